"""Log compaction: keep the latest record for every key, drop older ones and expired tombstones.

Mirrors Kafka's `LogCleaner` (the `Cleaner` that rewrites segments), `LogCleanerManager` (which log
to clean, the `cleaner-offset-checkpoint`) and `MemoryRecords.filterTo` (how a batch is rewritten).

A compacted log has three parts: the *clean* section below the first dirty offset (already
compacted), the *dirty* section up to the first uncleanable offset, and the active segment (never
cleaned). One cleaning round:
1. builds an offset map (key → latest offset) over the dirty section, stopping early when the map
   is full (the round then cleans only as far as the map reaches);
2. groups the segments below that point by size and rewrites each group into one `.cleaned`
   segment, keeping a record iff it is the latest for its key (and a tombstone only until its
   delete horizon), with its original offset: offsets are never renumbered, so gaps appear;
3. swaps the new segment in crash-safely (`.cleaned` → `.swap` → live) and checkpoints the new
   first dirty offset.

Transactions: cleaning stops at the last stable offset; the records of aborted transactions (the
`.txnindex` ranges) are left out of the offset map and dropped from the cleaned segment, and an
ABORT marker that is kept carries its `.txnindex` entry into the cleaned segment.

A marker whose transaction has no records left (aborted, or compacted away) gets a delete horizon
at the next cleaning and is removed by a cleaning after it (delete.retention.ms), as Kafka does.

kstore differs from Kafka: cleaning runs in the caller's thread (or on the log manager's scheduler)
rather than in dedicated cleaner threads.
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass, field
from typing import Iterable, Iterator, NamedTuple, Sequence

from .checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from .cleaner_native import FilterWalk, MapWalk
from .clock import Clock
from .errors import KStoreError
from .index import INT32_MAX
from .log import Log
from .offset_map import SkimpyOffsetMap
from .file_records import FileRecords
from .records import (LENGTH_OFFSET, LOG_OVERHEAD, MIN_BATCH_LENGTH_FIELD, NO_PRODUCER_ID,
                      ControlRecordType, Record, RecordBatch, build_batch, build_empty_batch,
                      native_codec)
from .segment import CLEANED_SUFFIX, LogSegment, segment_paths

READ_CHUNK_BYTES = 262_144   # log.cleaner.io.buffer.size (524288) / 2: one read buffer


class CleaningAbortedError(KStoreError):
    """The log changed (truncation, deletion) while it was being cleaned (LogCleaningAbortedException)."""


# ------------------------------------------------------------------------------------------------
# Pure rules
# ------------------------------------------------------------------------------------------------

def aborted_ranges(log: Log, start: int, end: int) -> dict[int, list[tuple[int, int]]]:
    """Producer id -> (first offset, marker offset) of each transaction aborted in [start, end)."""
    ranges: dict[int, list[tuple[int, int]]] = {}
    for t in log.collect_aborted_transactions(start, end):
        ranges.setdefault(t.producer_id, []).append((t.first_offset, t.last_offset))
    return ranges


def read_batches(file: FileRecords, position: int = 0, skim=None, skip=None) -> Iterator[RecordBatch]:
    """A segment's batches from `position`, read a buffer at a time (Kafka's cleaner fills its
    read buffer, log.cleaner.io.buffer.size, and grows it for a batch that does not fit) instead
    of two reads per batch. Where the buffer ends in a partial batch at the end of the file, or
    holds an impossible length, the file's own iterator takes over: it stops or raises as ever.

    `skim(buffer, pos, buffer's file position)`, where given, may handle a run of batches itself
    before the next one is yielded (the native codec's walks: one call per buffer, not per batch);
    it returns the position it got to, or -1 to stop reading. `skip(position)`, before each read,
    may move the position past batches that need not be read at all."""
    size = READ_CHUNK_BYTES
    while True:
        if skip is not None:
            position = skip(position)
        chunk = memoryview(file.read(position, min(size, max(file.size_in_bytes() - position, 0))))
        pos, end, length = 0, len(chunk), 0
        while end - pos >= LOG_OVERHEAD:
            if skim is not None:
                pos = skim(chunk, pos, position)
                if pos < 0:
                    return
                if end - pos < LOG_OVERHEAD:
                    break
            (length,) = _LENGTH.unpack_from(chunk, pos + LENGTH_OFFSET)
            if length < MIN_BATCH_LENGTH_FIELD or LOG_OVERHEAD + length > end - pos:
                break
            yield RecordBatch(chunk[pos:pos + LOG_OVERHEAD + length], position + pos)
            pos += LOG_OVERHEAD + length
        if pos == 0:
            if end < size or length < MIN_BATCH_LENGTH_FIELD:
                yield from file.batches(position)
                return
            size = LOG_OVERHEAD + length   # one batch larger than the buffer: grow it
            continue
        position += pos
        size = READ_CHUNK_BYTES


_LENGTH = struct.Struct(">i")


def in_aborted(batch: RecordBatch, ranges: dict[int, list[tuple[int, int]]]) -> bool:
    """A transactional data batch inside one of its producer's aborted ranges?"""
    if not batch.is_transactional or batch.is_control:
        return False
    return any(first <= batch.base_offset < last for first, last in ranges.get(batch.producer_id, ()))


def should_retain_record(record: Record, batch_delete_horizon: int | None, latest_offset_for_key: int,
                         map_latest_offset: int, now: int) -> bool:
    """Keep a (non-control) record? (Cleaner.shouldRetainRecord)

    * beyond what the map covers → keep;
    * no key → drop (invalid in a compacted log);
    * otherwise keep iff no newer record has the key, and it has a value or is a tombstone whose
      batch has no delete horizon yet or whose horizon has not passed.
    """
    if record.offset > map_latest_offset:
        return True
    if record.key is None:
        return False
    if record.offset < latest_offset_for_key:
        return False
    if record.value is not None:
        return True
    return batch_delete_horizon is None or now < batch_delete_horizon


_REFERENCE_RETAIN = should_retain_record   # the native filter stands in only for this one
_REFERENCE_MAP = SkimpyOffsetMap   # kept here: the "from scratch" seam replaces the module's name
key_digest = SkimpyOffsetMap.hash_key   # how the map's entries are keyed: MD5, Kafka's default


def is_reference_map(m) -> bool:
    """Is the offset map kstore's own class? Then the cleaner may hand whole batches to it
    (`put_batch`, the native codec reading and writing its entries). A learner's own class, a
    subclass too, is asked key by key through its `put` and `get`, as Kafka's cleaner asks its map."""
    return type(m) is _REFERENCE_MAP


def put_keys_one_by_one(m, batch: RecordBatch, start: int) -> tuple[int, bool]:
    """A learner's offset map: put each keyed record at or above `start` with the map's own `put`
    until it holds `max_desired_size` entries; return (records read, whether the map filled up)."""
    read = 0
    for offset, key in batch.keys_and_offsets():
        if key is not None and offset >= start:
            if m.size >= m.max_desired_size:
                return read, True
            m.put(key, offset)
        read += 1
    return read, False


def latest_offsets_asked(m, records: Sequence[Record]) -> dict[bytes, int]:
    """A learner's offset map: its `get` for each keyed record of a batch, as the entries
    `filter_records` looks up (MD5 of the key → latest offset)."""
    return {key_digest(r.key): m.get(r.key) for r in records if r.key is not None}


def filter_records(records: Sequence[Record], entries: dict[bytes, int], map_latest_offset: int,
                   batch_delete_horizon: int | None, now: int) -> tuple[list[int], int, int, int]:
    """Which records of one data batch a cleaning keeps (MemoryRecords.filterTo asking
    Cleaner.shouldRetainRecord of each record). `entries` is the offset map (MD5 of a key → its
    latest offset). Return (indexes of the records kept, records without a key inside the map,
    tombstones dropped, tombstones kept)."""
    kept, invalid, tombstones_dropped, tombstones_kept = [], 0, 0, 0
    for i, r in enumerate(records):
        if r.key is None and r.offset <= map_latest_offset:
            invalid += 1
        latest = entries.get(key_digest(r.key), -1) if r.key is not None else -1
        if should_retain_record(r, batch_delete_horizon, latest, map_latest_offset, now):
            kept.append(i)
            tombstones_kept += r.value is None
        elif r.value is None and r.key is not None and batch_delete_horizon is not None:
            tombstones_dropped += 1
    return kept, invalid, tombstones_dropped, tombstones_kept


def group_segments_by_size(segments: Sequence, max_size: int, max_index_size: int,
                           first_uncleanable_offset: int) -> list[list]:
    """Greedy groups of consecutive segments that fit in one segment (Cleaner.groupSegmentsBySize).

    A group grows while its `.log` bytes stay ≤ segment.bytes, each index's bytes ≤
    segment.index.bytes, and every offset in it stays within 2^31 − 1 of the group's base.
    Segments need `size`, `base_offset`, and `offset_index`/`time_index` with `size_in_bytes`.
    """
    groups, segs = [], list(segments)
    while segs:
        group = [segs.pop(0)]
        log_size = group[0].size
        index_size = group[0].offset_index.size_in_bytes
        time_index_size = group[0].time_index.size_in_bytes
        while segs:
            nxt = segs[0]
            last_offset = (segs[1].base_offset - 1) if len(segs) > 1 else first_uncleanable_offset - 1
            if not (log_size + nxt.size <= max_size
                    and index_size + nxt.offset_index.size_in_bytes <= max_index_size
                    and time_index_size + nxt.time_index.size_in_bytes <= max_index_size
                    and (nxt.size == 0 or last_offset - group[0].base_offset <= INT32_MAX)):
                break
            group.append(segs.pop(0))
            log_size += nxt.size
            index_size += nxt.offset_index.size_in_bytes
            time_index_size += nxt.time_index.size_in_bytes
        groups.append(group)
    return groups


@dataclass
class LogToClean:
    """A compacted log with its clean/dirty split, as the cleaner manager sizes it up."""
    log: Log
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    needs_compaction_now: bool = False

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0


class CleanableLog(NamedTuple):
    """What the cleaner manager weighs for one compacted log (names as in LogCleanerManager)."""
    name: str                     # "topic-partition"
    clean_bytes: int              # segments below the first dirty offset
    cleanable_bytes: int          # segments from there to the first uncleanable offset
    min_cleanable_ratio: float    # the log's min.cleanable.dirty.ratio
    needs_compaction_now: bool    # a dirty segment is older than max.compaction.lag.ms


def choose_filthiest(logs: list[CleanableLog]) -> str | None:
    """The name of the log to clean next, or None (`LogCleanerManager.grabFilthiestCompactedLog`):
    a log with no bytes is skipped; dirty ratio = cleanable / (clean + cleanable); a log qualifies
    when the ratio is strictly above its min.cleanable.dirty.ratio, or when it must be compacted now
    and has something to clean; of those, the highest ratio wins (the first on a tie)."""
    best, best_ratio = None, -1.0
    for log in logs:
        total = log.clean_bytes + log.cleanable_bytes
        if total == 0:
            continue
        ratio = log.cleanable_bytes / total
        eligible = ratio > log.min_cleanable_ratio or (log.needs_compaction_now and log.cleanable_bytes > 0)
        if eligible and ratio > best_ratio:
            best, best_ratio = log.name, ratio
    return best


def cleanable_offsets(log: Log, checkpointed_dirty_offset: int | None, now: int) -> tuple[int, int]:
    """(first dirty offset, first uncleanable offset) for a compacted log (LogCleanerManager).

    The active segment, anything at or above the high watermark, and (with min.compaction.lag.ms)
    segments holding records younger than the lag are never cleanable.
    """
    first_dirty = checkpointed_dirty_offset
    if first_dirty is None or first_dirty < log.log_start_offset or first_dirty > log.log_end_offset:
        first_dirty = log.log_start_offset
    candidates = [log.last_stable_offset, log.active_segment.base_offset]
    lag = log.config.min_compaction_lag_ms
    if lag > 0:
        for segment in log.segments[:-1]:   # from the segment holding first_dirty (its floor)
            if _segment_end(log, segment) > first_dirty and segment.largest_timestamp > now - lag:
                candidates.append(segment.base_offset)
                break
    return first_dirty, max(first_dirty, min(candidates))


def size_up(log: Log, first_dirty: int, first_uncleanable: int, now: int) -> LogToClean:
    """Clean bytes, cleanable bytes and whether max.compaction.lag.ms forces a cleaning."""
    segments = log.segments
    clean = sum(s.size for s in segments if _segment_end(log, s) <= first_dirty)
    uncleanable_base = max((s.base_offset for s in segments if s.base_offset <= first_uncleanable),
                           default=first_uncleanable)
    cleanable = sum(s.size for s in segments
                    if _segment_end(log, s) > first_dirty and s.base_offset < uncleanable_base)
    need_now = False
    max_lag = log.config.max_compaction_lag_ms
    if max_lag < (1 << 63) - 1:
        for s in segments[:-1]:
            if _segment_end(log, s) > first_dirty:
                first_ts = next((b.max_timestamp for b in s.log.batch_headers()), -1)
                if 0 < first_ts < now - max_lag:
                    need_now = True
                    break
    # The round stops at the base of the segment holding the first uncleanable offset (Kafka's
    # LogToClean.firstUncleanableOffset): records at or above the HW must not enter the map.
    return LogToClean(log, first_dirty, uncleanable_base, clean, cleanable, need_now)


def _segment_end(log: Log, segment: LogSegment) -> int:
    following = log.higher_segment(segment.base_offset)
    return following.base_offset if following is not None else log.log_end_offset


# ------------------------------------------------------------------------------------------------
# The cleaner
# ------------------------------------------------------------------------------------------------

@dataclass
class CleanerStats:
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    invalid_records: int = 0
    map_records_read: int = 0
    map_entries: int = 0
    tombstones_marked: int = 0
    tombstones_dropped: int = 0
    batches_kept_empty: int = 0
    segments_cleaned: list[int] = field(default_factory=list)

    @property
    def space_saved(self) -> int:
        return self.bytes_read - self.bytes_written


class Cleaner:
    """Rewrites one log's segments (Kafka's Cleaner)."""

    _aborted: dict = {}
    _codec = None            # the native codec for the segment being cleaned (None: the reference)
    _txn_data: dict = {}     # producer id -> its current transaction still has records kept

    def __init__(self, offset_map: SkimpyOffsetMap, clock: Clock):
        if offset_map.slots * offset_map.load_factor <= 1:   # Kafka's require() in Cleaner
            raise ValueError(f"offset map is too small to fit in even a single message "
                             f"({offset_map.slots} slots × load factor {offset_map.load_factor})")
        self.offset_map = offset_map
        self.clock = clock

    # ---- step 1: the offset map
    def build_offset_map(self, log: Log, start: int, end: int, stats: CleanerStats) -> None:
        m = self.offset_map
        m.clear()
        self._aborted = aborted_ranges(log, start, end)
        dirty = [s for s in log.segments if _segment_end(log, s) > start and s.base_offset < end]
        for i, segment in enumerate(dirty):
            next_start = dirty[i + 1].base_offset if i + 1 < len(dirty) else end
            if self._map_segment(segment, start, next_start, stats):
                return   # the map is full: this round cleans only up to map.latest_offset
        stats.map_entries = m.size

    def _map_segment(self, segment: LogSegment, start: int, next_segment_start: int,
                     stats: CleanerStats) -> bool:
        m = self.offset_map
        codec = native_codec()      # asked once per segment, not per batch
        position = segment.offset_index.lookup(start).position
        native = MapWalk(codec, m, segment.base_offset, start, next_segment_start, stats) \
            if codec is not None and is_reference_map(m) and m.walks_natively() else None   # plain batches in C
        for batch in read_batches(segment.log, position, native and native.skim):
            if batch.base_offset >= next_segment_start:
                break   # the uncleanable part (e.g. above the LSO) stays out of the map
            if not batch.is_control and not in_aborted(batch, self._aborted):
                # Keys and offsets only (offset_map.map_keys): no Record objects are built.
                read, full = m.put_batch(batch, start, codec) if is_reference_map(m) \
                    else put_keys_one_by_one(m, batch, start)
                stats.map_records_read += read
                if full:
                    stats.map_entries = m.size
                    return True
            if batch.last_offset >= start:
                m.update_latest_offset(batch.last_offset)
        if native is not None and native.map_full:
            stats.map_entries = m.size
            return True
        m.update_latest_offset(next_segment_start - 1)   # cover offset gaps
        return False

    # ---- steps 2 and 3
    def clean(self, to_clean: LogToClean, now: int | None = None) -> tuple[int, CleanerStats]:
        """One cleaning round; returns (new first dirty offset, stats) (Cleaner.doClean)."""
        log = to_clean.log
        now = self.clock.milliseconds() if now is None else now
        stats = CleanerStats()
        start_count = log.modification_count
        upper_bound = to_clean.first_uncleanable_offset
        self.build_offset_map(log, to_clean.first_dirty_offset, upper_bound, stats)
        end_offset = self.offset_map.latest_offset + 1
        if end_offset <= to_clean.first_dirty_offset:
            # Nothing dirty below the upper bound (a forced clean_log): Kafka never picks such a
            # log; answering latest_offset + 1 = 0 would move the checkpoint back to the start.
            return to_clean.first_dirty_offset, stats
        segments = [s for s in log.segments if s.base_offset < end_offset]
        self._aborted = aborted_ranges(log, segments[0].base_offset if segments else 0, end_offset)
        self._txn_data = {}
        groups = group_segments_by_size(segments, log.config.segment_bytes,
                                        log.config.segment_index_bytes, upper_bound)
        last_records = log.producer_state.active_producers()
        for group in groups:
            self._clean_segments(log, group, now, stats, last_records, upper_bound, start_count)
        log.events.emit("clean", log.dir, first_dirty_offset=to_clean.first_dirty_offset,
                        end_offset=end_offset, groups=[[s.base_offset for s in g] for g in groups],
                        bytes_read=stats.bytes_read, bytes_written=stats.bytes_written,
                        records_read=stats.records_read, records_written=stats.records_written)
        return end_offset, stats

    def _clean_segments(self, log: Log, group: list[LogSegment], now: int, stats: CleanerStats,
                        last_records: dict, upper_bound: int, start_count: int) -> None:
        for path in segment_paths(log.dir, group[0].base_offset, CLEANED_SUFFIX).values():
            if os.path.exists(path):
                os.remove(path)   # leftovers of an earlier, aborted cleaning
        cleaned = LogSegment.open(log.dir, group[0].base_offset, log.config, log.clock,
                                  file_suffix=CLEANED_SUFFIX)
        try:
            for segment in group:
                self._clean_into(log, segment, cleaned, now, stats, last_records, upper_bound)
            cleaned.on_become_inactive_segment()
            cleaned.flush()
            mtime = os.path.getmtime(group[-1].log.path)
            for path in (cleaned.log.path, cleaned.offset_index.path, cleaned.time_index.path):
                os.utime(path, (mtime, mtime))   # time retention still sees the data's age
            with log._lock:
                if log.modification_count != start_count or log.closed:
                    raise CleaningAbortedError(f"{log.name} changed while it was being cleaned")
                log.replace_segments([cleaned], group)
            stats.segments_cleaned.extend(s.base_offset for s in group)
        except BaseException:
            # Only while the new files are still `.cleaned`: once the swap has renamed some of
            # them, deleting them could lose data; recovery finishes or undoes the swap (Kafka
            # deletes the cleaned segment only on LogCleaningAbortedException).
            if cleaned.has_suffix(CLEANED_SUFFIX):
                cleaned.delete_files()
            raise

    def _clean_into(self, log: Log, source: LogSegment, dest: LogSegment, now: int,
                    stats: CleanerStats, last_records: dict, upper_bound: int) -> None:
        """Filter one segment's batches into `dest` (Cleaner.cleanInto + MemoryRecords.filterTo)."""
        chunk: list[bytes] = []
        chunk_info = [-1, -1, -1]   # max offset, max timestamp, shallow offset of max timestamp
        chunk_size = 0
        self._codec = native_codec()   # asked once per segment, not per batch

        def flush_chunk() -> None:
            nonlocal chunk, chunk_size
            if chunk:
                data = b"".join(chunk)
                dest.append(chunk_info[0], chunk_info[1], chunk_info[2], data)
                stats.bytes_written += len(data)
                chunk, chunk_size = [], 0
                chunk_info[:] = [-1, -1, -1]

        def keep(out, last_offset: int, max_timestamp: int) -> None:
            nonlocal chunk_size
            if chunk_size + len(out) > READ_CHUNK_BYTES:
                flush_chunk()
            chunk.append(out)
            chunk_size += len(out)
            chunk_info[0] = max(chunk_info[0], last_offset)
            if max_timestamp > chunk_info[1]:
                chunk_info[1], chunk_info[2] = max_timestamp, last_offset

        native = None                  # dropped or kept-whole plain batches in C
        if self._codec is not None and should_retain_record is _REFERENCE_RETAIN and \
                is_reference_map(self.offset_map) and self.offset_map.walks_natively():
            native = FilterWalk(self._codec, self.offset_map, source.base_offset, now, upper_bound,
                                last_records, stats, keep)
        for batch in read_batches(source.log, skim=native and native.skim,
                                  skip=native and native.skip):
            stats.bytes_read += batch.size_in_bytes
            out = self._filter_batch(log, batch, now, stats, last_records, upper_bound)
            if out is None:
                continue
            kept = RecordBatch(out)
            if kept.is_control and kept.records() and \
                    kept.control_record_type() == ControlRecordType.ABORT:
                for entry in source.txn_index.entries:   # the kept marker keeps its entry
                    if (entry.producer_id, entry.last_offset) == (kept.producer_id, kept.base_offset):
                        dest.txn_index.append(entry)
            keep(out, kept.last_offset, kept.max_timestamp)
        flush_chunk()

    def _filter_batch(self, log: Log, batch: RecordBatch, now: int, stats: CleanerStats,
                      last_records: dict, upper_bound: int) -> bytes | None:
        """The bytes to keep for one batch, or None to drop it."""
        stats.records_read += batch.records_count
        horizon = batch.delete_horizon_ms
        marker_horizon = False
        records = None                           # decoded only where a rule needs Record objects
        tombstones_kept = 0
        if batch.is_control:
            # A marker goes once its transaction has no data left in the log: the first such
            # cleaning stamps a delete horizon, a cleaning after the horizon removes it.
            records = batch.records()
            still_has_data = self._txn_data.pop(batch.producer_id, False)
            discard = not still_has_data and horizon is not None and horizon <= now
            marker_horizon = not still_has_data and horizon is None
            kept = [] if discard else list(range(len(records)))
        elif in_aborted(batch, self._aborted):
            records = batch.records()            # (checked as before: a malformed batch raises)
            kept = []                            # an aborted transaction's records go
            self._txn_data.setdefault(batch.producer_id, False)
        else:
            kept, invalid, dropped, tombstones_kept, records = self._retained(batch, horizon, now)
            stats.invalid_records += invalid
            stats.tombstones_dropped += dropped
        if batch.is_transactional and not batch.is_control and kept:
            self._txn_data[batch.producer_id] = True
        producer = last_records.get(batch.producer_id) if batch.producer_id != NO_PRODUCER_ID else None
        is_last_of_producer = producer is not None and (
            batch.last_offset == producer.last_data_offset if producer.last_data_offset is not None
            else batch.is_control and batch.producer_epoch == producer.producer_epoch)
        retain_empty = is_last_of_producer or batch.next_offset == upper_bound
        if kept:
            set_horizon = (tombstones_kept > 0 and horizon is None and not batch.is_control) or marker_horizon
            stats.records_written += len(kept)
            if len(kept) == batch.records_count and not set_horizon:
                return batch.to_bytes()   # nothing to change: copied verbatim, not re-encoded
            if set_horizon:
                horizon = now + log.config.delete_retention_ms
                stats.tombstones_marked += tombstones_kept
            if records is None:
                records = batch.records()
            retained = [records[i] for i in kept]
            # Kafka's v2 rule: the rewritten batch keeps its base offset, every record its offset.
            return build_batch(
                retained, base_offset=batch.base_offset, offsets=[r.offset for r in retained],
                compression=batch.compression, timestamp_type=batch.timestamp_type,
                partition_leader_epoch=batch.partition_leader_epoch,
                producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
                base_sequence=batch.base_sequence, transactional=batch.is_transactional,
                control=batch.is_control, delete_horizon_ms=horizon,
                last_offset_delta=batch.last_offset_delta,
                max_timestamp=batch.max_timestamp if batch.timestamp_type.value else None)
        if retain_empty:
            if batch.is_transactional and not batch.is_control:
                # the empty batch still opens the transaction when the log is replayed: its
                # marker must stay to close it
                self._txn_data[batch.producer_id] = True
            stats.batches_kept_empty += 1
            return build_empty_batch(
                base_offset=batch.base_offset, last_offset=batch.last_offset,
                max_timestamp=batch.max_timestamp, partition_leader_epoch=batch.partition_leader_epoch,
                producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
                base_sequence=batch.base_sequence, timestamp_type=batch.timestamp_type,
                transactional=batch.is_transactional, control=batch.is_control)
        return None

    def _retained(self, batch: RecordBatch, horizon: int | None,
                  now: int) -> tuple[list[int], int, int, int, list[Record] | None]:
        """`filter_records` for one data batch, plus its decoded records (None where the native
        codec ran: it walks the records in place and builds no Record objects)."""
        m = self.offset_map
        codec = self._codec
        if codec is not None and should_retain_record is _REFERENCE_RETAIN and \
                is_reference_map(m):
            batch._check_v2()
            out = codec.filter_records(batch.records_view(), batch.base_offset, batch.records_count,
                                       m.entries, m.latest_offset, horizon, now)
            if out is not None:
                return (*out, None)
        records = batch.records()   # the reference path (also where a learner's rule is plugged in)
        entries = m.entries if is_reference_map(m) else latest_offsets_asked(m, records)
        return (*filter_records(records, entries, m.latest_offset, horizon, now), records)


# ------------------------------------------------------------------------------------------------
# Choosing a log and keeping the checkpoint
# ------------------------------------------------------------------------------------------------

@dataclass
class CleaningResult:
    log: Log
    first_dirty_offset: int
    end_offset: int
    cleanable_ratio: float
    stats: CleanerStats


class LogCleaner:
    """Picks the dirtiest compacted log and cleans it (LogCleaner + LogCleanerManager).

    `log.cleaner.dedupe.buffer.size` / `log.cleaner.threads` bytes of offset map, load factor
    `log.cleaner.io.buffer.load.factor`. The first dirty offset of each log is kept in
    `<log dir>/cleaner-offset-checkpoint`.
    """

    def __init__(self, log_dir: str, clock: Clock, *, dedupe_buffer_size: int = 134217728,
                 threads: int = 1, load_factor: float = 0.9):
        self.log_dir = log_dir
        self.clock = clock
        self.offset_map = SkimpyOffsetMap(dedupe_buffer_size // threads, load_factor)
        self.cleaner = Cleaner(self.offset_map, clock)
        self.checkpoint = OffsetCheckpointFile(os.path.join(log_dir, CLEANER_OFFSET_CHECKPOINT))
        self._lock = threading.Lock()
        self.in_progress: set[tuple[str, int]] = set()

    def checkpointed_offsets(self) -> dict[tuple[str, int], int]:
        return self.checkpoint.read()

    def forget(self, tp: tuple[str, int]) -> None:
        """Drop a deleted partition's first dirty offset from the checkpoint (Kafka's
        LogCleanerManager.updateCheckpoints with a partition to remove). Under the cleaner's lock,
        so a cleaning round that is writing the checkpoint cannot put the entry back."""
        with self._lock:
            offsets = self.checkpoint.read()
            if offsets.pop(tp, None) is not None:
                self.checkpoint.write(offsets)

    def logs_to_clean(self, logs: Iterable[Log], now: int | None = None) -> list[LogToClean]:
        """Every compacted log with its dirty ratio, dirtiest first."""
        now = self.clock.milliseconds() if now is None else now
        checkpoints = self.checkpoint.read()
        out = []
        for log in logs:
            if not log.config.compact or log.closed or (log.topic, log.partition) in self.in_progress:
                continue
            first_dirty, uncleanable = cleanable_offsets(
                log, checkpoints.get((log.topic, log.partition)), now)
            to_clean = size_up(log, first_dirty, uncleanable, now)
            if to_clean.total_bytes > 0:
                out.append(to_clean)
        return sorted(out, key=lambda t: t.cleanable_ratio, reverse=True)

    def grab_filthiest_compacted_log(self, logs: Iterable[Log], now: int | None = None) -> LogToClean | None:
        """The log with the highest dirty ratio above min.cleanable.dirty.ratio (strictly), or one
        that max.compaction.lag.ms says must be cleaned now (`choose_filthiest` decides)."""
        candidates = {f"{t.log.topic}-{t.log.partition}": t for t in self.logs_to_clean(logs, now)}
        chosen = choose_filthiest([
            CleanableLog(name, t.clean_bytes, t.cleanable_bytes, t.log.config.min_cleanable_dirty_ratio,
                         t.needs_compaction_now) for name, t in candidates.items()])
        return None if chosen is None else candidates[chosen]

    def clean_filthiest(self, logs: Iterable[Log], now: int | None = None) -> CleaningResult | None:
        """One cleaning round on the dirtiest log (if any qualifies), then the checkpoint."""
        now = self.clock.milliseconds() if now is None else now
        with self._lock:
            to_clean = self.grab_filthiest_compacted_log(list(logs), now)
            if to_clean is None:
                return None
            return self._clean(to_clean, now)

    def clean_log(self, log: Log, now: int | None = None) -> CleaningResult:
        """Clean this log now whatever its dirty ratio (what a test or a notebook asks for)."""
        now = self.clock.milliseconds() if now is None else now
        with self._lock:
            first_dirty, uncleanable = cleanable_offsets(
                log, self.checkpoint.read().get((log.topic, log.partition)), now)
            return self._clean(size_up(log, first_dirty, uncleanable, now), now)

    def _clean(self, to_clean: LogToClean, now: int) -> CleaningResult:
        log = to_clean.log
        tp = (log.topic, log.partition)
        self.in_progress.add(tp)
        try:
            end_offset, stats = self.cleaner.clean(to_clean, now)
            offsets = self.checkpoint.read()
            offsets[tp] = end_offset
            self.checkpoint.write(offsets)
        finally:
            self.in_progress.discard(tp)
        if log.config.delete:          # compact,delete: retention runs after each cleaning
            log.delete_old_segments()
        return CleaningResult(log, to_clean.first_dirty_offset, end_offset,
                              to_clean.cleanable_ratio, stats)

"""One log segment: a `.log` file of batches plus its `.index` and `.timeindex`.

Mirrors Kafka's `LogSegment`. Files are named by the segment's base offset, 20 digits zero-padded
(`00000000000000000000.log`): the offset of the first record the segment may hold, not "the offset
before the first message". The segment decides when to add a sparse index entry
(`index.interval.bytes`), whether the next append must go to a new segment (`should_roll`), how
to find an offset or a timestamp, and how to rebuild itself after a crash (`recover`).

The fourth file, `.txnindex` (`transaction_index`), lists the transactions aborted in this segment;
like Kafka's, it exists only once a segment holds an ABORT marker.

kstore differs from Kafka in one small way, on purpose: a missing or insane `.timeindex` triggers a
rebuild just like a missing `.index` (Kafka rebuilds only for the offset index, or for segments
above the recovery point).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

from .clock import Clock
from .config import LogConfig
from .errors import (CorruptIndexError, CorruptRecordError, InvalidRecordError,
                     LogSegmentOffsetOverflowError)
from .file_records import FileRecords, FileSlice, LogOffsetPosition
from .index import INT32_MAX, LazyIndex, OffsetIndex, TimeIndex, TimestampOffset
from .records import CURRENT_MAGIC, RecordBatch
from .transaction_index import TransactionIndex

LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX = ".log", ".index", ".timeindex", ".txnindex"
SNAPSHOT_SUFFIX = ".snapshot"
DELETED_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX = ".deleted", ".cleaned", ".swap"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)


def filename_prefix_from_offset(offset: int) -> str:
    """The 20-digit zero-padded base offset that names a segment's files."""
    if offset < 0:
        raise ValueError(f"a segment base offset cannot be negative: {offset}")
    return f"{offset:020d}"


def offset_from_file_name(name: str) -> int:
    """Parse the base offset from a segment file name (the text before the first '.')."""
    prefix = os.path.basename(name).split(".", 1)[0]
    if not prefix.isdigit():
        raise ValueError(f"{name!r} is not a segment file name (expected 20 digits before the '.')")
    return int(prefix)


def segment_paths(directory: str, base_offset: int, suffix: str = "") -> dict[str, str]:
    prefix = os.path.join(directory, filename_prefix_from_offset(base_offset))
    return {ext: prefix + ext + suffix for ext in SEGMENT_SUFFIXES}


class LogOffsetMetadata(NamedTuple):
    """An offset and where it sits on disk: its segment and byte position (Kafka's LogOffsetMetadata)."""
    message_offset: int
    segment_base_offset: int = -1
    relative_position_in_segment: int = -1

    @property
    def message_offset_only(self) -> bool:
        return self.segment_base_offset == -1


@dataclass(frozen=True)
class FetchDataInfo:
    """What a read returns: where it started and a slice of file bytes (maybe empty)."""
    fetch_offset_metadata: LogOffsetMetadata
    records: FileSlice | None
    first_entry_incomplete: bool = False

    @property
    def size(self) -> int:
        return 0 if self.records is None else self.records.size

    def batches(self) -> list[RecordBatch]:
        return [] if self.records is None else self.records.batches()


class TimestampAndOffset(NamedTuple):
    timestamp: int
    offset: int
    leader_epoch: int | None


class RollParams(NamedTuple):
    """What the next append brings, for `should_roll` (Kafka's RollParams). A named tuple: one
    is made per append."""
    max_segment_ms: int
    max_segment_bytes: int
    max_timestamp_in_messages: int
    max_offset_in_messages: int
    messages_size: int
    now: int


_NO_MAX_POSITION = object()


class LogSegment:
    def __init__(self, log: FileRecords, offset_index: OffsetIndex, time_index: TimeIndex,
                 base_offset: int, index_interval_bytes: int, roll_jitter_ms: int, clock: Clock):
        self.log = log
        self.offset_index = offset_index
        self.time_index = time_index
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.roll_jitter_ms = roll_jitter_ms
        self.clock = clock
        self.created_ms = clock.milliseconds()
        self.bytes_since_last_index_entry = 0
        self.rolling_based_timestamp: int | None = None
        self._max_ts_so_far: TimestampOffset | None = None  # lazily from the time index
        stem, _, suffix = log.path.rpartition(LOG_SUFFIX)   # e.g. ".cleaned" after ".log"
        self.txn_index = TransactionIndex(stem + TXN_INDEX_SUFFIX + suffix, base_offset)
        self.txn_index_needs_rebuild = self.txn_index.corrupt   # the log refills it on open

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, directory: str, base_offset: int, config: LogConfig, clock: Clock, *,
             file_already_exists: bool = False, init_file_size: int = 0, preallocate: bool = False,
             file_suffix: str = "", roll_jitter_ms: int = 0, read_only: bool = False) -> "LogSegment":
        """`read_only`: every file opened for reading only (offline tools change nothing)."""
        paths = segment_paths(directory, base_offset, file_suffix)
        log = FileRecords(paths[LOG_SUFFIX], preallocate_size=init_file_size if preallocate else 0,
                          file_already_exists=file_already_exists, read_only=read_only)
        max_index = config.segment_index_bytes
        writable = not read_only
        # Indexes are mapped on first use (Kafka's LazyIndex): descriptors follow use, not disk.
        segment = cls(log, LazyIndex(OffsetIndex, paths[INDEX_SUFFIX], base_offset, max_index, writable),
                      LazyIndex(TimeIndex, paths[TIME_INDEX_SUFFIX], base_offset, max_index, writable),
                      base_offset, config.index_interval_bytes, roll_jitter_ms, clock)
        segment.read_only = read_only
        return segment

    read_only = False

    # ------------------------------------------------------------------ facts
    @property
    def size(self) -> int:
        return self.log.size_in_bytes()

    @property
    def max_timestamp_so_far(self) -> int:
        return self._max_ts().timestamp

    @property
    def offset_of_max_timestamp_so_far(self) -> int:
        return self._max_ts().offset

    def _max_ts(self) -> TimestampOffset:
        if self._max_ts_so_far is None:
            self._max_ts_so_far = self.time_index.last_entry()
        return self._max_ts_so_far

    @property
    def largest_timestamp(self) -> int:
        """The largest record timestamp, or the file's mtime when there is none (retention uses it)."""
        ts = self.max_timestamp_so_far
        return ts if ts >= 0 else self.last_modified_ms

    @property
    def last_modified_ms(self) -> int:
        return int(os.path.getmtime(self.log.path) * 1000)

    def file_names(self) -> list[str]:
        paths = [self.log.path, self.offset_index.path, self.time_index.path]
        if self.txn_index.exists():
            paths.append(self.txn_index.path)
        return [os.path.basename(p) for p in paths]

    def can_convert_to_relative_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= INT32_MAX

    def _ensure_offset_in_range(self, offset: int) -> None:
        if not self.can_convert_to_relative_offset(offset):
            raise LogSegmentOffsetOverflowError(
                f"detected offset overflow at offset {offset} in segment with base offset "
                f"{self.base_offset}: {offset} − {self.base_offset} is outside [0, {INT32_MAX}]")

    # ------------------------------------------------------------------ appending
    def append(self, largest_offset: int, largest_timestamp: int,
               shallow_offset_of_max_timestamp: int, records: bytes) -> bool:
        """Append ready batches (offsets already assigned); maybe add one sparse index entry.
        Return whether it did (views of the index show it)."""
        if not records:
            return False
        physical_position = self.log.size_in_bytes()
        if physical_position == 0:
            self.rolling_based_timestamp = largest_timestamp
        self._ensure_offset_in_range(largest_offset)
        self.log.append(records)
        if largest_timestamp > self.max_timestamp_so_far:
            self._max_ts_so_far = TimestampOffset(largest_timestamp, shallow_offset_of_max_timestamp)
        # Strictly greater, and counted before this append: the first append is never indexed.
        indexed = self.bytes_since_last_index_entry > self.index_interval_bytes
        if indexed:
            # The open indexes themselves, as Kafka's LogSegment reads `lazyOffsetIndex.get()`:
            # each call through the LazyIndex proxy costs more than the 8-byte write.
            self.offset_index.get().append(largest_offset, physical_position)
            self.time_index.get().maybe_append(self.max_timestamp_so_far,
                                               self.offset_of_max_timestamp_so_far)
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += len(records)
        return indexed

    # ------------------------------------------------------------------ rolling
    def should_roll(self, p: RollParams) -> bool:
        reached_roll_ms = self.time_waited_for_roll(p.now, p.max_timestamp_in_messages) > \
            p.max_segment_ms - self.roll_jitter_ms
        size = self.size
        return (size > p.max_segment_bytes - p.messages_size
                or (size > 0 and reached_roll_ms)
                or self.offset_index.is_full()
                or self.time_index.is_full()
                or not self.can_convert_to_relative_offset(p.max_offset_in_messages))

    def roll_reasons(self, p: RollParams) -> list[str]:
        """Which of the roll conditions hold (for the course: *why* a segment rolled)."""
        reasons = []
        if self.size > p.max_segment_bytes - p.messages_size:
            reasons.append("segment.bytes")
        if self.size > 0 and self.time_waited_for_roll(p.now, p.max_timestamp_in_messages) > \
                p.max_segment_ms - self.roll_jitter_ms:
            reasons.append("segment.ms")
        if self.offset_index.is_full():
            reasons.append("offset index full")
        if self.time_index.is_full():
            reasons.append("time index full")
        if not self.can_convert_to_relative_offset(p.max_offset_in_messages):
            reasons.append("relative offset overflow")
        return reasons

    def time_waited_for_roll(self, now: int, message_timestamp: int) -> int:
        """By record timestamps when the segment has them, else by wall clock since creation."""
        if self.rolling_based_timestamp is None:
            self._load_first_batch_timestamp()
        if self.rolling_based_timestamp is not None and self.rolling_based_timestamp >= 0:
            return message_timestamp - self.rolling_based_timestamp
        return now - self.created_ms

    def _load_first_batch_timestamp(self) -> None:
        if self.rolling_based_timestamp is None:
            for loc in self.log.batch_locations():
                self.rolling_based_timestamp = loc.max_timestamp
                break

    def on_become_inactive_segment(self) -> None:
        """On roll: write the final time-index entry and trim the files to what they hold."""
        self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far,
                                     skip_full_check=True)
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()
        self.log.trim_to_size()

    # ------------------------------------------------------------------ reading
    def translate_offset(self, offset: int, starting_file_position: int = 0) -> LogOffsetPosition | None:
        """Step 2+3 of a lookup: index floor entry → forward scan to the batch holding `offset`."""
        mapping = self.offset_index.lookup(offset)
        return self.log.search_for_offset_with_size(offset, max(mapping.position, starting_file_position))

    def read(self, start_offset: int, max_size: int, max_position=None,
             min_one_message: bool = False) -> FetchDataInfo | None:
        """Read from the batch holding `start_offset`; None when nothing ≥ start_offset is here.

        The slice starts at a batch boundary (possibly below start_offset) and may end in the
        middle of a batch: readers drop a partial trailing batch, as Kafka's clients do.
        `max_position=None` means up to the end of the segment; pass NO_MAX_POSITION for none.
        """
        if max_size < 0:
            raise ValueError(f"invalid max size {max_size} for log read from segment {self.log.path}")
        start = self.translate_offset(start_offset)
        if start is None:
            return None
        metadata = LogOffsetMetadata(start_offset, self.base_offset, start.position)
        adjusted = max(max_size, start.size) if min_one_message else max_size
        if max_position is None:
            max_position = self.size
        if adjusted == 0 or max_position is _NO_MAX_POSITION:
            return FetchDataInfo(metadata, self.log.slice(start.position, 0))
        fetch_size = max(0, min(max_position - start.position, adjusted))
        return FetchDataInfo(metadata, self.log.slice(start.position, fetch_size),
                             first_entry_incomplete=adjusted < start.size)

    def read_next_offset(self) -> int:
        """The offset after the last batch, or the base offset when the segment is empty."""
        start = self.translate_offset(self.offset_index.last_offset)
        if start is None:
            return self.base_offset
        next_offset = self.base_offset
        for loc in self.log.batch_locations(start.position):
            next_offset = loc.last_offset + 1
        return next_offset

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int | None = None
                                 ) -> TimestampAndOffset | None:
        """The first record with timestamp ≥ target (and offset ≥ starting_offset)."""
        starting_offset = self.base_offset if starting_offset is None else starting_offset
        ts_offset = self.time_index.lookup(timestamp)
        position = self.offset_index.lookup(max(ts_offset.offset, starting_offset)).position
        for batch in self.log.batches(position):
            if batch.max_timestamp >= timestamp:
                for record in batch.records():
                    if record.timestamp >= timestamp and record.offset >= starting_offset:
                        epoch = batch.partition_leader_epoch
                        return TimestampAndOffset(record.timestamp, record.offset,
                                                  epoch if epoch >= 0 else None)
        return None

    # ------------------------------------------------------------------ truncation
    def truncate_to(self, offset: int) -> int:
        """Remove every batch holding an offset ≥ `offset` (whole batches); return bytes removed."""
        mapping = self.translate_offset(offset)
        # Read the (lazily loaded) max timestamp before the time index shrinks: after a reopen it
        # would otherwise come from the truncated index and look unknown (−1).
        had_timestamps = self.max_timestamp_so_far >= 0
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        self.offset_index.resize(self.offset_index.max_index_size)
        self.time_index.resize(self.time_index.max_index_size)
        bytes_truncated = 0 if mapping is None else self.log.truncate_to(mapping.position)
        if self.log.size_in_bytes() == 0:
            self.created_ms = self.clock.milliseconds()
            self.rolling_based_timestamp = None
        self.bytes_since_last_index_entry = 0
        if had_timestamps:
            self._load_largest_timestamp()
        return bytes_truncated

    def _load_largest_timestamp(self) -> None:
        last = self.time_index.last_entry()
        best = last
        position = self.offset_index.lookup(last.offset).position
        for loc in self.log.batch_locations(position):
            if loc.max_timestamp > best.timestamp:
                best = TimestampOffset(loc.max_timestamp, loc.last_offset)
        self._max_ts_so_far = best

    # ------------------------------------------------------------------ recovery
    def recover(self, epoch_cache=None, max_message_size: int | None = None) -> int:
        """Rebuild both indexes from the `.log`, validating every batch; cut the log at the first
        bad batch. Returns the number of bytes truncated (LogSegment.recover)."""
        self.offset_index.reset()
        self.time_index.reset()
        self.txn_index.reset()            # refilled by the log, which knows the open transactions
        self.txn_index_needs_rebuild = True
        valid_bytes = 0
        last_index_entry = 0
        self._max_ts_so_far = TimestampOffset(-1, self.base_offset)
        self.recovery_error: str | None = None
        try:
            for batch in self.log.batches():
                self._validate_batch_structure(batch)
                batch.ensure_valid()
                self._ensure_offset_in_range(batch.last_offset)
                last_index_entry = self._index_stored_batch(batch, valid_bytes, last_index_entry)
                valid_bytes += batch.size_in_bytes
                if epoch_cache is not None and batch.partition_leader_epoch >= 0:
                    latest = epoch_cache.latest_epoch()
                    if latest is None or batch.partition_leader_epoch > latest:
                        epoch_cache.assign(batch.partition_leader_epoch, batch.base_offset)
        except (CorruptRecordError, InvalidRecordError, LogSegmentOffsetOverflowError) as e:
            self.recovery_error = f"{type(e).__name__}: {e}"
        truncated = self.log.size_in_bytes() - valid_bytes
        if truncated > 0:
            self.log.truncate_to(valid_bytes)
        self.offset_index.trim_to_valid_size()
        self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far,
                                     skip_full_check=True)
        self.time_index.trim_to_valid_size()
        self.bytes_since_last_index_entry = 0
        self.rolling_based_timestamp = None
        return truncated

    def _index_stored_batch(self, batch: RecordBatch, position: int, last_index_entry: int) -> int:
        """Index a batch already in the `.log` at `position` as recovery does: an entry when more
        than index.interval.bytes lie between it and the last entry. Returns the position of the
        last entry."""
        if batch.max_timestamp > self.max_timestamp_so_far:
            self._max_ts_so_far = TimestampOffset(batch.max_timestamp, batch.last_offset)
        if position - last_index_entry > self.index_interval_bytes:
            # A segment appended to across restarts (bytes_since_last_index_entry starts at 0 on
            # open) can need more entries than its index holds: a sparse index may skip some,
            # but recovery must not fail.
            if not self.offset_index.is_full():
                self.offset_index.append(batch.last_offset, position)
            if not self.time_index.is_full():
                self.time_index.maybe_append(self.max_timestamp_so_far,
                                             self.offset_of_max_timestamp_so_far)
            return position
        return last_index_entry

    def index_adopted(self, batches: list[RecordBatch]) -> None:
        """kstore addition (Log.adopt_as_leader): this segment's `.log` was written elsewhere and
        renamed in, holding exactly `batches` (validated, offsets assigned). Build the indexes
        recovery would build for it, without reading the file again, and leave the segment ready
        for appends."""
        self._max_ts_so_far = TimestampOffset(-1, self.base_offset)
        last_index_entry = 0
        for batch in batches:
            last_index_entry = self._index_stored_batch(batch, batch.position, last_index_entry)
        self.rolling_based_timestamp = batches[0].max_timestamp
        self.bytes_since_last_index_entry = self.size - last_index_entry

    def _validate_batch_structure(self, batch: RecordBatch) -> None:
        """Header checks beyond the CRC: a format kstore reads, sane counts and offsets."""
        if batch.magic != CURRENT_MAGIC:
            raise InvalidRecordError(
                f"batch at position {batch.position} has magic {batch.magic}; kstore stores only "
                f"message format v2")
        if batch.records_count < 0 or batch.last_offset_delta < 0:
            raise InvalidRecordError(
                f"batch at position {batch.position} has record count {batch.records_count} and "
                f"last offset delta {batch.last_offset_delta}")
        if batch.records_count > batch.last_offset_delta + 1:
            raise InvalidRecordError(
                f"batch at position {batch.position} claims {batch.records_count} records in "
                f"{batch.last_offset_delta + 1} offsets")

    def sanity_check(self) -> None:
        """Raise FileNotFoundError for a missing index and CorruptIndexError for an insane one."""
        for index in (self.offset_index, self.time_index):
            if not os.path.exists(index.path):
                raise FileNotFoundError(f"index file {index.path} is missing")
        self.offset_index.sanity_check()
        self.time_index.sanity_check()
        # kstore addition: an index entry must point inside the log.
        if self.offset_index.entries:
            last = self.offset_index.last_entry()
            if not 0 <= last.position < self.size:
                raise CorruptIndexError(
                    f"index file {self.offset_index.path} has an entry at position "
                    f"{last.position}, beyond the end of the log ({self.size} bytes)")

    # ------------------------------------------------------------------ files
    def flush(self) -> None:
        self.log.flush()
        self.offset_index.flush()
        self.time_index.flush()

    def close(self) -> None:
        if self.read_only:
            self.close_handlers()
            return
        # The final time-index entry (a no-op when the last entry already has this timestamp).
        self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far,
                                     skip_full_check=True)
        self.offset_index.close()
        self.time_index.close()
        self.log.close()

    def close_handlers(self) -> None:
        self.offset_index.close_handler()
        self.time_index.close_handler()
        self.log.close_handlers()

    def change_file_suffixes(self, old_suffix: str, new_suffix: str) -> None:
        """Rename all files of the segment, e.g. '' → '.deleted' (LogSegment.changeFileSuffixes)."""
        for f in (self.log, self.offset_index, self.time_index, self.txn_index):
            path = f.path
            base = path[:-len(old_suffix)] if old_suffix and path.endswith(old_suffix) else path
            f.rename_to(base + new_suffix)

    def has_suffix(self, suffix: str) -> bool:
        return self.log.path.endswith(suffix)

    def delete_files(self) -> None:
        self.log.delete()
        self.offset_index.delete()
        self.time_index.delete()
        self.txn_index.delete()

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self.size}, file={self.log.file_name()})"


NO_MAX_POSITION = _NO_MAX_POSITION

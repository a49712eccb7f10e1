"""One partition's log: an ordered set of segments with a log start offset and a log end offset.

Mirrors Kafka's `UnifiedLog` (offset assignment, validation, roll, read, timestamp lookup,
truncation, flush, leader-epoch cache) together with `LocalLog` (the segment map and its files).
Segments are kept sorted by base offset; the segment that holds an offset is found by bisect
(Kafka uses a skip-list map, `floorEntry`). Only the last segment, the *active* one, is written.

Offsets:
* log start offset (LSO start) — the first offset still readable;
* log end offset (LEO)         — the offset the next record will get;
* high watermark (HW)          — the first offset not yet known to be replicated. With
                                 `single_replica=True` (the default: the leader is the whole ISR)
                                 it follows the LEO after each append, as Kafka's Partition moves
                                 it; the replication layer opens logs with `single_replica=False`
                                 and moves it itself (UnifiedLog alone never moves it on append);
* recovery point               — the first offset not yet known to be fsynced;
* last stable offset (LSO)     — the HW, or the first offset of the oldest transaction still open
                                 (or decided only above the HW) if that is lower; read_committed
                                 readers stop there, and aborted transactions are listed in each
                                 segment's `.txnindex` for them to drop.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import random
import threading
from dataclasses import dataclass
from typing import Iterable, Sequence

from . import log_loader
from .checkpoint import LEADER_EPOCH_CHECKPOINT, fsync_dir
from .clock import SYSTEM, Clock
from .compression import Compression
from .config import LogConfig
from .errors import (CorruptRecordError, InvalidRecordError, LogError, OffsetOutOfRangeError,
                     RecordBatchTooLargeError, RecordTooLargeError)
from .events import EventBus
from .leader_epoch import LeaderEpochFileCache
from .producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS, CompletedTxn, ProducerStateManager
from .transaction_index import AbortedTxn
from . import retention
from .records import (NO_TIMESTAMP, MemoryRecords, Record, RecordBatch, TimestampType,
                      build_batch, set_base_offset, set_max_timestamp, set_partition_leader_epoch)
from .scheduler import Scheduler
from .timestamp_validator import check_timestamps
from .segment import (CLEANED_SUFFIX, DELETED_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX, FetchDataInfo,
                      LogOffsetMetadata, LogSegment, RollParams, TimestampAndOffset, segment_paths)

# ListOffsets special timestamps (ListOffsetsRequest).
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5


class Isolation:
    """How far a read may go (FetchIsolation)."""
    LOG_END = "log_end"                  # followers: up to the LEO
    HIGH_WATERMARK = "high_watermark"    # read_uncommitted consumers: up to the HW
    TXN_COMMITTED = "txn_committed"      # read_committed consumers: up to the LSO


@dataclass(slots=True)
class LogAppendInfo:
    """What an append did (Kafka's LogAppendInfo; mutable like it — and one is made per append,
    where a frozen dataclass's field-by-field `object.__setattr__` would cost microseconds)."""
    first_offset: int
    last_offset: int
    max_timestamp: int
    shallow_offset_of_max_timestamp: int
    log_append_time: int
    log_start_offset: int
    num_messages: int
    valid_bytes: int
    source_compression: Compression
    rolled: bool = False
    duplicate: bool = False   # an idempotent producer's retry: nothing appended, first offsets


def parse_topic_partition(directory: str) -> tuple[str, int]:
    """`orders-3` → ("orders", 3): the partition is after the last '-'."""
    name = os.path.basename(os.path.normpath(directory))
    topic, sep, part = name.rpartition("-")
    if not sep or not topic or not part.isdigit():
        raise LogError(f"found directory {directory!r}, {name!r} is not in the form of "
                       f"topic-partition")
    return topic, int(part)


class Log:
    """A partition log on disk. Open one with `Log.open(directory, config)`."""

    def __init__(self, directory: str, config: LogConfig, clock: Clock, loaded: log_loader.LoadedLog,
                 epoch_cache: LeaderEpochFileCache, events: EventBus, scheduler: Scheduler,
                 high_watermark: int | None, single_replica: bool = True):
        self.dir = str(directory)
        self.topic, self.partition = parse_topic_partition(self.dir)
        self.config = config
        self.clock = clock
        self.events = events
        self.scheduler = scheduler
        self.leader_epoch_cache = epoch_cache
        self.load_report = loaded.report
        self._lock = threading.RLock()
        self._segments: dict[int, LogSegment] = loaded.segments
        self._bases: list[int] = sorted(self._segments)
        self._log_start_offset = loaded.log_start_offset
        self._recovery_point = loaded.recovery_point
        self._next_offset = loaded.next_offset
        self._last_flush_ms = clock.milliseconds()
        self.single_replica = single_replica
        if high_watermark is None:
            high_watermark = self._next_offset if single_replica else self._log_start_offset
        self._high_watermark = min(max(high_watermark, self._log_start_offset), self._next_offset)
        self._producer_state: ProducerStateManager | None = None   # built on first use
        self.producer_id_expiration_ms = DEFAULT_PRODUCER_ID_EXPIRATION_MS
        self._pending_deletes: list[LogSegment] = []   # renamed `.deleted`, handles still open
        self.modification_count = 0   # bumped by truncation and deletion; the cleaner checks it
        self.closed = False

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, directory: str, config: LogConfig | dict | None = None, clock: Clock | None = None,
             *, recovery_point: int = 0, log_start_offset: int = 0, had_clean_shutdown: bool = False,
             high_watermark: int | None = None, events: EventBus | None = None,
             scheduler: Scheduler | None = None, single_replica: bool = True,
             read_only: bool = False) -> "Log":
        """Open (or create) the partition directory `<topic>-<partition>` and load it.

        `recovery_point` and `log_start_offset` come from the log directory's checkpoint files;
        `had_clean_shutdown` from `.kafka_cleanshutdown` (the LogManager reads both).
        `single_replica=False` leaves the high watermark to the replication layer.
        """
        config = config if isinstance(config, LogConfig) else LogConfig(config or {})
        clock = clock or SYSTEM
        parse_topic_partition(directory)
        if not read_only:
            os.makedirs(directory, exist_ok=True)
        epoch_cache = LeaderEpochFileCache(os.path.join(directory, LEADER_EPOCH_CHECKPOINT))
        if read_only:
            epoch_cache.detach_file()   # read it, never write it
        loaded = log_loader.load(directory, config, clock, epoch_cache,
                                 recovery_point_checkpoint=recovery_point,
                                 log_start_offset_checkpoint=log_start_offset,
                                 had_clean_shutdown=had_clean_shutdown, read_only=read_only)
        log = cls(directory, config, clock, loaded, epoch_cache, events or EventBus(),
                  scheduler or Scheduler(clock), high_watermark, single_replica)
        log.read_only = read_only
        log.events.emit("load", log.dir, report=loaded.report, log_end_offset=log.log_end_offset)
        if loaded.report.recovered_segments:
            log.events.emit("recover", log.dir, report=loaded.report)
        if any(s.txn_index_needs_rebuild for s in log.segments):
            log._rebuild_txn_indexes()
        return log

    def _rebuild_txn_indexes(self) -> None:
        """After recovery: replay the batches from the log start and re-append the aborted
        transactions of the recovered segments (LogSegment.recover's updateTxnIndex). kstore
        replays the whole log rather than from a snapshot, since the recovered segments need the
        transactions opened before them."""
        state = ProducerStateManager(None)
        for segment in self.segments:
            for batch in segment.log.batches():
                done = state.update(batch)
                if done is not None and done.is_aborted and segment.txn_index_needs_rebuild:
                    segment.txn_index.append(AbortedTxn(done.producer_id, done.first_offset,
                                                        done.last_offset,
                                                        state.last_stable_offset_after(done)))
            segment.txn_index_needs_rebuild = False

    # ------------------------------------------------------------------ offsets
    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._next_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def unflushed_messages(self) -> int:
        return self._next_offset - self._recovery_point

    def update_high_watermark(self, offset: int) -> int:
        """Set the HW, clamped to [log start offset, LEO]; return the value used."""
        with self._lock:
            old = self._high_watermark
            self._high_watermark = min(max(offset, self._log_start_offset), self._next_offset)
            if self._high_watermark != old:
                self.events.emit("high_watermark", self.dir, old=old, new=self._high_watermark)
            return self._high_watermark

    def maybe_increment_high_watermark(self, offset: int) -> bool:
        """Move the HW forward only (Kafka's maybeIncrementHighWatermark)."""
        with self._lock:
            if offset > self._next_offset:
                raise LogError(f"high watermark {offset} update exceeds the log end offset "
                               f"{self._next_offset}")
            if offset > self._high_watermark:
                self.update_high_watermark(offset)
                return True
            return False

    def maybe_increment_log_start_offset(self, offset: int, reason: str = "") -> bool:
        """Raise the log start offset (never past the HW); cut the epoch cache from the start."""
        with self._lock:
            if offset > self._high_watermark:
                raise OffsetOutOfRangeError(
                    f"cannot increment the log start offset to {offset} of partition {self.name} "
                    f"since it is larger than the high watermark {self._high_watermark}")
            if offset <= self._log_start_offset:
                return False
            self._log_start_offset = offset
            self.leader_epoch_cache.truncate_from_start(offset)
            self.events.emit("log_start_offset", self.dir, offset=offset, reason=reason)
            return True

    @property
    def producer_state(self) -> ProducerStateManager:
        """The idempotent producers' state, built when first needed: the newest `.snapshot` file
        at or below the LEO, then the batch headers above it (UnifiedLog.rebuildProducerState)."""
        with self._lock:
            if self._producer_state is None:
                state = ProducerStateManager(self.dir, self.producer_id_expiration_ms)
                start = state.load(self._log_start_offset, self._next_offset,
                                   self.clock.milliseconds())
                for segment in self.segments:
                    following = self.higher_segment(segment.base_offset)
                    if following is None or following.base_offset > start:
                        position = 0
                        if segment.base_offset < start:
                            # Kafka reads the segment from `start` (segment.read), found through
                            # the offset index: the batches below it are not read at all.
                            found = segment.translate_offset(start)
                            if found is None:
                                continue   # nothing at or above `start` in this segment
                            position = found.position
                        for batch in segment.log.batch_headers(position):
                            if batch.base_offset >= start:
                                if batch.is_control:   # the marker's type is in its record
                                    batch = next(segment.log.batches(batch.position))
                                state.update(batch)
                state.map_end_offset = self._next_offset
                self._producer_state = state
            return self._producer_state

    def remove_expired_producers(self) -> list[int]:
        """Forget producers idle for producer.id.expiration.ms (the periodic expiration check)."""
        with self._lock:
            return self.producer_state.remove_expired(self.clock.milliseconds())

    # ------------------------------------------------------------------ segments
    @property
    def segments(self) -> list[LogSegment]:
        with self._lock:
            return [self._segments[b] for b in self._bases]

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[self._bases[-1]]

    @property
    def number_of_segments(self) -> int:
        return len(self._bases)

    def floor_segment(self, offset: int) -> LogSegment | None:
        """The segment with the largest base offset ≤ `offset` (step 1 of a lookup)."""
        i = bisect.bisect_right(self._bases, offset)
        return self._segments[self._bases[i - 1]] if i else None

    def higher_segment(self, base_offset: int) -> LogSegment | None:
        i = bisect.bisect_right(self._bases, base_offset)
        return self._segments[self._bases[i]] if i < len(self._bases) else None

    def size_in_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def _add_segment(self, segment: LogSegment) -> None:
        if segment.base_offset not in self._segments:
            bisect.insort(self._bases, segment.base_offset)
        self._segments[segment.base_offset] = segment

    def _remove_segment(self, base_offset: int) -> LogSegment:
        self._bases.remove(base_offset)
        return self._segments.pop(base_offset)

    # ------------------------------------------------------------------ appending
    def append(self, records: Iterable[Record | tuple | bytes | None], *, leader_epoch: int = 0,
               compression: Compression | str = Compression.NONE, timestamp: int | None = None,
               producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1
               ) -> LogAppendInfo:
        """Convenience: build one batch from `records` and append it as leader.

        Each item is a `Record`, a `(key, value)` tuple, or a value. Records without a timestamp
        get the clock's time, as a producer stamps CreateTime.
        """
        if isinstance(compression, str):
            compression = Compression.from_name(compression)
        now = self.clock.milliseconds() if timestamp is None else timestamp
        built = [as_record(r, now) for r in records]
        if not built:
            raise InvalidRecordError("an append needs at least one record")
        batch = build_batch(built, compression=compression, producer_id=producer_id,
                            producer_epoch=producer_epoch, base_sequence=base_sequence)
        return self.append_as_leader(batch, leader_epoch=leader_epoch)

    def append_as_leader(self, records: bytes | bytearray | MemoryRecords, leader_epoch: int = 0
                         ) -> LogAppendInfo:
        """Validate producer batches, assign offsets from the LEO, stamp the leader epoch, append."""
        return self._append(records, assign_offsets=True, leader_epoch=leader_epoch)

    def append_as_follower(self, records: bytes | bytearray | MemoryRecords) -> LogAppendInfo:
        """Append batches that already carry offsets (replication); they must start at the LEO."""
        return self._append(records, assign_offsets=False, leader_epoch=None)

    def _append(self, records, *, assign_offsets: bool, leader_epoch: int | None) -> LogAppendInfo:
        # One buffer from request to file: the batches below are views of it, the leader patches
        # offsets and epoch into it in place, and it is what is written to the segment. A writable
        # memoryview (the broker's request buffer) is used as it is; anything else is copied once.
        buf = records.buffer if isinstance(records, MemoryRecords) else records
        if not isinstance(buf, memoryview) or buf.readonly:
            buf = bytearray(buf)
        with self._lock:
            self._check_open()
            batches = self._analyze_and_validate(buf, assign_offsets)
            now = self.clock.milliseconds()
            if not batches:
                return LogAppendInfo(-1, -1, NO_TIMESTAMP, -1, NO_TIMESTAMP, self._log_start_offset,
                                     0, 0, Compression.NONE)
            # The batches lie end to end from the buffer's start: the valid bytes end where the
            # last one does. Drop a partial trailing batch (Kafka's trimInvalidBytes).
            valid_bytes = batches[-1].position + batches[-1].size_in_bytes
            if valid_bytes < len(buf):
                buf = memoryview(buf)[:valid_bytes]
            idempotent = transactional = False
            for batch in batches:
                idempotent = idempotent or batch.producer_id >= 0
                transactional = transactional or batch.is_transactional
            if self._producer_state is None and transactional:
                self.producer_state   # build it now: the append may open or close a transaction
            if assign_offsets and idempotent:
                duplicate = self.producer_state.check_append(batches)
                if duplicate is not None:   # a retry: answer with the first append's offsets
                    return LogAppendInfo(duplicate.first_offset, duplicate.last_offset,
                                         duplicate.timestamp, duplicate.last_offset, NO_TIMESTAMP,
                                         self._log_start_offset, 0, 0, Compression.NONE,
                                         duplicate=True)
            if assign_offsets:
                buf, batches = self._assign_offsets(buf, batches, leader_epoch, now)
            elif batches[0].base_offset < self._next_offset:
                raise LogError(
                    f"unexpected append offset: first offset {batches[0].base_offset} of the "
                    f"appended batches is below the log end offset {self._next_offset} of "
                    f"{self.name}")
            if len(buf) > self.config.segment_bytes:
                raise RecordBatchTooLargeError(
                    f"message batch size is {len(buf)} bytes in append to partition {self.name} "
                    f"which exceeds the maximum configured segment size of "
                    f"{self.config.segment_bytes}")
            info = self._append_info(batches, now, valid_bytes)
            for batch in batches:
                if batch.partition_leader_epoch >= 0:
                    self.leader_epoch_cache.assign(batch.partition_leader_epoch, batch.base_offset)
            segment, rolled = self._maybe_roll(len(buf), info, now)
            position = segment.size
            indexed = segment.append(info.last_offset, info.max_timestamp,
                                     info.shallow_offset_of_max_timestamp, buf)
            self._next_offset = info.last_offset + 1
            if self._producer_state is not None:
                for batch in batches:
                    done = self._producer_state.update(batch)
                    if done is not None:
                        self._complete_txn(segment, done)
            self._appended(info, now, len(buf), position, segment.base_offset, len(batches))
            if indexed:
                self.events.emit("index_entry", self.dir, segment=segment.base_offset,
                                 offset=info.last_offset, position=position)
        self.scheduler.run_due()
        info.rolled = rolled
        return info

    def adopt_as_leader(self, path: str, leader_epoch: int = 0) -> LogAppendInfo | None:
        """kstore addition, with no Kafka counterpart: take a file of producer batches for this
        partition, written beside the log on the same file system, as a new segment at the LEO,
        instead of copying its bytes into the active segment (the Spark sink's staged files).

        The batches pass the checks of append_as_leader and get their offsets and leader epoch
        stamped the same way, in the file itself; then the file is renamed into the partition as
        `<LEO>.log` and becomes the active segment, with the indexes recovery would build for it
        (the segment before it is rolled: its files trimmed, flushed). The mechanics are those
        of Kafka's own renames (the cleaner's `.swap` files, LogSegment.changeFileSuffixes) and
        of its recovery, which rebuilds the indexes of a segment found without them after a
        crash. Returns None, having changed nothing in the log, when the batches are not plain
        producer batches the leader takes as they are (idempotent or transactional ones go
        through the producer state; a topic compression.type other than the batches' makes the
        broker rewrite them), or when the file is empty, larger than segment.bytes or on another
        file system: append its bytes instead. A file that ends inside a batch, or any batch that
        fails the checks, raises and leaves the log and the file unchanged (nothing is stamped
        before every batch passed)."""
        stat = os.stat(path)
        size = stat.st_size
        if not 0 < size <= self.config.segment_bytes or \
                stat.st_dev != os.stat(self.dir).st_dev:                # a rename cannot move it
            return None
        fd = os.open(path, os.O_RDWR)
        try:
            mapped = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        try:
            with self._lock:
                self._check_open()
                try:
                    batches = self._adoptable_batches(memoryview(mapped), path)
                except (CorruptRecordError, InvalidRecordError) as e:
                    cause = str(e).removeprefix(f"append to {self.name}: ")
                    raise type(e)(f"adopting {path} into {self.name}: {cause}") from None
                if batches is None:
                    return None
                now = self.clock.milliseconds()
                _, batches = self._assign_offsets(memoryview(mapped), batches, leader_epoch, now)
                info = self._append_info(batches, now, size)
                for batch in batches:
                    if batch.partition_leader_epoch >= 0:
                        self.leader_epoch_cache.assign(batch.partition_leader_epoch,
                                                       batch.base_offset)
                new_offset = self._next_offset
                active = self._retire_active_segment(new_offset)
                os.rename(path, segment_paths(self.dir, new_offset)[LOG_SUFFIX])
                segment = LogSegment.open(self.dir, new_offset, self.config, self.clock,
                                          file_already_exists=True)
                segment.index_adopted(batches)
                self._start_segment(segment, active, ["adopted"])
                self._next_offset = info.last_offset + 1
                if self._producer_state is not None:    # no producer's batches: only the offset
                    for batch in batches:               # the state covers moves on
                        self._producer_state.update(batch)
                self._appended(info, now, size, 0, new_offset, len(batches))
        finally:
            batches = None                     # views of the mapping, released before it closes
            with contextlib.suppress(BufferError):      # (an exception's frames may hold some:
                mapped.close()                          # the mapping then goes with them)
        self.scheduler.run_due()
        info.rolled = True
        return info

    def _adoptable_batches(self, view: memoryview, path: str) -> list[RecordBatch] | None:
        """The batches of a file to adopt, validated as a leader validates a producer's (None:
        they need the append path)."""
        batches = self._analyze_and_validate(view, True, stamped_from=self._next_offset)
        if not batches or batches[-1].position + batches[-1].size_in_bytes != len(view):
            raise CorruptRecordError("the file ends inside a record batch")
        target = self.config.compression_type
        for b in batches:
            if b.producer_id >= 0 or b.is_transactional or b.is_control or \
                    (target != "producer" and Compression.from_name(target) != b.compression):
                return None
        return batches

    def _appended(self, info: LogAppendInfo, now: int, size: int, position: int, segment: int,
                  batches: int) -> None:
        """After the LEO moved: the HW follows it on a lone replica, flush.messages / flush.ms may
        flush, and views hear of the append."""
        if self.single_replica:
            self.update_high_watermark(self._next_offset)
        if self.unflushed_messages >= self.config.flush_messages or \
                now - self._last_flush_ms >= self.config.flush_ms:
            self.flush()
        self.events.emit("append", self.dir, first_offset=info.first_offset,
                         last_offset=info.last_offset, size=size, position=position,
                         segment=segment, batches=batches)

    def _complete_txn(self, segment: LogSegment, done: CompletedTxn) -> None:
        """A marker closed a transaction: an aborted one gets its `.txnindex` entry in the
        segment holding the marker (UnifiedLog.updateTxnIndex via LogSegment.updateTxnIndex)."""
        if done.is_aborted:
            segment.txn_index.append(AbortedTxn(
                done.producer_id, done.first_offset, done.last_offset,
                self._producer_state.last_stable_offset_after(done)))
        self.events.emit("txn_marker", self.dir, producer_id=done.producer_id,
                         first_offset=done.first_offset, marker_offset=done.last_offset,
                         aborted=done.is_aborted)

    @property
    def last_stable_offset(self) -> int:
        """The LSO: below it every transaction is decided (min of the HW and the first unstable
        offset); read_committed consumers read up to here."""
        with self._lock:
            first = self.producer_state.first_unstable_offset(self._high_watermark)
            return self._high_watermark if first is None else min(first, self._high_watermark)

    def collect_aborted_transactions(self, start_offset: int, upper_bound_offset: int
                                     ) -> list[AbortedTxn]:
        """The aborted transactions overlapping [start, upper bound), from the `.txnindex` files
        of the segment holding `start` onwards (UnifiedLog.collectAbortedTransactions)."""
        with self._lock:
            found: list[AbortedTxn] = []
            first = self.floor_segment(start_offset)
            for segment in self.segments:
                if first is not None and segment.base_offset < first.base_offset:
                    continue
                entries, complete = segment.txn_index.collect_aborted(start_offset,
                                                                      upper_bound_offset)
                found.extend(entries)
                if complete:
                    break
            return found

    def _analyze_and_validate(self, buf: bytearray, from_client: bool,
                              stamped_from: int | None = None) -> list[RecordBatch]:
        """Check each batch's size, CRC and contents (UnifiedLog.analyzeAndValidateRecords and
        LogValidator). A partial trailing batch is ignored, as Kafka trims it. `stamped_from`:
        client batches may also carry the offsets a leader would assign from there (a file
        adopted again after an attempt that stamped it failed)."""
        try:
            batches = MemoryRecords(buf, max_batch_size=None).batches()
        except CorruptRecordError as e:
            raise CorruptRecordError(f"append to {self.name}: {e}") from None
        previous_last = None
        next_stamp = stamped_from
        for batch in batches:
            if next_stamp is not None and batch.base_offset in (0, next_stamp):
                next_stamp += batch.last_offset_delta + 1
            elif from_client and batch.magic >= 2 and batch.base_offset != 0:
                raise InvalidRecordError(
                    f"the baseOffset of the record batch in the append to {self.name} should be "
                    f"0, but it is {batch.base_offset}")
            # A follower takes what its leader accepted, whatever its own max.message.bytes
            # (Kafka's appendAsFollower: ignoreRecordSize), or it could never catch up.
            if from_client and batch.size_in_bytes > self.config.max_message_bytes:
                raise RecordTooLargeError(
                    f"the record batch size in the append to {self.name} is "
                    f"{batch.size_in_bytes} bytes which exceeds the maximum configured value of "
                    f"{self.config.max_message_bytes} (max.message.bytes)")
            # The leader validates the CRC and the records' structure (count, lengths, varints,
            # headers, consecutive offsets); a follower only the CRC, as Kafka's appendAsFollower.
            if from_client:
                null_key = batch.validate()
                check_timestamps(batch, self.config, self.clock)
            else:
                batch.ensure_valid()
                null_key = False
            if self.config.compact and not batch.is_control and null_key:
                raise InvalidRecordError(
                    f"compacted topic cannot accept message without key in topic partition "
                    f"{self.name}")
            if not from_client:   # a follower's batches come with offsets: in order
                if previous_last is not None and batch.base_offset <= previous_last:
                    raise InvalidRecordError(
                        f"out of order offsets in append to {self.name}: batch at "
                        f"{batch.base_offset} follows a batch ending at {previous_last}")
                previous_last = batch.last_offset
        return batches

    def _assign_offsets(self, buf: memoryview, batches: list[RecordBatch], leader_epoch: int,
                        now: int) -> tuple[memoryview | bytes, list[RecordBatch]]:
        """Rewrite each batch header in place: base offset = LEO, leader epoch, maybe
        LogAppendTime (LogValidator.assignOffsetsNonCompressed / in-place compressed path).
        Only a batch the topic's compression.type makes the broker re-compress is rebuilt."""
        target = self.config.compression_type
        log_append_time = self.config.message_timestamp_type == "LogAppendTime"
        offset = self._next_offset
        rebuilt: dict[int, bytearray] = {}
        for batch in batches:
            pos = batch.position
            if target != "producer" and Compression.from_name(target) != batch.compression:
                raw, pos = bytearray(build_batch(
                    batch.records(), compression=Compression.from_name(target),
                    producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
                    base_sequence=batch.base_sequence, transactional=batch.is_transactional,
                    control=batch.is_control)), 0
                rebuilt[batch.position] = raw
            else:
                raw = buf
            set_base_offset(raw, pos, offset)
            set_partition_leader_epoch(raw, pos, leader_epoch)
            if log_append_time:
                set_max_timestamp(raw, pos, TimestampType.LOG_APPEND_TIME, now)
            offset += batch.last_offset_delta + 1
        if rebuilt:
            buf = b"".join(rebuilt.get(b.position) or b.buffer for b in batches)
            return buf, MemoryRecords(buf).batches()
        if log_append_time:   # re-read the patched headers
            return buf, [RecordBatch(b.buffer, b.position) for b in batches]
        offset = self._next_offset   # only the two fields patched above changed: set them
        for batch in batches:
            batch.base_offset, batch.partition_leader_epoch = offset, leader_epoch
            offset += batch.last_offset_delta + 1
        return buf, batches

    def _append_info(self, batches: list[RecordBatch], now: int, valid_bytes: int) -> LogAppendInfo:
        max_ts, offset_of_max, num_messages = NO_TIMESTAMP, batches[0].last_offset, 0
        for b in batches:
            num_messages += b.records_count
            if b.max_timestamp > max_ts:
                max_ts, offset_of_max = b.max_timestamp, b.last_offset
        log_append = self.config.message_timestamp_type == "LogAppendTime"
        # Positional: the keywords of a 9-field constructor cost a microsecond on every append.
        return LogAppendInfo(batches[0].base_offset, batches[-1].last_offset, max_ts, offset_of_max,
                             now if log_append else NO_TIMESTAMP, self._log_start_offset,
                             num_messages, valid_bytes, batches[0].compression)

    # ------------------------------------------------------------------ rolling
    def _maybe_roll(self, messages_size: int, info: LogAppendInfo, now: int
                    ) -> tuple[LogSegment, bool]:
        segment = self.active_segment
        params = RollParams(self.config.max_segment_ms, self.config.segment_bytes,
                            info.max_timestamp, info.last_offset, messages_size, now)
        if segment.should_roll(params):
            reasons = segment.roll_reasons(params)
            return self.roll(info.first_offset, reasons=reasons), True
        return segment, False

    def roll(self, expected_next_offset: int | None = None, reasons: Sequence[str] = ("requested",)
             ) -> LogSegment:
        """Close the active segment to appends and start a new one at max(expected, LEO)."""
        with self._lock:
            self._check_open()
            new_offset = max(expected_next_offset or 0, self._next_offset)
            active = self._retire_active_segment(new_offset, expected_next_offset)
            jitter = 0
            if self.config.segment_jitter_ms > 0:
                jitter = random.randrange(1 << 31) % min(self.config.segment_jitter_ms,
                                                          self.config.segment_ms)
            segment = LogSegment.open(self.dir, new_offset, self.config, self.clock,
                                      init_file_size=self.config.initial_file_size,
                                      preallocate=self.config.preallocate, roll_jitter_ms=jitter)
            self._start_segment(segment, active, reasons)
            return segment

    def _retire_active_segment(self, new_offset: int, expected_next_offset: int | None = None
                               ) -> LogSegment:
        """The first half of a roll: make room for a segment starting at `new_offset` (the active
        segment closed to appends, or deleted if it is empty at that very offset). Returns the
        segment that was active."""
        active = self.active_segment
        if new_offset in self._segments:
            if active.base_offset == new_offset and active.size == 0:
                # An empty active segment at the same offset is simply replaced.
                self._remove_segment(new_offset)
                active.delete_files()
            else:
                raise LogError(
                    f"trying to roll a new log segment for {self.name} with start offset "
                    f"{new_offset} = max(provided offset = {expected_next_offset}, LEO = "
                    f"{self._next_offset}) while it already exists and is active with size "
                    f"{active.size}")
        elif new_offset < active.base_offset:
            raise LogError(
                f"trying to roll a new log segment for {self.name} with start offset "
                f"{new_offset} lower than start offset of the active segment {active}")
        else:
            for path in segment_paths(self.dir, new_offset).values():
                if os.path.exists(path):  # a stray file with the new segment's name
                    os.remove(path)
            active.on_become_inactive_segment()
        return active

    def _start_segment(self, segment: LogSegment, active: LogSegment, reasons: Sequence[str]) -> None:
        """The second half of a roll: `segment` becomes the active one."""
        new_offset = segment.base_offset
        self._add_segment(segment)
        self.producer_state.take_snapshot(new_offset)
        # Kafka flushes the rolled segments asynchronously; kstore does it right away.
        self.flush(new_offset)
        self.events.emit("roll", self.dir, new_segment=new_offset, old_segment=active.base_offset
                         if active is not segment else None, reasons=list(reasons))

    # ------------------------------------------------------------------ reading
    def read(self, start_offset: int, max_length: int = 1024 * 1024,
             isolation: str = Isolation.LOG_END, min_one_message: bool = True) -> FetchDataInfo:
        """Read batches from `start_offset` (UnifiedLog.read + LocalLog.read).

        Offsets below the log start offset or above the LEO raise OffsetOutOfRangeError. Reading
        at the bound (LEO / HW) gives an empty result. The result starts at the batch holding
        `start_offset` (which may begin below it) and may end inside a batch.
        """
        with self._lock:
            self._check_open()
            if start_offset < self._log_start_offset:
                raise OffsetOutOfRangeError(
                    f"received request for offset {start_offset} for partition {self.name}, but "
                    f"we only have log segments starting from offset: {self._log_start_offset}")
            if isolation == Isolation.LOG_END:
                bound = self._next_offset
            elif isolation == Isolation.HIGH_WATERMARK:
                bound = self._high_watermark
            elif isolation == Isolation.TXN_COMMITTED:
                bound = self.last_stable_offset
            else:
                raise ValueError(f"unknown isolation {isolation!r}")
            segment = self.floor_segment(start_offset)
            if start_offset > self._next_offset or segment is None:
                raise OffsetOutOfRangeError(
                    f"received request for offset {start_offset} for partition {self.name}, but "
                    f"we only have log segments upto {self._next_offset}")
            if start_offset >= bound:
                return FetchDataInfo(self._offset_metadata(start_offset), None)
            bound_md = self._offset_metadata(bound)
            while segment is not None:
                if bound_md.segment_base_offset > segment.base_offset:
                    max_position = segment.size
                elif bound_md.segment_base_offset == segment.base_offset:
                    max_position = bound_md.relative_position_in_segment
                else:
                    max_position = 0
                fetch = segment.read(start_offset, max_length, max_position, min_one_message)
                if fetch is not None:
                    return fetch
                segment = self.higher_segment(segment.base_offset)
            return FetchDataInfo(self._offset_metadata(self._next_offset), None)

    def _offset_metadata(self, offset: int) -> LogOffsetMetadata:
        """Where `offset` sits: its segment and the position of the batch holding it."""
        if offset >= self._next_offset:
            active = self.active_segment
            return LogOffsetMetadata(offset, active.base_offset, active.size)
        segment = self.floor_segment(offset)
        while segment is not None:
            found = segment.translate_offset(offset)
            if found is not None:
                return LogOffsetMetadata(offset, segment.base_offset, found.position)
            segment = self.higher_segment(segment.base_offset)
        return LogOffsetMetadata(offset)

    def read_records(self, start_offset: int, max_length: int = 1024 * 1024,
                     isolation: str = Isolation.LOG_END) -> list[Record]:
        """Read and decode: records with offset ≥ start_offset from complete batches, control
        batches skipped (what a consumer sees from one fetch)."""
        fetch = self.read(start_offset, max_length, isolation)
        return [r for b in fetch.batches() if not b.is_control
                for r in b.records() if r.offset >= start_offset]

    def records(self, start_offset: int | None = None, isolation: str = Isolation.LOG_END) -> list[Record]:
        """Every record from `start_offset` (default: log start) to the bound, across fetches."""
        offset = self._log_start_offset if start_offset is None else start_offset
        return [r for b in self.batches(offset, isolation) if not b.is_control
                for r in b.records() if r.offset >= offset]

    def committed_records(self, start_offset: int | None = None) -> list[Record]:
        """What a read_committed consumer ends up with: the records below the LSO, less those of
        aborted transactions, which the consumer drops using the fetch's aborted-transactions
        list (Kafka's consumer does this on the client side)."""
        offset = self._log_start_offset if start_offset is None else start_offset
        from .completed_fetch import committed_batches
        aborted = self.collect_aborted_transactions(offset, self.last_stable_offset)
        batches = list(self.batches(offset, Isolation.TXN_COMMITTED))
        return [r for b in committed_batches(batches, aborted) for r in b.records() if r.offset >= offset]

    def batches(self, start_offset: int | None = None, isolation: str = Isolation.LOG_END):
        """Every batch (control batches included) from the one holding `start_offset` to the bound."""
        offset = self._log_start_offset if start_offset is None else start_offset
        while True:
            batches = self.read(offset, 1024 * 1024, isolation).batches()
            if not batches:
                return
            yield from batches
            offset = batches[-1].next_offset

    # ------------------------------------------------------------------ timestamps
    def fetch_offset_by_timestamp(self, target: int) -> TimestampAndOffset | None:
        """The first offset whose record timestamp ≥ target, or a special answer for −1/−2/−3."""
        with self._lock:
            self._check_open()
            if target in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
                first = self.leader_epoch_cache.earliest_entry()
                epoch = first.epoch if first and first.start_offset <= self._log_start_offset else None
                return TimestampAndOffset(NO_TIMESTAMP, self._log_start_offset, epoch)
            if target == LATEST_TIMESTAMP:
                return TimestampAndOffset(NO_TIMESTAMP, self._next_offset,
                                          self.leader_epoch_cache.latest_epoch())
            if target == LATEST_TIERED_TIMESTAMP:
                return TimestampAndOffset(NO_TIMESTAMP, -1, None)
            if target == MAX_TIMESTAMP:
                best = max(self.segments, key=lambda s: s.max_timestamp_so_far)
                if best.max_timestamp_so_far < 0:
                    return None
                return best.find_offset_by_timestamp(best.max_timestamp_so_far, self._log_start_offset)
            if target < 0:
                raise ValueError(f"invalid target timestamp {target}")
            for segment in self.segments:
                if segment.largest_timestamp >= target:
                    return segment.find_offset_by_timestamp(target, self._log_start_offset)
            return None

    # ------------------------------------------------------------------ truncation
    def truncate_to(self, target_offset: int) -> bool:
        """Remove everything at or above `target_offset` (a follower after a leader change)."""
        if target_offset < 0:
            raise ValueError(f"cannot truncate partition {self.name} to a negative offset "
                             f"({target_offset})")
        with self._lock:
            self._check_open()
            if target_offset >= self._next_offset:
                self.leader_epoch_cache.truncate_from_end(self._next_offset)
                return False
            if self.segments[0].base_offset > target_offset:
                self.truncate_fully_and_start_at(target_offset)
                return True
            old_leo = self._next_offset
            self.modification_count += 1
            for base in [b for b in self._bases if b > target_offset]:
                self._delete_segment_files(self._remove_segment(base))
            truncated = self.active_segment.truncate_to(target_offset)
            self._next_offset = target_offset
            self._reset_producer_state(keep_snapshots_up_to=target_offset)
            self.leader_epoch_cache.truncate_from_end(target_offset)
            self._log_start_offset = min(self._log_start_offset, target_offset)
            self._recovery_point = min(self._recovery_point, target_offset)
            if self._high_watermark > target_offset:
                self.update_high_watermark(target_offset)
            self.events.emit("truncate", self.dir, target_offset=target_offset,
                             old_log_end_offset=old_leo, bytes=truncated)
            return True

    def truncate_fully_and_start_at(self, new_offset: int) -> None:
        """Delete every segment and start empty at `new_offset`."""
        with self._lock:
            self._check_open()
            old_leo = self._next_offset
            self.modification_count += 1
            for base in list(self._bases):
                self._delete_segment_files(self._remove_segment(base))
            segment = LogSegment.open(self.dir, new_offset, self.config, self.clock,
                                      init_file_size=self.config.initial_file_size,
                                      preallocate=self.config.preallocate)
            self._add_segment(segment)
            self.leader_epoch_cache.clear()
            self._reset_producer_state(keep_snapshots_up_to=-1)
            self._next_offset = new_offset
            self._log_start_offset = new_offset
            self._recovery_point = new_offset
            self._high_watermark = new_offset
            self.events.emit("truncate", self.dir, target_offset=new_offset,
                             old_log_end_offset=old_leo, full=True)

    def _reset_producer_state(self, keep_snapshots_up_to: int) -> None:
        """After a truncation: drop the snapshots above the new end; rebuild when next needed."""
        ProducerStateManager(self.dir).delete_snapshots(lambda o: o <= keep_snapshots_up_to)
        self._producer_state = None

    def _delete_segment_files(self, segment: LogSegment, reason: str = "truncation") -> None:
        """Rename to `.deleted` now; remove after file.delete.delay.ms (LocalLog.deleteSegmentFiles).

        The file handles stay open until then, so a read already under way (a fetch being sent, a
        cleaning pass) finishes on the renamed file, as in Kafka."""
        segment.change_file_suffixes("", DELETED_SUFFIX)
        self._pending_deletes.append(segment)

        def delete() -> None:
            segment.delete_files()
            if segment in self._pending_deletes:
                self._pending_deletes.remove(segment)
        self.scheduler.schedule(f"delete-file-{segment.base_offset}", delete,
                                delay_ms=self.config.file_delete_delay_ms)
        self.events.emit("delete", self.dir, segment=segment.base_offset,
                         files=segment.file_names(), reason=reason)

    # ------------------------------------------------------------------ retention
    def delete_old_segments(self) -> int:
        """One retention pass over this log; returns the number of segments deleted.

        Kafka's order: log-start-offset breach, then size, then time (time and size only when
        cleanup.policy contains `delete`). Each rule sees the log the previous one left.
        """
        deleted = self._delete_by(retention.log_start_offset_breached(self._log_start_offset),
                                  "log start offset breach")
        if self.config.delete:
            deleted += self._delete_by(retention.retention_size_breached(
                self.size_in_bytes(), self.config.retention_bytes), "retention size breach")
            deleted += self._delete_by(retention.retention_ms_breached(
                self.clock.milliseconds(), self.config.retention_ms), "retention time breach")
        self.scheduler.run_due()
        return deleted

    def _delete_by(self, predicate, reason: str) -> int:
        if predicate is None:
            return 0
        with self._lock:
            self._check_open()
            deletable = retention.deletable_segments(
                self.segments, predicate, high_watermark=self._high_watermark,
                log_end_offset=self._next_offset)
            return self._delete_segments(deletable, reason)

    def _delete_segments(self, deletable: list[LogSegment], reason: str) -> int:
        """Remove `deletable` (a prefix) from the log; roll first if every segment goes, so the
        log always keeps one (UnifiedLog.deleteSegments)."""
        if not deletable:
            return 0
        self.modification_count += 1
        to_delete = list(deletable)
        if len(to_delete) == self.number_of_segments:
            new_segment = self.roll(reasons=[f"{reason}: every segment is deletable"])
            if to_delete[-1].base_offset == new_segment.base_offset:
                to_delete = to_delete[:-1]   # the empty active segment was replaced, not deleted
        for segment in to_delete:
            self._remove_segment(segment.base_offset)
            self._delete_segment_files(segment, reason)
        self.maybe_increment_log_start_offset(self.segments[0].base_offset, reason)
        # Kafka keeps the producers' state (until it expires) but not the deleted segments' snapshots
        gone = {s.base_offset for s in to_delete}
        ProducerStateManager(self.dir).delete_snapshots(lambda o: o not in gone)
        return len(deletable)

    def replace_segments(self, new_segments: list[LogSegment], old_segments: list[LogSegment]) -> None:
        """Swap cleaned segments in, crash-safely (LocalLog.replaceSegments): the new files go
        `.cleaned` → `.swap`, the old ones are renamed `.deleted`, then `.swap` is dropped. A crash
        at any point is completed or undone by the loader."""
        with self._lock:
            self._check_open()
            new_sorted = sorted(new_segments, key=lambda s: s.base_offset)
            old_sorted = sorted((s for s in old_segments if self._segments.get(s.base_offset) is s),
                                key=lambda s: s.base_offset)
            for segment in reversed(new_sorted):
                segment.change_file_suffixes(CLEANED_SUFFIX, SWAP_SUFFIX)
            for segment in reversed(new_sorted):
                self._add_segment(segment)
            for old in old_sorted:
                if old.base_offset != new_sorted[0].base_offset:
                    self._remove_segment(old.base_offset)
                self._delete_segment_files(old, "replaced by cleaned segment")
            for segment in new_sorted:
                segment.change_file_suffixes(SWAP_SUFFIX, "")
            fsync_dir(self.dir)   # producer state stays: the cleaner keeps each producer's last batch
            replaced = {o.base_offset for o in old_sorted} - {n.base_offset for n in new_sorted}
            ProducerStateManager(self.dir).delete_snapshots(lambda o: o not in replaced)

    # ------------------------------------------------------------------ durability
    def flush(self, offset: int | None = None) -> None:
        """fsync every segment holding offsets in [recovery point, offset) and move the recovery
        point to `offset` (default: the LEO)."""
        with self._lock:
            self._check_open()
            offset = self._next_offset if offset is None else offset
            if offset <= self._recovery_point:
                return
            flushed = [s for s in self.segments
                       if s.base_offset < offset and
                       (self.higher_segment(s.base_offset) is None
                        or self.higher_segment(s.base_offset).base_offset > self._recovery_point)]
            for segment in flushed:
                segment.flush()
            fsync_dir(self.dir)  # new segment files must survive too
            old = self._recovery_point
            self._recovery_point = offset
            self._last_flush_ms = self.clock.milliseconds()
            self.events.emit("flush", self.dir, old_recovery_point=old, recovery_point=offset,
                             segments=[s.base_offset for s in flushed])

    read_only = False   # opened by an offline read-only tool: no file is ever written

    def close(self, flush: bool = True) -> None:
        """Flush (by default) and close every segment, trimming the indexes to their entries."""
        with self._lock:
            if self.closed:
                return
            if flush and not self.read_only:
                self.flush()
                try:   # clean shutdown; a directory we may not write to only loses the snapshot
                    self.producer_state.take_snapshot(self._next_offset)
                except OSError:
                    pass
            for segment in self.segments:
                segment.close()
            for segment in self._pending_deletes:   # removed at the next load
                segment.close_handlers()
            self.closed = True
            self.events.emit("close", self.dir)

    def lose_unflushed_data(self) -> int:
        """Simulate a power loss: cut the files back to the recovery point (what was fsynced).
        Returns the bytes lost. The in-memory log is stale afterwards: close and reopen it."""
        with self._lock:
            lost = 0
            for segment in self.segments:
                if segment.base_offset >= self._recovery_point:
                    lost += segment.size
                    segment.log.truncate_to(0)
                else:
                    following = self.higher_segment(segment.base_offset)
                    if following is None or following.base_offset > self._recovery_point:
                        found = segment.translate_offset(self._recovery_point)
                        if found is not None:
                            lost += segment.log.truncate_to(found.position)
            return lost

    def close_without_flush(self) -> None:
        """Drop file handles without flushing or trimming: what a crash leaves (for tests)."""
        with self._lock:
            for segment in self.segments + self._pending_deletes:
                segment.close_handlers()
            self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise LogError(f"log {self.name} is closed")

    def __repr__(self) -> str:
        return (f"Log({self.name}, segments={self._bases}, log_start_offset="
                f"{self._log_start_offset}, log_end_offset={self._next_offset}, "
                f"high_watermark={self._high_watermark})")

    def __enter__(self) -> "Log":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def as_record(item, now: int) -> Record:
    """A Record from a Record, a (key, value) tuple or a value; no timestamp → `now` (CreateTime)."""
    if isinstance(item, Record):
        return item if item.timestamp >= 0 else Record(item.key, item.value, now, item.headers)
    if isinstance(item, tuple):
        key, value = item
        return Record(to_bytes(key), to_bytes(value), now)
    return Record(None, to_bytes(item), now)


def to_bytes(v) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"record keys and values must be bytes, str or None, not {type(v).__name__}")


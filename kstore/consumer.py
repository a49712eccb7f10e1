"""An in-process consumer: assign partitions, seek, poll, and commit offsets.

Mirrors the shape of Kafka's `KafkaConsumer` with `assign()` (no group rebalancing):
* the position of each assigned partition is the next offset to return; it starts from the
  group's committed offset, else `auto.offset.reset` (earliest / latest / none);
* `poll()` fetches from each partition up to the high watermark, returns at most
  `max.poll.records` records, and moves the positions past them; it skips records below the
  position (a fetch starts at a batch boundary), control batches, and offset gaps;
* commits: `commit()` (sync: written before it returns), `commit_async()` (queued, written on the
  next poll, its callback called then), and auto-commit (`enable.auto.commit`, every
  `auto.commit.interval.ms`, of the positions returned by earlier polls — done at the start of
  `poll()` and on `close()`, as Kafka does);
* `check.crcs` (Kafka's name and default, true): every fetched batch's CRC-32C is checked before
  its records are used, and a batch that fails — or whose records do not decode — raises
  CorruptRecordError naming topic, partition, offset and (read from a log dir) the file.
Consequences the course shows: auto-commit or commit-after-processing gives at-least-once (a crash
between processing and commit re-delivers); committing before processing gives at-most-once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from .clock import Clock
from .errors import (CorruptRecordError, InvalidRecordError, KStoreError,
                     NoOffsetForPartitionError, OffsetOutOfRangeError, UnknownTopicOrPartitionError)
from .group_coordinator import OffsetAndMetadata
from .completed_fetch import committed_batches
from .log import Isolation
from .records import CURRENT_MAGIC, check_batch

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: str
    key: bytes | None
    value: bytes | None
    headers: tuple
    leader_epoch: int | None


class Consumer:
    def __init__(self, broker, *, group_id: str | None = None, enable_auto_commit: bool = True,
                 auto_commit_interval_ms: int = 5000, auto_offset_reset: str = "latest",
                 max_poll_records: int = 500, max_partition_fetch_bytes: int = 1048576,
                 isolation_level: str = "read_uncommitted", clock: Clock | None = None,
                 check_crcs: bool = True):
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(f"auto.offset.reset must be earliest, latest or none, "
                             f"not {auto_offset_reset!r}")
        if max_poll_records < 1:
            raise ValueError("max.poll.records must be at least 1")
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError(f"unknown isolation.level {isolation_level!r}")
        self.broker = broker
        self.check_crcs = check_crcs
        self.group_id = group_id
        self.enable_auto_commit = enable_auto_commit and group_id is not None
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.auto_offset_reset = auto_offset_reset
        self.max_poll_records = max_poll_records
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.isolation = (Isolation.HIGH_WATERMARK if isolation_level == "read_uncommitted"
                          else Isolation.TXN_COMMITTED)
        self.clock = clock or broker.clock
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._pending_async: list[tuple[dict, Callable | None]] = []
        self._next_auto_commit = self.clock.milliseconds() + auto_commit_interval_ms
        self._round_robin = 0
        self.group_member = None    # a ConsumerCoordinator when the consumer subscribed
        self.closed = False

    # ---- assignment and positions
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        partitions = [(t, int(p)) for t, p in partitions]
        for t, p in partitions:
            if not 0 <= p < self.broker.partition_count(t):   # raises for an unknown topic
                raise UnknownTopicOrPartitionError(f"topic '{t}' has no partition {p}")
        self._assignment = partitions
        self._positions = {tp: o for tp, o in self._positions.items() if tp in partitions}

    def assignment(self) -> list[TopicPartition]:
        return list(self._assignment)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._check_assigned(tp)
        if offset < 0:
            raise ValueError(f"seek offset must not be negative: {offset}")
        self._positions[tp] = offset

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        for tp in partitions or self._assignment:
            self.seek(tp, self.broker.list_offsets(*tp, -2).offset)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        for tp in partitions or self._assignment:
            self.seek(tp, self.broker.list_offsets(*tp, -1).offset)

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict:
        """The earliest offset whose timestamp ≥ the given one, per partition (None if none)."""
        out = {}
        for tp, ts in timestamps.items():
            found = self.broker.list_offsets(*tp, ts)
            out[tp] = None if found.offset < 0 else found
        return out

    def seek_to_timestamp(self, tp: TopicPartition, timestamp: int) -> None:
        found = self.offsets_for_times({tp: timestamp})[tp]
        self.seek(tp, found.offset if found else self.broker.list_offsets(*tp, -1).offset)

    def position(self, tp: TopicPartition) -> int:
        self._check_assigned(tp)
        if tp not in self._positions:
            self._positions[tp] = self._initial_position(tp)
        return self._positions[tp]

    def _initial_position(self, tp: TopicPartition) -> int:
        if self.group_id is not None:
            committed = self.committed(tp)
            if committed is not None:
                return committed.offset
        if self.auto_offset_reset == "none":
            raise NoOffsetForPartitionError(
                f"no committed offset for {tp[0]}-{tp[1]} and auto.offset.reset is none")
        return self.broker.list_offsets(*tp, -2 if self.auto_offset_reset == "earliest" else -1).offset

    def _check_assigned(self, tp: TopicPartition) -> None:
        if tp not in self._assignment:
            raise KStoreError(f"{tp[0]}-{tp[1]} is not assigned to this consumer")

    # ---- polling
    def poll(self, max_records: int | None = None) -> list[ConsumerRecord]:
        if self.closed:
            raise KStoreError("the consumer is closed")
        self._run_async_commits()
        self._maybe_auto_commit()
        limit = min(max_records or self.max_poll_records, self.max_poll_records)
        out: list[ConsumerRecord] = []
        n = len(self._assignment)
        for i in range(n):   # rotate the starting partition so none starves
            tp = self._assignment[(self._round_robin + i) % n]
            if len(out) >= limit:
                break
            out.extend(self._fetch(tp, limit - len(out)))
        self._round_robin = (self._round_robin + 1) % max(n, 1)
        return out

    def _fetch(self, tp: TopicPartition, limit: int) -> list[ConsumerRecord]:
        position = self.position(tp)
        try:
            result = self.broker.fetch(tp[0], tp[1], position, self.max_partition_fetch_bytes,
                                       self.isolation)
        except OffsetOutOfRangeError:
            if self.auto_offset_reset == "none":
                raise
            reset = self.broker.list_offsets(*tp, -2 if self.auto_offset_reset == "earliest" else -1)
            self._positions[tp] = reset.offset
            return []
        out = []
        file = getattr(getattr(result.data, "records", None), "file", None)   # read from a log dir
        batches = list(result.data.batches())
        delivered = None                # read_committed: aborted transactions' batches are dropped
        if self.isolation == Isolation.TXN_COMMITTED:
            delivered = {b.base_offset for b in committed_batches(batches, getattr(result, "aborted_transactions", ()))}
        for batch in batches:
            try:
                records = self._checked_records(tp, batch, file)
            except CorruptRecordError:
                if out:   # as Kafka's fetcher: hand over the good records, raise on the next poll
                    self._positions[tp] = position
                    return out
                raise
            if records is None or (delivered is not None and batch.base_offset not in delivered):
                position = max(position, batch.next_offset)
                continue
            ts_type = batch.timestamp_type.kafka_name
            epoch = batch.partition_leader_epoch if batch.partition_leader_epoch >= 0 else None
            for r in records:
                if r.offset < position:
                    continue
                if len(out) >= limit:
                    self._positions[tp] = position
                    return out
                out.append(ConsumerRecord(tp[0], tp[1], r.offset, r.timestamp, ts_type, r.key,
                                          r.value, r.headers, epoch))
                position = r.offset + 1
            position = max(position, batch.next_offset)   # skip a compacted tail / offset gaps
        # Reads stop at the HW's byte position, so complete batches never carry us past it.
        self._positions[tp] = position
        return out

    def _checked_records(self, tp: TopicPartition, batch, file) -> list | None:
        """The records of a fetched batch (None for a control or empty batch), after the CRC
        check (check.crcs) and with a structure error reported like a CRC error."""
        if self.check_crcs and batch.magic == CURRENT_MAGIC:
            check_batch(batch.buffer, topic=tp[0], partition=tp[1],
                        file=file.path if file else None,
                        file_position=batch.position if file else None)
        if batch.is_control or not batch.records_count:
            return None
        try:
            return batch.records()
        except (CorruptRecordError, InvalidRecordError) as e:   # the structure inside
            where = f" (file {file.path}, position {batch.position})" if file else ""
            raise CorruptRecordError(f"Record batch for partition {tp[0]}-{tp[1]} at offset "
                                     f"{batch.base_offset}{where} is invalid, cause: {e}") from None

    # ---- committing
    def _current_offsets(self) -> dict[TopicPartition, int]:
        return {tp: o for tp, o in self._positions.items() if tp in self._assignment}

    def commit(self, offsets: dict[TopicPartition, int] | None = None) -> dict:
        """Commit synchronously: the offsets are in `__consumer_offsets` when this returns.
        The committed offset is the next record to read (last processed + 1)."""
        if self.group_id is None:
            raise KStoreError("commit needs a group_id")
        offsets = self._current_offsets() if offsets is None else offsets
        member = self.group_member.commit_identity() if self.group_member is not None else {}
        return self.broker.group_coordinator.commit_offsets(
            self.group_id, {tp: OffsetAndMetadata(o) for tp, o in offsets.items()}, **member)

    def commit_async(self, offsets: dict[TopicPartition, int] | None = None,
                     callback: Callable[[dict, BaseException | None], None] | None = None) -> None:
        """Queue a commit; it is written on the next poll() (or close()), then `callback(offsets,
        error)` runs — the order in which Kafka's async commits complete."""
        if self.group_id is None:
            raise KStoreError("commit needs a group_id")
        self._pending_async.append((self._current_offsets() if offsets is None else dict(offsets),
                                    callback))

    def _run_async_commits(self) -> None:
        pending, self._pending_async = self._pending_async, []
        for offsets, callback in pending:
            error = None
            try:
                self.commit(offsets)
            except KStoreError as e:
                error = e
            if callback is not None:
                callback(offsets, error)

    def _maybe_auto_commit(self, force: bool = False) -> None:
        if not self.enable_auto_commit:
            return
        now = self.clock.milliseconds()
        if force or now >= self._next_auto_commit:
            if self._current_offsets():
                self.commit()
            self._next_auto_commit = now + self.auto_commit_interval_ms

    def committed(self, tp: TopicPartition) -> OffsetAndMetadata | None:
        if self.group_id is None:
            return None
        return self.broker.group_coordinator.fetch_offsets(self.group_id, [tp])[tp]

    def close(self, autocommit: bool = True) -> None:
        if self.closed:
            return
        self._run_async_commits()
        if autocommit:
            self._maybe_auto_commit(force=True)
        self.closed = True

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

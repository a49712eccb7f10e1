"""What each idempotent producer last wrote to a partition, and the checks a leader makes with it.

Mirrors Kafka's `ProducerStateManager` with `ProducerStateEntry`, `BatchMetadata` and the checks of
`ProducerAppendInfo`. For every producer id the partition keeps the epoch and the metadata of the
producer's last 5 batches (first/last sequence, first/last offset). On a leader append of a client
batch (`check_append`):

* a batch whose epoch and exact sequence range match one of the cached 5 is a *duplicate* (the
  producer retried after losing the response): it is not appended again and the append answers with
  the offsets the batch got the first time (Kafka answers success, not DUPLICATE_SEQUENCE_NUMBER);
* an epoch below the producer's current one answers INVALID_PRODUCER_EPOCH (since Kafka 2.7 the
  produce path says this, not PRODUCER_FENCED, which only the transaction coordinator answers);
* a new epoch must start at sequence 0, else OUT_OF_ORDER_SEQUENCE_NUMBER;
* the same epoch must continue at last sequence + 1 (wrapping from Int.MaxValue to 0), else
  OUT_OF_ORDER_SEQUENCE_NUMBER;
* a producer id the partition has no state for is accepted at any sequence (KIP-360: its state may
  have expired, or been lost with its data): the broker no longer answers UNKNOWN_PRODUCER_ID.

Followers and log loading apply batches without checks (`update`), so a follower that becomes leader
knows the same producers. The state is written to `<offset>.snapshot` files (`producer_snapshot`)
at every roll and clean shutdown; loading reads the newest snapshot at or below the log end offset
and replays the batch headers above it. Producers idle for `producer.id.expiration.ms` are removed
(`remove_expired`). Retention deleting a producer's batches does not remove its state (Kafka keeps
it in memory until it expires); snapshots at or below the log start offset are deleted, so after a
restart a producer known only from deleted data is unknown again.

Transactions: the first offset of each producer's ongoing transaction is tracked (a transactional
data batch opens one, a COMMIT/ABORT marker closes it: `update` then returns the `CompletedTxn`).
The smallest such first offset, with those of completed transactions whose marker is not yet below
the high watermark, is the *first unstable offset*; the log's last stable offset (LSO) is the
smaller of it and the HW. Snapshots keep the ongoing transaction's first offset (the
`current_txn_first_offset` field), and producers with an open transaction never expire.

A marker a coordinator appends is checked as Kafka's `ProducerAppendInfo.appendEndTxnMarker` does:
its producer epoch must not be older than the producer's (INVALID_PRODUCER_EPOCH), and its
coordinator epoch (in the marker's value) not older than the last marker's: a coordinator that lost
its `__transaction_state` partition to another broker is a zombie (TRANSACTION_COORDINATOR_FENCED).
Replicated markers are not checked (the leader did).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import Iterable

import struct

from .errors import (CorruptRecordError, InvalidProducerEpochError, OutOfOrderSequenceError,
                     TransactionCoordinatorFencedError)
from .records import (NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, ControlRecordType,
                      RecordBatch, decrement_sequence)
from . import producer_snapshot

_log = logging.getLogger("kstore.producer_state")
_log.addHandler(logging.NullHandler())   # quiet as a library (notebooks); the CLI and serve show it

NUM_BATCHES_TO_RETAIN = 5                 # ProducerStateEntry.NUM_BATCHES_TO_RETAIN
INT32_MAX = (1 << 31) - 1
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86400000   # producer.id.expiration.ms

# The decision for an incoming batch (what `decide` answers).
APPEND = "APPEND"
DUPLICATE = "DUPLICATE"
OUT_OF_ORDER_SEQUENCE = "OUT_OF_ORDER_SEQUENCE_NUMBER"
INVALID_PRODUCER_EPOCH = "INVALID_PRODUCER_EPOCH"


@dataclass(frozen=True)
class BatchMetadata:
    """One cached batch of a producer (Kafka's BatchMetadata)."""
    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_seq(self) -> int:
        return decrement_sequence(self.last_seq, self.offset_delta)

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@dataclass(frozen=True)
class ProducerEntry:
    """One producer's state in one partition (Kafka's ProducerStateEntry)."""
    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: tuple[BatchMetadata, ...] = ()   # oldest first, at most NUM_BATCHES_TO_RETAIN
    last_timestamp: int = -1
    coordinator_epoch: int = -1

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_data_offset(self) -> int | None:
        """None when the producer's last batch was a control batch (or none is cached)."""
        return self.batches[-1].last_offset if self.batches else None

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The cached batch with exactly this epoch and sequence range (findDuplicateBatch)."""
        if epoch != self.producer_epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None

    def with_batch(self, epoch: int, batch: BatchMetadata) -> "ProducerEntry":
        """The entry after a data batch: a new epoch forgets the old epoch's batches."""
        kept = self.batches if epoch == self.producer_epoch else ()
        return ProducerEntry(self.producer_id, epoch, (kept + (batch,))[-NUM_BATCHES_TO_RETAIN:],
                             batch.timestamp, self.coordinator_epoch)   # (once per batch appended)


@dataclass(frozen=True)
class CompletedTxn:
    """A transaction closed by a marker (Kafka's CompletedTxn): first data offset, marker offset."""
    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """`next_seq` follows `last_seq`; after Int.MaxValue comes 0."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def decide(entry: ProducerEntry | None, epoch: int, first_seq: int, last_seq: int
           ) -> tuple[str, BatchMetadata | None]:
    """The leader's decision for a client batch of a producer whose state is `entry` (None: unknown).

    Returns (APPEND, None), (DUPLICATE, the cached batch), (OUT_OF_ORDER_SEQUENCE, None) or
    (INVALID_PRODUCER_EPOCH, None). The order is Kafka's: duplicates first (UnifiedLog checks the
    cache before validating), then the epoch, then the sequence (ProducerAppendInfo)."""
    if entry is None:
        return APPEND, None               # unknown producer: any sequence (KIP-360)
    duplicate = entry.find_duplicate(epoch, first_seq, last_seq)
    if duplicate is not None:
        return DUPLICATE, duplicate
    if epoch < entry.producer_epoch:
        return INVALID_PRODUCER_EPOCH, None
    if epoch != entry.producer_epoch:
        if first_seq != 0 and entry.producer_epoch != NO_PRODUCER_EPOCH:
            return OUT_OF_ORDER_SEQUENCE, None
        return APPEND, None
    if entry.producer_epoch == NO_PRODUCER_EPOCH or in_sequence(entry.last_sequence, first_seq):
        return APPEND, None
    return OUT_OF_ORDER_SEQUENCE, None


def _metadata(batch: RecordBatch) -> BatchMetadata:
    return BatchMetadata(batch.last_sequence, batch.last_offset, batch.last_offset_delta,
                         batch.max_timestamp)


class ProducerStateManager:
    """The producer entries of one partition, and their snapshot files in `directory` (if given)."""

    def __init__(self, directory: str | None = None,
                 expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> None:
        self.dir = directory
        self.expiration_ms = expiration_ms
        self._producers: dict[int, ProducerEntry] = {}
        self.map_end_offset = 0           # the state covers batches below this offset
        self._ongoing: dict[int, int] = {}            # producer id -> first offset of its open txn
        self._unreplicated: list[CompletedTxn] = []   # completed, marker not yet below the HW

    # ---- appends
    def check_append(self, batches: Iterable[RecordBatch]) -> BatchMetadata | None:
        """Validate a leader's client append before offsets are assigned. Returns the cached
        metadata when a batch is a duplicate (the whole append is then skipped); raises
        OutOfOrderSequenceError or InvalidProducerEpochError. Changes nothing."""
        pending: dict[int, ProducerEntry | None] = {}
        for batch in batches:
            pid = batch.producer_id
            if pid != NO_PRODUCER_ID and batch.is_control:
                self._check_marker(batch, pending[pid] if pid in pending else self._producers.get(pid))
                continue
            if pid == NO_PRODUCER_ID or batch.base_sequence == NO_SEQUENCE:
                continue   # transactional offset commits come from coordinators
            entry = pending[pid] if pid in pending else self._producers.get(pid)
            outcome, cached = decide(entry, batch.producer_epoch, batch.base_sequence,
                                     batch.last_sequence)
            if outcome == DUPLICATE:
                return cached
            base = entry or ProducerEntry(pid)
            if outcome == INVALID_PRODUCER_EPOCH:
                raise InvalidProducerEpochError(
                    f"epoch of producer {pid} in the append to {self._where()} is "
                    f"{batch.producer_epoch}, which is smaller than the last seen epoch "
                    f"{base.producer_epoch}")
            if outcome == OUT_OF_ORDER_SEQUENCE:
                raise OutOfOrderSequenceError(
                    f"out of order sequence number for producer {pid} (epoch "
                    f"{batch.producer_epoch}) in the append to {self._where()}: "
                    f"{batch.base_sequence} (incoming seq. number), "
                    f"{base.last_sequence} (current end sequence number, epoch "
                    f"{base.producer_epoch})")
            pending[pid] = base.with_batch(batch.producer_epoch, _metadata(batch))
        return None

    def _check_marker(self, batch: RecordBatch, entry: ProducerEntry | None) -> None:
        """A coordinator's COMMIT/ABORT marker: not from a fenced producer epoch, nor from a
        coordinator older than the one that wrote the producer's last marker."""
        if entry is None or batch.control_record_type() not in (ControlRecordType.COMMIT,
                                                                 ControlRecordType.ABORT):
            return
        pid = batch.producer_id
        if batch.producer_epoch < entry.producer_epoch:
            raise InvalidProducerEpochError(
                f"epoch of producer {pid} in the transaction marker appended to {self._where()} is "
                f"{batch.producer_epoch}, which is smaller than the last seen epoch "
                f"{entry.producer_epoch}")
        epoch = marker_coordinator_epoch(batch)
        if entry.coordinator_epoch > epoch:
            raise TransactionCoordinatorFencedError(
                f"Invalid coordinator epoch for producerId {pid} in partition {self._where()}: "
                f"{epoch} (zombie), {entry.coordinator_epoch} (current)")

    def update(self, batch: RecordBatch) -> CompletedTxn | None:
        """Apply a batch that is in the log (after a leader append, on a follower, when loading).
        A control batch must be read whole (its record key says COMMIT or ABORT); the transaction
        it closes is returned."""
        self.map_end_offset = max(self.map_end_offset, batch.next_offset)
        pid = batch.producer_id
        if pid == NO_PRODUCER_ID:
            return None
        entry = self._producers.get(pid) or ProducerEntry(pid)
        if batch.is_control:
            # a transaction marker: the producer's epoch and time, no data batch to cache
            self._producers[pid] = replace(entry, producer_epoch=batch.producer_epoch,
                                           last_timestamp=batch.max_timestamp)
            kind = batch.control_record_type()
            if kind not in (ControlRecordType.COMMIT, ControlRecordType.ABORT):
                return None
            self._producers[pid] = replace(self._producers[pid],
                                           coordinator_epoch=marker_coordinator_epoch(batch))
            first = self._ongoing.pop(pid, batch.base_offset)
            done = CompletedTxn(pid, first, batch.base_offset, kind == ControlRecordType.ABORT)
            self._unreplicated.append(done)
            return done
        self._producers[pid] = entry.with_batch(batch.producer_epoch, _metadata(batch))
        if batch.is_transactional and pid not in self._ongoing:
            self._ongoing[pid] = batch.base_offset
        return None

    # ---- transactions
    def ongoing_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of its open transaction."""
        return dict(self._ongoing)

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of the oldest transaction not yet decided below the HW (or None)."""
        self._unreplicated = [t for t in self._unreplicated if t.last_offset >= high_watermark]
        firsts = list(self._ongoing.values()) + [t.first_offset for t in self._unreplicated]
        return min(firsts) if firsts else None

    def last_stable_offset_after(self, completed: CompletedTxn) -> int:
        """The LSO recorded with an aborted transaction: the next open transaction's first offset,
        else just past the marker (ProducerStateManager.lastStableOffset)."""
        others = [first for pid, first in self._ongoing.items() if pid != completed.producer_id]
        return min(others) if others else completed.last_offset + 1

    def rebuild(self, batches: Iterable[RecordBatch]) -> None:
        self._producers.clear()
        self._ongoing.clear()
        self._unreplicated.clear()
        for batch in batches:
            self.update(batch)

    # ---- queries
    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def active_producers(self) -> dict[int, ProducerEntry]:
        return dict(self._producers)

    def __len__(self) -> int:
        return len(self._producers)

    # ---- expiration
    def is_expired(self, entry: ProducerEntry, now_ms: int) -> bool:
        return now_ms - entry.last_timestamp >= self.expiration_ms

    def remove_expired(self, now_ms: int) -> list[int]:
        """Forget producers idle for producer.id.expiration.ms (removeExpiredProducers)."""
        expired = [pid for pid, e in self._producers.items()
                   if self.is_expired(e, now_ms) and pid not in self._ongoing]
        for pid in expired:
            del self._producers[pid]
        return expired

    # ---- snapshot files
    def snapshot_offsets(self) -> list[int]:
        """Offsets of the `.snapshot` files in the directory, ascending."""
        if self.dir is None or not os.path.isdir(self.dir):
            return []
        found = []
        for name in os.listdir(self.dir):
            stem, ext = os.path.splitext(name)
            if ext == producer_snapshot.SUFFIX and stem.isdigit() and len(stem) == 20:
                found.append(int(stem))
        return sorted(found)

    def take_snapshot(self, offset: int | None = None) -> str | None:
        """Write the state as `<offset>.snapshot` (default: the map end offset) unless that file
        exists (takeSnapshot); returns the path written. Kafka writes one only when the map end
        offset is past the last snapshot's, so an empty log (offset 0) gets none: a broker's 50
        empty `__consumer_offsets` partitions are closed without 50 files and 100 fsyncs."""
        if self.dir is None or not os.path.isdir(self.dir):
            return None
        offset = self.map_end_offset if offset is None else offset
        if offset == 0:
            return None
        path = producer_snapshot.snapshot_path(self.dir, offset)
        if os.path.exists(path):
            return None
        producer_snapshot.write_snapshot_file(
            path, [self._snapshot_entry(e, self._ongoing.get(e.producer_id, -1))
                   for e in self._producers.values()])
        return path

    def delete_snapshots(self, keep) -> list[int]:
        """Delete the snapshot files whose offset `keep(offset)` rejects."""
        deleted = [o for o in self.snapshot_offsets() if not keep(o)]
        for offset in deleted:
            try:
                os.remove(producer_snapshot.snapshot_path(self.dir, offset))
            except FileNotFoundError:
                pass
        return deleted

    def load(self, log_start_offset: int, log_end_offset: int, now_ms: int) -> int:
        """Drop snapshots outside (log start, log end] and load the newest readable one (a
        corrupt one is deleted and the next older tried), skipping expired producers. Returns the
        offset the log must be replayed from (truncateAndReload + loadFromSnapshot)."""
        self._producers.clear()
        self._ongoing.clear()
        self._unreplicated.clear()
        self.delete_snapshots(lambda o: log_start_offset < o <= log_end_offset)
        for offset in reversed(self.snapshot_offsets()):
            path = producer_snapshot.snapshot_path(self.dir, offset)
            try:
                with open(path, "rb") as f:
                    entries = producer_snapshot.read_snapshot(f.read(), path)
            except (CorruptRecordError, OSError) as e:
                _log.warning("%s: deleted unreadable producer snapshot %s (%s); the producer state "
                             "is rebuilt from the log", os.path.basename(self.dir),
                             os.path.basename(path), e)
                os.remove(path)
                continue
            for e in entries:
                entry = self._from_snapshot(e)
                if e.current_txn_first_offset >= 0:
                    self._ongoing[entry.producer_id] = e.current_txn_first_offset
                if not self.is_expired(entry, now_ms) or e.current_txn_first_offset >= 0:
                    self._producers[entry.producer_id] = entry
            self.map_end_offset = offset
            return offset
        self.map_end_offset = log_start_offset
        return log_start_offset

    @staticmethod
    def _snapshot_entry(e: ProducerEntry, txn_first_offset: int = -1
                        ) -> producer_snapshot.ProducerSnapshotEntry:
        last = e.batches[-1] if e.batches else None
        return producer_snapshot.ProducerSnapshotEntry(
            e.producer_id, e.producer_epoch, last.last_seq if last else NO_SEQUENCE,
            last.last_offset if last else -1, last.offset_delta if last else 0,
            e.last_timestamp, e.coordinator_epoch, txn_first_offset)

    @staticmethod
    def _from_snapshot(s: producer_snapshot.ProducerSnapshotEntry) -> ProducerEntry:
        batches = () if s.last_offset < 0 else (
            BatchMetadata(s.last_sequence, s.last_offset, s.offset_delta, s.timestamp),)
        return ProducerEntry(s.producer_id, s.producer_epoch, batches, s.timestamp,
                             s.coordinator_epoch)

    def _where(self) -> str:
        return os.path.basename(self.dir) if self.dir else "the partition"


def marker_coordinator_epoch(batch: RecordBatch) -> int:
    """The coordinator epoch in a marker's value (EndTransactionMarker: version int16, epoch int32)."""
    records = batch.records()
    value = records[0].value if records else None
    if value is None or len(value) < 6:
        return -1
    return struct.unpack_from(">i", value, 2)[0]

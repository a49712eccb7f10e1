"""An in-process producer with Kafka's partitioning, batching and acks settings.

Mirrors the shape of Kafka's `KafkaProducer` (RecordAccumulator + Sender, without a network):
* `send()` picks the partition (explicit, murmur2 of the key, or sticky for keyless records) and
  adds the record to that partition's open batch;
* a batch is sent when it holds `batch.size` bytes, when it has waited `linger.ms` (checked on
  `send()` and `poll()`, on the injected clock), or on `flush()` / `close()`;
* `acks` is checked (0, 1, −1/all); its full meaning comes with replication. The broker assigns
  offsets; each `send()` returns a future that holds the record's offset once its batch is sent.
* idempotence (`enable_idempotence`, on by default with acks=all as in Kafka's producer since
  3.0): the producer gets a producer id from the broker (InitProducerId) and numbers each
  partition's batches with sequences; a batch resent after a lost response keeps its sequence, so
  the partition leader recognises it and answers with the offsets of the first append. After a
  batch fails for good the producer takes a new producer id and starts its sequences at 0 again
  (Kafka's producer bumps its epoch instead, which needs InitProducerId v3).
Defaults are Kafka 4.0's: batch.size 16384, linger.ms 5, acks all, compression none.
Like Kafka's producer it keeps each topic's partition count (its metadata) and asks the broker
again only after metadata.max.age.ms, for a partition it does not know yet, or after an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import NamedTuple

from .clock import Clock
from .compression import Compression
from .errors import KStoreError
from .log import to_bytes
from .partitioner import BuiltInPartitioner
from . import records
from .records import RECORD_BATCH_OVERHEAD, build_batch, increment_sequence
from .broker import normalize_acks


@dataclass(frozen=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int
    timestamp: int


class ProduceRequestResult:
    """The outcome of one batch's produce, shared by the futures of all its records (Kafka's
    ProduceRequestResult): sending a batch sets it once, not once per record."""

    __slots__ = ("info", "error")

    def __init__(self):
        self.info = None                      # the LogAppendInfo once the batch is appended
        self.error: BaseException | None = None


class FutureRecordMetadata(tuple):
    """Resolved when the record's batch has been appended (or failed).

    A tuple (topic, partition, batch result, position in the batch, timestamp) built with
    tuple.__new__: send() makes one per record, and a Python-level __init__ would cost about as
    much as the rest of sizing and queueing the record."""

    __slots__ = ()

    topic = property(itemgetter(0))
    partition = property(itemgetter(1))

    @property
    def done(self) -> bool:
        result = self[2]
        return result.info is not None or result.error is not None

    def get(self) -> RecordMetadata:
        topic, partition, result, relative_offset, timestamp = self
        info = result.info
        if result.error is not None:
            raise result.error
        if info is None:
            raise KStoreError("the record has not been sent yet: call flush() or poll()")
        ts = info.log_append_time if info.log_append_time >= 0 else timestamp
        return RecordMetadata(topic, partition, info.first_offset + relative_offset, ts)

    def exception(self) -> BaseException | None:
        """The send's error, or None (like concurrent.futures.Future.exception)."""
        return self[2].error

    def __repr__(self) -> str:
        state = self[2].error or (self.get() if self[2].info is not None else "pending")
        return f"FutureRecordMetadata({self.topic}-{self.partition}: {state})"


class ProducerRecord(NamedTuple):
    """A record as the producer holds it until its batch is built (what build_batch reads)."""
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple


_new_tuple = tuple.__new__


@dataclass(slots=True)
class _OpenBatch:
    topic: str
    partition: int
    created_ms: int
    records: list[ProducerRecord] = field(default_factory=list)
    result: ProduceRequestResult = field(default_factory=ProduceRequestResult)
    estimated_bytes: int = RECORD_BATCH_OVERHEAD


class Producer:
    def __init__(self, broker, *, acks="all", batch_size: int = 16384, linger_ms: int = 5,
                 compression_type: str = "none", clock: Clock | None = None,
                 partitioner: BuiltInPartitioner | None = None, max_request_size: int = 1048576,
                 metadata_max_age_ms: int = 300_000, enable_idempotence: bool | None = None):
        self.broker = broker
        self.acks = normalize_acks(acks)
        self.idempotent = _idempotence(enable_idempotence, self.acks)
        self.producer_id, self.producer_epoch = -1, -1   # asked for with the first batch
        self._sequences: dict[tuple[str, int], int] = {}
        if batch_size < 0 or linger_ms < 0:
            raise ValueError("batch.size and linger.ms must be ≥ 0")
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.compression = Compression.from_name(compression_type)
        self.clock = clock or broker.clock
        self.partitioner = partitioner or BuiltInPartitioner(batch_size)
        self.max_request_size = max_request_size
        self.metadata_max_age_ms = metadata_max_age_ms
        self._partition_counts: dict[str, tuple[int, int]] = {}   # topic -> (count, learned at ms)
        self._open: dict[tuple[str, int], _OpenBatch] = {}
        self._next_linger_check = float("inf")   # the clock time at which a batch may be due
        self.batches_sent = 0
        self.records_sent = 0
        self.closed = False

    def send(self, topic: str, value: bytes | str | None = None, key: bytes | str | None = None,
             partition: int | None = None, timestamp_ms: int | None = None,
             headers: list[tuple[str, bytes | None]] | None = None) -> FutureRecordMetadata:
        if self.closed:
            raise KStoreError("cannot send after the producer is closed")
        # bytes and None pass as they are (to_bytes would return them): no call per record.
        key_b = key if key is None or type(key) is bytes else to_bytes(key)
        value_b = value if value is None or type(value) is bytes else to_bytes(value)
        now = self.clock.milliseconds()
        known = self._partition_counts.get(topic)   # (count, learned at): this producer's metadata
        if known is None or now - known[1] >= self.metadata_max_age_ms or \
                (partition is not None and partition >= known[0]):
            known = self._refresh_partition_count(topic, now)
        n = known[0]
        p = self.partitioner.partition(topic, key_b, n, partition)
        timestamp = now if timestamp_ms is None else timestamp_ms
        headers = tuple(headers) if headers else ()
        size = records.sized_record(key_b, value_b, headers)
        if size + RECORD_BATCH_OVERHEAD > self.max_request_size:
            raise KStoreError(f"the record is {size + RECORD_BATCH_OVERHEAD} bytes when serialized, "
                              f"larger than max.request.size ({self.max_request_size})")
        batch = self._open.get((topic, p))
        if batch is not None and batch.estimated_bytes + size > self.batch_size and batch.records:
            self._send_batch(batch)   # full: it goes now, the record starts a new batch
            batch = None
        appended = size
        if batch is None:
            batch = self._open[(topic, p)] = _OpenBatch(topic, p, now)
            self._next_linger_check = min(self._next_linger_check, now + self.linger_ms)
            appended += batch.estimated_bytes   # a new batch counts its header (Kafka's appendedBytes)
        queued = batch.records
        # tuple.__new__ builds these tuples without a Python-level __new__ or __init__ (per record).
        future = _new_tuple(FutureRecordMetadata, (topic, p, batch.result, len(queued), timestamp))
        queued.append(_new_tuple(ProducerRecord, (key_b, value_b, timestamp, headers)))
        batch.estimated_bytes += size
        if key_b is None:
            self.partitioner.record_appended(topic, p, appended, n)
        if batch.estimated_bytes >= self.batch_size:
            self._send_batch(batch)
        if now >= self._next_linger_check:
            self._send_lingered(now)
        return future

    def _refresh_partition_count(self, topic: str, now: int) -> tuple[int, int]:
        """Ask the broker for the topic's partition count: send() does when its metadata is older
        than metadata.max.age.ms or does not know the explicit partition asked for."""
        self.broker.ensure_topic(topic)
        known = self._partition_counts[topic] = (self.broker.partition_count(topic), now)
        return known

    def poll(self) -> int:
        """Send every batch that has waited linger.ms; return how many were sent."""
        return self._send_lingered(self.clock.milliseconds())

    def _send_lingered(self, now: int) -> int:
        due = [b for b in self._open.values() if now - b.created_ms >= self.linger_ms]
        for batch in due:
            self._send_batch(batch)
        # No open batch can be due before the oldest one's linger.ms is up.
        self._next_linger_check = min((b.created_ms for b in self._open.values()),
                                      default=float("inf")) + self.linger_ms
        return len(due)

    def flush(self) -> None:
        """Send every open batch now (KafkaProducer.flush)."""
        for batch in list(self._open.values()):
            self._send_batch(batch)

    def _send_batch(self, batch: _OpenBatch) -> None:
        self._open.pop((batch.topic, batch.partition), None)
        tp = (batch.topic, batch.partition)
        if self.idempotent and self.producer_id < 0:
            self.producer_id, self.producer_epoch = self.broker.allocate_producer_id(), 0
        sequence = self._sequences.get(tp, 0) if self.idempotent else -1
        data = build_batch(batch.records, compression=self.compression,
                           producer_id=self.producer_id, producer_epoch=self.producer_epoch,
                           base_sequence=sequence)
        try:   # the broker client resends these same bytes, sequence included, on a lost answer
            info = self.broker.produce(batch.topic, batch.partition, data, acks=self.acks)
        except KStoreError as e:
            self._partition_counts.pop(batch.topic, None)   # the metadata may be stale
            batch.result.error = e
            if self.idempotent:   # the batch may or may not be stored: start a new producer
                self.producer_id, self._sequences = -1, {}
            return
        if self.idempotent:
            self._sequences[tp] = increment_sequence(sequence, len(batch.records))
        batch.result.info = info    # every future of the batch is resolved at once
        self.batches_sent += 1
        self.records_sent += len(batch.records)

    def pending(self) -> int:
        return sum(len(b.records) for b in self._open.values())

    def close(self) -> None:
        if not self.closed:
            self.flush()
            self.closed = True

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _idempotence(enabled: bool | None, acks: int) -> bool:
    """Kafka's rule: on by default unless acks is not all; asked for explicitly it needs acks=all."""
    if enabled is None:
        return acks == -1
    if enabled and acks != -1:
        raise KStoreError("must set acks to all in order to use the idempotent producer; "
                          "otherwise we cannot guarantee idempotence")
    return bool(enabled)

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
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .clock import Clock
from .compression import Compression
from .errors import KStoreError
from .log import to_bytes
from .partitioner import BuiltInPartitioner
from .records import Record, build_batch, encode_record, increment_sequence
from .broker import normalize_acks


@dataclass(frozen=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int
    timestamp: int


class FutureRecordMetadata:
    """Resolved when the record's batch has been appended (or failed)."""

    def __init__(self, topic: str, partition: int):
        self.topic, self.partition = topic, partition
        self._value: RecordMetadata | None = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self._value is not None or self._error is not None

    def get(self) -> RecordMetadata:
        if self._error is not None:
            raise self._error
        if self._value is None:
            raise KStoreError("the record has not been sent yet: call flush() or poll()")
        return self._value

    def exception(self) -> BaseException | None:
        """The send's error, or None (like concurrent.futures.Future.exception)."""
        return self._error

    def __repr__(self) -> str:
        state = self._value or self._error or "pending"
        return f"FutureRecordMetadata({self.topic}-{self.partition}: {state})"


@dataclass
class _OpenBatch:
    topic: str
    partition: int
    created_ms: int
    records: list[Record] = field(default_factory=list)
    futures: list[FutureRecordMetadata] = field(default_factory=list)
    estimated_bytes: int = 61


class Producer:
    def __init__(self, broker, *, acks="all", batch_size: int = 16384, linger_ms: int = 5,
                 compression_type: str = "none", clock: Clock | None = None,
                 partitioner: BuiltInPartitioner | None = None, max_request_size: int = 1048576,
                 enable_idempotence: bool | None = None):
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
        self._open: dict[tuple[str, int], _OpenBatch] = {}
        self.batches_sent = 0
        self.records_sent = 0
        self.closed = False

    def send(self, topic: str, value: bytes | str | None = None, key: bytes | str | None = None,
             partition: int | None = None, timestamp_ms: int | None = None,
             headers: list[tuple[str, bytes | None]] | None = None) -> FutureRecordMetadata:
        if self.closed:
            raise KStoreError("cannot send after the producer is closed")
        key_b, value_b = to_bytes(key), to_bytes(value)
        self.broker.ensure_topic(topic)
        n = self.broker.partition_count(topic)
        p = self.partitioner.partition(topic, key_b, n, partition)
        now = self.clock.milliseconds()
        record = Record(key_b, value_b, now if timestamp_ms is None else timestamp_ms,
                        tuple(headers or ()))
        size = len(encode_record(0, 0, key_b, value_b, record.headers))
        if size + 61 > self.max_request_size:
            raise KStoreError(f"the record is {size + 61} bytes when serialized, larger than "
                              f"max.request.size ({self.max_request_size})")
        batch = self._open.get((topic, p))
        if batch is not None and batch.estimated_bytes + size > self.batch_size and batch.records:
            self._send_batch(batch)   # full: it goes now, the record starts a new batch
            batch = None
        appended = size
        if batch is None:
            batch = self._open[(topic, p)] = _OpenBatch(topic, p, now)
            appended += batch.estimated_bytes   # a new batch counts its header (Kafka's appendedBytes)
        future = FutureRecordMetadata(topic, p)
        batch.records.append(record)
        batch.futures.append(future)
        batch.estimated_bytes += size
        if key_b is None:
            self.partitioner.record_appended(topic, p, appended, n)
        if batch.estimated_bytes >= self.batch_size:
            self._send_batch(batch)
        self.poll()
        return future

    def poll(self) -> int:
        """Send every batch that has waited linger.ms; return how many were sent."""
        now = self.clock.milliseconds()
        due = [b for b in self._open.values() if now - b.created_ms >= self.linger_ms]
        for batch in due:
            self._send_batch(batch)
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
            for f in batch.futures:
                f._error = e
            if self.idempotent:   # the batch may or may not be stored: start a new producer
                self.producer_id, self._sequences = -1, {}
            return
        if self.idempotent:
            self._sequences[tp] = increment_sequence(sequence, len(batch.records))
        for i, (f, r) in enumerate(zip(batch.futures, batch.records)):
            ts = info.log_append_time if info.log_append_time >= 0 else r.timestamp
            f._value = RecordMetadata(batch.topic, batch.partition, info.first_offset + i, ts)
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

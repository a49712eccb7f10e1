"""The sink's task side: route a task's Arrow rows to topic-partitions, encode them into
RecordBatch v2 bytes (`kstore.spark.encode`), and either produce them to the brokers (network
mode, what Spark's Kafka sink does) or stage them for the driver's commit (a log directory that
no broker serves).

Routing is Kafka's producer's: an explicit `partition` column wins; otherwise a key goes to
murmur2(key) mod partitions (in C for a whole column where the native codec is built, otherwise
once per distinct key of an Arrow batch); and
keyless records stick to one partition until about batch.size (16 KiB) went there, then move to
another at random (Kafka's BuiltInPartitioner).

Producing (`TaskProducer`): each task is one transactional producer. When the task starts it
asks the coordinator for its producer id and epoch (InitProducerId); every batch it sends carries
them and a sequence number per partition (the partition's records counted from 0). It sends every batch to
its partition's leader (`RemoteBroker` routes by Metadata and follows a moved leader), ONE batch
per partition per Produce request — Kafka's brokers refuse a request carrying several batches for
one partition — but the batches of several partitions in one request per leader, as Kafka's
Sender groups them; with acks=all, and it waits for each answer before the next (max.in.flight =
1, so batches of a partition land in order).

Delivery guarantee, precisely (exactly once for read_committed readers, through transactions):

* Each task attempt is a transactional producer (`kstore.transaction_manager`) whose
  transactional id names the sink and the task: `kstore-spark-<query id or write id>-<task>`.
  InitProducerId gives it the id's producer id and a new epoch, which fences every earlier
  attempt of the same task: a retried or speculative attempt, or the same task of a batch that a
  killed-and-restarted query runs again. The coordinator aborts the transaction such an attempt
  left open, and the partitions refuse its late batches (INVALID_PRODUCER_EPOCH).
* Before its first batch to a partition, the task adds the partition to its transaction
  (AddPartitionsToTxn); every batch carries the producer id, epoch, a per-partition sequence and
  the transactional bit. A batch re-sent after a lost answer is recognised by its sequence.
* The task does NOT commit. It reports (transactional id, producer id, epoch) to the driver, and
  the driver, once every task of the batch succeeded, ends each transaction with EndTxn(commit)
  — the two phases of Spark's DataSourceWriter (`sink.KStoreStreamWriter.commit`). Until then a
  read_committed reader sees none of the batch (the partitions' last stable offset stops at the
  first open transaction); after it, all of it. A failed job's transactions are aborted.
* The driver writes what it is about to commit into the query's checkpoint
  (`kstore-sink-commits.json`: batch id, state "committing", the transactions) before the first
  EndTxn, and "committed" after the last. A driver killed in between leaves "committing": the
  restarted query finishes those EndTxns (an EndTxn that already succeeded succeeds again) before
  it runs anything, and Spark's re-run of that batch id is skipped by every task. A transaction
  the coordinator aborted meanwhile (its transaction.timeout.ms passed) cannot be committed any
  more: the re-run batch writes again exactly those tasks (by task number; Spark re-runs a batch
  with the same offsets, so each task gets the same rows) and skips the others.

Readers with the default read_uncommitted (Spark's Kafka source, kstore's source unless
kafka.isolation.level=read_committed) also see the rows of aborted attempts: exactly once holds
for read_committed readers, as with Kafka's transactions. Spark's own Kafka sink is at least once.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import native
from ..compression import Compression
from ..errors import KStoreError
from ..transaction_manager import TransactionManager
from ..records import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, increment_sequence
from ..partitioner import BuiltInPartitioner, partition_for_key
from .encode import BinaryColumn, encode_batches, no_producer

MAX_REQUEST_SIZE = 1048576   # the producer's max.request.size (Kafka's default): bytes per request

ROUTED_COLUMNS = ("key", "value", "topic", "partition", "headers")


class KStoreSinkError(KStoreError):
    """The kstore sink could not write (lock held, missing topic, bad partition...)."""


def _binary(array):
    if array is None:
        return None
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return array.cast(pa.binary()) if pa.types.is_string(array.type) else array


class Router:
    """Where each row of an Arrow batch goes: [(topic, partition, row indices)], rows in order."""

    def __init__(self, topic: str | None, counts: dict[str, int], describe: str,
                 rng: random.Random | None = None):
        self.topic, self.counts, self.describe = topic, counts, describe
        self.partitioner = BuiltInPartitioner(rng=rng)   # draws the keyless rows' partitions

    def route(self, rb: pa.RecordBatch, keys: BinaryColumn, values: BinaryColumn):
        names = rb.schema.names
        n = rb.num_rows
        if self.topic is not None:
            by_topic = [(self.topic, np.arange(n))]
        else:
            col = rb.column(names.index("topic"))
            if col.null_count:
                raise KStoreSinkError("null topic encountered while writing a row: set the topic "
                                      "option or give every row a topic")
            by_topic = [(t, np.flatnonzero(np.asarray(pc.equal(col, t))))
                        for t in pc.unique(col).to_pylist()]
        explicit = None
        if "partition" in names:
            column = rb.column(names.index("partition"))
            explicit = np.asarray(pc.fill_null(column, -1), dtype=np.int64)
            explicit_given = np.asarray(pc.is_valid(column))
        out = []
        for topic, idx in by_topic:
            count = self.counts.get(topic)
            if count is None:
                raise KStoreSinkError(f"topic '{topic}' does not exist in the {self.describe}; "
                                      f"create it first")
            parts = np.full(len(idx), -1, dtype=np.int64)
            if explicit is not None:
                parts = explicit[idx].copy()
                bad = (parts >= count) | (parts < -1) | (explicit_given[idx] & (parts < 0))
                if bad.any():
                    raise KStoreSinkError(f"partition {int(parts[bad][0])} of topic '{topic}' does "
                                          f"not exist (it has {count} partitions)")
            keyed = (parts < 0) & (keys.lengths[idx] >= 0)
            if keyed.any():
                parts[keyed] = self._by_key(keys.take(idx[keyed]), count)
            keyless = np.flatnonzero(parts < 0)
            if len(keyless):
                parts[keyless] = self._sticky(topic, values.nbytes()[idx[keyless]], count)
            for p in np.unique(parts).tolist():
                out.append((topic, int(p), idx[parts == p]))
        return out

    @staticmethod
    def _by_key(keys: BinaryColumn, count: int) -> np.ndarray:
        """murmur2 partition of each (non-null) key: in C when the native codec is built
        (`partitions_for_keys` in kstore/_codec.c, ~10 ns a key); otherwise with
        `partition_for_key`, once per distinct key (~2 µs each in Python)."""
        hashing = getattr(native.codec, "partitions_for_keys", None)
        if hashing is not None:
            data, starts = keys.parts()
            found = hashing(data, starts, np.ascontiguousarray(keys.lengths, dtype=np.int64), count)
            if found is not None:
                return np.frombuffer(found, dtype=np.int64)
        encoded = keys.array.take(pa.array(keys.rows)).dictionary_encode()
        table = np.array([partition_for_key(k, count) for k in encoded.dictionary.to_pylist()],
                         dtype=np.int64)
        return table[np.asarray(encoded.indices, dtype=np.int64)]

    def _sticky(self, topic: str, sizes: np.ndarray, count: int) -> np.ndarray:
        """Keyless records: runs of about batch.size bytes per partition (BuiltInPartitioner)."""
        out = np.empty(len(sizes), dtype=np.int64)
        cum = np.cumsum(sizes + 70)          # + a record's overhead, as the producer estimates
        start = 0
        while start < len(sizes):
            p = self.partitioner.partition(topic, None, count)
            base = cum[start - 1] if start else 0
            end = int(np.searchsorted(cum, base + self.partitioner.batch_size, side="left")) + 1
            end = min(max(end, start + 1), len(sizes))
            out[start:end] = p
            self.partitioner.record_appended(topic, p, int(cum[end - 1] - base), count)
            start = end
        return out


def encoded_runs(rb: pa.RecordBatch, router: Router, compression: Compression, timestamp: int,
                 producer: "TaskProducer | None" = None):
    """Yield (topic, partition, batch bytes, record count) for one Arrow batch of a task; with a
    producer, the batches carry its id and sequences (to be sent in the order yielded)."""
    names = rb.schema.names
    n = rb.num_rows
    keys = BinaryColumn(_binary(rb.column(names.index("key"))) if "key" in names else None, n)
    values = BinaryColumn(_binary(rb.column(names.index("value"))), n)
    headers = rb.column(names.index("headers")).to_pylist() if "headers" in names else None
    for topic, partition, idx in router.route(rb, keys, values):
        rows = None if headers is None else [headers[i] for i in idx.tolist()]
        stamp = no_producer if producer is None else producer.stamper(topic, partition)
        transactional = producer is not None and producer.txn is not None
        for data, count in encode_batches(keys.take(idx), values.take(idx), timestamp,
                                          compression, rows, stamp, transactional):
            yield topic, partition, data, count


class TaskProducer:
    """One write task's producer: Produce requests to each partition's leader, one batch per
    partition in each (several partitions per request),
    every batch stamped with the producer id and the partition's next sequence. With a
    transactional id, its batches belong to one transaction, which someone ends (`txn`)."""

    def __init__(self, bootstrap_servers: str, timeout_ms: int, client_id: str,
                 idempotent: bool = True, transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60000):
        from ..remote_broker import RemoteBroker
        self.timeout_ms = timeout_ms
        self.client = RemoteBroker(bootstrap_servers, client_id=client_id,
                                   timeout_s=timeout_ms / 1000)
        self.producer_id, self.producer_epoch = NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        self.txn = None
        if transactional_id is not None:
            self.txn = TransactionManager(self.client, transactional_id, transaction_timeout_ms)
            self.producer_id, self.producer_epoch = self.txn.init()
        elif idempotent:
            self.producer_id, self.producer_epoch = self.client.allocate_producer_id(), 0
        self.sequences: dict[tuple[str, int], int] = {}  # next sequence per partition
        self.sent: dict[tuple[str, int], int] = {}       # records acknowledged per partition

    def partition_counts(self) -> dict[str, int]:
        return self.client.topic_partition_counts()

    def stamper(self, topic: str, partition: int):
        """`stamp(count)` for `encode_batches`: the producer fields of the partition's next batch
        of `count` records. The sequence advances when a batch is stamped, as Kafka's producer
        advances it when a batch is drained for sending: batches go out in the order stamped,
        and a batch that finally fails fails the task, which ends this producer."""
        tp = (topic, partition)

        def stamp(count: int) -> tuple[int, int, int]:
            if self.producer_id == NO_PRODUCER_ID:
                return no_producer(count)
            sequence = self.sequences.get(tp, 0)
            self.sequences[tp] = increment_sequence(sequence, count)
            return self.producer_id, self.producer_epoch, sequence
        return stamp

    def send(self, topic: str, partition: int, batch: bytes, count: int) -> None:
        self.send_all([(topic, partition, batch, count)])

    def send_all(self, batches: list[tuple[str, int, bytes, int]]) -> None:
        """Send one batch for each of several partitions: one Produce request per leader."""
        tid = None
        if self.txn is not None:
            self.txn.add_partitions([(t, p) for t, p, _b, _n in batches])   # once per partition
            tid = self.txn.transactional_id
        # on a lost answer RemoteBroker sends these same bytes again, sequences included
        self.client.produce_many([(t, p, b) for t, p, b, _n in batches], acks=-1,
                                 timeout_ms=self.timeout_ms, transactional_id=tid)
        for topic, partition, _b, count in batches:
            self.sent[(topic, partition)] = self.sent.get((topic, partition), 0) + count

    def close(self) -> None:
        self.client.close()


def produce_task(batches, topic: str | None, producer: TaskProducer, compression: Compression,
                 describe: str) -> int:
    """Produce every row of a task's Arrow batches; returns the number of rows. The encoded
    batches go out in rounds of at most one per partition (a Produce request holds one batch per
    partition) and of at most max.request.size bytes, each round in one request per leader,
    each partition's batches in the order they were stamped with their sequences."""
    router = None
    rows = 0
    now = int(time.time() * 1000)
    round_: list[tuple[str, int, bytes, int]] = []
    round_bytes = 0
    for rb in batches:
        if router is None:
            router = Router(topic, producer.partition_counts(), describe)
        for t, p, data, count in encoded_runs(rb, router, compression, now, producer):
            if round_ and (round_bytes + len(data) > MAX_REQUEST_SIZE
                           or any(t == q[0] and p == q[1] for q in round_)):
                producer.send_all(round_)
                round_, round_bytes = [], 0
            round_.append((t, p, data, count))
            round_bytes += len(data)
        rows += rb.num_rows
    if round_:
        producer.send_all(round_)
    return rows

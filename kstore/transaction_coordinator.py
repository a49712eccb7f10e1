"""The transaction coordinator: one transactional producer's transaction, from begin to markers.

Mirrors Kafka's `TransactionCoordinator`, `TransactionStateManager` and `TransactionMetadata`.
Each transactional.id is owned by the leader of its `__transaction_state` partition (Java hashCode,
as for groups). Its metadata — producer id, epoch, timeout, state and the partitions in the
transaction — is written there as a TransactionLogKey/Value record at every state change, with
acks=all, and replayed when the broker starts or becomes the partition's leader.

States: Empty → (AddPartitionsToTxn / AddOffsetsToTxn) Ongoing → (EndTxn) PrepareCommit or
PrepareAbort → (markers written to every partition of the transaction) CompleteCommit or
CompleteAbort → (next AddPartitions) Ongoing ...

* InitProducerId bumps the epoch: a second producer with the same transactional.id fences the
  first, whose requests then get PRODUCER_FENCED from the coordinator (INVALID_PRODUCER_EPOCH on
  older request versions, as Kafka's KafkaApis maps it) and INVALID_PRODUCER_EPOCH from the
  partitions. If the old producer left a transaction open, the coordinator aborts it with the
  bumped epoch first and answers CONCURRENT_TRANSACTIONS; the client retries.
* A transaction open longer than its `transaction.timeout.ms` is aborted by the coordinator
  (`abort_timed_out`, on the broker's timer), again bumping the epoch so the late producer is fenced.
* A transactional id with no transaction open and no request for `transactional.id.expiration.ms`
  (7 days) is removed: a tombstone in `__transaction_state` (`remove_expired_transactional_ids`,
  every `transaction.remove.expired.transaction.cleanup.interval.ms`); a producer that comes back
  with it gets a new producer id.
* Markers to partitions this broker leads are appended locally; to partitions another broker leads
  they go as a WriteTxnMarkers v0 request (Kafka's TransactionMarkerChannelManager). A transaction whose
  markers could not all be written stays in Prepare* and is retried on the timer.

kstore differs from Kafka: the coordinator handles one request at a time (one lock), and the
markers of an EndTxn request are written by one background thread per transaction (Kafka queues
them per broker in its TransactionMarkerChannelManager); `end_txn` called in-process waits for them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .errors import KStoreError, error_code
from .records import ControlRecordType, Record, build_batch, build_control_batch
from .transaction_log import (TRANSACTION_STATE_TOPIC, TransactionLogValue, decode_key,
                              decode_value, encode_key, partition_for)

MAX_EPOCH = 32767 - 1          # Short.MaxValue - 1: one epoch is kept back for fencing
DEFAULT_MAX_TIMEOUT_MS = 900000     # transaction.max.timeout.ms
GROUP_OFFSETS_TOPIC = "__consumer_offsets"


@dataclass
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str = "Empty"
    partitions: set = field(default_factory=set)     # {(topic, partition)}
    start_ms: int = -1
    last_update_ms: int = -1

    def to_value(self) -> TransactionLogValue:
        grouped: dict[str, list[int]] = {}
        for topic, p in self.partitions:
            grouped.setdefault(topic, []).append(p)
        return TransactionLogValue(self.producer_id, self.producer_epoch, self.timeout_ms,
                                   self.state, grouped, self.last_update_ms, self.start_ms)

    @classmethod
    def from_value(cls, tid: str, v: TransactionLogValue) -> "TransactionMetadata":
        return cls(tid, v.producer_id, v.producer_epoch, v.timeout_ms, v.state,
                   {(t, p) for t, ps in v.partitions.items() for p in ps}, v.start_ms,
                   v.last_update_ms)


class TransactionCoordinator:
    def __init__(self, broker):
        self.broker = broker
        self.clock = broker.clock
        self.max_timeout_ms = broker.config["transaction.max.timeout.ms"]
        self._lock = threading.RLock()
        self._txns: dict[str, TransactionMetadata] = {}
        self._loaded_epochs: dict[int, int] = {}
        self._last_run = {"abort": self.clock.milliseconds(), "expiry": self.clock.milliseconds()}
        self._writing: set[str] = set()     # transactional ids whose markers are in flight
        if broker.metadata.topic(TRANSACTION_STATE_TOPIC) is None:
            brokers = len(broker.metadata.children("/brokers/ids"))
            wanted = broker.config["transaction.state.log.replication.factor"]
            broker.create_topic(TRANSACTION_STATE_TOPIC,
                                broker.config["transaction.state.log.num.partitions"],
                                max(1, min(wanted, brokers)),
                                {"cleanup.policy": "compact", "compression.type": "producer",
                                 "segment.bytes": 104857600})
        self.num_partitions = broker.partition_count(TRANSACTION_STATE_TOPIC)
        with self._lock:
            for p in range(self.num_partitions):
                if self._leads(p):
                    self._load_partition(p)

    # ---- ownership and loading
    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.num_partitions)

    def coordinator_for(self, transactional_id: str) -> int:
        state = self.broker.metadata.partition_state(TRANSACTION_STATE_TOPIC,
                                                     self.partition_for(transactional_id))
        return state["leader"] if state else -1

    def _part(self, p: int):
        return self.broker.replica_manager.partitions.get((TRANSACTION_STATE_TOPIC, p))

    def _leads(self, p: int) -> bool:
        part = self._part(p)
        return part is not None and part.is_leader

    def _load_partition(self, p: int) -> None:
        """Replay one `__transaction_state` partition; finish transactions left in Prepare*."""
        for tid in [t for t in self._txns if self.partition_for(t) == p]:
            del self._txns[tid]
        part = self._part(p)
        for record in part.log.records():
            tid = decode_key(record.key)
            if record.value is None:
                self._txns.pop(tid, None)
            else:
                self._txns[tid] = TransactionMetadata.from_value(tid, decode_value(record.value))
        self._loaded_epochs[p] = part.leader_epoch

    def _ensure_fresh(self, tid: str) -> None:
        p = self.partition_for(tid)
        part = self._part(p)
        if part is None or not part.is_leader:
            raise _Refused("NOT_COORDINATOR")
        if self._loaded_epochs.get(p) != part.leader_epoch:
            self._load_partition(p)
            self._finish_prepared(p)

    def _coordinator_epoch(self, tid: str) -> int:
        part = self._part(self.partition_for(tid))
        return max(part.leader_epoch, 0) if part is not None else 0

    # ---- writing the log
    def _persist(self, meta: TransactionMetadata) -> None:
        """Write the metadata record with acks=all and wait for it (appendTransactionToLog)."""
        meta.last_update_ms = self.clock.milliseconds()
        self._append_state(meta.transactional_id, meta.to_value().encode(), meta.last_update_ms)
        self._txns[meta.transactional_id] = meta

    def _append_state(self, tid: str, value: bytes | None, timestamp: int) -> None:
        """One `__transaction_state` record (a tombstone when value is None), acks=all."""
        record = Record(encode_key(tid), value, timestamp)
        result = self.broker.produce_request(TRANSACTION_STATE_TOPIC, self.partition_for(tid),
                                             build_batch([record]), -1)
        result.wait(30)
        if not result.done:
            raise _Refused("COORDINATOR_NOT_AVAILABLE")
        if result.error is not None:
            raise _Refused("NOT_COORDINATOR" if error_code(result.error) == 6
                           else "COORDINATOR_NOT_AVAILABLE")

    # ---- the APIs (each answers an error name, "NONE" on success)
    def init_producer_id(self, tid: str, timeout_ms: int) -> tuple[str, int, int]:
        if tid == "":
            return "INVALID_REQUEST", -1, -1
        if timeout_ms <= 0 or timeout_ms > self.max_timeout_ms:
            return "INVALID_TRANSACTION_TIMEOUT", -1, -1
        with self._lock:
            try:
                self._ensure_fresh(tid)
                meta = self._txns.get(tid)
                if meta is None:
                    meta = TransactionMetadata(tid, self.broker.allocate_producer_id(), 0, timeout_ms)
                    self._persist(meta)
                    return "NONE", meta.producer_id, meta.producer_epoch
                if meta.state in ("PrepareCommit", "PrepareAbort"):
                    return "CONCURRENT_TRANSACTIONS", -1, -1
                if meta.state == "Ongoing":   # fence the old producer, abort its transaction
                    self._abort_with_bumped_epoch(meta)
                    return "CONCURRENT_TRANSACTIONS", -1, -1
                nxt = _copy(meta, state="Empty", partitions=set(), timeout_ms=timeout_ms,
                            start_ms=-1)
                if meta.producer_epoch >= MAX_EPOCH:
                    nxt.producer_id, nxt.producer_epoch = self.broker.allocate_producer_id(), 0
                else:
                    nxt.producer_epoch += 1
                self._persist(nxt)
                return "NONE", nxt.producer_id, nxt.producer_epoch
            except _Refused as r:
                return r.error, -1, -1

    def _check_producer(self, tid: str, pid: int, epoch: int) -> TransactionMetadata:
        self._ensure_fresh(tid)
        meta = self._txns.get(tid)
        if meta is None or meta.producer_id != pid:
            raise _Refused("INVALID_PRODUCER_ID_MAPPING")
        if epoch != meta.producer_epoch:
            raise _Refused("PRODUCER_FENCED")
        return meta

    def add_partitions(self, tid: str, pid: int, epoch: int, partitions: list[tuple[str, int]]
                       ) -> dict[tuple[str, int], str]:
        """AddPartitionsToTxn: one error name per partition."""
        with self._lock:
            try:
                meta = self._check_producer(tid, pid, epoch)
                if meta.state in ("PrepareCommit", "PrepareAbort"):
                    raise _Refused("CONCURRENT_TRANSACTIONS")
                unknown = [tp for tp in partitions if not self._exists(*tp)]
                if unknown:
                    return {tp: "UNKNOWN_TOPIC_OR_PARTITION" if tp in unknown
                            else "OPERATION_NOT_ATTEMPTED" for tp in partitions}
                if meta.state == "Ongoing" and set(partitions) <= meta.partitions:
                    return {tp: "NONE" for tp in partitions}
                nxt = _copy(meta, state="Ongoing", partitions=meta.partitions | set(partitions))
                if meta.state != "Ongoing":
                    nxt.start_ms = self.clock.milliseconds()
                self._persist(nxt)
                return {tp: "NONE" for tp in partitions}
            except _Refused as r:
                return {tp: r.error for tp in partitions}

    def _exists(self, topic: str, partition: int) -> bool:
        try:
            return 0 <= partition < self.broker.partition_count(topic)
        except KStoreError:
            return False

    def add_offsets(self, tid: str, pid: int, epoch: int, group_id: str) -> str:
        """AddOffsetsToTxn: the group's `__consumer_offsets` partition joins the transaction."""
        p = self.broker.group_coordinator.partition_for(group_id)
        return self.add_partitions(tid, pid, epoch, [(GROUP_OFFSETS_TOPIC, p)])[(GROUP_OFFSETS_TOPIC, p)]

    def end_txn(self, tid: str, pid: int, epoch: int, commit: bool, wait_markers: bool = True) -> str:
        """EndTxn. With wait_markers=False (the EndTxn request, as Kafka answers it) the answer goes
        once PrepareCommit/PrepareAbort is logged and the markers are written in the background
        (Kafka's TransactionMarkerChannelManager), then Complete* is logged; meanwhile the
        producer's next requests get CONCURRENT_TRANSACTIONS and retry. In-process callers (the
        chapters) wait for the markers, so they are in the logs when end_txn returns."""
        with self._lock:
            try:
                meta = self._check_producer(tid, pid, epoch)
                done = "CompleteCommit" if commit else "CompleteAbort"
                if meta.state == "Ongoing":
                    if wait_markers:
                        self._complete(meta, commit)
                    else:
                        self._markers_in_background(self._prepare(meta, commit))
                    return "NONE"
                if meta.state == done:               # a retry of the EndTxn that succeeded
                    return "NONE"
                if meta.state in ("PrepareCommit", "PrepareAbort"):
                    return "CONCURRENT_TRANSACTIONS"
                return "INVALID_TXN_STATE"
            except _Refused as r:
                return r.error

    # ---- completing a transaction
    def _abort_with_bumped_epoch(self, meta: TransactionMetadata) -> None:
        fenced = _copy(meta, producer_epoch=meta.producer_epoch + 1)
        self._complete(fenced, commit=False)

    def _prepare(self, meta: TransactionMetadata, commit: bool) -> TransactionMetadata:
        prepared = _copy(meta, state="PrepareCommit" if commit else "PrepareAbort")
        self._persist(prepared)
        return prepared

    def _complete(self, meta: TransactionMetadata, commit: bool) -> None:
        self._write_markers_and_finish(self._prepare(meta, commit))

    def _markers_in_background(self, prepared: TransactionMetadata) -> None:
        """Write the markers of a logged Prepare* on another thread, without the coordinator's
        lock (other transactional ids go on), then log Complete*. While they are in flight the
        timer's retry leaves the transaction alone; if some fail, it stays Prepare* for the timer."""
        tid = prepared.transactional_id
        self._writing.add(tid)

        def run() -> None:
            try:
                failed = self.write_markers(prepared.producer_id, prepared.producer_epoch,
                                            prepared.state == "PrepareCommit",
                                            sorted(prepared.partitions), self._coordinator_epoch(tid))
                with self._lock:
                    current = self._txns.get(tid)
                    if failed or current is None or (current.state, current.producer_id,
                                                     current.producer_epoch) != (
                            prepared.state, prepared.producer_id, prepared.producer_epoch):
                        return
                    try:
                        self._persist(_completed(current))
                    except _Refused:
                        pass                        # stays Prepare*: the timer finishes it
            finally:
                with self._lock:
                    self._writing.discard(tid)
        threading.Thread(target=run, name=f"txn-markers-{tid}", daemon=True).start()

    def wait_completed(self, tid: str, timeout_s: float = 30.0) -> str | None:
        """Wait until the transaction of `tid` is no longer in Prepare* (markers written);
        returns its state."""
        import time
        deadline = time.monotonic() + timeout_s
        while True:
            meta = self.describe(tid)
            if meta is None or meta.state not in ("PrepareCommit", "PrepareAbort") \
                    or time.monotonic() > deadline:
                return None if meta is None else meta.state
            time.sleep(0.005)

    def _write_markers_and_finish(self, prepared: TransactionMetadata) -> None:
        commit = prepared.state == "PrepareCommit"
        failed = self.write_markers(prepared.producer_id, prepared.producer_epoch, commit,
                                    sorted(prepared.partitions),
                                    self._coordinator_epoch(prepared.transactional_id))
        if failed:
            raise _Refused("COORDINATOR_NOT_AVAILABLE")   # stays Prepare*; retried on the timer
        self._persist(_completed(prepared))

    def write_markers(self, pid: int, epoch: int, commit: bool, partitions, coordinator_epoch: int
                      ) -> list[tuple[str, int]]:
        """Append a COMMIT/ABORT marker to each partition; returns the partitions that failed."""
        failed = []
        remote: dict[int, list[tuple[str, int]]] = {}
        for topic, p in partitions:
            if self.broker.metadata.topic(topic) is None:
                # Deleted since it joined the transaction: no marker to write (Kafka's
                # TransactionMarkerChannelManager skips such partitions), or the transaction
                # would stay in Prepare* and fence every later one of this producer.
                continue
            state = self.broker.metadata.partition_state(topic, p)
            leader = state["leader"] if state else -1
            if leader != self.broker.broker_id and leader >= 0:
                remote.setdefault(leader, []).append((topic, p))
                continue
            if write_marker_locally(self.broker, topic, p, pid, epoch, commit,
                                    coordinator_epoch) != "NONE":
                failed.append((topic, p))
        for leader, tps in remote.items():
            failed.extend(self._send_markers(leader, pid, epoch, commit, tps, coordinator_epoch))
        return failed

    def _send_markers(self, leader: int, pid: int, epoch: int, commit: bool, tps, coordinator_epoch: int
                      ) -> list[tuple[str, int]]:
        """Markers for partitions another broker leads: a WriteTxnMarkers v0 request to it (in an
        in-process cluster, that broker's handler work is done directly). Returns the failures."""
        transport = self.broker.replica_manager.fetcher.transport
        peers = getattr(transport, "brokers", None)
        if peers is not None:                       # an in-process cluster
            other = peers.get(leader)
            if other is None or not getattr(other, "alive", True):
                return list(tps)
            return [tp for tp in tps if write_marker_locally(other, *tp, pid, epoch, commit,
                                                             coordinator_epoch) != "NONE"]
        from .network_client import KafkaConnection
        from .protocol import API_KEYS
        node = self.broker.metadata.get(f"/brokers/ids/{leader}")
        if node is None:
            return list(tps)
        grouped: dict[str, list[int]] = {}
        for topic, p in tps:
            grouped.setdefault(topic, []).append(p)
        body = {"markers": [{"producer_id": pid, "producer_epoch": epoch, "transaction_result": commit,
                             "coordinator_epoch": coordinator_epoch,
                             "topics": [{"name": t, "partition_indexes": ps}
                                        for t, ps in grouped.items()]}]}
        try:
            conn = KafkaConnection(node["host"], node["port"], client_id=f"broker-{self.broker.broker_id}")
            try:
                answer = conn.request(API_KEYS["WriteTxnMarkers"], 0, body, timeout=30)
            finally:
                conn.close()
        except (OSError, KStoreError):
            return list(tps)
        return [(t["name"], p["partition_index"]) for m in answer["markers"] for t in m["topics"]
                for p in t["partitions"] if p["error_code"] != 0]

    def _finish_prepared(self, p: int | None = None) -> None:
        for meta in list(self._txns.values()):
            if meta.state in ("PrepareCommit", "PrepareAbort") and \
                    meta.transactional_id not in self._writing and \
                    (p is None or self.partition_for(meta.transactional_id) == p):
                try:
                    self._write_markers_and_finish(meta)
                except _Refused:
                    pass

    # ---- timers
    def abort_timed_out(self, now: int | None = None) -> list[str]:
        """Abort (with a bumped epoch) every transaction open longer than its timeout; retry
        unfinished markers. Returns the aborted transactional ids."""
        now = self.clock.milliseconds() if now is None else now
        aborted = []
        with self._lock:
            for meta in list(self._txns.values()):
                if not self._leads(self.partition_for(meta.transactional_id)):
                    continue
                if meta.state == "Ongoing" and meta.start_ms + meta.timeout_ms <= now:
                    try:
                        self._abort_with_bumped_epoch(meta)
                        aborted.append(meta.transactional_id)
                    except _Refused:
                        pass
            self._finish_prepared()
        return aborted

    def remove_expired_transactional_ids(self, now: int | None = None) -> list[str]:
        """Forget the transactional ids idle for transactional.id.expiration.ms with no
        transaction open (Empty, CompleteCommit, CompleteAbort), writing a tombstone for each
        (TransactionStateManager.removeExpiredTransactionalIds). Returns the removed ids."""
        now = self.clock.milliseconds() if now is None else now
        expiration = self.broker.config["transactional.id.expiration.ms"]
        removed = []
        with self._lock:
            for meta in list(self._txns.values()):
                if meta.state not in ("Empty", "CompleteCommit", "CompleteAbort") or \
                        meta.last_update_ms + expiration > now or \
                        not self._leads(self.partition_for(meta.transactional_id)):
                    continue
                try:
                    self._append_state(meta.transactional_id, None, now)
                except _Refused:
                    continue
                del self._txns[meta.transactional_id]
                removed.append(meta.transactional_id)
        return removed

    def expiry_check_due(self) -> bool:
        """Time to remove expired transactional ids?"""
        return self._due("expiry", "transaction.remove.expired.transaction.cleanup.interval.ms")

    def abort_check_due(self) -> bool:
        """Time for the periodic abort of timed-out transactions?"""
        return self._due("abort", "transaction.abort.timed.out.transaction.cleanup.interval.ms")

    def _due(self, task: str, interval_key: str) -> bool:
        """A periodic task is due when its interval (a broker config) has passed since it last ran."""
        now = self.clock.milliseconds()
        if now - self._last_run[task] < self.broker.config[interval_key]:
            return False
        self._last_run[task] = now
        return True

    # ---- views
    def describe(self, tid: str) -> TransactionMetadata | None:
        with self._lock:
            meta = self._txns.get(tid)
            return None if meta is None else _copy(meta)

    def transactional_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._txns)


def write_marker_locally(broker, topic: str, partition: int, pid: int, epoch: int, commit: bool,
                         coordinator_epoch: int, timeout_s: float = 30.0) -> str:
    """Append one marker with acks=all on this broker (the WriteTxnMarkers handler's work); a
    marker in `__consumer_offsets` also settles the group's pending transactional offsets."""
    kind = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
    batch = build_control_batch(kind, timestamp=broker.clock.milliseconds(), producer_id=pid,
                                producer_epoch=epoch, coordinator_epoch=coordinator_epoch)
    try:
        result = broker.produce_request(topic, partition, batch, -1)
        result.wait(timeout_s)
        if not result.done:
            return "REQUEST_TIMED_OUT"
        if result.error is not None:
            raise result.error
    except KStoreError as e:
        from .protocol import ERROR_NAMES
        return ERROR_NAMES.get(error_code(e), "UNKNOWN_SERVER_ERROR")
    if topic == GROUP_OFFSETS_TOPIC:
        broker.group_coordinator.complete_txn(pid, partition, commit)
    return "NONE"


class _Refused(Exception):
    def __init__(self, error: str):
        super().__init__(error)
        self.error = error


def _completed(prepared: TransactionMetadata) -> TransactionMetadata:
    """PrepareCommit → CompleteCommit, PrepareAbort → CompleteAbort, with no partitions."""
    done = "CompleteCommit" if prepared.state == "PrepareCommit" else "CompleteAbort"
    return _copy(prepared, state=done, partitions=set())


def _copy(meta: TransactionMetadata, **changes) -> TransactionMetadata:
    fields = dict(meta.__dict__)
    fields["partitions"] = set(meta.partitions)
    fields.update(changes)
    return TransactionMetadata(**fields)

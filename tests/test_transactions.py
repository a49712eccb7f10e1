"""Transactions: control batches, the `.txnindex`, the last stable offset, the transaction
coordinator, and unmodified librdkafka (confluent-kafka) and kafka-python transactional producers
and read_committed consumers against the broker."""

from __future__ import annotations

import os
import struct
import time
import uuid
from contextlib import closing

import confluent_kafka as ck
import pytest
from hypothesis import given, settings, strategies as st
from kafka import KafkaConsumer, KafkaProducer

from kstore import Record
from kstore import protocol as P
from kstore.broker import Broker
from kstore.clock import ManualClock
from kstore.log import Isolation, Log
from kstore.network_client import KafkaConnection
from kstore.records import ControlRecordType, MemoryRecords, build_batch, build_control_batch
from kstore.server import KafkaServer
from kstore.transaction_index import ENTRY_SIZE, AbortedTxn, TransactionIndex, read_entries
from kstore.transaction_log import (TRANSACTION_STATE_TOPIC, TransactionLogValue, decode_key,
                                    decode_value, encode_key)

API, E = P.API_KEYS, P.ERRORS
T0 = 1_700_000_000_000


def txn_batch(pid: int, values, seq: int = 0, epoch: int = 0) -> bytes:
    return build_batch([Record(b"k", v, T0) for v in values], producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq, transactional=True)


def marker(pid: int, commit: bool, epoch: int = 0) -> bytes:
    kind = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
    return build_control_batch(kind, timestamp=T0, producer_id=pid, producer_epoch=epoch)


def committed_view(log: Log) -> list[bytes]:
    """What a read_committed client keeps: records up to the LSO, minus the aborted ranges that
    the fetch's aborted-transactions list names (the consumer's filtering, as Kafka's Fetcher)."""
    aborted = log.collect_aborted_transactions(log.log_start_offset, log.last_stable_offset)
    out = []
    for batch in log.batches(isolation=Isolation.TXN_COMMITTED):
        if batch.is_control:
            continue
        dropped = any(a.producer_id == batch.producer_id and a.first_offset <= batch.base_offset
                      <= a.last_offset for a in aborted) and batch.is_transactional
        if not dropped:
            out.extend(r.value for r in batch.records())
    return out


# ---------------------------------------------------------------- bytes
def test_aborted_txn_entry_is_34_bytes_as_kafka_writes_it(tmp_path):
    entry = AbortedTxn(producer_id=7, first_offset=3, last_offset=9, last_stable_offset=10)
    data = entry.encode()
    assert len(data) == ENTRY_SIZE == 34
    assert data == struct.pack(">hqqqq", 0, 7, 3, 9, 10)
    index = TransactionIndex(str(tmp_path / "00000000000000000000.txnindex"), 0)
    assert not index.exists()                       # created by the first entry only
    index.append(entry)
    index.append(AbortedTxn(8, 11, 14, 15))
    assert read_entries(index.path) == [entry, AbortedTxn(8, 11, 14, 15)]
    assert str(entry) == ("AbortedTxn(version=0, producerId=7, firstOffset=3, lastOffset=9, "
                          "lastStableOffset=10)")
    with pytest.raises(ValueError, match="less than the last offset"):
        index.append(AbortedTxn(9, 0, 2, 3))
    index.truncate_to(14)
    assert read_entries(index.path) == [entry]
    index.truncate_to(0)
    assert not index.exists()


def test_control_batch_bytes_are_kafkas_end_transaction_marker():
    batch = MemoryRecords(marker(5, commit=True)).batches()[0]
    assert batch.is_control and batch.is_transactional and batch.producer_id == 5
    assert batch.attributes & 0x30 == 0x30                  # the transactional + control bits
    record = batch.records()[0]
    assert record.key == struct.pack(">hh", 0, 1)          # version 0, COMMIT
    assert record.value == struct.pack(">hi", 0, 0)         # version 0, coordinator epoch
    assert batch.control_record_type() == ControlRecordType.COMMIT


def test_transaction_log_records_round_trip():
    value = TransactionLogValue(42, 3, 60000, "Ongoing", {"t": [1, 0], "u": [2]}, T0 + 5, T0)
    data = value.encode()
    assert data[:2] == b"\x00\x00" and data[16] == 1             # version 0, status Ongoing
    assert decode_value(data) == TransactionLogValue(42, 3, 60000, "Ongoing",
                                                     {"t": [0, 1], "u": [2]}, T0 + 5, T0)
    empty = TransactionLogValue(42, 4, 60000, "Empty", {}, T0, -1).encode()
    assert struct.unpack_from(">i", empty, 17)[0] == -1          # Empty: null partitions
    assert decode_key(encode_key("tx-1")) == "tx-1"
    assert encode_key("tx-1") == b"\x00\x00\x00\x04tx-1"


# ---------------------------------------------------------------- the log
def test_lso_txnindex_recovery_truncation_and_retention(tmp_path):
    d = str(tmp_path / "t-0")
    log = Log.open(d, {"segment.bytes": 100_000})
    log.append_as_leader(txn_batch(1, [b"a1", b"a2"]))                 # 0-1 pid 1 (aborted)
    log.append_as_leader(txn_batch(2, [b"c1"]))                        # 2   pid 2 (committed)
    log.append([Record(None, b"plain", T0)])                           # 3
    assert log.last_stable_offset == 0 and log.high_watermark == 4
    assert log.read_records(0, isolation=Isolation.TXN_COMMITTED) == []
    log.append_as_leader(marker(1, commit=False))                      # 4
    assert log.last_stable_offset == 2                                 # pid 2 still open
    assert log.collect_aborted_transactions(0, 10) == [AbortedTxn(1, 0, 4, 2)]
    log.append_as_leader(marker(2, commit=True))                       # 5
    assert log.last_stable_offset == log.high_watermark == 6
    assert committed_view(log) == [b"c1", b"plain"]
    path = os.path.join(d, "00000000000000000000.txnindex")
    assert read_entries(path) == [AbortedTxn(1, 0, 4, 2)]
    log.roll()
    log.append_as_leader(txn_batch(3, [b"x"]))                         # 6, then a crash
    log.close()
    os.remove(path)                                   # a crash lost the index: recovery rebuilds
    log = Log.open(d, {"segment.bytes": 100_000}, had_clean_shutdown=False, recovery_point=0)
    assert read_entries(path) == [AbortedTxn(1, 0, 4, 2)]
    assert log.last_stable_offset == 6                                 # pid 3 still open
    log.close()
    with open(path, "ab") as f:
        f.write(b"\x00" * 10)                       # a torn entry: rebuilt when the log opens
    log = Log.open(d, {"segment.bytes": 100_000})
    assert read_entries(path) == [AbortedTxn(1, 0, 4, 2)]
    log.append_as_leader(marker(3, commit=False))                      # 7, in the second segment
    second = os.path.join(d, "00000000000000000006.txnindex")
    assert read_entries(second) == [AbortedTxn(3, 6, 7, 8)]
    log.truncate_to(7)                                # a follower truncating drops the entry
    assert not os.path.exists(second) and log.last_stable_offset == 6
    log.append_as_leader(marker(3, commit=False))
    log.roll()
    log.update_high_watermark(log.log_end_offset)
    log.maybe_increment_log_start_offset(6)
    log.delete_old_segments()                         # the first segment goes with its .txnindex
    assert not any(n.startswith("00000000000000000000.") and not n.endswith(".deleted")
                   for n in os.listdir(d))
    log.close()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["data", "plain", "commit", "abort", "roll"]),
                          st.integers(1, 3)), max_size=30))
def test_read_committed_matches_a_model_of_committed_and_aborted_ranges(tmp_path_factory, ops):
    """Random interleavings of three transactional producers, plain appends, markers and rolls:
    a read_committed reader (records below the LSO, minus the aborted ranges) sees exactly the
    plain records and the committed transactions' records, in log order; closing, reopening
    after a crash and rebuilding the index changes nothing."""
    d = str(tmp_path_factory.mktemp("prop") / "t-0")
    log = Log.open(d)
    open_txn: dict[int, list[bytes]] = {}
    visible: list[tuple[int, bytes]] = []     # (offset, value) of everything decided committed
    pending: dict[int, list[tuple[int, bytes]]] = {}
    seqs: dict[int, int] = {}
    n = 0
    for op, pid in ops:
        if op == "data":
            value = f"{pid}-{n}".encode()
            info = log.append_as_leader(txn_batch(pid, [value], seq=seqs.get(pid, 0)))
            seqs[pid] = seqs.get(pid, 0) + 1
            pending.setdefault(pid, []).append((info.first_offset, value))
            open_txn.setdefault(pid, [])
        elif op == "plain":
            info = log.append([Record(None, f"p{n}".encode(), T0)])
            visible.append((info.first_offset, f"p{n}".encode()))
        elif op in ("commit", "abort") and pid in open_txn:
            log.append_as_leader(marker(pid, commit=op == "commit"))
            del open_txn[pid]
            done = pending.pop(pid, [])
            if op == "commit":
                visible.extend(done)
        elif op == "roll":
            log.roll()
        n += 1
    first_open = min((pending[p][0][0] for p in open_txn if pending.get(p)), default=None)
    lso = log.high_watermark if first_open is None else first_open
    assert log.last_stable_offset == lso
    expected = [v for o, v in sorted(visible) if o < lso]
    assert committed_view(log) == expected
    assert [r.value for r in log.committed_records()] == expected
    log.close_without_flush()
    for name in os.listdir(d):
        if name.endswith(".txnindex"):
            os.remove(os.path.join(d, name))
    log = Log.open(d, had_clean_shutdown=False, recovery_point=0)
    assert log.last_stable_offset == lso
    assert committed_view(log) == expected
    log.close()


# ---------------------------------------------------------------- the coordinator
def _broker(path, clock=None, **config):
    return Broker(str(path), port=0, clock=clock, config={
        "transaction.state.log.num.partitions": 5, **config})


def test_coordinator_states_fencing_timeout_and_reload(tmp_path):
    clock = ManualClock(T0)
    broker = _broker(tmp_path / "logs", clock)
    broker.create_topic("t", 2)
    tc = broker.transaction_coordinator
    assert tc.init_producer_id("tx", 0) == ("INVALID_TRANSACTION_TIMEOUT", -1, -1)
    error, pid, epoch = tc.init_producer_id("tx", 60000)
    assert (error, epoch) == ("NONE", 0) and tc.describe("tx").state == "Empty"
    assert tc.add_partitions("tx", pid, 0, [("t", 0), ("nope", 0)]) == {
        ("t", 0): "OPERATION_NOT_ATTEMPTED", ("nope", 0): "UNKNOWN_TOPIC_OR_PARTITION"}
    assert tc.add_partitions("tx", pid, 0, [("t", 0), ("t", 1)]) == {("t", 0): "NONE",
                                                                    ("t", 1): "NONE"}
    broker.produce("t", 0, txn_batch(pid, [b"one"]))
    assert tc.describe("tx").state == "Ongoing"
    assert tc.end_txn("tx", pid, 0, True) == "NONE"
    assert tc.describe("tx").state == "CompleteCommit"
    assert tc.end_txn("tx", pid, 0, True) == "NONE"                  # a retried EndTxn
    assert tc.end_txn("tx", pid, 0, False) == "INVALID_TXN_STATE"
    log0, log1 = broker.get_log("t", 0), broker.get_log("t", 1)
    assert [b.control_record_type() for b in log0.batches() if b.is_control] == [ControlRecordType.COMMIT]
    assert [b.control_record_type() for b in log1.batches() if b.is_control] == [ControlRecordType.COMMIT]

    # a second producer with the same id fences the first, aborting its open transaction
    tc.add_partitions("tx", pid, 0, [("t", 0)])
    broker.produce("t", 0, txn_batch(pid, [b"two"], seq=1))
    assert tc.init_producer_id("tx", 60000)[0] == "CONCURRENT_TRANSACTIONS"
    assert tc.describe("tx").state == "CompleteAbort" and tc.describe("tx").producer_epoch == 1
    error, pid2, epoch2 = tc.init_producer_id("tx", 60000)
    assert (error, pid2, epoch2) == ("NONE", pid, 2)
    assert tc.add_partitions("tx", pid, 0, [("t", 0)]) == {("t", 0): "PRODUCER_FENCED"}
    assert tc.end_txn("tx", pid, 0, True) == "PRODUCER_FENCED"
    assert tc.end_txn("tx", pid + 99, 2, True) == "INVALID_PRODUCER_ID_MAPPING"
    assert committed_view(log0) == [b"one"]

    # transaction.timeout.ms: the coordinator aborts, with a bumped epoch
    tc.add_partitions("tx", pid, 2, [("t", 0)])
    broker.produce("t", 0, txn_batch(pid, [b"three"], epoch=2))
    assert log0.last_stable_offset < log0.high_watermark
    assert tc.abort_timed_out() == []
    clock.advance(60_000)
    assert tc.abort_timed_out() == ["tx"]
    assert tc.describe("tx").state == "CompleteAbort" and tc.describe("tx").producer_epoch == 3
    assert log0.last_stable_offset == log0.high_watermark and committed_view(log0) == [b"one"]
    assert tc.end_txn("tx", pid, 2, True) == "PRODUCER_FENCED"

    # restart with a transaction open: the coordinator reloads it from __transaction_state
    tc.init_producer_id("tx", 60000)
    tc.add_partitions("tx", pid, 4, [("t", 1)])
    broker.produce("t", 1, txn_batch(pid, [b"four"], epoch=4))
    broker.shutdown()
    broker = _broker(tmp_path / "logs", clock)
    tc = broker.transaction_coordinator
    meta = tc.describe("tx")
    assert (meta.state, meta.producer_epoch, meta.partitions) == ("Ongoing", 4, {("t", 1)})
    import subprocess
    import sys
    state_dir = broker.get_log(TRANSACTION_STATE_TOPIC, tc.partition_for("tx")).dir
    dumped = subprocess.run([sys.executable, "-m", "kstore", "dump-log", "--transaction-log-decoder",
                             os.path.join(state_dir, "00000000000000000000.log")],
                            capture_output=True, text=True, check=True).stdout
    assert ('key: {"type":"0","data":{"transactionalId":"tx"}} payload: {"version":"0","data":'
            '{"producerId":%d,"producerEpoch":4,"transactionTimeoutMs":60000,"transactionStatus":1,'
            '"transactionPartitions":[{"topic":"t","partitionIds":[1]}],' % pid) in dumped
    assert '"transactionStatus":0,"transactionPartitions":null' in dumped      # Empty
    log1 = broker.get_log("t", 1)
    assert log1.last_stable_offset < log1.high_watermark         # the open txn holds the LSO
    assert tc.end_txn("tx", pid, 4, True) == "NONE"
    assert committed_view(log1) == [b"four"]
    broker.shutdown()


# ---------------------------------------------------------------- real clients
@pytest.fixture()
def served(tmp_path):
    broker = _broker(tmp_path / "logs")
    server = KafkaServer(broker, "127.0.0.1", 0).start_in_thread()
    yield broker, f"127.0.0.1:{server.port}"
    server.stop()
    broker.shutdown()


def _ck_values(bootstrap: str, topic: str, isolation: str, expected: int, timeout: float = 15):
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                            "auto.offset.reset": "earliest", "isolation.level": isolation,
                            "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, 0)])
    got, deadline = [], time.monotonic() + timeout
    quiet_until = None
    while time.monotonic() < deadline:
        m = consumer.poll(0.2)
        if m is not None and not m.error():
            got.append(m.value())
        if len(got) >= expected:   # then a short quiet period: nothing more may arrive
            quiet_until = quiet_until or time.monotonic() + 1.0
            if time.monotonic() > quiet_until:
                break
    consumer.close()
    return got


def _kp_values(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             isolation_level=isolation, consumer_timeout_ms=2500)
    try:
        return [m.value for m in consumer]
    finally:
        consumer.close()


def test_librdkafka_and_kafka_python_commit_and_abort(served):
    broker, bootstrap = served
    broker.create_topic("t", 1)
    producer = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": "ck-tx"})
    producer.init_transactions(20)
    producer.begin_transaction()
    for i in range(3):
        producer.produce("t", value=b"ck-c%d" % i)
    producer.commit_transaction(20)
    producer.begin_transaction()
    for i in range(2):
        producer.produce("t", value=b"ck-a%d" % i)
    producer.flush(10)                      # sent, so the abort needs a marker
    producer.abort_transaction(20)

    kp = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="kp-tx")
    kp.init_transactions()
    kp.begin_transaction()
    kp.send("t", b"kp-c0")
    kp.commit_transaction()
    kp.begin_transaction()
    kp.send("t", b"kp-a0")
    kp.flush()
    kp.abort_transaction()
    producer.begin_transaction()            # left open: read_committed stops at its first offset
    producer.produce("t", value=b"ck-open")
    producer.flush(10)

    committed = [b"ck-c0", b"ck-c1", b"ck-c2", b"kp-c0"]
    everything = committed[:3] + [b"ck-a0", b"ck-a1", b"kp-c0", b"kp-a0", b"ck-open"]
    assert _ck_values(bootstrap, "t", "read_committed", 4) == committed
    assert _ck_values(bootstrap, "t", "read_uncommitted", 8) == everything
    assert _kp_values(bootstrap, "t", "read_committed") == committed
    assert _kp_values(bootstrap, "t", "read_uncommitted") == everything
    log = broker.get_log("t", 0)
    assert [a.producer_id for a in log.collect_aborted_transactions(0, log.log_end_offset)] == [
        broker.transaction_coordinator.describe("ck-tx").producer_id,
        broker.transaction_coordinator.describe("kp-tx").producer_id]
    with closing(KafkaConnection("127.0.0.1", int(bootstrap.rsplit(":", 1)[1]))) as conn:
        answer = conn.request(API["ListOffsets"], 2, {"replica_id": -1, "isolation_level": 1,
                              "topics": [{"name": "t", "partitions": [
                                  {"partition_index": 0, "timestamp": -1}]}]})
        lso = answer["topics"][0]["partitions"][0]["offset"]
        assert lso == log.last_stable_offset < log.high_watermark
        found = conn.request(API["FindCoordinator"], 1, {"key": "ck-tx", "key_type": 1})
        assert (found["error_code"], found["node_id"]) == (0, broker.broker_id)
    producer.abort_transaction(20)
    kp.close(timeout=5)


def test_console_consumer_isolation_level_like_kafka_console_consumer(served):
    """`kstore consume --isolation-level read_committed` leaves out aborted and still-open
    transactions (kafka-console-consumer's option); the consumer property works too, the
    option wins over it, and a bad value is one line naming it."""
    import subprocess
    import sys
    broker, bootstrap = served
    broker.create_topic("t", 1)
    producer = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": "console-tx"})
    producer.init_transactions(20)
    for values, commit in (([b"c0", b"c1"], True), ([b"a0"], False), ([b"c2"], True)):
        producer.begin_transaction()
        for v in values:
            producer.produce("t", value=v)
        producer.flush(10)
        producer.commit_transaction(20) if commit else producer.abort_transaction(20)
    producer.begin_transaction()
    producer.produce("t", value=b"open")
    producer.flush(10)

    def consume(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kstore", "consume", "--bootstrap-server",
                               bootstrap, "--topic", "t", "--from-beginning", "--timeout-ms",
                               "1500", *extra], capture_output=True, text=True, timeout=120)

    committed, everything = ["c0", "c1", "c2"], ["c0", "c1", "a0", "c2", "open"]
    assert consume().stdout.split() == everything
    assert consume("--isolation-level", "read_committed").stdout.split() == committed
    assert consume("--consumer-property", "isolation.level=read_committed").stdout.split() == committed
    assert consume("--consumer-property", "isolation.level=read_committed", "--isolation-level",
                   "read_uncommitted").stdout.split() == everything
    bad = consume("--isolation-level", "read_dirty")
    assert bad.returncode != 0 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "kstore consume: KStoreError: invalid value 'read_dirty' for isolation.level: it must be "
        "one of read_committed, read_uncommitted"]
    producer.abort_transaction(20)


def test_a_second_producer_fences_the_first(served):
    broker, bootstrap = served
    broker.create_topic("t", 1)
    first = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": "same", "log_level": 0})
    first.init_transactions(20)
    first.begin_transaction()
    first.produce("t", value=b"zombie")
    first.flush(10)
    second = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": "same"})
    second.init_transactions(30)             # aborts the zombie's transaction, bumps the epoch
    with pytest.raises(ck.KafkaException) as raised:
        first.commit_transaction(10)
    assert raised.value.args[0].fatal()
    assert raised.value.args[0].code() in (ck.KafkaError._FENCED, ck.KafkaError.PRODUCER_FENCED,
                                           ck.KafkaError.INVALID_PRODUCER_EPOCH)
    second.begin_transaction()
    second.produce("t", value=b"real")
    second.commit_transaction(20)
    assert _kp_values(bootstrap, "t", "read_committed") == [b"real"]


def test_consume_transform_produce_is_exactly_once_across_a_producer_crash(served):
    """A processor copies `in` to `out` in transactions with send_offsets_to_transaction; the
    first instance dies mid-transaction (after producing and sending offsets). Its successor,
    same transactional.id, fences it, resumes from the committed offsets: every input record is
    in `out` exactly once for a read_committed reader."""
    broker, bootstrap = served
    broker.create_topic("in", 1)
    broker.create_topic("out", 1)
    source = ck.Producer({"bootstrap.servers": bootstrap})
    for i in range(30):
        source.produce("in", value=b"r%02d" % i)
    source.flush(10)

    def processor():
        consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "eos",
                                "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                "isolation.level": "read_committed"})
        consumer.assign([ck.TopicPartition("in", 0)])
        producer = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": "eos-app",
                                "log_level": 0})
        producer.init_transactions(30)
        return consumer, producer

    def one_transaction(consumer, producer, n, commit=True) -> int:
        msgs = consumer.consume(n, timeout=5)
        if not msgs:
            return 0
        producer.begin_transaction()
        for m in msgs:
            producer.produce("out", value=m.value().upper())
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 20)
        if commit:
            producer.commit_transaction(20)
        else:
            producer.flush(10)                # crash here: no commit ever comes
        return len(msgs)

    consumer, producer = processor()
    assert one_transaction(consumer, producer, 10) == 10
    one_transaction(consumer, producer, 7, commit=False)
    consumer.close()                          # the crashed instance is abandoned as it is
    consumer, producer = processor()          # its successor fences it and aborts its txn
    copied = 0
    while copied < 20:
        got = one_transaction(consumer, producer, 10)
        assert got, "the successor did not resume from the committed offsets"
        copied += got
    consumer.close()
    out = _kp_values(bootstrap, "out", "read_committed")
    assert out == [b"R%02d" % i for i in range(30)]
    assert len(_kp_values(bootstrap, "out", "read_uncommitted")) == 37     # 7 aborted copies
    committed = broker.group_coordinator.fetch_offsets("eos")
    assert committed[("in", 0)].offset == 30


def test_dump_log_prints_markers_and_the_txnindex_like_kafkas_tool(tmp_path):
    import subprocess
    import sys
    d = str(tmp_path / "t-0")
    log = Log.open(d)
    log.append_as_leader(txn_batch(9, [b"gone"]))
    log.append_as_leader(marker(9, commit=False))
    log.close()
    out = subprocess.run([sys.executable, "-m", "kstore", "dump-log", "--deep-iteration",
                          "--files", f"{d}/00000000000000000000.log,{d}/00000000000000000000.txnindex"],
                         capture_output=True, text=True, check=True).stdout
    assert "isTransactional: true isControl: true" in out
    assert "endTxnMarker: ABORT coordinatorEpoch: 0" in out
    assert ("version: 0 producerId: 9 firstOffset: 0 lastOffset: 1 lastStableOffset: 2"
            in out.splitlines())


def test_the_cleaner_drops_aborted_records_keeps_committed_and_the_abort_entry(tmp_path):
    """Compaction of a transactional log: an aborted transaction's records (even the newest for
    their key) are removed and do not shadow the committed value; cleaning stops at the LSO; the
    kept ABORT marker carries its .txnindex entry into the cleaned segment, gets a delete horizon
    (its transaction has no data left) and goes at a cleaning after it; the COMMIT marker of a
    transaction with data left stays."""
    from kstore.cleaner import Cleaner
    from kstore.offset_map import SkimpyOffsetMap
    d = str(tmp_path / "c-0")
    log = Log.open(d, {"cleanup.policy": "compact", "segment.bytes": 100_000})
    log.append([Record(b"k1", b"old", T0), Record(b"k2", b"keep", T0)])       # 0-1
    log.append_as_leader(build_batch([Record(b"k1", b"committed", T0)], producer_id=1,
                                     producer_epoch=0, base_sequence=0, transactional=True))  # 2
    log.append_as_leader(marker(1, commit=True))                                # 3
    log.append_as_leader(build_batch([Record(b"k1", b"aborted", T0), Record(b"k2", b"aborted", T0)],
                                     producer_id=2, producer_epoch=0, base_sequence=0,
                                     transactional=True))                        # 4-5
    log.append_as_leader(marker(2, commit=False))                               # 6
    log.append_as_leader(build_batch([Record(b"k3", b"later", T0)], producer_id=2,
                                     producer_epoch=0, base_sequence=2, transactional=True))  # 7
    log.append_as_leader(marker(2, commit=True))                                # 8
    log.append_as_leader(build_batch([Record(b"k2", b"open", T0)], producer_id=3,
                                     producer_epoch=0, base_sequence=0, transactional=True))  # 9
    log.roll()
    log.append([Record(b"k9", b"active", T0)])
    assert log.last_stable_offset == 9
    cleaner = Cleaner(SkimpyOffsetMap(1 << 20), log.clock)
    from kstore.cleaner import LogToClean, cleanable_offsets
    first_dirty, uncleanable = cleanable_offsets(log, None, T0)
    assert uncleanable == 9                                 # stops at the open transaction
    cleaner.clean(LogToClean(log, first_dirty, uncleanable, 0, 0), now=T0)
    values = {(r.key, r.value) for r in log.records()}
    assert values == {(b"k2", b"keep"), (b"k1", b"committed"), (b"k3", b"later"),
                      (b"k2", b"open"), (b"k9", b"active")}
    assert committed_view(log) == [b"keep", b"committed", b"later"]
    assert read_entries(os.path.join(d, "00000000000000000000.txnindex")) == [AbortedTxn(2, 4, 6, 7)]
    markers = {b.base_offset: b for b in log.batches() if b.is_control}
    assert markers[6].delete_horizon_ms == T0 + log.config.delete_retention_ms   # data all gone
    assert markers[3].delete_horizon_ms is None              # the committed record is still there
    later = T0 + log.config.delete_retention_ms + 1
    cleaner.clean(LogToClean(log, 0, cleanable_offsets(log, None, later)[1], 0, 0), now=later)
    assert sorted(b.base_offset for b in log.batches() if b.is_control and b.records_count) == [3, 8]
    assert not os.path.exists(os.path.join(d, "00000000000000000000.txnindex"))
    assert committed_view(log) == [b"keep", b"committed", b"later"]
    log.close()


def test_markers_reach_other_leaders_and_a_new_coordinator_finishes_after_failover(tmp_path):
    """A 3-broker cluster (running, real clock): the transaction spans partitions led by all three
    brokers, so the coordinator writes two markers through the other brokers; then the
    coordinator broker crashes mid-transaction, the new leader of the __transaction_state
    partition reloads the Ongoing transaction from the replicated record and aborts it."""
    from kstore.clock import SystemClock
    from kstore.cluster import Cluster
    cluster = Cluster(str(tmp_path / "c"), 3, clock=SystemClock(),
                      broker_config={"transaction.state.log.num.partitions": 3})
    cluster.start()
    try:
        cluster.create_topic("t", 3, 3)
        assert len({cluster.leader("t", p) for p in range(3)}) == 3
        any_tc = cluster.brokers[0].transaction_coordinator         # creates __transaction_state
        coordinator = any_tc.coordinator_for("tx")
        tc = cluster.brokers[coordinator].transaction_coordinator
        error, pid, epoch = tc.init_producer_id("tx", 60000)
        assert error == "NONE"
        parts = [("t", p) for p in range(3)]

        def produce_all(seq: int, tag: bytes, epoch: int) -> None:
            for topic, p in parts:
                result = cluster.brokers[cluster.leader(topic, p)].produce_request(
                    topic, p, txn_batch(pid, [tag], seq=seq, epoch=epoch), -1)
                assert result.wait(20).error is None
        assert set(tc.add_partitions("tx", pid, epoch, parts).values()) == {"NONE"}
        produce_all(0, b"committed", epoch)
        assert tc.end_txn("tx", pid, epoch, True) == "NONE"
        for topic, p in parts:
            log = cluster.brokers[cluster.leader(topic, p)].get_log(topic, p)
            assert [b.control_record_type() for b in log.batches() if b.is_control] == [
                ControlRecordType.COMMIT]

        tc.add_partitions("tx", pid, epoch, parts)
        produce_all(1, b"orphan", epoch)
        wait_until(lambda: all(cluster.brokers[b].get_log(TRANSACTION_STATE_TOPIC, tc.partition_for("tx"))
                               .log_end_offset == cluster.brokers[coordinator].get_log(
                                   TRANSACTION_STATE_TOPIC, tc.partition_for("tx")).log_end_offset
                               for b in cluster.brokers))
        cluster.crash(coordinator)
        successor = any_tc.coordinator_for("tx")
        assert successor not in (coordinator, -1)
        new_tc = cluster.brokers[successor].transaction_coordinator
        assert new_tc.end_txn("tx", pid, epoch, False) == "NONE"     # reloaded: Ongoing -> abort
        assert new_tc.describe("tx").state == "CompleteAbort"
        for topic, p in parts:
            leader = cluster.leader(topic, p)
            if leader == coordinator or leader < 0:
                continue
            log = cluster.brokers[leader].get_log(topic, p)
            wait_until(lambda: log.last_stable_offset == log.high_watermark)
            assert committed_view(log) == [b"committed"]
    finally:
        cluster.shutdown()


def wait_until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_restart_with_an_open_transaction_then_the_timeout_aborts_it(tmp_path):
    """kafka-python leaves a transaction open (1 s timeout) and the broker restarts: the reloaded
    coordinator still knows it, the LSO still holds read_committed readers back, and the
    coordinator's timer aborts it — the records never become visible to read_committed."""
    config = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": 100}
    broker = _broker(tmp_path / "logs", **config)
    server = KafkaServer(broker, "127.0.0.1", 0).start_in_thread()
    bootstrap = f"127.0.0.1:{server.port}"
    broker.create_topic("t", 1)
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="slow",
                             transaction_timeout_ms=1000)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("t", b"committed")
    producer.commit_transaction()
    producer.begin_transaction()
    producer.send("t", b"left open")
    producer.flush()
    server.stop()
    broker.shutdown()
    broker = _broker(tmp_path / "logs", **config)
    log = broker.get_log("t", 0)
    assert log.last_stable_offset == 2 < log.high_watermark         # the open txn survived
    server = KafkaServer(broker, "127.0.0.1", 0).start_in_thread()
    try:
        bootstrap = f"127.0.0.1:{server.port}"
        assert broker.transaction_coordinator.describe("slow").state in ("Ongoing", "CompleteAbort")
        wait_until(lambda: broker.transaction_coordinator.describe("slow").state == "CompleteAbort")
        assert log.last_stable_offset == log.high_watermark
        assert _kp_values(bootstrap, "t", "read_committed") == [b"committed"]
        assert _kp_values(bootstrap, "t", "read_uncommitted") == [b"committed", b"left open"]
    finally:
        producer.close(timeout=1)
        server.stop()
        broker.shutdown()


def test_kafka_python_send_offsets_visible_only_on_commit_and_after_a_restart(tmp_path):
    """TxnOffsetCommit from kafka-python: the offsets are pending (OffsetFetch does not show them)
    until the COMMIT marker reaches __consumer_offsets; an aborted transaction's offsets are
    dropped; a restarted broker replays both the same way."""
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata as KOffset
    broker = _broker(tmp_path / "logs")
    server = KafkaServer(broker, "127.0.0.1", 0).start_in_thread()
    bootstrap = f"127.0.0.1:{server.port}"
    broker.create_topic("in", 1)
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="kp-offsets")
    try:
        producer.init_transactions()
        tp = TopicPartition("in", 0)
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp: KOffset(5, "", -1)}, "kg")
        assert broker.group_coordinator.fetch_offsets("kg") == {}          # pending
        producer.commit_transaction()            # answered at PrepareCommit: the marker follows
        assert broker.transaction_coordinator.wait_completed("kp-offsets") == "CompleteCommit"
        assert broker.group_coordinator.fetch_offsets("kg")[("in", 0)].offset == 5
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp: KOffset(9, "", -1)}, "kg")
        producer.abort_transaction()
        assert broker.transaction_coordinator.wait_completed("kp-offsets") == "CompleteAbort"
        assert broker.group_coordinator.fetch_offsets("kg")[("in", 0)].offset == 5
    finally:
        producer.close(timeout=2)
        server.stop()
        broker.shutdown()
    broker = _broker(tmp_path / "logs")
    try:
        assert broker.group_coordinator.fetch_offsets("kg")[("in", 0)].offset == 5
        assert not broker.group_coordinator.has_pending_offsets("kg")
    finally:
        broker.shutdown()


def test_a_marker_stays_while_an_empty_batch_of_its_transaction_remains(tmp_path):
    """The aborted batch is its producer's last data batch, so the cleaner keeps it empty (the
    producer's sequence state); its ABORT marker must then stay too, or a restart would replay
    an open transaction holding the LSO back for ever."""
    from kstore.cleaner import Cleaner, LogToClean, cleanable_offsets
    from kstore.offset_map import SkimpyOffsetMap
    d = str(tmp_path / "c-0")
    log = Log.open(d, {"cleanup.policy": "compact", "segment.bytes": 100_000})
    log.append_as_leader(build_batch([Record(b"k", b"aborted", T0)], producer_id=4,
                                     producer_epoch=0, base_sequence=0, transactional=True))
    log.append_as_leader(marker(4, commit=False))
    log.roll()
    log.append([Record(b"x", b"active", T0)])
    cleaner = Cleaner(SkimpyOffsetMap(1 << 20), log.clock)
    later = T0 + log.config.delete_retention_ms + 1
    for now in (T0, later):
        cleaner.clean(LogToClean(log, 0, cleanable_offsets(log, None, now)[1], 0, 0), now=now)
    kept = [(b.base_offset, b.records_count, b.is_control) for b in log.batches()]
    assert kept[:2] == [(0, 0, False), (1, 1, True)]
    log.close()
    log = Log.open(d, had_clean_shutdown=False, recovery_point=0)
    assert log.last_stable_offset == log.high_watermark
    log.close()


def test_kstores_own_consumer_drops_aborted_records_in_process_and_over_the_network(served):
    """kstore's Consumer with isolation_level=read_committed drops aborted transactions' records
    (the broker's aborted-transactions list + kstore.completed_fetch), even when a fetch ends in an
    aborted transaction, and reads on when the open transaction commits."""
    from kstore.consumer import Consumer
    from kstore.remote_broker import RemoteBroker
    broker, bootstrap = served
    broker.create_topic("cx", 1)
    log = broker.get_log("cx", 0)
    log.append_as_leader(txn_batch(1, [b"a1", b"a2"]))
    log.append_as_leader(txn_batch(2, [b"c1"]))
    log.append_as_leader(marker(1, commit=False))
    log.append_as_leader(txn_batch(1, [b"c2"], seq=2))          # the same producer, committed next
    log.append_as_leader(marker(1, commit=True))
    log.append_as_leader(marker(2, commit=True))
    log.append_as_leader(txn_batch(3, [b"a3"] * 3))              # aborted, at the log's end
    log.append_as_leader(marker(3, commit=False))
    log.append_as_leader(txn_batch(4, [b"open"]))
    log.update_high_watermark(log.log_end_offset)

    def poll_all(consumer, isolation):
        consumer.assign([("cx", 0)])
        consumer.seek(("cx", 0), 0)
        out = []
        for _ in range(30):                         # many small fetches, none may get stuck
            out += [r.value for r in consumer.poll()]
        return out, consumer.position(("cx", 0))

    remote = RemoteBroker(bootstrap)
    try:
        for b in (broker, remote):
            committed = Consumer(b, isolation_level="read_committed", max_partition_fetch_bytes=100)
            assert poll_all(committed, "rc") == ([b"c1", b"c2"], log.last_stable_offset)
            everything = Consumer(b, max_partition_fetch_bytes=100)
            assert poll_all(everything, "ru")[0] == [b"a1", b"a2", b"c1", b"c2"] + [b"a3"] * 3 + [b"open"]
        log.append_as_leader(marker(4, commit=True))
        log.update_high_watermark(log.log_end_offset)
        assert poll_all(Consumer(remote, isolation_level="read_committed"), "rc")[0] == [b"c1", b"c2", b"open"]
    finally:
        remote.close()


def test_a_marker_from_a_stale_coordinator_epoch_or_producer_epoch_is_refused(served):
    """WriteTxnMarkers as Kafka's partition leader checks it (ProducerAppendInfo.appendEndTxnMarker):
    a marker whose coordinator epoch is older than the producer's last marker's is a zombie
    coordinator's (TRANSACTION_COORDINATOR_FENCED), one with an older producer epoch is fenced
    (INVALID_PRODUCER_EPOCH); nothing is appended and the transaction stays open. The coordinator
    epoch survives a restart (producer snapshot)."""
    from kstore.transaction_coordinator import write_marker_locally
    broker, bootstrap = served
    broker.create_topic("mk", 1)
    log = broker.get_log("mk", 0)
    log.append_as_leader(txn_batch(5, [b"x"], epoch=1))
    assert write_marker_locally(broker, "mk", 0, 5, 1, True, coordinator_epoch=3) == "NONE"
    log.append_as_leader(txn_batch(5, [b"y"], seq=1, epoch=1))
    leo = log.log_end_offset
    assert write_marker_locally(broker, "mk", 0, 5, 1, False, coordinator_epoch=2) == \
        "TRANSACTION_COORDINATOR_FENCED"

    def wire_marker(producer_epoch: int, coordinator_epoch: int) -> int:
        host, port = bootstrap.split(":")
        with closing(KafkaConnection(host, int(port))) as conn:
            answer = conn.request(API["WriteTxnMarkers"], 0, {"markers": [{
                "producer_id": 5, "producer_epoch": producer_epoch, "transaction_result": False,
                "coordinator_epoch": coordinator_epoch,
                "topics": [{"name": "mk", "partition_indexes": [0]}]}]})
        return answer["markers"][0]["topics"][0]["partitions"][0]["error_code"]
    assert wire_marker(1, 2) == E["TRANSACTION_COORDINATOR_FENCED"]
    assert wire_marker(0, 3) == E["INVALID_PRODUCER_EPOCH"]
    assert log.log_end_offset == leo and log.last_stable_offset == leo - 1     # still open
    assert wire_marker(1, 4) == 0                                              # a newer coordinator
    assert log.log_end_offset == leo + 1 and log.collect_aborted_transactions(0, leo + 1)
    log.append_as_leader(txn_batch(5, [b"z"], seq=2, epoch=1))
    broker.shutdown()
    again = _broker(broker.log_dir)
    try:
        assert write_marker_locally(again, "mk", 0, 5, 1, True, coordinator_epoch=3) == \
            "TRANSACTION_COORDINATOR_FENCED"
        assert write_marker_locally(again, "mk", 0, 5, 1, True, coordinator_epoch=4) == "NONE"
    finally:
        again.shutdown()


def test_an_idle_transactional_id_expires_with_a_tombstone(tmp_path):
    """transactional.id.expiration.ms: an id with no open transaction and no request for that long
    is removed (a tombstone in __transaction_state, so it stays gone after a restart); one with a
    transaction open never expires; a producer coming back with the expired id gets a new
    producer id at epoch 0."""
    clock = ManualClock(T0)
    broker = _broker(tmp_path / "logs", clock, **{"transactional.id.expiration.ms": 3_600_000})
    broker.create_topic("t", 1)
    tc = broker.transaction_coordinator
    _e, idle_pid, _ = tc.init_producer_id("idle", 60000)
    _e, busy_pid, _ = tc.init_producer_id("busy", 900000)
    assert tc.add_partitions("busy", busy_pid, 0, [("t", 0)]) == {("t", 0): "NONE"}
    clock.advance(3_599_999)
    assert tc.remove_expired_transactional_ids() == []
    clock.advance(1)
    assert tc.remove_expired_transactional_ids() == ["idle"]
    assert tc.transactional_ids() == ["busy"]
    state = broker.get_log(TRANSACTION_STATE_TOPIC, tc.partition_for("idle"))
    last = state.records()[-1]
    assert decode_key(last.key) == "idle" and last.value is None
    broker.shutdown()
    broker = _broker(tmp_path / "logs", clock, **{"transactional.id.expiration.ms": 3_600_000})
    try:
        tc = broker.transaction_coordinator
        assert tc.transactional_ids() == ["busy"] and tc.describe("busy").state == "Ongoing"
        error, pid, epoch = tc.init_producer_id("idle", 60000)
        assert error == "NONE" and pid != idle_pid and epoch == 0
        assert not tc.expiry_check_due()            # the broker's timer runs it once an hour
        clock.advance(3_600_000)
        assert tc.expiry_check_due() and not tc.expiry_check_due()
    finally:
        broker.shutdown()


def test_end_txn_answers_once_prepare_is_logged_and_markers_follow(served):
    """EndTxn over the wire as Kafka answers it: once PrepareCommit is in __transaction_state; the
    markers are written afterwards in the background (held back here until the test lets them
    go), and meanwhile the producer's next AddPartitionsToTxn gets CONCURRENT_TRANSACTIONS and the
    LSO stays at the transaction's first offset. Then CompleteCommit, the marker, LSO = HW."""
    import threading
    broker, bootstrap = served
    broker.create_topic("as", 1)
    tc = broker.transaction_coordinator
    _e, pid, epoch = tc.init_producer_id("async", 60000)
    tc.add_partitions("async", pid, epoch, [("as", 0)])
    broker.produce("as", 0, txn_batch(pid, [b"v"], epoch=epoch))
    log = broker.get_log("as", 0)
    go, real_write = threading.Event(), tc.write_markers

    def held_back(*args, **kwargs):
        go.wait(30)
        return real_write(*args, **kwargs)
    tc.write_markers = held_back
    host, port = bootstrap.split(":")
    with closing(KafkaConnection(host, int(port))) as conn:
        answer = conn.request(API["EndTxn"], 0, {"transactional_id": "async", "producer_id": pid,
                                                 "producer_epoch": epoch, "committed": True})
    assert answer["error_code"] == 0
    assert tc.describe("async").state == "PrepareCommit"
    assert not any(b.is_control for b in log.batches()) and log.last_stable_offset == 0
    assert tc.add_partitions("async", pid, epoch, [("as", 0)]) == {("as", 0): "CONCURRENT_TRANSACTIONS"}
    go.set()
    assert tc.wait_completed("async") == "CompleteCommit"
    assert [b.control_record_type() for b in log.batches() if b.is_control] == [ControlRecordType.COMMIT]
    assert log.last_stable_offset == log.high_watermark == 2
    assert tc.add_partitions("async", pid, epoch, [("as", 0)]) == {("as", 0): "NONE"}

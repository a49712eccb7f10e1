"""Idempotent producers on the wire: the Produce checks answered with Kafka's error codes, one
batch per partition, InitProducerId (transactions: test_transactions.py), and unmodified librdkafka (confluent-kafka) and kafka-python
producers through a proxy that loses Produce responses after the broker appended: no duplicate,
no gap, order kept, on one broker and across a leader failover in a 3-broker cluster."""

from __future__ import annotations

import signal
import time
from contextlib import closing

import confluent_kafka as ck
import confluent_kafka.admin  # noqa: F401  (ck.admin)
import pytest
from kafka import KafkaProducer

from kstore import Record
from kstore import protocol as P
from kstore.broker import Broker
from kstore.network_client import KafkaConnection
from kstore.records import build_batch
from kstore.server import KafkaServer

from kafka_proxy import DroppingProxy
from test_clients import serve_processes  # noqa: F401  (the fixture)
from test_cluster_network import Node, free_ports, state, values_in_files, wait_for

API, E = P.API_KEYS, P.ERRORS


# ---------------------------------------------------------------- helpers
@pytest.fixture
def broker_server(tmp_path):
    broker = Broker(str(tmp_path / "logs"), port=0)
    server = KafkaServer(broker, "127.0.0.1", 0).start_in_thread()
    yield broker, server
    server.stop()
    broker.shutdown()


def idempotent_batch(seq: int, n: int = 2, pid: int = 0, epoch: int = 0, tag: str = "v") -> bytes:
    """Stamped now: a producer whose last batch is older than producer.id.expiration.ms (a day)
    is forgotten when a snapshot is loaded."""
    now = int(time.time() * 1000)
    return build_batch([Record(None, f"{tag}{seq + i}".encode(), now) for i in range(n)],
                       producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def produce(conn: KafkaConnection, records: bytes, topic: str = "t", version: int = 8) -> dict:
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 5000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}]}
    return conn.request(API["Produce"], version, body)["responses"][0]["partition_responses"][0]


def init_producer_id(conn: KafkaConnection, transactional_id: str | None = None) -> dict:
    return conn.request(API["InitProducerId"], 1, {"transactional_id": transactional_id,
                                                   "transaction_timeout_ms": 60000})


def stored_values(broker: Broker, topic: str = "t") -> list[bytes]:
    return [r.value for r in broker.get_log(topic, 0).records()]


# ---------------------------------------------------------------- raw protocol
def test_each_sequence_rule_on_the_wire(broker_server):
    broker, server = broker_server
    broker.create_topic("t", 1)
    with closing(KafkaConnection("127.0.0.1", server.port)) as conn:
        pid = init_producer_id(conn)["producer_id"]
        first = produce(conn, idempotent_batch(0, pid=pid))
        assert (first["error_code"], first["base_offset"]) == (0, 0)
        produce(conn, idempotent_batch(2, pid=pid))
        retry = produce(conn, idempotent_batch(0, pid=pid))          # duplicate: its first offset
        assert (retry["error_code"], retry["base_offset"]) == (0, 0)
        gap = produce(conn, idempotent_batch(7, pid=pid))
        assert gap["error_code"] == E["OUT_OF_ORDER_SEQUENCE_NUMBER"]
        assert "out of order sequence number" in gap["error_message"]
        produce(conn, idempotent_batch(0, pid=pid, epoch=1))          # a new epoch from 0
        stale = produce(conn, idempotent_batch(4, pid=pid, epoch=0))
        assert stale["error_code"] == E["INVALID_PRODUCER_EPOCH"]
        unknown = produce(conn, idempotent_batch(40, pid=pid + 1))    # KIP-360: accepted
        assert (unknown["error_code"], unknown["base_offset"]) == (0, 6)
        two = produce(conn, idempotent_batch(2, pid=pid, epoch=1) + idempotent_batch(4, pid=pid, epoch=1))
        assert two["error_code"] == E["INVALID_RECORD"]
        assert "exactly one record batch per partition" in two["error_message"]
        assert produce(conn, idempotent_batch(2, pid=pid, epoch=1), version=7)["error_code"] == 0
    assert stored_values(broker) == [b"v0", b"v1", b"v2", b"v3", b"v0", b"v1", b"v40", b"v41",
                                     b"v2", b"v3"]


def test_several_batches_for_a_partition_are_refused_without_a_producer_id_too(broker_server):
    broker, server = broker_server
    broker.create_topic("t", 1)
    plain = build_batch([Record(None, b"a", 1)])
    with closing(KafkaConnection("127.0.0.1", server.port)) as conn:
        assert produce(conn, plain + plain)["error_code"] == E["INVALID_RECORD"]
        assert produce(conn, plain + plain, version=3)["error_code"] == E["CORRUPT_MESSAGE"]
    assert stored_values(broker) == []


def test_producer_ids_are_unique_and_never_reused_after_a_restart(tmp_path):
    ids = []
    for _ in range(2):
        broker = Broker(str(tmp_path / "logs"), port=0)
        server = KafkaServer(broker, "127.0.0.1", 0).start_in_thread()
        with closing(KafkaConnection("127.0.0.1", server.port)) as conn:
            ids += [init_producer_id(conn)["producer_id"] for _ in range(3)]
        server.stop()
        broker.shutdown()
    assert ids[:3] == [0, 1, 2] and len(set(ids)) == 6 and min(ids[3:]) >= 1000


def test_a_killed_and_a_cleanly_stopped_broker_still_recognise_retries(tmp_path, serve_processes):
    """`kstore serve` killed with SIGKILL: the state comes back from the roll's snapshot and the
    batch headers above it; stopped with SIGTERM: from the snapshot written at shutdown."""
    from kstore.remote_broker import RemoteBroker
    log_dir = tmp_path / "logs"
    server = serve_processes(log_dir)
    with closing(RemoteBroker(server.bootstrap)) as remote:
        remote.create_topic("t", 1, configs={"segment.bytes": 600})
        pid = remote.allocate_producer_id()
    sent = [idempotent_batch(seq, pid=pid) for seq in range(0, 24, 2)]

    def connection():
        return closing(KafkaConnection("127.0.0.1", server.port))
    with connection() as conn:
        offsets = [produce(conn, b)["base_offset"] for b in sent]
    assert offsets == list(range(0, 24, 2))
    assert sorted(p.name for p in (log_dir / "t-0").glob("*.snapshot"))   # rolls wrote snapshots
    for stop in ("kill", "stop"):
        server.kill() if stop == "kill" else server.stop()
        server.start()
        with connection() as conn:
            retry = produce(conn, sent[-1])
            assert (retry["error_code"], retry["base_offset"]) == (0, offsets[-1]), stop
            older = produce(conn, sent[-2])
            if stop == "kill":   # replayed from the log above the roll's snapshot: cached again
                assert (older["error_code"], older["base_offset"]) == (0, offsets[-2])
            else:                # as in Kafka, a snapshot keeps only each producer's last batch
                assert older["error_code"] == E["OUT_OF_ORDER_SEQUENCE_NUMBER"]
            assert produce(conn, idempotent_batch(30, pid=pid))["error_code"] == \
                E["OUT_OF_ORDER_SEQUENCE_NUMBER"]
    with connection() as conn:
        assert produce(conn, idempotent_batch(24, pid=pid))["base_offset"] == 24
    server.stop()
    assert (log_dir / "t-0" / "00000000000000000026.snapshot").exists()   # the clean shutdown's


# ---------------------------------------------------------------- real clients, lost responses
N = 3000


def ck_produce_all(bootstrap: str, topic: str, n: int = N, during=None) -> None:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                            "linger.ms": 2, "batch.num.messages": 60, "log_level": 0,
                            "message.timeout.ms": 120000,
                            "reconnect.backoff.max.ms": 200})   # each lost response: a reconnect
    failures = []
    for i in range(n):
        producer.produce(topic, f"{i}".encode(), partition=0,
                         on_delivery=lambda err, msg: err and failures.append(err))
        if i % 60 == 59:
            producer.poll(0.01)
        if during is not None and i == n // 3:
            during()
    assert producer.flush(120) == 0
    assert failures == []


def kp_produce_all(bootstrap: str, topic: str, n: int = N, during=None) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all",
                             linger_ms=2, batch_size=600, max_in_flight_requests_per_connection=5,
                             reconnect_backoff_max_ms=200)
    futures = []
    for i in range(n):
        futures.append(producer.send(topic, f"{i}".encode(), partition=0))
        if during is not None and i == n // 3:
            during()
    producer.flush(120)
    for f in futures:
        f.get(1)
    producer.close(10)


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_lost_produce_responses_leave_no_duplicates_and_no_gaps(broker_server, client):
    broker, server = broker_server
    broker.create_topic("orders", 1)
    proxy = DroppingProxy(drop_every=3, max_drops=15)
    try:
        bootstrap = f"127.0.0.1:{proxy.add(server.port)}"
        (ck_produce_all if client == "confluent-kafka" else kp_produce_all)(bootstrap, "orders")
    finally:
        proxy.close()
    assert proxy.dropped >= 5                     # responses were lost, so retries happened
    assert stored_values(broker, "orders") == [f"{i}".encode() for i in range(N)]


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_no_duplicates_across_a_leader_failover(tmp_path, client):
    """Three `kstore serve` processes behind the proxy; the client produces while responses are
    lost, and a third of the way through the partition leader is killed with SIGKILL. The new
    leader rebuilt the producer state from what it replicated, so the retries are recognised."""
    ports = free_ports(3)
    nodes = [Node(tmp_path, b, ports[b]) for b in range(3)]
    proxy = DroppingProxy(drop_every=4, max_drops=12)
    try:
        for n in nodes:
            n.start()
        bootstrap = ",".join(f"127.0.0.1:{proxy.add(n.port)}" for n in nodes)
        admin = ck.admin.AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([ck.admin.NewTopic("orders", 1, 3)])["orders"].result(30)
        wait_for(lambda: (s := state(tmp_path)[0]) and len(s["isr"]) == 3, 30, "three in sync")
        ids = []
        for n in nodes:   # each process claims its own block of ids in the shared metadata
            with closing(KafkaConnection("127.0.0.1", n.port)) as conn:
                ids += [init_producer_id(conn)["producer_id"] for _ in range(2)]
        assert len(set(ids)) == 6, ids
        killed = []

        def kill_leader():
            leader = state(tmp_path)[0]["leader"]
            nodes[leader].stop(signal.SIGKILL)
            killed.append(leader)

        (ck_produce_all if client == "confluent-kafka" else kp_produce_all)(
            bootstrap, "orders", during=kill_leader)
        expected = [(i, f"{i}".encode()) for i in range(N)]
        for n in nodes:
            if n.broker_id not in killed:
                wait_for(lambda n=n: values_in_files(tmp_path, n.broker_id) == expected, 30,
                         f"broker {n.broker_id} to hold every record once, in order")
        assert proxy.dropped >= 3 and state(tmp_path)[0]["leader"] not in killed
    finally:
        proxy.close()
        for n in nodes:
            n.stop()


# ---------------------------------------------------------------- kstore's own producer
def test_kstores_producer_is_idempotent_by_default_with_acks_all(tmp_path):
    from kstore.errors import KStoreError
    from kstore.producer import Producer
    with Broker(str(tmp_path / "logs")) as broker:
        broker.create_topic("t", 2)
        producer = Producer(broker, linger_ms=0, batch_size=200)
        for i in range(40):
            producer.send("t", f"v{i}", partition=i % 2)
        producer.flush()
        for p in (0, 1):
            batches = broker.get_log("t", p).read(0, 1 << 20).batches()
            assert {b.producer_id for b in batches} == {producer.producer_id}
            assert [b.base_sequence for b in batches] == \
                [sum(x.records_count for x in batches[:i]) for i in range(len(batches))]
        plain = Producer(broker, acks=1)
        plain.send("t", "x", partition=0)
        plain.flush()
        assert broker.get_log("t", 0).read(20, 1 << 20).batches()[-1].producer_id == -1
        with pytest.raises(KStoreError, match="must set acks to all"):
            Producer(broker, acks=1, enable_idempotence=True)


def test_kstores_producer_over_the_network_resends_without_duplicating(broker_server):
    """RemoteBroker resends a batch whose response was lost (the connection closed): the same
    bytes, so the same sequence, and the broker answers with the first append's offsets."""
    from kstore.producer import Producer
    from kstore.remote_broker import RemoteBroker
    broker, server = broker_server
    broker.create_topic("orders", 1)
    proxy = DroppingProxy(drop_every=3, max_drops=10)
    try:
        remote = RemoteBroker(f"127.0.0.1:{proxy.add(server.port)}")
        producer = Producer(remote, linger_ms=0, batch_size=300)
        futures = [producer.send("orders", f"{i}", partition=0) for i in range(300)]
        producer.flush()
        remote.close()
    finally:
        proxy.close()
    assert proxy.dropped >= 5
    assert [f.get().offset for f in futures] == list(range(300))
    assert stored_values(broker, "orders") == [f"{i}".encode() for i in range(300)]

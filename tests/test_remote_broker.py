"""`RemoteBroker` as a library: kstore's own Producer and Consumer, unchanged, running against a
broker over real sockets, and giving the same answers as the in-process `Broker` they also run on."""

from __future__ import annotations

import time

import pytest

from kstore.broker import Broker
from kstore.consumer import Consumer
from kstore.errors import (CommitFailedError, InvalidPartitionsError, KStoreError,
                           OffsetOutOfRangeError, TopicExistsError, UnknownTopicOrPartitionError)
from kstore.partitioner import partition_for_key
from kstore.producer import Producer
from kstore.remote_broker import RemoteBroker, parse_bootstrap
from kstore.server import KafkaServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def remote(tmp_path):
    broker = Broker(str(tmp_path / "logs"))
    server = KafkaServer(broker, "127.0.0.1", 0).start_in_thread()
    client = RemoteBroker(f"127.0.0.1:{server.port}", timeout_s=5)
    yield broker, client
    client.close()
    server.stop()
    broker.shutdown()


def test_producer_and_consumer_run_unchanged_over_the_network(remote):
    broker, client = remote
    client.create_topic("orders", 3, 1, {"cleanup.policy": "compact"})
    producer = Producer(client, linger_ms=0, batch_size=200, compression_type="gzip")
    futures = [producer.send("orders", f"value {i}", key=f"key-{i % 5}") for i in range(50)]
    producer.close()
    sent = [f.get() for f in futures]
    # Kafka's partition for each key, and dense offsets
    assert all(partition_for_key(f"key-{i % 5}".encode(), 3) == m.partition for i, m in enumerate(sent))
    for p in range(3):
        offsets = [m.offset for m in sent if m.partition == p]
        assert offsets == list(range(len(offsets)))

    consumer = Consumer(client, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([("orders", p) for p in range(3)])
    got = []
    while batch := consumer.poll():
        got.extend(batch)
    assert sorted(r.value.decode() for r in got) == sorted(f"value {i}" for i in range(50))
    consumer.commit()
    assert {tp: om.offset for tp, om in broker.group_coordinator.fetch_offsets("g").items()} == {
        ("orders", p): len([m for m in sent if m.partition == p]) for p in range(3)}

    # what the network says equals what the engine says
    for p in range(3):
        for ts in (-2, -1, sent[0].timestamp):
            assert client.list_offsets("orders", p, ts).offset == broker.list_offsets("orders", p, ts).offset
    assert client.describe_topic("orders").configs == {"cleanup.policy": "compact"}
    assert [(p.partition, p.leader, p.replicas, p.isr) for p in client.describe_topic("orders").partitions] \
        == [(p.partition, p.leader, p.replicas, p.isr) for p in broker.describe_topic("orders").partitions]
    assert client.group_coordinator.groups() == ["g"]


def test_errors_arrive_as_the_engine_raises_them(remote):
    broker, client = remote
    client.create_topic("t", 2)
    with pytest.raises(TopicExistsError, match="topic 't' already exists"):
        client.create_topic("t", 2)
    with pytest.raises(InvalidPartitionsError, match="never shrink"):
        client.create_partitions("t", 1)
    with pytest.raises(UnknownTopicOrPartitionError, match="topic 'nope' does not exist"):
        client.partition_count("nope")
    with pytest.raises(UnknownTopicOrPartitionError, match="no partition 5"):
        client.list_offsets("t", 5, -1)
    with pytest.raises(OffsetOutOfRangeError):
        client.fetch("t", 0, 10)
    # The coordinator answers per partition, as Kafka's does: the unknown one is refused and
    # named, the valid one is committed (the in-process coordinator refuses the whole commit).
    with pytest.raises(CommitFailedError, match="t-7: UNKNOWN_TOPIC_OR_PARTITION; 1 other"):
        client.group_coordinator.commit_offsets("g", {("t", 0): 1, ("t", 7): 1})
    assert {tp: om.offset for tp, om in broker.group_coordinator.fetch_offsets("g").items()} == {
        ("t", 0): 1}
    with pytest.raises(CommitFailedError, match="t-0"):
        client.group_coordinator.commit_offsets("g", {("t", 0): -5})
    assert broker.group_coordinator.fetch_offsets("g")[("t", 0)].offset == 1
    consumer = Consumer(client)
    with pytest.raises(UnknownTopicOrPartitionError):
        consumer.assign([("t", 2)])
    assert broker.partition_count("t") == 2


def test_acks_zero_gets_no_answer_and_still_lands(remote):
    broker, client = remote
    client.create_topic("fire", 1)
    producer = Producer(client, acks=0, linger_ms=0)
    future = producer.send("fire", "and forget")
    producer.close()
    assert future.get().offset == -1            # the broker does not say where it went
    deadline = time.monotonic() + 10
    while broker.list_offsets("fire", 0, -1).offset == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert broker.list_offsets("fire", 0, -1).offset == 1


@pytest.mark.parametrize("servers", ["localhost", "host:port", ":9092", "h:0", "h:70000", "a:1,,b:2"])
def test_bad_bootstrap_lists_are_named(servers):
    with pytest.raises(KStoreError, match="bootstrap servers are HOST:PORT"):
        parse_bootstrap(servers)


# ---- requests sent as gathered buffers ------------------------------------------------------

def test_a_produce_request_sent_in_buffers_is_byte_for_byte_the_encoded_frame():
    """The client sends a Produce request's batches from their own buffers (no copy into the
    frame); joined, the buffers are exactly the frame encode_request builds."""
    from kstore import protocol as P
    from kstore.records import Record, build_batch
    batches = [build_batch([Record(b"k%d" % i, b"v" * (100 * i), 1)]) for i in range(4)]
    body = {"transactional_id": "t", "acks": -1, "timeout_ms": 30000, "topic_data": [
        {"name": "a", "partition_data": [{"index": 0, "records": batches[0]},
                                         {"index": 1, "records": None}]},
        {"name": "b", "partition_data": [{"index": 3, "records": batches[2]},
                                         {"index": 4, "records": b""}]}]}
    for version in (3, 7, 8):
        gathered = {**body, "topic_data": [
            {"name": t["name"], "partition_data": [
                {**p, "records": None if p["records"] is None else P.RecordsBuffer(p["records"])}
                for p in t["partition_data"]]} for t in body["topic_data"]]}
        chunks = P.encode_request_chunks(0, version, 7, "c", gathered)
        assert b"".join(bytes(c) for c in chunks) == P.encode_request(0, version, 7, "c", body)
        assert any(c is batches[0] for c in chunks) and any(c is batches[2] for c in chunks)


def test_send_buffers_finishes_partial_gathering_writes_in_order():
    import socket
    import threading
    from kstore.network_client import send_buffers
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)    # many partial sendmsg calls
    buffers = [bytes([i]) * n for i, n in enumerate([3, 0, 70_000, 1, 250_000, 5, 0, 1_000_000])]
    received = bytearray()

    def read():
        while len(received) < sum(map(len, buffers)):
            received.extend(b.recv(65536))
    reader = threading.Thread(target=read)
    reader.start()
    a.settimeout(10)
    send_buffers(a, [memoryview(buffers[0]), bytearray(buffers[1]), *buffers[2:]])
    reader.join(10)
    a.close(), b.close()
    assert bytes(received) == b"".join(buffers)

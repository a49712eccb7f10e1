"""The broker and its in-process clients: topics and their files and metadata, the producer's
batching and acks, the consumer's positions and reads, and what commit timing really does."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from kstore import ManualClock
from kstore.broker import Broker
from kstore.consumer import Consumer
from kstore.errors import (ConfigError, InvalidPartitionsError, InvalidReplicationFactorError,
                           InvalidRequiredAcksError, InvalidTopicError, KStoreError,
                           NoOffsetForPartitionError, OffsetOutOfRangeError, TopicExistsError,
                           UnknownTopicOrPartitionError)
from kstore.group_coordinator import OFFSETS_TOPIC
from kstore.log import Isolation
from kstore.producer import Producer
from kstore.records import ControlRecordType, Record, build_batch, build_control_batch, encode_record

T0 = 1_700_000_000_000
METADATA_FILE = "kstore-cluster-metadata.json"


@pytest.fixture
def clock():
    return ManualClock(T0)


@pytest.fixture
def log_dir(tmp_path):
    return tmp_path / "logs"


@pytest.fixture
def open_broker(log_dir, clock):
    brokers: list[Broker] = []

    def make(**kwargs) -> Broker:
        kwargs.setdefault("clock", clock)
        b = Broker(str(log_dir), **kwargs)
        brokers.append(b)
        return b

    yield make
    for b in brokers:
        b.shutdown()


@pytest.fixture
def broker(open_broker):
    return open_broker()


def snapshot(directory: Path) -> dict:
    """Every file under a directory with its bytes (to prove nothing was written)."""
    out = {}
    for root, dirs, files in os.walk(directory):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), directory) + "/"] = None
        for f in files:
            path = os.path.join(root, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, directory)] = fh.read()
    return out


def drain(consumer: Consumer) -> list:
    """Poll until a poll returns nothing."""
    out = []
    while batch := consumer.poll():
        out.extend(batch)
    return out


def values(broker: Broker, topic: str, partition: int) -> list[bytes]:
    return [r.value for r in broker.get_log(topic, partition).records()]


# ==========================================================================================
# Topics
# ==========================================================================================
def test_create_topic_with_partitions_and_config_overrides(open_broker, log_dir):
    broker = open_broker(topic_defaults={"retention.ms": 3_600_000})
    info = broker.create_topic("orders", 3, configs={"segment.bytes": 4096,
                                                     "cleanup.policy": "compact"})
    plain = broker.create_topic("plain", 2)
    assert info.partition_count == 3 and info.replication_factor == 1
    assert info.configs == {"segment.bytes": 4096, "cleanup.policy": "compact"}
    assert plain.configs == {}
    for p in range(3):
        config = broker.get_log("orders", p).config
        assert config.segment_bytes == 4096
        assert config.cleanup_policy == ("compact",)
        assert config.retention_ms == 3_600_000            # broker default for topics, not overridden
        assert config.index_interval_bytes == 4096         # Kafka's default
        assert (log_dir / f"orders-{p}").is_dir()
    for p in range(2):
        config = broker.get_log("plain", p).config
        assert (config.segment_bytes, config.cleanup_policy, config.retention_ms) == \
            (1073741824, ("delete",), 3_600_000)
    assert not (log_dir / "orders-3").exists()
    assert sorted(broker.topics()) == ["orders", "plain"]
    # partitions carry what Kafka's DescribeTopics/Metadata report
    for part in info.partitions:
        assert (part.leader, part.replicas, part.isr, part.leader_epoch) == (0, [0], [0], 0)
        assert (part.log_start_offset, part.log_end_offset, part.high_watermark) == (0, 0, 0)


def test_a_bad_topic_config_writes_nothing(broker, log_dir):
    before = snapshot(log_dir)
    with pytest.raises(ConfigError, match="segment.bytes"):
        broker.create_topic("bad", 2, configs={"segment.bytes": 1})
    with pytest.raises(ConfigError, match="Unknown topic config name"):
        broker.create_topic("bad", 2, configs={"segmentbytes": 4096})
    assert snapshot(log_dir) == before
    assert broker.metadata.topic("bad") is None


def test_alter_topic_config_reaches_the_open_logs_and_the_metadata(broker):
    broker.create_topic("orders", 2, configs={"segment.bytes": 4096})
    broker.alter_topic_config("orders", {"retention.ms": 1000})
    for p in range(2):
        c = broker.get_log("orders", p).config
        assert (c.segment_bytes, c.retention_ms) == (4096, 1000)
    assert broker.metadata.get("/config/topics/orders") == \
        {"version": 1, "config": {"segment.bytes": 4096, "retention.ms": 1000}}
    with pytest.raises(ConfigError):
        broker.alter_topic_config("orders", {"retention.ms": -7})
    assert broker.get_log("orders", 0).config.retention_ms == 1000
    with pytest.raises(UnknownTopicOrPartitionError):
        broker.alter_topic_config("missing", {"retention.ms": 5})


def test_partition_metadata_file_is_exact_and_written_before_data(broker, log_dir):
    info = broker.create_topic("orders", 2)
    topic_id = info.topic_id
    assert len(topic_id) == 22 and not topic_id.startswith("-")
    raw = base64.urlsafe_b64decode(topic_id + "==")
    assert len(raw) == 16
    for p in range(2):
        pdir = log_dir / f"orders-{p}"
        # before anything was produced: the file is there and the log is empty
        assert (pdir / "00000000000000000000.log").stat().st_size == 0
        assert (pdir / "partition.metadata").read_bytes() == \
            f"version: 0\ntopic_id: {topic_id}".encode()
        # read as Kafka does: split each line on ':\s+'
        fields = dict(line.split(": ", 1) for line in
                      (pdir / "partition.metadata").read_text().split("\n"))
        assert fields == {"version": "0", "topic_id": topic_id}
    assert broker.metadata.topic("orders")["topic_id"] == topic_id
    # a second topic gets another id
    assert broker.create_topic("payments", 1).topic_id != topic_id
    # auto-created topics and added partitions get the file too, with their topic's id
    producer = Producer(broker, linger_ms=60_000)
    producer.send("auto", value=b"x")
    auto_id = broker.describe_topic("auto").topic_id
    assert (log_dir / "auto-0" / "partition.metadata").read_text() == f"version: 0\ntopic_id: {auto_id}"
    assert (log_dir / "auto-0" / "00000000000000000000.log").stat().st_size == 0   # not sent yet
    producer.flush()
    broker.create_partitions("orders", 3)
    assert (log_dir / "orders-2" / "partition.metadata").read_text() == \
        f"version: 0\ntopic_id: {topic_id}"


def test_zookeeper_shaped_metadata_tree_and_restart(open_broker, log_dir, clock):
    broker = open_broker(host="10.0.0.7", port=9093)
    info = broker.create_topic("orders", 3, configs={"segment.bytes": 4096})
    producer = Producer(broker)
    producer.send("orders", value=b"v", key=b"k")
    producer.flush()
    tree = broker.metadata.tree()
    assert tree["/cluster/id"]["version"] == "1"
    cluster_id = tree["/cluster/id"]["id"]
    assert len(cluster_id) == 22 and broker.cluster_id == cluster_id
    assert tree["/controller"]["brokerid"] == 0 and tree["/controller"]["version"] == 2
    assert tree["/controller_epoch"] == 1
    reg = tree["/brokers/ids/0"]
    assert (reg["host"], reg["port"], reg["endpoints"]) == ("10.0.0.7", 9093, ["PLAINTEXT://10.0.0.7:9093"])
    topic = tree["/brokers/topics/orders"]
    assert topic["topic_id"] == info.topic_id
    assert topic["partitions"] == {"0": [0], "1": [0], "2": [0]}
    for p in range(3):
        state = tree[f"/brokers/topics/orders/partitions/{p}/state"]
        assert (state["leader"], state["leader_epoch"], state["isr"]) == (0, 0, [0])
        assert state["controller_epoch"] == 1
    assert tree["/config/topics/orders"] == {"version": 1, "config": {"segment.bytes": 4096}}
    assert broker.metadata.children("/brokers/ids") == ["0"]
    assert broker.metadata.children("/brokers/topics") == ["orders"]
    # it is a JSON file in the log dir, with the same content
    on_disk = json.loads((log_dir / METADATA_FILE).read_text())
    assert on_disk == tree
    assert "cluster.id=" + cluster_id in (log_dir / "meta.properties").read_text()

    broker.shutdown()
    again = open_broker(host="10.0.0.7", port=9093)
    tree2 = again.metadata.tree()
    strip = lambda t: {k: v for k, v in t.items() if k != "/brokers/ids/0"}   # noqa: E731
    assert strip(tree2) == strip(tree)
    assert tree2["/brokers/ids/0"]["host"] == "10.0.0.7"
    assert again.cluster_id == cluster_id
    assert again.describe_topic("orders").topic_id == info.topic_id
    assert again.get_log("orders", 1).config.segment_bytes == 4096    # configs reapplied
    assert sum(again.describe_topic("orders").partitions[p].log_end_offset for p in range(3)) == 1


def test_auto_creation_on_first_produce_uses_num_partitions(open_broker, log_dir):
    broker = open_broker(config={"num.partitions": 4})
    producer = Producer(broker)
    f = producer.send("events", value=b"hello", key=b"user-1")
    producer.flush()
    info = broker.describe_topic("events")
    assert info.partition_count == 4
    assert all((log_dir / f"events-{p}" / "partition.metadata").exists() for p in range(4))
    assert values(broker, "events", f.get().partition) == [b"hello"]
    # consumers do not create topics
    consumer = Consumer(broker)
    with pytest.raises(UnknownTopicOrPartitionError):
        consumer.assign([("never-produced", 0)])
    with pytest.raises(UnknownTopicOrPartitionError):
        consumer.assign([("events", 4)])
    assert not (log_dir / "never-produced-0").exists()
    # the internal topic is never auto-created by a produce
    with pytest.raises(UnknownTopicOrPartitionError):
        broker.ensure_topic(OFFSETS_TOPIC)


def test_auto_creation_disabled_refuses_and_writes_nothing(open_broker, log_dir):
    broker = open_broker(config={"auto.create.topics.enable": False})
    before = snapshot(log_dir)
    producer = Producer(broker)
    with pytest.raises(UnknownTopicOrPartitionError, match="auto.create.topics.enable is false"):
        producer.send("events", value=b"x")
    with pytest.raises(UnknownTopicOrPartitionError):
        broker.produce("events", 0, build_batch([Record(b"k", b"v", T0)]))
    assert snapshot(log_dir) == before
    assert broker.topics() == []
    broker.create_topic("events", 2)            # explicit creation still works
    producer.send("events", value=b"x", partition=1)
    producer.flush()
    assert values(broker, "events", 1) == [b"x"]


def test_partition_count_grows_but_never_shrinks_or_stays(broker, log_dir):
    broker.create_topic("orders", 2)
    producer = Producer(broker)
    for i in range(10):
        producer.send("orders", value=f"v{i}".encode(), partition=i % 2)
    producer.flush()
    info = broker.create_partitions("orders", 5)
    assert info.partition_count == 5
    assert [p.partition for p in info.partitions] == [0, 1, 2, 3, 4]
    assert broker.metadata.topic("orders")["partitions"] == {str(p): [0] for p in range(5)}
    for p in range(2, 5):
        assert broker.metadata.partition_state("orders", p)["leader"] == 0
        assert broker.get_log("orders", p).log_end_offset == 0
    assert values(broker, "orders", 0) == [f"v{i}".encode() for i in range(0, 10, 2)]
    before = snapshot(log_dir)
    for bad in (5, 4, 1, 0, -1):
        with pytest.raises(InvalidPartitionsError, match="currently has 5 partitions"):
            broker.create_partitions("orders", bad)
    assert snapshot(log_dir) == before
    with pytest.raises(UnknownTopicOrPartitionError):
        broker.create_partitions("missing", 3)
    # a new partition takes records at once
    f = producer.send("orders", value=b"new", partition=4)
    producer.flush()
    assert f.get().offset == 0 and values(broker, "orders", 4) == [b"new"]


@pytest.mark.parametrize("partitions", [0, -3])
def test_a_topic_needs_at_least_one_partition(broker, log_dir, partitions):
    before = snapshot(log_dir)
    with pytest.raises(InvalidPartitionsError):
        broker.create_topic("orders", partitions)
    assert snapshot(log_dir) == before


def test_replication_factor_above_the_broker_count_is_refused(broker, log_dir):
    before = snapshot(log_dir)
    with pytest.raises(InvalidReplicationFactorError,
                       match="replication factor: 3 larger than available brokers: 1"):
        broker.create_topic("orders", 3, replication_factor=3)
    with pytest.raises(InvalidReplicationFactorError):
        broker.create_topic("orders", 3, replication_factor=0)
    assert snapshot(log_dir) == before
    assert broker.create_topic("orders", 3, replication_factor=1).replication_factor == 1


@pytest.mark.parametrize("name", ["../x", ".", "..", "a" * 250, "ordres-é", "", "a/b",
                                  "with space", "tab\there", "nul\x00"])
def test_invalid_topic_names_are_refused_and_nothing_is_written(broker, log_dir, name):
    before = snapshot(log_dir)
    with pytest.raises(InvalidTopicError):
        broker.create_topic(name, 1)
    producer = Producer(broker)
    with pytest.raises(InvalidTopicError):
        producer.send(name, value=b"x")            # auto-creation validates too
    assert snapshot(log_dir) == before
    assert broker.topics(include_internal=True) == []
    assert not (log_dir.parent / "x-0").exists()


def test_longest_legal_topic_name(broker, log_dir):
    name = "a" * 249
    broker.create_topic(name, 1)
    assert (log_dir / f"{name}-0" / "partition.metadata").exists()


def test_duplicate_topics_are_refused(broker, log_dir):
    info = broker.create_topic("orders.v1", 2)
    before = snapshot(log_dir)
    with pytest.raises(TopicExistsError, match="already exists"):
        broker.create_topic("orders.v1", 5)
    with pytest.raises(TopicExistsError, match="collides"):
        broker.create_topic("orders_v1", 1)         # '.' and '_' collide in metric names
    assert snapshot(log_dir) == before
    assert broker.describe_topic("orders.v1").topic_id == info.topic_id
    assert broker.partition_count("orders.v1") == 2


# ==========================================================================================
# Producer
# ==========================================================================================
def _size(key: bytes, value: bytes) -> int:
    return len(encode_record(0, 0, key, value))


def test_a_batch_goes_out_when_it_reaches_batch_size(broker, clock):
    broker.create_topic("t", 1)
    key, value = b"key-00", b"v" * 40
    size = _size(key, value)
    log = broker.get_log("t", 0)
    producer = Producer(broker, batch_size=61 + 5 * size, linger_ms=60_000, clock=clock)
    futures = []
    for i in range(12):
        futures.append(producer.send("t", value=value, key=key))
        # exactly full after the 5th record: sent right away
        assert log.log_end_offset == 5 * ((i + 1) // 5), i
    assert producer.pending() == 2 and not futures[10].done and futures[9].done
    assert [f.get().offset for f in futures[:10]] == list(range(10))
    batches = log.read(0, 1 << 20).batches()
    assert [b.records_count for b in batches] == [5, 5]
    assert all(b.size_in_bytes == 61 + 5 * size for b in batches)
    assert producer.batches_sent == 2 and producer.records_sent == 10
    with pytest.raises(KStoreError, match="not been sent yet"):
        futures[11].get()


def test_a_record_that_does_not_fit_sends_the_open_batch_first(broker, clock):
    broker.create_topic("t", 1)
    key, value = b"key-00", b"v" * 40
    size = _size(key, value)
    log = broker.get_log("t", 0)
    producer = Producer(broker, batch_size=61 + 5 * size + 10, linger_ms=60_000, clock=clock)
    for i in range(5):
        producer.send("t", value=value, key=key)
    assert log.log_end_offset == 0                 # 10 bytes short of batch.size: still open
    producer.send("t", value=value, key=key)       # does not fit: the 5 go, it starts a batch
    assert log.log_end_offset == 5 and producer.pending() == 1
    producer.flush()
    assert [b.records_count for b in log.read(0, 1 << 20).batches()] == [5, 1]


def test_linger_ms_holds_a_batch_until_it_has_waited(broker, clock):
    broker.create_topic("t", 2)
    log0, log1 = broker.get_log("t", 0), broker.get_log("t", 1)
    producer = Producer(broker, linger_ms=100, clock=clock)
    f = producer.send("t", value=b"a", partition=0)
    assert producer.poll() == 0 and log0.log_end_offset == 0
    clock.advance(60)
    g = producer.send("t", value=b"b", partition=1)   # a younger batch on another partition
    clock.advance(39)
    assert producer.poll() == 0 and not f.done and log0.log_end_offset == 0
    clock.advance(1)                                   # 100 ms since the first record
    assert producer.poll() == 1
    assert f.get().offset == 0 and f.get().timestamp == T0
    assert log0.log_end_offset == 1 and log1.log_end_offset == 0 and not g.done
    clock.advance(60)
    producer.send("t", value=b"c", partition=0)        # send() also sends what is due
    assert g.done and log1.log_end_offset == 1 and log0.log_end_offset == 1
    producer.flush()
    assert log0.log_end_offset == 2 and producer.pending() == 0


def test_linger_zero_sends_every_record_at_once(broker, clock):
    broker.create_topic("t", 1)
    producer = Producer(broker, linger_ms=0, clock=clock)
    for i in range(3):
        producer.send("t", value=b"x")
        assert broker.get_log("t", 0).log_end_offset == i + 1


def test_flush_and_close_send_everything(broker, clock):
    broker.create_topic("t", 3)
    producer = Producer(broker, linger_ms=60_000, clock=clock)
    fs = [producer.send("t", value=f"{i}".encode(), partition=i % 3) for i in range(9)]
    assert producer.pending() == 9 and sum(broker.get_log("t", p).log_end_offset for p in range(3)) == 0
    producer.flush()
    assert producer.pending() == 0 and all(f.done for f in fs)
    assert [len(broker.get_log("t", p).read(0, 1 << 20).batches()) for p in range(3)] == [1, 1, 1]
    producer.send("t", value=b"last", partition=0)
    producer.close()
    assert values(broker, "t", 0)[-1] == b"last"
    with pytest.raises(KStoreError, match="closed"):
        producer.send("t", value=b"late")


@pytest.mark.parametrize("acks", [0, 1, -1, "all"])
def test_legal_acks(broker, acks):
    broker.create_topic("t", 1)
    producer = Producer(broker, acks=acks, linger_ms=0)
    assert producer.send("t", value=b"x").get().offset == 0
    broker.produce("t", 0, build_batch([Record(None, b"y", T0)]), acks=acks)
    assert broker.get_log("t", 0).log_end_offset == 2


@pytest.mark.parametrize("acks", [2, -2, 3, "one", "ALL", "", None, True, [1]])
def test_illegal_acks_are_refused(broker, acks):
    broker.create_topic("t", 1)
    with pytest.raises(InvalidRequiredAcksError):
        Producer(broker, acks=acks)
    with pytest.raises(InvalidRequiredAcksError):
        broker.produce("t", 0, build_batch([Record(None, b"y", T0)]), acks=acks)
    assert broker.get_log("t", 0).log_end_offset == 0
    assert InvalidRequiredAcksError.error_code == 21


# ==========================================================================================
# Consumer: positions and reads
# ==========================================================================================
def _fill(broker, topic, partitions, n, ts_step=10):
    producer = Producer(broker, linger_ms=0)
    for p in range(partitions):
        for i in range(n):
            producer.send(topic, value=f"{p}-{i}".encode(), key=f"k{i}".encode(), partition=p,
                          timestamp_ms=T0 + ts_step * i)
    producer.flush()


def test_assign_poll_max_poll_records_and_positions(broker):
    broker.create_topic("t", 2)
    _fill(broker, "t", 2, 25)
    consumer = Consumer(broker, auto_offset_reset="earliest", max_poll_records=10)
    consumer.assign([("t", 0), ("t", 1)])
    assert consumer.assignment() == [("t", 0), ("t", 1)]
    assert consumer.position(("t", 0)) == 0
    got, sizes = [], []
    while True:
        batch = consumer.poll()
        if not batch:
            break
        sizes.append(len(batch))
        got.extend(batch)
    assert max(sizes) == 10 and sum(sizes) == 50
    for p in range(2):
        mine = [r for r in got if r.partition == p]
        assert [r.offset for r in mine] == list(range(25))
        assert [r.value for r in mine] == [f"{p}-{i}".encode() for i in range(25)]
        assert consumer.position(("t", p)) == 25
    r = got[0]
    assert (r.topic, r.timestamp_type, r.leader_epoch) == ("t", "CreateTime", 0)
    assert consumer.poll(max_records=3) == []
    with pytest.raises(KStoreError, match="not assigned"):
        consumer.position(("t", 5))


def test_poll_returns_the_rest_of_a_batch_on_the_next_poll(broker):
    broker.create_topic("t", 1)
    broker.produce("t", 0, build_batch([Record(b"k", f"v{i}".encode(), T0) for i in range(10)]))
    consumer = Consumer(broker, auto_offset_reset="earliest", max_poll_records=4)
    consumer.assign([("t", 0)])
    offsets = [[r.offset for r in consumer.poll()] for _ in range(4)]
    assert offsets == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], []]


def test_seek_to_beginning_end_and_offsets(broker):
    broker.create_topic("t", 1)
    _fill(broker, "t", 1, 20)
    consumer = Consumer(broker, auto_offset_reset="latest")
    tp = ("t", 0)
    consumer.assign([tp])
    assert consumer.position(tp) == 20 and consumer.poll() == []
    consumer.seek_to_beginning()
    assert consumer.position(tp) == 0
    assert [r.offset for r in consumer.poll(max_records=3)] == [0, 1, 2]
    consumer.seek(tp, 15)
    assert [r.offset for r in consumer.poll()] == [15, 16, 17, 18, 19]
    consumer.seek(tp, 7)
    assert consumer.poll(max_records=1)[0].value == b"0-7"
    consumer.seek_to_end([tp])
    assert consumer.position(tp) == 20
    with pytest.raises(ValueError):
        consumer.seek(tp, -1)
    with pytest.raises(KStoreError, match="not assigned"):
        consumer.seek(("t", 1), 0)


def test_seek_by_timestamp(broker):
    broker.create_topic("t", 1)
    _fill(broker, "t", 1, 20, ts_step=10)          # record i has timestamp T0 + 10 i
    consumer = Consumer(broker)
    tp = ("t", 0)
    consumer.assign([tp])
    found = consumer.offsets_for_times({tp: T0 + 25})[tp]
    assert (found.offset, found.timestamp) == (3, T0 + 30)
    exact = consumer.offsets_for_times({tp: T0 + 50})[tp]
    assert (exact.offset, exact.timestamp) == (5, T0 + 50)
    assert consumer.offsets_for_times({tp: 0})[tp].offset == 0
    assert consumer.offsets_for_times({tp: T0 + 191})[tp] is None     # after the newest record
    consumer.seek_to_timestamp(tp, T0 + 120)
    assert consumer.position(tp) == 12
    assert consumer.poll(max_records=1)[0].timestamp == T0 + 120
    consumer.seek_to_timestamp(tp, T0 + 10_000)
    assert consumer.position(tp) == 20


def test_consumers_read_only_below_the_high_watermark(broker):
    broker.create_topic("t", 1)
    _fill(broker, "t", 1, 10)                        # ten one-record batches
    log = broker.get_log("t", 0)
    assert log.high_watermark == 10                  # single replica: HW = LEO
    log.update_high_watermark(6)
    tp = ("t", 0)
    consumer = Consumer(broker, auto_offset_reset="earliest")
    consumer.assign([tp])
    assert [r.offset for r in consumer.poll()] == [0, 1, 2, 3, 4, 5]
    assert consumer.position(tp) == 6 and consumer.poll() == []
    assert broker.list_offsets("t", 0, -1).offset == 6       # "latest" is the HW
    assert broker.fetch("t", 0, 6).high_watermark == 6
    assert broker.fetch("t", 0, 6).data.batches() == []
    assert consumer.offsets_for_times({tp: T0 + 80})[tp] is None   # record 8 is above the HW
    # a follower (LOG_END isolation) still reads everything
    assert len(broker.fetch("t", 0, 6, isolation=Isolation.LOG_END).data.batches()) == 4
    latest = Consumer(broker, auto_offset_reset="latest")
    latest.assign([tp])
    assert latest.position(tp) == 6
    log.update_high_watermark(10)
    assert [r.offset for r in consumer.poll()] == [6, 7, 8, 9]
    assert [r.offset for r in latest.poll()] == [6, 7, 8, 9]


def test_offset_gaps_left_by_compaction_are_skipped(broker):
    broker.create_topic("compacted", 1, configs={"cleanup.policy": "compact", "segment.bytes": 600})
    producer = Producer(broker, linger_ms=0)
    for i in range(60):
        producer.send("compacted", key=f"k{i % 4}".encode(), value=f"v{i}".encode(), partition=0)
    log = broker.get_log("compacted", 0)
    assert log.number_of_segments > 3
    broker.logs.cleaner.clean_log(log)
    active_base = log.active_segment.base_offset
    consumer = Consumer(broker, auto_offset_reset="earliest")
    consumer.assign([("compacted", 0)])
    got = drain(consumer)
    offsets = [r.offset for r in got]
    cleaned = [o for o in offsets if o < active_base]
    # below the active segment: only the latest record of each key (before it) is left
    assert cleaned == sorted(max(i for i in range(active_base) if i % 4 == k) for k in range(4))
    assert offsets[len(cleaned):] == list(range(active_base, 60))
    assert [r.value for r in got] == [f"v{o}".encode() for o in offsets]
    assert offsets != list(range(len(offsets)))     # there are gaps...
    assert consumer.position(("compacted", 0)) == 60  # ...and the position still reaches the end
    # a seek into a gap lands on the next record that exists
    gap = next(o for o in range(60) if o not in offsets)
    consumer.seek(("compacted", 0), gap)
    assert consumer.poll(max_records=1)[0].offset == min(o for o in offsets if o > gap)


def test_tombstones_are_delivered_and_once_removed_leave_a_gap_to_jump(broker, clock):
    broker.create_topic("compacted", 1, configs={"cleanup.policy": "compact", "segment.bytes": 500,
                                                 "delete.retention.ms": 1000})
    producer = Producer(broker, linger_ms=0)
    for i in range(20):
        producer.send("compacted", key=f"k{i % 4}".encode(), value=f"v{i}".encode(), partition=0)
    for k in range(4):
        producer.send("compacted", key=f"k{k}".encode(), value=None, partition=0)   # tombstones
    log = broker.get_log("compacted", 0)
    log.roll()
    broker.logs.cleaner.clean_log(log)
    tp = ("compacted", 0)
    c1 = Consumer(broker, auto_offset_reset="earliest")
    c1.assign([tp])
    got = c1.poll()
    # every value was superseded by its tombstone; the tombstones themselves are delivered
    assert [(r.offset, r.key, r.value) for r in got] == [(20 + k, f"k{k}".encode(), None)
                                                         for k in range(4)]
    assert c1.position(tp) == 24
    # past delete.retention.ms the next cleaning drops them: offsets 0..23 hold nothing at all
    clock.advance(1001)
    producer.send("compacted", key=b"other", value=b"final", partition=0)
    log.roll()
    producer.send("compacted", key=b"other", value=b"after", partition=0)
    broker.logs.cleaner.clean_log(log)
    assert all(r.offset >= 24 for r in log.records())
    c2 = Consumer(broker, auto_offset_reset="earliest")
    c2.assign([tp])
    assert c2.position(tp) == 0
    # (a fetch reads from one segment, as Kafka's does: 24 is in a cleaned one, 25 in the active)
    assert [(r.offset, r.value) for r in drain(c2)] == [(24, b"final"), (25, b"after")]
    assert c2.position(tp) == 26
    assert [r.offset for r in drain(c1)] == [24, 25]


def test_control_batches_are_skipped_but_advance_the_position(broker):
    broker.create_topic("t", 1)
    broker.produce("t", 0, build_batch([Record(b"a", b"1", T0), Record(b"b", b"2", T0)]))
    broker.produce("t", 0, build_control_batch(ControlRecordType.COMMIT, timestamp=T0,
                                               producer_id=7, producer_epoch=0))
    broker.produce("t", 0, build_batch([Record(b"c", b"3", T0)]))
    broker.produce("t", 0, build_control_batch(ControlRecordType.ABORT, timestamp=T0,
                                               producer_id=8, producer_epoch=0))
    log = broker.get_log("t", 0)
    assert log.log_end_offset == 5
    assert [b.is_control for b in log.read(0, 1 << 20).batches()] == [False, True, False, True]
    consumer = Consumer(broker, auto_offset_reset="earliest")
    consumer.assign([("t", 0)])
    got = consumer.poll()
    assert [(r.offset, r.value) for r in got] == [(0, b"1"), (1, b"2"), (3, b"3")]
    assert consumer.position(("t", 0)) == 5          # past the trailing marker
    assert consumer.poll() == []


def test_auto_offset_reset_earliest_latest_none(broker):
    broker.create_topic("t", 1)
    _fill(broker, "t", 1, 5)
    tp = ("t", 0)
    earliest = Consumer(broker, group_id="e", auto_offset_reset="earliest")
    latest = Consumer(broker, group_id="l", auto_offset_reset="latest")
    none = Consumer(broker, group_id="n", auto_offset_reset="none")
    for c in (earliest, latest, none):
        c.assign([tp])
    assert [r.offset for r in earliest.poll()] == [0, 1, 2, 3, 4]
    assert latest.poll() == [] and latest.position(tp) == 5
    with pytest.raises(NoOffsetForPartitionError):
        none.poll()
    with pytest.raises(ValueError):
        Consumer(broker, auto_offset_reset="smallest")
    # new records: "latest" sees only those
    Producer(broker, linger_ms=0).send("t", value=b"new", partition=0)
    assert [r.value for r in latest.poll()] == [b"new"]
    # a committed offset wins over the reset policy
    broker.group_coordinator.commit_offsets("n", {tp: 3})
    none2 = Consumer(broker, group_id="n", auto_offset_reset="none")
    none2.assign([tp])
    assert [r.offset for r in none2.poll()] == [3, 4, 5]
    # an out-of-range position is reset (or raised with "none")
    earliest.seek(tp, 100)
    assert earliest.poll() == [] and earliest.position(tp) == 0
    latest.seek(tp, 100)
    latest.poll()
    assert latest.position(tp) == 6
    none2.seek(tp, 100)
    with pytest.raises(OffsetOutOfRangeError):
        none2.poll()


# ==========================================================================================
# Commit timing
# ==========================================================================================
def _topic_with(broker, n=10):
    broker.create_topic("jobs", 1)
    producer = Producer(broker, linger_ms=0)
    for i in range(n):
        producer.send("jobs", value=f"job-{i}".encode(), partition=0)
    return ("jobs", 0)


def test_commit_after_processing_then_crash_redelivers_at_least_once(broker):
    tp = _topic_with(broker)
    processed: list[bytes] = []
    c1 = Consumer(broker, group_id="workers", enable_auto_commit=False, auto_offset_reset="earliest",
                  max_poll_records=4)
    c1.assign([tp])
    first = c1.poll()
    processed.extend(r.value for r in first)
    c1.commit()                                       # after processing: commits offset 4
    second = c1.poll()
    processed.extend(r.value for r in second)         # processed 4..7 ...
    del c1                                            # ... and crashed before committing them
    assert broker.group_coordinator.fetch_offsets("workers", [tp])[tp].offset == 4

    c2 = Consumer(broker, group_id="workers", enable_auto_commit=False, auto_offset_reset="earliest")
    c2.assign([tp])
    redelivered = c2.poll()
    processed.extend(r.value for r in redelivered)
    c2.commit()
    assert [r.offset for r in redelivered] == list(range(4, 10))
    # every job was processed, some twice: at-least-once
    assert set(processed) == {f"job-{i}".encode() for i in range(10)}
    assert sorted(v for v in set(processed) if processed.count(v) == 2) == \
        [f"job-{i}".encode() for i in range(4, 8)]


def test_commit_before_processing_then_crash_skips_at_most_once(broker):
    tp = _topic_with(broker)
    processed: list[bytes] = []
    c1 = Consumer(broker, group_id="workers", enable_auto_commit=False, auto_offset_reset="earliest",
                  max_poll_records=6)
    c1.assign([tp])
    records = c1.poll()
    c1.commit()                                       # before processing: commits offset 6
    for r in records[:2]:                             # processes two, then crashes
        processed.append(r.value)
    del c1

    c2 = Consumer(broker, group_id="workers", enable_auto_commit=False, auto_offset_reset="earliest")
    c2.assign([tp])
    for r in c2.poll():
        processed.append(r.value)
    lost = {f"job-{i}".encode() for i in range(10)} - set(processed)
    assert lost == {f"job-{i}".encode() for i in (2, 3, 4, 5)}       # never processed
    assert len(processed) == len(set(processed))                     # nothing twice: at-most-once


def test_auto_commit_on_poll_after_the_interval_and_on_close(broker, clock):
    tp = _topic_with(broker)
    gc = broker.group_coordinator
    c = Consumer(broker, group_id="auto", auto_commit_interval_ms=5000, auto_offset_reset="earliest",
                 max_poll_records=3)
    c.assign([tp])
    assert [r.offset for r in c.poll()] == [0, 1, 2]
    assert gc.fetch_offsets("auto", [tp])[tp] is None
    clock.advance(4999)
    assert [r.offset for r in c.poll()] == [3, 4, 5]
    assert gc.fetch_offsets("auto", [tp])[tp] is None           # not yet: 4999 < 5000
    clock.advance(1)
    assert [r.offset for r in c.poll()] == [6, 7, 8]
    # committed at the start of that poll: what the earlier polls returned
    committed = gc.fetch_offsets("auto", [tp])[tp]
    assert committed.offset == 6 and committed.commit_timestamp == T0 + 5000
    clock.advance(1000)
    c.poll()                                                    # 9; interval not over
    assert gc.fetch_offsets("auto", [tp])[tp].offset == 6
    c.close()                                                   # close commits the position
    assert gc.fetch_offsets("auto", [tp])[tp].offset == 10
    with pytest.raises(KStoreError, match="closed"):
        c.poll()
    # a crash (no close) loses the auto-commit of the last records: they come back
    c2 = Consumer(broker, group_id="auto2", auto_commit_interval_ms=5000,
                  auto_offset_reset="earliest")
    c2.assign([tp])
    assert len(c2.poll()) == 10
    del c2
    c3 = Consumer(broker, group_id="auto2", auto_offset_reset="earliest")
    c3.assign([tp])
    assert len(c3.poll()) == 10


def test_auto_commit_disabled_and_without_group(broker, clock):
    tp = _topic_with(broker)
    c = Consumer(broker, group_id="manual", enable_auto_commit=False, auto_offset_reset="earliest")
    c.assign([tp])
    c.poll()
    clock.advance(60_000)
    c.poll()
    c.close()
    assert broker.group_coordinator.fetch_offsets("manual", [tp])[tp] is None
    anonymous = Consumer(broker, auto_offset_reset="earliest")
    anonymous.assign([tp])
    assert len(anonymous.poll()) == 10
    assert anonymous.committed(tp) is None
    with pytest.raises(KStoreError, match="group_id"):
        anonymous.commit()
    with pytest.raises(KStoreError, match="group_id"):
        anonymous.commit_async()


def test_commit_async_callbacks_run_on_the_next_poll(broker):
    tp = _topic_with(broker)
    calls = []
    c = Consumer(broker, group_id="async", enable_auto_commit=False, auto_offset_reset="earliest",
                 max_poll_records=4)
    c.assign([tp])
    c.poll()
    c.commit_async(callback=lambda offsets, error: calls.append((dict(offsets), error)))
    assert calls == [] and c.committed(tp) is None               # queued, not yet written
    c.commit_async({tp: 2}, callback=lambda offsets, error: calls.append((dict(offsets), error)))
    second = c.poll()
    assert [r.offset for r in second] == [4, 5, 6, 7]
    # both ran, in order, with the offsets they committed
    assert calls == [({tp: 4}, None), ({tp: 2}, None)]
    assert c.committed(tp).offset == 2                           # the last one written wins
    # a failing async commit reports its error to the callback instead of raising
    c.commit_async({("jobs", 9): 1}, callback=lambda offsets, error: calls.append((offsets, error)))
    c.poll()
    offsets, error = calls[-1]
    assert offsets == {("jobs", 9): 1} and "jobs-9" in str(error)
    assert c.committed(tp).offset == 2
    # close() runs what is still queued
    c.commit_async(callback=lambda offsets, error: calls.append((dict(offsets), error)))
    c.close(autocommit=False)
    assert calls[-1] == ({tp: 10}, None) and c.committed(tp).offset == 10

"""The broker's admin requests (CreateTopics, CreatePartitions, DescribeConfigs, ListGroups,
DescribeLogDirs) driven by two real, unmodified admin clients over loopback sockets: confluent-kafka's AdminClient
(librdkafka) and kafka-python's KafkaAdminClient. What they report is checked against the broker's
own state, and every refusal must leave that state as it was."""

from __future__ import annotations

import glob
import os

import confluent_kafka as ck
import kafka.errors
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.admin import NewPartitions as KPNewPartitions
from kafka.admin import NewTopic as KPNewTopic

from kstore.broker import MAX_PARTITIONS_PER_TOPIC, Broker
from kstore.records import Record, build_batch
from kstore.server import KafkaServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def served(tmp_path):
    broker = Broker(str(tmp_path / "logs"), config={"num.partitions": 2})
    server = KafkaServer(broker, "127.0.0.1", 0).start_in_thread()
    yield broker, f"127.0.0.1:{server.port}"
    server.stop()
    broker.shutdown()


def results(futures: dict, timeout: float = 30) -> dict:
    """name -> None (success) or the KafkaError code name."""
    out = {}
    for name, future in futures.items():
        try:
            future.result(timeout)
            out[name] = None
        except ck.KafkaException as e:
            out[name] = e.args[0].name()
    return out


def test_confluent_admin_creates_and_grows_topics(served):
    broker, bootstrap = served
    admin = AdminClient({"bootstrap.servers": bootstrap})
    got = results(admin.create_topics([
        NewTopic("orders", 3, 1, config={"cleanup.policy": "compact", "retention.ms": "3600000"}),
        NewTopic("defaults"),                              # -1, -1: num.partitions (2) and RF 1
        NewTopic("bad/name", 1, 1),
        NewTopic("too-many-replicas", 1, 3),
        NewTopic("bad-config", 1, 1, config={"segment.bytes": "1"}),
        NewTopic("unknown-config", 1, 1, config={"no.such.config": "1"}),
        NewTopic("placed", 2, replica_assignment=[[0], [0]]),
        NewTopic("zero", 0, 1),
        NewTopic("huge", MAX_PARTITIONS_PER_TOPIC + 1, 1),
    ]))
    assert got == {"orders": None, "defaults": None, "bad/name": "TOPIC_EXCEPTION",
                   "too-many-replicas": "INVALID_REPLICATION_FACTOR", "bad-config": "INVALID_CONFIG",
                   "unknown-config": "INVALID_CONFIG", "placed": "INVALID_REPLICA_ASSIGNMENT",
                   "zero": "INVALID_PARTITIONS", "huge": "INVALID_PARTITIONS"}
    assert sorted(broker.topics()) == ["defaults", "orders"]   # the refused ones left no trace
    assert broker.partition_count("defaults") == 2
    assert broker.get_log("orders", 2).config.compact
    assert broker.get_log("orders", 0).config.retention_ms == 3600000

    assert results(admin.create_topics([NewTopic("orders", 1, 1)])) == {"orders": "TOPIC_ALREADY_EXISTS"}
    assert results(admin.create_topics([NewTopic("checked", 4, 1)], validate_only=True)) == {"checked": None}
    assert "checked" not in broker.topics()                      # validate_only created nothing

    assert results(admin.create_partitions([NewPartitions("orders", 5), NewPartitions("defaults", 1),
                                            NewPartitions("missing", 4)])) == {
        "orders": None, "defaults": "INVALID_PARTITIONS", "missing": "UNKNOWN_TOPIC_OR_PART"}
    assert broker.partition_count("orders") == 5 and broker.partition_count("defaults") == 2
    assert broker.get_log("orders", 4).config.compact          # new partitions keep the topic's configs
    assert results(admin.create_partitions([NewPartitions("orders", 9)], validate_only=True)) == {
        "orders": None}
    assert broker.partition_count("orders") == 5

    metadata = admin.list_topics(timeout=10)
    assert {t: len(m.partitions) for t, m in metadata.topics.items()} == {"orders": 5, "defaults": 2}


def test_confluent_admin_describes_configs_with_their_sources(served):
    broker, bootstrap = served
    broker.create_topic("orders", 1, 1, {"cleanup.policy": "compact,delete", "min.insync.replicas": "1"})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.describe_configs([ConfigResource("topic", "orders"), ConfigResource("broker", "0"),
                                      ConfigResource("topic", "missing")])
    by_type = {}
    for resource, future in futures.items():
        try:
            by_type[resource.name] = future.result(10)
        except ck.KafkaException as e:
            by_type[resource.name] = e.args[0].name()
    topic = by_type["orders"]
    assert (topic["cleanup.policy"].value, topic["cleanup.policy"].source) == (
        "compact,delete", ck.admin.ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert (topic["retention.ms"].value, topic["retention.ms"].source) == (
        "604800000", ck.admin.ConfigSource.DEFAULT_CONFIG.value)
    assert topic["preallocate"].value == "false" and not topic["retention.ms"].is_read_only
    assert topic["flush.messages"].value == str((1 << 63) - 1)
    assert len(topic) == len(broker.logs.default_config.as_dict())    # every topic config
    num_partitions = by_type["0"]["num.partitions"]      # set for this broker in the fixture
    assert (num_partitions.value, num_partitions.source, num_partitions.is_read_only) == (
        "2", ck.admin.ConfigSource.STATIC_BROKER_CONFIG.value, True)
    assert by_type["missing"] == "UNKNOWN_TOPIC_OR_PART"


def test_kafka_python_admin_agrees(served):
    broker, bootstrap = served
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        admin.create_topics([KPNewTopic("events", 3, 1, topic_configs={"retention.ms": "1000"})])
        with pytest.raises(kafka.errors.TopicAlreadyExistsError):
            admin.create_topics([KPNewTopic("events", 3, 1)])
        admin.create_partitions({"events": KPNewPartitions(4)})
        assert broker.partition_count("events") == 4
        changed = admin.describe_configs([KPConfigResource(ConfigResourceType.TOPIC, "events")])
        assert {name: (c["value"], c["config_source"], c["config_type"])
                for name, c in changed["topic"]["events"].items()} == {
            "retention.ms": ("1000", "DYNAMIC_TOPIC_CONFIG", "LONG")}     # only what was set
        every = admin.describe_configs([KPConfigResource(ConfigResourceType.TOPIC, "events")],
                                       config_filter="all")["topic"]["events"]
        assert every["segment.bytes"]["value"] == "1073741824"
        assert every["segment.bytes"]["config_source"] == "DEFAULT_CONFIG"
        assert every["cleanup.policy"]["config_type"] == "LIST"

        assert admin.list_groups() == []
        broker.group_coordinator.commit_offsets("reporting", {("events", 0): 3})
        broker.group_coordinator.commit_offsets("billing", {("events", 1): 1})
        assert sorted(g["group_id"] for g in admin.list_groups()) == ["billing", "reporting"]
        assert {g["protocol_type"] for g in admin.list_groups()} == {""}
    finally:
        admin.close()


def test_describe_configs_with_no_keys_or_an_empty_key_list_describes_every_config(served):
    """DescribeConfigs' configuration_keys: null and [] both mean every config (Kafka's
    ConfigHelper); a list names the ones wanted."""
    from test_clients import Conn
    from kstore import protocol as P
    broker, bootstrap = served
    port = int(bootstrap.rsplit(":", 1)[1])

    def names(keys) -> set[str]:
        body = {"resources": [{"resource_type": 4, "resource_name": "0", "configuration_keys": keys}],
                "include_synonyms": False}
        with Conn(port) as c:
            (result,) = c.call(P.API_KEYS["DescribeConfigs"], 1, body)["results"]
        assert result["error_code"] == 0
        return {entry["name"] for entry in result["configs"]}

    every = names(None)
    assert {"socket.send.buffer.bytes", "socket.receive.buffer.bytes", "num.partitions"} <= every
    assert names([]) == every
    assert names(["socket.send.buffer.bytes", "no.such.config"]) == {"socket.send.buffer.bytes"}


def test_kafka_python_describe_log_dirs_reports_the_bytes_on_disk(served):
    """kafka-log-dirs.sh --describe: each partition's size is what its segment files hold."""
    broker, bootstrap = served
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([KPNewTopic("sized", 3, 1)])
        for p, n in ((0, 5), (2, 40)):
            broker.get_log("sized", p).append_as_leader(build_batch(
                [Record(b"k", b"v" * 100)] * n))
        broker.get_log("sized", 2).roll()                        # two segments: both count
        broker.get_log("sized", 2).append_as_leader(build_batch([Record(None, b"after the roll")]))

        (described,) = admin.describe_log_dirs()
        (log_dir,) = described["log_dirs"]
        assert (described["broker"], log_dir["error_code"]) == (0, 0)
        assert log_dir["log_dir"] == broker.logs.log_dir
        sizes = {p["partition_index"]: p["partition_size"]
                 for t in log_dir["topics"] if t["name"] == "sized" for p in t["partitions"]}
        on_disk = {p: sum(os.path.getsize(f) for f in glob.glob(
            os.path.join(broker.logs.log_dir, f"sized-{p}", "*.log"))) for p in range(3)}
        assert sizes == on_disk and sizes[1] == 0 and sizes[2] > sizes[0] > 0
        assert all(p["offset_lag"] == 0 and p["is_future_key"] is False
                   for t in log_dir["topics"] for p in t["partitions"])

        # only the partitions asked for; one this broker does not hold is left out, as in Kafka
        (only,) = admin.describe_log_dirs({"sized": [2, 9]})
        assert [(t["name"], [p["partition_index"] for p in t["partitions"]])
                for t in only["log_dirs"][0]["topics"]] == [("sized", [2])]
    finally:
        admin.close()

"""DeleteRecords, AlterConfigs and IncrementalAlterConfigs against a `kstore serve` process, driven
by the two admin clients a Kafka developer reaches for, unmodified and in their default modes:
confluent-kafka's AdminClient (librdkafka) and kafka-python's KafkaAdminClient. Before kstore
answered these requests both clients refused to send them ("not supported by broker").

Every answer is checked against what the clients then see (watermarks, the first record a consumer
gets, DescribeConfigs) and against the broker's files after a crash and a restart."""

from __future__ import annotations

import shutil
import signal
import time

import confluent_kafka as ck
import kafka.errors
import pytest
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic,
                                   OffsetSpec)
from kafka import TopicPartition as KPTopicPartition
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient

from test_clients import serve_processes  # noqa: F401 (the fixture)
from test_cluster_network import cluster, values_in_files, wait_for  # noqa: F401 (the fixture)

pytestmark = pytest.mark.timeout(90)

# Small segments, so that deleted records leave whole segments for retention to remove; the
# retention task runs often, so that its removal is seen within the test.
OVERRIDES = ("log.segment.bytes=1024", "log.retention.check.interval.ms=200",
             "log.initial.task.delay.ms=0")


def outcomes(futures: dict, timeout: float = 15) -> dict:
    """key -> the result (low watermark for DeleteRecords, None for configs) or the error name."""
    out = {}
    for key, future in futures.items():
        try:
            result = future.result(timeout)
            out[key] = getattr(result, "low_watermark", result)
        except ck.KafkaException as e:
            out[key] = e.args[0].name()
    return out


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    """Batches of at most 5 records, well under the 1 KiB segments."""
    producer = ck.Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 5})
    errors = []
    for i in range(per_partition):
        for p in range(partitions):
            producer.produce(topic, key=b"k%d" % i, value=b"value-%03d-" % i + b"x" * 100, partition=p,
                             on_delivery=lambda err, msg: err and errors.append(err))
        producer.poll(0)
    assert producer.flush(15) == 0 and errors == []


def first_offset_read(bootstrap: str, topic: str, partition: int) -> int:
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "reader",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.assign([ck.TopicPartition(topic, partition, ck.OFFSET_BEGINNING)])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                return m.offset()
        raise AssertionError(f"no record from {topic}-{partition}")
    finally:
        consumer.close()


def test_delete_records_moves_the_low_watermark_for_both_clients_and_survives_a_crash(
        tmp_path, serve_processes):
    sp = serve_processes(tmp_path / "logs", *OVERRIDES)
    admin = AdminClient({"bootstrap.servers": sp.bootstrap})
    assert outcomes(admin.create_topics([NewTopic("events", 2, 1), NewTopic(
        "table", 1, 1, config={"cleanup.policy": "compact"})])) == {"events": None, "table": None}
    produce(sp.bootstrap, "events", 2, 40)
    produce(sp.bootstrap, "table", 1, 3)

    TP = ck.TopicPartition
    got = outcomes(admin.delete_records([TP("events", 0, 25), TP("events", 1, -1)]))
    assert [got[k] for k in sorted(got, key=lambda tp: tp.partition)] == [25, 40]   # -1: the HW
    refused = outcomes(admin.delete_records([TP("events", 0, 41), TP("table", 0, 1), TP("missing", 0, 1)]))
    assert {tp.topic: error for tp, error in refused.items()} == {
        "events": "OFFSET_OUT_OF_RANGE",            # above the high watermark
        "table": "POLICY_VIOLATION",                # a compacted topic
        "missing": "UNKNOWN_TOPIC_OR_PART"}
    assert list(outcomes(admin.delete_records([TP("events", 0, 10)])).values()) == [25]   # lower: kept

    consumer = ck.Consumer({"bootstrap.servers": sp.bootstrap, "group.id": "w"})
    assert consumer.get_watermark_offsets(TP("events", 0), 10) == (25, 40)
    assert consumer.get_watermark_offsets(TP("events", 1), 10) == (40, 40)
    consumer.close()
    earliest = admin.list_offsets({TP("events", 0): OffsetSpec.earliest()})
    assert [f.result(10).offset for f in earliest.values()] == [25]
    assert first_offset_read(sp.bootstrap, "events", 0) == 25

    kp_admin = KafkaAdminClient(bootstrap_servers=sp.bootstrap, request_timeout_ms=10000)
    try:
        answer = kp_admin.delete_records({KPTopicPartition("events", 0): 30})
        assert answer[KPTopicPartition("events", 0)]["low_watermark"] == 30
        with pytest.raises(kafka.errors.PolicyViolationError):
            kp_admin.delete_records({KPTopicPartition("table", 0): 1})
    finally:
        kp_admin.close()

    # Retention removes the segments wholly below the low watermark (Kafka's
    # deleteLogStartOffsetBreachedSegments); the segment holding offset 30 stays.
    partition_dir = sp.log_dir / "events-0"
    deadline = time.monotonic() + 10
    while min(int(f.stem) for f in partition_dir.glob("*.log")) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    bases = sorted(int(f.stem) for f in partition_dir.glob("*.log"))
    assert 0 < bases[0] <= 30, bases

    sp.kill()                                    # no clean shutdown: the checkpoint must be there
    sp.start(sp.port)
    assert first_offset_read(sp.bootstrap, "events", 0) == 30


def describe(admin: AdminClient, topic: str) -> dict:
    [future] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return {name: (entry.value, entry.source) for name, entry in future.result(10).items()}


DYNAMIC = ck.admin.ConfigSource.DYNAMIC_TOPIC_CONFIG.value
DEFAULT = ck.admin.ConfigSource.DEFAULT_CONFIG.value


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_incremental_and_legacy_alter_configs_with_both_clients(tmp_path, serve_processes):
    sp = serve_processes(tmp_path / "logs")
    admin = AdminClient({"bootstrap.servers": sp.bootstrap})
    assert outcomes(admin.create_topics([NewTopic("orders", 1, 1, config={"segment.ms": "3600000"})])) \
        == {"orders": None}

    def incremental(*entries, topic="orders", kind="topic", validate_only=False):
        changes = [ConfigEntry(name, value, incremental_operation=op) for name, value, op in entries]
        return list(outcomes(admin.incremental_alter_configs(
            [ConfigResource(kind, topic, incremental_configs=changes)],
            validate_only=validate_only)).values())[0]

    SET, DELETE, APPEND, SUBTRACT = (AlterConfigOpType.SET, AlterConfigOpType.DELETE,
                                     AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT)
    assert incremental(("retention.ms", "7200000", SET), ("cleanup.policy", "compact", APPEND)) is None
    configs = describe(admin, "orders")
    assert configs["retention.ms"] == ("7200000", DYNAMIC)
    assert configs["cleanup.policy"] == ("delete,compact", DYNAMIC)     # appended to the default
    assert configs["segment.ms"] == ("3600000", DYNAMIC)                # untouched
    assert incremental(("cleanup.policy", "delete", SUBTRACT), ("retention.ms", None, DELETE)) is None
    configs = describe(admin, "orders")
    assert configs["cleanup.policy"] == ("compact", DYNAMIC)
    assert configs["retention.ms"] == ("604800000", DEFAULT)

    # Refusals change nothing: a bad value, APPEND to a non-list config, an unknown config, an
    # unknown topic, a broker config (static in kstore), validate_only.
    before = describe(admin, "orders")
    assert incremental(("retention.ms", "soon", SET)) == "INVALID_CONFIG"
    assert incremental(("retention.ms", "1", APPEND)) == "INVALID_CONFIG"
    assert incremental(("no.such.config", "1", SET)) == "INVALID_CONFIG"
    assert incremental(("retention.ms", "1", SET), topic="missing") == "UNKNOWN_TOPIC_OR_PART"
    assert incremental(("log.retention.ms", "1", SET), topic="0", kind="broker") == "INVALID_REQUEST"
    assert incremental(("retention.ms", "1000", SET), validate_only=True) is None
    assert describe(admin, "orders") == before

    # AlterConfigs (the legacy request) replaces the whole set: what is not named goes back to
    # its default.
    [legacy] = admin.alter_configs([ConfigResource("topic", "orders",
                                                   set_config={"retention.bytes": "1048576"})]).values()
    assert legacy.result(10) is None
    configs = describe(admin, "orders")
    assert configs["retention.bytes"] == ("1048576", DYNAMIC)
    assert configs["cleanup.policy"] == ("delete", DEFAULT) and configs["segment.ms"][1] == DEFAULT

    # kafka-python's alter_configs sends IncrementalAlterConfigs to a broker that has it.
    kp_admin = KafkaAdminClient(bootstrap_servers=sp.bootstrap, request_timeout_ms=10000)
    try:
        assert kp_admin.alter_configs([KPConfigResource(ConfigResourceType.TOPIC, "orders",
                                                        configs={"retention.ms": "5000"})]) \
            == {"topic": {"orders": "OK"}}
        refused = kp_admin.alter_configs([KPConfigResource(ConfigResourceType.TOPIC, "orders",
                                                           configs={"retention.ms": "x"})])
        assert refused["topic"]["orders"].startswith("[Error 40] InvalidConfigurationError")
    finally:
        kp_admin.close()
    configs = describe(admin, "orders")
    assert configs["retention.ms"] == ("5000", DYNAMIC)
    assert configs["retention.bytes"] == ("1048576", DYNAMIC)     # incremental: the rest kept

    # Kept across a restart.
    sp.stop()
    sp.start(sp.port)
    assert describe(AdminClient({"bootstrap.servers": sp.bootstrap}), "orders")["retention.ms"] == (
        "5000", DYNAMIC)


def test_delete_topics_with_both_clients_removes_files_offsets_and_metadata(tmp_path, serve_processes):
    sp = serve_processes(tmp_path / "logs", "log.segment.delete.delay.ms=300")   # file.delete.delay.ms
    admin = AdminClient({"bootstrap.servers": sp.bootstrap})
    assert outcomes(admin.create_topics([NewTopic("old", 2, 1), NewTopic("other", 1, 1)])) == {
        "old": None, "other": None}
    produce(sp.bootstrap, "old", 2, 5)
    consumer = ck.Consumer({"bootstrap.servers": sp.bootstrap, "group.id": "readers",
                            "enable.auto.commit": False})
    consumer.commit(offsets=[ck.TopicPartition("old", 0, 5), ck.TopicPartition("old", 1, 3),
                             ck.TopicPartition("other", 0, 0)], asynchronous=False)
    consumer.close()
    assert list(outcomes(admin.delete_records([ck.TopicPartition("old", 0, 3)])).values()) == [3]

    got = outcomes(admin.delete_topics(["old", "missing", "__consumer_offsets"], operation_timeout=10))
    assert got == {"old": None, "missing": "UNKNOWN_TOPIC_OR_PART", "__consumer_offsets": "INVALID_REQUEST"}
    # Renamed at once (never loaded again), removed file.delete.delay.ms later.
    renamed = sorted(d.name.split(".")[0] for d in sp.log_dir.iterdir() if d.name.startswith("old-"))
    assert renamed == ["old-0", "old-1"] and not (sp.log_dir / "old-0").exists()
    wait_for(lambda: not [d for d in sp.log_dir.iterdir() if d.name.startswith("old-")], 10,
             "the renamed directories to be removed")
    assert "old" not in admin.list_topics(timeout=10).topics
    [offsets] = admin.list_consumer_group_offsets([ck.ConsumerGroupTopicPartitions("readers")]).values()
    assert [(tp.topic, tp.offset) for tp in offsets.result(10).topic_partitions] == [("other", 0)]

    # The name can be used again, and holds only what is written after the deletion.
    assert outcomes(admin.create_topics([NewTopic("old", 1, 1)])) == {"old": None}
    produce(sp.bootstrap, "old", 1, 1)
    assert first_offset_read(sp.bootstrap, "old", 0) == 0
    consumer = ck.Consumer({"bootstrap.servers": sp.bootstrap, "group.id": "w"})
    assert consumer.get_watermark_offsets(ck.TopicPartition("old", 0), 10) == (0, 1)
    consumer.close()

    kp_admin = KafkaAdminClient(bootstrap_servers=sp.bootstrap, request_timeout_ms=10000)
    try:
        kp_admin.delete_topics(["other"])
        with pytest.raises(kafka.errors.UnknownTopicOrPartitionError):
            kp_admin.delete_topics(["other"])
    finally:
        kp_admin.close()

    # A crash: the new "old" must not come back with the deleted one's log start offset (3); a
    # deleted partition's directory that was still waiting for removal is removed at the start.
    sp.kill()
    leftover = sp.log_dir / "gone-0.6f1d2c3b4a5e6f708192a3b4c5d6e7f8-delete"
    leftover.mkdir()
    (leftover / "00000000000000000000.log").write_bytes(b"")
    sp.start(sp.port)
    assert not leftover.exists()
    topics = AdminClient({"bootstrap.servers": sp.bootstrap}).list_topics(timeout=10).topics
    assert "other" not in topics and len(topics["old"].partitions) == 1
    assert first_offset_read(sp.bootstrap, "old", 0) == 0


def test_in_a_cluster_configs_reach_every_broker_and_followers_copy_what_leaders_took(cluster):
    """Three `kstore serve --cluster-dir` brokers. A config altered through one of them reaches the
    open logs of the others (they lead the other partitions). Lowering max.message.bytes below the
    size of stored batches must not stop replication: a replica that lost its files copies them
    back from its leader (Kafka's followers ignore max.message.bytes; kstore's refused, and
    acks=all produces timed out). DeleteRecords goes to each leader; DeleteTopics is refused
    (kstore deletes topics on a single broker only)."""
    cluster_dir, nodes = cluster
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{nodes[0].port}"})
    assert outcomes(admin.create_topics([NewTopic("limits", 3, 3)])) == {"limits": None}
    bootstrap = ",".join(f"127.0.0.1:{n.port}" for n in nodes)
    produce(bootstrap, "limits", 3, 4)                       # batches of ~600 bytes
    partitions = admin.list_topics("limits", timeout=10).topics["limits"].partitions.values()
    leaders = {p.id: p.leader for p in partitions}
    assert len(set(leaders.values())) > 1, leaders          # spread: the alter cannot be local only

    [altered] = admin.incremental_alter_configs([ConfigResource("topic", "limits", incremental_configs=[
        ConfigEntry("max.message.bytes", "300", incremental_operation=AlterConfigOpType.SET)])]).values()
    assert altered.result(10) is None

    def refused_everywhere() -> bool:
        producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "message.timeout.ms": 5000})
        errors = []
        for p in range(3):
            producer.produce("limits", value=b"x" * 1000, partition=p,
                             on_delivery=lambda err, msg: errors.append(err and err.name()))
        producer.flush(10)
        return errors == ["MSG_SIZE_TOO_LARGE"] * 3
    wait_for(refused_everywhere, 20, "every leader to apply max.message.bytes=300")

    TP = ck.TopicPartition      # (before a broker is killed below: the leaders stay where they are)
    assert sorted(outcomes(admin.delete_records([TP("limits", p, 2) for p in (1, 2)])).values()) == [2, 2]
    assert outcomes(admin.delete_topics(["limits"], operation_timeout=10)) == {"limits": "INVALID_REQUEST"}

    # A follower of partition 0 loses its replica and restarts: it copies the big batches back.
    follower = next(n for n in nodes if n.broker_id != leaders[0])
    follower.stop(signal.SIGKILL)
    shutil.rmtree(cluster_dir / f"broker-{follower.broker_id}" / "limits-0")
    follower.start()
    leader_files = values_in_files(cluster_dir, leaders[0], "limits")
    wait_for(lambda: values_in_files(cluster_dir, follower.broker_id, "limits") == leader_files, 20,
             "the follower to copy its leader's batches")


def test_a_transaction_whose_topic_was_deleted_still_completes(tmp_path, serve_processes):
    """A topic deleted while an open transaction holds one of its partitions: the coordinator
    skips that partition's marker, as Kafka does. kstore tried to write it forever, so the
    transaction stayed PrepareCommit and every later transaction of the producer timed out."""
    sp = serve_processes(tmp_path / "logs")
    admin = AdminClient({"bootstrap.servers": sp.bootstrap})
    assert outcomes(admin.create_topics([NewTopic("doomed", 1, 1), NewTopic("kept", 1, 1)])) == {
        "doomed": None, "kept": None}
    producer = ck.Producer({"bootstrap.servers": sp.bootstrap, "transactional.id": "mover",
                            "message.timeout.ms": 8000})
    producer.init_transactions(15)
    reports = []

    def transaction(*sends, before_commit=lambda: None):
        producer.begin_transaction()
        for topic, value in sends:
            producer.produce(topic, value=value, on_delivery=lambda err, msg: reports.append(err))
        assert producer.flush(15) == 0
        before_commit()
        producer.commit_transaction(15)

    def delete_doomed():
        assert outcomes(admin.delete_topics(["doomed"], operation_timeout=10)) == {"doomed": None}

    transaction(("doomed", b"1"), ("kept", b"2"), before_commit=delete_doomed)
    transaction(("kept", b"3"))
    assert reports == [None, None, None]
    consumer = ck.Consumer({"bootstrap.servers": sp.bootstrap, "group.id": "reader",
                            "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    try:
        consumer.assign([ck.TopicPartition("kept", 0, 0)])
        values, deadline = [], time.monotonic() + 15
        while len(values) < 2 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                values.append(m.value())
        assert values == [b"2", b"3"]
    finally:
        consumer.close()


def test_deleting_a_compacted_topic_drops_its_cleaner_checkpoint_entry(tmp_path):
    """The cleaner's checkpoint forgets a deleted partition (through the cleaner, under its lock),
    so a topic created again under the name is cleaned from its start, not from the old offset."""
    from kstore.broker import Broker
    from kstore.records import Record, build_batch
    with Broker(str(tmp_path / "logs")) as b:
        b.create_topic("c", 1, configs={"cleanup.policy": "compact", "segment.bytes": 1024})
        for i in range(60):
            b.produce("c", 0, build_batch([Record(b"k%d" % (i % 3), b"v%d" % i, 1700000000000)]))
        b.get_log("c", 0).roll()
        b.logs.cleaner.clean_log(b.get_log("c", 0))
        assert ("c", 0) in b.logs.cleaner.checkpointed_offsets()
        b.delete_topic("c")
        assert ("c", 0) not in b.logs.cleaner.checkpointed_offsets()
        b.create_topic("c", 1, configs={"cleanup.policy": "compact"})
        assert ("c", 0) not in b.logs.cleaner.checkpointed_offsets()

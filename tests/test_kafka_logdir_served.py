"""A log directory written by a real KRaft Kafka broker, served and read by kstore as it is.

kstore learns the topics, topic ids, replicas and configs from the directory's own metadata
(`meta.properties`, `partition.metadata`, the `__cluster_metadata-0` log); the offline read-only
tools change no byte of the directory; `kstore serve` hands the records to kafka-python and
confluent-kafka with Kafka's ids. Expected records are those the fixtures' README lists.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kstore.broker import Broker
from kstore.checkpoint import OffsetCheckpointFile
from kstore.errors import LogError
from kstore.metadata_image import (MetadataRecordError, decode_metadata_record,
                                   load_metadata_image)
from test_broker_clients import snapshot as tree_contents
from test_clients import ck_consume, kp_consume, serve_processes  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_ID = "rwd2jqiwRaCycLq7mKVHXA"
# snapshot -> (topic id of foo in partition.metadata, records of foo-0 per the README)
FIXTURES = {
    "e856b9a": ("fZi4qEpCTsik-rzkyV0Ypg", [b"m1", b"m2", b"m3"]),
    "510714e": ("v9meXjI1RVKB-NSvF0GXDA", [b"Hello World!"]),
}


def kstore(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kstore", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


@pytest.mark.parametrize("snapshot", sorted(FIXTURES))
def test_metadata_log_gives_topics_with_their_ids(kafka_logs, snapshot):
    image = load_metadata_image(str(kafka_logs / snapshot))
    topic_id, _ = FIXTURES[snapshot]
    assert image.cluster_id == CLUSTER_ID and image.node_id == 1
    assert sorted(image.topics) == ["foo"]
    foo = image.topics["foo"]
    assert foo.topic_id == topic_id
    assert sorted(foo.partitions) == [0]
    assert foo.partitions[0].replicas == [1] and foo.partitions[0].isr == [1]
    assert image.records_read > 100


def test_metadata_record_decoding_rejects_leftover_bytes():
    # A TopicRecord (type 2, v0): name "t", a 16-byte id, no tagged fields.
    good = bytes([1, 2, 0, 2]) + b"t" + bytes(range(16)) + b"\x00"
    record_type, version, fields = decode_metadata_record(good)
    assert (record_type, version, fields["name"]) == (2, 0, "t")
    with pytest.raises(MetadataRecordError, match="left over"):
        decode_metadata_record(good + b"\x00")
    with pytest.raises(MetadataRecordError, match="ends early"):
        decode_metadata_record(good[:10])


def kstore_in_process(capsys, *args: str) -> subprocess.CompletedProcess:
    """The `kstore` command's main() in this process (the same code as the console script)."""
    from kstore.cli import main
    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


@pytest.mark.parametrize("snapshot", sorted(FIXTURES))
def test_offline_read_only_tools_change_nothing(kafka_logs, snapshot, capsys):
    log_dir = kafka_logs / snapshot
    topic_id, values = FIXTURES[snapshot]
    before = tree_contents(log_dir)
    kstore = functools.partial(kstore_in_process, capsys)
    runs = {
        "latest": kstore("get-offsets", "--log-dir", str(log_dir)),
        "earliest": kstore("get-offsets", "--log-dir", str(log_dir), "--time", "earliest"),
        "list": kstore("topics", "--log-dir", str(log_dir), "--list"),
        "describe": kstore("topics", "--log-dir", str(log_dir), "--describe"),
        "groups": kstore("consumer-groups", "--log-dir", str(log_dir), "--list"),
        "group": kstore("consumer-groups", "--log-dir", str(log_dir), "--describe", "--group", "g"),
        "consume": kstore("consume", "--log-dir", str(log_dir), "--topic", "foo",
                          "--from-beginning"),
    }
    for name, run in runs.items():
        if name == "group":   # a group that was never stored: Kafka's message, and exit 1
            assert run.returncode == 1 and "Consumer group 'g' does not exist." in run.stderr
        else:
            assert run.returncode == 0, (name, run.stderr)
    assert tree_contents(log_dir) == before            # not one byte, not one new file or dir
    assert runs["latest"].stdout == f"foo:0:{len(values)}\n"
    assert runs["earliest"].stdout == "foo:0:0\n"
    assert runs["list"].stdout == "foo\n"
    assert f"TopicId: {topic_id}" in runs["describe"].stdout
    assert "Leader: 1\tReplicas: 1\tIsr: 1" in runs["describe"].stdout
    assert runs["groups"].stdout == ""
    assert runs["consume"].stdout.splitlines() == [v.decode() for v in values]


def test_read_only_broker_refuses_a_missing_dir_and_creates_nothing(tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(LogError, match="does not exist"):
        Broker(str(missing), read_only=True)
    assert not (tmp_path / "no").exists()


def test_read_only_broker_shares_the_lock_with_readers_not_with_a_broker(kafka_logs):
    log_dir = str(kafka_logs / "e856b9a")
    with Broker(log_dir) as writer:      # a broker holds the directory: readers are refused
        with pytest.raises(LogError, match="in use"):
            Broker(log_dir, read_only=True)
        assert writer.describe_topic("foo").topic_id == FIXTURES["e856b9a"][0]
    readers = [Broker(log_dir, read_only=True) for _ in range(2)]   # readers share it
    for r in readers:
        r.shutdown()


@pytest.mark.parametrize("snapshot", sorted(FIXTURES))
def test_served_with_kafka_ids_and_read_by_both_clients(kafka_logs, snapshot, serve_processes):  # noqa: F811
    log_dir = kafka_logs / snapshot
    topic_id, values = FIXTURES[snapshot]
    hw_before = OffsetCheckpointFile(str(log_dir / "replication-offset-checkpoint")).read()
    segment = log_dir / "foo-0" / "00000000000000000000.log"
    data_before = segment.read_bytes()
    server = serve_processes(log_dir, "auto.create.topics.enable=false")
    from kafka.admin import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=10000)
    try:
        assert admin.list_topics() == ["foo"]
        assert admin._client.cluster.cluster_id == CLUSTER_ID  # noqa: SLF001 (kafka-python has no public getter)
        described = admin.describe_topics(["foo"])[0]
        assert described["error_code"] == 0 and len(described["partitions"]) == 1
    finally:
        admin.close()
    assert [r["value"] for r in kp_consume(server.bootstrap, "foo", 0, len(values))] == values
    assert [r["value"] for r in ck_consume(server.bootstrap, "foo", 0)] == values
    server.stop()
    assert segment.read_bytes() == data_before
    assert (log_dir / "foo-0" / "partition.metadata").read_text().endswith(topic_id)
    props = dict(line.split("=", 1) for line in (log_dir / "meta.properties").read_text().splitlines()
                 if "=" in line)
    assert props["cluster.id"] == CLUSTER_ID and props["node.id"] == "1"   # left as Kafka wrote it
    hw_after = OffsetCheckpointFile(str(log_dir / "replication-offset-checkpoint")).read()
    assert hw_after[("foo", 0)] == hw_before[("foo", 0)] == len(values)
    metadata = json.loads((log_dir / "kstore-cluster-metadata.json").read_text())
    assert metadata["/cluster/id"]["id"] == CLUSTER_ID
    assert metadata["/brokers/topics/foo"]["topic_id"] == topic_id


def test_a_checkpoint_keeps_entries_of_partitions_still_on_disk(kafka_logs):
    """A broker that does not (yet) host a partition whose directory is on disk keeps its HW."""
    log_dir = kafka_logs / "e856b9a"
    (log_dir / "kstore-cluster-metadata.json").write_text(   # a kstore dir that forgot foo
        json.dumps({"/cluster/id": {"version": "1", "id": CLUSTER_ID}}))
    with Broker(str(log_dir)) as broker:
        assert broker.topics() == []
    hws = OffsetCheckpointFile(str(log_dir / "replication-offset-checkpoint")).read()
    assert hws == {("foo", 0): 3}


def test_read_only_tools_on_a_dir_with_committed_offsets_change_nothing(tmp_path, capsys):
    from kstore.consumer import Consumer
    from kstore.producer import Producer
    log_dir = tmp_path / "logs"
    with Broker(str(log_dir)) as broker:
        broker.create_topic("t", 2)
        producer = Producer(broker)
        for i in range(10):
            producer.send("t", f"v{i}", partition=i % 2)
        producer.close()
        consumer = Consumer(broker, group_id="g", auto_offset_reset="earliest")
        consumer.assign([("t", 0), ("t", 1)])
        consumer.poll()
        consumer.commit()
        consumer.close()
    before = tree_contents(log_dir)
    groups = kstore_in_process(capsys, "consumer-groups", "--log-dir", str(log_dir), "--list")
    described = kstore_in_process(capsys, "consumer-groups", "--log-dir", str(log_dir),
                                  "--describe", "--group", "g")
    consumed = kstore_in_process(capsys, "consume", "--log-dir", str(log_dir), "--topic", "t",
                                 "--from-beginning")
    assert tree_contents(log_dir) == before
    assert groups.stdout == "g\n" and " 5 " in described.stdout
    assert sorted(consumed.stdout.split()) == sorted(f"v{i}" for i in range(10))

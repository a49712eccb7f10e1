"""The Kafka-style tools, run as real processes on a log directory: kstore topics, produce,
consume, get-offsets and consumer-groups."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kstore.broker import Broker


def kstore(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kstore", *args], input=stdin, capture_output=True,
                          text=True, check=check, timeout=120)


@pytest.fixture
def log_dir(tmp_path):
    d = str(tmp_path / "logs")
    kstore("topics", "--log-dir", d, "--create", "--topic", "orders", "--partitions", "3",
           "--config", "segment.bytes=100000", "--config", "retention.ms=3600000")
    return d


def test_topics_create_list_describe_alter(log_dir):
    assert kstore("topics", "--log-dir", log_dir, "--list").stdout.split() == ["orders"]
    out = kstore("topics", "--log-dir", log_dir, "--describe", "--topic", "orders").stdout.splitlines()
    head = out[0].split("\t")
    assert head[0] == "Topic: orders" and head[2:4] == ["PartitionCount: 3", "ReplicationFactor: 1"]
    assert head[1].startswith("TopicId: ") and len(head[1]) == len("TopicId: ") + 22
    assert head[4] == "Configs: retention.ms=3600000,segment.bytes=100000"
    assert out[1:] == [f"\tTopic: orders\tPartition: {p}\tLeader: 0\tReplicas: 0\tIsr: 0" for p in range(3)]
    kstore("topics", "--log-dir", log_dir, "--alter", "--topic", "orders", "--partitions", "5")
    with Broker(log_dir) as broker:
        assert broker.partition_count("orders") == 5
        assert broker.get_log("orders", 4).config.segment_bytes == 100000


@pytest.mark.parametrize("args,message", [
    (["--create", "--topic", "../x"], "InvalidTopicError"),
    (["--create", "--topic", "orders"], "TopicExistsError: topic 'orders' already exists"),
    (["--create", "--topic", "t", "--replication-factor", "3"], "larger than available brokers: 1"),
    (["--create", "--topic", "t", "--config", "segment.bytes=1"], "segment.bytes: Value must be at least 14"),
    (["--alter", "--topic", "orders", "--partitions", "2"], "can grow but never shrink"),
    (["--describe", "--topic", "nope"], "topic 'nope' does not exist"),
    (["--create", "--list"], "exactly one of"),
])
def test_topic_errors_are_one_clear_line(log_dir, args, message):
    result = kstore("topics", "--log-dir", log_dir, *args, check=False)
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr


def test_produce_and_consume_like_the_console_tools(log_dir):
    lines = "".join(f"user-{i % 4}:order {i}\n" for i in range(20))
    kstore("produce", "--log-dir", log_dir, "--topic", "orders", "--property", "parse.key=true",
           "--property", "key.separator=:", stdin=lines)
    out = kstore("consume", "--log-dir", log_dir, "--topic", "orders", "--from-beginning",
                 "--property", "print.key=true", "--property", "key.separator=:")
    got = out.stdout.splitlines()
    assert sorted(got) == sorted(f"user-{i % 4}:order {i}" for i in range(20))
    assert "Processed a total of 20 messages" in out.stderr
    # every key went to one partition, in order
    for key in range(4):
        part = kstore("consume", "--log-dir", log_dir, "--topic", "orders", "--from-beginning",
                      "--property", "print.key=true", "--property", "print.partition=true").stdout
        partitions = {line.split("\t")[0] for line in part.splitlines() if f"\tuser-{key}\t" in line}
        assert len(partitions) == 1
    from kstore.partitioner import partition_for_key
    p0 = partition_for_key(b"user-0", 3)          # user-0's five records, in order, on one partition
    plain = kstore("consume", "--log-dir", log_dir, "--topic", "orders", "--partition", str(p0),
                   "--offset", "1", "--max-messages", "2", "--property", "print.offset=true").stdout
    assert [line.split("\t")[0] for line in plain.splitlines()] == ["Offset:1", "Offset:2"]


def test_produce_refuses_a_line_without_the_separator(log_dir):
    result = kstore("produce", "--log-dir", log_dir, "--topic", "orders", "--property",
                    "parse.key=true", stdin="no separator here\n", check=False)
    assert result.returncode == 1
    assert "no key separator '\\t' found on line 1" in result.stderr


def test_consume_from_a_timestamp_and_get_offsets(log_dir):
    with Broker(log_dir) as broker:
        from kstore.records import Record, build_batch
        for i in range(10):
            broker.produce("orders", 0, build_batch([Record(b"k", f"v{i}".encode(), 1_000 + 10 * i)]))
    out = kstore("consume", "--log-dir", log_dir, "--topic", "orders", "--partition", "0",
                 "--timestamp", "1045").stdout.split()
    assert out == ["v5", "v6", "v7", "v8", "v9"]
    assert kstore("get-offsets", "--log-dir", log_dir, "--topic", "orders").stdout.split() == \
        ["orders:0:10", "orders:1:0", "orders:2:0"]
    assert kstore("get-offsets", "--log-dir", log_dir, "--topic", "orders", "--partitions", "0",
                  "--time", "1031").stdout.split() == ["orders:0:4"]
    assert kstore("get-offsets", "--log-dir", log_dir, "--topic", "orders", "--partitions", "0",
                  "--time", "earliest").stdout.split() == ["orders:0:0"]
    assert kstore("get-offsets", "--log-dir", log_dir, "--topic", "orders", "--partitions", "0",
                  "--time", "99999").stdout.split() == ["orders:0:"]


def test_consumer_groups_show_committed_offsets_and_lag(log_dir):
    kstore("produce", "--log-dir", log_dir, "--topic", "orders", "--partition", "1",
           stdin="".join(f"m{i}\n" for i in range(6)))
    kstore("consume", "--log-dir", log_dir, "--topic", "orders", "--group", "billing",
           "--from-beginning", "--max-messages", "4")
    kstore("produce", "--log-dir", log_dir, "--topic", "orders", "--partition", "1",
           stdin="m6\nm7\n")
    out = kstore("consumer-groups", "--log-dir", log_dir, "--describe", "--group", "billing").stdout
    rows = [line.split() for line in out.strip().splitlines()]
    assert rows[0] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                       "CONSUMER-ID", "HOST", "CLIENT-ID"]
    assert ["billing", "orders", "1", "4", "8", "4", "-", "-", "-"] in rows
    assert kstore("consumer-groups", "--log-dir", log_dir, "--list").stdout.split() == ["billing"]
    # the group resumes where it committed
    rest = kstore("consume", "--log-dir", log_dir, "--topic", "orders", "--group", "billing").stdout
    assert rest.split() == ["m4", "m5", "m6", "m7"]


def test_a_tool_refuses_a_log_dir_a_broker_holds(log_dir):
    with Broker(log_dir):
        result = kstore("topics", "--log-dir", log_dir, "--list", check=False)
    assert result.returncode == 1 and "is in use by another broker or tool" in result.stderr
    assert kstore("topics", "--log-dir", log_dir, "--list").stdout.split() == ["orders"]

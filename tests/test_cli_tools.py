"""The Kafka-style tools, run as real processes: kstore topics, produce, consume, get-offsets and
consumer-groups — each test twice, offline on a log directory (`--log-dir`) and against a running
`kstore serve` on that directory (`--bootstrap-server`), with the same expected output."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time

import pytest

from kstore.broker import Broker
from test_clients import ServeProcess

pytestmark = pytest.mark.timeout(300)


def kstore(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "kstore", *args], input=stdin,
                            capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"kstore {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


class Target:
    """Where the tools run: offline on the log dir, or through a `kstore serve` process on it."""

    def __init__(self, mode: str, log_dir: str):
        self.mode, self.log_dir = mode, log_dir
        self.server = ServeProcess(log_dir) if mode == "bootstrap-server" else None

    @property
    def args(self) -> list[str]:
        if self.server is None:
            return ["--log-dir", self.log_dir]
        return ["--bootstrap-server", self.server.bootstrap]

    def start(self) -> "Target":
        if self.server is not None:
            self.server.start()
        return self

    @contextlib.contextmanager
    def broker(self):
        """The log dir opened in-process (a running server is stopped for it, then restarted)."""
        if self.server is not None:
            self.server.stop()
        try:
            with Broker(self.log_dir) as broker:
                yield broker
        finally:
            if self.server is not None:
                self.server.start(port=self.server.port)


# Offline, consume ends at the end of the log; a live one waits for more unless told to stop.
UNTIL_IDLE = ["--timeout-ms", "1500"]


@pytest.fixture(params=["log-dir", "bootstrap-server"])
def target(request, tmp_path):
    d = str(tmp_path / "logs")
    kstore("topics", "--log-dir", d, "--create", "--topic", "orders", "--partitions", "3",
           "--config", "segment.bytes=100000", "--config", "retention.ms=3600000")
    t = Target(request.param, d).start()
    yield t
    if t.server is not None:
        t.server.kill()


def test_topics_create_list_describe_alter(target):
    assert kstore("topics", *target.args, "--list").stdout.split() == ["orders"]
    out = kstore("topics", *target.args, "--describe", "--topic", "orders").stdout.splitlines()
    head = out[0].split("\t")
    if target.server is None:   # the offline tool reads the id from the metadata
        topic_id = head.pop(1)
        assert topic_id.startswith("TopicId: ") and len(topic_id) == len("TopicId: ") + 22
    # (classic Metadata has no topic id: kafka-topics leaves the field out then)
    assert head == ["Topic: orders", "PartitionCount: 3", "ReplicationFactor: 1",
                    "Configs: retention.ms=3600000,segment.bytes=100000"]
    assert out[1:] == [f"\tTopic: orders\tPartition: {p}\tLeader: 0\tReplicas: 0\tIsr: 0" for p in range(3)]
    kstore("topics", *target.args, "--alter", "--topic", "orders", "--partitions", "5")
    kstore("topics", *target.args, "--create", "--topic", "audit", "--config", "cleanup.policy=compact")
    assert kstore("topics", *target.args, "--list").stdout.split() == ["audit", "orders"]
    described = kstore("topics", *target.args, "--describe").stdout
    assert "Topic: audit\t" in described and "Configs: cleanup.policy=compact\n" in described
    assert "\tTopic: orders\tPartition: 4\tLeader: 0" in described
    with target.broker() as broker:
        assert broker.partition_count("orders") == 5
        assert broker.get_log("orders", 4).config.segment_bytes == 100000
        assert broker.partition_count("audit") == 1   # num.partitions, the broker's default
        assert broker.get_log("audit", 0).config.compact


@pytest.mark.parametrize("args,message", [
    (["--create", "--topic", "../x"], "InvalidTopicError"),
    (["--create", "--topic", "orders"], "TopicExistsError: topic 'orders' already exists"),
    (["--create", "--topic", "t", "--replication-factor", "3"], "larger than available brokers: 1"),
    (["--create", "--topic", "t", "--config", "segment.bytes=1"], "segment.bytes: Value must be at least 14"),
    (["--alter", "--topic", "orders", "--partitions", "2"], "can grow but never shrink"),
    (["--describe", "--topic", "nope"], "topic 'nope' does not exist"),
    (["--create", "--list"], "exactly one of"),
])
def test_topic_errors_are_one_clear_line(target, args, message):
    result = kstore("topics", *target.args, *args, check=False)
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert kstore("topics", *target.args, "--list").stdout.split() == ["orders"]   # nothing made


def test_produce_and_consume_like_the_console_tools(target):
    lines = "".join(f"user-{i % 4}:order {i}\n" for i in range(20))
    kstore("produce", *target.args, "--topic", "orders", "--property", "parse.key=true",
           "--property", "key.separator=:", stdin=lines)
    out = kstore("consume", *target.args, *UNTIL_IDLE, "--topic", "orders", "--from-beginning",
                 "--property", "print.key=true", "--property", "key.separator=:")
    got = out.stdout.splitlines()
    assert sorted(got) == sorted(f"user-{i % 4}:order {i}" for i in range(20))
    assert "Processed a total of 20 messages" in out.stderr
    # every key went to one partition, in order
    for key in range(4):
        part = kstore("consume", *target.args, *UNTIL_IDLE, "--topic", "orders", "--from-beginning",
                      "--property", "print.key=true", "--property", "print.partition=true").stdout
        partitions = {line.split("\t")[0] for line in part.splitlines() if f"\tuser-{key}\t" in line}
        assert len(partitions) == 1
    from kstore.partitioner import partition_for_key
    p0 = partition_for_key(b"user-0", 3)          # user-0's five records, in order, on one partition
    plain = kstore("consume", *target.args, *UNTIL_IDLE, "--topic", "orders", "--partition", str(p0),
                   "--offset", "1", "--max-messages", "2", "--property", "print.offset=true").stdout
    assert [line.split("\t")[0] for line in plain.splitlines()] == ["Offset:1", "Offset:2"]


def test_produce_refuses_a_line_without_the_separator(target):
    result = kstore("produce", *target.args, "--topic", "orders", "--property",
                    "parse.key=true", stdin="no separator here\n", check=False)
    assert result.returncode == 1
    assert "no key separator '\\t' found on line 1" in result.stderr


def test_consume_from_a_timestamp_and_get_offsets(target):
    with target.broker() as broker:
        from kstore.records import Record, build_batch
        for i in range(10):
            broker.produce("orders", 0, build_batch([Record(b"k", f"v{i}".encode(), 1_000 + 10 * i)]))
    out = kstore("consume", *target.args, *UNTIL_IDLE, "--topic", "orders", "--partition", "0",
                 "--timestamp", "1045").stdout.split()
    assert out == ["v5", "v6", "v7", "v8", "v9"]
    assert kstore("get-offsets", *target.args, "--topic", "orders").stdout.split() == \
        ["orders:0:10", "orders:1:0", "orders:2:0"]
    assert kstore("get-offsets", *target.args, "--topic", "orders", "--partitions", "0",
                  "--time", "1031").stdout.split() == ["orders:0:4"]
    assert kstore("get-offsets", *target.args, "--topic", "orders", "--partitions", "0",
                  "--time", "earliest").stdout.split() == ["orders:0:0"]
    assert kstore("get-offsets", *target.args, "--topic", "orders", "--partitions", "0",
                  "--time", "99999").stdout.split() == ["orders:0:"]


def test_consumer_groups_show_committed_offsets_and_lag(target):
    kstore("produce", *target.args, "--topic", "orders", "--partition", "1",
           stdin="".join(f"m{i}\n" for i in range(6)))
    kstore("consume", *target.args, *UNTIL_IDLE, "--topic", "orders", "--group", "billing",
           "--from-beginning", "--max-messages", "4")
    kstore("produce", *target.args, "--topic", "orders", "--partition", "1",
           stdin="m6\nm7\n")
    out = kstore("consumer-groups", *target.args, "--describe", "--group", "billing").stdout
    rows = [line.split() for line in out.strip().splitlines()]
    assert rows[0] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                       "CONSUMER-ID", "HOST", "CLIENT-ID"]
    assert ["billing", "orders", "1", "4", "8", "4", "-", "-", "-"] in rows
    assert kstore("consumer-groups", *target.args, "--list").stdout.split() == ["billing"]
    # the group resumes where it committed
    rest = kstore("consume", *target.args, *UNTIL_IDLE, "--topic", "orders", "--group", "billing").stdout
    assert rest.split() == ["m4", "m5", "m6", "m7"]


def test_a_tool_refuses_a_log_dir_a_broker_holds(tmp_path):
    d = str(tmp_path / "logs")
    kstore("topics", "--log-dir", d, "--create", "--topic", "orders")
    with Broker(d):
        result = kstore("topics", "--log-dir", d, "--list", check=False)
    assert result.returncode == 1 and "is in use by another broker or tool" in result.stderr
    assert kstore("topics", "--log-dir", d, "--list").stdout.split() == ["orders"]


# ---- only against a running broker ----

def test_the_same_records_and_offsets_whichever_way_they_are_read(tmp_path):
    """Produce over the network, read over the network, stop the broker, read offline: the same
    lines, the same offsets, and the group's committed offsets are in __consumer_offsets."""
    target = Target("bootstrap-server", str(tmp_path / "logs"))
    kstore("topics", "--log-dir", target.log_dir, "--create", "--topic", "t", "--partitions", "2")
    target.start()
    try:
        kstore("produce", *target.args, "--topic", "t", "--property", "parse.key=true",
               "--property", "key.separator=:", "--compression-codec", "gzip",
               stdin="".join(f"k{i % 5}:v{i}\n" for i in range(40)))
        shown = ["--property", "print.key=true", "--property", "print.offset=true",
                 "--property", "print.partition=true"]
        online = kstore("consume", *target.args, "--topic", "t", "--from-beginning", "--group", "g",
                        "--max-messages", "40", *shown).stdout
        online_offsets = kstore("get-offsets", *target.args, "--topic", "t").stdout
        online_groups = kstore("consumer-groups", *target.args, "--describe", "--group", "g").stdout
        assert kstore("consumer-groups", *target.args, "--list").stdout.split() == ["g"]
        topics_online = kstore("topics", *target.args, "--list").stdout.split()
        target.server.stop()
        offline = kstore("consume", "--log-dir", target.log_dir, "--topic", "t", "--from-beginning",
                         *shown).stdout
        assert sorted(online.splitlines()) == sorted(offline.splitlines())
        assert len(online.splitlines()) == 40
        assert kstore("get-offsets", "--log-dir", target.log_dir, "--topic", "t").stdout == online_offsets
        assert kstore("consumer-groups", "--log-dir", target.log_dir, "--describe",
                      "--group", "g").stdout == online_groups
        assert topics_online == kstore("topics", "--log-dir", target.log_dir, "--list").stdout.split() \
            == ["__consumer_offsets", "t"]
    finally:
        target.server.kill()


def test_a_live_consumer_waits_for_new_records(tmp_path):
    target = Target("bootstrap-server", str(tmp_path / "logs"))
    kstore("topics", "--log-dir", target.log_dir, "--create", "--topic", "live")
    target.start()
    consumer = subprocess.Popen(
        [sys.executable, "-m", "kstore", "consume", *target.args, "--topic", "live",
         "--group", "watchers", "--timeout-ms", "60000", "--max-messages", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # it subscribes: wait until it is in the group and owns the partition (then it waits at
        # the end of the empty log; with auto.offset.reset=latest, what is produced before it owns
        # the partition would not be read, as with Kafka's console consumer)
        deadline = time.monotonic() + 30
        while "Stable" not in kstore("consumer-groups", *target.args, "--describe", "--group",
                                     "watchers", "--state", check=False).stdout:
            assert time.monotonic() < deadline, "the consumer did not join its group"
            time.sleep(0.3)
        assert consumer.poll() is None
        kstore("produce", *target.args, "--topic", "live", stdin="a\nb\nc\nd\n")
        out, err = consumer.communicate(timeout=60)
        assert consumer.returncode == 0, err
        assert out.split() == ["a", "b", "c"] and "Processed a total of 3 messages" in err
        # it committed where it stopped: the next run of the group starts at d
        rest = kstore("consume", *target.args, "--topic", "live", "--group", "watchers",
                      "--timeout-ms", "1000")
        assert rest.stdout.split() == ["d"]
        # and with nothing more to read, --timeout-ms ends the run
        empty = kstore("consume", *target.args, "--topic", "live", "--group", "watchers",
                       "--timeout-ms", "500")
        assert empty.stdout == "" and "Processed a total of 0 messages" in empty.stderr
    finally:
        consumer.kill()
        target.server.kill()


@pytest.mark.parametrize("args,message", [
    (["--bootstrap-server", "127.0.0.1:1"], "no broker reachable at 127.0.0.1:1"),
    (["--bootstrap-server", "localhost"], "bootstrap servers are HOST:PORT"),
    (["--bootstrap-server", "127.0.0.1:1", "--log-dir", "x"], "not allowed with argument"),
    ([], "one of the arguments --log-dir --bootstrap-server is required"),
])
def test_where_to_connect_is_checked(args, message):
    result = kstore("topics", "--list", *args, check=False)
    assert result.returncode in (1, 2) and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_port_that_is_not_a_kafka_broker_gets_a_clear_error():
    """Something else listens (an HTTP-ish server answering garbage): one line, no traceback."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer():
        conn, _ = listener.accept()
        conn.recv(1024)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()
    threading.Thread(target=answer, daemon=True).start()
    try:
        result = kstore("topics", "--bootstrap-server", f"127.0.0.1:{listener.getsockname()[1]}",
                        "--list", check=False)
    finally:
        listener.close()
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "did not answer like a Kafka broker" in result.stderr, result.stderr


def test_produce_to_an_unknown_topic_with_auto_creation_off(tmp_path):
    server = ServeProcess(tmp_path / "logs", "auto.create.topics.enable=false").start()
    try:
        result = kstore("produce", "--bootstrap-server", server.bootstrap, "--topic", "nope",
                        stdin="x\n", check=False)
        assert result.returncode == 1
        assert "UnknownTopicOrPartitionError: topic 'nope' does not exist" in result.stderr
        assert kstore("topics", "--bootstrap-server", server.bootstrap, "--list").stdout == ""
    finally:
        server.kill()

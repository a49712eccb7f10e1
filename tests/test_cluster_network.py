"""Multi-broker mode: three `kstore serve --cluster-dir` processes on loopback ports replicate through
Fetch requests over real sockets; kill one with SIGKILL and the others carry on."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from kstore.file_records import FileRecords


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_listening(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


class Node:
    def __init__(self, cluster_dir, broker_id, port):
        self.cluster_dir, self.broker_id, self.port = cluster_dir, broker_id, port
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kstore", "serve", "--cluster-dir", str(self.cluster_dir),
             "--broker-id", str(self.broker_id), "--port", str(self.port),
             "--override", "default.replication.factor=3"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_listening(self.port)

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def state(cluster_dir, topic="orders", partition=0):
    with open(cluster_dir / "zookeeper.json") as f:
        z = json.load(f)
    return z.get(f"/brokers/topics/{topic}/partitions/{partition}/state"), z.get("/controller_epoch")


def values_in_files(cluster_dir, broker_id, topic="orders", partition=0):
    d = cluster_dir / f"broker-{broker_id}" / f"{topic}-{partition}"
    out = []
    for name in sorted(os.listdir(d)):
        if name.endswith(".log"):
            fr = FileRecords(str(d / name), file_already_exists=True)
            for b in fr.batches():
                assert b.is_valid()
                out.extend((r.offset, r.value) for r in b.records())
            fr.close_handlers()
    return out


@pytest.fixture
def cluster(tmp_path):
    ports = free_ports(3)
    nodes = [Node(tmp_path, b, ports[b]) for b in range(3)]
    for n in nodes:
        n.start()
    yield tmp_path, nodes
    for n in nodes:
        n.stop()


def test_three_processes_replicate_and_survive_a_killed_leader(cluster):
    cluster_dir, nodes = cluster
    bootstrap = [f"127.0.0.1:{n.port}" for n in nodes]
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=50,
                             request_timeout_ms=20000, reconnect_backoff_max_ms=1000)
    for i in range(30):
        producer.send("orders", value=f"v{i}".encode())
    producer.flush(60)
    s, _ = wait_for(lambda: state(cluster_dir)[0] and state(cluster_dir), 10, "the topic's state")
    assert s["isr"] == [0, 1, 2] and s["leader_epoch"] == 0
    expected = [(i, f"v{i}".encode()) for i in range(30)]
    for b in range(3):   # every replica has every record, in its own files, fetched over sockets
        wait_for(lambda b=b: values_in_files(cluster_dir, b) == expected, 20, f"broker {b} to replicate")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)    # kafka-log-dirs.sh asks each broker
    sizes = {d["broker"]: [p["partition_size"] for t in d["log_dirs"][0]["topics"] if t["name"] == "orders"
                           for p in t["partitions"]] for d in admin.describe_log_dirs({"orders": [0]})}
    admin.close()
    assert len(sizes) == 3 and len({tuple(v) for v in sizes.values()}) == 1 and sizes[0][0] > 0

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id="billing", enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=5000)
    tp = TopicPartition("orders", 0)
    consumer.assign([tp])
    assert [m.value for m in consumer] == [v for _, v in expected]
    consumer.commit()
    consumer.close()

    leader = s["leader"]
    _, controller_epoch = state(cluster_dir)
    nodes[leader].stop(signal.SIGKILL)               # kill -9 the leader
    new_state = wait_for(lambda: (st := state(cluster_dir)[0])["leader"] not in (leader, -1)
                         and st, 45, "a new leader")
    assert new_state["leader_epoch"] == 1 and leader not in new_state["isr"]
    if leader == 0:                                   # the controller died too: a new one, epoch up
        assert state(cluster_dir)[1] > controller_epoch

    for i in range(30, 45):                           # the survivors carry on
        producer.send("orders", value=f"v{i}".encode())
    producer.flush(60)
    producer.close()
    expected += [(i, f"v{i}".encode()) for i in range(30, 45)]
    survivors = [n for n in nodes if n.broker_id != leader]
    for n in survivors:
        wait_for(lambda n=n: values_in_files(cluster_dir, n.broker_id) == expected, 30,
                 f"broker {n.broker_id} to have everything")

    # the killed broker comes back, truncates by leader epoch and catches up
    nodes[leader].start()
    wait_for(lambda: values_in_files(cluster_dir, leader) == expected, 45, "the restarted broker to catch up")
    wait_for(lambda: leader in state(cluster_dir)[0]["isr"], 45, "the restarted broker to rejoin the ISR")
    consumer = KafkaConsumer(bootstrap_servers=[f"127.0.0.1:{n.port}" for n in survivors],
                             group_id="billing", enable_auto_commit=False, consumer_timeout_ms=5000)
    consumer.assign([tp])
    assert [m.value for m in consumer] == [v for _, v in expected[30:]]   # resumes at the commit
    consumer.close()


def test_the_cli_tools_work_against_the_cluster_through_one_bootstrap_broker(cluster):
    """`kstore topics/produce/consume/get-offsets/consumer-groups --bootstrap-server` given only
    broker 0: partition requests must reach each partition's leader (spread over the three
    brokers), commits the group's coordinator."""
    cluster_dir, nodes = cluster
    bootstrap = f"127.0.0.1:{nodes[0].port}"

    def kstore(*args, stdin=None):
        result = subprocess.run([sys.executable, "-m", "kstore", *args], input=stdin, text=True,
                                capture_output=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout

    kstore("topics", "--bootstrap-server", bootstrap, "--create", "--topic", "spread",
           "--partitions", "3", "--replication-factor", "3")
    rows = wait_for(lambda: (lines := kstore("topics", "--bootstrap-server", bootstrap,
                                             "--describe", "--topic", "spread").splitlines())
                    and all("Isr: " in r and len(r.split("Isr: ")[1].split(",")) == 3
                            for r in lines[1:]) and lines, 30, "three in-sync replicas each")
    assert rows[0] == "Topic: spread\tPartitionCount: 3\tReplicationFactor: 3\tConfigs: "
    leaders = {int(r.split("Leader: ")[1].split("\t")[0]) for r in rows[1:]}
    assert leaders == {0, 1, 2}     # so two of the three partitions are led by other brokers

    kstore("produce", "--bootstrap-server", bootstrap, "--topic", "spread", "--property",
           "parse.key=true", "--property", "key.separator=:",
           stdin="".join(f"k{i}:v{i}\n" for i in range(30)))
    out = kstore("consume", "--bootstrap-server", bootstrap, "--topic", "spread", "--group", "g",
                 "--from-beginning", "--max-messages", "30")
    assert sorted(out.split()) == sorted(f"v{i}" for i in range(30))
    ends = kstore("get-offsets", "--bootstrap-server", bootstrap, "--topic", "spread").split()
    assert sum(int(line.rsplit(":", 1)[1]) for line in ends) == 30
    described = kstore("consumer-groups", "--bootstrap-server", bootstrap, "--describe",
                       "--group", "g").split("\n")
    lags = [line.split() for line in described if line.startswith("g ")]
    assert len(lags) == 3 and all(row[3] == row[4] and row[5] == "0" for row in lags)
    assert kstore("consumer-groups", "--bootstrap-server", bootstrap, "--list").split() == ["g"]


def test_produce_many_sends_one_request_per_leader_and_follows_a_moved_leader(cluster):
    """`RemoteBroker.produce_many`, what the Spark sink's tasks send with: the batches of several
    partitions go in one Produce request per leader. A partition whose cached leader is stale
    is answered NOT_LEADER_OR_FOLLOWER by the broker it reached, and goes again, alone, to its
    leader after a metadata refresh; the other partitions are not sent twice."""
    from kstore.errors import KStoreError
    from kstore.records import Record, build_batch
    from kstore.remote_broker import RemoteBroker
    _tmp, nodes = cluster
    client = RemoteBroker(f"127.0.0.1:{nodes[0].port}", timeout_s=15)
    try:
        client.create_topic("multi", 6, 3, {})
        leaders = wait_for(lambda: (lambda t: {p["partition_index"]: p["leader_id"]
                                               for p in t["partitions"]}
                                    if all(p["leader_id"] >= 0 for p in t["partitions"]) else None
                                    )(client._topic_metadata("multi")), 30, "leaders")
        assert len(set(leaders.values())) > 1                   # more than one leader to group by

        def every_leader_has_its_partition():
            try:
                return all(client.fetch("multi", p, 0) is not None for p in range(6))
            except KStoreError:                                 # not opened by its leader yet
                return False
        wait_for(every_leader_has_its_partition, 30, "the leaders to open their partitions")
        client._leaders[("multi", 0)] = next(b for b in range(3) if b != leaders[0])   # stale
        sent = []
        request = client.request

        def counted(api, body, node=None, expect_response=True):
            if api == "Produce":
                sent.append((node, sorted(p["index"] for t in body["topic_data"]
                                          for p in t["partition_data"])))
            return request(api, body, node, expect_response)
        client.request = counted
        batches = [("multi", p, build_batch([Record(None, b"v%d" % p, 1_700_000_000_000)]))
                   for p in range(6)]
        acks = client.produce_many(batches)
        assert sorted(acks) == [("multi", p) for p in range(6)]
        assert all(a.first_offset == 0 for a in acks.values())
        stale_leader = next(b for b in range(3) if b != leaders[0])
        cached = {leaders[p] for p in range(1, 6)} | {stale_leader}
        assert len(sent) == len(cached) + 1                     # one request per leader, + 1
        grouped = dict(sent[:-1])
        for node in cached:
            assert grouped[node] == sorted([p for p in range(1, 6) if leaders[p] == node]
                                           + ([0] if node == stale_leader else []))
        assert sent[-1] == (leaders[0], [0])                    # partition 0 again, alone
        client.request = request
        for p in range(6):
            assert [r.value for b in client.fetch("multi", p, 0).data.batches()
                    for r in b.records()] == [b"v%d" % p]
        with pytest.raises(ValueError, match="one batch per partition"):
            client.produce_many(batches[:1] * 2)
    finally:
        client.close()

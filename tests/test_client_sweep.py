"""What a Kafka developer met when poking `kstore serve` with real clients in their default
modes, each fixed and kept fixed here (the larger findings have their own files, e.g.
tests/test_admin_change_apis.py)."""

from __future__ import annotations

import re
import select
import signal
import subprocess
import sys
import time

import confluent_kafka as ck
import kafka.errors
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kafka import KafkaProducer

from test_clients import ROOT, serve_processes  # noqa: F401 (the fixture)

pytestmark = pytest.mark.timeout(60)


def test_serve_on_port_0_prints_the_port_it_listens_on(tmp_path):
    """`--port 0` (any free port, the usual way to avoid clashes) printed `on 127.0.0.1:0`, leaving
    no way to connect; the line now names the bound port, and a client reaches the broker there."""
    proc = subprocess.Popen([sys.executable, "-m", "kstore", "serve", "--log-dir", str(tmp_path / "logs"),
                             "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        line, deadline = "", time.monotonic() + 30
        while "serving" not in line and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1)
            if ready:
                line = proc.stdout.readline()
        port = int(re.search(r" on 127\.0\.0\.1:(\d+) ", line).group(1))
        assert port != 0, line
        producer = ck.Producer({"bootstrap.servers": f"127.0.0.1:{port}"})
        producer.produce("t", value=b"v")
        assert producer.flush(15) == 0
        assert "t" in producer.list_topics(timeout=10).topics
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_a_topic_timestamp_window_refuses_records_outside_it(tmp_path, serve_processes):
    """message.timestamp.before.max.ms / after.max.ms (Kafka 3.6+) were unknown configs
    (INVALID_CONFIG at topic creation). Now a CreateTime record outside the window fails its batch
    with INVALID_TIMESTAMP for both producers, and the broker-wide default applies to every topic."""
    sp = serve_processes(tmp_path / "logs", "log.message.timestamp.after.max.ms=60000")
    admin = AdminClient({"bootstrap.servers": sp.bootstrap})
    [created] = admin.create_topics([NewTopic("readings", 1, 1, config={
        "message.timestamp.before.max.ms": "3600000"})]).values()
    assert created.result(10) is None
    [described] = admin.describe_configs([ConfigResource("topic", "readings")]).values()
    configs = described.result(10)
    assert configs["message.timestamp.before.max.ms"].value == "3600000"
    after = configs["message.timestamp.after.max.ms"]
    assert (after.value, after.source) == ("60000", ck.admin.ConfigSource.STATIC_BROKER_CONFIG.value)

    now = int(time.time() * 1000)
    outcomes = []
    producer = ck.Producer({"bootstrap.servers": sp.bootstrap, "linger.ms": 0})
    for topic, ts in (("readings", now - 2 * 3600_000), ("readings", now + 3600_000), ("readings", now),
                      ("other", now + 3600_000), ("other", now - 2 * 3600_000)):
        producer.produce(topic, value=b"v", timestamp=ts,
                         on_delivery=lambda err, msg: outcomes.append(err.name() if err else msg.offset()))
        assert producer.flush(15) == 0
    assert outcomes == ["INVALID_TIMESTAMP", "INVALID_TIMESTAMP", 0, "INVALID_TIMESTAMP", 0]

    # kafka-python's idempotent producer (its default) turns any non-retriable error into a fatal
    # state, as it would against Kafka: a new producer sends the good record.
    for value, error in ((b"old", kafka.errors.InvalidTimestampError), (b"fine", None)):
        kp = KafkaProducer(bootstrap_servers=sp.bootstrap, request_timeout_ms=10000, max_block_ms=10000)
        try:
            future = kp.send("readings", value, timestamp_ms=now - 2 * 3600_000 if error else now)
            if error:
                with pytest.raises(error):
                    future.get(15)
            else:
                assert future.get(15).offset == 1
        finally:
            kp.close(5)
    consumer = ck.Consumer({"bootstrap.servers": sp.bootstrap, "group.id": "w"})
    assert consumer.get_watermark_offsets(ck.TopicPartition("readings", 0), 10) == (0, 2)
    consumer.close()

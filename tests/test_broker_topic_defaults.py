"""Broker-wide defaults of the topic configs, under the names Kafka's server.properties uses
(`log.segment.bytes`, `log.retention.hours`, `message.max.bytes`, ...; Kafka's
ServerTopicConfigSynonyms): `kstore serve --override` takes them, every topic without its own value
gets them (auto-created, created by CreateTopics), a topic's own value wins, and DescribeConfigs
names where each value came from as Kafka does. Driven through a real `kstore serve` process with
confluent-kafka and kafka-python; the segment files on disk are the proof of the size."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from helpers import serve_log_dir
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient

from kstore.broker import Broker
from kstore.config import BROKER_KEYS, KEYS, TOPIC_CONFIG_SYNONYMS, BrokerConfig, describe
from kstore.errors import ConfigError

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent
SEGMENT = 16384
STATIC, DEFAULT = ck.admin.ConfigSource.STATIC_BROKER_CONFIG.value, ck.admin.ConfigSource.DEFAULT_CONFIG.value


def produce(bootstrap: str, topic: str, count: int, size: int = 500) -> None:
    # small batches: each fits a 16 KiB segment, so rolls happen at the segment size
    producer = ck.Producer({"bootstrap.servers": bootstrap, "batch.size": 4000, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, key=f"k{i}".encode(), value=bytes([65 + i % 26]) * size)
    assert producer.flush(30) == 0


def segment_sizes(log_dir: Path, partition: str) -> list[int]:
    return [os.path.getsize(p) for p in sorted((log_dir / partition).glob("*.log"))]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`kstore serve --override log.segment.bytes=16384 --override log.retention.hours=1`, with
    three topics written: auto-created, created without configs, created with its own
    segment.bytes. Stopped (SIGTERM) after the tests of the module that need it running."""
    log_dir = tmp_path_factory.mktemp("defaults") / "logs"
    proc, bootstrap = serve_log_dir(log_dir, cwd=ROOT, overrides=(f"log.segment.bytes={SEGMENT}",
                                                                  "log.retention.hours=1"))
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([
                NewTopic("created", 1, 1),
                NewTopic("own", 1, 1, config={"segment.bytes": "1048576"})]).values():
            future.result(30)
        for topic in ("auto", "created", "own"):     # "auto" is created by its first produce
            produce(bootstrap, topic, 300)
        yield log_dir, bootstrap, admin
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_serve_rolls_every_topic_at_the_broker_segment_size(served):
    log_dir, bootstrap, admin = served
    configs = {r.name: f.result(30) for r, f in admin.describe_configs(
        [ConfigResource("topic", t) for t in ("auto", "created", "own")]).items()}
    for topic in ("auto", "created"):
        sizes = segment_sizes(log_dir, f"{topic}-0")
        assert len(sizes) >= 8 and sum(sizes) > 150_000, sizes       # 300 x 500-byte values
        assert all(s <= SEGMENT for s in sizes), sizes
        assert all(s > SEGMENT - 4600 for s in sizes[:-1]), sizes     # rolled only when full
        entry = configs[topic]["segment.bytes"]
        assert (entry.value, entry.source) == (str(SEGMENT), STATIC)
        assert configs[topic]["retention.ms"].value == "3600000"     # log.retention.hours=1
    own = segment_sizes(log_dir, "own-0")                               # its own segment.bytes wins
    assert len(own) == 1 and own[0] > 150_000
    entry = configs["own"]["segment.bytes"]
    assert (entry.value, entry.source) == ("1048576", ck.admin.ConfigSource.DYNAMIC_TOPIC_CONFIG.value)


def test_describe_configs_names_the_broker_config_as_kafka_does(served):
    _, bootstrap, admin = served
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        got = admin.describe_configs([KPConfigResource(ConfigResourceType.TOPIC, "own"),
                                      KPConfigResource(ConfigResourceType.TOPIC, "auto"),
                                      KPConfigResource(ConfigResourceType.BROKER, "0")],
                                     include_synonyms=True, config_filter="all")
    finally:
        admin.close()

    def synonyms(resource: str, name: str, config: str) -> list[tuple]:
        return [(s["name"], s["value"], s["source"])
                for s in got[resource][name][config]["synonyms"]]
    # the topic's own value, then the broker's, then the default — all under the broker's name
    assert synonyms("topic", "own", "segment.bytes") == [
        ("segment.bytes", "1048576", "DYNAMIC_TOPIC_CONFIG"),
        ("log.segment.bytes", str(SEGMENT), "STATIC_BROKER_CONFIG"),
        ("log.segment.bytes", "1073741824", "DEFAULT_CONFIG")]
    assert synonyms("topic", "auto", "segment.bytes") == [
        ("log.segment.bytes", str(SEGMENT), "STATIC_BROKER_CONFIG"),
        ("log.segment.bytes", "1073741824", "DEFAULT_CONFIG")]
    assert synonyms("topic", "auto", "compression.type") == [
        ("compression.type", "producer", "DEFAULT_CONFIG")]
    # Kafka lists a topic config's synonyms from its first broker name on (log.retention.ms), so
    # a retention set by log.retention.hours alone reports its value with no synonyms, as DEFAULT
    retention = got["topic"]["auto"]["retention.ms"]
    assert (retention["value"], retention["config_source"], retention["synonyms"]) == (
        "3600000", "DEFAULT_CONFIG", [])
    broker = got["broker"]["0"]
    assert (broker["log.segment.bytes"]["value"], broker["log.segment.bytes"]["config_source"]) == (
        str(SEGMENT), "STATIC_BROKER_CONFIG")
    assert synonyms("broker", "0", "log.retention.hours") == [
        ("log.retention.hours", "1", "STATIC_BROKER_CONFIG"),
        ("log.retention.hours", "168", "DEFAULT_CONFIG")]
    assert broker["log.retention.ms"]["value"] is None             # unset, no default: null
    assert broker["message.max.bytes"]["value"] == "1048588"


@pytest.mark.parametrize("overrides, problem", [
    (["log.segment.bytes=abc"],
     "Invalid value 'abc' for configuration log.segment.bytes: expected type int"),
    (["log.segment.bytes=13"],
     "Invalid value 13 for configuration log.segment.bytes: Value must be at least 14"),
    (["log.segment.bytes=1048576", "no.such.config=1"], "Unknown broker config name: no.such.config"),
])
def test_serve_refuses_a_bad_broker_default_in_one_line(tmp_path, overrides, problem):
    result = subprocess.run([sys.executable, "-m", "kstore", "serve", "--log-dir", str(tmp_path / "logs"),
                             "--port", "0", *(f"--override={o}" for o in overrides)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [f"kstore serve: ConfigError: {problem}"]
    assert not (tmp_path / "logs").exists()                          # nothing written


# ---- the same rules in process (no network needed) ----

@pytest.mark.parametrize("given, retention_ms", [
    ({"log.retention.hours": "1"}, 3_600_000),
    ({"log.retention.minutes": "2", "log.retention.hours": "1"}, 120_000),
    ({"log.retention.ms": "5000", "log.retention.minutes": "2", "log.retention.hours": "1"}, 5000),
    ({"log.retention.hours": "-1"}, -1),                  # any negative keeps forever, as Kafka
    ({}, 604_800_000),
])
def test_retention_ms_wins_over_minutes_over_hours(tmp_path, given, retention_ms):
    broker = Broker(str(tmp_path / "logs"), config=given)
    try:
        broker.create_topic("t", 1, 1)
        assert broker.get_log("t", 0).config.retention_ms == retention_ms
        broker.create_topic("mine", 1, 1, {"retention.ms": "42"})      # the topic's own still wins
        assert broker.get_log("mine", 0).config.retention_ms == 42
    finally:
        broker.shutdown()


def test_every_broker_default_reaches_its_topic_config():
    """Each broker name is a ConfigKey of its own, and setting it (to a legal value other than the
    default) changes exactly its topic config."""
    samples = {"int": "77", "long": "77", "double": "0.25", "boolean": "true", "list": "compact",
               "string": None}
    strings = {"message.timestamp.type": "LogAppendTime", "compression.type": "zstd"}
    for topic, names in TOPIC_CONFIG_SYNONYMS.items():
        assert topic in KEYS
        for name, unit in names:
            key = BROKER_KEYS[name]
            value = strings.get(topic) or samples[key.type]
            if topic == "min.compaction.lag.ms":
                value = "0"   # must stay below max.compaction.lag.ms
            defaults = BrokerConfig({name: value}).topic_defaults()
            expected = BrokerConfig({name: value})[name]
            expected = expected * unit if unit != 1 else expected
            assert defaults == {topic: expected}, name
    assert len(KEYS) == len(TOPIC_CONFIG_SYNONYMS)       # every topic config has a broker default
    assert {d["name"]: d["server_default"] for d in describe()}["max.message.bytes"] == "message.max.bytes"


def test_conflicting_broker_defaults_name_the_broker_configs():
    with pytest.raises(ConfigError) as e:
        BrokerConfig({"log.cleaner.min.compaction.lag.ms": "10",
                      "log.cleaner.max.compaction.lag.ms": "5"})
    assert str(e.value) == ("conflict: log.cleaner.max.compaction.lag.ms (5) must be at least "
                            "log.cleaner.min.compaction.lag.ms (10)")
    with pytest.raises(ConfigError, match="configuration log.roll.hours: Value must be at least 1"):
        BrokerConfig({"log.roll.hours": "0"})
    with pytest.raises(ConfigError, match="configuration log.cleanup.policy"):
        BrokerConfig({"log.cleanup.policy": "forever"})


def test_python_topic_defaults_are_the_highest_broker_synonym(tmp_path):
    """`Broker(topic_defaults=...)` (kstore's Python API, topic names) is the same thing as the
    highest-priority broker name: it beats log.retention.hours and shows as log.retention.ms."""
    broker = Broker(str(tmp_path / "logs"), config={"log.retention.hours": "1"},
                    topic_defaults={"retention.ms": 1000, "segment.bytes": 4096})
    try:
        assert broker.config["log.retention.ms"] == 1000 and broker.config["log.segment.bytes"] == 4096
        broker.create_topic("t", 1, 1)
        log = broker.get_log("t", 0)
        assert (log.config.retention_ms, log.config.segment_bytes) == (1000, 4096)
        broker.alter_topic_config("t", {"segment.bytes": "8192"})          # and the topic's own wins
        assert log.config.segment_bytes == 8192 and log.config.retention_ms == 1000
    finally:
        broker.shutdown()

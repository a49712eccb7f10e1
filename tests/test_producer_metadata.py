"""The in-process producer keeps each topic's partition count (its metadata) and asks the broker
again only when it is older than metadata.max.age.ms or does not know an explicit partition, as
Kafka's producer does; send() checks that per record without asking the broker."""

from __future__ import annotations

import pytest

from kstore.broker import Broker
from kstore.clock import ManualClock
from kstore.errors import KStoreError
from kstore.producer import Producer


@pytest.fixture
def broker(tmp_path):
    b = Broker(str(tmp_path / "logs"), clock=ManualClock())
    yield b
    b.close()


def test_new_partitions_are_seen_after_metadata_max_age(broker):
    broker.create_topic("t", 1)
    producer = Producer(broker, linger_ms=0, batch_size=1, metadata_max_age_ms=1000)
    assert producer.send("t", b"a").get().partition == 0
    broker.create_partitions("t", 3)
    calls = []
    original = broker.partition_count
    broker.partition_count = lambda topic: calls.append(topic) or original(topic)
    for _ in range(20):   # within the age: the cached count (1), no question to the broker
        assert producer.send("t", b"b").get().partition == 0
    assert calls == []
    broker.clock.advance(1000)
    producer.send("t", b"c")
    assert calls == ["t"] and producer._partition_counts["t"][0] == 3


def test_an_explicit_partition_the_producer_does_not_know_refreshes_its_metadata(broker):
    broker.create_topic("t", 1)
    producer = Producer(broker, linger_ms=0, batch_size=1)
    producer.send("t", b"a")
    broker.create_partitions("t", 2)
    assert producer.send("t", b"b", partition=1).get().partition == 1
    with pytest.raises((KStoreError, ValueError), match="partition"):
        producer.send("t", b"c", partition=5)

"""Which partition things land on: the `__consumer_offsets` partition of a group (reference §8.2)
and the producer's partition of a record (Kafka's `Utils.murmur2` / `Utils.toPositive` /
`BuiltInPartitioner`).

The expected numbers come from Kafka itself (the JDK's String.hashCode examples of §8.2 and
`UtilsTest.testMurmur2`), from an independent implementation written below from the Java source,
and from kafka-python's copy of the algorithm (`kafka.partitioner.default`), never from kstore.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
from kafka.cluster import ClusterMetadata
from kafka.partitioner.default import DefaultPartitioner
from kafka.partitioner.default import murmur2 as kafka_python_murmur2
from kafka.protocol.metadata import MetadataResponse

from kstore import ManualClock
from kstore.broker import Broker
from kstore.coordinator_records import java_string_hashcode, partition_for, utils_abs
from kstore.group_coordinator import OFFSETS_TOPIC
from kstore.partitioner import BuiltInPartitioner, murmur2, partition_for_key, to_positive
from kstore.producer import Producer

T0 = 1_700_000_000_000
PARTITION_COUNTS = (1, 3, 7, 12, 50)


# ------------------------------------------------------------------------------------------
# An independent transcription of Kafka's Java code, with explicit 32-bit int emulation
# ------------------------------------------------------------------------------------------
def _int(x: int) -> int:
    """Wrap to a Java int (two's complement, 32 bits)."""
    x &= 0xFFFFFFFF
    return x - 0x100000000 if x >= 0x80000000 else x


def _ushr(x: int, n: int) -> int:
    """Java's >>> on an int."""
    return _int((x & 0xFFFFFFFF) >> n)


def java_murmur2(data: bytes) -> int:
    """org.apache.kafka.common.utils.Utils.murmur2, line by line."""
    length = len(data)
    seed = _int(0x9747B28C)
    m = 0x5BD1E995
    r = 24
    h = _int(seed ^ length)
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = _int((data[i4 + 0] & 0xFF) + ((data[i4 + 1] & 0xFF) << 8)
                 + ((data[i4 + 2] & 0xFF) << 16) + ((data[i4 + 3] & 0xFF) << 24))
        k = _int(k * m)
        k = _int(k ^ _ushr(k, r))
        k = _int(k * m)
        h = _int(h * m)
        h = _int(h ^ k)
    # switch (length % 4) with fall-through: case 3, case 2, case 1
    rest = length % 4
    if rest == 3:
        h = _int(h ^ ((data[(length & ~3) + 2] & 0xFF) << 16))
    if rest in (2, 3):
        h = _int(h ^ ((data[(length & ~3) + 1] & 0xFF) << 8))
    if rest in (1, 2, 3):
        h = _int(h ^ (data[length & ~3] & 0xFF))
        h = _int(h * m)
    h = _int(h ^ _ushr(h, 13))
    h = _int(h * m)
    h = _int(h ^ _ushr(h, 15))
    return h


def java_to_positive(n: int) -> int:
    """Utils.toPositive: number & 0x7fffffff."""
    return n & 0x7FFFFFFF


def java_partition(key: bytes, num_partitions: int) -> int:
    """BuiltInPartitioner.partitionForKey."""
    return java_to_positive(java_murmur2(key)) % num_partitions


def java_hashcode(s: str) -> int:
    """java.lang.String.hashCode over UTF-16 code units (surrogates as two units)."""
    h = 0
    units = []
    for ch in s:
        cp = ord(ch)
        if cp >= 0x10000:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    for u in units:
        h = _int(31 * h + u)
    return h


def kafka_utils_abs(n: int) -> int:
    """Utils.abs: MIN_VALUE → 0."""
    return 0 if n == -2147483648 else abs(n)


# ------------------------------------------------------------------------------------------
# §8.2: the partition of a group in __consumer_offsets
# ------------------------------------------------------------------------------------------
GROUP_EXAMPLES = [
    ("my-group", -1906497762, 12),
    ("test-group", 627841412, 12),
    ("console-consumer-12345", 158455506, 6),
    ("polygenelubricants", -2147483648, 0),
    ("g\U0001F600", 1871882, 32),
]


@pytest.mark.parametrize("group,hashcode,partition", GROUP_EXAMPLES)
def test_group_partition_examples_of_the_reference(group, hashcode, partition):
    assert java_hashcode(group) == hashcode          # the test's own transcription agrees
    assert java_string_hashcode(group) == hashcode
    assert partition_for(group) == partition
    assert partition_for(group, 50) == partition


def test_utils_abs_of_min_value_is_zero_unlike_abs():
    h = java_string_hashcode("polygenelubricants")
    assert h == -(1 << 31)
    assert utils_abs(h) == 0
    # Python's abs gives 2**31, whose remainder mod 50 is 48: not what Kafka computes.
    assert abs(h) % 50 == 48 and partition_for("polygenelubricants") == 0
    assert utils_abs(-5) == 5 and utils_abs(7) == 7 and utils_abs(0) == 0


def test_surrogate_pairs_count_as_two_utf16_units():
    s = "g\U0001F600"
    assert len(s) == 2 and len(s.encode("utf-16-be")) == 6
    code_points_hash = _int(31 * _int(31 * 0 + ord("g")) + 0x1F600)
    assert code_points_hash != 1871882 == java_string_hashcode(s)


def test_group_partition_matches_the_independent_hashcode_for_random_ids():
    rng = random.Random(8)
    alphabet = "abcxyzABC-_.0123456789éß中\U0001F600"
    for _ in range(500):
        group = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))
        h = java_hashcode(group)
        assert java_string_hashcode(group) == h, group
        for n in (1, 7, 50):
            assert partition_for(group, n) == kafka_utils_abs(h) % n, (group, n)


def test_the_coordinator_uses_the_group_partition(tmp_path):
    broker = Broker(str(tmp_path / "logs"), clock=ManualClock(T0))
    try:
        broker.create_topic("orders", 1)
        coordinator = broker.group_coordinator
        assert broker.partition_count(OFFSETS_TOPIC) == 50
        for group, _, partition in GROUP_EXAMPLES:
            assert coordinator.partition_for(group) == partition
            coordinator.commit_offsets(group, {("orders", 0): 1})
            log = broker.get_log(OFFSETS_TOPIC, partition)
            assert log.log_end_offset >= 1
        # "my-group" and "test-group" share partition 12; partition 0 holds polygenelubricants.
        assert broker.get_log(OFFSETS_TOPIC, 12).log_end_offset == 2
        assert broker.get_log(OFFSETS_TOPIC, 0).log_end_offset == 1
        used = {p for _, _, p in GROUP_EXAMPLES}
        for p in range(50):
            if p not in used:
                assert broker.get_log(OFFSETS_TOPIC, p).log_end_offset == 0, p
    finally:
        broker.shutdown()


# ------------------------------------------------------------------------------------------
# murmur2: Kafka's vectors, the independent implementation, kafka-python
# ------------------------------------------------------------------------------------------
KAFKA_MURMUR2_VECTORS = [   # clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (bytes([ord("a"), ord("b"), ord("c")]), 479470107),
]


@pytest.mark.parametrize("data,expected", KAFKA_MURMUR2_VECTORS)
def test_murmur2_matches_kafkas_test_vectors(data, expected):
    assert java_murmur2(data) == expected
    assert murmur2(data) == expected
    assert kafka_python_murmur2(data) == expected & 0xFFFFFFFF   # kafka-python: unsigned


def test_to_positive_clears_the_sign_bit_instead_of_abs():
    assert to_positive(-1) == 0x7FFFFFFF and java_to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(1 << 31)) == 0
    assert to_positive(-973932308) == (-973932308) & 0x7FFFFFFF != abs(-973932308)
    assert to_positive(12345) == 12345


def _random_keys(n: int = 240) -> list[bytes]:
    rng = random.Random(20240611)
    keys: list[bytes] = [b"", b"\x00", b"\xff\xff\xff\xff", "ключ".encode(), "clé-é".encode()]
    while len(keys) < n:
        kind = rng.randrange(3)
        length = rng.randrange(0, 48)
        if kind == 0:
            k = bytes(rng.randrange(256) for _ in range(length))
        elif kind == 1:
            k = f"user-{rng.randrange(10 ** 6)}".encode()
        else:
            k = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789-_") for _ in range(length)).encode()
        if k not in keys:
            keys.append(k)
    return keys


KEYS = _random_keys()
# The expected table: computed only by the independent transcription above.
EXPECTED = {k: {n: java_partition(k, n) for n in PARTITION_COUNTS} for k in KEYS}


def _kafka_python_cluster(topic: str, partitions: int) -> ClusterMetadata:
    """kafka-python's own ClusterMetadata, filled from a MetadataResponse like a broker's."""
    v = 1
    broker = MetadataResponse.MetadataResponseBroker(version=v, node_id=0, host="127.0.0.1",
                                                     port=9092, rack=None)
    part = MetadataResponse.MetadataResponseTopic.MetadataResponsePartition
    topic_md = MetadataResponse.MetadataResponseTopic(
        version=v, error_code=0, name=topic, is_internal=False,
        partitions=[part(version=v, error_code=0, partition_index=i, leader_id=0, leader_epoch=0,
                         replica_nodes=[0], isr_nodes=[0], offline_replicas=[])
                    for i in range(partitions)])
    cluster = ClusterMetadata()
    cluster.update_metadata(MetadataResponse(version=v, brokers=[broker], controller_id=0,
                                             topics=[topic_md]))
    assert cluster.partitions_for_topic(topic) == set(range(partitions))
    return cluster


def test_partition_table_agrees_with_kafka_python_and_kstore():
    assert len(KEYS) >= 200
    kp = DefaultPartitioner()
    clusters = {n: _kafka_python_cluster(f"t{n}", n) for n in PARTITION_COUNTS}
    abs_would_differ = 0
    for key, row in EXPECTED.items():
        h = java_murmur2(key)
        assert kafka_python_murmur2(key) == h & 0xFFFFFFFF, key
        assert murmur2(key) == h, key
        for n, expected in row.items():
            assert (kafka_python_murmur2(key) & 0x7FFFFFFF) % n == expected
            assert kp.partition(f"t{n}", key, key, None, None, clusters[n]) == expected
            assert partition_for_key(key, n) == expected, (key, n)
            if h < 0 and abs(h) % n != expected:
                abs_would_differ += 1
    # The table discriminates: abs() instead of toPositive() would put many keys elsewhere.
    assert abs_would_differ > 50
    # and the keys spread over every partition of the 50-partition topic... almost
    assert len({row[50] for row in EXPECTED.values()}) > 40


@pytest.fixture
def broker(tmp_path):
    b = Broker(str(tmp_path / "logs"), clock=ManualClock(T0))
    yield b
    b.shutdown()


def test_the_producer_puts_keyed_records_on_exactly_those_partitions(broker):
    for n in PARTITION_COUNTS:
        broker.create_topic(f"keys-{n}", n)
    producer = Producer(broker, linger_ms=10_000)
    futures = {}
    for n in PARTITION_COUNTS:
        for i, key in enumerate(KEYS):
            futures[(n, key)] = producer.send(f"keys-{n}", value=f"v{i}".encode(), key=key)
    producer.flush()
    for (n, key), f in futures.items():
        md = f.get()
        assert md.topic == f"keys-{n}"
        assert md.partition == EXPECTED[key][n], (key, n)
    # and the bytes on disk say the same: every partition holds exactly its keys
    for n in PARTITION_COUNTS:
        expected_keys = defaultdict(set)
        for key in KEYS:
            expected_keys[EXPECTED[key][n]].add(key)
        total = 0
        for p in range(n):
            stored = broker.get_log(f"keys-{n}", p).records()
            assert {r.key for r in stored} == expected_keys[p], (n, p)
            assert len(stored) == len(expected_keys[p])
            total += len(stored)
        assert total == len(KEYS)
    # the same key keeps its partition over time (a second round, after growing nothing)
    again = producer.send("keys-12", value=b"again", key=KEYS[7])
    producer.flush()
    assert again.get().partition == EXPECTED[KEYS[7]][12]
    producer.close()


def _record_size(value_len: int) -> int:
    """Encoded size of a keyless record with deltas 0 and no headers (DefaultRecord.sizeInBytes)."""
    def varint_len(n: int) -> int:
        z = (n << 1) ^ (n >> 31)
        size = 1
        while z >= 0x80:
            z >>= 7
            size += 1
        return size
    body = 1 + 1 + 1 + varint_len(-1) + varint_len(value_len) + value_len + 1
    return varint_len(body) + body


def _kafka_accumulator(run_partitions: list[int], n_records: int, size: int, batch_size: int):
    """What Kafka's RecordAccumulator + BuiltInPartitioner do with equal-sized keyless records,
    given the partitions the sticky partitioner picks in turn:
    * a record joins its partition's open batch if it fits (hasRoomFor: estimate + size ≤
      batch.size), else that batch is closed and a new one (61-byte header) starts;
    * a batch whose estimate reaches batch.size is full and ready;
    * the partitioner adds each append's growth of the batch estimate (`appendedBytes`, the header
      included for a new batch) and moves on once batch.size bytes went to this partition."""
    header = 61
    open_batches: dict[int, list[int]] = {}     # partition -> [estimated bytes, records]
    sent: dict[int, list[int]] = defaultdict(list)
    chosen = iter(run_partitions)
    current, produced, partitions = next(chosen), 0, []
    for _ in range(n_records):
        p = current
        batch = open_batches.get(p)
        if batch is not None and batch[0] + size > batch_size:
            sent[p].append(open_batches.pop(p)[1])
            batch = None
        if batch is None:
            batch = open_batches[p] = [header, 0]
            appended = header + size
        else:
            appended = size
        batch[0] += size
        batch[1] += 1
        partitions.append(p)
        if batch[0] >= batch_size:
            sent[p].append(open_batches.pop(p)[1])
        produced += appended
        if produced >= batch_size:
            current, produced = next(chosen, None), 0
    for p, batch in open_batches.items():      # flush()
        sent[p].append(batch[1])
    return partitions, dict(sent)


def test_keyless_records_stick_to_one_partition_until_batch_size_then_switch(broker):
    broker.create_topic("sticky", 6)
    batch_size = 1000
    value = b"x" * 100
    size = _record_size(len(value))
    assert size == 109
    n = 150
    producer = Producer(broker, batch_size=batch_size, linger_ms=60_000,
                        partitioner=BuiltInPartitioner(batch_size, random.Random(3)))
    futures = [producer.send("sticky", value=value) for _ in range(n)]
    assert producer.pending() > 0          # linger.ms has not passed: some batches still open
    producer.flush()
    partitions = [f.get().partition for f in futures]
    run_partitions = [p for i, p in enumerate(partitions) if i == 0 or partitions[i - 1] != p]
    assert len(run_partitions) >= 12
    assert all(a != b for a, b in zip(run_partitions, run_partitions[1:]))   # a switch moves
    assert len(set(run_partitions)) >= 4
    # The first run: 8 records fill a batch (61 + 8 × 109 = 933; a 9th would make 1042 > 1000),
    # the 9th starts a new batch whose header brings the partition's bytes to 1103 ≥ 1000.
    assert partitions[:9] == [partitions[0]] * 9 and partitions[9] != partitions[0]
    expected_partitions, expected_batches = _kafka_accumulator(run_partitions, n, size, batch_size)
    assert partitions == expected_partitions
    # On disk, per partition, the batches hold exactly what the accumulator model says.
    for p in range(6):
        counts = [b.records_count for b in broker.get_log("sticky", p).read(0, 1 << 20).batches()]
        assert counts == expected_batches.get(p, []), p
    assert max(c for cs in expected_batches.values() for c in cs) == 8
    producer.close()


def test_sticky_partition_with_a_single_partition_topic_never_moves(broker):
    broker.create_topic("one", 1)
    producer = Producer(broker, batch_size=200)
    fs = [producer.send("one", value=b"y" * 50) for _ in range(40)]
    producer.flush()
    assert {f.get().partition for f in fs} == {0}
    assert broker.get_log("one", 0).log_end_offset == 40


def test_explicit_partitions_are_honoured_over_keys_and_stickiness(broker):
    broker.create_topic("explicit", 5)
    producer = Producer(broker)
    key = b"user-42"
    hashed = java_partition(key, 5)
    target = (hashed + 2) % 5
    other = next(p for p in range(5) if p not in (hashed, target))
    f1 = producer.send("explicit", value=b"a", key=key, partition=target)
    f2 = producer.send("explicit", value=b"b", partition=other)
    f3 = producer.send("explicit", value=b"c", key=key)
    producer.flush()
    assert (f1.get().partition, f2.get().partition, f3.get().partition) == (target, other, hashed)
    contents = {p: [r.value for r in broker.get_log("explicit", p).records()] for p in range(5)}
    assert contents[target] == [b"a"] and contents[other] == [b"b"] and contents[hashed] == [b"c"]
    assert sum(len(v) for v in contents.values()) == 3


@pytest.mark.parametrize("bad", [5, 6, -1, 100])
def test_an_out_of_range_explicit_partition_is_an_error_and_nothing_is_written(broker, bad):
    broker.create_topic("explicit", 5)
    producer = Producer(broker)
    with pytest.raises(ValueError, match=f"invalid partition {bad}"):
        producer.send("explicit", value=b"a", partition=bad)
    producer.flush()
    assert producer.pending() == 0
    for p in range(5):
        assert broker.get_log("explicit", p).log_end_offset == 0

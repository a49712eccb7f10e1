"""Exercise 08 — `__consumer_offsets`: Java's String.hashCode, the partition of a group
(`Utils.abs(hashCode) % 50`, §8.2), and the OffsetCommit key/value bytes (§8.3). Compared with
kstore.coordinator_records."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, strategies as st

from kstore.coordinator_records import (OffsetCommitKey, OffsetCommitValue, decode_key,
                                        decode_offset_commit_value, java_string_hashcode, partition_for)
from kstore.grading.feedback import expect_bytes, expect_equal
from kstore.grading.testing import PROPERTY, extra, task

GROUP_IDS = st.text(alphabet="abcxyz-_.0129AZéü€😀", max_size=24)
HASH_VECTORS = [("my-group", -1906497762), ("test-group", 627841412), ("console-consumer-12345", 158455506),
                ("polygenelubricants", -2147483648), ("g😀", 1871882), ("", 0), ("a", 97)]


def hash_mistakes(s):
    utf8 = 0
    for b in s.encode("utf-8"):
        utf8 = (31 * utf8 + b) & 0xFFFFFFFF
    utf8 = utf8 - (1 << 32) if utf8 & 0x80000000 else utf8
    codepoints = 0
    for ch in s:
        codepoints = (31 * codepoints + ord(ch)) & 0xFFFFFFFF
    codepoints = codepoints - (1 << 32) if codepoints & 0x80000000 else codepoints
    unbounded = 0
    for i in range(0, len(s.encode("utf-16-be")), 2):
        unbounded = 31 * unbounded + int.from_bytes(s.encode("utf-16-be")[i:i + 2], "big")
    return [("no 32-bit wrap-around: Java's int overflows; keep h in 32 bits and convert to signed",
             unbounded),
            ("the result must be a *signed* 32-bit int (Java's int): values ≥ 2**31 are negative",
             lambda a: isinstance(a, int) and a >= 2**31 and a - 2**32 == java_string_hashcode(s)),
            ("hashed over UTF-8 bytes; Java hashes UTF-16 code units (s.encode('utf-16-be'), 2 bytes each)", utf8),
            ("hashed over code points (ord); Java hashes UTF-16 code units, so 😀 counts as two",
             codepoints)]


@task("ex08.1", points=6)
@pytest.mark.parametrize("s, expected", HASH_VECTORS, ids=[repr(s) for s, _ in HASH_VECTORS])
def test_java_string_hashcode_vectors(learner, s, expected):
    assert java_string_hashcode(s) == expected
    expect_equal(learner.java_string_hashcode(s), expected, call=f"java_string_hashcode({s!r})",
                 mistakes=hash_mistakes(s))


@task("ex08.1", points=4)
@PROPERTY
@given(GROUP_IDS)
def test_java_string_hashcode_matches_the_engine(learner, s):
    expect_equal(learner.java_string_hashcode(s), java_string_hashcode(s), call=f"java_string_hashcode({s!r})",
                 mistakes=hash_mistakes(s))


# ------------------------------------------------------------------ ex08.2 partition_for
def partition_mistakes(group, n):
    h = java_string_hashcode(group)
    return [("Python's abs(−2**31) is 2**31; Kafka's Utils.abs maps Integer.MIN_VALUE to 0",
             abs(h) % n if h == -(1 << 31) else object()),
            ("Python's % of a negative number is not negative like Java's; take Utils.abs first",
             h % n if h < 0 else object())]


PARTITION_VECTORS = [("my-group", 50, 12), ("test-group", 50, 12), ("console-consumer-12345", 50, 6),
                     ("polygenelubricants", 50, 0), ("g😀", 50, 32), ("my-group", 7, None), ("a", 3, 1)]


@task("ex08.2", points=6)
@pytest.mark.parametrize("group, n, expected", PARTITION_VECTORS, ids=[f"{g!r}-of-{n}" for g, n, _ in PARTITION_VECTORS])
def test_partition_for_vectors(learner, group, n, expected):
    expected = partition_for(group, n) if expected is None else expected
    assert partition_for(group, n) == expected
    expect_equal(learner.partition_for(group, n), expected, call=f"partition_for({group!r}, {n})",
                 mistakes=partition_mistakes(group, n))


@task("ex08.2", points=4)
@PROPERTY
@given(GROUP_IDS, st.integers(1, 200))
def test_partition_for_matches_the_engine(learner, group, n):
    expect_equal(learner.partition_for(group, n), partition_for(group, n), call=f"partition_for({group!r}, {n})",
                 mistakes=partition_mistakes(group, n))


# ------------------------------------------------------------------ ex08.3 encode
def engine_encode(group, topic, partition, offset, leader_epoch, metadata, commit_timestamp):
    return (OffsetCommitKey(group, topic, partition).encode(),
            OffsetCommitValue(offset, metadata, commit_timestamp, leader_epoch).encode())


def encode_mistakes(args):
    key, value = engine_encode(*args)
    group, topic, partition, offset, epoch, metadata, ts = args
    return [("the key version is 1 (OffsetCommitKey), not 0", (b"\x00\x00" + key[2:], value)),
            ("the value version is 3 (offset, leader epoch, metadata, commit timestamp)",
             lambda a: isinstance(a, tuple) and len(a) == 2 and a[0] == key and a[1][:2] != b"\x00\x03"),
            ("strings are an int16 length + UTF-8 bytes; the length counts bytes, not characters",
             lambda a: isinstance(a, tuple) and len(a) == 2 and a[0] != key and len(a[0]) == 2 + 2 + len(group) + 2 + len(topic) + 4)]


T = 1_700_000_000_000
ENCODE_VECTORS = [
    ("reference-8.3", ("my-group", "orders", 0, 42, 0, "", T),
     "0001 0008 6d792d67726f7570 0006 6f7264657273 00000000",
     "0003 000000000000002a 00000000 0000 0000018bcfe56800"),
    ("no-leader-epoch-and-metadata", ("g", "t", 7, 1234567890123, -1, "note", T + 5), None, None),
    ("unicode-names", ("grüppe-😀", "tópic", 49, 0, 5, "é", 0), None, None),
]


@task("ex08.3", points=6)
@pytest.mark.parametrize("args, key_hex, value_hex", [v[1:] for v in ENCODE_VECTORS], ids=[v[0] for v in ENCODE_VECTORS])
def test_encode_offset_commit_vectors(learner, args, key_hex, value_hex):
    key, value = engine_encode(*args)
    if key_hex:
        assert key == bytes.fromhex(key_hex.replace(" ", "")) and value == bytes.fromhex(value_hex.replace(" ", ""))
    got = learner.encode_offset_commit(*args)
    call = "encode_offset_commit(group={!r}, topic={!r}, partition={}, offset={}, leader_epoch={}, " \
           "metadata={!r}, commit_timestamp={})".format(*args)
    expect_equal(type(got).__name__ if not (isinstance(got, tuple) and len(got) == 2) else "tuple", "tuple",
                 call=call, hint="return a tuple (key_bytes, value_bytes)")
    expect_bytes(got[0], key, call=call + "  → key", mistakes=[(m, v[0]) for m, v in encode_mistakes(args)[:1]])
    expect_bytes(got[1], value, call=call + "  → value")


@task("ex08.3", points=4)
@PROPERTY
@given(GROUP_IDS, GROUP_IDS, st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1), st.integers(-1, 2**31 - 1),
       GROUP_IDS, st.integers(-1, 2**45))
def test_encode_offset_commit_matches_the_engine(learner, group, topic, partition, offset, epoch, metadata, ts):
    args = (group, topic, partition, offset, epoch, metadata, ts)
    key, value = engine_encode(*args)
    got = learner.encode_offset_commit(*args)
    call = "encode_offset_commit({!r}, {!r}, {}, {}, {}, {!r}, {})".format(*args)
    expect_equal(isinstance(got, tuple) and len(got) == 2, True, call=call, hint="return (key_bytes, value_bytes)")
    expect_bytes(got[0], key, call=call + "  → key")
    expect_bytes(got[1], value, call=call + "  → value")


# ------------------------------------------------------------------ ex08.4 decode
def engine_decode(key: bytes, value: bytes):
    k = decode_key(key)
    v = decode_offset_commit_value(value)
    return (k.group, k.topic, k.partition, v.offset, v.leader_epoch, v.metadata, v.commit_timestamp)


@task("ex08.4", points=6)
@pytest.mark.parametrize("args", [v[1] for v in ENCODE_VECTORS], ids=[v[0] for v in ENCODE_VECTORS])
def test_decode_offset_commit_vectors(learner, args):
    key, value = engine_encode(*args)
    expect_equal(learner.decode_offset_commit(key, value), engine_decode(key, value),
                 call=f"decode_offset_commit(bytes.fromhex('{key.hex()}'), bytes.fromhex('{value.hex()}'))",
                 normalize=lambda r: tuple(r) if isinstance(r, (list, tuple)) else r,
                 mistakes=[("the leader epoch (int32) sits between the offset and the metadata in value v3",
                            lambda a: isinstance(a, tuple) and len(a) == 7 and a[3] == args[3] and a[4] != args[4])])


@task("ex08.4", points=4)
@PROPERTY
@given(GROUP_IDS, GROUP_IDS, st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1), st.integers(-1, 2**31 - 1),
       GROUP_IDS, st.integers(-1, 2**45))
def test_decode_offset_commit_round_trips_engine_bytes(learner, group, topic, partition, offset, epoch, metadata, ts):
    key, value = engine_encode(group, topic, partition, offset, epoch, metadata, ts)
    expect_equal(learner.decode_offset_commit(key, value), engine_decode(key, value),
                 call=f"decode_offset_commit(bytes.fromhex('{key.hex()}'), bytes.fromhex('{value.hex()}'))",
                 normalize=lambda r: tuple(r) if isinstance(r, (list, tuple)) else r)


@task("ex08.4", points=2)
@extra
@pytest.mark.parametrize("key_version", [0, 1])
def test_extra_decode_offset_commit_value_v1_with_expire_timestamp(learner, key_version):
    """Older brokers (and commits with an explicit retention) write value v1: offset, metadata,
    commit timestamp, expire timestamp — no leader epoch (decode it as −1)."""
    key = OffsetCommitKey("old-group", "events", 3).encode(key_version)
    value = OffsetCommitValue(99, "m", T, expire_timestamp=T + 1000).encode()
    assert struct.unpack(">h", value[:2])[0] == 1
    expect_equal(learner.decode_offset_commit(key, value), ("old-group", "events", 3, 99, -1, "m", T),
                 call=f"decode_offset_commit(<key v{key_version}>, <value v1 with an expire timestamp>)",
                 normalize=lambda r: tuple(r) if isinstance(r, (list, tuple)) else r)


# ------------------------------------------------------------------ ex08.5 range assignor
from kstore.assignors import range_assign as engine_range_assign  # noqa: E402


def _normalize_assignment(result):
    """{member: sorted [(topic, partition)]}, members with nothing left out (either is fine)."""
    if not isinstance(result, dict):
        return result
    return {m: sorted((t, int(p)) for t, p in tps) for m, tps in result.items() if tps}


def _ranges(members, partitions, *, extras_last=False):
    """Contiguous ranges of `partitions` for `members` in the given order."""
    out, n, m = {}, len(partitions), len(members)
    per, extra = divmod(n, m)
    for i, member in enumerate(members):
        gets_extra = (i >= m - extra) if extras_last else (i < extra)
        start = per * i + (max(0, i - (m - extra)) if extras_last else min(i, extra))
        out.setdefault(member, []).extend(partitions[start:start + per + (1 if gets_extra else 0)])
    return out


def range_mistakes(subscriptions, counts):
    def per_topic(order, **kw):
        out = {}
        for topic in sorted({t for ts in subscriptions.values() for t in ts}):
            members = order([m for m in subscriptions if topic in subscriptions[m]])
            for member, tps in _ranges(members, [(topic, p) for p in range(counts.get(topic, 0))],
                                       **kw).items():
                out.setdefault(member, []).extend(tps)
        return _normalize_assignment(out)

    def floor_only():
        out = {}
        for topic in sorted({t for ts in subscriptions.values() for t in ts}):
            members = sorted(m for m in subscriptions if topic in subscriptions[m])
            per = counts.get(topic, 0) // len(members)
            for i, member in enumerate(members):
                out.setdefault(member, []).extend((topic, p) for p in range(per * i, per * (i + 1)))
        return _normalize_assignment(out)

    def one_list():
        everything = [(t, p) for t in sorted({t for ts in subscriptions.values() for t in ts})
                      for p in range(counts.get(t, 0))]
        return _normalize_assignment(_ranges(sorted(subscriptions), everything))

    def ignoring_subscriptions():
        out = {}
        for topic in sorted({t for ts in subscriptions.values() for t in ts}):
            for member, tps in _ranges(sorted(subscriptions),
                                       [(topic, p) for p in range(counts.get(topic, 0))]).items():
                out.setdefault(member, []).extend(tps)
        return _normalize_assignment(out)

    return [("members not sorted: Kafka sorts each topic's members by member id (sorted(...)) so "
             "every leader computes the same assignment", per_topic(list)),
            ("the extra partitions went to the last members; the first n % m members (in sorted "
             "order) get one more", per_topic(sorted, extras_last=True)),
            ("partitions of all topics divided as one list; range assigns each topic on its own",
             one_list()),
            ("the remainder was dropped: n % m partitions got no owner", floor_only()),
            ("a topic was given to members that do not subscribe to it", ignoring_subscriptions())]


RANGE_VECTORS = [
    ("7 partitions, 3 members", {"c-b": ["t"], "c-a": ["t"], "c-c": ["t"]}, {"t": 7}),
    ("two topics of 3, two members", {"m2": ["a", "b"], "m1": ["a", "b"]}, {"a": 3, "b": 3}),
    ("more members than partitions", {"z": ["t"], "y": ["t"], "x": ["t"]}, {"t": 2}),
    ("different subscriptions", {"c1": ["a"], "c2": ["a", "b"], "c3": ["b"]}, {"a": 4, "b": 5}),
    ("one member", {"only": ["t", "u"]}, {"t": 4, "u": 1}),
    ("member ids sort as strings", {"consumer-10": ["t"], "consumer-2": ["t"], "consumer-1": ["t"]},
     {"t": 4}),
]


@task("ex08.5", points=6)
@pytest.mark.parametrize("case", RANGE_VECTORS, ids=[c[0] for c in RANGE_VECTORS])
def test_range_assign_vectors(learner, case):
    _, subscriptions, counts = case
    expect_equal(learner.range_assign({m: list(ts) for m, ts in subscriptions.items()}, dict(counts)),
                 _normalize_assignment(engine_range_assign(subscriptions, counts)),
                 call=f"range_assign({subscriptions!r}, {counts!r})",
                 normalize=_normalize_assignment, mistakes=range_mistakes(subscriptions, counts))


MEMBER_IDS = st.text(alphabet="abcz-019", min_size=1, max_size=6)


@task("ex08.5", points=4)
@PROPERTY
@given(st.dictionaries(MEMBER_IDS, st.sets(st.sampled_from(["t0", "t1", "t2"]), min_size=1), min_size=1,
                       max_size=6),
       st.fixed_dictionaries({"t0": st.integers(0, 12), "t1": st.integers(0, 12), "t2": st.integers(0, 12)}))
def test_range_assign_matches_kafka_on_random_groups(learner, subscriptions, counts):
    subscriptions = {m: sorted(ts) for m, ts in subscriptions.items()}
    expect_equal(learner.range_assign({m: list(ts) for m, ts in subscriptions.items()}, dict(counts)),
                 _normalize_assignment(engine_range_assign(subscriptions, counts)),
                 call=f"range_assign({subscriptions!r}, {counts!r})",
                 normalize=_normalize_assignment, mistakes=range_mistakes(subscriptions, counts))

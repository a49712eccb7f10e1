"""Exercise 01 — varints, a record, a batch with its CRC (docs/kafka-storage-notes.md §1).

The learner's functions are compared with kstore's own (`kstore.varint`, `kstore.records`) on the
reference's fixed vectors (§1.6, §1.11) and, with hypothesis, on random inputs.
"""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, strategies as st

from kstore import varint as engine
from kstore.grading.feedback import Mismatch, call_repr, expect_bytes, expect_equal
from kstore.grading.testing import PROPERTY, expect_raises, extra, task
from kstore.records import HEADER_FIELDS, MemoryRecords, Record, build_batch, crc32c
from kstore.records import encode_record as engine_encode_record

T = 1_700_000_000_000
INT32 = st.integers(engine.INT32_MIN, engine.INT32_MAX)
INT64 = st.integers(engine.INT64_MIN, engine.INT64_MAX)
BATCH_FIELDS = [(name, start, size) for name, start, size, _ in HEADER_FIELDS] + [("records", 61, 1 << 40)]


# ------------------------------------------------------------------ known mistakes
def _unsigned(u: int) -> bytes:
    return engine.write_unsigned_varint(u)


def _big_endian_groups(u: int) -> bytes:
    groups = []
    while True:
        groups.append(u & 0x7F)
        u >>= 7
        if not u:
            break
    groups.reverse()
    return bytes([g | 0x80 for g in groups[:-1]] + [groups[-1]])


def varint_mistakes(n: int, bits: int) -> list:
    z = engine.zigzag_encode(n, bits)
    out = [("no zig-zag: the number was written as it is; Kafka maps n to (n << 1) ^ (n >> 31) first",
            _unsigned(n & ((1 << bits) - 1))),
           ("the 7-bit groups are written most significant first; Kafka writes the least "
            "significant group first", _big_endian_groups(z)),
           ("the 'more bytes follow' bit (0x80) is missing", bytes(engine.write_unsigned_varint(z)[i] & 0x7F
                                                                     for i in range(engine.size_of_unsigned_varint(z))))]
    if bits == 32:
        out.append(("64-bit zig-zag (n >> 63) in a 32-bit varint: use n >> 31",
                    _unsigned(engine.zigzag_encode(n, 64))))
    else:
        out.append(("32-bit zig-zag for a varlong: (n << 1) ^ (n >> 31) is the int32 rule; a varlong "
                    "needs (n << 1) ^ (n >> 63), masked to 64 bits",
                    lambda a: a in (_unsigned(((n << 1) ^ (n >> 31)) & 0xFFFFFFFF),
                                    _unsigned(((n << 1) ^ (n >> 31)) & 0xFFFFFFFFFFFFFFFF))))
    return out


VARINT_VECTORS = [(0, "00"), (-1, "01"), (1, "02"), (-2, "03"), (63, "7e"), (-64, "7f"),
                  (64, "8001"), (300, "d804"), (-300, "d704"), (2147483647, "feffffff0f"),
                  (-2147483648, "ffffffff0f")]


# ------------------------------------------------------------------ ex01.1 write_varint
@task("ex01.1", points=5)
@pytest.mark.parametrize("n, hex_", VARINT_VECTORS, ids=[f"n={n}" for n, _ in VARINT_VECTORS])
def test_write_varint_vectors(learner, n, hex_):
    expect_bytes(learner.write_varint(n), bytes.fromhex(hex_), call=f"write_varint({n})",
                 mistakes=varint_mistakes(n, 32))


@task("ex01.1", points=4)
@PROPERTY
@given(INT32)
def test_write_varint_matches_engine(learner, n):
    expect_bytes(learner.write_varint(n), engine.write_varint(n), call=f"write_varint({n})",
                 mistakes=varint_mistakes(n, 32))


@task("ex01.1", points=1)
@extra
@pytest.mark.parametrize("n", [2**31, -(2**31) - 1], ids=["n=2**31", "n=-2**31-1"])
def test_extra_write_varint_rejects_out_of_range(learner, n):
    expect_raises(learner.write_varint, (n,), call=f"write_varint({n})",
                  what="ValueError: an int32 cannot hold this number", exceptions=(ValueError,))


# ------------------------------------------------------------------ ex01.2 read_varint
@task("ex01.2", points=5)
@pytest.mark.parametrize("n, hex_", VARINT_VECTORS, ids=[f"n={n}" for n, _ in VARINT_VECTORS])
def test_read_varint_vectors(learner, n, hex_):
    data = b"\xaa\xbb" + bytes.fromhex(hex_) + b"\x7f\x01"      # the varint sits at position 2
    end = 2 + len(hex_) // 2
    z, _ = engine.read_unsigned_varint(data, 2)
    expect_equal(learner.read_varint(data, 2), (n, end), call=f"read_varint(bytes.fromhex('{data.hex()}'), 2)",
                 mistakes=[("the zig-zag was not undone: decode with (z >> 1) ^ -(z & 1)", (z, end)),
                           ("the position returned is the varint's last byte; return the position "
                            "after it", (n, end - 1)),
                           ("the position returned is relative to `pos`; return an absolute position",
                            (n, end - 2)),
                           ("the position returned is the length of the varint", (n, end - 2))])


@task("ex01.2", points=4)
@PROPERTY
@given(INT32, st.binary(max_size=6), st.binary(max_size=6))
def test_read_varint_round_trips_engine_bytes(learner, n, before, after):
    data = before + engine.write_varint(n) + after
    expected = engine.read_varint(data, len(before))
    expect_equal(learner.read_varint(data, len(before)), expected,
                 call=f"read_varint(bytes.fromhex('{data.hex()}'), {len(before)})")


@task("ex01.2", points=1)
@extra
def test_extra_read_varint_rejects_six_bytes(learner):
    data = bytes.fromhex("ffffffffff01")
    expect_raises(learner.read_varint, (data, 0), call="read_varint(bytes.fromhex('ffffffffff01'), 0)",
                  what="an error: Kafka rejects a varint longer than 5 bytes")


# ------------------------------------------------------------------ ex01.3 write_varlong
VARLONG_VECTORS = [(0, "00"), (-1, "01"), (300, "d804"), (T, None),
                   (2**31, None), (-(2**31) - 1, None), (2**40, None), (-(2**40), None),
                   (2**63 - 1, "feffffffffffffffff01"), (-(2**63), "ffffffffffffffffff01")]
VARLONG_VECTORS = [(n, h or engine.write_varlong(n).hex()) for n, h in VARLONG_VECTORS]


@task("ex01.3", points=5)
@pytest.mark.parametrize("n, hex_", VARLONG_VECTORS, ids=[f"n={n}" for n, _ in VARLONG_VECTORS])
def test_write_varlong_vectors(learner, n, hex_):
    expect_bytes(learner.write_varlong(n), bytes.fromhex(hex_), call=f"write_varlong({n})",
                 mistakes=varint_mistakes(n, 64))


@task("ex01.3", points=5)
@PROPERTY
@given(INT64)
def test_write_varlong_matches_engine(learner, n):
    expect_bytes(learner.write_varlong(n), engine.write_varlong(n), call=f"write_varlong({n})",
                 mistakes=varint_mistakes(n, 64))


# ------------------------------------------------------------------ ex01.4 encode_record
def _record_variant(offset_delta, timestamp_delta, key, value, headers=(), *, length_counts_itself=False,
                    ts_as_varint=False, null_as_zero=False, no_header_count=False) -> bytes:
    def field(b):
        if b is None:
            return b"\x00" if null_as_zero else b"\x01"
        return engine.write_varint(len(b)) + b
    ts = engine.write_varint(timestamp_delta) if ts_as_varint and engine.INT32_MIN <= timestamp_delta <= engine.INT32_MAX \
        else engine.write_varlong(timestamp_delta)
    parts = [b"\x00", ts, engine.write_varint(offset_delta), field(key), field(value)]
    if not no_header_count:
        parts.append(engine.write_varint(len(headers)))
    for hk, hv in headers:
        parts += [field(hk.encode()), field(hv)]
    body = b"".join(parts)
    n = len(body) + (engine.size_of_varint(len(body)) if length_counts_itself else 0)
    return engine.write_varint(n) + body


def record_mistakes(args, kwargs) -> list:
    return [("the length varint counts its own bytes too; it counts only what follows it",
             _record_variant(*args, **kwargs, length_counts_itself=True)),
            ("a null key or value was written as length 0 (00); null is length −1, i.e. 01",
             _record_variant(*args, **kwargs, null_as_zero=True)),
            ("the headers count (a varint, 00 for none) is missing at the end",
             _record_variant(*args, **kwargs, no_header_count=True))]


RECORD_VECTORS = [
    ("k-v", (0, 0, b"k", b"v"), {}, "1000000002 6b 02 76 00"),
    ("header-h-x", (0, 0, b"k", b"v"), {"headers": [("h", b"x")]}, "18 00 00 00 02 6b 02 76 02 02 68 02 78"),
    ("tombstone", (0, 0, b"k", None), {}, "0e 00 00 00 02 6b 01 00"),
    ("null-key", (0, 0, None, b"v"), {}, "0e 00 00 00 01 02 76 00"),
    ("second-record-of-a-batch", (1, 5, b"k2", b"v2"), {}, "14 00 0a 02 04 6b 32 04 76 32 00"),
    ("negative-timestamp-delta", (3, -7, b"", b""), {}, "0c 00 0d 06 00 00 00"),
    ("large-timestamp-delta", (0, 2**40, b"k", b"v"), {}, None),
]


@task("ex01.4", points=6)
@pytest.mark.parametrize("args, kwargs, hex_", [v[1:] for v in RECORD_VECTORS], ids=[v[0] for v in RECORD_VECTORS])
def test_encode_record_vectors(learner, args, kwargs, hex_):
    expected = bytes.fromhex(hex_.replace(" ", "")) if hex_ else engine_encode_record(*args, **kwargs)
    assert expected == engine_encode_record(*args, **kwargs)
    mistakes = record_mistakes(args, kwargs) + [
        ("timestampDelta written as a varint; it is a varlong (64-bit zig-zag)",
         _record_variant(*args, **kwargs, ts_as_varint=True))]
    expect_bytes(learner.encode_record(*args, **kwargs), expected,
                 call=call_repr("encode_record", *args, **kwargs), mistakes=mistakes)


HEADER_KEYS = st.text(alphabet="abc-xyzé✓€😀", max_size=5)
RECORD_ARGS = st.tuples(st.integers(0, 10_000), INT64, st.one_of(st.none(), st.binary(max_size=20)),
                        st.one_of(st.none(), st.binary(max_size=200)),
                        st.lists(st.tuples(HEADER_KEYS, st.one_of(st.none(), st.binary(max_size=8))), max_size=3))


@task("ex01.4", points=4)
@PROPERTY
@given(RECORD_ARGS)
def test_encode_record_matches_engine(learner, args):
    offset_delta, ts_delta, key, value, headers = args
    expected = engine_encode_record(offset_delta, ts_delta, key, value, headers)
    expect_bytes(learner.encode_record(offset_delta, ts_delta, key, value, headers), expected,
                 call=f"encode_record({offset_delta}, {ts_delta}, {key!r}, {value!r}, headers={headers!r})",
                 mistakes=record_mistakes((offset_delta, ts_delta, key, value), {"headers": headers}))


# ------------------------------------------------------------------ ex01.5 encode_batch
def _engine_batch(records, base_offset=0, partition_leader_epoch=-1) -> bytes:
    return build_batch([Record(k, v, ts) for k, v, ts in records], base_offset=base_offset,
                       partition_leader_epoch=partition_leader_epoch)


def batch_mistakes(expected: bytes) -> list:
    def with_crc(crc: int) -> bytes:
        return expected[:17] + crc.to_bytes(4, "big") + expected[21:]

    zeroed = expected[:17] + b"\0\0\0\0" + expected[21:]
    out = []
    for start, label in [(0, "the whole batch (byte 0)"), (12, "bytes 12.. (from the leader epoch)"),
                         (16, "bytes 16.. (from the magic byte)"), (17, "bytes 17.. (from the CRC field)"),
                         (61, "bytes 61.. (the records only)")]:
        crcs = {crc32c(zeroed[start:]), crc32c(expected[start:])} if start <= 17 else {crc32c(expected[start:])}
        out.append((f"the CRC-32C covers {label}; Kafka's covers bytes 21..end (attributes to the end), "
                    f"so the broker can rewrite baseOffset and the leader epoch without recomputing it",
                    lambda a, crcs=crcs: a[:17] == expected[:17] and a[21:] == expected[21:]
                    and int.from_bytes(a[17:21], "big") in crcs))
    out.append(("the checksum is CRC-32 (zlib.crc32); Kafka uses CRC-32C (Castagnoli): crc32c.crc32c",
                lambda a: a[:17] == expected[:17] and a[21:] == expected[21:]
                and int.from_bytes(a[17:21], "big") in {zlib.crc32(expected[s:]) for s in (0, 16, 21)}
                | {zlib.crc32(zeroed[s:]) for s in (0, 16, 17)}))
    out.append(("the CRC field still holds 0: compute it after the rest of the batch is written",
                zeroed))
    size = len(expected)
    wrong_len = expected[:8] + size.to_bytes(4, "big") + expected[12:]
    out.append(("batchLength counts the whole batch; it counts the bytes after the length field "
                "(size − 12)", lambda a: a[:12] == wrong_len[:12] and a[21:] == expected[21:]))
    return out


BATCH_VECTORS = [
    ("reference-1.11", [(b"k", b"v", T)], 0, 0,
     "00000000000000000000003a0000000002e99b8dd80000000000000000018bcfe568000000018bcfe56800ffffffff"
     "ffffffffffffffffffff0000000110000000026b027600"),
    ("two-records-offset-100-epoch-3", [(b"k1", b"v1", T), (b"k2", b"v2", T + 5)], 100, 3,
     "00000000000000640000004700000003026702d0b70000000000010000018bcfe568000000018bcfe56805ffffffff"
     "ffffffffffffffffffff0000000214000000046b310476310014000a02046b3204763200"),
    ("tombstone-no-epoch", [(b"user-1", None, T)], 0, -1, None),
    ("timestamps-out-of-order", [(b"a", b"1", T + 50), (b"b", b"2", T), (b"c", b"3", T + 20)], 7, 2, None),
]


@task("ex01.5", points=6)
@pytest.mark.parametrize("records, base_offset, epoch, hex_", [v[1:] for v in BATCH_VECTORS],
                         ids=[v[0] for v in BATCH_VECTORS])
def test_encode_batch_vectors(learner, records, base_offset, epoch, hex_):
    expected = bytes.fromhex(hex_) if hex_ else _engine_batch(records, base_offset, epoch)
    assert expected == _engine_batch(records, base_offset, epoch)
    expect_bytes(learner.encode_batch(records, base_offset=base_offset, partition_leader_epoch=epoch), expected,
                 call=f"encode_batch({records!r}, base_offset={base_offset}, partition_leader_epoch={epoch})",
                 fields=BATCH_FIELDS, mistakes=batch_mistakes(expected))


BATCH_RECORDS = st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=8)),
                                   st.one_of(st.none(), st.binary(max_size=40)),
                                   st.integers(0, 2**41)), min_size=1, max_size=6)


@task("ex01.5", points=4)
@PROPERTY
@given(BATCH_RECORDS, st.integers(0, 2**40), st.integers(-1, 1000))
def test_encode_batch_matches_engine(learner, records, base_offset, epoch):
    expected = _engine_batch(records, base_offset, epoch)
    expect_bytes(learner.encode_batch(records, base_offset=base_offset, partition_leader_epoch=epoch), expected,
                 call=f"encode_batch({records!r}, base_offset={base_offset}, partition_leader_epoch={epoch})",
                 fields=BATCH_FIELDS, mistakes=batch_mistakes(expected))


@task("ex01.5", points=2)
@extra
def test_extra_kafka_python_and_the_engine_accept_your_batch(learner):
    records = [(b"k1", b"v1", T), (None, b"v2", T + 3), (b"k3", None, T + 1)]
    data = learner.encode_batch(records, base_offset=0, partition_leader_epoch=0)
    if not isinstance(data, (bytes, bytearray)):
        raise Mismatch(f"encode_batch returned {type(data).__name__}, not bytes")
    from kafka.record.default_records import DefaultRecordBatch
    batch = DefaultRecordBatch(bytes(data))
    if not batch.validate_crc():
        raise Mismatch("kafka-python's DefaultRecordBatch rejects the CRC of your batch")
    decoded = [(r.key, r.value, r.timestamp) for r in batch]
    expect_equal(decoded, records, call="decoding your batch with kafka-python")
    mem = MemoryRecords(bytes(data)).batches()
    if len(mem) != 1:
        raise Mismatch(f"kstore sees {len(mem)} batches in your bytes, not 1")
    mem[0].ensure_valid()
    expect_equal([(r.key, r.value, r.timestamp) for r in mem[0].records()], records,
                 call="decoding your batch with kstore")

"""The native codec (kstore/_codec.c) against the pure-Python reference (kstore/records.py).

Differential property tests: the same inputs go to every function the C code mirrors
(encode_records, decode_records, decode_keys, validate_records, RecordBatch.validate). Where the reference returns, the native
function returns the same value (same bytes, equal records); where the reference raises, the
native function returns None so the engine re-runs the reference and the user sees the reference's
exception and message (checked through RecordBatch on both paths). A subprocess with
KSTORE_PURE_PYTHON=1 must run the pure path and get the same results.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from kstore import native, records, varint
from kstore.errors import KStoreError
from kstore.grading import live
from kstore.records import NO_SEQUENCE, RECORDS_OFFSET, Record, RecordBatch, build_batch

CI = os.environ.get("CI") == "true"
EXAMPLES = int(os.environ.get("KSTORE_HYPOTHESIS_EXAMPLES", "60"))
SETTINGS = settings(deadline=None, max_examples=EXAMPLES * 3, derandomize=CI,
                    database=None if CI else settings.default.database,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

if native.codec is None:  # pragma: no cover - CI builds it (make test installs with pip -e)
    if os.environ.get("KSTORE_PURE_PYTHON", "").strip() not in ("", "0"):
        pytest.skip("KSTORE_PURE_PYTHON is set: the native codec is not loaded",
                    allow_module_level=True)
    MISSING = (f"the native codec is not built ({native.description}); add a C compiler and "
               f"Python's headers, then: apt-get install gcc python3-dev && .venv/bin/pip install -e .")
    if CI:
        pytest.fail(MISSING, pytrace=False)
    pytest.skip(MISSING, allow_module_level=True)

C = native.codec

payload = st.none() | st.binary(max_size=200)
header_key = st.text(max_size=10) | st.binary(max_size=10)
headers = st.lists(st.tuples(header_key, payload), max_size=4).map(tuple)
timestamps = st.integers(-(1 << 62), 1 << 62) | st.sampled_from([0, -1, 1_700_000_000_000])
a_record = st.builds(Record, key=payload, value=payload, timestamp=timestamps, headers=headers)


def outcome(fn, *args):
    """('ok', value) or ('error', exception type name, message)."""
    try:
        return ("ok", fn(*args))
    except (KStoreError, ValueError, TypeError, UnicodeError) as e:
        return ("error", type(e).__name__, str(e))


# ------------------------------------------------------------------------------ encode
@SETTINGS
@given(st.lists(a_record, max_size=30), st.integers(0, 1 << 40))
def test_encode_records_same_bytes(recs, base_offset):
    base_ts = recs[0].timestamp if recs else -1
    expected = outcome(records.encode_records, recs, None, base_offset, base_ts)
    got = C.encode_records(recs, None, base_offset, base_ts)
    if expected[0] == "ok":
        assert got == expected[1]
    else:
        assert got is None


@SETTINGS
@given(st.lists(st.tuples(a_record, st.integers(0, 1 << 33)), min_size=1, max_size=20),
       st.integers(0, 1 << 33))
def test_encode_records_with_gaps_in_offsets(pairs, base_offset):
    recs = [r for r, _ in pairs]
    offsets = sorted(o for _, o in pairs)
    expected = outcome(records.encode_records, recs, offsets, base_offset, recs[0].timestamp)
    got = C.encode_records(recs, offsets, base_offset, recs[0].timestamp)
    if expected[0] == "ok":
        assert got == expected[1]
    else:  # an offset delta outside int32: the reference raises, the native code defers to it
        assert got is None


odd_value = st.sampled_from(["text", 12, memoryview(b"mv"), bytearray(b"ba"), None, b"ok"])
odd_header = st.sampled_from([(None, b"v"), ("\ud800", b"v"), ("k",), ("k", "str"), ["k", b"v"],
                              (b"k", bytearray(b"v")), ("ключ", None)])


@SETTINGS
@given(odd_value, odd_value, st.lists(odd_header, max_size=3),
       st.integers(-(1 << 64), 1 << 64) | st.none())
def test_encode_records_odd_inputs_match_or_defer(key, value, hdrs, ts):
    rec = Record(key, value, ts, tuple(hdrs))
    expected = outcome(records.encode_records, [rec], None, 0, 0)
    got = C.encode_records([rec], None, 0, 0)
    if got is not None:
        assert expected == ("ok", got)


def test_engine_reports_the_references_error_for_bad_records():
    with pytest.raises(KStoreError, match="a record header key must not be null"):
        build_batch([Record(b"k", b"v", 1, ((None, b"x"),))])
    with pytest.raises(ValueError, match="varint out of int32 range"):
        build_batch([Record(b"k", b"v", 1)] * 2, offsets=[0, 1 << 40])


# ------------------------------------------------------------------------------ decode / validate
def section(recs, base_offset=0):
    """(records section, base timestamp) of a producer batch of recs."""
    batch = RecordBatch(build_batch(recs, base_offset=base_offset))
    return bytes(batch.buffer[RECORDS_OFFSET:]), batch.base_timestamp


def drawn_section(recs):
    """`section` of drawn records (in a hypothesis test): a batch whose timestamp deltas do not
    fit a varlong (e.g. -2^62 and 2^62 together) cannot be built, so it is not an example."""
    assume(all(-(1 << 63) <= r.timestamp - recs[0].timestamp < (1 << 63) for r in recs))
    return section(recs)


def compare(name, *args, native_extra=()):
    """Reference and native function `name` on the same input: the same value, or None from the
    native one where the reference raises."""
    expected = outcome(getattr(records, name), *args)
    got = getattr(C, name)(*args, *native_extra)
    if expected[0] == "ok":
        assert got == expected[1]
    else:
        assert got is None, expected
    return got


def compare_decode(data, base_offset, base_ts, lat, base_seq, count):
    got = compare("decode_records", data, base_offset, base_ts, lat, base_seq, count,
                  native_extra=(Record,))
    assert got is None or all(type(r) is Record for r in got)


def compare_keys(data, base_offset, count):
    compare("decode_keys", data, base_offset, count)


def compare_validate(data, base_offset, count):
    compare("validate_records", data, base_offset, count)


@SETTINGS
@given(st.lists(a_record, min_size=1, max_size=20), st.integers(0, 1 << 40),
       st.none() | st.integers(0, 1 << 41), st.sampled_from([NO_SEQUENCE, 0, 7, (1 << 31) - 3]))
def test_decode_and_validate_well_formed(recs, base_offset, lat, base_seq):
    data, base_ts = drawn_section(recs)
    compare_decode(data, base_offset, base_ts, lat, base_seq, len(recs))
    compare_validate(data, base_offset, len(recs))
    compare_keys(data, base_offset, len(recs))
    assert C.decode_records(memoryview(bytearray(data)), base_offset, base_ts, lat, base_seq,
                            len(recs), Record) == records.decode_records(
        data, base_offset, base_ts, lat, base_seq, len(recs))


@st.composite
def damaged(draw):
    """A valid records section, then damaged: truncated, bytes changed, bytes inserted, or a
    wrong record count."""
    recs = draw(st.lists(a_record, min_size=1, max_size=6))
    data, base_ts = drawn_section(recs)
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["truncate", "set", "insert", "delete"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "truncate":
            del data[at:]
        elif kind == "set" and data:
            data[at] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, 0xFE, 0x02]))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=6))
        elif data:
            del data[at]
    count = len(recs) + draw(st.sampled_from([0, 0, 0, -1, 1, 1000]))
    return bytes(data), base_ts, max(count, 0)


@SETTINGS
@given(damaged(), st.none() | st.just(5), st.sampled_from([NO_SEQUENCE, 3]))
@example(data=(b"", 0, 1), lat=None, base_seq=NO_SEQUENCE)
@example(data=(b"\xff\xff\xff\xff\xff\x01", 0, 1), lat=None, base_seq=NO_SEQUENCE)
@example(data=(b"\x02\x00\x00", 0, 1), lat=None, base_seq=NO_SEQUENCE)
def test_decode_and_validate_damaged(data, lat, base_seq):
    raw, base_ts, count = data
    compare_decode(raw, 10, base_ts, lat, base_seq, count)
    compare_validate(raw, 10, count)
    compare_keys(raw, 10, count)


@SETTINGS
@given(st.binary(max_size=80), st.integers(0, 5))
def test_decode_and_validate_random_bytes(raw, count):
    compare_decode(raw, 0, 0, None, NO_SEQUENCE, count)
    compare_validate(raw, 0, count)
    compare_keys(raw, 0, count)


# ------------------------------------------------------------------------------ validate_batch
def reference_validate(raw):
    """What RecordBatch.validate answers on the reference path: ensure_valid, then
    validate_records; its null-key flag, or the exception."""
    def run():
        batch = RecordBatch(raw)
        batch.ensure_valid()
        return batch.validate_records()[1]
    return outcome(run)


def compare_validate_batch(raw):
    """validate_batch (the CRC through the reference's crc32c) against the reference: the same
    flag, or None where the reference raises."""
    expected = reference_validate(raw)
    got = C.validate_batch(raw, records.crc32c)
    if expected[0] == "ok":
        assert got is expected[1]
    else:
        assert got is None, expected
    return got


@st.composite
def damaged_batch(draw):
    """A whole producer batch (header and records), then damaged anywhere: bytes changed
    (inside the CRC's range or not), truncated, or grown."""
    recs = draw(st.lists(a_record, min_size=1, max_size=6))
    drawn_section(recs)   # only batches that can be built
    raw = bytearray(build_batch(recs))
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(["set", "set", "truncate", "append"]))
        at = draw(st.integers(0, max(len(raw) - 1, 0)))
        if kind == "set" and raw:
            raw[at] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del raw[at:]
        else:
            raw += draw(st.binary(min_size=1, max_size=8))
    if draw(st.booleans()) and len(raw) >= records.RECORD_BATCH_OVERHEAD:
        # Sealed again: the CRC matches the damage, so the records' walk has to catch it.
        struct.pack_into(">I", raw, records.CRC_OFFSET,
                         records.crc32c(bytes(raw[records.ATTRIBUTES_OFFSET:])))
    return bytes(raw)


@SETTINGS
@given(st.lists(a_record, min_size=1, max_size=20))
def test_validate_batch_well_formed(recs):
    drawn_section(recs)
    raw = build_batch(recs)
    for buffer in (raw, bytearray(raw), memoryview(bytearray(raw))):
        assert compare_validate_batch(buffer) is (RecordBatch(raw).validate_records()[1])
    assert RecordBatch(raw).validate() is any(r.key is None for r in recs)


@SETTINGS
@given(damaged_batch())
@example(raw=b"")
@example(raw=b"\x00" * 61)
def test_validate_batch_damaged(raw):
    compare_validate_batch(raw)
    # The engine's RecordBatch.validate raises the reference's exception and message.
    expected = reference_validate(raw)
    if expected[0] == "error" and len(raw) >= records.RECORD_BATCH_OVERHEAD:
        assert outcome(RecordBatch(raw).validate) == expected


def test_validate_batch_defers_compressed_batches_and_uses_the_crc_it_is_given():
    recs = [Record(b"k%d" % i, b"v" * 50, 1000 + i) for i in range(20)]
    gzipped = build_batch(recs, compression=records.Compression.GZIP)
    assert C.validate_batch(gzipped, records.crc32c) is None   # the reference decompresses
    assert RecordBatch(gzipped).validate() is False
    plain = build_batch(recs)
    assert C.validate_batch(plain, records.crc32c) is False
    assert C.validate_batch(plain, lambda data: 0) is None     # a CRC that does not match
    with pytest.raises(ZeroDivisionError):                     # the CRC function's error
        C.validate_batch(plain, lambda data: 1 // 0)


def test_varint_limits_defer_to_the_reference():
    # An 11th varlong byte, a 6th varint byte, and a varint above 32 bits: the reference's errors.
    for raw in (b"\x10\x00" + b"\xff" * 9 + b"\x7f", b"\x10\x00\x00" + b"\xff" * 5 + b"\x01",
                b"\xff\xff\xff\xff\x7f"):
        compare_decode(raw, 0, 0, None, NO_SEQUENCE, 1)
        compare_validate(raw, 0, 1)
        compare_keys(raw, 0, 1)


def test_overflowing_timestamps_and_offsets_give_the_references_big_ints():
    data, _ = section([Record(b"k", b"v", 0), Record(b"k", b"v", 10)])
    top = (1 << 63) - 1
    # base + delta overflows int64 in C (timestamp, then offset); the reference gives Python ints.
    assert C.decode_records(data, 0, top, None, -1, 2, Record) is None
    assert C.decode_records(data, top, 0, None, -1, 2, Record) is None
    assert C.decode_keys(data, top, 2) is None
    assert records.decode_records(data, 0, top, None, -1, 2)[1].timestamp == top + 10
    assert records.decode_records(data, top, 0, None, -1, 2)[1].offset == top + 1


# ------------------------------------------------------------------------------ engine wiring
def test_a_plugged_in_learner_function_switches_the_engine_to_the_reference():
    assert records.native_codec() is C
    calls, reference_encode_record = [], records.encode_record

    def learner_encode_record(*args):
        calls.append(args)
        return reference_encode_record(*args)

    with live.plug(live.Patch(records, "encode_record", learner_encode_record)):
        assert records.native_codec() is None
        build_batch([Record(b"k", b"v", 5)])
    assert len(calls) == 1
    reference_read_varint = varint.read_varint
    with live.plug(live.Patch(varint, "read_varint", lambda buf, pos: reference_read_varint(buf, pos))):
        assert records.native_codec() is None
    assert records.native_codec() is C


SCRIPT = r"""
import json, sys
from kstore import native, records
from kstore.records import Record, RecordBatch, build_batch
out = {"codec": native.description, "results": []}
recs = [Record(b"k%d" % i, b"v" * i, 1000 + i, (("h", b"x"),) if i % 2 else ()) for i in range(50)]
good = build_batch(recs, base_offset=0)
cases = [good, good[:-3], good[:70] + b"\xff" + good[71:], good[:61] + b"\x00" + good[62:]]
for raw in cases:
    batch = RecordBatch(raw)
    row = []
    for call in (batch.validate_records, batch.validate, batch.keys_and_offsets, lambda: [tuple(r.__getattribute__(f) for f in
                 ("key", "value", "timestamp", "headers", "offset", "sequence")) for r in batch.records()]):
        try:
            row.append(["ok", repr(call())])
        except Exception as e:
            row.append(["error", type(e).__name__, str(e)])
    out["results"].append(row)
out["build"] = build_batch(recs, base_offset=7).hex()
print(json.dumps(out))
"""


def run_script(pure: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "KSTORE_PURE_PYTHON"}
    if pure:
        env["KSTORE_PURE_PYTHON"] = "1"
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                          timeout=120, check=True)
    return json.loads(proc.stdout)


def test_kstore_pure_python_forces_the_pure_path_with_the_same_results():
    pure, fast = run_script(pure=True), run_script(pure=False)
    assert pure["codec"].startswith("pure Python (KSTORE_PURE_PYTHON")
    assert fast["codec"].startswith("native")
    assert pure["results"] == fast["results"]
    assert pure["build"] == fast["build"]
    kinds = [cell[0] for row in fast["results"] for cell in row]
    assert "ok" in kinds and "error" in kinds  # both the valid and the damaged cases ran


def test_log_append_and_read_through_the_native_codec(tmp_path):
    from kstore import Log
    log = Log.open(str(tmp_path / "t-0"))
    recs = [Record(b"k%d" % i, b"v" * 100, 1000 + i, (("h", b"x"),)) for i in range(200)]
    log.append_as_leader(build_batch(recs[:100]))
    log.append_as_leader(build_batch(recs[100:]), leader_epoch=3)
    got = log.records()
    assert [(r.key, r.value, r.headers, r.offset) for r in got] == \
        [(r.key, r.value, r.headers, i) for i, r in enumerate(recs)]
    assert [b.partition_leader_epoch for s in log.segments for b in s.log.batches()] == [0, 3]
    log.close()


@pytest.mark.parametrize("lat", [None, 123])
def test_log_append_time_and_sequences(lat):
    data, base_ts = section([Record(b"a", b"b", 50), Record(None, b"c", 60)])
    for seq in (NO_SEQUENCE, (1 << 31) - 1):
        assert C.decode_records(data, 0, base_ts, lat, seq, 2, Record) == \
            records.decode_records(data, 0, base_ts, lat, seq, 2)
    assert C.validate_records(data, 0, 2) == (2, True)


def test_engine_tests_pass_on_the_pure_python_path():
    """The record, log and segment tests again, in a process running the pure-Python codec (the
    rest of this suite runs the native one wherever it is built)."""
    env = {**os.environ, "KSTORE_PURE_PYTHON": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=",
         "tests/test_records.py", "tests/test_log.py", "tests/test_segment.py"],
        capture_output=True, text=True, env=env, timeout=600,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout


def test_without_the_extension_kstore_warns_once_and_runs_the_pure_path():
    script = ("import sys, warnings\n"
              "sys.modules['kstore._codec'] = None   # as on a machine without a compiler\n"
              "with warnings.catch_warnings(record=True) as caught:\n"
              "    warnings.simplefilter('always')\n"
              "    from kstore import native, records\n"
              "    import kstore.log, kstore.cleaner\n"
              "print(native.codec, records.native_codec(), len(caught))\n"
              "print(caught[0].message)\n"
              "print(records.RecordBatch(records.build_batch([records.Record(b'k', b'v', 1)]))"
              ".validate_records())\n")
    env = {k: v for k, v in os.environ.items() if k != "KSTORE_PURE_PYTHON"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout.splitlines()
    assert out[0] == "None None 1"
    assert out[1].startswith("kstore: pure Python (the native codec is not built")
    assert out[2] == "(1, False)"

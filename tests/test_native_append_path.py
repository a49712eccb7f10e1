"""The native functions of the produce path (issue 17b) against their pure-Python references.

Differential property tests, as tests/test_native_codec.py does for the record codec: the same
inputs go to the C function and to the Python reference it mirrors; where the reference returns,
the C function returns the same value; where the reference raises (or takes a type the C code does
not handle), the C function returns None and the engine calls the reference, which raises its own
error. The engine's dispatchers must still run a learner's function once it is plugged in.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_native_codec import SETTINGS, C, outcome  # its module-level skip applies here too

from kstore import native, records
from kstore.errors import KStoreError
from kstore.grading import live

payload = st.none() | st.binary(max_size=300) | st.binary(max_size=300).map(bytearray)
header_key = st.text(max_size=10) | st.binary(max_size=10)
headers = st.lists(st.tuples(header_key, payload), max_size=4)
deltas = (st.integers(-(1 << 63), (1 << 63) - 1) | st.integers(-(1 << 70), 1 << 70)
          | st.sampled_from([0, 1, -1, 63, 64, 8191, 8192, (1 << 31) - 1, 1 << 31, -(1 << 31)]))
odd_value = st.sampled_from(["text", 12, memoryview(b"mv"), None, b"ok", bytearray(b"ba")])
odd_header = st.sampled_from([(None, b"v"), ("\ud800", b"v"), ("k",), ("k", "str"), ["k", b"v"],
                              (b"k", bytearray(b"v")), ("ключ", None), (b"k", None)])


@SETTINGS
@given(deltas, deltas, payload, payload, headers.map(tuple) | headers)
def test_record_size_in_bytes_same_size(offset_delta, timestamp_delta, key, value, hdrs):
    expected = outcome(records.record_size_in_bytes, offset_delta, timestamp_delta, key, value, hdrs)
    got = C.record_size_in_bytes(offset_delta, timestamp_delta, key, value, hdrs)
    if got is None:   # out of the C range (a delta beyond 64 bits): the reference answers
        assert abs(offset_delta) >= 1 << 63 or abs(timestamp_delta) >= 1 << 63
    else:
        assert expected == ("ok", got)


@SETTINGS
@given(st.integers(0, 1 << 20), st.integers(-(1 << 40), 1 << 40), payload, payload,
       headers.map(tuple))
def test_record_size_is_the_length_of_the_encoded_record(offset_delta, timestamp_delta, key, value, hdrs):
    """What the reference promises (len(encode_record(...))) holds for the C mirror too."""
    offset_delta %= 1 << 31
    key = None if key is None else bytes(key)
    value = None if value is None else bytes(value)
    hdrs = tuple((k, None if v is None else bytes(v)) for k, v in hdrs)
    encoded = records.encode_record(offset_delta, timestamp_delta, key, value, hdrs)
    assert C.record_size_in_bytes(offset_delta, timestamp_delta, key, value, hdrs) == len(encoded)


@SETTINGS
@given(odd_value, odd_value, st.lists(odd_header, max_size=3).map(tuple))
def test_record_size_odd_inputs_match_or_defer(key, value, hdrs):
    expected = outcome(records.record_size_in_bytes, 0, 0, key, value, hdrs)
    got = C.record_size_in_bytes(0, 0, key, value, hdrs)
    if got is not None:
        assert expected == ("ok", got)
    # The dispatcher the producer calls answers exactly as the reference does, errors included.
    assert outcome(records.sized_record, key, value, hdrs) == expected


def test_sized_record_runs_a_plugged_in_learner_function_and_the_pure_path():
    calls, reference = [], records.record_size_in_bytes

    def learner_record_size(*args):
        calls.append(args)
        return reference(*args)

    assert records.sized_record(None, b"x" * 100) == 109
    with live.plug(live.Patch(records, "record_size_in_bytes", learner_record_size)):
        assert records.sized_record(b"k", b"v", (("h", b"1"),)) == reference(0, 0, b"k", b"v", (("h", b"1"),))
        assert records.native_codec() is None
    assert len(calls) == 1
    with native.pure_python():
        assert records.sized_record(None, b"x" * 100) == 109
    with pytest.raises(KStoreError, match="a record header key must not be null"):
        records.sized_record(b"k", b"v", ((None, b"x"),))

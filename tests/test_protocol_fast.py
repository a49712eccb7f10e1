"""kstore.protocol's compiled codec (the fast path) checked against its interpretive reference.

`_decode` / `_encode` / `decode_request_header` first run functions compiled from the schemas
(`_compiled_decoder`, `_compiled_encoder`); on anything unusual those miss and the reference
(`_decode_struct`, `_encode_struct`) runs again from the start. Three ways to run the codec:

* `reference_only()`: every compiled function misses at once, so only the reference runs;
* `fast_only()`: the reference raises if called, so a result proves the compiled code made it;
* neither: what the broker runs.

For every message in SCHEMAS, every version, requests and responses, hypothesis builds valid
bodies from the schema and checks that the fast path alone gives what the reference gives (same
bytes and chunks; same dicts, key order and value types). Then it mutates the frames (every
truncation, flipped bytes, junk appended) and the bodies (wrong types, unknown keys, ints out of
range, nulls where not allowed, ...): the normal path must return or raise exactly what the
reference alone returns or raises.
"""

from __future__ import annotations

import enum
import os
from collections import OrderedDict
from contextlib import contextmanager
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kstore import protocol as p

# 218 message versions: a few examples each by default (KSTORE_HYPOTHESIS_EXAMPLES as elsewhere)
EXAMPLES = max(4, int(os.environ.get("KSTORE_HYPOTHESIS_EXAMPLES", "60")) // 5)
CI = os.environ.get("CI") == "true"
SETTINGS = settings(deadline=None, max_examples=EXAMPLES, derandomize=CI,
                    database=None if CI else settings.default.database,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

CASES = [pytest.param(message, version, id=f"{message.name}-v{version}")
         for message in p.SCHEMAS.values()
         for version in range(message.versions[0], message.versions[1] + 1)]


# ---- the three ways to run the codec ----

def _always_miss(*args):
    raise p._Miss


@contextmanager
def reference_only():
    """Every compiled function misses: the interpretive reference does all the work."""
    with mock.patch.object(p, "_compiled_decoder", lambda fields, version: _always_miss), \
         mock.patch.object(p, "_compiled_encoder", lambda fields, version: _always_miss):
        yield


def _reference_called(*args, **kwargs):
    raise AssertionError("the reference codec ran: the compiled one missed")


@contextmanager
def fast_only():
    """The reference raises if it is reached: what comes out was made by the compiled codec."""
    with mock.patch.object(p, "_decode_struct", _reference_called), \
         mock.patch.object(p, "_encode_struct", _reference_called), \
         mock.patch.object(p, "_decode_value", _reference_called), \
         mock.patch.object(p, "_encode_value", _reference_called):
        yield


# ---- comparing results exactly ----

class FakeSlice:
    """A file slice as encode_response sees one: an object with an int `.size`."""

    def __init__(self, data: bytes, size: object = None):
        self.data = data
        self.size = len(data) if size is None else size

    def __repr__(self):
        return f"FakeSlice({self.data!r}, size={self.size!r})"


class IndexLike:
    """Not an int, though struct.pack takes it (as numpy integers): the reference refuses it."""

    def __index__(self):
        return 1


class Code(enum.IntEnum):   # an int subclass: the reference takes it
    SEVEN = 7


def typed(value):
    """`value` with every type spelled out: dicts compare with their key order, a memoryview by
    the buffer it views and its bytes, a slice by identity (`==` would hide all three)."""
    if isinstance(value, dict):
        return ("dict", [(k, typed(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [typed(v) for v in value])
    if isinstance(value, memoryview):
        return ("memoryview", id(value.obj), value.tobytes())
    if isinstance(value, p.RequestHeader):
        return ("RequestHeader", typed(vars(value)))
    if isinstance(value, FakeSlice):
        return ("slice", id(value))
    return (type(value), value)


def outcome(function, *args):
    """What calling `function` gives: its typed result, or its exception's type and message."""
    try:
        return ("returned", typed(function(*args)))
    except Exception as e:  # noqa: BLE001 - any exception must be the reference's, to the letter
        return ("raised", type(e), str(e))


def decode_request_frame(frame):
    header = p.decode_request_header(frame)
    return header, p.decode_request(header.api_key, header.api_version, frame, header.size)


# ---- valid bodies, generated from the schema ----

INT_RANGES = {"int8": (-2**7, 2**7 - 1), "int16": (-2**15, 2**15 - 1), "int32": (-2**31, 2**31 - 1),
              "int64": (-2**63, 2**63 - 1), "uint16": (0, 2**16 - 1)}


def primitive(type_: str, nullable: bool, kind: str):
    if type_ in INT_RANGES:   # bools and IntEnums are ints to the reference too
        values = st.integers(*INT_RANGES[type_]) | st.booleans() | st.just(Code.SEVEN)
    elif type_ == "bool":
        values = st.booleans() | st.integers(-3, 3)
    elif type_ == "string":
        values = st.text(max_size=6)
    elif type_ == "bytes":
        values = st.binary(max_size=8) | st.binary(max_size=8).map(bytearray)
    else:   # records: bytes, other buffers, and in a response a file slice
        values = (st.binary(max_size=12) | st.binary(max_size=12).map(bytearray)
                  | st.binary(max_size=12).map(memoryview))
        if kind == "response":
            values |= st.binary(max_size=12).map(FakeSlice)
    return st.none() | values if nullable else values


def body_of(fields: tuple[p.Field, ...], version: int, kind: str):
    """A dict for these fields at `version`: every field of the version, or some (the others at
    their defaults), plus keys of other versions (which the encoder ignores)."""
    present, others = {}, {}
    for field in fields:
        if not field.in_version(version):
            others[field.name] = st.none() | st.integers(0, 3)
            continue
        nullable = field.nullable_in(version)
        if not field.is_array:
            present[field.name] = primitive(field.type, nullable, kind)
            continue
        element = (body_of(field.fields, version, kind) if field.element_type is None
                   else primitive(field.element_type, False, kind))
        array = st.lists(element, max_size=3)
        array = array | array.map(tuple)
        present[field.name] = st.none() | array if nullable else array
    return (st.fixed_dictionaries(present)
            | st.fixed_dictionaries({}, optional={**present, **others}))


def materialize(chunks) -> bytes:
    """The bytes a response's chunks stand for, with each slice's data in its place."""
    return b"".join(c.data if isinstance(c, FakeSlice) else c for c in chunks)


# ---- invalid bodies: one value of a valid body made wrong ----

WRONG_VALUES = [1.5, "7", b"7", None, [], {}, (), object(), IndexLike(), 2**70, -2**70, -1, True,
                "\ud800", "x" * 40000, [1.5], ["a", None], [{}], {"nope": 1}, FakeSlice(b"abc"),
                FakeSlice(b"", size=0), FakeSlice(b"abc", size=-1), FakeSlice(b"abc", size=True),
                FakeSlice(b"abc", size=2**31), FakeSlice(b"abc", size=3.0), iter([]), {1, 2},
                [IndexLike()], [2**40], [True, Code.SEVEN], ["x" * 40000], [b"7"]]


def structs_in(body, fields):
    """Every (dict, its fields) in a body, the body first, then those in arrays of structs."""
    found = [(body, fields)]
    for field in fields:
        value = body.get(field.name)
        if field.fields and isinstance(value, (list, tuple)):
            for element in value:
                found += structs_in(element, field.fields)
    return found


@st.composite
def broken(draw, message: p.Message, version: int, kind: str):
    body = draw(body_of(message.fields, version, kind))
    structs = structs_in(body, message.fields)
    target, fields = structs[draw(st.integers(0, len(structs) - 1))]
    how = draw(st.sampled_from(["wrong value", "unknown key", "missing key", "not a dict"]))
    if how == "unknown key":
        target["no_such_field"] = 1
    elif how == "missing key" and target:
        del target[draw(st.sampled_from(sorted(target)))]
    elif how == "not a dict" and fields:
        field = draw(st.sampled_from(fields))
        if field.fields:
            target[field.name] = [draw(st.sampled_from([None, 1, "x", [1], mock.sentinel.x]))]
    elif fields:
        target[draw(st.sampled_from(fields)).name] = draw(st.sampled_from(WRONG_VALUES))
    return body


# ---- encode and decode: the fast path alone gives the reference's result ----

def encode(message: p.Message, version: int, body: dict, correlation_id=7, client_id="client"):
    if message.kind == "request":
        return p.encode_request(message.api_key, version, correlation_id, client_id, body)
    return p.encode_response(message.api_key, version, correlation_id, body)


@pytest.mark.parametrize("message, version", CASES)
@SETTINGS
@given(data=st.data())
def test_the_compiled_codec_alone_matches_the_reference(message, version, data):
    body = data.draw(body_of(message.fields, version, message.kind))
    with reference_only():
        expected = encode(message, version, body)
    with fast_only():
        encoded = encode(message, version, body)
    assert typed(encoded) == typed(expected)

    if message.kind == "request":
        for frame in (bytes(encoded), bytearray(encoded), memoryview(bytes(encoded))):
            with reference_only():
                expected = outcome(decode_request_frame, frame)
            with fast_only():
                assert outcome(decode_request_frame, frame) == expected
            assert expected[0] == "returned"
    else:
        frame = materialize(encoded)
        for buffer in (frame, bytearray(frame)):
            with reference_only():
                expected = outcome(p.decode_response, message.api_key, version, buffer)
            with fast_only():
                assert outcome(p.decode_response, message.api_key, version, buffer) == expected
            assert expected[0] == "returned"


# ---- malformed frames: the same result or the same error, message included ----

def both_agree(function, *args):
    with reference_only():
        expected = outcome(function, *args)
    assert outcome(function, *args) == expected, args
    return expected


def mutations(frame: bytes, data) -> list[bytes]:
    """Every truncation; a null (-1) and a too-large length as int16 and as int32 at every byte;
    some flipped bytes (lengths, counts, UTF-8...); junk after the end."""
    found = [frame[:end] for end in range(len(frame))]
    for at in range(len(frame)):
        for length in (b"\xff\xff", b"\xff\xff\xff\xff", b"\x00\x07", b"\x00\x00\x00\x07"):
            found.append(frame[:at] + length + frame[at + len(length):])
    for _ in range(6):
        if not frame:
            break
        at = data.draw(st.integers(0, len(frame) - 1))
        flip = data.draw(st.sampled_from([0xFF, 0x80, 0x01, 0x7F]) | st.integers(1, 255))
        found.append(frame[:at] + bytes([frame[at] ^ flip]) + frame[at + 1:])
    found.append(frame + b"\x00")
    found.append(frame + data.draw(st.binary(min_size=1, max_size=6)))
    return found


@pytest.mark.parametrize("message, version", CASES)
@SETTINGS
@given(data=st.data())
def test_malformed_frames_get_the_reference_answer(message, version, data):
    body = data.draw(body_of(message.fields, version, message.kind))
    frame = materialize(encode(message, version, body)) if message.kind == "response" else \
        encode(message, version, body)
    for mutated in mutations(frame, data):
        if message.kind == "request":
            both_agree(decode_request_frame, bytearray(mutated))
            both_agree(decode_request_frame, mutated)
        else:
            both_agree(p.decode_response, message.api_key, version, mutated)


@pytest.mark.parametrize("message, version", CASES)
@SETTINGS
@given(data=st.data())
def test_invalid_bodies_get_the_reference_error(message, version, data):
    body = data.draw(broken(message, version, message.kind))
    correlation_id = data.draw(st.sampled_from([7, 2**31, -2**31 - 1, 1.0, True, None]))
    client_id = data.draw(st.sampled_from(["client", None, b"client", 3, "\ud800"]))
    both_agree(encode, message, version, body, correlation_id, client_id)


def full_body(fields: tuple[p.Field, ...], version: int) -> dict:
    """Every field of the version set, every array with one element: a value everywhere."""
    sample = {"bool": True, "string": "s", "bytes": b"b", "records": b"r"}
    body = {}
    for field in fields:
        if not field.in_version(version):
            continue
        if field.element_type is not None:
            body[field.name] = [sample.get(field.element_type, 1)]
        elif field.is_array:
            body[field.name] = [full_body(field.fields, version)]
        else:
            body[field.name] = sample.get(field.type, 1)
    return body


@pytest.mark.parametrize("message, version", CASES)
def test_every_wrong_value_in_every_field_gets_the_reference_error(message, version):
    """Exhaustive where the property test samples: each wrong value in each field of each struct."""
    struct_count = len(structs_in(full_body(message.fields, version), message.fields))
    for which in range(struct_count):
        for field in structs_in(full_body(message.fields, version), message.fields)[which][1]:
            for wrong in WRONG_VALUES:
                body = full_body(message.fields, version)
                structs_in(body, message.fields)[which][0][field.name] = wrong
                both_agree(encode, message, version, body)


# ---- the compiled path is taken, and misses reach the reference ----

FETCH = p.API_KEYS["Fetch"]
FETCH_BODY = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 20000,
              "topics": [{"topic": "bench", "partitions": [
                  {"partition": 0, "fetch_offset": 45000, "partition_max_bytes": 20000}]}]}


def fetch_response(records) -> dict:
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [
        {"topic": "bench", "partitions": [
            {"partition_index": 0, "error_code": 0, "high_watermark": 50000,
             "last_stable_offset": 50000, "log_start_offset": 0, "aborted_transactions": None,
             "preferred_read_replica": -1, "records": records}]}]}


def test_valid_input_never_reaches_the_reference():
    """With the reference disabled, the broker's hot requests still encode and decode."""
    with reference_only():
        frame = bytearray(p.encode_request(FETCH, 11, 3, "bench", FETCH_BODY))
        produce = {"transactional_id": None, "acks": -1, "timeout_ms": 30000, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": b"x" * 100}]}]}
        produce_frame = bytearray(p.encode_request(0, 3, 4, "bench", produce))
        response_chunks = p.encode_response(FETCH, 11, 3, fetch_response(b"x"))
    records = FakeSlice(b"y" * 10)
    with fast_only():
        header = p.decode_request_header(frame)
        assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == \
            (FETCH, 11, 3, "bench")
        assert p.decode_request(FETCH, 11, frame, header.size)["topics"] == [
            {"topic": "bench", "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 45000,
                 "log_start_offset": -1, "partition_max_bytes": 20000}]}]
        decoded = p.decode_request(0, 3, produce_frame, p.decode_request_header(produce_frame).size)
        view = decoded["topic_data"][0]["partition_data"][0]["records"]
        assert isinstance(view, memoryview) and view.obj is produce_frame and view == b"x" * 100
        assert bytes(p.encode_request(FETCH, 11, 3, "bench", FETCH_BODY)) == frame
        assert p.encode_response(FETCH, 11, 3, fetch_response(b"x")) == response_chunks
        chunks = p.encode_response(FETCH, 11, 3, fetch_response(records))
        assert len(chunks) == 2 and chunks[1] is records   # the slice ends the response
        assert p.decode_response(FETCH, 11, materialize(chunks))[1]["responses"][0][
            "partitions"][0]["records"] == b"y" * 10


def test_invalid_input_reaches_the_reference_and_its_message():
    calls = []

    def spy(original):
        def spying(*args, **kwargs):
            calls.append(original.__name__)
            return original(*args, **kwargs)
        return spying

    frame = bytearray(p.encode_request(FETCH, 11, 3, "bench", FETCH_BODY))
    header = p.decode_request_header(frame)
    with mock.patch.object(p, "_decode_struct", spy(p._decode_struct)), \
         mock.patch.object(p, "_encode_struct", spy(p._encode_struct)):
        p.decode_request(FETCH, 11, frame, header.size)
        p.encode_request(FETCH, 11, 3, "bench", FETCH_BODY)
        assert calls == []   # valid: the compiled codec only
        with pytest.raises(p.ProtocolError, match=r"^FetchRequest v11 field topics\[0\]\.partitions"
                                                  r"\[0\]\.partition_max_bytes: truncated: int32 "
                                                  r"needs 4 bytes at byte \d+, only 2 left$"):
            p.decode_request(FETCH, 11, frame[:-8], header.size)
        assert calls and set(calls) == {"_decode_struct"}
        body = {**FETCH_BODY, "max_bytes": 2**31}
        with pytest.raises(p.ProtocolError, match=r"^cannot encode FetchRequest v11 in max_bytes: "
                                                  r"2147483648 does not fit in int32$"):
            p.encode_request(FETCH, 11, 3, "bench", body)
        assert "_encode_struct" in calls
        with pytest.raises(p.ProtocolError, match=r"int32 value must be an int, got IndexLike"):
            p.encode_request(FETCH, 11, 3, "bench", {**FETCH_BODY, "max_bytes": IndexLike()})
        with pytest.raises(p.ProtocolError, match=r"unknown field\(s\) \['max_byte'\]"):
            p.encode_request(FETCH, 11, 3, "bench", {**FETCH_BODY, "max_byte": 1})


def test_a_miss_leaves_nothing_of_the_fast_attempt_in_the_chunks():
    """A slice is emitted, then a later struct misses (a dict subclass, which the reference
    encodes): the reference's chunks alone come out, nothing of the compiled attempt."""
    body = fetch_response(FakeSlice(b"abc"))
    second = {**body["responses"][0]["partitions"][0], "records": FakeSlice(b"de"),
              "preferred_read_replica": True}   # a bool is an int: the fast path takes it
    body["responses"].append({"topic": "t", "partitions": [second]})
    with fast_only():
        expected = p.encode_response(FETCH, 11, 3, body)
    body["responses"][1]["partitions"][0] = OrderedDict(second)
    chunks = p.encode_response(FETCH, 11, 3, body)
    assert typed(chunks) == typed(expected) and len(chunks) == 4
    assert both_agree(p.encode_response, FETCH, 11, 3, body)[0] == "returned"
    body["responses"][1]["partitions"][0]["preferred_read_replica"] = 2**40
    assert both_agree(p.encode_response, FETCH, 11, 3, body)[0] == "raised"


def test_a_slice_in_a_request_is_refused_as_by_the_reference():
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 30000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": FakeSlice(b"abc")}]}]}
    assert both_agree(p.encode_request, 0, 3, 1, "c", body) == (
        "raised", p.ProtocolError, "cannot encode ProduceRequest v3 in topic_data[0]."
        "partition_data[0].records: a records slice can only be encoded by encode_response")


def test_defaults_of_absent_arrays_are_fresh_lists():
    """Fetch v6 has no forgotten_topics_data: each decode gets its own empty list, as from the
    reference, never the schema's default object (a caller appending to it would change it)."""
    frame = p.encode_request(FETCH, 6, 3, "bench", FETCH_BODY)
    header = p.decode_request_header(frame)
    with fast_only():
        first, second = (p.decode_request(FETCH, 6, frame, header.size) for _ in range(2))
    default = next(f for f in p.SCHEMAS[(FETCH, "request")].fields
                   if f.name == "forgotten_topics_data").default
    assert first["forgotten_topics_data"] == [] and first["forgotten_topics_data"] is not default
    assert first["forgotten_topics_data"] is not second["forgotten_topics_data"]


def test_the_compiled_code_is_there_to_read():
    decode = p._compiled_decoder(p.SCHEMAS[(FETCH, "request")].fields, 11)
    assert "return {'replica_id': v0" in decode.source

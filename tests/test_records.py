"""RecordBatch v2, records, varints, CRC and compression.

Behaviour cases 1-7 of the reference (docs/kafka-storage-notes.md §12), each taken
from the Kafka test named in its docstring, plus the byte-exact vectors of §1.6 and §1.11.
Expected values come from the reference / Kafka's tests, never from what kstore returns.
"""

from __future__ import annotations

import struct

import pytest

from kstore import varint
from kstore.compression import Compression
from kstore.errors import CorruptRecordError, InvalidRecordError
from kstore.records import (ControlRecordType, MemoryRecords, Record, RecordBatch, TimestampType,
                            build_batch, build_control_batch, build_empty_batch, crc32c,
                            decode_record, decrement_sequence, encode_record, increment_sequence,
                            set_base_offset, set_max_timestamp, set_partition_leader_epoch)

INT_MAX = 2**31 - 1
T = 1_700_000_000_000  # 0x0000018BCFE56800

# Header byte positions (reference §1.2), written out here rather than imported from kstore.
LENGTH_AT, EPOCH_AT, MAGIC_AT, CRC_AT, ATTR_AT = 8, 12, 16, 17, 21
LAST_OFFSET_DELTA_AT, BASE_TS_AT, MAX_TS_AT, COUNT_AT = 23, 27, 35, 57

WORKED_EXAMPLE_HEX = (
    "00000000000000000000003a0000000002e99b8dd80000000000000000018bcfe568000000018bcfe56800"
    "ffffffffffffffffffffffffffff0000000110000000026b027600")
TWO_RECORD_HEX = (
    "00000000000000640000004700000003026702d0b70000000000010000018bcfe568000000018bcfe56805"
    "ffffffffffffffffffffffffffff0000000214000000046b310476310014000a02046b3204763200")


def three_record_batch(compression: Compression = Compression.NONE) -> bytearray:
    """MemoryRecords.withRecords(V2, 0L, NONE, CREATE_TIME, (1,a,1), (2,b,2), (3,c,3))."""
    return bytearray(build_batch([Record(b"a", b"1", 1), Record(b"b", b"2", 2),
                                  Record(b"c", b"3", 3)], base_offset=0, compression=compression))


def stored_crc(buf) -> int:
    return struct.unpack_from(">I", buf, CRC_AT)[0]


# --------------------------------------------------------------------------------------------
# Case 1
# --------------------------------------------------------------------------------------------

def test_case_01_invalid_crc_after_overwriting_last_offset_delta():
    """Case 1 [DefaultRecordBatchTest.testInvalidCrc]: overwrite lastOffsetDelta (CRC-covered)
    with 23 without recomputing the CRC -> isValid false, ensureValid throws."""
    buf = three_record_batch()
    assert RecordBatch(bytes(buf)).is_valid()
    struct.pack_into(">i", buf, LAST_OFFSET_DELTA_AT, 23)
    batch = RecordBatch(bytes(buf))
    assert batch.last_offset_delta == 23
    assert not batch.is_valid()
    with pytest.raises(CorruptRecordError):
        batch.ensure_valid()


def test_case_01_invalid_record_size_field():
    """Case 1 companion [DefaultRecordBatchTest.testInvalidRecordSize]: batchLength = 10 makes the
    batch smaller than the 61-byte overhead -> isValid false, ensureValid throws."""
    buf = three_record_batch()
    struct.pack_into(">i", buf, LENGTH_AT, 10)
    batch = RecordBatch(bytes(buf))
    assert not batch.is_valid()
    with pytest.raises(CorruptRecordError):
        batch.ensure_valid()


# --------------------------------------------------------------------------------------------
# Case 2
# --------------------------------------------------------------------------------------------

def test_case_02_set_last_offset_rewrites_base_offset_keeps_crc():
    """Case 2 [DefaultRecordBatchTest.testSetLastOffset]: setLastOffset(500) on a 3-record batch
    -> baseOffset 498, lastOffset 500, records 498..500, CRC still valid (not covered)."""
    buf = three_record_batch()
    crc_before = stored_crc(buf)
    last_offset = 500
    # setLastOffset(o) writes baseOffset = o - lastOffsetDelta (DefaultRecordBatch.setLastOffset).
    set_base_offset(buf, 0, last_offset - 2)
    batch = RecordBatch(bytes(buf))
    assert batch.last_offset == 500
    assert batch.base_offset == 498
    assert batch.is_valid()
    assert stored_crc(buf) == crc_before  # baseOffset is outside the CRC range: not recomputed
    batches = MemoryRecords(bytes(buf)).batches()
    assert len(batches) == 1 and batches[0].last_offset == 500
    assert [r.offset for r in MemoryRecords(bytes(buf)).records()] == [498, 499, 500]


def test_case_02_set_partition_leader_epoch_keeps_crc_valid():
    """Case 2 [DefaultRecordBatchTest.testSetPartitionLeaderEpoch]: epoch 500, CRC still valid."""
    buf = three_record_batch()
    crc_before = stored_crc(buf)
    set_partition_leader_epoch(buf, 0, 500)
    assert struct.unpack_from(">i", buf, EPOCH_AT)[0] == 500
    batch = RecordBatch(bytes(buf))
    assert batch.partition_leader_epoch == 500
    assert batch.is_valid()
    assert stored_crc(buf) == crc_before
    batches = MemoryRecords(bytes(buf)).batches()
    assert len(batches) == 1 and batches[0].partition_leader_epoch == 500


def test_case_02_setters_work_at_a_position_inside_a_larger_buffer():
    """Case 2 (in place at a position): rewriting the second of two batches leaves the first alone."""
    first = build_batch([Record(b"x", b"y", 10)], base_offset=0)
    buf = bytearray(first) + three_record_batch()
    pos = len(first)
    set_base_offset(buf, pos, 498)
    set_partition_leader_epoch(buf, pos, 7)
    assert bytes(buf[:pos]) == first
    b0, b1 = MemoryRecords(bytes(buf)).batches()
    assert (b0.base_offset, b0.partition_leader_epoch) == (0, -1)
    assert (b1.base_offset, b1.last_offset, b1.partition_leader_epoch) == (498, 500, 7)
    assert b0.is_valid() and b1.is_valid()


# --------------------------------------------------------------------------------------------
# Case 3
# --------------------------------------------------------------------------------------------

def test_case_03_set_log_append_time():
    """Case 3 [DefaultRecordBatchTest.testSetLogAppendTime]: setMaxTimestamp(LOG_APPEND_TIME, 15)
    sets attribute bit 3, maxTimestamp 15, every record reports 15, CRC recomputed and valid."""
    buf = three_record_batch()
    crc_before = stored_crc(buf)
    set_max_timestamp(buf, 0, TimestampType.LOG_APPEND_TIME, 15)
    attributes = struct.unpack_from(">h", buf, ATTR_AT)[0]
    assert attributes & 0x08 == 0x08
    batch = RecordBatch(bytes(buf))
    assert batch.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert batch.max_timestamp == 15
    assert batch.is_valid()
    assert stored_crc(buf) != crc_before  # CRC-covered fields changed, CRC redone
    assert stored_crc(buf) == crc32c(bytes(buf[ATTR_AT:]))
    batches = MemoryRecords(bytes(buf)).batches()
    assert len(batches) == 1
    assert batches[0].max_timestamp == 15
    assert batches[0].timestamp_type is TimestampType.LOG_APPEND_TIME
    assert [r.timestamp for r in MemoryRecords(bytes(buf)).records()] == [15, 15, 15]


def test_case_03_back_to_create_time_restores_record_timestamps():
    """Case 3 (reverse): CreateTime again -> bit 3 cleared, records use base + delta again."""
    buf = three_record_batch()
    original = bytes(buf)
    set_max_timestamp(buf, 0, TimestampType.LOG_APPEND_TIME, 15)
    set_max_timestamp(buf, 0, TimestampType.CREATE_TIME, 3)
    assert bytes(buf) == original
    assert [r.timestamp for r in RecordBatch(bytes(buf)).records()] == [1, 2, 3]


# --------------------------------------------------------------------------------------------
# Case 4
# --------------------------------------------------------------------------------------------

def batch_with_record_count(compression: Compression, count: int) -> RecordBatch:
    """recordsWithInvalidRecordCount: 3 records (null key; hello/there/beautiful), count rewritten."""
    now = T
    buf = bytearray(build_batch([Record(None, b"hello", now), Record(None, b"there", now),
                                 Record(None, b"beautiful", now)], base_offset=0,
                                compression=compression))
    struct.pack_into(">i", buf, COUNT_AT, count)
    return RecordBatch(bytes(buf))


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
@pytest.mark.parametrize("count", [5, 2], ids=["too_many", "too_few"])
def test_case_04_record_count_mismatch_raises_invalid_record(compression, count):
    """Case 4 [testInvalidRecordCountTooMany/TooLittle{Non,}CompressedV2]: count 5 or 2 for 3
    real records, uncompressed or gzip -> InvalidRecordException while iterating."""
    batch = batch_with_record_count(compression, count)
    assert batch.records_count == count
    with pytest.raises(InvalidRecordError):
        list(batch)


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
def test_case_04_correct_count_iterates(compression):
    """Case 4 control: the same batch with its true count (3) iterates fine."""
    batch = batch_with_record_count(compression, 3)
    assert [r.value for r in batch] == [b"hello", b"there", b"beautiful"]


def test_case_04_negative_record_count_raises():
    """Case 4 / §1.5: a negative count -> InvalidRecordException."""
    with pytest.raises(InvalidRecordError):
        batch_with_record_count(Compression.NONE, -1).records()


# --------------------------------------------------------------------------------------------
# Case 5
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("timestamp_type", [TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME])
@pytest.mark.parametrize("transactional", [True, False])
@pytest.mark.parametrize("control", [True, False])
def test_case_05_write_empty_header(timestamp_type, transactional, control):
    """Case 5 [DefaultRecordBatchTest.testWriteEmptyHeader]: a header-only batch keeps base/last
    offsets, producer fields, epoch, flags, maxTimestamp; firstTimestamp is NO_TIMESTAMP."""
    producer_id, producer_epoch, base_sequence = 23423, 145, 983
    base_offset, last_offset, leader_epoch, timestamp = 15, 37, 15, T + 12345
    data = build_empty_batch(base_offset=base_offset, last_offset=last_offset,
                             max_timestamp=timestamp, partition_leader_epoch=leader_epoch,
                             producer_id=producer_id, producer_epoch=producer_epoch,
                             base_sequence=base_sequence, timestamp_type=timestamp_type,
                             transactional=transactional, control=control)
    assert len(data) == 61
    batch = RecordBatch(data)
    assert batch.producer_id == producer_id
    assert batch.producer_epoch == producer_epoch
    assert batch.base_sequence == base_sequence
    assert batch.last_sequence == base_sequence + (last_offset - base_offset)
    assert batch.base_offset == base_offset
    assert batch.last_offset == last_offset
    assert batch.partition_leader_epoch == leader_epoch
    assert batch.is_transactional == transactional
    assert batch.timestamp_type is timestamp_type
    assert batch.max_timestamp == timestamp
    assert batch.base_timestamp == -1
    assert batch.is_control == control
    assert batch.records_count == 0
    assert batch.size_in_bytes == 61
    assert batch.is_valid()
    assert batch.records() == []


# --------------------------------------------------------------------------------------------
# Case 6
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sequence,increment,expected", [
    (5, 5, 10), (INT_MAX, 1, 0), (INT_MAX - 5, 10, 4)])
def test_case_06_increment_sequence_wraps(sequence, increment, expected):
    """Case 6 [DefaultRecordBatchTest.testIncrementSequence]."""
    assert increment_sequence(sequence, increment) == expected


@pytest.mark.parametrize("sequence,decrement,expected", [(5, 5, 0), (0, 1, INT_MAX)])
def test_case_06_decrement_sequence_wraps(sequence, decrement, expected):
    """Case 6 [DefaultRecordBatchTest.testDecrementSequence]."""
    assert decrement_sequence(sequence, decrement) == expected


def test_case_06_batch_sequences_wrap_around():
    """Case 6 [DefaultRecordBatchTest.buildDefaultRecordBatchWithSequenceWrapAround]: base sequence
    MAX-1 with 3 records -> last sequence 0, record sequences MAX-1, MAX, 0."""
    data = build_batch([Record(b"a", b"v", 1), Record(b"b", b"v", 2), Record(b"c", b"v", 3)],
                       base_offset=1234567, producer_id=23423, producer_epoch=145,
                       base_sequence=INT_MAX - 1)
    batch = RecordBatch(data)
    assert batch.producer_id == 23423 and batch.producer_epoch == 145
    assert batch.base_sequence == INT_MAX - 1
    assert batch.last_sequence == 0
    assert [r.sequence for r in batch.records()] == [INT_MAX - 1, INT_MAX, 0]


def test_case_06_no_sequence_stays_no_sequence():
    """§1.2: lastSequence is -1 when baseSequence is -1; records get sequence -1."""
    batch = RecordBatch(build_batch([Record(b"a", b"v", 1), Record(b"b", b"v", 2)]))
    assert batch.base_sequence == -1 and batch.last_sequence == -1
    assert [r.sequence for r in batch.records()] == [-1, -1]


# --------------------------------------------------------------------------------------------
# Case 7: records
# --------------------------------------------------------------------------------------------

SERDE_HEADERS = (("foo", b"value"), ("bar", None), ('"A\\u00ea\\u00f1\\u00fcC"', b"value"))
SERDE_RECORDS = [
    (b"hi", b"there", ()),
    (None, b"there", ()),
    (b"hi", None, ()),
    (None, None, ()),
    (b"hi", b"there", SERDE_HEADERS),
]


@pytest.mark.parametrize("key,value,headers", SERDE_RECORDS)
def test_case_07_record_basic_serde(key, value, headers):
    """Case 7 [DefaultRecordTest.testBasicSerde]: offsetDelta 10, timestampDelta 323, baseOffset
    37, baseSequence 723 -> offset 47, sequence 733, timestamp base+323, same key/value/headers."""
    base_ts = T
    data = encode_record(10, 323, key, value, headers)
    record, end = decode_record(data, 0, 37, base_ts, None, 723)
    assert end == len(data)
    assert record.offset == 47
    assert record.sequence == 733
    assert record.timestamp == base_ts + 323
    assert record.key == key
    assert record.value == value
    assert record.headers == headers


def _serde_header_record() -> bytearray:
    rec = SERDE_RECORDS[4]
    data = bytearray(encode_record(10, 323, rec[0], rec[1], rec[2]))
    # Layout check (so that byte 14 really is the header count, as in Kafka's test):
    # len(1) attr(1) tsDelta(2) offDelta(1) keyLen(1) "hi"(2) valLen(1) "there"(5) -> byte 14.
    assert data[14] == 6  # zigzag(3)
    return data


@pytest.mark.parametrize("count_byte", [8, 4], ids=["too_high_4", "too_low_2"])
def test_case_07_header_count_wrong(count_byte):
    """Case 7 [testBasicSerdeInvalidHeaderCountTooHigh / TooLow]: byte 14 set to 8 (4 headers) or
    4 (2 headers) for a record with 3 -> InvalidRecordException."""
    data = _serde_header_record()
    data[14] = count_byte
    with pytest.raises(InvalidRecordError):
        decode_record(bytes(data), 0, 37, T, None, 723)


def _malformed(*fields: bytes, body_size: int = 100) -> bytes:
    """A record that claims a `body_size` body: given fields, then zero padding (Kafka's tests)."""
    head = varint.write_varint(body_size)
    body = b"".join(fields)
    return head + body + bytes(body_size - len(body))


_ATTR_TS_OFF = (b"\x00", varint.write_varlong(2), varint.write_varint(1))
MALFORMED = {
    "key_size_105": _ATTR_TS_OFF + (varint.write_varint(105),),
    "value_size_105": _ATTR_TS_OFF + (varint.write_varint(-1), varint.write_varint(105)),
    "num_headers_negative": _ATTR_TS_OFF + (b"\x01", b"\x01", varint.write_varint(-1)),
    "num_headers_100": _ATTR_TS_OFF + (b"\x01", b"\x01", varint.write_varint(100)),
    "header_key_size_105": _ATTR_TS_OFF + (b"\x01", b"\x01", varint.write_varint(1),
                                           varint.write_varint(105)),
    "null_header_key": _ATTR_TS_OFF + (b"\x01", b"\x01", varint.write_varint(1),
                                       varint.write_varint(-1)),
    "header_value_size_105": _ATTR_TS_OFF + (b"\x01", b"\x01", varint.write_varint(1),
                                             varint.write_varint(1), b"\x01",
                                             varint.write_varint(105)),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_case_07_malformed_record_rejected(name):
    """Case 7 [DefaultRecordTest.testInvalidKeySize, testInvalidValueSize, testInvalidNumHeaders,
    testInvalidHeaderKey, testNullHeaderKey, testInvalidHeaderValue]: 100-byte body whose sizes
    run past it, a negative/too-large header count, or a null header key -> InvalidRecordException."""
    data = _malformed(*MALFORMED[name])
    assert len(data) == 102  # varint(100) = c8 01, then the 100-byte body
    with pytest.raises(InvalidRecordError):
        decode_record(data, 0, 0, 0, None, -1)


@pytest.mark.parametrize("delta", [+1, -1], ids=["length_too_big", "length_too_small"])
def test_case_07_wrong_body_length_rejected(delta):
    """Case 7 / §1.6: the body must be exactly `length` bytes (DefaultRecord.readFrom). The record
    is followed by a second one so that a longer length doesn't run off the buffer."""
    rec = encode_record(0, 0, b"k", b"v")
    assert rec[0] == 0x10  # zigzag(8)
    bad = bytes([varint.zigzag_encode(8 + delta)]) + rec[1:]
    with pytest.raises(InvalidRecordError):
        decode_record(bad + encode_record(1, 0, b"k2", b"v2"), 0, 0, 0, None, -1)


def test_case_07_record_bytes_in_batch_with_leftover_or_premature_eof():
    """§1.5: leftover bytes after recordsCount records, or running out early -> InvalidRecord."""
    good = bytearray(build_batch([Record(b"k", b"v", T)]))
    extra = bytearray(good) + b"\x00\x00"
    struct.pack_into(">i", extra, LENGTH_AT, len(extra) - 12)
    with pytest.raises(InvalidRecordError, match="remaining"):
        RecordBatch(bytes(extra)).records()
    short = bytearray(good)
    struct.pack_into(">i", short, COUNT_AT, 2)
    with pytest.raises(InvalidRecordError, match="premature EOF"):
        RecordBatch(bytes(short)).records()


# ---- varints (ByteUtilsTest.testVarintSerde / testInvalidVarint) ----

VARINT_EXAMPLES = [
    (0, "00"), (-1, "01"), (1, "02"), (-2, "03"), (63, "7e"), (-64, "7f"), (64, "8001"),
    (300, "d804"), (2147483647, "feffffff0f"), (-2147483648, "ffffffff0f"),
]


@pytest.mark.parametrize("value,hexed", VARINT_EXAMPLES)
def test_case_07_varint_examples_encode(value, hexed):
    """§1.6 zig-zag varint examples, encoding."""
    assert varint.write_varint(value) == bytes.fromhex(hexed)
    assert varint.size_of_varint(value) == len(hexed) // 2


@pytest.mark.parametrize("value,hexed", VARINT_EXAMPLES)
def test_case_07_varint_examples_decode(value, hexed):
    """§1.6 zig-zag varint examples, decoding (value and position after it)."""
    data = bytes.fromhex(hexed) + b"\xaa"  # a trailing byte that must not be consumed
    assert varint.read_varint(data, 0) == (value, len(hexed) // 2)
    assert varint.read_varlong(data, 0) == (value, len(hexed) // 2)


@pytest.mark.parametrize("value", [0, 1, -1, 2**31, -(2**31) - 1, 2**62, 2**63 - 1, -(2**63)])
def test_case_07_varlong_round_trip(value):
    """Varlongs: zig-zag with >> 63, up to 10 bytes (ByteUtilsTest.testVarlongSerde)."""
    data = varint.write_varlong(value)
    z = ((value << 1) ^ (value >> 63)) & (2**64 - 1)
    assert len(data) == max(1, (z.bit_length() + 6) // 7)
    assert varint.read_varlong(data, 0) == (value, len(data))
    assert varint.write_varlong(-(2**63)) == bytes.fromhex("ffffffffffffffffff01")


def test_case_07_varint_longer_than_5_bytes_rejected():
    """Case 7 [ByteUtilsTest.testInvalidVarint]: FF FF FF FF FF 01 is too long for a varint."""
    with pytest.raises(InvalidRecordError):
        varint.read_varint(bytes.fromhex("ffffffffff01"), 0)


def test_case_07_varlong_longer_than_10_bytes_rejected():
    """Case 7 [ByteUtilsTest.testInvalidVarlong]: 10 x FF then 01 is too long for a varlong."""
    with pytest.raises(InvalidRecordError):
        varint.read_varlong(bytes.fromhex("ff" * 10 + "01"), 0)


def test_case_07_truncated_varint_rejected():
    """A varint whose continuation bit runs off the end of the buffer -> InvalidRecord."""
    with pytest.raises(InvalidRecordError):
        varint.read_varint(b"\x80\x80", 0)


# --------------------------------------------------------------------------------------------
# CRC-32C and the worked examples (§1.3, §1.11)
# --------------------------------------------------------------------------------------------

def test_crc32c_check_value():
    """§1.3: CRC-32C (Castagnoli) check value of "123456789" is 0xE3069283."""
    assert crc32c(b"123456789") == 0xE3069283


def test_worked_example_built_byte_for_byte():
    """§1.11: key "k", value "v", ts 1700000000000, leader epoch 0, offset 0 -> 70 exact bytes."""
    data = build_batch([Record(b"k", b"v", T)], base_offset=0, partition_leader_epoch=0)
    assert data == bytes.fromhex(WORKED_EXAMPLE_HEX)
    assert len(data) == 70


def test_worked_example_decoded():
    """§1.11: every header field of the example, then the one record."""
    batch = RecordBatch(bytes.fromhex(WORKED_EXAMPLE_HEX))
    assert batch.base_offset == 0
    assert batch.batch_length == 58
    assert batch.partition_leader_epoch == 0
    assert batch.magic == 2
    assert batch.crc == 0xE99B8DD8
    assert batch.attributes == 0
    assert batch.last_offset_delta == 0
    assert batch.base_timestamp == T
    assert batch.max_timestamp == T
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)
    assert batch.records_count == 1
    assert batch.size_in_bytes == 70
    assert batch.is_valid()
    (record,) = batch.records()
    assert (record.offset, record.timestamp, record.key, record.value, record.headers) == \
        (0, T, b"k", b"v", ())
    assert crc32c(bytes.fromhex(WORKED_EXAMPLE_HEX)[21:70]) == 0xE99B8DD8


def test_worked_example_crc_independent_of_base_offset_and_epoch():
    """§1.11: with baseOffset 42 and partitionLeaderEpoch 7 the CRC stays e99b8dd8."""
    data = build_batch([Record(b"k", b"v", T)], base_offset=42, partition_leader_epoch=7)
    expected = bytearray.fromhex(WORKED_EXAMPLE_HEX)
    struct.pack_into(">q", expected, 0, 42)
    struct.pack_into(">i", expected, EPOCH_AT, 7)
    assert data == bytes(expected)
    assert stored_crc(data) == 0xE99B8DD8


def test_more_vectors_header_record():
    """§1.11: record with header h = x -> 18 00 00 00 02 6b 02 76 02 02 68 02 78."""
    assert encode_record(0, 0, b"k", b"v", [("h", b"x")]) == \
        bytes.fromhex("18000000026b02760202680278")
    record, end = decode_record(bytes.fromhex("18000000026b02760202680278"),
                                0, 0, T, None, -1)
    assert end == 13 and record.headers == (("h", b"x"),)


def test_more_vectors_tombstone_record():
    """§1.11: tombstone (key "k", null value) -> 0e 00 00 00 02 6b 01 00."""
    assert encode_record(0, 0, b"k", None) == bytes.fromhex("0e000000026b0100")
    record, _ = decode_record(bytes.fromhex("0e000000026b0100"), 0, 0, T, None, -1)
    assert record.key == b"k" and record.value is None and record.is_tombstone


def test_more_vectors_two_record_batch():
    """§1.11: k1/v1 at T, k2/v2 at T+5, baseOffset 100, leader epoch 3: 83 bytes, CRC 6702d0b7."""
    data = build_batch([Record(b"k1", b"v1", T), Record(b"k2", b"v2", T + 5)],
                       base_offset=100, partition_leader_epoch=3)
    assert data == bytes.fromhex(TWO_RECORD_HEX)
    assert len(data) == 83
    batch = RecordBatch(data)
    assert batch.crc == 0x6702D0B7 and batch.is_valid()
    assert batch.last_offset_delta == 1 and batch.last_offset == 101
    assert [(r.offset, r.timestamp, r.key, r.value) for r in batch.records()] == \
        [(100, T, b"k1", b"v1"), (101, T + 5, b"k2", b"v2")]


# --------------------------------------------------------------------------------------------
# Compression (§1.7)
# --------------------------------------------------------------------------------------------

MIXED_RECORDS = [
    Record(b"key-0", b"value-0", T),
    Record(None, b"no key", T + 1),
    Record(b"tomb", None, T + 2),
    Record(b"hdr", b"v", T + 3, headers=(("a", b"1"), ("b", None))),
    Record(b"empty", b"", T + 4),
    Record(b"big", bytes(range(256)) * 8, T + 10),
]

FRAME_MAGIC = {
    Compression.GZIP: bytes.fromhex("1f8b"),
    Compression.SNAPPY: b"\x82SNAPPY\x00",          # snappy-java (xerial) stream framing
    Compression.LZ4: bytes.fromhex("04224d18"),      # LZ4 frame
    Compression.ZSTD: bytes.fromhex("28b52ffd"),     # zstd frame
}


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.name)
def test_every_codec_round_trips(codec):
    """§1.7: each codec's batch carries its id in attribute bits 0-2, the header (and count) stays
    uncompressed, the records section is that codec's stream, and the records come back intact."""
    data = build_batch(MIXED_RECORDS, base_offset=1000, compression=codec)
    batch = RecordBatch(data)
    assert batch.attributes & 0x07 == int(codec)
    assert batch.compression is codec
    assert batch.records_count == len(MIXED_RECORDS)
    assert batch.last_offset == 1005
    assert batch.base_timestamp == T and batch.max_timestamp == T + 10
    assert batch.is_valid()
    plain = b"".join(encode_record(i, r.timestamp - T, r.key, r.value, r.headers)
                     for i, r in enumerate(MIXED_RECORDS))
    if codec is Compression.NONE:
        assert data[61:] == plain
    else:
        assert data[61:].startswith(FRAME_MAGIC[codec])
        assert data[61:] != plain
        assert batch.records_bytes() == plain
    got = batch.records()
    assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in got] == \
        [(1000 + i, r.key, r.value, r.timestamp, r.headers) for i, r in enumerate(MIXED_RECORDS)]
    # And through MemoryRecords, as a reader of a fetched buffer does.
    assert [r.value for r in MemoryRecords(data).records()] == [r.value for r in MIXED_RECORDS]


@pytest.mark.parametrize("codec", [c for c in Compression if c is not Compression.NONE],
                         ids=lambda c: c.name)
def test_compressed_garbage_raises_invalid_record(codec):
    """A compressed records section that doesn't decompress -> InvalidRecordError."""
    data = bytearray(build_batch(MIXED_RECORDS, compression=codec))
    for i in range(61 + 8, len(data)):
        data[i] ^= 0x5A
    with pytest.raises(InvalidRecordError):
        RecordBatch(bytes(data)).records()


# --------------------------------------------------------------------------------------------
# Control batches (§1.8)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("marker", [ControlRecordType.COMMIT, ControlRecordType.ABORT])
def test_control_batch_recognised(marker):
    """§1.8 [DefaultRecordBatchTest.testReadAndWriteControlBatch]: attribute bits 4 and 5, key =
    version 0 + type, value = version 0 + coordinator epoch."""
    data = build_control_batch(marker, base_offset=7, timestamp=T, producer_id=1,
                               producer_epoch=0, coordinator_epoch=15)
    batch = RecordBatch(data)
    assert batch.is_control
    assert batch.is_transactional
    assert batch.attributes & 0x30 == 0x30
    assert batch.control_record_type() is marker
    assert batch.producer_id == 1 and batch.producer_epoch == 0
    (record,) = batch.records()
    assert record.key == struct.pack(">hh", 0, int(marker))
    assert record.value == bytes.fromhex("0000" "0000000f")
    assert record.offset == 7


def test_control_batches_skipped_by_memory_records():
    """§1.8: readers skip control batches: only the data records come out."""
    data1 = build_batch([Record(b"a", b"1", T), Record(b"b", b"2", T)], base_offset=0,
                        producer_id=1, producer_epoch=0, base_sequence=0, transactional=True)
    marker = build_control_batch(ControlRecordType.COMMIT, base_offset=2, timestamp=T,
                                 producer_id=1, producer_epoch=0)
    data2 = build_batch([Record(b"c", b"3", T)], base_offset=3)
    mr = MemoryRecords.of(data1, marker, data2)
    assert [b.is_control for b in mr.batches()] == [False, True, False]
    assert [(r.offset, r.value) for r in mr.records()] == [(0, b"1"), (1, b"2"), (3, b"3")]
    assert [r.offset for r in mr.records(skip_control=False)] == [0, 1, 2, 3]


def test_data_batch_is_not_control():
    batch = RecordBatch(build_batch([Record(b"a", b"1", T)]))
    assert not batch.is_control and not batch.is_transactional


# --------------------------------------------------------------------------------------------
# Record contents: null key, tombstone, null header value, empty value, large values
# --------------------------------------------------------------------------------------------

def test_null_key_encoding():
    """keyLength -1 (`01`) for a null key."""
    assert encode_record(0, 0, None, b"v") == bytes.fromhex("0e00000001027600")
    rec, _ = decode_record(bytes.fromhex("0e00000001027600"), 0, 5, T, None, -1)
    assert rec.key is None and rec.value == b"v" and rec.offset == 5


def test_empty_value_is_not_a_tombstone():
    """valueLength 0 (`00`) is an empty value, distinct from null (-1, `01`)."""
    data = encode_record(0, 0, b"k", b"")
    assert data == bytes.fromhex("0e000000026b0000")
    rec, _ = decode_record(data, 0, 0, T, None, -1)
    assert rec.value == b"" and not rec.is_tombstone


def test_header_with_null_value():
    """headerValueLength -1 for a null header value: 02 02 68 01."""
    data = encode_record(0, 0, b"k", b"v", [("h", None)])
    assert data == bytes.fromhex("16000000026b027602026801")
    rec, _ = decode_record(data, 0, 0, T, None, -1)
    assert rec.headers == (("h", None),)


def test_null_header_key_cannot_be_written():
    with pytest.raises(InvalidRecordError):
        encode_record(0, 0, b"k", b"v", [(None, b"x")])


def test_large_value_uses_multibyte_varints():
    """200-byte value: valueLength zigzag(200)=400 -> 90 03; body 207 -> length 9e 03."""
    value = bytes(range(200))
    data = encode_record(0, 0, None, value)
    assert data[:8] == bytes.fromhex("9e03000000019003")
    assert len(data) == 2 + 207
    assert data[8:208] == value and data[208:] == b"\x00"
    rec, end = decode_record(data, 0, 0, T, None, -1)
    assert rec.value == value and end == 209


def test_large_values_in_a_batch_round_trip():
    """Several records > 127 bytes (multi-byte lengths and deltas) in one batch."""
    records = [Record(b"k%d" % i, bytes([i]) * (128 + 300 * i), T + 1000 * i) for i in range(5)]
    data = build_batch(records, base_offset=10)
    batch = RecordBatch(data)
    assert batch.is_valid() and batch.records_count == 5
    assert [(r.offset, r.key, r.value, r.timestamp) for r in batch.records()] == \
        [(10 + i, r.key, r.value, r.timestamp) for i, r in enumerate(records)]


def test_create_time_record_timestamps_are_base_plus_delta():
    """§1.4 CreateTime: record ts = baseTimestamp + delta; maxTimestamp = max (not last)."""
    data = build_batch([Record(b"a", b"1", T + 50), Record(b"b", b"2", T), Record(b"c", b"3", T + 20)])
    batch = RecordBatch(data)
    assert batch.base_timestamp == T + 50
    assert batch.max_timestamp == T + 50
    assert [r.timestamp for r in batch.records()] == [T + 50, T, T + 20]

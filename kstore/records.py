"""RecordBatch v2 (magic 2): the unit Kafka writes to disk and sends over the wire.

Mirrors Kafka's `DefaultRecordBatch`, `DefaultRecord`, `MemoryRecordsBuilder` and
`ByteBufferLogInputStream`. A batch is a 61-byte header followed by its records:

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 | crc uint32 |
    attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64 |
    producerId int64 | producerEpoch int16 | baseSequence int32 | recordsCount int32 | records...

The CRC-32C covers bytes 21.. (attributes to the end), so a broker can rewrite baseOffset and the
leader epoch without recomputing it. Each record is a zig-zag varint length followed by its body.
"""

from __future__ import annotations

import enum
import operator
import struct
import sys
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import crc32c as _crc32c

from . import native, varint
from .compression import Compression, compress, decompress
from .errors import CorruptRecordError, InvalidRecordError

# Byte positions of the header fields (DefaultRecordBatch.*_OFFSET).
BASE_OFFSET_OFFSET = 0
LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
PRODUCER_EPOCH_OFFSET = 51
BASE_SEQUENCE_OFFSET = 53
RECORDS_COUNT_OFFSET = 57
RECORDS_OFFSET = 61

LOG_OVERHEAD = 12              # baseOffset + batchLength
HEADER_SIZE_UP_TO_MAGIC = 17
RECORD_BATCH_OVERHEAD = 61
MIN_BATCH_LENGTH_FIELD = 14    # LegacyRecord.RECORD_OVERHEAD_V0: smallest legal batchLength
CURRENT_MAGIC = 2

NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

COMPRESSION_CODEC_MASK = 0x07
_CODECS = tuple(sorted(Compression))     # Compression by attribute id: _CODECS[id] is Compression(id)
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40

HEADER = struct.Struct(">qiibIhiqqqhii")
assert HEADER.size == RECORD_BATCH_OVERHEAD

# (name, byte offset, size, struct format) of every header field, for dumps and hex views.
HEADER_FIELDS: tuple[tuple[str, int, int, str], ...] = (
    ("baseOffset", 0, 8, ">q"), ("batchLength", 8, 4, ">i"),
    ("partitionLeaderEpoch", 12, 4, ">i"), ("magic", 16, 1, ">b"), ("crc", 17, 4, ">I"),
    ("attributes", 21, 2, ">h"), ("lastOffsetDelta", 23, 4, ">i"),
    ("baseTimestamp", 27, 8, ">q"), ("maxTimestamp", 35, 8, ">q"),
    ("producerId", 43, 8, ">q"), ("producerEpoch", 51, 2, ">h"),
    ("baseSequence", 53, 4, ">i"), ("recordsCount", 57, 4, ">i"),
)


class TimestampType(enum.IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1

    @property
    def kafka_name(self) -> str:
        return "CreateTime" if self is TimestampType.CREATE_TIME else "LogAppendTime"

    @classmethod
    def from_name(cls, name: str) -> "TimestampType":
        return {"CreateTime": cls.CREATE_TIME, "LogAppendTime": cls.LOG_APPEND_TIME}[name]


class ControlRecordType(enum.IntEnum):
    """Type of a control record, from its key (ControlRecordType.java)."""
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6
    UNKNOWN = -1


# CRC-32C (Castagnoli), as Kafka's Crc32C: the `crc32c` package's hardware-accelerated function.
crc32c = _crc32c.crc32c


Header = tuple  # (key: str, value: bytes | None)


@dataclass(frozen=True, slots=True)
class Record:
    """One record. `offset` and `sequence` are filled in when a record is read from a batch."""
    key: bytes | None = None
    value: bytes | None = None
    timestamp: int = NO_TIMESTAMP
    headers: tuple[Header, ...] = ()
    offset: int = -1
    sequence: int = NO_SEQUENCE

    @property
    def is_tombstone(self) -> bool:
        return self.value is None


# --------------------------------------------------------------------------------------------
# Records (DefaultRecord)
# --------------------------------------------------------------------------------------------

def _bytes_field(data: bytes | None) -> bytes:
    if data is None:
        return b"\x01"  # varint -1
    return varint.write_varint(len(data)) + data


def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None,
                  value: bytes | None, headers: Sequence[Header] = ()) -> bytes:
    """Encode one record: length varint, then attributes, deltas, key, value and headers."""
    parts = [b"\x00", varint.write_varlong(timestamp_delta), varint.write_varint(offset_delta),
             _bytes_field(key), _bytes_field(value), varint.write_varint(len(headers))]
    for h_key, h_value in headers:
        if h_key is None:
            raise InvalidRecordError("a record header key must not be null")
        parts.append(_bytes_field(h_key.encode("utf-8") if isinstance(h_key, str) else h_key))
        parts.append(_bytes_field(h_value))
    body = b"".join(parts)
    return varint.write_varint(len(body)) + body


def record_size_in_bytes(offset_delta: int, timestamp_delta: int, key: bytes | None,
                         value: bytes | None, headers: Sequence[Header] = ()) -> int:
    """len(encode_record(...)) without encoding it (DefaultRecord.sizeInBytes): a producer sizes
    its batches with this."""
    size = (1 + varint.size_of_varlong(timestamp_delta) + varint.size_of_varint(offset_delta)
            + (1 if key is None else _length_size(len(key)) + len(key))
            + (1 if value is None else _length_size(len(value)) + len(value))
            + _length_size(len(headers)))
    for h_key, h_value in headers:
        if h_key is None:
            raise InvalidRecordError("a record header key must not be null")
        h_key = h_key.encode("utf-8") if isinstance(h_key, str) else h_key
        size += _length_size(len(h_key)) + len(h_key)
        size += 1 if h_value is None else _length_size(len(h_value)) + len(h_value)
    return _length_size(size) + size


def sized_record(key: bytes | None, value: bytes | None, headers: Sequence[Header] = ()) -> int:
    """record_size_in_bytes of a record a producer is batching (deltas 0), through the native
    codec where it may stand in: the producer sizes every record it sends."""
    # Only record_size_in_bytes is checked here, not all of native_codec()'s list (this runs once
    # per record): it calls no other function the native codec mirrors.
    if native.codec is not None and record_size_in_bytes is _REFERENCE_RECORD_SIZE:
        size = native.codec.record_size_in_bytes(0, 0, key, value, headers)
        if size is not None:
            return size
    return record_size_in_bytes(0, 0, key, value, headers)


def _length_size(n: int) -> int:
    """varint.size_of_varint(n) for a length n ≥ 0 (zig-zag doubles it)."""
    return ((n << 1).bit_length() + 6) // 7 or 1


def _read_bytes_field(buf, pos: int, end: int, what: str) -> tuple[bytes | None, int]:
    length, pos = varint.read_varint(buf, pos)
    if length < 0:
        return None, pos
    if pos + length > end:
        raise InvalidRecordError(f"invalid {what} size {length}: runs past the end of the record")
    return bytes(buf[pos:pos + length]), pos + length


def decode_record(buf, pos: int, base_offset: int, base_timestamp: int,
                  log_append_time: int | None, base_sequence: int) -> tuple[Record, int]:
    """Decode the record at buf[pos]; return it and the position after it (DefaultRecord.readFrom)."""
    size, pos = varint.read_varint(buf, pos)
    end = pos + size
    if size < 0 or end > len(buf):
        raise InvalidRecordError(
            f"premature EOF: record claims {size} bytes but only {len(buf) - pos} remain")
    pos += 1  # attributes: unused
    ts_delta, pos = varint.read_varlong(buf, pos)
    offset_delta, pos = varint.read_varint(buf, pos)
    key, pos = _read_bytes_field(buf, pos, end, "key")
    value, pos = _read_bytes_field(buf, pos, end, "value")
    n_headers, pos = varint.read_varint(buf, pos)
    if n_headers < 0:
        raise InvalidRecordError(f"found invalid number of record headers {n_headers}")
    if n_headers > end - pos:
        raise InvalidRecordError(
            f"found invalid number of record headers {n_headers}: more than the bytes remaining")
    headers = []
    for _ in range(n_headers):
        h_key, pos = _read_bytes_field(buf, pos, end, "header key")
        if h_key is None:
            raise InvalidRecordError("invalid negative header key size")
        h_value, pos = _read_bytes_field(buf, pos, end, "header value")
        headers.append((h_key.decode("utf-8", errors="replace"), h_value))
    if pos != end:
        raise InvalidRecordError(
            f"invalid record size: expected to read {size} bytes in record payload, "
            f"but instead read {size - (end - pos)}")
    timestamp = log_append_time if log_append_time is not None else base_timestamp + ts_delta
    sequence = NO_SEQUENCE if base_sequence < 0 else increment_sequence(base_sequence, offset_delta)
    return Record(key, value, timestamp, tuple(headers), base_offset + offset_delta, sequence), end


def increment_sequence(sequence: int, increment: int) -> int:
    """Producer sequences wrap past Integer.MAX_VALUE to 0 (DefaultRecordBatch.incrementSequence)."""
    if sequence > varint.INT32_MAX - increment:
        return increment - (varint.INT32_MAX - sequence) - 1
    return sequence + increment


def decrement_sequence(sequence: int, decrement: int) -> int:
    if sequence < decrement:
        return varint.INT32_MAX - (decrement - sequence) + 1
    return sequence - decrement


# ---- a batch's records section, record by record (the native codec mirrors these three) ----

def encode_records(records: Sequence[Record], offsets: Sequence[int] | None, base_offset: int,
                   base_timestamp: int) -> bytes:
    """The records section of a batch: every record encoded with its deltas from the batch's
    base offset and base timestamp; offsets None means base_offset, base_offset+1, ..."""
    if offsets is None:
        offsets = range(base_offset, base_offset + len(records))
    return b"".join(encode_record(off - base_offset, r.timestamp - base_timestamp,
                                  r.key, r.value, r.headers)
                    for off, r in zip(offsets, records))


def decode_records(data, base_offset: int, base_timestamp: int, log_append_time: int | None,
                   base_sequence: int, records_count: int) -> list[Record]:
    """Decode a records section holding exactly `records_count` records."""
    out, pos = [], 0
    for _ in range(records_count):
        if pos >= len(data):
            raise InvalidRecordError(
                f"premature EOF: batch at offset {base_offset} declares "
                f"{records_count} records but holds only {len(out)}")
        record, pos = decode_record(data, pos, base_offset, base_timestamp,
                                    log_append_time, base_sequence)
        out.append(record)
    if pos != len(data):
        raise InvalidRecordError(
            f"incorrect declared batch size, records still remaining in file: batch at "
            f"offset {base_offset} declares {records_count} records, "
            f"{len(data) - pos} bytes are left over")
    return out


def decode_keys(data, base_offset: int, records_count: int) -> list[tuple[int, bytes | None]]:
    """(offset, key) of every record in a records section, checked as `decode_records` checks
    it: all the cleaner's offset map needs (the native codec builds no other objects)."""
    return [(r.offset, r.key)
            for r in decode_records(data, base_offset, 0, None, NO_SEQUENCE, records_count)]


def validate_records(data, base_offset: int, records_count: int) -> tuple[int, bool]:
    """Walk a producer batch's records section checking what `decode_records` checks, without
    building Record objects; offset deltas must be 0, 1, 2, ... Return (count, null key seen)."""
    end_all = len(data)
    pos, null_key = 0, False
    read_varint, read_varlong = varint.read_varint, varint.read_varlong
    for i in range(records_count):
        if pos >= end_all:
            raise InvalidRecordError(
                f"premature EOF: batch at offset {base_offset} declares "
                f"{records_count} records but holds only {i}")
        size, pos = read_varint(data, pos)
        end = pos + size
        if size < 0 or end > end_all:
            raise InvalidRecordError(
                f"premature EOF: record claims {size} bytes but only {end_all - pos} remain")
        pos += 1                                   # attributes
        _, pos = read_varlong(data, pos)           # timestamp delta
        offset_delta, pos = read_varint(data, pos)
        if offset_delta != i:
            raise InvalidRecordError(
                f"inner record offsets of a producer batch must be consecutive: record {i} "
                f"has offset delta {offset_delta}")
        for what in ("key", "value"):
            length, pos = read_varint(data, pos)
            if length < 0:
                null_key |= what == "key"
            elif pos + length > end:
                raise InvalidRecordError(f"invalid {what} size {length}: runs past the end "
                                         f"of the record")
            else:
                pos += length
        n_headers, pos = read_varint(data, pos)
        if n_headers < 0 or n_headers > end - pos:
            raise InvalidRecordError(f"found invalid number of record headers {n_headers}")
        for _ in range(n_headers):
            h_len, pos = read_varint(data, pos)
            if h_len < 0:
                raise InvalidRecordError("invalid negative header key size")
            pos += h_len
            v_len, pos = read_varint(data, pos)
            pos += max(v_len, 0)
            if pos > end:
                raise InvalidRecordError("record header runs past the end of the record")
        if pos != end:
            raise InvalidRecordError(
                f"invalid record size: expected to read {size} bytes in record payload, "
                f"but instead read {size - (end - pos)}")
    if pos != end_all:
        raise InvalidRecordError(
            f"incorrect declared batch size, records still remaining in file: batch at "
            f"offset {base_offset} declares {records_count} records, "
            f"{end_all - pos} bytes are left over")
    return records_count, null_key


def native_codec():
    """The C codec (kstore/_codec.c) when it may stand in for the functions above, else None.

    It is None when the extension is not built, when KSTORE_PURE_PYTHON is set, and while a
    learner's function replaces one of the reference functions it mirrors (kstore.grading.live
    plugs exercises in that way): then the engine runs the learner's code, record by record."""
    if native.codec is None:
        return None
    for names_of, namespace, references in _MIRRORED_BY_MODULE:   # one C call per module
        if names_of(namespace) != references:
            return None
    return native.codec


# --------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------

class RecordBatch:
    """A view of one v2 batch held in memory. `position` is its byte position in a file, if any."""

    __slots__ = ("buffer", "position", "base_offset", "batch_length", "partition_leader_epoch",
                 "magic", "crc", "attributes", "last_offset_delta", "base_timestamp",
                 "max_timestamp", "producer_id", "producer_epoch", "base_sequence", "records_count",
                 "size_in_bytes")

    def __init__(self, buffer, position: int | None = None):
        if len(buffer) < RECORD_BATCH_OVERHEAD:
            raise CorruptRecordError(
                f"record batch is corrupt (the size {len(buffer)} is smaller than the minimum "
                f"allowed overhead {RECORD_BATCH_OVERHEAD})")
        self.buffer = buffer
        self.position = position
        (self.base_offset, self.batch_length, self.partition_leader_epoch, self.magic, self.crc,
         self.attributes, self.last_offset_delta, self.base_timestamp, self.max_timestamp,
         self.producer_id, self.producer_epoch, self.base_sequence,
         self.records_count) = HEADER.unpack_from(buffer, 0)
        # Derived once, not a property: an append asks four times, and the length never changes.
        self.size_in_bytes = LOG_OVERHEAD + self.batch_length

    # ---- derived values
    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> Compression:
        codec = self.attributes & COMPRESSION_CODEC_MASK
        # A tuple lookup: the enum's own Compression(codec) costs ~0.4 µs, and every append and
        # read asks. An unknown codec id (5-7) still raises the enum's ValueError.
        return _CODECS[codec] if codec < len(_CODECS) else Compression(codec)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType(1 if self.attributes & TIMESTAMP_TYPE_MASK else 0)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_FLAG_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        return self.base_timestamp if self.has_delete_horizon else None

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return increment_sequence(self.base_sequence, self.last_offset_delta)

    # ---- validity
    def compute_crc(self) -> int:
        return crc32c(memoryview(self.buffer)[ATTRIBUTES_OFFSET:self.size_in_bytes])

    def is_valid(self) -> bool:
        return (self.size_in_bytes >= RECORD_BATCH_OVERHEAD and len(self.buffer) >= self.size_in_bytes
                and self.crc == self.compute_crc())

    def ensure_valid(self) -> None:
        """Raise CorruptRecordError unless the size is sane and the stored CRC matches."""
        size = LOG_OVERHEAD + self.batch_length   # size_in_bytes, read once: every append asks
        if size < RECORD_BATCH_OVERHEAD:
            raise CorruptRecordError(
                f"record batch at offset {self.base_offset} is corrupt (the size "
                f"{size} is smaller than the minimum allowed overhead "
                f"{RECORD_BATCH_OVERHEAD})")
        if len(self.buffer) < size:
            raise CorruptRecordError(
                f"record batch at offset {self.base_offset} is truncated: header says "
                f"{size} bytes, only {len(self.buffer)} present")
        computed = self.compute_crc()
        if computed != self.crc:
            raise CorruptRecordError(
                f"record batch at offset {self.base_offset} is corrupt (stored crc = "
                f"{self.crc:#010x}, computed crc = {computed:#010x})")

    # ---- contents
    def records_bytes(self) -> bytes:
        """The records section, decompressed."""
        raw = bytes(self.buffer[RECORDS_OFFSET:self.size_in_bytes])
        return raw if self.compression is Compression.NONE else decompress(self.compression, raw)

    def records_view(self):
        """The records section without copying it when uncompressed (a memoryview or bytes)."""
        if self.compression is Compression.NONE:
            return memoryview(self.buffer)[RECORDS_OFFSET:self.size_in_bytes]
        return self.records_bytes()

    def records(self) -> list[Record]:
        """Decode every record; the count must match exactly (DefaultRecordBatch iterators)."""
        self._check_v2()
        data = self.records_view()
        log_append_time = (self.max_timestamp
                           if self.timestamp_type is TimestampType.LOG_APPEND_TIME else None)
        return _run_codec("decode_records", data, self.base_offset, self.base_timestamp,
                          log_append_time, self.base_sequence, self.records_count,
                          native_extra=(Record,))

    def keys_and_offsets(self) -> list[tuple[int, bytes | None]]:
        """(offset, key) of every record, without building Record objects where the native codec
        runs (the cleaner's offset map)."""
        self._check_v2()
        return _run_codec("decode_keys", self.records_view(), self.base_offset, self.records_count)

    def _check_v2(self) -> None:
        if self.magic != CURRENT_MAGIC:
            raise InvalidRecordError(
                f"batch at offset {self.base_offset} has magic {self.magic}; kstore reads only "
                f"message format v2 (magic 2)")
        if self.records_count < 0:
            raise InvalidRecordError(
                f"found invalid record count {self.records_count} in magic v2 batch")

    def validate_records(self) -> tuple[int, bool]:
        """Walk the records section checking its structure without building Record objects
        (the checks of `records()`); return (count, whether some record has a null key).

        Offset deltas must be 0, 1, 2, ... (a producer's batch): the leader's validation path."""
        self._check_v2()
        return _run_codec("validate_records", self.records_view(), self.base_offset,
                          self.records_count)

    def validate(self) -> bool:
        """The leader's checks of a producer's batch: `ensure_valid` (size and CRC), then
        `validate_records` (the records' structure); return whether some record has a null key.
        The native codec does both in one call (`validate_batch`) for an uncompressed batch."""
        codec = native_codec()
        if codec is not None:
            null_key = codec.validate_batch(self.buffer, crc32c)
            if null_key is not None:
                return null_key
        self.ensure_valid()
        return self.validate_records()[1]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())

    def control_record_type(self) -> ControlRecordType:
        """For a control batch: the type in its (single) record's key."""
        recs = self.records()
        if not recs or recs[0].key is None or len(recs[0].key) < 4:
            return ControlRecordType.UNKNOWN
        (type_id,) = struct.unpack_from(">h", recs[0].key, 2)
        try:
            return ControlRecordType(type_id)
        except ValueError:
            return ControlRecordType.UNKNOWN

    def to_bytes(self) -> bytes:
        return bytes(self.buffer[:self.size_in_bytes])

    def header_dict(self) -> dict:
        return {name: getattr(self, _snake(name)) for name, *_ in HEADER_FIELDS}

    def __repr__(self) -> str:
        return (f"RecordBatch(base_offset={self.base_offset}, last_offset={self.last_offset}, "
                f"count={self.records_count}, size={self.size_in_bytes}, "
                f"epoch={self.partition_leader_epoch}, {self.compression.kafka_name})")


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


# ---- in-place header rewrites, as the leader does on append (LogValidator) ----

def set_base_offset(buf: bytearray, pos: int, base_offset: int) -> None:
    """Not covered by the CRC: no recomputation."""
    struct.pack_into(">q", buf, pos + BASE_OFFSET_OFFSET, base_offset)


def set_partition_leader_epoch(buf: bytearray, pos: int, epoch: int) -> None:
    """Not covered by the CRC: no recomputation."""
    struct.pack_into(">i", buf, pos + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def set_max_timestamp(buf: bytearray, pos: int, timestamp_type: TimestampType,
                      max_timestamp: int) -> None:
    """Set the timestamp type bit and maxTimestamp; both are CRC-covered, so the CRC is redone."""
    (attributes,) = struct.unpack_from(">h", buf, pos + ATTRIBUTES_OFFSET)
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    else:
        attributes &= ~TIMESTAMP_TYPE_MASK
    struct.pack_into(">h", buf, pos + ATTRIBUTES_OFFSET, attributes)
    struct.pack_into(">q", buf, pos + MAX_TIMESTAMP_OFFSET, max_timestamp)
    (length,) = struct.unpack_from(">i", buf, pos + LENGTH_OFFSET)
    end = pos + LOG_OVERHEAD + length
    struct.pack_into(">I", buf, pos + CRC_OFFSET, crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET:end]))


# ---- building (MemoryRecordsBuilder) ----

def build_batch(records: Iterable[Record], *, base_offset: int = 0,
                compression: Compression = Compression.NONE,
                timestamp_type: TimestampType = TimestampType.CREATE_TIME,
                partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
                producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
                base_sequence: int = NO_SEQUENCE, transactional: bool = False,
                control: bool = False, delete_horizon_ms: int | None = None,
                offsets: Sequence[int] | None = None, last_offset_delta: int | None = None,
                max_timestamp: int | None = None) -> bytes:
    """Build one v2 batch.

    Records get offsets base_offset, base_offset+1, ... unless `offsets` gives them (the cleaner
    keeps original offsets, leaving gaps). `last_offset_delta` may be forced above the last
    record's delta (the cleaner keeps the producer's last sequence). `max_timestamp` overrides the
    computed one (LogAppendTime keeps the broker's time).
    """
    records = list(records)
    if offsets is not None and len(offsets) != len(records):
        raise ValueError("offsets must have one entry per record")
    if delete_horizon_ms is not None:
        base_timestamp = delete_horizon_ms
    else:
        base_timestamp = records[0].timestamp if records else NO_TIMESTAMP
    body = _encode_body(records, offsets, base_offset, base_timestamp)
    if compression != Compression.NONE:
        body = compress(compression, body)
    if max_timestamp is None:
        max_timestamp = max((r.timestamp for r in records), default=NO_TIMESTAMP)
    if last_offset_delta is None:
        last_offset_delta = ((offsets[-1] if offsets is not None else base_offset + len(records) - 1)
                             - base_offset) if records else 0
    attributes = int(compression) & COMPRESSION_CODEC_MASK
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    if transactional:
        attributes |= TRANSACTIONAL_FLAG_MASK
    if control:
        attributes |= CONTROL_FLAG_MASK
    if delete_horizon_ms is not None:
        attributes |= DELETE_HORIZON_FLAG_MASK
    header = bytearray(RECORD_BATCH_OVERHEAD)
    HEADER.pack_into(header, 0, base_offset, RECORD_BATCH_OVERHEAD + len(body) - LOG_OVERHEAD,
                     partition_leader_epoch, CURRENT_MAGIC, 0, attributes, last_offset_delta,
                     base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence,
                     len(records))
    crc = _crc32c.crc32c(body, value=_crc32c.crc32c(memoryview(header)[ATTRIBUTES_OFFSET:]))
    struct.pack_into(">I", header, CRC_OFFSET, crc)
    return bytes(header) + body


def _encode_body(records: list, offsets, base_offset: int, base_timestamp: int) -> bytes:
    if offsets is not None and not isinstance(offsets, list):
        offsets = list(offsets)
    return _run_codec("encode_records", records, offsets, base_offset, base_timestamp)


def _run_codec(name: str, *args, native_extra: tuple = ()):
    """Call codec function `name`: the native one when it may stand in and takes the input, else
    this module's (the reference, or a learner's function plugged in its place), which also
    raises the errors."""
    codec = native_codec()
    if codec is not None:
        out = getattr(codec, name)(*args, *native_extra)
        if out is not None:
            return out
    return globals()[name](*args)


def build_empty_batch(*, base_offset: int, last_offset: int, max_timestamp: int,
                      partition_leader_epoch: int, producer_id: int, producer_epoch: int,
                      base_sequence: int, timestamp_type: TimestampType,
                      transactional: bool = False, control: bool = False) -> bytes:
    """A header-only batch, count 0, as the cleaner keeps one (DefaultRecordBatch.writeEmptyHeader)."""
    return build_batch([], base_offset=base_offset, timestamp_type=timestamp_type,
                       partition_leader_epoch=partition_leader_epoch, producer_id=producer_id,
                       producer_epoch=producer_epoch, base_sequence=base_sequence,
                       transactional=transactional, control=control,
                       last_offset_delta=last_offset - base_offset, max_timestamp=max_timestamp)


def build_control_batch(record_type: ControlRecordType, *, base_offset: int = 0, timestamp: int,
                        producer_id: int, producer_epoch: int, coordinator_epoch: int = 0,
                        partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH) -> bytes:
    """A transaction marker (EndTransactionMarker): key = version 0 + type, value = version 0 + epoch."""
    key = struct.pack(">hh", 0, int(record_type))
    value = struct.pack(">hi", 0, coordinator_epoch)
    return build_batch([Record(key, value, timestamp)], base_offset=base_offset, control=True,
                       transactional=True, producer_id=producer_id, producer_epoch=producer_epoch,
                       partition_leader_epoch=partition_leader_epoch)


# --------------------------------------------------------------------------------------------
# A buffer of batches (MemoryRecords + ByteBufferLogInputStream)
# --------------------------------------------------------------------------------------------

def batch_crc_mismatch(buffer, position: int = 0) -> tuple[int, int] | None:
    """The CRC-32C check of the v2 batch at `buffer[position:]`: None when the stored CRC matches
    the one computed over attributes..end, else (stored, computed). This is the one CRC check all
    of kstore's read paths call (a native codec may replace this function)."""
    (length,) = struct.unpack_from(">i", buffer, position + LENGTH_OFFSET)
    (stored,) = struct.unpack_from(">I", buffer, position + CRC_OFFSET)
    # A memoryview: the CRC is computed in place, without copying the batch first.
    computed = crc32c(memoryview(buffer)[position + ATTRIBUTES_OFFSET:position + LOG_OVERHEAD + length])
    return None if computed == stored else (stored, computed)


def check_batch(buffer, position: int = 0, *, topic: str, partition: int,
                file: str | None = None, file_position: int | None = None) -> None:
    """What a consumer with `check.crcs=true` (Kafka's default) checks before using a batch: a
    whole batch whose CRC matches. Raises CorruptRecordError naming the topic, partition, base
    offset and (when known) the file and position of the batch."""
    (base_offset, length) = struct.unpack_from(">qi", buffer, position)
    if length < MIN_BATCH_LENGTH_FIELD or len(buffer) - position < LOG_OVERHEAD + length:
        cause = (f"the batch length {length} does not fit the {len(buffer) - position} bytes "
                 f"present")
    else:
        mismatch = batch_crc_mismatch(buffer, position)
        if mismatch is None:
            return
        cause = f"Record is corrupt (stored crc = {mismatch[0]}, computed crc = {mismatch[1]})"
    where = f" (file {file}" + (f", position {file_position})" if file_position is not None
                                else ")") if file else ""
    raise CorruptRecordError(f"Record batch for partition {topic}-{partition} at offset "
                             f"{base_offset}{where} is invalid, cause: {cause}")


@dataclass
class MemoryRecords:
    """Batches held in memory, e.g. a producer request or bytes read from a file.

    Iteration follows `ByteBufferLogInputStream`: it stops quietly at a partial trailing batch (a
    read may end in the middle of one) and raises CorruptRecordError for an impossible length or
    magic byte.
    """
    buffer: bytes | bytearray | memoryview
    max_batch_size: int | None = None
    base_position: int = 0
    _batches: list | None = field(default=None, repr=False)

    @classmethod
    def of(cls, *batches: bytes) -> "MemoryRecords":
        return cls(b"".join(batches))

    def batches(self) -> list[RecordBatch]:
        if self._batches is None:
            self._batches = self._read_batches()
        return self._batches

    def _read_batches(self) -> list[RecordBatch]:
        # A list built in a loop, not a generator: every append reads its request this way.
        buf, pos, end = self.buffer, 0, len(self.buffer)
        view = buf if isinstance(buf, memoryview) else None if isinstance(buf, bytes) \
            else memoryview(buf)
        found: list[RecordBatch] = []
        while end - pos >= LOG_OVERHEAD:
            (length,) = struct.unpack_from(">i", buf, pos + LENGTH_OFFSET)
            if length < MIN_BATCH_LENGTH_FIELD:
                raise CorruptRecordError(
                    f"record size {length} is less than the minimum record overhead "
                    f"({MIN_BATCH_LENGTH_FIELD}) at position {self.base_position + pos}")
            if self.max_batch_size is not None and length > self.max_batch_size:
                raise CorruptRecordError(
                    f"record size {length} exceeds the largest allowable message size "
                    f"({self.max_batch_size}) at position {self.base_position + pos}")
            if end - pos < HEADER_SIZE_UP_TO_MAGIC or end - pos < LOG_OVERHEAD + length:
                break  # partial trailing batch
            magic = buf[pos + MAGIC_OFFSET]
            magic = magic - 256 if magic > 127 else magic
            if magic < 0 or magic > CURRENT_MAGIC:
                raise CorruptRecordError(
                    f"invalid magic found in record: {magic} at position {self.base_position + pos}")
            size = LOG_OVERHEAD + length
            found.append(RecordBatch(buf[pos:pos + size] if view is None else view[pos:pos + size],
                                     self.base_position + pos))
            pos += size
        return found

    def __iter__(self) -> Iterator[RecordBatch]:
        return iter(self.batches())

    def records(self, skip_control: bool = True) -> Iterator[Record]:
        """Every record of every complete batch; control batches (transaction markers) skipped."""
        for batch in self.batches():
            if skip_control and batch.is_control:
                continue
            yield from batch.records()

    def size_in_bytes(self) -> int:
        return len(self.buffer)

    def valid_bytes(self) -> int:
        return sum(b.size_in_bytes for b in self.batches())


# The functions the native codec stands in for (see native_codec): all must be the reference ones.
_THIS = sys.modules[__name__]
_MIRRORED = tuple((module, name, module.__dict__[name]) for module, name in (
    (varint, "read_unsigned_varint"), (varint, "read_varint"), (varint, "read_varlong"),
    (varint, "write_varint"), (varint, "write_varlong"), (varint, "write_unsigned_varint"),
    (_THIS, "encode_record"), (_THIS, "decode_record"), (_THIS, "_read_bytes_field"),
    (_THIS, "_bytes_field"), (_THIS, "encode_records"), (_THIS, "decode_records"),
    (_THIS, "decode_keys"), (_THIS, "validate_records"), (_THIS, "record_size_in_bytes")))
_REFERENCE_RECORD_SIZE = record_size_in_bytes
# The same, grouped by module for native_codec(), which runs on every codec call: an itemgetter
# reads a module's current functions in one call, compared at once (by identity) with the references.
_MIRRORED_BY_MODULE = tuple(
    (operator.itemgetter(*names), module.__dict__, tuple(module.__dict__[n] for n in names))
    for module in (varint, _THIS)
    for names in [tuple(n for m, n, _ in _MIRRORED if m is module)])

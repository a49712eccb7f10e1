"""RecordBatch v2 bytes → Arrow record batches with the Kafka source's columns.

Spark's Python data sources are fastest when `read()` yields `pyarrow.RecordBatch`es: Spark then
takes the columns as they are, instead of converting one Python tuple per row. So the reader never
builds `Record` objects: it walks each batch's records with the varints inlined (one- and two-byte
varints, nearly all of them, never leave the loop) and appends straight into column lists, which
become Arrow arrays once ~64k rows have accumulated:

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp (µs, UTC), timestampType int [, headers array<struct<key string, value binary>>]

The batch header tells everything that is the same for its records: base offset, base timestamp,
timestamp type (attributes bit 3; LogAppendTime batches carry the broker's time in maxTimestamp),
compression (the records section is decompressed once with `kstore.compression`), control flag
(transaction markers are skipped, as consumers skip them). Offsets may have gaps (compaction) and a
batch may begin below the requested start offset (a fetch starts at a batch boundary): records
outside [start, end) are dropped, and only batches that straddle a boundary pay for that check.
The CRC is checked for every batch, as Kafka's consumers do (`check.crcs=true`).
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa

from ..compression import Compression, decompress
from ..errors import CorruptRecordError, InvalidRecordError
from ..records import (ATTRIBUTES_OFFSET, COMPRESSION_CODEC_MASK, CONTROL_FLAG_MASK, CURRENT_MAGIC,
                       HEADER, LOG_OVERHEAD, MAGIC_OFFSET, MIN_BATCH_LENGTH_FIELD,
                       RECORD_BATCH_OVERHEAD, TIMESTAMP_TYPE_MASK, crc32c)

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

# The Arrow schema Spark derives from the source's DDL schema (every column nullable).
ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
    pa.field("timestamp", TIMESTAMP_TYPE), pa.field("timestampType", pa.int32()),
])
ARROW_SCHEMA_WITH_HEADERS = ARROW_SCHEMA.append(pa.field("headers", HEADER_TYPE))

ROWS_PER_ARROW_BATCH = 65536
_HEADER_UNPACK = HEADER.unpack_from


def _varint_slow(data, p: int) -> tuple[int, int]:
    """A zig-zag varint of any length at data[p]: (value, position after it)."""
    shift = value = 0
    while True:
        b = data[p]
        p += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return (value >> 1) ^ -(value & 1), p
        shift += 7
        if shift > 63:
            raise InvalidRecordError(f"varint longer than 10 bytes at position {p - 10}")


class ColumnBuilder:
    """Column lists for one topic-partition, cut into Arrow record batches."""

    def __init__(self, topic: str, partition: int, include_headers: bool = False,
                 rows_per_batch: int = ROWS_PER_ARROW_BATCH):
        self.topic, self.partition = topic, partition
        self.include_headers = include_headers
        self.rows_per_batch = rows_per_batch
        self.schema = ARROW_SCHEMA_WITH_HEADERS if include_headers else ARROW_SCHEMA
        self._topic_bytes = topic.encode("utf-8")
        self._reset()
        self.rows = 0            # rows emitted so far (all Arrow batches)
        self.last_offset = -1    # offset of the last record kept

    def _reset(self) -> None:
        self.keys: list = []
        self.values: list = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.type_runs: list[tuple[int, int]] = []   # (timestampType, number of rows)
        self.headers: list = []

    def __len__(self) -> int:
        return len(self.offsets)

    # ---- decoding
    def add_batch(self, buf, pos: int, start: int, end: int, check_crc: bool = True) -> int:
        """Decode the v2 batch at buf[pos:] keeping records with start ≤ offset < end.
        Returns the number of records kept."""
        magic = buf[pos + MAGIC_OFFSET]
        if magic != CURRENT_MAGIC:
            raise InvalidRecordError(
                f"batch at position {pos} of {self.topic}-{self.partition} has magic {magic}; "
                f"only message format v2 (magic 2) is read")
        (base_offset, length, _epoch, magic, crc, attributes, last_delta, base_ts, max_ts,
         _pid, _pepoch, _seq, count) = _HEADER_UNPACK(buf, pos)
        size = LOG_OVERHEAD + length
        if check_crc:
            computed = crc32c(buf[pos + ATTRIBUTES_OFFSET:pos + size])
            if computed != crc:
                raise CorruptRecordError(
                    f"record batch at offset {base_offset} of {self.topic}-{self.partition} is "
                    f"corrupt (stored crc = {crc:#010x}, computed crc = {computed:#010x})")
        if attributes & CONTROL_FLAG_MASK or count == 0:
            return 0                     # transaction markers / emptied batches: not data
        last_offset = base_offset + last_delta
        if last_offset < start or base_offset >= end:
            return 0
        codec = attributes & COMPRESSION_CODEC_MASK
        raw = buf[pos + RECORD_BATCH_OVERHEAD:pos + size]
        data = bytes(raw) if codec == 0 else decompress(Compression(codec), raw)
        log_append = bool(attributes & TIMESTAMP_TYPE_MASK)
        whole = base_offset >= start and last_offset < end
        before = len(self.offsets)
        self._decode(data, count, base_offset, base_ts, max_ts if log_append else None,
                     None if whole else (start, end))
        kept = len(self.offsets) - before
        if kept:
            self.type_runs.append((1 if log_append else 0, kept))
            self.last_offset = self.offsets[-1]
        return kept

    def _decode(self, data: bytes, count: int, base_offset: int, base_ts: int,
                log_append_ts: int | None, bounds: tuple[int, int] | None) -> None:
        keys_append, values_append = self.keys.append, self.values.append
        offsets_append, ts_append = self.offsets.append, self.timestamps.append
        headers_append = self.headers.append if self.include_headers else None
        slow = _varint_slow
        n = len(data)
        p = 0
        try:
            for _ in range(count):
                # length (zig-zag varint; one or two bytes for records up to 8 KiB)
                b = data[p]
                if b < 0x80:
                    ln = (b >> 1) ^ -(b & 1)
                    p += 1
                else:
                    b2 = data[p + 1]
                    if b2 < 0x80:
                        v = (b & 0x7F) | (b2 << 7)
                        ln = (v >> 1) ^ -(v & 1)
                        p += 2
                    else:
                        ln, p = slow(data, p)
                rec_end = p + ln
                p += 1                                  # attributes (unused)
                b = data[p]                             # timestamp delta
                if b < 0x80:
                    tsd = (b >> 1) ^ -(b & 1)
                    p += 1
                else:
                    tsd, p = slow(data, p)
                b = data[p]                             # offset delta
                if b < 0x80:
                    od = (b >> 1) ^ -(b & 1)
                    p += 1
                else:
                    b2 = data[p + 1]
                    if b2 < 0x80:
                        v = (b & 0x7F) | (b2 << 7)
                        od = (v >> 1) ^ -(v & 1)
                        p += 2
                    else:
                        od, p = slow(data, p)
                b = data[p]                             # key length
                if b < 0x80:
                    kl = (b >> 1) ^ -(b & 1)
                    p += 1
                else:
                    kl, p = slow(data, p)
                if kl < 0:
                    key = None
                else:
                    key = data[p:p + kl]
                    p += kl
                b = data[p]                             # value length
                if b < 0x80:
                    vl = (b >> 1) ^ -(b & 1)
                    p += 1
                else:
                    b2 = data[p + 1]
                    if b2 < 0x80:
                        v = (b & 0x7F) | (b2 << 7)
                        vl = (v >> 1) ^ -(v & 1)
                        p += 2
                    else:
                        vl, p = slow(data, p)
                if vl < 0:
                    value = None
                else:
                    value = data[p:p + vl]
                    p += vl
                if p > rec_end or rec_end > n:
                    raise InvalidRecordError(
                        f"record at offset {base_offset + od} of {self.topic}-{self.partition} "
                        f"runs past its declared length")
                offset = base_offset + od
                if bounds is not None and not bounds[0] <= offset < bounds[1]:
                    p = rec_end
                    continue
                if headers_append is not None:
                    headers_append(self._headers(data, p, rec_end) if p < rec_end and data[p] else None)
                p = rec_end
                keys_append(key)
                values_append(value)
                offsets_append(offset)
                ts_append(log_append_ts if log_append_ts is not None else base_ts + tsd)
        except IndexError:
            raise InvalidRecordError(
                f"premature end of a batch at offset {base_offset} of {self.topic}-"
                f"{self.partition}: it declares {count} records") from None
        if p != n:
            raise InvalidRecordError(
                f"batch at offset {base_offset} of {self.topic}-{self.partition} declares {count} "
                f"records but {n - p} bytes are left over")

    @staticmethod
    def _headers(data: bytes, p: int, end: int) -> list[tuple[str, bytes | None]] | None:
        count, p = _varint_slow(data, p)
        if count < 0 or count > end - p:
            raise InvalidRecordError(f"found invalid number of record headers {count}")
        out = []
        for _ in range(count):
            kl, p = _varint_slow(data, p)
            if kl < 0:
                raise InvalidRecordError("invalid negative header key size")
            hkey = data[p:p + kl].decode("utf-8", errors="replace")
            p += kl
            vl, p = _varint_slow(data, p)
            if vl < 0:
                out.append((hkey, None))
            else:
                out.append((hkey, data[p:p + vl]))
                p += vl
        if p != end:
            raise InvalidRecordError("record headers do not end where the record does")
        return out or None

    # ---- Arrow
    def full(self) -> bool:
        return len(self.offsets) >= self.rows_per_batch

    def flush(self) -> pa.RecordBatch | None:
        """The rows gathered so far as one Arrow record batch (None when there are none)."""
        n = len(self.offsets)
        if n == 0:
            return None
        topic = self._topic_bytes
        topic_offsets = np.arange(0, (n + 1) * len(topic), len(topic) or 1, dtype=np.int32)[:n + 1] \
            if topic else np.zeros(n + 1, dtype=np.int32)
        topics = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(topic_offsets),
                                                         pa.py_buffer(topic * n)])
        ts = np.fromiter(self.timestamps, dtype=np.int64, count=n)
        ts *= 1000
        if len(self.type_runs) == 1:
            types = np.full(n, self.type_runs[0][0], dtype=np.int32)
        else:
            types = np.repeat(np.array([t for t, _ in self.type_runs], dtype=np.int32),
                              [c for _, c in self.type_runs])
        columns = [
            pa.array(self.keys, type=pa.binary()),
            pa.array(self.values, type=pa.binary()),
            topics,
            pa.array(np.full(n, self.partition, dtype=np.int32)),
            pa.array(np.fromiter(self.offsets, dtype=np.int64, count=n)),
            pa.array(ts, type=TIMESTAMP_TYPE),
            pa.array(types),
        ]
        if self.include_headers:
            columns.append(pa.array(self.headers, type=HEADER_TYPE))
        batch = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        self.rows += n
        self._reset()
        return batch


def batch_spans(buf, start_pos: int = 0):
    """(position, base offset, last offset, size) of each complete batch in `buf` from start_pos;
    stops at a partial trailing batch (a read may end inside one)."""
    n = len(buf)
    pos = start_pos
    unpack = struct.Struct(">qi").unpack_from
    last_delta = struct.Struct(">i").unpack_from
    while n - pos >= RECORD_BATCH_OVERHEAD:
        base, length = unpack(buf, pos)
        if length == 0 and base == 0:
            return          # a preallocated file's zero tail: the end of the data
        if length < MIN_BATCH_LENGTH_FIELD:
            raise CorruptRecordError(f"record size {length} is less than the minimum record "
                                     f"overhead ({MIN_BATCH_LENGTH_FIELD}) at position {pos}")
        size = LOG_OVERHEAD + length
        if pos + size > n:
            return
        last = base + last_delta(buf, pos + 23)[0] if buf[pos + MAGIC_OFFSET] == CURRENT_MAGIC else base
        yield pos, base, last, size
        pos += size

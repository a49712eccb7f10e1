"""RecordBatch v2 bytes → Arrow record batches with the Kafka source's columns.

Spark's Python data sources are fastest when `read()` yields `pyarrow.RecordBatch`es: Spark then
takes the columns as they are, instead of converting one Python tuple per row. The reader never
builds `Record` objects either. Decoding is columnar, in two steps per ~64k rows:

1. per batch: check the CRC (as Kafka's consumers do, `check.crcs=true`), decompress the
   records section once (`kstore.compression`), and walk the chain of record lengths — the
   only step that must go record by record (a record's start depends on the previous length).
   A read buffer's uncompressed batches go through `take_batches`, many per call (in C when the
   native codec is built: no Python work per batch); any other batch through `add_batch`, in
   Python, with the walk in C where it can (`record_lengths`) or a Python loop where one- and
   two-byte varints, nearly all of them, never leave the loop;
2. for all the records at once, with numpy: every other field sits at a position computed from
   the previous field's position and varint size, so attributes, timestamp delta, offset delta,
   key length and value length are decoded as whole columns (`_varints`). Keys and values are
   then cut out of the buffer by Arrow itself: an Arrow binary array is built over the buffer
   whose offsets alternate [key start, key end, next key start, ...] — every even element is a
   key, every odd one the bytes in between — and `take` of the even elements copies the keys
   into a contiguous array in C++.

PySpark's Python data source API (4.3) has no column-pruning hook (only filters can be pushed
down), so a query that needs few columns names them in a user-specified schema; the reader then
asks this decoder for only those columns (`ColumnBuilder(columns=...)`, plus `offset`, by which
it follows its progress) and drops `offset` again before the batches cross to the JVM
(`source.project`). The walk over the records is shared by every column and always done (it is
also the structural check); what a pruned read skips is cutting out values or keys, computing
timestamps, and building the constant columns — about 15 % of the decoding of a key-only read of
100-byte records. The hand-over to the JVM, not the decoding, is what costs most.

The batch header gives everything shared by its records: base offset, base timestamp, timestamp
type (attributes bit 3; LogAppendTime batches carry the broker's time in maxTimestamp),
compression, control flag (transaction markers are skipped, as consumers skip them). Offsets may
have gaps (compaction) and a fetch starts at a batch boundary, so records outside [start, end) are
masked out. Headers (includeHeaders=true) are parsed in Python, only for records that have some.

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp (µs, UTC), timestampType int [, headers array<struct<key string, value binary>>]
"""

from __future__ import annotations

import struct
from array import array
from typing import Sequence

import numpy as np
import pyarrow as pa

from .. import native
from ..compression import Compression, decompress
from ..errors import CorruptRecordError, InvalidRecordError
from ..records import (ATTRIBUTES_OFFSET, COMPRESSION_CODEC_MASK, CONTROL_FLAG_MASK, CURRENT_MAGIC,
                       HEADER, LOG_OVERHEAD, MAGIC_OFFSET, MIN_BATCH_LENGTH_FIELD,
                       RECORD_BATCH_OVERHEAD, TIMESTAMP_TYPE_MASK, check_batch, crc32c)

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
MAX_ARROW_BATCH_BYTES = 64 * 1024 * 1024
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


def _varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zig-zag varints at every position of `pos` in `buf`: (values, sizes in bytes)."""
    first = buf[pos]
    two = first >= 0x80
    if not two.any():                      # all one byte (the common case): no 64-bit work
        small = first.astype(np.int64)
        return (small >> 1) ^ -(small & 1), np.ones(len(pos), dtype=np.int64)
    # Two bytes (offset deltas past 63, 100-byte values' lengths) as whole columns too; only
    # the rare longer ones take the general loop below.
    second = buf[np.minimum(pos + 1, len(buf) - 1)]
    if not (two & (second >= 0x80)).any():
        z = (first & 0x7F).astype(np.int64) | ((second & 0x7F).astype(np.int64) << 7) * two
        return (z >> 1) ^ -(z & 1), 1 + two.astype(np.int64)
    return _varints_any(buf, pos, first)


def _varints_any(buf: np.ndarray, pos: np.ndarray, first: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """`_varints` where some are longer than two bytes: one byte position per round."""
    b = first.astype(np.uint64)
    value = b & np.uint64(0x7F)
    size = np.ones(len(pos), dtype=np.int64)
    more = np.flatnonzero(b >= 0x80)
    shift = 7
    while more.size:
        if shift > 63:
            raise InvalidRecordError("a varint longer than 10 bytes")
        nxt = buf[pos[more] + size[more]].astype(np.uint64)
        value[more] |= (nxt & np.uint64(0x7F)) << np.uint64(shift)
        size[more] += 1
        more = more[nxt >= 0x80]
        shift += 7
    return (value >> np.uint64(1)).view(np.int64) ^ -(value & np.uint64(1)).view(np.int64), size


def _cut(buf_arrow: pa.Buffer, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary array of buf[starts[i] : starts[i] + lengths[i]] (null where length < 0)."""
    n = len(starts)
    if n == 0:
        return pa.array([], type=pa.binary())
    present = lengths >= 0
    ends = starts + np.where(present, lengths, 0)
    offsets = np.empty(2 * n, dtype=np.int32)
    offsets[0::2] = starts
    offsets[1::2] = ends
    validity = None
    if not present.all():
        bits = np.ones(2 * n - 1, dtype=bool)
        bits[0::2] = present
        validity = pa.py_buffer(np.packbits(bits, bitorder="little"))
    interleaved = pa.Array.from_buffers(pa.binary(), 2 * n - 1,
                                        [validity, pa.py_buffer(offsets), buf_arrow])
    return interleaved.take(pa.array(np.arange(0, 2 * n - 1, 2, dtype=np.int64)))


def decoded_schema(include_headers: bool, columns: Sequence[str] | None = None) -> pa.Schema:
    """The Arrow schema of the batches decoded for `columns` (all when None), in the fixed
    order. `offset` is always among them: a reader follows its progress by the last offset."""
    full = ARROW_SCHEMA_WITH_HEADERS if include_headers else ARROW_SCHEMA
    if columns is None:
        return full
    wanted = set(columns) | {"offset"}
    return pa.schema([f for f in full if f.name in wanted])


class ColumnBuilder:
    """Batches of one topic-partition, decoded into Arrow record batches of ~64k rows."""

    def __init__(self, topic: str, partition: int, include_headers: bool = False,
                 rows_per_batch: int = ROWS_PER_ARROW_BATCH, check_crcs: bool = True,
                 columns: Sequence[str] | None = None):
        self.topic, self.partition = topic, partition
        self.check_crcs = check_crcs      # the source's kafka.check.crcs (Kafka's default: true)
        self.include_headers = include_headers
        self.rows_per_batch = rows_per_batch
        self.schema = decoded_schema(include_headers, columns)
        self._topic_bytes = topic.encode("utf-8")
        self._reset()
        self.rows = 0            # rows emitted so far

    def _reset(self) -> None:
        self._payloads: list[bytes | memoryview] = []
        self._size = 0
        self._lengths: list[np.ndarray] = []   # per batch: each record's zig-zag length varint
        self._batches: list[tuple] = []     # (count, base offset, base ts, log-append ts, lo, hi)
        self._pending = 0

    def __len__(self) -> int:
        return self._pending

    def full(self) -> bool:
        return self._pending >= self.rows_per_batch or self._size >= MAX_ARROW_BATCH_BYTES

    # ---- step 1: per batch
    def add_batch(self, buf, pos: int, start: int, end: int, check_crc: bool | None = None,
                  file: str | None = None, file_position: int | None = None) -> int:
        """Queue the records of the v2 batch at buf[pos:] whose offsets are in [start, end).
        Returns the number of records queued (a batch straddling a bound is trimmed on flush).
        `check_crc` is the consumer's check.crcs (default true); `file`/`file_position` say where
        the batch was read, for the error."""
        magic = buf[pos + MAGIC_OFFSET]
        if magic != CURRENT_MAGIC:
            raise InvalidRecordError(
                f"batch at position {pos} of {self.topic}-{self.partition} has magic {magic}; "
                f"only message format v2 (magic 2) is read")
        (base_offset, length, _epoch, magic, crc, attributes, last_delta, base_ts, max_ts,
         _pid, _pepoch, _seq, count) = _HEADER_UNPACK(buf, pos)
        size = LOG_OVERHEAD + length
        if self.check_crcs if check_crc is None else check_crc:
            check_batch(buf, pos, topic=self.topic, partition=self.partition, file=file,
                        file_position=file_position)
        if attributes & CONTROL_FLAG_MASK or count <= 0:
            return 0                     # transaction markers / emptied batches: not data
        if base_offset + last_delta < start or base_offset >= end:
            return 0
        codec = attributes & COMPRESSION_CODEC_MASK
        raw = memoryview(buf)[pos + RECORD_BATCH_OVERHEAD:pos + size]
        # Uncompressed records stay a view of the read buffer until flush joins them: one copy.
        data = raw if codec == 0 else decompress(Compression(codec), raw)
        self._lengths.append(self._record_lengths(data, count, base_offset))
        self._payloads.append(data)
        self._size += len(data)
        log_append = max_ts if attributes & TIMESTAMP_TYPE_MASK else None
        whole = base_offset >= start and base_offset + last_delta < end
        self._batches.append((count, base_offset, base_ts, log_append,
                              None if whole else start, None if whole else end))
        self._pending += count
        return count

    def add_batches(self, buf, positions: Sequence[int], start: int, end: int,
                    file: str | None = None, chunk_position: int = 0):
        """`add_batch` for each batch at `positions` of `buf`, yielding the Arrow batches that
        fill up on the way. Runs of batches go through `take_batches` (in C where the native codec
        is built: one call queues many batches, with no Python work per batch); a batch it does
        not take (compressed, another magic, a bad CRC...) goes through `add_batch`, which
        decompresses it or raises its error."""
        take = getattr(native.codec, "take_batches", None) or take_batches
        at = np.asarray(positions, dtype=np.int64)
        i, n = 0, len(positions)
        while i < n:
            room = max(self.rows_per_batch - self._pending, 1)
            nxt, meta, lengths = take(buf, at, i, start, end, self.check_crcs, crc32c, room)
            if nxt == i:
                self.add_batch(buf, positions[i], start, end, file=file,
                               file_position=chunk_position + positions[i])
                i += 1
            else:
                self._queue(buf, meta, lengths, start, end)
                i = nxt
            if self.full():
                batch = self.flush()
                if batch is not None:         # None: every queued record was out of bounds
                    yield batch

    def _queue(self, buf, meta: bytes, lengths: bytes, start: int, end: int) -> None:
        """Queue what take_batches took, as add_batch queues each batch: its records section
        stays a view of the read buffer until flush joins them (one copy)."""
        if not meta:
            return
        view = memoryview(buf)
        for count, base, last_delta, base_ts, max_ts, attributes, pos, size in \
                np.frombuffer(meta, dtype=np.int64).reshape(-1, len(BATCH_META)).tolist():
            whole = base >= start and base + last_delta < end
            self._batches.append((count, base, base_ts,
                                  max_ts if attributes & TIMESTAMP_TYPE_MASK else None,
                                  None if whole else start, None if whole else end))
            self._payloads.append(view[pos + RECORD_BATCH_OVERHEAD:pos + size])
            self._size += size - RECORD_BATCH_OVERHEAD
            self._pending += count
        self._lengths.append(np.frombuffer(lengths, dtype=np.int64))

    def drop_batch(self, buf, pos: int, file: str | None = None,
                   file_position: int | None = None) -> None:
        """A batch the reader drops unread (read_committed: an aborted transaction's) is still
        CRC-checked first, as Kafka's consumer checks every batch it fetched before it skips
        the aborted ones."""
        if self.check_crcs:
            check_batch(buf, pos, topic=self.topic, partition=self.partition, file=file,
                        file_position=file_position)

    def _record_lengths(self, data: bytes, count: int, base_offset: int) -> np.ndarray:
        """The walk below, in C when the native codec is built (`record_lengths` in
        kstore/_codec.c); the Python walk runs where C finds something wrong, to raise its error."""
        walk = getattr(native.codec, "record_lengths", None)
        if walk is not None:
            found = walk(data, count)
            if found is not None:
                return np.frombuffer(found, dtype=np.int64)
        out: list[int] = []
        self._walk(data, count, out.append, base_offset)
        return np.array(out, dtype=np.int64)

    def _walk(self, data: bytes, count: int, append, base_offset: int) -> None:
        """Record boundaries: append the raw (zig-zag) length varint of each record. Positions
        are computed from these later, as whole columns (a record is its length varint + body)."""
        n = len(data)
        p = 0
        try:
            for _ in range(count):
                b = data[p]
                if b < 0x80:
                    v = b
                    p += 1 + (b >> 1)
                else:
                    b2 = data[p + 1]
                    if b2 < 0x80:
                        v = (b & 0x7F) | (b2 << 7)
                        p += 2 + (v >> 1)
                    else:
                        ln, q = _varint_slow(data, p)
                        if ln < 0:
                            raise InvalidRecordError(f"record of {ln} bytes")
                        v = ln << 1
                        p = q + ln
                append(v)
        except IndexError:
            p = n + 1
        if p != n:
            raise InvalidRecordError(
                f"batch at offset {base_offset} of {self.topic}-{self.partition} declares {count} "
                f"records, which do not fill its {n} bytes of records exactly")

    # ---- step 2: every record's fields
    FIELDS = ("timestamp delta", "offset delta", "key start", "key length", "value start",
              "value length", "headers position", "end")

    def _record_fields(self, buf: np.ndarray, zz: np.ndarray) -> tuple[np.ndarray, ...]:
        """`_fields` below, in C when the native codec is built (`record_fields` in
        kstore/_codec.c: one pass over the records); the numpy reference runs where C finds
        something wrong, to raise its error."""
        fields = getattr(native.codec, "record_fields", None)
        if fields is not None:
            found = fields(buf, zz)
            if found is not None:
                return tuple(np.frombuffer(found, dtype=np.int64).reshape(len(self.FIELDS), len(zz)))
        return self._fields(buf, zz)

    def _fields(self, buf: np.ndarray, zz: np.ndarray) -> tuple[np.ndarray, ...]:
        """Each record's FIELDS, from the records laid back to back in `buf` and their zig-zag
        lengths `zz` (from the walk): one numpy pass per field, over all records at once."""
        if (zz & 1).any():
            raise InvalidRecordError(f"a record of {self.topic}-{self.partition} has a negative "
                                     f"length")
        length = zz >> 1
        varint_size = 1 + (zz >= 1 << 7) + (zz >= 1 << 14) + (zz >= 1 << 21) + (zz >= 1 << 28)
        ends = np.cumsum(varint_size + length)          # payloads are back to back, each full
        starts = ends - length
        if (length < 6).any():                          # attributes + 4 varints + header count
            raise InvalidRecordError(f"a record of {self.topic}-{self.partition} is shorter than "
                                     f"the smallest possible record")
        pos = starts + 1                                   # skip the attributes byte
        ts_delta, size = _varints(buf, pos)
        pos += size
        offset_delta, size = _varints(buf, pos)
        pos += size
        key_len, size = _varints(buf, pos)
        pos += size
        key_start = pos
        pos = pos + np.maximum(key_len, 0)
        value_len, size = _varints(buf, np.minimum(pos, len(buf) - 1))
        pos += size
        value_start = pos
        pos = pos + np.maximum(value_len, 0)               # the header count is here
        if (pos >= ends).any() or (key_len < -1).any() or (value_len < -1).any():
            bad = int(np.flatnonzero((pos >= ends) | (key_len < -1) | (value_len < -1))[0])
            meta = self._batches
            first_offsets = np.repeat([m[1] for m in meta], [m[0] for m in meta])
            raise InvalidRecordError(f"a record of {self.topic}-{self.partition} near offset "
                                     f"{int(first_offsets[bad])} has field sizes that run past "
                                     f"its end")
        return ts_delta, offset_delta, key_start, key_len, value_start, value_len, pos, ends

    # ---- step 3: whole columns
    def flush(self) -> pa.RecordBatch | None:
        """The queued records as one Arrow record batch (None when there are none)."""
        n_all = self._pending
        if n_all == 0:
            return None
        data = b"".join(self._payloads)     # bytes (a lone compressed payload is not copied)
        try:
            return self._columns(data)
        except IndexError:
            raise InvalidRecordError(f"a record of {self.topic}-{self.partition} runs past the "
                                     f"end of its batch") from None

    def _columns(self, data: bytes) -> pa.RecordBatch | None:
        buf = np.frombuffer(data, dtype=np.uint8)
        zz = np.concatenate(self._lengths) if len(self._lengths) > 1 else self._lengths[0]
        (ts_delta, offset_delta, key_start, key_len, value_start, value_len, pos,
         ends) = self._record_fields(buf, zz)
        meta = self._batches
        counts = np.array([m[0] for m in meta], dtype=np.int64)
        offsets = np.repeat(np.array([m[1] for m in meta], dtype=np.int64), counts) + offset_delta
        keep = None
        if any(m[4] is not None for m in meta):
            lo = np.repeat(np.array([m[4] if m[4] is not None else -(1 << 62) for m in meta],
                                    dtype=np.int64), counts)
            hi = np.repeat(np.array([m[5] if m[5] is not None else 1 << 62 for m in meta],
                                    dtype=np.int64), counts)
            keep = (offsets >= lo) & (offsets < hi)
            if keep.all():
                keep = None
        kept = (lambda a: a) if keep is None else (lambda a: a[keep])   # noqa: E731
        offsets = kept(offsets)
        n = len(offsets)
        self._reset()
        if n == 0:
            return None
        arrow_buf = pa.py_buffer(data)

        # Only the columns asked for are built (column pruning). The walk and the fields pass
        # above run for every column (they are also the structural check); a pruned read saves
        # what is below.
        def timestamps() -> pa.Array:
            log_append = np.repeat(np.array([m[3] is not None for m in meta]), counts)
            ts = np.where(log_append,
                          np.repeat(np.array([m[3] if m[3] is not None else 0 for m in meta],
                                             dtype=np.int64), counts),
                          np.repeat(np.array([m[2] for m in meta], dtype=np.int64), counts) + ts_delta)
            return pa.array(kept(ts) * 1000, type=TIMESTAMP_TYPE)

        def timestamp_types() -> pa.Array:
            return pa.array(kept(np.repeat(np.array([m[3] is not None for m in meta],
                                                    dtype=np.int32), counts)))

        def topics() -> pa.Array:
            topic = self._topic_bytes
            topic_offsets = (np.arange(n + 1, dtype=np.int32) * len(topic)).astype(np.int32)
            return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(topic_offsets),
                                                          pa.py_buffer(topic * n)])

        def headers() -> pa.Array:
            starts, stops = kept(pos), kept(ends)
            found: list = [None] * n
            for i in np.flatnonzero(buf[starts] != 0).tolist():
                found[i] = _parse_headers(data, int(starts[i]), int(stops[i]))
            return pa.array(found, type=HEADER_TYPE)

        build = {
            "key": lambda: _cut(arrow_buf, kept(key_start), kept(key_len)),
            "value": lambda: _cut(arrow_buf, kept(value_start), kept(value_len)),
            "topic": topics,
            "partition": lambda: pa.array(np.full(n, self.partition, dtype=np.int32)),
            "offset": lambda: pa.array(offsets),
            "timestamp": timestamps,
            "timestampType": timestamp_types,
            "headers": headers,
        }
        batch = pa.RecordBatch.from_arrays([build[name]() for name in self.schema.names],
                                           schema=self.schema)
        self.rows += n
        return batch


BATCH_META = ("records", "base offset", "last offset delta", "base timestamp", "max timestamp",
              "attributes", "position", "size")


def take_batches(buf, positions: np.ndarray, first: int, start: int, end: int, check_crcs: bool,
                 crc, max_records: int) -> tuple[int, bytes, bytes]:
    """The batches at positions[first:] of `buf` that the decoder queues as they are, from the
    first one on, up to `max_records` records (at least one batch): uncompressed v2 batches
    whose CRC matches (`crc`, when `check_crcs`) and whose records fill them exactly. Control
    batches, emptied ones and those wholly outside [start, end) are passed over, after their CRC
    check, as add_batch passes them over. Returns (index of the first batch not taken, then per
    batch queued its BATCH_META as int64s, and each record's zig-zag length varint as int64s).
    It stops before a batch it does not take as it is (another magic, a bad length or CRC,
    compressed, records that do not fill it): the caller's add_batch decompresses that one or
    raises its error. `take_batches` in kstore/_codec.c mirrors this function."""
    def passed_over(attributes: int, count: int, base: int, last_delta: int) -> bool:
        return bool(attributes & CONTROL_FLAG_MASK) or count <= 0 or base + last_delta < start \
            or base >= end

    # Pass 1, the headers only: how far to go.
    stop, records = first, 0
    while stop < len(positions):
        pos = int(positions[stop])
        if pos < 0 or pos > len(buf) - RECORD_BATCH_OVERHEAD:
            break
        (base, length, _e, magic, _c, attributes, last_delta, *_r, count) = _HEADER_UNPACK(buf, pos)
        size = LOG_OVERHEAD + length
        if (size < RECORD_BATCH_OVERHEAD or size > len(buf) - pos or magic != CURRENT_MAGIC
                or attributes & COMPRESSION_CODEC_MASK):
            break
        if not passed_over(attributes, count, base, last_delta):
            if count > size - RECORD_BATCH_OVERHEAD or (records and records + count > max_records):
                break
            records += count
        stop += 1
    # Pass 2: the CRC and the walk of each batch; it stops before one that fails either.
    meta, lengths = array("q"), array("q")
    i = first
    while i < stop:
        pos = int(positions[i])
        (base, length, _e, _m, stored, attributes, last_delta, base_ts, max_ts, _p, _pe, _s,
         count) = _HEADER_UNPACK(buf, pos)
        size = LOG_OVERHEAD + length
        if check_crcs and crc(memoryview(buf)[pos + ATTRIBUTES_OFFSET:pos + size]) != stored:
            break
        if not passed_over(attributes, count, base, last_delta):
            walked = _strict_lengths(memoryview(buf)[pos + RECORD_BATCH_OVERHEAD:pos + size], count)
            if walked is None:
                break
            lengths.extend(walked)
            meta.extend((count, base, last_delta, base_ts, max_ts, attributes, pos, size))
        i += 1
    return i, meta.tobytes(), lengths.tobytes()


def _strict_lengths(data, count: int) -> list[int] | None:
    """Each record's zig-zag length varint, as `record_lengths` in kstore/_codec.c walks them:
    None where a length is negative, needs more than 5 bytes, or the records do not fill `data`
    exactly (ColumnBuilder._walk then raises, or handles the longer varints)."""
    out, p, n = [], 0, len(data)
    for _ in range(count):
        z = shift = 0
        for k in range(5):
            if p >= n:
                return None
            b = data[p]
            p += 1
            z |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        else:
            return None                                     # longer than 5 bytes
        if z > 0xFFFFFFFF or z & 1:
            return None
        out.append(z)
        p += z >> 1
        if p > n:
            return None
    return out if p == n else None


def _parse_headers(data: bytes, p: int, end: int) -> list[tuple[str, bytes | None]] | None:
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

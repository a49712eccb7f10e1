"""Arrow columns → RecordBatch v2 bytes, for the sink: the reverse of `kstore.spark.decode`.

Spark hands the sink's `write()` Arrow record batches. Encoding them record by record in Python
(one `Record` object, one `encode_record` call per row) costs microseconds per row; here a whole
batch of records is laid out with numpy instead:

1. every record is `length varint | attributes 0 | timestamp delta | offset delta | key length |
   key | value length | value | header count`; all records of a sink batch share one timestamp
   (the time of the write, as a producer stamps CreateTime), so the timestamp delta is the single
   byte 0, and every other size is known from the key and value lengths;
2. the sizes give each record's position (a cumulative sum), each varint is written for all
   records at once (`_put_varints`), and the key and value bytes are gathered from the Arrow
   buffers into their places with one fancy-indexing copy each;
3. the records section is compressed once (`kstore.compression`) and wrapped in the batch header
   (CRC-32C over attributes..end, as `build_batch` does).

Records with headers (rare in a sink) go through `build_batch`, one batch at a time. The bytes
are the same as `build_batch` would give for the same records (tests/test_spark_logdir.py checks).
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..compression import Compression, compress
from ..records import (ATTRIBUTES_OFFSET, COMPRESSION_CODEC_MASK, CRC_OFFSET, CURRENT_MAGIC,
                       HEADER, LOG_OVERHEAD, NO_PARTITION_LEADER_EPOCH, NO_PRODUCER_EPOCH,
                       NO_PRODUCER_ID, NO_SEQUENCE, RECORD_BATCH_OVERHEAD, Record, build_batch,
                       crc32c)

MAX_BATCH_BYTES = 512 * 1024          # below max.message.bytes (1 MiB) after the header
MAX_BATCH_RECORDS = 16384
RECORD_FIXED = 3                      # attributes, timestamp delta (0) and header count (0)


def _zigzag(values: np.ndarray) -> np.ndarray:
    v = values.astype(np.int64)
    return ((v << 1) ^ (v >> 63)).astype(np.uint64)


def _varint_sizes(z: np.ndarray) -> np.ndarray:
    return (1 + (z >= 1 << 7) + (z >= 1 << 14) + (z >= 1 << 21) + (z >= 1 << 28)).astype(np.int64)


def _put_varints(out: np.ndarray, pos: np.ndarray, z: np.ndarray, sizes: np.ndarray) -> None:
    """Write the (zig-zagged) varints z at out[pos] (values below 2**35: sizes up to 5)."""
    for k in range(int(sizes.max(initial=1))):
        has = sizes > k
        byte = (z[has] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = sizes[has] > k + 1
        out[pos[has] + k] = (byte | (more.astype(np.uint64) << np.uint64(7))).astype(np.uint8)


def _gather(out: np.ndarray, dest: np.ndarray, data: np.ndarray, src: np.ndarray,
            lengths: np.ndarray) -> None:
    """out[dest[i] : dest[i]+lengths[i]] = data[src[i] : src[i]+lengths[i]] for every i."""
    total = int(lengths.sum())
    if total == 0:
        return
    starts = np.cumsum(lengths) - lengths
    within = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
    out[np.repeat(dest, lengths) + within] = data[np.repeat(src, lengths) + within]


class BinaryColumn:
    """A string/binary Arrow array as numpy views: data bytes, start of each value, lengths
    (−1 for null)."""

    def __init__(self, array: pa.Array | None, n: int):
        if array is None:
            self.data = np.zeros(1, dtype=np.uint8)
            self.starts = np.zeros(n, dtype=np.int64)
            self.lengths = np.full(n, -1, dtype=np.int64)
            return
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
            array = array.cast(pa.binary() if pa.types.is_string(array.type) else pa.large_binary())
        offsets_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
        validity, offsets_buf, data_buf = array.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=offsets_type)[array.offset:array.offset + n + 1]
        self.data = (np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None and
                     data_buf.size else np.zeros(1, dtype=np.uint8))
        self.starts = offsets[:-1].astype(np.int64)
        self.lengths = np.diff(offsets).astype(np.int64)
        if array.null_count:
            self.lengths[np.asarray(pc.is_null(array))] = -1

    def take(self, idx: np.ndarray) -> "BinaryColumn":
        out = BinaryColumn.__new__(BinaryColumn)
        out.data, out.starts, out.lengths = self.data, self.starts[idx], self.lengths[idx]
        return out

    def nbytes(self) -> np.ndarray:
        return np.maximum(self.lengths, 0)


def records_section(keys: BinaryColumn, values: BinaryColumn) -> bytes:
    """The records of one batch (offset deltas 0..n−1, timestamp delta 0, no headers)."""
    n = len(values.lengths)
    delta = np.arange(n, dtype=np.int64)
    z_delta, z_klen, z_vlen = _zigzag(delta), _zigzag(keys.lengths), _zigzag(values.lengths)
    s_delta, s_klen, s_vlen = _varint_sizes(z_delta), _varint_sizes(z_klen), _varint_sizes(z_vlen)
    body = RECORD_FIXED + s_delta + s_klen + keys.nbytes() + s_vlen + values.nbytes()
    z_body = _zigzag(body)
    s_body = _varint_sizes(z_body)
    total = s_body + body
    start = np.cumsum(total) - total
    out = np.zeros(int(total.sum()), dtype=np.uint8)       # attributes, ts delta, headers: 0
    _put_varints(out, start, z_body, s_body)
    pos = start + s_body + 2                                # after attributes and ts delta
    _put_varints(out, pos, z_delta, s_delta)
    pos = pos + s_delta
    _put_varints(out, pos, z_klen, s_klen)
    pos = pos + s_klen
    _gather(out, pos, keys.data, keys.starts, keys.nbytes())
    pos = pos + keys.nbytes()
    _put_varints(out, pos, z_vlen, s_vlen)
    pos = pos + s_vlen
    _gather(out, pos, values.data, values.starts, values.nbytes())
    return out.tobytes()


def wrap_batch(records: bytes, count: int, timestamp: int, compression: Compression,
               producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
               base_sequence: int = NO_SEQUENCE) -> bytes:
    """A v2 batch around an encoded records section (base offset 0: the broker assigns it).
    The producer fields are where an idempotent producer puts its id, epoch and sequence."""
    body = compress(compression, records) if compression != Compression.NONE else records
    buf = bytearray(RECORD_BATCH_OVERHEAD + len(body))
    HEADER.pack_into(buf, 0, 0, len(buf) - LOG_OVERHEAD, NO_PARTITION_LEADER_EPOCH, CURRENT_MAGIC,
                     0, int(compression) & COMPRESSION_CODEC_MASK, count - 1, timestamp,
                     timestamp, producer_id, producer_epoch, base_sequence, count)
    buf[RECORD_BATCH_OVERHEAD:] = body
    struct.pack_into(">I", buf, CRC_OFFSET, crc32c(bytes(buf[ATTRIBUTES_OFFSET:])))
    return bytes(buf)


def split_points(keys: BinaryColumn, values: BinaryColumn,
                 max_bytes: int = MAX_BATCH_BYTES, max_records: int = MAX_BATCH_RECORDS) -> list[int]:
    """Where to cut a run of records into batches of at most max_bytes / max_records."""
    sizes = keys.nbytes() + values.nbytes() + 16
    cuts, start, n = [0], 0, len(sizes)
    cum = np.cumsum(sizes)
    while start < n:
        base = cum[start - 1] if start else 0
        end = int(np.searchsorted(cum, base + max_bytes, side="right"))
        end = min(max(end, start + 1), start + max_records, n)
        cuts.append(end)
        start = end
    return cuts


def no_producer(count: int) -> tuple[int, int, int]:
    """The producer fields of a batch from no idempotent producer (the staged sink)."""
    return NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE


def encode_batches(keys: BinaryColumn, values: BinaryColumn, timestamp: int,
                   compression: Compression, headers: list | None = None, stamp=no_producer):
    """Yield (batch bytes, record count) for a run of records of one partition. `stamp(count)`
    gives each batch, in order, its (producer id, epoch, base sequence)."""
    cuts = split_points(keys, values)
    for a, b in zip(cuts, cuts[1:]):
        idx = np.arange(a, b)
        producer = stamp(b - a)
        if headers is not None and any(headers[i] for i in range(a, b)):
            yield _python_batch(keys.take(idx), values.take(idx), timestamp, compression,
                                headers[a:b], producer), b - a
            continue
        section = records_section(keys.take(idx), values.take(idx))
        yield wrap_batch(section, b - a, timestamp, compression, *producer), b - a


def _python_batch(keys: BinaryColumn, values: BinaryColumn, timestamp: int,
                  compression: Compression, headers: list,
                  producer: tuple[int, int, int]) -> bytes:
    def cell(col: BinaryColumn, i: int) -> bytes | None:
        n = int(col.lengths[i])
        return None if n < 0 else col.data[col.starts[i]:col.starts[i] + n].tobytes()
    records = [Record(cell(keys, i), cell(values, i), timestamp,
                      tuple((h["key"], h["value"]) for h in headers[i]) if headers[i] else ())
               for i in range(len(values.lengths))]
    producer_id, producer_epoch, base_sequence = producer
    return build_batch(records, compression=compression, producer_id=producer_id,
                       producer_epoch=producer_epoch, base_sequence=base_sequence)

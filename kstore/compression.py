"""The five compression codecs a RecordBatch may use, framed the way Kafka's Java client frames them.

Mirrors Kafka's `CompressionType` and the codec classes behind it. The batch header stays
uncompressed; everything after byte 61 is one compressed stream of the concatenated records.
* gzip   — a gzip member (GZIPOutputStream);
* snappy — snappy-java's "xerial" stream framing: an 8-byte magic, two int32 version fields, then
           blocks of [int32 length][raw snappy]. Some clients (librdkafka) send raw snappy without
           the framing; snappy-java reads both, so do we;
* lz4    — the LZ4 frame format (KafkaLZ4BlockOutputStream writes a standard frame for magic 2);
* zstd   — a zstd frame (its content size may be absent, so decode as a stream).
"""

from __future__ import annotations

import enum
import gzip
import io
import struct

from .errors import InvalidRecordError


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def from_name(cls, name: str) -> "Compression":
        names = {"none": cls.NONE, "uncompressed": cls.NONE, "gzip": cls.GZIP,
                 "snappy": cls.SNAPPY, "lz4": cls.LZ4, "zstd": cls.ZSTD}
        try:
            return names[name.lower()]
        except KeyError:
            raise ValueError(f"unknown compression type {name!r}; "
                             f"expected one of {sorted(names)}") from None

    @property
    def kafka_name(self) -> str:
        return self.name.lower()


_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024  # snappy-java's default block size


def compress(codec: Compression, data: bytes) -> bytes:
    codec = Compression(codec)
    if codec is Compression.NONE:
        return bytes(data)
    if codec is Compression.GZIP:
        return gzip.compress(data, compresslevel=6, mtime=0)
    if codec is Compression.SNAPPY:
        import cramjam
        out = bytearray(_XERIAL_HEADER)
        for start in range(0, len(data), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(data[start:start + _XERIAL_BLOCK]))
            out += struct.pack(">i", len(block)) + block
        return bytes(out)
    if codec is Compression.LZ4:
        import lz4.frame
        return lz4.frame.compress(data, block_size=lz4.frame.BLOCKSIZE_MAX64KB,
                                  content_checksum=False, block_linked=False)
    if codec is Compression.ZSTD:
        import zstandard
        return zstandard.ZstdCompressor(level=3).compress(data)
    raise AssertionError(codec)


def decompress(codec: Compression, data: bytes) -> bytes:
    """Decompress one batch's records section; raise InvalidRecordError naming the codec on failure."""
    codec = Compression(codec)
    try:
        if codec is Compression.NONE:
            return bytes(data)
        if codec is Compression.GZIP:
            return gzip.decompress(data)
        if codec is Compression.SNAPPY:
            return _snappy_decompress(bytes(data))
        if codec is Compression.LZ4:
            import lz4.frame
            return lz4.frame.decompress(bytes(data))
        if codec is Compression.ZSTD:
            import zstandard
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(bytes(data))) as reader:
                return reader.read()
    except InvalidRecordError:
        raise
    except Exception as e:  # every codec library has its own error types
        raise InvalidRecordError(f"cannot decompress {codec.kafka_name} records: {e}") from e
    raise InvalidRecordError(f"unknown compression codec id {int(codec)}")


def _snappy_decompress(data: bytes) -> bytes:
    import cramjam
    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    pos, out = 16, bytearray()
    while pos < len(data):
        if pos + 4 > len(data):
            raise InvalidRecordError("truncated xerial snappy block header")
        (length,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if length < 0 or pos + length > len(data):
            raise InvalidRecordError(f"xerial snappy block of length {length} runs past the data")
        out += cramjam.snappy.decompress_raw(data[pos:pos + length])
        pos += length
    return bytes(out)

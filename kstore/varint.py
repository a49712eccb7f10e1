"""Zig-zag variable-length integers, as Kafka's `ByteUtils` writes them.

A varint (int32) or varlong (int64) is first zig-zag mapped so small negative numbers stay small
(0→0, −1→1, 1→2, −2→3, ...), then written 7 bits at a time, least significant group first, with
the high bit of each byte meaning "more bytes follow". Kafka caps a varint at 5 bytes and a varlong
at 10; longer input is rejected, as `ByteUtils.readVarint` does.
"""

from __future__ import annotations

from .errors import InvalidRecordError

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_VARINT_BYTES = 5
MAX_VARLONG_BYTES = 10


def zigzag_encode(n: int, bits: int = 32) -> int:
    """Map a signed integer to an unsigned one: (n << 1) ^ (n >> bits-1)."""
    return ((n << 1) ^ (n >> (bits - 1))) & ((1 << bits) - 1)


def zigzag_decode(z: int) -> int:
    """Inverse of zigzag_encode (the same for 32 and 64 bits)."""
    return (z >> 1) ^ -(z & 1)


def write_unsigned_varint(u: int) -> bytes:
    """7-bit groups, least significant first; high bit set on every byte but the last."""
    if u < 0x80:
        return _ONE_BYTE[u]
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


_ONE_BYTE = [bytes([i]) for i in range(0x80)]


def write_varint(n: int) -> bytes:
    """Encode a signed 32-bit integer as a zig-zag varint (1–5 bytes)."""
    if not INT32_MIN <= n <= INT32_MAX:
        raise ValueError(f"varint out of int32 range: {n}")
    return write_unsigned_varint(((n << 1) ^ (n >> 31)) & 0xFFFFFFFF)


def write_varlong(n: int) -> bytes:
    """Encode a signed 64-bit integer as a zig-zag varlong (1–10 bytes)."""
    if not INT64_MIN <= n <= INT64_MAX:
        raise ValueError(f"varlong out of int64 range: {n}")
    return write_unsigned_varint(((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF)


def read_unsigned_varint(buf, pos: int, max_bytes: int = MAX_VARINT_BYTES) -> tuple[int, int]:
    """Read an unsigned varint at buf[pos]; return (value, position after it)."""
    result = 0
    shift = 0
    for i in range(max_bytes):
        try:
            b = buf[pos + i]
        except IndexError:
            raise InvalidRecordError(
                f"premature end of data while reading a varint at position {pos}") from None
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos + i + 1
        shift += 7
    kind = "varint" if max_bytes == MAX_VARINT_BYTES else "varlong"
    raise InvalidRecordError(f"{kind} at position {pos} is longer than {max_bytes} bytes")


def read_varint(buf, pos: int) -> tuple[int, int]:
    """Read a zig-zag varint (int32); return (value, position after it)."""
    try:  # fast paths: one and two bytes cover every length below 8 KiB
        b = buf[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
        b2 = buf[pos + 1]
        if b2 < 0x80:
            z = (b & 0x7F) | (b2 << 7)
            return (z >> 1) ^ -(z & 1), pos + 2
    except IndexError:
        pass  # the general path below reports where the data ended
    z, end = read_unsigned_varint(buf, pos, MAX_VARINT_BYTES)
    if z > 0xFFFFFFFF:
        raise InvalidRecordError(f"varint at position {pos} does not fit in 32 bits")
    return (z >> 1) ^ -(z & 1), end


def read_varlong(buf, pos: int) -> tuple[int, int]:
    """Read a zig-zag varlong (int64); return (value, position after it)."""
    z, end = read_unsigned_varint(buf, pos, MAX_VARLONG_BYTES)
    if z > 0xFFFFFFFFFFFFFFFF:
        raise InvalidRecordError(f"varlong at position {pos} does not fit in 64 bits")
    return (z >> 1) ^ -(z & 1), end


def size_of_unsigned_varint(u: int) -> int:
    """Bytes of a varint: one per started group of 7 significant bits, at least one."""
    return (u.bit_length() + 6) // 7 or 1


def size_of_varint(n: int) -> int:
    return size_of_unsigned_varint(((n << 1) ^ (n >> 31)) & 0xFFFFFFFF)


def size_of_varlong(n: int) -> int:
    return size_of_unsigned_varint(((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF)

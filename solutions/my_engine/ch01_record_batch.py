"""Chapter 01 — The append-only log and the record batch: my passing functions (write_varint, read_varint, write_varlong, encode_record, encode_batch).

Written by kstore.my_engine.save("ex01"); a new save replaces this file.
"""

import crc32c
import struct

SAVED = ('write_varint', 'read_varint', 'write_varlong', 'encode_record', 'encode_batch')    # the functions whose tests passed: the engine plugs in these


def write_varint(n: int) -> bytes:
    if not -(1 << 31) <= n < (1 << 31):
        raise ValueError(f"{n} does not fit in an int32")
    z = ((n << 1) ^ (n >> 31)) & 0xFFFFFFFF
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    z = shift = 0
    for i in range(5):
        b = buf[pos + i]
        z |= (b & 0x7F) << shift
        if not b & 0x80:
            return (z >> 1) ^ -(z & 1), pos + i + 1
        shift += 7
    raise ValueError(f"varint at position {pos} is longer than 5 bytes")


def write_varlong(n: int) -> bytes:
    z = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None,
                  value: bytes | None, headers=()) -> bytes:
    def field(data):
        return b"\x01" if data is None else write_varint(len(data)) + data

    body = [b"\x00", write_varlong(timestamp_delta), write_varint(offset_delta),
            field(key), field(value), write_varint(len(headers))]
    for h_key, h_value in headers:
        body += [field(h_key.encode("utf-8")), field(h_value)]
    body = b"".join(body)
    return write_varint(len(body)) + body


def encode_batch(records, base_offset: int = 0, partition_leader_epoch: int = -1) -> bytes:
    base_ts = records[0][2]
    body = b"".join(encode_record(i, ts - base_ts, key, value)
                    for i, (key, value, ts) in enumerate(records))
    header = bytearray(struct.pack(">qiibIhiqqqhii", base_offset, 61 - 12 + len(body),
                                   partition_leader_epoch, 2, 0, 0, len(records) - 1, base_ts,
                                   max(ts for _, _, ts in records), -1, -1, -1, len(records)))
    batch = header + body
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)

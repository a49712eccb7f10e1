"""Chapter 05 — Crashes and recovery: my passing functions (valid_prefix_length, rebuild_index).

Written by kstore.my_engine.save("ex05"); a new save replaces this file.
"""

import crc32c
import struct

SAVED = ('valid_prefix_length', 'rebuild_index')    # the functions whose tests passed: the engine plugs in these


def valid_prefix_length(data: bytes) -> int:
    p = 0
    while len(data) - p > 17:
        (length,) = struct.unpack_from(">i", data, p + 8)
        size = 12 + length
        if length < 14 or p + size > len(data):
            break
        (stored_crc,) = struct.unpack_from(">I", data, p + 17)
        if size < 61 or data[p + 16] != 2 or stored_crc != crc32c.crc32c(data[p + 21:p + size]):
            break
        p += size
    return p


def rebuild_index(data, base_offset, index_interval_bytes):
    entries, valid_bytes, last_index_entry = [], 0, 0
    while valid_bytes < len(data):
        batch_base, length = struct.unpack_from(">qi", data, valid_bytes)
        (last_delta,) = struct.unpack_from(">i", data, valid_bytes + 23)
        if valid_bytes - last_index_entry > index_interval_bytes:
            entries.append((batch_base + last_delta, valid_bytes))
            last_index_entry = valid_bytes
        valid_bytes += 12 + length
    return entries

"""Producer-state snapshot files (`<20 digits>.snapshot`).

Mirrors the format of Kafka's `ProducerStateManager.readSnapshot` (ProducerSnapshot.json v1):
int16 version, uint32 CRC-32C of every byte after the CRC, int32 entry count, then per producer
producerId int64, epoch int16, lastSequence int32, lastOffset int64, offsetDelta int32,
timestamp int64, coordinatorEpoch int32, currentTxnFirstOffset int64 (46 bytes).
`dump-log` reads them; the ProducerStateManager writes one at every roll and clean shutdown
(`writeSnapshot`: the file is written and fsynced) and loads the newest at startup.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

from .errors import CorruptRecordError
from .checkpoint import fsync_dir
from .records import crc32c

SUFFIX = ".snapshot"

_HEADER = struct.Struct(">hIi")
_ENTRY = struct.Struct(">qhiqiqiq")


class ProducerSnapshotEntry(NamedTuple):
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int

    @property
    def first_sequence(self) -> int:
        return self.last_sequence - self.offset_delta


def read_snapshot(data: bytes, source: str = "snapshot") -> list[ProducerSnapshotEntry]:
    if len(data) < _HEADER.size:
        raise CorruptRecordError(f"snapshot file {source} is too short ({len(data)} bytes)")
    version, crc, count = _HEADER.unpack_from(data, 0)
    if version != 1:
        raise CorruptRecordError(f"snapshot file {source} has unknown version {version}")
    computed = crc32c(data[6:])
    if computed != crc:
        raise CorruptRecordError(f"snapshot file {source} is corrupted (CRC is no longer valid). "
                                 f"Stored crc: {crc}. Computed crc: {computed}")
    if len(data) != _HEADER.size + count * _ENTRY.size:
        raise CorruptRecordError(f"snapshot file {source} declares {count} entries but has "
                                 f"{len(data)} bytes")
    return [ProducerSnapshotEntry(*_ENTRY.unpack_from(data, _HEADER.size + i * _ENTRY.size))
            for i in range(count)]


def snapshot_path(directory: str, offset: int) -> str:
    return os.path.join(directory, f"{offset:020d}{SUFFIX}")


def encode_snapshot(entries: list[ProducerSnapshotEntry]) -> bytes:
    body = _HEADER.pack(1, 0, len(entries))[6:] + b"".join(_ENTRY.pack(*e) for e in entries)
    return _HEADER.pack(1, crc32c(body), len(entries))[:6] + body


def write_snapshot_file(path: str, entries: list[ProducerSnapshotEntry]) -> None:
    """Write and fsync (a snapshot must not be half there after a crash: the CRC would catch it,
    and the loader would fall back to an older one)."""
    with open(path, "wb") as f:
        f.write(encode_snapshot(entries))
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(os.path.dirname(path))

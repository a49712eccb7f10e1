"""Producer-state snapshot files (`<20 digits>.snapshot`), read-only.

Mirrors the format of Kafka's `ProducerStateManager.readSnapshot` (ProducerSnapshot.json v1):
int16 version, uint32 CRC-32C of every byte after the CRC, int32 entry count, then per producer
producerId int64, epoch int16, lastSequence int32, lastOffset int64, offsetDelta int32,
timestamp int64, coordinatorEpoch int32, currentTxnFirstOffset int64 (46 bytes).
kstore reads these (so `dump-log` shows what Kafka wrote) but does not write them: it keeps no
idempotent-producer state across restarts.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .errors import CorruptRecordError
from .records import crc32c

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

"""The cleaner's map from key to the latest offset seen for it, with a fixed memory budget.

Mirrors Kafka's `SkimpyOffsetMap`: each entry is an MD5 of the key (16 bytes) plus an int64 offset,
24 bytes in all, so a budget of `memory` bytes has `memory // 24` slots. The cleaner stops filling
the map at `slots × load_factor` entries and cleans only as far as it got (a partial round); the
next round continues from there. kstore keeps the entries in a dict keyed by the MD5 digest (the same
collision behaviour as Kafka's open-addressing table) and counts them against the same budget; where
the native codec runs, the dict is its `OffsetTable`, Kafka's layout of 24-byte entries.

`map_keys` is the cleaner's inner loop over one batch (Kafka's `Cleaner.buildOffsetMapForSegment`);
the native codec (kstore/_codec.c) runs the same loop in C when it may (see `put_batch`).
"""

from __future__ import annotations

import hashlib

from . import records

ENTRY_SIZE = 24  # 16-byte MD5 + 8-byte offset
_ASK = object()


class SkimpyOffsetMap:
    def __init__(self, memory: int = 128 * 1024 * 1024, load_factor: float = 0.9, *,
                 slots: int | None = None):
        self.slots = slots if slots is not None else memory // ENTRY_SIZE
        if self.slots < 1:
            raise ValueError(f"offset map memory {memory} bytes holds no 24-byte entry")
        self.load_factor = load_factor
        codec = records.native_codec()
        # The native codec keeps the entries as Kafka does, 24 bytes each in one table (no Python
        # object per entry); it is the same mapping as this dict, which is the reference.
        self._map: dict[bytes, int] = codec.offset_table() if codec is not None else {}
        self.latest_offset = -1
        self.lookups = 0

    @property
    def max_desired_size(self) -> int:
        """Entries the cleaner will put before it stops (Kafka: (slots × loadFactor).toInt)."""
        return int(self.slots * self.load_factor)

    @staticmethod
    def hash_key(key: bytes) -> bytes:
        return hashlib.md5(key).digest()

    def put(self, key: bytes, offset: int) -> None:
        self._map[self.hash_key(key)] = offset
        self.latest_offset = offset

    def get(self, key: bytes) -> int:
        """The latest offset for `key`, or −1 when the key is not in the map."""
        self.lookups += 1
        return self._map.get(self.hash_key(key), -1)

    @property
    def entries(self) -> dict[bytes, int]:
        """The map itself: MD5 digest of a key -> the latest offset of that key."""
        return self._map

    def put_batch(self, batch: records.RecordBatch, start: int, codec=_ASK) -> tuple[int, bool]:
        """Put the keys of one batch's records at or above `start`, stopping when the map is full;
        return (records read, whether the map filled up). The records are walked once, keys only.
        `codec`: what `records.native_codec()` answered for this pass (asked here if not given)."""
        batch._check_v2()   # magic 2 and a count >= 0, as RecordBatch.keys_and_offsets checks
        args = (batch.records_view(), batch.base_offset, batch.records_count, start, self._map,
                self.max_desired_size)
        if codec is _ASK:
            codec = records.native_codec()
        out = None
        if codec is not None and type(self) is SkimpyOffsetMap and self.hash_key is _MD5:
            out = codec.map_keys(*args)
        if out is None:
            out = map_keys(*args)       # the reference (it also raises on malformed records)
        read, full, latest = out
        if latest >= 0:
            self.latest_offset = latest
        return read, full

    def walks_natively(self) -> bool:
        """May the native codec walk whole buffers of batches into this map (codec.map_batches
        and filter_batches)? Only for this class with its MD5 and the codec's OffsetTable: a
        subclass or another hash runs the reference, batch by batch."""
        return type(self) is SkimpyOffsetMap and self.hash_key is _MD5 and \
            type(self._map).__name__ == "OffsetTable"

    def update_latest_offset(self, offset: int) -> None:
        self.latest_offset = offset

    def clear(self) -> None:
        self._map.clear()
        self.latest_offset = -1

    @property
    def size(self) -> int:
        return len(self._map)

    def __len__(self) -> int:
        return len(self._map)

    @property
    def utilization(self) -> float:
        return len(self._map) / self.slots

    def __repr__(self) -> str:
        return f"SkimpyOffsetMap(slots={self.slots}, size={self.size}, latest_offset={self.latest_offset})"


_MD5 = SkimpyOffsetMap.hash_key


def map_keys(data, base_offset: int, records_count: int, start: int, entries: dict[bytes, int],
             max_entries: int) -> tuple[int, bool, int]:
    """Put MD5(key) -> offset for each keyed record at or above `start` in one batch's records
    section, until `entries` holds `max_entries`; a later record of a key overwrites an earlier one.
    Return (records read before the map filled up, whether it did, the last offset put or -1)."""
    read, latest = 0, -1
    for offset, key in records.decode_keys(data, base_offset, records_count):
        if key is not None and offset >= start:
            if len(entries) >= max_entries:
                return read, True, latest
            entries[SkimpyOffsetMap.hash_key(key)] = offset
            latest = offset
        read += 1
    return read, False, latest

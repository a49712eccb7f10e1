"""The cleaner's map from key to the latest offset seen for it, with a fixed memory budget.

Mirrors Kafka's `SkimpyOffsetMap`: each entry is an MD5 of the key (16 bytes) plus an int64 offset,
24 bytes in all, so a budget of `memory` bytes has `memory // 24` slots. The cleaner stops filling
the map at `slots × load_factor` entries and cleans only as far as it got (a partial round); the
next round continues from there. kstore keeps the entries in a dict keyed by the MD5 digest (the same
collision behaviour as Kafka's open-addressing table) and counts them against the same budget.
"""

from __future__ import annotations

import hashlib

ENTRY_SIZE = 24  # 16-byte MD5 + 8-byte offset


class SkimpyOffsetMap:
    def __init__(self, memory: int = 128 * 1024 * 1024, load_factor: float = 0.9, *,
                 slots: int | None = None):
        self.slots = slots if slots is not None else memory // ENTRY_SIZE
        if self.slots < 1:
            raise ValueError(f"offset map memory {memory} bytes holds no 24-byte entry")
        self.load_factor = load_factor
        self._map: dict[bytes, int] = {}
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

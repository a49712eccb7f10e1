"""The aborted-transaction index of a segment: the `.txnindex` file.

Mirrors Kafka's `TransactionIndex` and `AbortedTxn`. Each entry is 34 bytes, big-endian:

    version int16 (0) | producerId int64 | firstOffset int64 | lastOffset int64 | lastStableOffset int64

One entry is appended when an ABORT marker lands in the segment: the producer, the offset of the
aborted transaction's first batch, the offset of the marker, and the last stable offset right after
the abort. A read_committed fetch collects the entries that overlap what it returns and sends them
to the client as the "aborted transactions" list, so the client drops those producers' records
between firstOffset and the marker. Like Kafka, the file is created only when the first entry is
written; a segment without aborted transactions has no `.txnindex` on disk.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from .errors import CorruptIndexError

_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size           # 34
CURRENT_VERSION = 0


@dataclass(frozen=True)
class AbortedTxn:
    """One entry (Kafka's AbortedTxn)."""
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int
    version: int = CURRENT_VERSION

    def encode(self) -> bytes:
        return _ENTRY.pack(self.version, self.producer_id, self.first_offset, self.last_offset,
                           self.last_stable_offset)

    @classmethod
    def decode(cls, data: bytes, pos: int = 0) -> "AbortedTxn":
        version, pid, first, last, lso = _ENTRY.unpack_from(data, pos)
        return cls(pid, first, last, lso, version)

    def __str__(self) -> str:   # as Kafka's AbortedTxn.toString, which dump-log prints
        return (f"AbortedTxn(version={self.version}, producerId={self.producer_id}, "
                f"firstOffset={self.first_offset}, lastOffset={self.last_offset}, "
                f"lastStableOffset={self.last_stable_offset})")


def read_entries(path: str) -> list[AbortedTxn]:
    """Every entry of a `.txnindex` file (none when it does not exist)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    if len(data) % ENTRY_SIZE:
        raise CorruptIndexError(f"transaction index file {path} has size {len(data)}, which is "
                                f"not a multiple of the entry size {ENTRY_SIZE}")
    entries = [AbortedTxn.decode(data, pos) for pos in range(0, len(data), ENTRY_SIZE)]
    for e in entries:
        if e.version != CURRENT_VERSION:
            raise CorruptIndexError(f"unexpected aborted transaction version {e.version} in "
                                    f"transaction index {path}, current version is {CURRENT_VERSION}")
    return entries


class TransactionIndex:
    """The `.txnindex` of one segment; entries are kept in memory and appended to the file."""

    def __init__(self, path: str, start_offset: int):
        self.path = path
        self.start_offset = start_offset
        self.corrupt = False
        try:
            self._entries: list[AbortedTxn] = read_entries(path)
        except CorruptIndexError:   # e.g. torn by a crash: the log rebuilds it from the batches
            self.corrupt = True
            self._entries = []
            self.delete()
        self._last_offset = self._entries[-1].last_offset if self._entries else None

    @property
    def entries(self) -> list[AbortedTxn]:
        return list(self._entries)

    def append(self, txn: AbortedTxn) -> None:
        """Append an entry; last offsets must grow (Kafka refuses an out-of-order append)."""
        if self._last_offset is not None and txn.last_offset < self._last_offset:
            raise ValueError(f"the last offset of appended transaction entry {txn} is less than "
                             f"the last offset {self._last_offset} of the previous entry")
        with open(self.path, "ab") as f:
            f.write(txn.encode())
        self._entries.append(txn)
        self._last_offset = txn.last_offset

    def collect_aborted(self, fetch_offset: int, upper_bound_offset: int) -> tuple[list[AbortedTxn], bool]:
        """Entries overlapping [fetch_offset, upper_bound_offset), and whether the search is
        complete: an entry whose last stable offset passes the bound ends it
        (TransactionIndex.collectAbortedTxns)."""
        found = []
        for e in self._entries:
            if e.last_offset >= fetch_offset and e.first_offset < upper_bound_offset:
                found.append(e)
            if e.last_stable_offset >= upper_bound_offset:
                return found, True
        return found, False

    def truncate_to(self, offset: int) -> None:
        """Keep only the entries whose marker is below `offset`."""
        kept = [e for e in self._entries if e.last_offset < offset]
        if len(kept) == len(self._entries):
            return
        self._rewrite(kept)

    def reset(self) -> None:
        self._rewrite([])

    def _rewrite(self, entries: list[AbortedTxn]) -> None:
        self._entries = list(entries)
        self._last_offset = entries[-1].last_offset if entries else None
        if not entries:
            self.delete()
            return
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"".join(e.encode() for e in entries))
        os.replace(tmp, self.path)

    def rename_to(self, path: str) -> None:
        if os.path.exists(self.path):
            os.replace(self.path, path)
        self.path = path

    def delete(self) -> None:
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass

    def exists(self) -> bool:
        return os.path.exists(self.path)

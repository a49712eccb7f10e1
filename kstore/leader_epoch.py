"""The leader-epoch cache of one partition: which leader epoch started at which offset.

Mirrors Kafka's `LeaderEpochFileCache` (KIP-101, KIP-279), persisted in `leader-epoch-checkpoint`.
Entries (epoch, startOffset) strictly increase in both fields. Followers use `end_offset_for` to
find where their log diverges from the leader's instead of truncating to their high watermark.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from .checkpoint import LeaderEpochCheckpointFile

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class LeaderEpochFileCache:
    def __init__(self, checkpoint_path: str | None):
        self._file = LeaderEpochCheckpointFile(checkpoint_path) if checkpoint_path else None
        self._entries: list[EpochEntry] = (
            [EpochEntry(e, o) for e, o in self._file.read()] if self._file else [])
        self._lock = threading.RLock()

    def detach_file(self) -> None:
        """Keep the entries read so far in memory only (offline read-only tools)."""
        self._file = None

    # ---- reading
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    def is_empty(self) -> bool:
        return not self._entries

    def latest_epoch(self) -> int | None:
        return self._entries[-1].epoch if self._entries else None

    def latest_entry(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    def earliest_entry(self) -> EpochEntry | None:
        return self._entries[0] if self._entries else None

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch whose range holds `offset`: the last entry starting at or before it."""
        found = None
        for e in self._entries:
            if e.start_offset <= offset:
                found = e.epoch
            else:
                break
        return found

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for `requested_epoch`, as the leader answers OffsetsForLeaderEpoch."""
        with self._lock:
            if requested_epoch == UNDEFINED_EPOCH:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            if self._entries and requested_epoch == self._entries[-1].epoch:
                return requested_epoch, log_end_offset
            higher = [e for e in self._entries if e.epoch > requested_epoch]
            if not higher:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            lower = [e for e in self._entries if e.epoch <= requested_epoch]
            if not lower:
                return requested_epoch, higher[0].start_offset
            return lower[-1].epoch, higher[0].start_offset

    # ---- changing
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` started at `start_offset`; return whether the cache changed."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"received invalid partition leader epoch entry "
                             f"(epoch {epoch}, start offset {start_offset})")
        # A steady leader's appends all land here: answer them without the lock. Reading the
        # list's last entry is atomic, so this answer is what the cache held at one instant,
        # as if this call had run just before any change racing with it.
        entries = self._entries
        if entries and entries[-1].epoch == epoch and entries[-1].start_offset <= start_offset:
            return False
        with self._lock:
            latest = self.latest_entry()
            if latest is not None and latest.epoch == epoch and latest.start_offset <= start_offset:
                return False
            while self._entries and (self._entries[-1].epoch >= epoch
                                     or self._entries[-1].start_offset >= start_offset):
                self._entries.pop()
            self._entries.append(EpochEntry(epoch, start_offset))
            self._flush()
            return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Remove entries starting at or after `end_offset` (log truncation)."""
        with self._lock:
            if self._entries and end_offset >= 0 and self._entries[-1].start_offset >= end_offset:
                self._entries = [e for e in self._entries if e.start_offset < end_offset]
                self._flush()

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop entries wholly below `start_offset`; the last one removed moves up to it."""
        with self._lock:
            removed = [e for e in self._entries if e.start_offset <= start_offset]
            if not removed:
                return
            kept = [e for e in self._entries if e.start_offset > start_offset]
            new_entries = [EpochEntry(removed[-1].epoch, start_offset)] + kept
            if new_entries != self._entries:
                self._entries = new_entries
                self._flush()

    def clear(self) -> None:
        with self._lock:
            self._entries = []
            self._flush()

    def _flush(self) -> None:
        if self._file is not None:
            self._file.write(self._entries)

    def __repr__(self) -> str:
        return f"LeaderEpochFileCache({[tuple(e) for e in self._entries]})"

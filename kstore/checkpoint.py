"""Kafka's text checkpoint files: a version line, a count line, then one entry per line.

Mirrors Kafka's `CheckpointFile`, `OffsetCheckpointFile` and `LeaderEpochCheckpointFile`:

    0                  <- version (always 0)
    2                  <- number of entries
    orders 0 1234      <- "topic partition offset" (offset checkpoints)
    orders 1 987          or "epoch startOffset" (leader-epoch-checkpoint)

Written atomically: `<file>.tmp` is written and fsynced, renamed over the target, and the
directory fsynced, so a crash leaves either the old file or the new one, never half of each.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from typing import Iterable

from .errors import CheckpointError

CURRENT_VERSION = 0
_WS = re.compile(r"\s+")

# File names (LogManager, ReplicaManager, LogCleanerManager, LeaderEpochCheckpointFile).
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, text: str) -> None:
    """Write `text` to `path` via `path.tmp` + fsync + rename + directory fsync."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


@contextlib.contextmanager
def file_lock(path: str):
    """Hold an exclusive lock on the file `path` (created if missing) for the `with` block, so
    the processes sharing a file serialize their read-change-write of it. An flock: the kernel
    drops it if the process dies, so a killed writer never leaves it held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def format_checkpoint(entries: Iterable[tuple]) -> str:
    entries = list(entries)
    lines = [str(CURRENT_VERSION), str(len(entries))] + [" ".join(map(str, e)) for e in entries]
    return "".join(line + "\n" for line in lines)


def parse_checkpoint(text: str, arity: int, source: str = "checkpoint") -> list[list[str]]:
    """Parse the version/count/entries format; raise CheckpointError naming the problem."""
    lines = text.splitlines()
    if not lines or (len(lines) == 1 and not lines[0].strip()):
        return []  # an empty file has no entries
    try:
        version = int(lines[0].strip())
    except ValueError:
        raise CheckpointError(f"malformed version line {lines[0]!r} in {source}") from None
    if version != CURRENT_VERSION:
        raise CheckpointError(f"unrecognised version of the checkpoint file {source}: {version}")
    if len(lines) < 2:
        raise CheckpointError(f"expected an entry count line after the version in {source}")
    try:
        expected = int(lines[1].strip())
    except ValueError:
        raise CheckpointError(f"malformed count line {lines[1]!r} in {source}") from None
    entries = []
    for line in lines[2:]:
        if not line.strip():
            continue
        fields = _WS.split(line.strip())
        if len(fields) != arity:
            raise CheckpointError(f"malformed line in checkpoint file ({source}): {line!r}")
        entries.append(fields)
    if len(entries) != expected:
        raise CheckpointError(
            f"expected {expected} entries in checkpoint file ({source}), but found only "
            f"{len(entries)}")
    return entries


def _parse_int(value: str, line: list[str], source: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise CheckpointError(f"malformed line in checkpoint file ({source}): "
                              f"{' '.join(line)!r}") from None


class OffsetCheckpointFile:
    """`topic partition offset` entries: recovery points, log start offsets, HWs, cleaner offsets."""

    def __init__(self, path: str):
        self.path = str(path)

    def write(self, offsets: dict[tuple[str, int], int]) -> None:
        atomic_write(self.path, format_checkpoint(
            (t, p, o) for (t, p), o in sorted(offsets.items())))

    def read(self) -> dict[tuple[str, int], int]:
        if not os.path.exists(self.path):
            return {}
        with open(self.path, encoding="utf-8") as f:
            text = f.read()
        out = {}
        for fields in parse_checkpoint(text, 3, self.path):
            topic, partition, offset = fields
            out[(topic, _parse_int(partition, fields, self.path))] = _parse_int(offset, fields, self.path)
        return out


class LeaderEpochCheckpointFile:
    """`epoch startOffset` entries (leader-epoch-checkpoint)."""

    def __init__(self, path: str):
        self.path = str(path)

    def write(self, entries: Iterable[tuple[int, int]]) -> None:
        atomic_write(self.path, format_checkpoint(entries))

    def read(self) -> list[tuple[int, int]]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as f:
            text = f.read()
        return [(_parse_int(e, f_, self.path), _parse_int(o, f_, self.path))
                for f_ in parse_checkpoint(text, 2, self.path) for e, o in [f_]]

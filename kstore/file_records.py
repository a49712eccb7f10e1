"""The `.log` file of a segment: batches appended at the end, read back by position.

Mirrors Kafka's `FileRecords` and `FileLogInputStream`. A read returns a `FileSlice` (file + start +
size), not bytes: the network layer can hand the slice to `os.sendfile` without copying it through
Python, as Kafka's `FileRecords.writeTo` hands it to `FileChannel.transferTo`.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Iterator, NamedTuple

from .errors import CorruptRecordError, LogError
from .records import (HEADER_SIZE_UP_TO_MAGIC, LAST_OFFSET_DELTA_OFFSET, LOG_OVERHEAD,
                      MAGIC_OFFSET, MIN_BATCH_LENGTH_FIELD, RECORD_BATCH_OVERHEAD, MemoryRecords,
                      RecordBatch)

_BASE_AND_LENGTH = struct.Struct(">qi")


class BatchLocation(NamedTuple):
    """Where a batch sits in a file, read from its header without loading the records."""
    position: int
    base_offset: int
    last_offset: int
    size: int
    magic: int
    max_timestamp: int


class LogOffsetPosition(NamedTuple):
    offset: int
    position: int
    size: int


class FileRecords:
    """An append-only file of batches, with a logical end `size` (may be below the file length
    when preallocated)."""

    def __init__(self, path: str, *, preallocate_size: int = 0, file_already_exists: bool | None = None,
                 read_only: bool = False):
        self.path = str(path)
        self.read_only = read_only   # offline tools: opened O_RDONLY, never written or trimmed
        exists = os.path.exists(self.path) if file_already_exists is None else file_already_exists
        mode = os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT
        self._fd = os.open(self.path, mode, 0o644)
        if not exists and preallocate_size > 0:
            os.ftruncate(self._fd, preallocate_size)
            self._size = 0  # preallocated: logical size 0, file full length
        else:
            self._size = os.fstat(self._fd).st_size
        self.preallocated = not exists and preallocate_size > 0

    # ---- basic facts
    @property
    def fd(self) -> int:
        return self._fd

    def size_in_bytes(self) -> int:
        return self._size

    def file_length(self) -> int:
        return os.fstat(self._fd).st_size

    def file_name(self) -> str:
        return os.path.basename(self.path)

    # ---- writing
    def append(self, data: bytes) -> int:
        """Write `data` at the logical end; return the number of bytes written."""
        n = os.pwrite(self._fd, data, self._size)
        if n != len(data):
            raise OSError(f"short write to {self.path}: {n} of {len(data)} bytes")
        self._size += n
        return n

    def flush(self) -> None:
        os.fsync(self._fd)

    def truncate_to(self, target_size: int) -> int:
        """Cut the file to `target_size`; return the bytes removed (FileRecords.truncateTo)."""
        if target_size > self._size or target_size < 0:
            raise LogError(
                f"attempt to truncate log segment {self.path} to {target_size} bytes failed, "
                f"size of this log segment is {self._size} bytes")
        original = self._size
        if target_size < self.file_length():
            os.ftruncate(self._fd, target_size)
        self._size = target_size
        return original - target_size

    def trim_to_size(self) -> None:
        """Drop preallocated space past the logical end (on roll and close)."""
        if self.file_length() != self._size:
            os.ftruncate(self._fd, self._size)

    def close(self) -> None:
        if self._fd >= 0:
            if not self.read_only:
                self.trim_to_size()
            os.close(self._fd)
            self._fd = -1

    def close_handlers(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def rename_to(self, new_path: str) -> None:
        os.replace(self.path, new_path)
        self.path = str(new_path)

    def delete(self) -> None:
        self.close_handlers()
        if os.path.exists(self.path):
            os.remove(self.path)

    # ---- reading
    def read(self, position: int, size: int) -> bytes:
        return os.pread(self._fd, size, position)

    def _headers(self, start: int, end: int | None) -> Iterator[tuple[int, bytes, int]]:
        """(position, header bytes, batch size) for each complete batch, as
        `FileLogInputStream.nextBatch` walks them: stop quietly at a partial trailing batch, raise
        CorruptRecordError for a length below the legal minimum."""
        end = self._size if end is None else min(end, self._size)
        pos = start
        while pos < end - HEADER_SIZE_UP_TO_MAGIC:
            header = os.pread(self._fd, RECORD_BATCH_OVERHEAD, pos)
            _, length = _BASE_AND_LENGTH.unpack_from(header, 0)
            if length < MIN_BATCH_LENGTH_FIELD:
                raise CorruptRecordError(
                    f"found record size {length} smaller than minimum record overhead "
                    f"({MIN_BATCH_LENGTH_FIELD}) in file {self.path} at position {pos}")
            size = LOG_OVERHEAD + length
            if pos + size > end:
                return
            yield pos, header, size
            pos += size

    def batch_locations(self, start: int = 0, end: int | None = None) -> Iterator[BatchLocation]:
        """Where each batch is, read from its header alone."""
        for pos, header, size in self._headers(start, end):
            base_offset = _BASE_AND_LENGTH.unpack_from(header, 0)[0]
            magic = header[MAGIC_OFFSET]
            if len(header) >= RECORD_BATCH_OVERHEAD and magic == 2:
                (delta,) = struct.unpack_from(">i", header, LAST_OFFSET_DELTA_OFFSET)
                (max_ts,) = struct.unpack_from(">q", header, 35)
                yield BatchLocation(pos, base_offset, base_offset + delta, size, magic, max_ts)
            else:
                # Legacy (v0/v1) entries put the offset of their last message in the first field.
                yield BatchLocation(pos, base_offset, base_offset, size, magic, -1)

    def batch_headers(self, start: int = 0, end: int | None = None) -> Iterator[RecordBatch]:
        """v2 batch headers only (61 bytes each, records not read): cheap scans of producer fields."""
        for pos, header, _size in self._headers(start, end):
            if len(header) >= RECORD_BATCH_OVERHEAD and header[MAGIC_OFFSET] == 2:
                yield RecordBatch(header, pos)

    def batches(self, start: int = 0, end: int | None = None) -> Iterator[RecordBatch]:
        """Full batches (header + records) from `start`; same stopping rules as batch_locations."""
        for loc in self.batch_locations(start, end):
            yield RecordBatch(os.pread(self._fd, loc.size, loc.position), loc.position)

    def search_for_offset_with_size(self, target_offset: int, starting_position: int) -> LogOffsetPosition | None:
        """The first batch at or after `starting_position` whose last offset ≥ target."""
        for loc in self.batch_locations(starting_position):
            if loc.last_offset >= target_offset:
                return LogOffsetPosition(loc.base_offset, loc.position, loc.size)
        return None

    def slice(self, position: int, size: int) -> "FileSlice":
        """A view [position, position+size) clamped to the current end (FileRecords.slice)."""
        if position < 0:
            raise ValueError(f"invalid position {position} in read from {self.path}")
        if position > self._size:
            raise ValueError(f"slice from position {position} exceeds end position "
                             f"{self._size} of {self.path}")
        if size < 0:
            raise ValueError(f"invalid size {size} in read from {self.path}")
        return FileSlice(self, position, min(size, self._size - position))


@dataclass(frozen=True)
class FileSlice:
    """A byte range of a segment file. Starts on a batch boundary; may end inside a batch."""
    file: FileRecords
    position: int
    size: int

    def read_bytes(self) -> bytes:
        return self.file.read(self.position, self.size)

    def to_memory_records(self) -> MemoryRecords:
        return MemoryRecords(self.read_bytes(), base_position=self.position)

    def batches(self) -> list[RecordBatch]:
        """Complete batches in the slice (a partial trailing batch is dropped, as clients do)."""
        return self.to_memory_records().batches()

    def send_to(self, sock_fd: int, offset: int = 0, count: int | None = None) -> int:
        """Zero-copy: page cache → socket with os.sendfile; returns bytes sent."""
        count = self.size - offset if count is None else count
        return os.sendfile(sock_fd, self.file.fd, self.position + offset, count)


EMPTY = b""

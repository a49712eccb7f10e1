"""The sparse offset index (`.index`) and time index (`.timeindex`) of a segment.

Mirrors Kafka's `AbstractIndex`, `OffsetIndex` and `TimeIndex`. Both are arrays of fixed-size,
big-endian entries in a memory-mapped file:

* `.index`     — 8 bytes:  int32 relative offset, int32 position in the `.log`
* `.timeindex` — 12 bytes: int64 timestamp, int32 relative offset

A new file is preallocated to `segment.index.bytes` (rounded down to whole entries) so appends
never grow it; an existing file counts *every* slot as an entry, which is why indexes are trimmed
to their real size when a segment rolls or closes. A lookup returns the largest entry whose key is
≤ the target: the index is only a starting point for a forward scan of the log.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import NamedTuple

from .errors import CorruptIndexError, IndexFullError, IndexOffsetOverflowError, InvalidOffsetError

INT32_MAX = (1 << 31) - 1


class OffsetPosition(NamedTuple):
    offset: int
    position: int


class TimestampOffset(NamedTuple):
    timestamp: int
    offset: int


class AbstractIndex:
    """A memory-mapped array of fixed-size entries, sorted by key."""

    entry_size: int = 0
    _entry: struct.Struct

    def __init__(self, path: str, base_offset: int, max_index_size: int = 10 * 1024 * 1024,
                 writable: bool = True):
        if max_index_size < self.entry_size:
            raise ValueError(f"max index size {max_index_size} is smaller than one entry "
                             f"({self.entry_size} bytes)")
        self.path = str(path)
        self.base_offset = base_offset
        self.max_index_size = max_index_size
        self.writable = writable
        newly_created = not os.path.exists(self.path)
        if newly_created:
            if not writable:
                raise FileNotFoundError(self.path)
            with open(self.path, "wb") as f:
                f.truncate(self._round_down(max_index_size))
        self._mmap: mmap.mmap | None = None
        self._length = 0
        self._map(os.path.getsize(self.path))
        # A new file has no entries; an existing one counts every whole slot (AbstractIndex).
        self._entries = 0 if newly_created else self._length // self.entry_size

    # ---- mapping
    def _round_down(self, n: int) -> int:
        return n - n % self.entry_size

    def _map(self, length: int) -> None:
        self._length = length
        self._max_entries = length // self.entry_size   # kept: is_full is asked on every append
        self._mmap = None
        if length > 0:
            with open(self.path, "r+b" if self.writable else "rb") as f:
                access = mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ
                self._mmap = mmap.mmap(f.fileno(), length, access=access)
            # Lookups binary-search the file and appends touch its tail, so tell the kernel not
            # to read ahead around a fault. Without this hint the first write into a fresh,
            # preallocated (sparse) 10 MiB index makes Linux fill the whole file with zero
            # pages (about 2 ms each for the .index and .timeindex of every new segment, paid
            # inside the append that rolls it); with it that write costs microseconds. Kafka's
            # JVM cannot give this hint; the files and their bytes are the same.
            if hasattr(mmap, "MADV_RANDOM"):     # not on Windows
                self._mmap.madvise(mmap.MADV_RANDOM)

    def _unmap(self) -> None:
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None

    def get(self) -> "AbstractIndex":
        """An open index is its own `LazyIndex.get()`: code may ask either for the open index."""
        return self

    # ---- size
    @property
    def entries(self) -> int:
        return self._entries

    @property
    def max_entries(self) -> int:
        return self._max_entries

    @property
    def length(self) -> int:
        """Length of the file (preallocated, so usually more than the bytes in use)."""
        return self._length

    @property
    def size_in_bytes(self) -> int:
        return self._entries * self.entry_size

    def is_full(self) -> bool:
        return self._entries >= self._max_entries

    def resize(self, new_size: int) -> bool:
        """Set the file length (rounded down to whole entries) and remap; entries are kept."""
        rounded = self._round_down(new_size)
        if rounded == self._length:
            return False
        self._unmap()
        with open(self.path, "r+b") as f:
            f.truncate(rounded)
        self._map(rounded)
        if rounded // self.entry_size < self._entries:
            self._truncate_to_entries(rounded // self.entry_size)
        return True

    def trim_to_valid_size(self) -> None:
        self.resize(self._entries * self.entry_size)

    def reset(self) -> None:
        """Drop every entry and go back to the preallocated size (used by recovery)."""
        self.truncate()
        self.resize(self.max_index_size)

    def truncate(self) -> None:
        self._truncate_to_entries(0)

    def _truncate_to_entries(self, n: int) -> None:
        self._entries = n
        self._on_truncated()

    def _on_truncated(self) -> None:  # TimeIndex refreshes its cached last entry
        pass

    def flush(self) -> None:
        if self._mmap is not None and self.writable:
            self._mmap.flush()

    def close(self) -> None:
        if self.writable and os.path.exists(self.path):
            self.trim_to_valid_size()
        self._unmap()

    def close_handler(self) -> None:
        """Release the mapping without trimming (used before renaming or deleting)."""
        self._unmap()

    def delete(self) -> None:
        self._unmap()
        if os.path.exists(self.path):
            os.remove(self.path)

    def rename_to(self, new_path: str) -> None:
        if os.path.exists(self.path):
            os.replace(self.path, new_path)
        self.path = str(new_path)

    # ---- entries
    def _read(self, n: int) -> tuple:
        return self._entry.unpack_from(self._mmap, n * self.entry_size)

    def _write(self, values: tuple) -> None:
        self._entry.pack_into(self._mmap, self._entries * self.entry_size, *values)
        self._entries += 1

    def _key(self, n: int) -> int:
        raise NotImplementedError

    def largest_lower_bound_slot_for(self, target: int, key=None) -> int:
        """Binary search: the largest slot whose key is ≤ target, or −1 (AbstractIndex)."""
        key = key or self._key
        if self._entries == 0 or key(0) > target:
            return -1
        lo, hi = 0, self._entries - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if key(mid) <= target:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def smallest_upper_bound_slot_for(self, target: int, key) -> int:
        """The smallest slot whose key is ≥ target, or −1."""
        if self._entries == 0 or key(self._entries - 1) < target:
            return -1
        lo, hi = 0, self._entries - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if key(mid) >= target:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def relative_offset(self, offset: int) -> int:
        rel = offset - self.base_offset
        if not 0 <= rel <= INT32_MAX:
            raise IndexOffsetOverflowError(
                f"integer overflow for offset {offset} ({os.path.basename(self.path)}): the "
                f"relative offset {rel} is outside [0, {INT32_MAX}]")
        return rel

    def can_append_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= INT32_MAX

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is ≥ `offset` (AbstractIndex.truncateTo)."""
        slot = self.largest_lower_bound_slot_for(offset, self._offset_of_slot)
        if slot < 0:
            new_entries = 0
        elif self._offset_of_slot(slot) == offset:
            new_entries = slot
        else:
            new_entries = slot + 1
        if new_entries < self._entries:
            self._truncate_to_entries(new_entries)

    def _offset_of_slot(self, n: int) -> int:
        raise NotImplementedError

    def file_name(self) -> str:
        return os.path.basename(self.path)


_I32_AT = struct.Struct(">i")   # the first field of an entry: an offset index's relative offset
_I64_AT = struct.Struct(">q")   # and a time index's timestamp


class OffsetIndex(AbstractIndex):
    """offset → position of the batch in the `.log` (8-byte entries)."""

    entry_size = 8
    _entry = struct.Struct(">ii")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Kept in memory, as Kafka's OffsetIndex keeps `_lastOffset`: every append checks it,
        # and reading it back from the mapping each time costs more than the write itself.
        self._last_offset = self._last_offset_from_file()

    def _last_offset_from_file(self) -> int:
        return self.entry(self._entries - 1).offset if self._entries else self.base_offset

    def _on_truncated(self) -> None:
        self._last_offset = self._last_offset_from_file()

    def _key(self, n: int) -> int:
        # One call per probe of the binary search (not self._read's two): every fetch and
        # every lookup by offset probes about log2(entries) slots. 8 is entry_size, written out:
        # the attribute lookup would add ~0.35 µs to a lookup.
        return self.base_offset + _I32_AT.unpack_from(self._mmap, n * 8)[0]

    _offset_of_slot = _key

    def entry(self, n: int) -> OffsetPosition:
        if not 0 <= n < self._entries:
            raise IndexError(f"slot {n} is outside the {self._entries} entries of {self.file_name()}")
        rel, pos = self._read(n)
        return OffsetPosition(self.base_offset + rel, pos)

    def entries_list(self) -> list[OffsetPosition]:
        return [self.entry(i) for i in range(self._entries)]

    @property
    def last_offset(self) -> int:
        return self._last_offset

    def last_entry(self) -> OffsetPosition:
        return self.entry(self._entries - 1) if self._entries else OffsetPosition(self.base_offset, 0)

    def lookup(self, target_offset: int) -> OffsetPosition:
        """Largest entry with offset ≤ target; (baseOffset, 0) when there is none."""
        slot = self.largest_lower_bound_slot_for(target_offset)
        return OffsetPosition(self.base_offset, 0) if slot < 0 else self.entry(slot)

    def fetch_upper_bound_offset(self, start_position: int, fetch_size: int) -> OffsetPosition | None:
        """The first entry at or beyond start_position + fetch_size, if any."""
        slot = self.smallest_upper_bound_slot_for(start_position + fetch_size,
                                                  lambda n: self._read(n)[1])
        return None if slot < 0 else self.entry(slot)

    def append(self, offset: int, position: int) -> None:
        if self.is_full():
            raise IndexFullError(
                f"attempt to append to a full index (size = {self._entries}) "
                f"{self.file_name()}")
        if self._entries > 0 and offset <= self._last_offset:
            raise InvalidOffsetError(
                f"attempt to append an offset ({offset}) to position {self._entries} no larger "
                f"than the last offset appended ({self._last_offset}) to {self.file_name()}")
        self._write((self.relative_offset(offset), position))
        self._last_offset = offset

    def sanity_check(self) -> None:
        if self._entries != 0 and self.last_offset < self.base_offset:
            raise CorruptIndexError(
                f"corrupt index found, index file ({self.path}) has non-zero size but the last "
                f"offset is {self.last_offset} which is less than the base offset "
                f"{self.base_offset}")
        if self._length % self.entry_size != 0:
            raise CorruptIndexError(
                f"index file {self.path} is corrupt, found {self._length} bytes which is neither "
                f"positive nor a multiple of {self.entry_size}")


class TimeIndex(AbstractIndex):
    """timestamp → offset (12-byte entries): "the largest timestamp seen up to `offset`"."""

    entry_size = 12
    _entry = struct.Struct(">qi")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._last = self._last_entry_from_file()

    def _key(self, n: int) -> int:
        return _I64_AT.unpack_from(self._mmap, n * 12)[0]   # one call per probe; 12 = entry_size

    def _offset_of_slot(self, n: int) -> int:
        return self.base_offset + self._read(n)[1]

    def entry(self, n: int) -> TimestampOffset:
        if not 0 <= n < self._entries:
            raise IndexError(f"slot {n} is outside the {self._entries} entries of {self.file_name()}")
        ts, rel = self._read(n)
        return TimestampOffset(ts, self.base_offset + rel)

    def entries_list(self) -> list[TimestampOffset]:
        return [self.entry(i) for i in range(self._entries)]

    def _last_entry_from_file(self) -> TimestampOffset:
        return self.entry(self._entries - 1) if self._entries else TimestampOffset(-1, self.base_offset)

    def _on_truncated(self) -> None:
        self._last = self._last_entry_from_file()

    def last_entry(self) -> TimestampOffset:
        return self._last

    def is_full(self) -> bool:
        # One slot stays free for the final entry written on roll/close (skip_full_check).
        return self._entries >= self._max_entries - 1

    def lookup(self, target_timestamp: int) -> TimestampOffset:
        """Largest entry with timestamp ≤ target; (−1, baseOffset) when there is none."""
        slot = self.largest_lower_bound_slot_for(target_timestamp)
        return TimestampOffset(-1, self.base_offset) if slot < 0 else self.entry(slot)

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> bool:
        """Append only if the timestamp is larger than the last one; return whether it did."""
        if not skip_full_check and self.is_full():
            raise IndexFullError(
                f"attempt to append to a full time index (size = {self._entries}) "
                f"{self.file_name()}")
        if self._entries > 0 and offset < self._last.offset:
            raise InvalidOffsetError(
                f"attempt to append an offset ({offset}) to slot {self._entries} no larger than "
                f"the last offset appended ({self._last.offset}) to {self.file_name()}")
        if self._entries > 0 and timestamp < self._last.timestamp:
            raise InvalidOffsetError(
                f"attempt to append a timestamp ({timestamp}) to slot {self._entries} no larger "
                f"than the last timestamp appended ({self._last.timestamp}) to {self.file_name()}")
        if timestamp > self._last.timestamp:
            if self._entries >= self.max_entries:  # even skip_full_check needs a free slot
                raise IndexFullError(f"no free slot in {self.file_name()}")
            self._write((timestamp, self.relative_offset(offset)))
            self._last = TimestampOffset(timestamp, offset)
            return True
        return False

    def sanity_check(self) -> None:
        if self._entries != 0:
            last, first = self._last_entry_from_file(), self.entry(0)
            if last.timestamp < first.timestamp:
                raise CorruptIndexError(
                    f"corrupt time index found, time index file ({self.path}) has non-zero size "
                    f"but the last timestamp is {last.timestamp} which is less than the first "
                    f"timestamp {first.timestamp}")
            if last.offset < self.base_offset:
                raise CorruptIndexError(
                    f"corrupt time index found, time index file ({self.path}) has non-zero size "
                    f"but the last offset is {last.offset} which is less than the base offset "
                    f"{self.base_offset}")
        if self._length % self.entry_size != 0:
            raise CorruptIndexError(
                f"time index file {self.path} is corrupt, found {self._length} bytes which is "
                f"neither positive nor a multiple of {self.entry_size}")


class LazyIndex:
    """Kafka's `LazyIndex`: an index opened (memory-mapped) on first use, not when its segment
    is loaded. A broker with thousands of partitions on disk then holds index mappings — each
    one an open descriptor in Python, whose mmap keeps a duplicate of the file's — only for the
    segments that are read or written.

    Until first use it answers from what it knows without opening the file: its path, renames,
    deletion, closing, and a resize (remembered and applied when the index is opened). A new
    index file is still created (preallocated) at once, so a segment's three files always exist.
    Every other attribute opens the index and is forwarded to it."""

    def __init__(self, index_class: type, path: str, base_offset: int,
                 max_index_size: int = 10 * 1024 * 1024, writable: bool = True):
        self._class = index_class
        self.path = str(path)
        self.base_offset = base_offset
        self.max_index_size = max_index_size
        self.writable = writable
        self._index: AbstractIndex | None = None
        self._pending_size: int | None = None
        self._fresh = False   # created here: preallocated but without entries
        self._closed = False  # after close() it is opened again only to be read (a view may)
        if writable and not os.path.exists(self.path):
            if max_index_size < index_class.entry_size:
                raise ValueError(f"max index size {max_index_size} is smaller than one entry "
                                 f"({index_class.entry_size} bytes)")
            with open(self.path, "wb") as f:
                f.truncate(max_index_size - max_index_size % index_class.entry_size)
            self._fresh = True
        elif not os.path.exists(self.path):
            raise FileNotFoundError(self.path)

    @property
    def is_loaded(self) -> bool:
        return self._index is not None

    @property
    def entries(self) -> int:
        # Read twice on every append (to tell views of a new entry): spelled out, not proxied.
        return (self._index or self.get()).entries

    def lookup(self, target: int):
        # Every fetch looks up its offset: spelled out too (__getattr__ costs ~0.7 µs a call).
        return (self._index or self.get()).lookup(target)

    def get(self) -> AbstractIndex:
        if self._index is None:
            # Read-only once closed: a view drawing a closed log — perhaps already deleted with
            # its directory — must never create a fresh preallocated file where one was.
            index = self._class(self.path, self.base_offset, self.max_index_size,
                                self.writable and not self._closed)
            if self._fresh:
                index.truncate()   # a preallocated file of zeros holds no entries yet
                self._fresh = False
            if self._pending_size is not None:
                index.resize(self._pending_size)
                self._pending_size = None
            self._index = index
        return self._index

    _OWN = frozenset({"_class", "path", "base_offset", "max_index_size", "writable", "_index",
                      "_pending_size", "_fresh", "_closed"})

    def __getattr__(self, name: str):
        if name.startswith("__") or name in self._OWN:
            raise AttributeError(name)
        return getattr(self.get(), name)

    # Setting or deleting an attribute this class does not define acts on the index itself (a
    # transparent proxy); its own attributes and methods are set on the wrapper.
    def __setattr__(self, name: str, value) -> None:
        if name in self._OWN or hasattr(type(self), name):
            object.__setattr__(self, name, value)
        else:
            setattr(self.get(), name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._OWN or name in self.__dict__:
            object.__delattr__(self, name)
        else:
            delattr(self.get(), name)

    # ---- what needs no mapping
    def resize(self, new_size: int) -> bool:
        if self._index is not None:
            return self._index.resize(new_size)
        if self._fresh and new_size - new_size % self._class.entry_size == os.path.getsize(self.path):
            return False   # already preallocated to that size
        self._pending_size = new_size
        return True

    def is_full(self) -> bool:
        index = self._index   # asked twice on every append: the open index first
        if index is not None:
            return index.is_full()
        if self._fresh and self._pending_size is None:
            return False   # preallocated, no entries yet
        return self.get().is_full()

    def flush(self) -> None:
        if self._index is not None:
            self._index.flush()

    def close(self) -> None:
        self._closed = True
        if self._index is not None:
            self._index.close()
            self._index = None
        elif self._fresh and self.writable and os.path.exists(self.path):
            os.truncate(self.path, 0)   # never used: trimmed to its (zero) entries, as on close
            self._fresh = False

    def close_handler(self) -> None:
        if self._index is not None:
            self._index.close_handler()
            self._index = None

    def delete(self) -> None:
        if self._index is not None:
            self._index.delete()
            self._index = None
        elif os.path.exists(self.path):
            os.remove(self.path)

    def rename_to(self, new_path: str) -> None:
        if self._index is not None:
            self._index.rename_to(new_path)
        elif os.path.exists(self.path):
            os.replace(self.path, new_path)
        self.path = str(new_path)

    def __repr__(self) -> str:
        state = "loaded" if self._index is not None else "not loaded"
        return f"LazyIndex({self._class.__name__}, {self.path!r}, {state})"

"""Plug a learner's functions into the live engine, so an exercise that passes runs real appends,
lookups, retention passes, cleanings and replication — and one that is wrong fails where you see it.

Everything here is a context manager that swaps an engine function for the learner's (and puts the
engine's back on exit, even after an error):

    with live.demo("your varints write a real log"), live.plug(ch01_varints(write_varint, ...)):
        log.append(...)

`demo()` prints ✔ lines as the demo goes and, if the engine fails with the learner's code, a ✘ line
with the error instead of a traceback: the notebook keeps running.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class Patch:
    target: Any        # a module or a class
    name: str
    value: Any


@contextlib.contextmanager
def plug(*patches: Patch | list[Patch]) -> Iterator[None]:
    """Apply patches (the engine uses the learner's functions) and undo them on exit."""
    flat: list[Patch] = []
    for p in patches:
        flat.extend(p if isinstance(p, list) else [p])
    saved = []
    try:
        for p in flat:
            saved.append((p.target, p.name, p.target.__dict__.get(p.name, _MISSING)))
            setattr(p.target, p.name, p.value)
        yield
    finally:
        for target, name, old in reversed(saved):
            if old is _MISSING:
                delattr(target, name)
            else:
                setattr(target, name, old)


_MISSING = object()


class DemoFailed(Exception):
    """Raised by `Demo.expect` when the engine, running the learner's code, does not do what it should."""


class Demo:
    def __init__(self, title: str):
        self.title = title
        self.ok = True

    def step(self, text: str) -> None:
        print(f"  ✔ {text}")

    def note(self, text: str) -> None:
        print(f"    {text}")

    def expect(self, condition: bool, text: str, why: str = "") -> None:
        """Print ✔ text, or stop the demo with ✘ text (and why)."""
        if condition:
            self.step(text)
        else:
            raise DemoFailed(f"{text}: NO" + (f" — {why}" if why else ""))


@contextlib.contextmanager
def demo(title: str) -> Iterator[Demo]:
    """A live demo: its failure is printed (✘ ...) instead of raised, so the notebook goes on."""
    d = Demo(title)
    print(f"▶ {title}")
    try:
        yield d
    except DemoFailed as e:
        d.ok = False
        print(f"  ✘ {e}")
        print("  the engine ran your code and it went wrong here: run check(...) for the details")
    except NotImplementedError as e:
        d.ok = False
        print(f"  ✘ not yet: your code raised NotImplementedError ({e}) — finish the task first")
    except Exception as e:
        d.ok = False
        tb = traceback.extract_tb(e.__traceback__)
        where = f" (in {tb[-1].name}, {tb[-1].filename.split('/')[-1]}:{tb[-1].lineno})" if tb else ""
        print(f"  ✘ the engine failed with your code: {type(e).__name__}: {e}{where}")
        print("  run check(...) above for the feedback on your functions")
    else:
        print("  done ✔")


@contextlib.contextmanager
def scratch(prefix: str = "kstore-demo-") -> Iterator[str]:
    """A temporary directory for a demo's partition directories, removed afterwards."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def hexdump(data: bytes, width: int = 16, limit: int = 256) -> str:
    lines = []
    for i in range(0, min(len(data), limit), width):
        chunk = data[i:i + width]
        lines.append(f"{i:04x}  {chunk.hex(' '):<{width * 3}} "
                     f"{''.join(chr(b) if 32 <= b < 127 else '.' for b in chunk)}")
    if len(data) > limit:
        lines.append(f"… ({len(data) - limit} more bytes)")
    return "\n".join(lines)


def func(f: Callable) -> Callable:
    """Identity; marks in notebooks that a learner's function is handed to the engine."""
    return f


# ------------------------------------------------------------------ chapter plugs
def record_encoding(write_varint: Callable, read_varint: Callable, write_varlong: Callable,
                    encode_record: Callable) -> list[Patch]:
    """Ch. 01: the engine encodes (and reads) records with the learner's varints and encoder."""
    from .. import records, varint
    return [Patch(varint, "write_varint", write_varint), Patch(varint, "read_varint", read_varint),
            Patch(varint, "write_varlong", write_varlong),
            Patch(records, "encode_record", encode_record)]


class _LazyKeys:
    """The keys of an index, read on demand (the learner's binary search reads a few of them)."""

    def __init__(self, n: int, key: Callable[[int], int]):
        self.n, self.key, self.reads = n, key, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        self.reads += 1
        return self.key(i)


def sparse_index(index_entries: Callable | None = None, largest_lower_bound_slot: Callable | None = None,
                 offset_index_lookup: Callable | None = None) -> list[Patch]:
    """Ch. 02: the learner decides where `.index` entries go and serves the index lookups."""
    from ..index import AbstractIndex, OffsetIndex, OffsetPosition
    from ..segment import LogSegment
    from ..index import TimestampOffset
    patches = []
    if index_entries is not None:
        def append(self, largest_offset, largest_timestamp, shallow_offset_of_max_timestamp, records):
            if not records:
                return
            history = self.__dict__.setdefault("_learner_appends", [])
            if self.log.size_in_bytes() == 0:
                self.rolling_based_timestamp = largest_timestamp
                history.clear()
            self._ensure_offset_in_range(largest_offset)
            self.log.append(records)
            if largest_timestamp > self.max_timestamp_so_far:
                self._max_ts_so_far = TimestampOffset(largest_timestamp, shallow_offset_of_max_timestamp)
            history.append((largest_offset, len(records)))
            entries = index_entries(list(history), self.index_interval_bytes)
            if len(entries) > self.offset_index.entries:       # the learner's rule says: index this one
                offset, position = entries[-1]
                self.offset_index.append(offset, position)
                self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far)
        patches.append(Patch(LogSegment, "append", append))
    if largest_lower_bound_slot is not None:
        def slot_for(self, target, key=None):
            return largest_lower_bound_slot(_LazyKeys(self._entries, key or self._key), target)
        patches.append(Patch(AbstractIndex, "largest_lower_bound_slot_for", slot_for))
    if offset_index_lookup is not None:
        def lookup(self, target_offset):
            entries = [(e.offset, e.position) for e in self.entries_list()]
            return OffsetPosition(*offset_index_lookup(entries, self.base_offset, target_offset))
        patches.append(Patch(OffsetIndex, "lookup", lookup))
    return patches


def segment_rolling(segment_file_name: Callable | None = None, base_offset_from_file_name: Callable | None = None,
                    time_waited_for_roll: Callable | None = None, should_roll: Callable | None = None) -> list[Patch]:
    """Ch. 03: the engine names segment files, and decides when to roll, with the learner's code."""
    from .. import log_loader, segment as seg_mod
    from ..segment import LogSegment
    patches = []
    if segment_file_name is not None:
        def prefix(offset: int) -> str:
            name = segment_file_name(offset, ".log")
            if not name.endswith(".log"):
                raise ValueError(f"segment_file_name({offset}, '.log') returned {name!r}")
            return name[:-len(".log")]
        patches.append(Patch(seg_mod, "filename_prefix_from_offset", prefix))
    if base_offset_from_file_name is not None:
        def parse(name: str) -> int:
            import os
            return base_offset_from_file_name(os.path.basename(name))
        patches += [Patch(seg_mod, "offset_from_file_name", parse), Patch(log_loader, "offset_from_file_name", parse)]
    if time_waited_for_roll is not None:
        def waited(self, now, message_timestamp):
            self._load_first_batch_timestamp()
            return time_waited_for_roll(self.rolling_based_timestamp, message_timestamp, self.created_ms, now)
        patches.append(Patch(LogSegment, "time_waited_for_roll", waited))
    if should_roll is not None:
        def roll(self, p):
            return should_roll(self.size, p.messages_size, p.max_segment_bytes,
                               self.time_waited_for_roll(p.now, p.max_timestamp_in_messages),
                               p.max_segment_ms - self.roll_jitter_ms,
                               self.offset_index.is_full() or self.time_index.is_full(),
                               self.base_offset, p.max_offset_in_messages)
        patches.append(Patch(LogSegment, "should_roll", roll))
    return patches


def finding_messages(floor_segment: Callable | None = None, translate_offset: Callable | None = None,
                     offset_for_timestamp: Callable | None = None) -> list[Patch]:
    """Ch. 04: the log finds segments, positions and timestamps with the learner's functions."""
    import struct
    from ..file_records import LogOffsetPosition
    from ..log import Log
    from ..segment import LogSegment, TimestampAndOffset
    from .views import SegmentView
    patches = []
    if floor_segment is not None:
        def floor(self, offset):
            base = floor_segment(list(self._bases), offset)
            return None if base is None else self._segments[base]
        patches.append(Patch(Log, "floor_segment", floor))
    if translate_offset is not None:
        def translate(self, offset, starting_file_position=0):
            found = translate_offset(SegmentView(self), offset)
            if found is None:
                return None
            position, size = found
            (base_offset,) = struct.unpack(">q", self.log.read(position, 8))
            return LogOffsetPosition(base_offset, position, size)
        patches.append(Patch(LogSegment, "translate_offset", translate))
    if offset_for_timestamp is not None:
        def by_timestamp(self, timestamp, starting_offset=None):
            offset = offset_for_timestamp(SegmentView(self), timestamp)
            if offset is None:
                return None
            for batch in self.log.batches():
                if batch.base_offset <= offset <= batch.last_offset:
                    for r in batch.records():
                        if r.offset == offset:
                            epoch = batch.partition_leader_epoch
                            return TimestampAndOffset(r.timestamp, r.offset, epoch if epoch >= 0 else None)
            return TimestampAndOffset(-1, offset, None)
        patches.append(Patch(LogSegment, "find_offset_by_timestamp", by_timestamp))
    return patches


def crash_recovery(valid_prefix_length: Callable, rebuild_index: Callable) -> list[Patch]:
    """Ch. 05: `LogSegment.recover` (run by the log loader after an unclean shutdown) cuts the
    `.log` where the learner's function says and rebuilds the offset index with the learner's rule."""
    from ..index import TimestampOffset
    from ..segment import LogSegment

    def recover(self, epoch_cache=None, max_message_size=None):
        size = self.log.size_in_bytes()
        data = self.log.read(0, size)
        valid = valid_prefix_length(data)
        if not 0 <= valid <= size:
            raise ValueError(f"valid_prefix_length returned {valid} for a {size}-byte file")
        entries = rebuild_index(data[:valid], self.base_offset, self.index_interval_bytes)
        self.offset_index.reset()
        self.time_index.reset()
        for offset, position in entries:
            self.offset_index.append(offset, position)
        best = TimestampOffset(-1, self.base_offset)
        for batch in self.log.batch_headers(0, valid):
            if batch.max_timestamp > best.timestamp:
                best = TimestampOffset(batch.max_timestamp, batch.last_offset)
            if epoch_cache is not None and batch.partition_leader_epoch >= 0:
                latest = epoch_cache.latest_epoch()
                if latest is None or batch.partition_leader_epoch > latest:
                    epoch_cache.assign(batch.partition_leader_epoch, batch.base_offset)
        self._max_ts_so_far = best
        truncated = size - valid
        if truncated:
            self.log.truncate_to(valid)
        self.recovery_error = "cut by your valid_prefix_length" if truncated else None
        self.offset_index.trim_to_valid_size()
        self.time_index.maybe_append(best.timestamp, best.offset, skip_full_check=True)
        self.time_index.trim_to_valid_size()
        self.bytes_since_last_index_entry = 0
        self.rolling_based_timestamp = None
        return truncated

    return [Patch(LogSegment, "recover", recover)]

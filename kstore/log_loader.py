"""Opening a partition directory: clean up leftovers, load segments, recover after a crash.

Mirrors Kafka's `LogLoader.load()`:
1. delete `*.deleted` files; delete `*.cleaned` files and any `.swap` at or above the smallest
   `.cleaned` offset (an unfinished cleaning); complete the remaining swaps;
2. load every segment, deleting index files that have no `.log`, rebuilding missing or insane
   indexes;
3. after an unclean shutdown, recover every segment from the recovery point on; if one loses
   bytes, every later segment is deleted (nothing after a torn write can be trusted);
4. work out the log end offset, log start offset and new recovery point.
The result includes a report of what was done, which the crash-recovery chapter shows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .clock import Clock
from .config import LogConfig
from .errors import CorruptRecordError, InvalidOffsetError, LogError, LogSegmentOffsetOverflowError
from .file_records import FileRecords
from .segment import (CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, SEGMENT_SUFFIXES,
                      SWAP_SUFFIX, LogSegment, offset_from_file_name, segment_paths)


@dataclass
class RecoveryReport:
    """What loading did: the chapter on crashes prints this."""
    had_clean_shutdown: bool
    deleted_files: list[str] = field(default_factory=list)
    completed_swaps: list[str] = field(default_factory=list)
    rebuilt_indexes: list[tuple[int, str]] = field(default_factory=list)   # (base, reason)
    recovered_segments: list[tuple[int, int, str | None]] = field(default_factory=list)  # (base, bytes cut, error)
    removed_after_corruption: list[int] = field(default_factory=list)
    truncated_bytes: int = 0
    started_empty_at: int | None = None   # no segment was left: a new empty one at this offset

    def summary(self) -> str:
        if not (self.deleted_files or self.completed_swaps or self.rebuilt_indexes
                or self.recovered_segments):
            return "clean load: nothing to recover" if self.had_clean_shutdown else "nothing to recover"
        parts = []
        if self.deleted_files:
            parts.append(f"deleted {len(self.deleted_files)} leftover file(s)")
        if self.completed_swaps:
            parts.append(f"completed {len(self.completed_swaps)} swap(s)")
        if self.rebuilt_indexes:
            parts.append(f"rebuilt indexes of {len(self.rebuilt_indexes)} segment(s)")
        if self.recovered_segments:
            parts.append(f"recovered {len(self.recovered_segments)} segment(s), "
                         f"truncated {self.truncated_bytes} byte(s)")
        if self.removed_after_corruption:
            parts.append(f"removed {len(self.removed_after_corruption)} segment(s) after the damage")
        return "; ".join(parts)

    def changes(self) -> list[str]:
        """One line per change loading made to the files (none after a clean load): what a
        broker logs so that an operator sees what recovery deleted, rebuilt or cut."""
        lines = [f"deleted {name}" for name in self.deleted_files]
        lines += [f"completed swap {name}" for name in self.completed_swaps]
        lines += [f"rebuilt the indexes of segment {base} ({reason})"
                  for base, reason in self.rebuilt_indexes]
        lines += [f"truncated {cut} invalid byte(s) at the end of segment {base}"
                  + (f": {error}" if error else "")
                  for base, cut, error in self.recovered_segments if cut > 0]
        lines += [f"deleted segment {base}, which followed the damage"
                  for base in self.removed_after_corruption]
        if self.started_empty_at is not None:
            lines.append(f"no segment (.log) file was left: the log starts empty at offset "
                         f"{self.started_empty_at}")
        return lines


@dataclass
class LoadedLog:
    segments: dict[int, LogSegment]
    log_start_offset: int
    recovery_point: int
    next_offset: int
    report: RecoveryReport


def _remove(path: str, report: RecoveryReport) -> None:
    if os.path.exists(path):
        os.remove(path)
        report.deleted_files.append(os.path.basename(path))


def _strip_suffix(name: str, suffix: str) -> str:
    return name[: -len(suffix)]


def _is_segment_file(name: str) -> bool:
    return name.split(".", 1)[0].isdigit() and len(name.split(".", 1)[0]) == 20


def _next_offset_of(log_path: str) -> int:
    """The offset after the last complete batch of a `.log` file (its base offset if empty)."""
    records = FileRecords(log_path, file_already_exists=True)
    try:
        next_offset = offset_from_file_name(log_path)
        for loc in records.batch_locations():
            next_offset = loc.last_offset + 1
        return next_offset
    except CorruptRecordError:
        return next_offset
    finally:
        records.close_handlers()


def remove_temp_files_and_complete_swaps(directory: str, report: RecoveryReport) -> None:
    names = sorted(os.listdir(directory))
    cleaned, swaps = [], []
    for name in names:
        if not _is_segment_file(name):
            continue
        path = os.path.join(directory, name)
        if name.endswith(DELETED_SUFFIX):
            _remove(path, report)
        elif name.endswith(CLEANED_SUFFIX):
            cleaned.append(name)
        elif name.endswith(SWAP_SUFFIX):
            swaps.append(name)
    min_cleaned = min((offset_from_file_name(n) for n in cleaned), default=None)
    for name in cleaned:
        _remove(os.path.join(directory, name), report)
    live_swaps = []
    for name in swaps:
        if min_cleaned is not None and offset_from_file_name(name) >= min_cleaned:
            _remove(os.path.join(directory, name), report)  # part of an unfinished cleaning
        else:
            live_swaps.append(name)
    swap_logs = [n for n in live_swaps if n.endswith(LOG_SUFFIX + SWAP_SUFFIX)]
    if swap_logs:
        # The offset range the swapped-in segments cover replaces the ordinary segments inside it.
        ranges = [(offset_from_file_name(n), _next_offset_of(os.path.join(directory, n)))
                  for n in swap_logs]
        lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
        for name in sorted(os.listdir(directory)):
            if (_is_segment_file(name) and any(name.endswith(s) for s in SEGMENT_SUFFIXES)
                    and lo <= offset_from_file_name(name) < hi):
                _remove(os.path.join(directory, name), report)
    for name in live_swaps:
        os.replace(os.path.join(directory, name),
                   os.path.join(directory, _strip_suffix(name, SWAP_SUFFIX)))
        report.completed_swaps.append(name)


def load_segments(directory: str, config: LogConfig, clock: Clock, epoch_cache,
                  report: RecoveryReport, read_only: bool = False) -> dict[int, LogSegment]:
    segments: dict[int, LogSegment] = {}
    names = sorted(os.listdir(directory))
    logs = {offset_from_file_name(n) for n in names if _is_segment_file(n) and n.endswith(LOG_SUFFIX)}
    if read_only:
        return {base: _open_read_only(directory, base, config, clock) for base in sorted(logs)}
    for name in names:  # index files whose .log is gone are orphans
        if (_is_segment_file(name) and any(name.endswith(s) for s in SEGMENT_SUFFIXES[1:])
                and offset_from_file_name(name) not in logs):
            _remove(os.path.join(directory, name), report)
    for base in sorted(logs):
        paths = segment_paths(directory, base)
        missing = [ext for ext in (INDEX_SUFFIX, ".timeindex") if not os.path.exists(paths[ext])]
        seg = LogSegment.open(directory, base, config, clock, file_already_exists=True)
        reason = f"missing {', '.join(missing)}" if missing else None
        if reason is None:
            try:
                seg.sanity_check()
            except Exception as e:  # CorruptIndexError and friends
                reason = f"corrupt index: {e}"
            else:
                _unmap_indexes(seg)
        if reason is not None:
            truncated = seg.recover(epoch_cache)
            report.rebuilt_indexes.append((base, reason))
            if truncated:
                report.recovered_segments.append((base, truncated, seg.recovery_error))
                report.truncated_bytes += truncated
        segments[base] = seg
    return segments


def _unmap_indexes(seg: LogSegment) -> None:
    """Checked at load, then unmapped: an index is mapped again when the segment is used, so a
    broker holds descriptors for the partitions in use, not for every partition on disk."""
    seg.offset_index.close_handler()
    seg.time_index.close_handler()


def _unmap_if_trimmed(seg: LogSegment) -> None:
    """Unmap the indexes whose file holds exactly their entries (reopening counts them right);
    a preallocated one — just rebuilt by recovery — stays mapped."""
    for index in (seg.offset_index, seg.time_index):
        if getattr(index, "is_loaded", False) and index.length == index.size_in_bytes:
            index.close_handler()


READ_ONLY_HINT = ("; offline read-only tools never rebuild files (start a broker on the directory "
                  "once to rebuild it)")


def _open_read_only(directory: str, base: int, config: LogConfig, clock: Clock) -> LogSegment:
    """A segment for an offline read-only tool: nothing may be rebuilt, so a missing or damaged
    index is an error naming the file instead of a repair."""
    paths = segment_paths(directory, base)
    for ext in (INDEX_SUFFIX, ".timeindex"):
        if not os.path.exists(paths[ext]):
            raise LogError(f"{paths[ext]} is missing{READ_ONLY_HINT}")
    seg = LogSegment.open(directory, base, config, clock, file_already_exists=True, read_only=True)
    try:
        seg.sanity_check()
        _unmap_indexes(seg)
    except Exception as e:  # CorruptIndexError and friends
        seg.close_handlers()
        raise LogError(f"{paths[INDEX_SUFFIX]}: {e}{READ_ONLY_HINT}") from None
    return seg


def recover_log(directory: str, segments: dict[int, LogSegment], recovery_point: int,
                epoch_cache, report: RecoveryReport) -> None:
    """Recover segments from the one holding the recovery point to the end (unclean shutdown)."""
    bases = sorted(segments)
    start_index = 0
    for i, base in enumerate(bases):
        if base <= recovery_point:
            start_index = i
    for i in range(start_index, len(bases)):
        seg = segments[bases[i]]
        try:
            truncated = seg.recover(epoch_cache)
        except (InvalidOffsetError, LogSegmentOffsetOverflowError) as e:
            truncated = seg.log.size_in_bytes()
            seg.truncate_to(seg.base_offset)
            seg.recovery_error = str(e)
        report.recovered_segments.append((seg.base_offset, truncated, seg.recovery_error))
        if truncated > 0:
            report.truncated_bytes += truncated
            for later in bases[i + 1:]:  # nothing after the damage can be trusted
                segments.pop(later).delete_files()
                report.removed_after_corruption.append(later)
            break


def load(directory: str, config: LogConfig, clock: Clock, epoch_cache, *,
         recovery_point_checkpoint: int, log_start_offset_checkpoint: int,
         had_clean_shutdown: bool, read_only: bool = False) -> LoadedLog:
    """`read_only` (offline tools): load what is there without changing any file — no temp-file
    cleanup, no recovery, no index resizing, no new segment."""
    report = RecoveryReport(had_clean_shutdown)
    if read_only:
        return _load_read_only(directory, config, clock, epoch_cache, report,
                               log_start_offset_checkpoint)
    remove_temp_files_and_complete_swaps(directory, report)
    segments = load_segments(directory, config, clock, epoch_cache, report)
    if not had_clean_shutdown and segments:
        recover_log(directory, segments, recovery_point_checkpoint, epoch_cache, report)
    next_offset = segments[max(segments)].read_next_offset() if segments else 0
    if segments and next_offset < log_start_offset_checkpoint:
        # Files were lost: the data the checkpoint promises is not on disk.
        for seg in segments.values():
            report.deleted_files.append(os.path.basename(seg.log.path))
            seg.delete_files()
        segments.clear()
    if not segments:
        base = log_start_offset_checkpoint
        if report.deleted_files or report.recovered_segments:
            report.started_empty_at = base   # not a new log: its files were lost or removed
        segments[base] = LogSegment.open(directory, base, config, clock,
                                         init_file_size=config.initial_file_size,
                                         preallocate=config.preallocate)
        next_offset = base
    active = segments[max(segments)]
    _unmap_if_trimmed(active)   # finding the next offset mapped it; it is mapped again on use
    active.offset_index.resize(config.segment_index_bytes)
    active.time_index.resize(config.segment_index_bytes)
    recovery_point = next_offset if had_clean_shutdown else min(recovery_point_checkpoint, next_offset)
    log_start_offset = max(log_start_offset_checkpoint, min(segments))
    if epoch_cache is not None:
        epoch_cache.truncate_from_end(next_offset)
        epoch_cache.truncate_from_start(log_start_offset)
    return LoadedLog(segments, log_start_offset, recovery_point, next_offset, report)


def _load_read_only(directory: str, config: LogConfig, clock: Clock, epoch_cache,
                    report: RecoveryReport, log_start_offset_checkpoint: int) -> LoadedLog:
    segments = load_segments(directory, config, clock, epoch_cache, report, read_only=True)
    if not segments:
        raise LogError(f"{directory} holds no segment (.log) file")
    next_offset = segments[max(segments)].read_next_offset()
    log_start_offset = max(log_start_offset_checkpoint, min(segments))
    if epoch_cache is not None:
        epoch_cache.truncate_from_end(next_offset)     # in memory only: its file is not written
        epoch_cache.truncate_from_start(log_start_offset)
    return LoadedLog(segments, log_start_offset, next_offset, next_offset, report)

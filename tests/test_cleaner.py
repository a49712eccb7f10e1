"""Log compaction (Kafka's LogCleaner, LogCleanerManager, MemoryRecords.filterTo): cases 50–55 of the
reference's §12, gaps left by compaction, `compact,delete`, a crash at every step of the segment
swap (§7.8), a property test of the cleaner's guarantees, and bad configurations.

Everything runs on real files in tmp_path with a ManualClock; nothing under test is mocked. The
crash tests inject a failure by subclassing `Log` (its `replace_segments` counts file renames and
dies before the N-th one), then reopen the directory the way a restarted broker would.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kstore import Log, LogConfig, LogManager, ManualClock, Record, RecordBatch, build_batch
from kstore.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from kstore.cleaner import (Cleaner, LogCleaner, LogToClean, cleanable_offsets,
                            group_segments_by_size, should_retain_record, size_up)
from kstore.errors import ConfigError, InvalidRecordError
from kstore.index import INT32_MAX
from kstore.offset_map import SkimpyOffsetMap
from kstore.records import DELETE_HORIZON_FLAG_MASK, RECORD_BATCH_OVERHEAD, crc32c

from helpers import T0


# ================================================================================ helpers
def open_log(directory: Path | str, config: dict, clock: ManualClock, **kwargs) -> Log:
    cfg = {"cleanup.policy": "compact"}
    cfg.update(config)
    return Log.open(str(directory), cfg, clock, **kwargs)


def k(i) -> bytes:
    return str(i).encode()


def offsets_in_log(log: Log) -> list[int]:
    return [r.offset for r in log.records()]


def keys_in_log(log: Log) -> list[bytes]:
    return [r.key for r in log.records()]


def all_batches(log: Log) -> list[RecordBatch]:
    return [b for seg in log.segments for b in seg.log.batches()]


def raw_batch(log: Log, batch: RecordBatch) -> bytes:
    """The exact bytes of a stored batch, read back from its segment file."""
    for seg in log.segments:
        for b in seg.log.batches():
            if b.base_offset == batch.base_offset:
                return seg.log.read(b.position, b.size_in_bytes)
    raise AssertionError(f"no batch at {batch.base_offset}")


def snapshot(log: Log) -> list[tuple]:
    return [(r.offset, r.key, r.value, r.timestamp) for r in log.records()]


def segment_files(directory: str | Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n[:20].isdigit())


def check_log_consistent(log: Log) -> None:
    """Every segment is whole, CRC-valid and in order; both indexes agree with the data; every
    stored record can be found through the index and read back through the log."""
    prev_last = -1
    for seg in log.segments:
        seg.sanity_check()
        batches = list(seg.log.batches())
        assert sum(b.size_in_bytes for b in batches) == seg.size, f"partial data in {seg}"
        by_position = {b.position: b for b in batches}
        for b in batches:
            assert b.is_valid(), f"bad CRC at offset {b.base_offset}"
            assert b.base_offset >= seg.base_offset and b.base_offset > prev_last
            prev_last = b.last_offset
            for r in b.records():
                found = seg.translate_offset(r.offset)
                assert found is not None and found.position == b.position, (seg, r.offset)
        entries = seg.offset_index.entries_list()
        for e in entries:
            assert e.position in by_position, f"index entry {e} is not a batch start"
            assert by_position[e.position].base_offset <= e.offset
        assert all(a.offset < b.offset and a.position < b.position
                   for a, b in zip(entries, entries[1:]))
        times = seg.time_index.entries_list()
        assert all(a.timestamp <= b.timestamp and a.offset <= b.offset for a, b in zip(times, times[1:]))
        if times:
            assert times[0].offset >= seg.base_offset and times[-1].offset <= max(prev_last, seg.base_offset)
    assert prev_last < log.log_end_offset
    for r in log.records():
        got = log.read_records(r.offset)
        assert got and got[0].offset == r.offset and got[0].value == r.value


def fill_unique(log: Log, n: int, start: int = 0, ts: int | None = None, value_size: int = 8) -> None:
    """n single-record batches with keys start.., every batch the same size (3-digit keys)."""
    for i in range(start, start + n):
        log.append([Record(f"{i:03d}".encode(), b"v" * value_size, ts if ts is not None else -1)])


# ================================================================================ case 50
def test_case_50_clean_keeps_latest_per_key_with_offsets_unchanged(tmp_path, clock):
    """testCleanSegments, with real newer records: unique keys until four segments, then newer
    values for keys 1,3,5,7,9; the cleaned segments keep every other key at its original offset."""
    log = open_log(tmp_path / "t-0", {"segment.bytes": 1024}, clock)
    i = 0
    while log.number_of_segments < 4:
        log.append([(k(i), f"v{i}")])
        i += 1
    for key in (1, 3, 5, 7, 9):
        log.append([(k(key), f"new{key}")])
    log.roll()
    before = {r.offset: r for r in log.records()}
    cleaned_segments = [s for s in log.segments if s is not log.active_segment]
    expected_bytes_read = sum(s.size for s in cleaned_segments)
    leo = log.log_end_offset

    result = LogCleaner(str(tmp_path), clock).clean_log(log)

    latest = {}
    for off, r in sorted(before.items()):
        latest[r.key] = off
    expected = sorted(latest.values())
    assert offsets_in_log(log) == expected
    for r in log.records():   # same offset, key, value and timestamp as before
        assert (r.key, r.value, r.timestamp) == (before[r.offset].key, before[r.offset].value,
                                                 before[r.offset].timestamp)
    assert {r.key: r.value for r in log.records()}[k(3)] == b"new3"
    assert k(3) in [before[o].key for o in before if o not in expected]   # the old one went
    assert result.stats.bytes_read == expected_bytes_read
    assert result.end_offset == log.active_segment.base_offset
    assert log.log_end_offset == leo
    assert LogCleaner(str(tmp_path), clock).checkpointed_offsets() == {("t", 0): result.end_offset}
    check_log_consistent(log)


def _partial_vector_log(tmp_path, clock, name="t-0") -> Log:
    log = open_log(tmp_path / name, {"segment.bytes": 1024}, clock)
    for key in [0, 1, 0, 1, 0]:           # offsets 0..4, one record per batch
        log.append([(k(key), f"value{key}")])
    log.roll()
    return log


def test_case_50_partial_rounds_vector(tmp_path, clock):
    """testPartialSegmentClean: a 2-slot map with load factor 0.75 holds one key, so each round
    cleans a little and still makes progress."""
    log = _partial_vector_log(tmp_path, clock)
    offset_map = SkimpyOffsetMap(slots=2, load_factor=0.75)
    assert offset_map.max_desired_size == 1
    cleaner = Cleaner(offset_map, clock)
    active = log.active_segment.base_offset
    assert active == 5

    end, _ = cleaner.clean(LogToClean(log, 2, active, 0, 0), clock.milliseconds())
    assert end == 3
    assert offsets_in_log(log) == [1, 2, 3, 4]
    assert keys_in_log(log) == [k(1), k(0), k(1), k(0)]

    end, _ = cleaner.clean(LogToClean(log, 3, active, 0, 0), clock.milliseconds())
    assert end == 4
    assert offsets_in_log(log) == [2, 3, 4]
    assert keys_in_log(log) == [k(0), k(1), k(0)]

    end, _ = cleaner.clean(LogToClean(log, 4, active, 0, 0), clock.milliseconds())
    assert end == 5
    assert offsets_in_log(log) == [3, 4]
    assert keys_in_log(log) == [k(1), k(0)]
    assert log.log_end_offset == 5
    check_log_consistent(log)


def test_case_50_partial_rounds_through_the_checkpoint(tmp_path, clock):
    """The same log cleaned by a LogCleaner with a 48-byte dedupe buffer (2 slots): each clean_log
    continues from the checkpoint the previous one wrote, and the checkpoint only moves forward."""
    log = _partial_vector_log(tmp_path, clock)
    cleaner = LogCleaner(str(tmp_path), clock, dedupe_buffer_size=48, load_factor=0.75)
    seen = []
    for _ in range(7):
        result = cleaner.clean_log(log)
        seen.append((result.first_dirty_offset, result.end_offset, offsets_in_log(log)))
    assert seen[:5] == [
        (0, 1, [0, 1, 2, 3, 4]),
        (1, 2, [0, 1, 2, 3, 4]),
        (2, 3, [1, 2, 3, 4]),
        (3, 4, [2, 3, 4]),
        (4, 5, [3, 4]),
    ]
    # Nothing dirty is left below the active segment: further rounds change nothing and the
    # checkpoint must not move backwards.
    assert seen[5] == (5, 5, [3, 4]) and seen[6] == (5, 5, [3, 4])
    assert cleaner.checkpointed_offsets() == {("t", 0): 5}


def test_case_50_offset_map_budget():
    """24 bytes per entry; the cleaner stops at int(slots × load factor) entries."""
    m = SkimpyOffsetMap(24 * 100, 0.9)
    assert m.slots == 100 and m.max_desired_size == 90
    m.put(b"a", 5)
    m.put(b"a", 7)                       # same key: overwritten, size unchanged
    assert m.size == 1 and m.get(b"a") == 7 and m.get(b"b") == -1
    assert m.latest_offset == 7
    with pytest.raises(ValueError):
        SkimpyOffsetMap(23)


# ================================================================================ case 51
def test_case_51_deleted_keys_disappear(tmp_path, clock):
    """testCleaningWithDeletes: after tombstoning the even keys, none of them keeps a value."""
    log = open_log(tmp_path / "t-0", {"segment.bytes": 1024}, clock)
    while log.number_of_segments < 2:
        log.append([(k(log.log_end_offset), f"v{log.log_end_offset}")])
    leo = log.log_end_offset
    for key in range(0, leo, 2):
        log.append([(k(key), None)])
    while log.number_of_segments < 4:
        log.append([(k(log.log_end_offset), f"v{log.log_end_offset}")])
    LogCleaner(str(tmp_path), clock).clean_log(log)
    with_value = {r.key for r in log.records() if r.value is not None}
    assert not any(k(key) in with_value for key in range(0, leo, 2))
    assert all(k(key) in with_value for key in range(1, leo, 2))
    # the tombstones themselves are still there (their horizon has not even been set before now)
    tombstones = {r.key for r in log.records() if r.value is None}
    assert tombstones == {k(key) for key in range(0, leo, 2)}
    check_log_consistent(log)


def test_case_51_tombstone_kept_until_delete_horizon(tmp_path, clock):
    retention = 60_000
    log = open_log(tmp_path / "t-0", {"segment.bytes": 4096, "delete.retention.ms": retention}, clock)
    for key in range(4):
        log.append([(k(key), f"v{key}")])          # offsets 0..3
    t_tomb = clock.advance(10)
    log.append([(k(0), None)])                      # offset 4: tombstone for key 0, its own batch
    log.append([(k(1), None), (k(9), "x")])          # offsets 5,6: tombstone + value in one batch
    log.roll()
    cleaner = LogCleaner(str(tmp_path), clock)

    t_clean = clock.advance(1000)
    result = cleaner.clean_log(log)
    assert offsets_in_log(log) == [2, 3, 4, 5, 6]
    assert result.stats.tombstones_marked == 2
    horizon = t_clean + retention
    by_base = {b.base_offset: b for b in all_batches(log)}
    for base in (4, 5):
        raw = raw_batch(log, by_base[base])
        batch = RecordBatch(raw)
        assert batch.is_valid()
        (attributes,) = struct.unpack_from(">h", raw, 21)
        (base_timestamp,) = struct.unpack_from(">q", raw, 27)
        (crc,) = struct.unpack_from(">I", raw, 17)
        assert attributes & 0x40 == DELETE_HORIZON_FLAG_MASK == 0x40
        assert base_timestamp == horizon == batch.delete_horizon_ms
        assert crc == crc32c(raw[21:])
        assert batch.max_timestamp == t_tomb       # the records keep their own timestamps
        assert all(r.timestamp == t_tomb for r in batch.records())
    # batches without tombstones are copied verbatim: no horizon
    assert not by_base[2].has_delete_horizon and by_base[2].base_timestamp == T0

    # A later cleaning before the horizon keeps the tombstones.
    log.append([(k(2), "again")])                  # something dirty so the clean rewrites the old part
    log.roll()
    clock.set(horizon - 1)
    cleaner.clean_log(log)
    assert [r.offset for r in log.records() if r.value is None] == [4, 5]
    assert RecordBatch(raw_batch(log, by_base[4])).delete_horizon_ms == horizon   # unchanged

    # At the horizon (now ≥ horizon) a later cleaning drops them.
    log.append([(k(3), "again")])
    log.roll()
    clock.set(horizon)
    result = cleaner.clean_log(log)
    assert [r.value for r in log.records()].count(None) == 0
    assert result.stats.tombstones_dropped == 2
    assert offsets_in_log(log) == [6, 7, 8]
    remaining = {b.base_offset: b for b in all_batches(log)}
    assert 4 not in remaining                      # the tombstone-only batch is gone
    assert remaining[5].records_count == 1 and remaining[5].last_offset == 6
    assert remaining[5].delete_horizon_ms == horizon   # the horizon stays with the batch
    check_log_consistent(log)


def test_case_51_retain_rule():
    """should_retain_record's table (Cleaner.shouldRetainRecord)."""
    now = T0
    value, tomb, unkeyed = Record(b"a", b"v", offset=5), Record(b"a", None, offset=5), Record(None, b"v", offset=5)
    assert should_retain_record(value, None, -1, 4, now)            # past the map: keep
    assert should_retain_record(unkeyed, None, -1, 4, now)
    assert not should_retain_record(unkeyed, None, -1, 10, now)     # no key: drop
    assert not should_retain_record(value, None, 6, 10, now)        # newer record: drop
    assert should_retain_record(value, None, 5, 10, now)            # latest: keep
    assert should_retain_record(tomb, None, 5, 10, now)             # no horizon yet: keep
    assert should_retain_record(tomb, now + 1, 5, 10, now)          # before the horizon: keep
    assert not should_retain_record(tomb, now, 5, 10, now)          # at the horizon: drop


# ================================================================================ case 52
def test_case_52_unkeyed_records_removed_and_counted(tmp_path, clock):
    """testCleaningWithUnkeyedMessages. A compacted log refuses unkeyed records, so they are
    written while the topic is `delete` and the directory is reopened as `compact`."""
    directory = tmp_path / "t-0"
    log = open_log(directory, {"cleanup.policy": "delete", "segment.bytes": 1024}, clock)
    while log.number_of_segments < 2:
        log.append([f"unkeyed{log.log_end_offset}"])
    unkeyed_count = log.log_end_offset
    size_with_unkeyed = log.size_in_bytes()
    while log.number_of_segments < 3:
        log.append([(k(log.log_end_offset), "keyed")])
    log.close()

    log = open_log(directory, {"segment.bytes": 1024}, clock, recovery_point=0)
    assert log.config.compact
    with pytest.raises(InvalidRecordError, match="without key"):
        log.append(["still unkeyed"])
    expected_size = log.size_in_bytes() - size_with_unkeyed
    result = LogCleaner(str(tmp_path), clock).clean_log(log)
    assert [r for r in log.records() if r.key is None] == []
    assert log.size_in_bytes() == expected_size
    assert result.stats.invalid_records == unkeyed_count
    assert offsets_in_log(log)[0] == unkeyed_count
    check_log_consistent(log)
    log.close()


# ================================================================================ case 53
def _check_order(groups, segments) -> None:
    flat = [s.base_offset for g in groups for s in g]
    assert flat == [s.base_offset for s in segments]
    assert flat == sorted(flat)


def test_case_53_grouping_real_segments(tmp_path, clock):
    """testSegmentGrouping on real segments."""
    log = open_log(tmp_path / "t-0", {"segment.bytes": 300, "index.interval.bytes": 1}, clock)
    while log.number_of_segments < 10:
        log.append([(b"hello", b"hello")])
    segs = log.segments
    leo = log.log_end_offset
    assert all(s.offset_index.size_in_bytes > 0 for s in segs[:-1])

    groups = group_segments_by_size(segs, INT32_MAX, INT32_MAX, leo)
    assert len(groups) == 1 and len(groups[0]) == len(segs)
    _check_order(groups, segs)

    for max_size, max_index in ((1, INT32_MAX), (INT32_MAX, 1)):
        groups = group_segments_by_size(segs, max_size, max_index, leo)
        assert len(groups) == len(segs) and all(len(g) == 1 for g in groups)
        _check_order(groups, segs)

    group_size = 3
    log_size = sum(s.size for s in segs[:group_size])
    for limit, expected in ((log_size + 1, 3), (log_size, 3), (log_size - 1, 2)):   # ≤ is allowed
        groups = group_segments_by_size(segs, limit, INT32_MAX, leo)
        _check_order(groups, segs)
        assert all(len(g) == expected for g in groups[:-1])
        assert all(sum(s.size for s in g) <= limit for g in groups)

    index_size = sum(s.offset_index.size_in_bytes for s in segs[:group_size])
    groups = group_segments_by_size(segs, INT32_MAX, index_size + 1, leo)
    _check_order(groups, segs)
    assert all(len(g) == group_size for g in groups[:-1])


class FakeIndex:
    def __init__(self, size_in_bytes: int):
        self.size_in_bytes = size_in_bytes


class FakeSegment:
    def __init__(self, base_offset: int, size: int = 100, index: int = 8, time_index: int = 12):
        self.base_offset = base_offset
        self.size = size
        self.offset_index = FakeIndex(index)
        self.time_index = FakeIndex(time_index)

    def __repr__(self) -> str:
        return f"Fake({self.base_offset})"


def _bases(groups):
    return [[s.base_offset for s in g] for g in groups]


def test_case_53_grouping_limits_with_fake_segments():
    segs = [FakeSegment(i * 10) for i in range(6)]
    assert _bases(group_segments_by_size(segs, 300, 10_000, 60)) == [[0, 10, 20], [30, 40, 50]]
    # offset index: at most 16 bytes of 8-byte indexes → pairs (time indexes 8 bytes here too)
    small_time = [FakeSegment(i * 10, time_index=8) for i in range(6)]
    assert _bases(group_segments_by_size(small_time, 10_000, 16, 60)) == [[0, 10], [20, 30], [40, 50]]
    assert _bases(group_segments_by_size(small_time, 10_000, 24, 60)) == [[0, 10, 20], [30, 40, 50]]
    # time index: 12 bytes each; a 30-byte limit allows two of them although the offset indexes
    # (8 bytes each) would allow three
    assert _bases(group_segments_by_size(segs, 10_000, 30, 60)) == [[0, 10], [20, 30], [40, 50]]
    mixed = [FakeSegment(0, time_index=0), FakeSegment(10, time_index=0), FakeSegment(20, time_index=24)]
    assert _bases(group_segments_by_size(mixed, 10_000, 20, 30)) == [[0, 10], [20]]
    assert group_segments_by_size([], 100, 100, 0) == []


def test_case_53_grouping_offset_range_fits_int32():
    """A group's offsets must stay within Integer.MAX_VALUE of its base; an empty segment skips
    the check (testSegmentGroupingWithSparseOffsets)."""
    far = INT32_MAX + 50
    segs = [FakeSegment(0), FakeSegment(100), FakeSegment(far)]
    # joining segment 100 would put the group's estimated last offset (far − 1) too far from 0
    assert _bases(group_segments_by_size(segs, 10_000, 10_000, INT32_MAX + 100)) == [[0], [100, far]]
    segs[1].size = 0
    assert _bases(group_segments_by_size(segs, 10_000, 10_000, INT32_MAX + 100)) == [[0, 100], [far]]
    # the last segment's estimate is first_uncleanable − 1
    two = [FakeSegment(0), FakeSegment(10)]
    assert _bases(group_segments_by_size(two, 10_000, 10_000, INT32_MAX + 1)) == [[0, 10]]
    assert _bases(group_segments_by_size(two, 10_000, 10_000, INT32_MAX + 2)) == [[0], [10]]


def test_case_53_cleaning_merges_small_segments(tmp_path, clock):
    """Small segments below the active one are rewritten into one `.log` (group base offset)."""
    log = open_log(tmp_path / "t-0", {"segment.bytes": 1024}, clock)
    for i in range(12):
        log.append([(k(i % 4), f"v{i}")])
        if i % 3 == 2:
            log.roll()
    assert [s.base_offset for s in log.segments] == [0, 3, 6, 9, 12]
    LogCleaner(str(tmp_path), clock).clean_log(log)
    assert [s.base_offset for s in log.segments] == [0, 12]
    assert offsets_in_log(log) == [8, 9, 10, 11]
    # the replaced files are renamed `.deleted` and removed after file.delete.delay.ms
    assert all(n.endswith(".deleted") for n in segment_files(tmp_path / "t-0")
               if not n.startswith(("00000000000000000000.", "00000000000000000012.")))
    assert [n for n in segment_files(tmp_path / "t-0") if not n.endswith(".deleted")] == [
        "00000000000000000000.index", "00000000000000000000.log", "00000000000000000000.timeindex",
        "00000000000000000012.index", "00000000000000000012.log", "00000000000000000012.snapshot",
        "00000000000000000012.timeindex"]   # the roll at 12 wrote the producer-state snapshot
    check_log_consistent(log)


# ================================================================================ case 54
def test_case_54_retains_producer_last_sequence(tmp_path, clock):
    """testLogCleanerRetainsProducerLastSequence."""
    log = open_log(tmp_path / "t-0", {"segment.bytes": 4096}, clock)
    spec = [(0, -1, -1), (0, 1, 0), (0, 2, 0), (0, 3, 0), (1, 2, 1)]   # (key, pid, sequence)
    for key, pid, seq in spec:
        log.append_as_leader(build_batch([Record(k(key), f"p{pid}".encode(), T0)], producer_id=pid,
                                         producer_epoch=0 if pid >= 0 else -1, base_sequence=seq))
    original = {b.base_offset: b for b in all_batches(log)}
    log.roll()
    cleaner = Cleaner(SkimpyOffsetMap(slots=10, load_factor=0.75), clock)
    cleaner.clean(LogToClean(log, 0, log.active_segment.base_offset, 0, 0), clock.milliseconds())

    batches = all_batches(log)
    assert [b.last_offset for b in batches] == [1, 3, 4]
    assert {b.producer_id: b.last_sequence for b in batches} == {1: 0, 2: 1, 3: 0}
    assert offsets_in_log(log) == [3, 4]
    assert keys_in_log(log) == [k(0), k(1)]
    empty = batches[0]
    assert empty.records_count == 0 and empty.size_in_bytes == RECORD_BATCH_OVERHEAD == 61
    assert (empty.base_offset, empty.last_offset) == (1, 1)
    assert (empty.producer_id, empty.producer_epoch, empty.base_sequence) == (1, 0, 0)
    assert empty.base_timestamp == -1 and empty.max_timestamp == original[1].max_timestamp
    assert empty.is_valid()
    assert raw_batch(log, batches[1]) == original[3].to_bytes()   # untouched batches are verbatim
    assert log.producer_state.get(1).last_sequence == 0
    check_log_consistent(log)


def test_case_54_last_batch_of_round_kept_empty(tmp_path, clock):
    """Without producers, the batch ending just below the upper bound is kept (empty) so the
    segment still records where the round ended; other emptied batches disappear."""
    log = open_log(tmp_path / "t-0", {"segment.bytes": 4096}, clock)
    for key in [0, 1, 0, 1]:
        log.append([(k(key), "v")])
    log.roll()
    log.append([(k(0), "newer")])
    log.append([(k(1), "newer")])        # offsets 4, 5: the active segment
    log.roll()                           # now 4,5 are cleanable too; upper bound 6
    log.append([(k(2), "x")])
    cleaner = Cleaner(SkimpyOffsetMap(slots=10, load_factor=0.75), clock)
    cleaner.clean(LogToClean(log, 0, 4, 0, 0), clock.milliseconds())   # the round ends at 4
    batches = all_batches(log)
    assert [(b.base_offset, b.records_count) for b in batches] == [(2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]
    cleaner.clean(LogToClean(log, 4, 6, 0, 0), clock.milliseconds())
    assert [(b.base_offset, b.records_count) for b in all_batches(log)] == [(4, 1), (5, 1), (6, 1)]


# ================================================================================ case 55
def _ratio_log(tmp_path, clock, name, clean_segments, dirty_segments, per_segment=3, **config):
    """A log of identical-size single-record batches: `clean_segments` + `dirty_segments`
    segments of `per_segment` batches, then an empty active segment."""
    log = open_log(tmp_path / f"{name}-0", {"segment.bytes": 1 << 20, **config}, clock)
    for _ in range(clean_segments + dirty_segments):
        fill_unique(log, per_segment, start=log.log_end_offset)
        log.roll()
    return log


def write_cleaner_checkpoint(tmp_path, entries: dict[str, int]) -> None:
    """By hand, in Kafka's text format."""
    lines = ["0", str(len(entries))] + [f"{topic} 0 {offset}" for topic, offset in entries.items()]
    (tmp_path / CLEANER_OFFSET_CHECKPOINT).write_text("".join(line + "\n" for line in lines))


def test_case_55_grab_filthiest_log(tmp_path, clock):
    a = _ratio_log(tmp_path, clock, "a", 1, 3)     # 3 of 4 segments dirty: 0.75
    b = _ratio_log(tmp_path, clock, "b", 3, 1)     # 0.25
    c = _ratio_log(tmp_path, clock, "c", 0, 4)     # never cleaned: 1.0
    d = open_log(tmp_path / "d-0", {"cleanup.policy": "delete"}, clock)   # not compacted
    fill_unique(d, 20)
    d.roll()
    write_cleaner_checkpoint(tmp_path, {"a": 3, "b": 9})
    cleaner = LogCleaner(str(tmp_path), clock)

    ranked = cleaner.logs_to_clean([a, b, c, d])
    assert [(t.log.topic, t.cleanable_ratio) for t in ranked] == [("c", 1.0), ("a", 0.75), ("b", 0.25)]
    seg = a.segments[0].size
    assert (ranked[1].clean_bytes, ranked[1].cleanable_bytes) == (seg, 3 * seg)
    assert cleaner.grab_filthiest_compacted_log([a, b, c, d]).log is c
    assert cleaner.grab_filthiest_compacted_log([a, b, d]).log is a
    assert cleaner.grab_filthiest_compacted_log([b, d]) is None      # 0.25 ≤ 0.5
    result = cleaner.clean_filthiest([a, b, c, d])
    assert result.log is c and result.end_offset == 12
    assert cleaner.checkpointed_offsets() == {("a", 0): 3, ("b", 0): 9, ("c", 0): 12}
    assert cleaner.grab_filthiest_compacted_log([c]) is None          # nothing dirty any more


def test_case_55_dirty_ratio_must_be_strictly_greater(tmp_path, clock):
    at = _ratio_log(tmp_path, clock, "at", 1, 3, **{"min.cleanable.dirty.ratio": 0.75})
    below = _ratio_log(tmp_path, clock, "below", 1, 3, **{"min.cleanable.dirty.ratio": 0.74})
    full = _ratio_log(tmp_path, clock, "full", 0, 2, **{"min.cleanable.dirty.ratio": 1.0})
    write_cleaner_checkpoint(tmp_path, {"at": 3, "below": 3})
    cleaner = LogCleaner(str(tmp_path), clock)
    assert cleaner.logs_to_clean([at])[0].cleanable_ratio == 0.75
    assert cleaner.grab_filthiest_compacted_log([at]) is None
    assert cleaner.grab_filthiest_compacted_log([full]) is None      # 1.0 is not > 1.0
    assert cleaner.grab_filthiest_compacted_log([at, full, below]).log is below


@pytest.mark.parametrize("bad_checkpoint, log_start, expected", [
    (999, 0, 0),     # beyond the log end offset → log start offset
    (0, 10, 10),     # below the log start offset → log start offset
    (7, 0, 7),       # valid: kept
])
def test_case_55_first_dirty_offset_reset(tmp_path, clock, bad_checkpoint, log_start, expected):
    log = _ratio_log(tmp_path, clock, "t", 0, 5, per_segment=4)
    if log_start:
        assert log.maybe_increment_log_start_offset(log_start)
    write_cleaner_checkpoint(tmp_path, {"t": bad_checkpoint})
    cleaner = LogCleaner(str(tmp_path), clock)
    to_clean = cleaner.grab_filthiest_compacted_log([log])
    assert to_clean.first_dirty_offset == expected
    assert cleanable_offsets(log, bad_checkpoint, clock.milliseconds())[0] == expected
    result = cleaner.clean_log(log)
    assert result.first_dirty_offset == expected
    assert cleaner.checkpointed_offsets()[("t", 0)] == log.active_segment.base_offset == 20


def test_case_55_active_segment_never_cleanable(tmp_path, clock):
    """testCleanableOffsetsActiveSegment; duplicates in the active segment survive a cleaning."""
    log = open_log(tmp_path / "t-0", {"segment.bytes": 1024}, clock)
    while log.number_of_segments < 8:
        log.append([(k(log.log_end_offset), "v")])
    assert cleanable_offsets(log, 0, clock.milliseconds()) == (0, log.active_segment.base_offset)
    active_base = log.active_segment.base_offset
    for _ in range(3):
        log.append([(b"dup", "in the active segment")])
    LogCleaner(str(tmp_path), clock).clean_log(log)
    assert [r.offset for r in log.records() if r.key == b"dup"] == [log.log_end_offset - 3 + i for i in range(3)]
    assert log.active_segment.base_offset == active_base


def test_case_55_nothing_at_or_above_the_high_watermark_is_cleaned(tmp_path, clock):
    """A follower may still truncate to the HW, so records above it must not decide what goes
    below it. The segment holding the HW is not cleaned at all (Kafka's LogToClean bounds the
    round by the base offset of the segment holding the first uncleanable offset)."""
    log = open_log(tmp_path / "t-0", {"segment.bytes": 4096}, clock, single_replica=False)
    for key in [0, 1, 0, 1]:
        log.append([(k(key), "a")])          # segment [0, 4)
    log.roll()
    for key in [0, 1, 0, 1]:
        log.append([(k(key), "b")])          # segment [4, 8)
    log.roll()
    log.append([(k(0), "active")])
    assert log.high_watermark == 0
    log.update_high_watermark(6)
    assert cleanable_offsets(log, None, clock.milliseconds()) == (0, 6)
    to_clean = size_up(log, 0, 6, clock.milliseconds())
    assert to_clean.cleanable_bytes == log.segments[0].size
    assert to_clean.first_uncleanable_offset == 4        # the base of the segment holding the HW

    before = snapshot(log)
    LogCleaner(str(tmp_path), clock).clean_log(log)
    assert offsets_in_log(log) == [2, 3, 4, 5, 6, 7, 8]
    assert snapshot(log)[2:] == before[4:]               # the HW segment is untouched
    log.truncate_to(log.high_watermark)                  # what a leader change may do
    assert {r.key: r.value for r in log.records()} == {k(0): b"b", k(1): b"b"}

    # HW at 0: nothing at all is cleanable
    log2 = open_log(tmp_path / "u-0", {"segment.bytes": 4096}, clock, single_replica=False)
    for key in [0, 0, 0]:
        log2.append([(k(key), "x")])
    log2.roll()
    assert cleanable_offsets(log2, None, clock.milliseconds()) == (0, 0)
    LogCleaner(str(tmp_path), clock).clean_log(log2)
    assert offsets_in_log(log2) == [0, 1, 2]
    log2.update_high_watermark(3)
    LogCleaner(str(tmp_path), clock).clean_log(log2)
    assert offsets_in_log(log2) == [2]


def test_case_55_min_compaction_lag_holds_back_recent_segments(tmp_path, clock):
    """testCleanableOffsetsForTime."""
    lag = 60 * 60 * 1000
    log = open_log(tmp_path / "t-0", {"segment.bytes": 1024, "min.compaction.lag.ms": lag}, clock)
    t0 = clock.milliseconds()
    while log.number_of_segments < 4:
        log.append([Record(k(log.log_end_offset), b"v", t0)])
    active_at_t0 = log.active_segment
    t1 = clock.advance(lag + 1)
    while log.number_of_segments < 8:
        log.append([Record(k(log.log_end_offset), b"v", t1)])
    assert cleanable_offsets(log, 0, t1) == (0, active_at_t0.base_offset)
    # without the lag the whole non-active part is cleanable
    assert cleanable_offsets(log, 0, t1 + lag) == (0, log.active_segment.base_offset)


def test_case_55_min_compaction_lag_applies_to_the_segment_holding_first_dirty(tmp_path, clock):
    """After a partial round the first dirty offset may sit inside a segment; that segment is
    one of the dirty segments the lag looks at (nonActiveLogSegmentsFrom starts at its floor)."""
    lag = 60_000
    log = open_log(tmp_path / "t-0", {"segment.bytes": 1 << 20, "min.compaction.lag.ms": lag}, clock)
    for i in range(5):
        log.append([Record(k(i), b"old", T0)])                 # segment [0, 5): old
    log.roll()
    for i in range(5):
        log.append([Record(k(i), b"young", T0 + 100_000)])     # segment [5, 10): young
    log.roll()
    now = T0 + 120_000
    assert cleanable_offsets(log, None, now) == (0, 5)
    assert cleanable_offsets(log, 3, now) == (3, 5)
    assert cleanable_offsets(log, 7, now) == (7, 7)
    assert cleanable_offsets(log, 7, T0 + 200_000) == (7, 10)


def test_case_55_min_compaction_lag_when_cleaning(tmp_path, clock):
    lag = 60_000
    log = open_log(tmp_path / "t-0", {"segment.bytes": 1 << 20, "min.compaction.lag.ms": lag}, clock)
    for i in range(4):
        log.append([Record(k(i % 2), b"old", T0)])
    log.roll()
    for i in range(4):
        log.append([Record(k(i % 2), b"young", T0 + 50_000)])
    log.roll()
    clock.set(T0 + 60_000)
    cleaner = LogCleaner(str(tmp_path), clock)
    cleaner.clean_log(log)
    assert offsets_in_log(log) == [2, 3, 4, 5, 6, 7]      # only the old segment was compacted
    clock.set(T0 + 110_001)
    cleaner.clean_log(log)
    assert offsets_in_log(log) == [6, 7]


def test_case_55_max_compaction_lag_forces_cleaning(tmp_path, clock):
    max_lag = 10_000
    log = open_log(tmp_path / "t-0", {"segment.bytes": 1 << 20, "max.compaction.lag.ms": max_lag}, clock)
    cleaner = LogCleaner(str(tmp_path), clock)
    fill_unique(log, 9)
    log.roll()
    cleaner.clean_log(log)                       # 9 unique records are now the clean section
    log.append([(b"000", "dup")])
    log.roll()
    to_clean = cleaner.logs_to_clean([log])[0]
    assert 0 < to_clean.cleanable_ratio < log.config.min_cleanable_dirty_ratio
    assert not to_clean.needs_compaction_now
    assert cleaner.grab_filthiest_compacted_log([log]) is None
    clock.advance(max_lag)                       # not yet: the first batch must be older than now − lag
    assert cleaner.grab_filthiest_compacted_log([log]) is None
    clock.advance(1)
    chosen = cleaner.grab_filthiest_compacted_log([log])
    assert chosen is not None and chosen.needs_compaction_now
    result = cleaner.clean_filthiest([log])
    assert result is not None and result.end_offset == 10
    assert offsets_in_log(log) == list(range(1, 10))


def test_case_55_log_manager_runs_the_cleaner(tmp_path, clock):
    manager = LogManager.open(str(tmp_path), {"cleanup.policy": "compact", "segment.bytes": 1 << 20},
                              clock)
    log = manager.get_or_create_log("orders", 0)
    plain = manager.get_or_create_log("plain", 0, {"cleanup.policy": "delete"})
    for i in range(10):
        log.append([(k(i % 2), f"v{i}")])
        plain.append([(k(i % 2), f"v{i}")])
    log.roll()
    plain.roll()
    manager.start_cleaner()
    clock.advance(manager.broker_config["log.initial.task.delay.ms"] - 1)
    manager.scheduler.run_due()
    assert offsets_in_log(log) == list(range(10))
    clock.advance(1)
    manager.scheduler.run_due()
    assert offsets_in_log(log) == [8, 9]
    assert offsets_in_log(plain) == list(range(10))
    assert OffsetCheckpointFile(str(tmp_path / CLEANER_OFFSET_CHECKPOINT)).read() == {("orders", 0): 10}
    assert manager.run_cleaner() == []            # nothing dirty any more
    assert manager.scheduler.errors == []
    manager.shutdown()


# ================================================================================ gaps
def test_reading_inside_a_compacted_gap(tmp_path, clock):
    """A consumer positioned inside a removed range gets the next batch that exists, also
    across segments (testReadAtLogGap); records() gives increasing offsets with gaps."""
    log = open_log(tmp_path / "t-0", {"segment.bytes": 500}, clock)
    for i in range(5):
        log.append([(k(i), f"first{i}")])
    log.roll()
    for i in range(5):
        log.append([(k(i), f"second{i}")])
    log.append([(k(9), "unique")])
    log.roll()
    log.append([(k(0), "third")])
    log.roll()
    LogCleaner(str(tmp_path), clock).clean_log(log)
    offsets = offsets_in_log(log)
    assert offsets == [6, 7, 8, 9, 10, 11]
    assert [s.base_offset for s in log.segments] == [0, 5, 11, 12]
    assert all(a < b for a, b in zip(offsets, offsets[1:]))
    assert log.segments[0].size == 0                # every record of [0, 5) was superseded
    stored = all_batches(log)
    for start in range(0, 12):                      # [0, 6) is a gap spanning a segment boundary
        first = log.read(start).batches()[0]
        expected = next(b for b in stored if b.last_offset >= start)
        assert (first.base_offset, first.last_offset) == (expected.base_offset, expected.last_offset)
        assert log.read_records(start)[0].offset == max(start, 6)
    assert log.read_records(5)[0].offset == 6
    assert log.read_records(11)[0].value == b"third"
    assert log.read_records(12) == []
    check_log_consistent(log)


# ================================================================================ compact,delete
def test_compact_delete_policy(tmp_path, clock):
    def build(policy: str, name: str) -> Log:
        log = open_log(tmp_path / f"{name}-0", {"cleanup.policy": policy, "segment.bytes": 400,
                                                 "retention.ms": 10_000}, clock)
        for key in [0, 1, 2, 3, 9]:
            log.append([Record(k(key), b"old", T0)])          # segment A: old
        log.roll()
        for key in [0, 1, 2, 3, 0, 1]:
            log.append([Record(k(key), b"young", T0 + 15_000)])  # segment B: young, duplicates
        log.roll()
        return log

    clock.set(T0 + 20_000)
    both = build("compact,delete", "both")
    only = build("compact", "only")
    cleaner = LogCleaner(str(tmp_path), clock)
    assert cleaner.clean_log(both).end_offset == 11
    cleaner.clean_log(only)
    # compact alone keeps key 9 from the old segment
    assert [(r.offset, r.key) for r in only.records()] == [(4, k(9)), (7, k(2)), (8, k(3)), (9, k(0)), (10, k(1))]
    # compact,delete: compacted, then the old segment expired by time
    assert [(r.offset, r.key) for r in both.records()] == [(7, k(2)), (8, k(3)), (9, k(0)), (10, k(1))]
    assert both.log_start_offset == 5 and both.segments[0].base_offset == 5
    assert both.log_end_offset == 11
    check_log_consistent(both)


# ================================================================================ crash-safe swap
CRASH_CONFIG = {"segment.bytes": 1 << 20, "index.interval.bytes": 64, "delete.retention.ms": 1000,
                "file.delete.delay.ms": 60_000}


class InjectedCrash(Exception):
    pass


class CrashingLog(Log):
    """A Log whose segment swap stops before file rename number `crash_before + 1`: the
    directory at that moment is copied to `snapshot_to` (what a power cut would leave) and an
    exception is raised. `renames` records every rename the swap made."""

    crash_before: int | None = None
    snapshot_to: str | None = None

    def replace_segments(self, new_segments, old_segments):
        self.renames: list[tuple[str, str]] = []
        wrapped = []

        def wrap(f):
            real = f.rename_to

            def rename_to(new_path):
                if self.crash_before is not None and len(self.renames) == self.crash_before:
                    if self.snapshot_to:
                        shutil.copytree(os.path.dirname(self.dir), self.snapshot_to)
                    raise InjectedCrash(f"crash before rename {len(self.renames) + 1}")
                self.renames.append((os.path.basename(f.path), os.path.basename(new_path)))
                real(new_path)
            f.rename_to = rename_to
            wrapped.append(f)

        for segment in list(new_segments) + list(old_segments):
            for f in (segment.log, segment.offset_index, segment.time_index):
                wrap(f)
        try:
            return super().replace_segments(new_segments, old_segments)
        finally:
            for f in wrapped:
                del f.rename_to


def build_crash_log(log_dir: Path, clock: ManualClock, log_class=Log) -> Log:
    """Two rounds of writes; the first is cleaned (so a checkpoint exists), the second is left
    dirty: the next clean rewrites [cleaned part, 3 dirty segments] as one group."""
    log = log_class.open(str(log_dir / "t-0"), {"cleanup.policy": "compact", **CRASH_CONFIG}, clock)
    for i in range(12):
        log.append([Record(k(i % 5), f"a{i}".encode(), T0 + i)])
    log.roll()
    LogCleaner(str(log_dir), clock).clean_log(log)
    for seg in range(3):
        for i in range(6):
            n = 20 + seg * 6 + i
            value = None if n == 24 else f"b{n}".encode()      # offset 24: a tombstone for key 3
            log.append([Record(k(n % 7), value, T0 + n)])
        log.roll()
    log.append([Record(b"active", b"x", T0 + 99)])
    return log


def _reopen(directory: str, clock: ManualClock) -> Log:
    return Log.open(directory, {"cleanup.policy": "compact", **CRASH_CONFIG}, clock, recovery_point=0)


@pytest.fixture
def crash_reference(tmp_path):
    """Pre- and post-clean contents from an uninterrupted run, and the renames it made."""
    clock = ManualClock(T0 + 1000)
    ref = tmp_path / "ref"
    ref.mkdir()
    log = build_crash_log(ref, clock, CrashingLog)
    pre = snapshot(log)
    first_checkpoint = LogCleaner(str(ref), clock).checkpointed_offsets()[("t", 0)]
    group = [s.base_offset for s in log.segments[:-1]]
    result = LogCleaner(str(ref), clock).clean_log(log)
    post = snapshot(log)
    renames = list(log.renames)
    log.close()
    assert pre != post
    return {"pre": pre, "post": post, "renames": renames, "group": group,
            "first_checkpoint": first_checkpoint, "end_offset": result.end_offset}


def test_swap_renames_follow_the_protocol(crash_reference):
    """§7.8: new files `.cleaned` → `.swap`, old files → `.deleted`, then `.swap` dropped."""
    renames = crash_reference["renames"]
    group = crash_reference["group"]
    assert len(group) == 4
    base = f"{group[0]:020d}"
    exts = [".log", ".index", ".timeindex"]
    expected = [(base + e + ".cleaned", base + e + ".swap") for e in exts]
    for g in group:
        expected += [(f"{g:020d}{e}", f"{g:020d}{e}.deleted") for e in exts]
    expected += [(base + e + ".swap", base + e) for e in exts]
    assert renames == expected


def _check_recovered(directory: str, clock: ManualClock, expected: list[tuple]) -> Log:
    log = _reopen(directory, clock)
    names = os.listdir(directory)
    assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))], names
    assert snapshot(log) == expected
    check_log_consistent(log)
    return log


def test_crash_at_every_step_of_the_swap(tmp_path, crash_reference):
    """Crash before each rename of the swap: reopening gives exactly the pre-clean log while the
    new segment is not completely `.swap`, exactly the post-clean log from then on. Checked both
    on a copy of the directory taken at the crash (a power cut: `.cleaned` files included) and on
    the directory the failed process left behind. The cleaner checkpoint written by the earlier
    clean survives, and the next clean from it gives the post-clean log."""
    total = len(crash_reference["renames"])
    phases = set()
    for n in range(total):
        clock = ManualClock(T0 + 1000)
        work = tmp_path / f"crash{n}"
        work.mkdir()
        log = build_crash_log(work, clock, CrashingLog)
        assert snapshot(log) == crash_reference["pre"]
        old_segments = log.segments[:-1]
        log.crash_before = n
        log.snapshot_to = str(tmp_path / f"snap{n}")
        with pytest.raises(InjectedCrash):
            LogCleaner(str(work), clock).clean_log(log)
        log.close_without_flush()
        for seg in old_segments:
            seg.close_handlers()
        complete_swap = n >= 3          # all three new files renamed to `.swap`
        expected = crash_reference["post" if complete_swap else "pre"]
        snap_dir = str(tmp_path / f"snap{n}" / "t-0")
        snap_names = os.listdir(snap_dir)
        if n == 0:
            assert sum(name.endswith(".cleaned") for name in snap_names) == 3
            phases.add("cleaned written")
        elif n < 3:
            phases.add("some .swap")
        elif n < 3 + 3 * 4:
            assert sum(name.endswith(".swap") for name in snap_names) == 3
            phases.add("old files .deleted" if n > 3 else "all .swap")
        else:
            assert sum(name.endswith(".deleted") for name in snap_names) == 12
            phases.add("dropping .swap")

        for directory, cleaner_dir in ((snap_dir, tmp_path / f"snap{n}"), (str(work / "t-0"), work)):
            reopened = _check_recovered(directory, clock, expected)
            cleaner = LogCleaner(str(cleaner_dir), clock)
            assert cleaner.checkpointed_offsets() == {("t", 0): crash_reference["first_checkpoint"]}
            result = cleaner.clean_log(reopened)
            assert result.first_dirty_offset == crash_reference["first_checkpoint"]
            assert snapshot(reopened) == crash_reference["post"]
            assert cleaner.checkpointed_offsets() == {("t", 0): crash_reference["end_offset"]}
            check_log_consistent(reopened)
            reopened.close()
    assert phases == {"cleaned written", "some .swap", "all .swap", "old files .deleted",
                      "dropping .swap"}


def test_clean_then_reopen_keeps_result_and_checkpoint(tmp_path, crash_reference):
    clock = ManualClock(T0 + 1000)
    log = build_crash_log(tmp_path, clock)
    LogCleaner(str(tmp_path), clock).clean_log(log)
    log.close()
    reopened = _check_recovered(str(tmp_path / "t-0"), clock, crash_reference["post"])
    cleaner = LogCleaner(str(tmp_path), clock)
    assert cleaner.checkpointed_offsets() == {("t", 0): crash_reference["end_offset"]}
    reopened.append([Record(k(0), b"later", T0 + 500)])
    reopened.roll()
    result = cleaner.clean_log(reopened)
    assert result.first_dirty_offset == crash_reference["end_offset"]
    assert snapshot(reopened)[-1][2] == b"later"
    reopened.close()


# ================================================================================ property test
EXAMPLES = int(os.environ.get("KSTORE_HYPOTHESIS_EXAMPLES", "50"))
CI = os.environ.get("CI") == "true"
RETENTION = 1000
NKEYS = 8

value_st = st.one_of(st.none(), st.binary(max_size=12), st.binary(max_size=12), st.binary(max_size=12))
record_st = st.tuples(st.integers(0, NKEYS - 1), value_st)
op_st = st.one_of(
    st.tuples(st.just("append"), st.lists(record_st, min_size=1, max_size=3)),
    st.tuples(st.just("append"), st.lists(record_st, min_size=1, max_size=3)),
    st.tuples(st.just("append"), st.lists(record_st, min_size=1, max_size=3)),
    st.tuples(st.just("advance"), st.sampled_from([1, 50, 400, RETENTION - 1, RETENTION, RETENTION + 1, 3000])),
    st.tuples(st.just("roll")),
    st.tuples(st.just("clean"), st.sampled_from([2, 2, 3, 4, 6, 12])),   # 1..9 map entries
)


def _disk_batches(log: Log) -> dict[int, RecordBatch]:
    out = {}
    for seg in log.segments:
        for b in seg.log.batches():
            assert b.is_valid(), f"CRC of batch {b.base_offset}"
            out[b.base_offset] = b
    return out


class CompactionModel:
    def __init__(self, directory: str):
        self.dir = directory
        self.clock = ManualClock(T0)
        self.log = Log.open(os.path.join(directory, "t-0"), {
            "cleanup.policy": "compact", "segment.bytes": 300, "delete.retention.ms": RETENTION,
            "index.interval.bytes": 50, "segment.index.bytes": 120, "file.delete.delay.ms": 0},
            self.clock)
        self.written: dict[int, tuple] = {}          # offset → (key, value, timestamp)
        self.latest: dict[bytes, int] = {}           # key → offset of its latest write
        self.seen: dict[int, tuple] = {}             # what consumers read earlier
        self.removed_tombstones: set[int] = set()    # latest-write tombstones legitimately dropped
        self.checkpoint = -1

    def append(self, items) -> None:
        now = self.clock.milliseconds()
        records = [Record(f"key{i}".encode(), v, now) for i, v in items]
        info = self.log.append(records)
        for offset, r in zip(range(info.first_offset, info.last_offset + 1), records):
            self.written[offset] = (r.key, r.value, r.timestamp)
            self.latest[r.key] = offset

    def clean(self, slots: int) -> None:
        log, now = self.log, self.clock.milliseconds()
        before = _disk_batches(log)
        horizon_before = {r.offset: b.delete_horizon_ms for b in before.values() for r in b.records()}
        present_before = set(horizon_before)
        leo = log.log_end_offset
        cleaner = LogCleaner(self.dir, self.clock, dedupe_buffer_size=24 * slots, load_factor=0.75)
        result = cleaner.clean_log(log)
        assert log.log_end_offset == leo
        after = _disk_batches(log)

        # batch level: nothing new, same offsets and producer fields, horizons set only now
        for base, b in after.items():
            assert base in before, f"batch {base} appeared from nowhere"
            old = before[base]
            assert b.last_offset == old.last_offset
            assert (b.producer_id, b.producer_epoch, b.base_sequence) == \
                (old.producer_id, old.producer_epoch, old.base_sequence)
            kept = {r.offset for r in b.records()}
            assert kept <= {r.offset for r in old.records()}
            if b.records_count == 0:                      # writeEmptyHeader: no horizon
                assert not b.has_delete_horizon and b.base_timestamp == -1
                assert b.size_in_bytes == RECORD_BATCH_OVERHEAD
            elif old.has_delete_horizon:
                assert b.delete_horizon_ms == old.delete_horizon_ms
            elif b.has_delete_horizon:
                assert b.delete_horizon_ms == now + RETENTION
                assert any(r.value is None for r in b.records())

        records = log.records()
        offsets = [r.offset for r in records]
        assert all(a < b for a, b in zip(offsets, offsets[1:]))
        present = set(offsets)
        assert present <= present_before
        for r in records:
            assert (r.key, r.value, r.timestamp) == self.written[r.offset], f"offset {r.offset} changed"
        for o in present_before - present:
            key, value, _ = self.written[o]
            if self.latest[key] > o:
                continue                                   # superseded
            assert value is None, f"latest value of {key!r} at {o} removed"
            assert horizon_before[o] is not None and horizon_before[o] <= now, \
                f"tombstone at {o} removed before its horizon ({horizon_before[o]}, now {now})"
            self.removed_tombstones.add(o)
        for key, o in self.latest.items():
            if self.written[o][1] is not None:
                assert o in present, f"latest value of {key!r} (offset {o}) missing"
            else:
                assert o in present or o in self.removed_tombstones
        for o, rec in self.seen.items():
            if o in present:
                assert rec == self.written[o]
            else:
                assert self.latest[rec[0]] > o or o in self.removed_tombstones
        self.seen.update({r.offset: (r.key, r.value, r.timestamp) for r in records})

        checkpoint = cleaner.checkpointed_offsets()[("t", 0)]
        assert checkpoint == result.end_offset
        assert self.checkpoint <= checkpoint <= log.active_segment.base_offset
        self.checkpoint = checkpoint
        check_log_consistent(log)


@settings(deadline=None, max_examples=EXAMPLES, derandomize=CI,
          database=None if CI else settings.default.database,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=st.lists(op_st, min_size=5, max_size=80))
def test_property_compaction_keeps_latest_values(ops):
    with tempfile.TemporaryDirectory() as directory:
        model = CompactionModel(directory)
        try:
            for op in ops:
                if op[0] == "append":
                    model.append(op[1])
                elif op[0] == "advance":
                    model.clock.advance(op[1])
                elif op[0] == "roll":
                    model.log.roll()
                else:
                    model.clean(op[1])
            # finally: everything below the active segment cleaned with a big map, then (after the
            # horizon and a new dirty record) once more, which must drop every tombstone
            model.log.roll()
            model.clean(64)
            model.clock.advance(RETENTION)
            model.append([(0, b"last")])
            model.log.roll()
            model.clean(64)
            assert all(r.value is not None for r in model.log.records())
        finally:
            model.log.close()


# ================================================================================ bad input
@pytest.mark.parametrize("overrides, names", [
    ({"cleanup.policy": "compaction"}, ["cleanup.policy"]),
    ({"cleanup.policy": "compact,remove"}, ["cleanup.policy"]),
    ({"cleanup.policy": ""}, ["cleanup.policy"]),
    ({"min.compaction.lag.ms": 10_000, "max.compaction.lag.ms": 5_000},
     ["min.compaction.lag.ms", "max.compaction.lag.ms"]),
    ({"min.cleanable.dirty.ratio": 1.5}, ["min.cleanable.dirty.ratio"]),
    ({"min.cleanable.dirty.ratio": -0.1}, ["min.cleanable.dirty.ratio"]),
    ({"delete.retention.ms": -1}, ["delete.retention.ms"]),
])
def test_bad_compaction_config(tmp_path, clock, overrides, names):
    with pytest.raises(ConfigError) as excinfo:
        LogConfig(overrides)
    for name in names:
        assert name in str(excinfo.value)
    with pytest.raises(ConfigError):
        open_log(tmp_path / "t-0", overrides, clock)


def test_good_compaction_configs():
    assert LogConfig({"cleanup.policy": "compact,delete"}).compact
    assert LogConfig({"cleanup.policy": ["delete", "compact"]}).delete
    assert LogConfig({"min.cleanable.dirty.ratio": 0}).min_cleanable_dirty_ratio == 0.0
    assert LogConfig({"min.cleanable.dirty.ratio": "1.0"}).min_cleanable_dirty_ratio == 1.0
    cfg = LogConfig({"min.compaction.lag.ms": 5, "max.compaction.lag.ms": 5})
    assert cfg.min_compaction_lag_ms == cfg.max_compaction_lag_ms == 5


def test_read_batches_reads_what_the_file_holds(tmp_path, monkeypatch):
    """The cleaner reads a segment a buffer at a time: the same batches as FileRecords.batches,
    a batch larger than the buffer included, the same quiet stop at a partial trailing batch, and
    the file's own error for an impossible length."""
    from kstore import cleaner as cleaner_module
    from kstore.errors import CorruptRecordError
    from kstore.file_records import FileRecords
    monkeypatch.setattr(cleaner_module, "READ_CHUNK_BYTES", 300)
    batches = [build_batch([Record(k(i), b"v" * (i * 40), T0)], base_offset=i) for i in range(12)]
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"".join(batches) + batches[0][:30])            # a partial batch at the end
    file = FileRecords(str(path))
    got = [(b.position, b.to_bytes()) for b in cleaner_module.read_batches(file)]
    assert got == [(b.position, b.to_bytes()) for b in file.batches()]
    assert [raw for _, raw in got] == batches                       # some are > 300 bytes
    middle = sum(len(b) for b in batches[:5])
    assert [b.to_bytes() for b in cleaner_module.read_batches(file, middle)] == batches[5:]
    file.close()
    corrupt = bytearray(b"".join(batches))
    struct.pack_into(">i", corrupt, middle + 8, 3)                  # batchLength 3 < 14
    path.write_bytes(bytes(corrupt))
    file = FileRecords(str(path))
    with pytest.raises(CorruptRecordError) as expected:
        list(file.batches())
    with pytest.raises(CorruptRecordError) as got_error:
        list(cleaner_module.read_batches(file))
    assert str(got_error.value) == str(expected.value)
    file.close()

"""Offset index (`.index`) and time index (`.timeindex`).

Behaviour cases 13-20 of the reference (docs/kafka-storage-notes.md §12), taken from
Kafka's OffsetIndexTest / TimeIndexTest, plus the file life cycle of §2.2 (preallocation,
trimming, reopening) and the byte layout of §2.1. Real files in tmp_path; no mocks.
"""

from __future__ import annotations

import bisect
import os
import random
import struct
import sys

import pytest

from kstore.errors import (CorruptIndexError, IndexFullError, IndexOffsetOverflowError,
                           InvalidOffsetError, KStoreError)
from kstore.index import OffsetIndex, OffsetPosition, TimeIndex, TimestampOffset

BASE_OFFSET = 45
MAX_ENTRIES = 30
INT_MAX = 2**31 - 1


@pytest.fixture
def index(tmp_path):
    """OffsetIndexTest.setup: base offset 45, 30 slots of 8 bytes."""
    idx = OffsetIndex(tmp_path / "00000000000000000045.index", BASE_OFFSET, MAX_ENTRIES * 8)
    yield idx
    idx.close()


@pytest.fixture
def tindex(tmp_path):
    """TimeIndexTest: base offset 45, 30 slots of 12 bytes."""
    idx = TimeIndex(tmp_path / "00000000000000000045.timeindex", BASE_OFFSET, MAX_ENTRIES * 12)
    yield idx
    idx.close()


def append_time_entries(idx: TimeIndex, n: int) -> None:
    """TimeIndexTest.appendEntries: (i*10, i*10 + baseOffset) for i in 1..n."""
    for i in range(1, n + 1):
        idx.maybe_append(i * 10, i * 10 + BASE_OFFSET)


def monotonic_seq(rng: random.Random, base: int, n: int) -> list[int]:
    out, last = [], base
    for _ in range(n):
        last += rng.randint(1, 15)
        out.append(last)
    return out


# --------------------------------------------------------------------------------------------
# Case 13
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_case_13_random_lookup_matches_floor_entry(tmp_path, seed):
    """Case 13 [OffsetIndexTest.randomLookupTest]: lookup = greatest entry <= target (a sorted
    map's floorEntry); below the first entry -> (baseOffset, 0)."""
    idx = OffsetIndex(tmp_path / "x.index", BASE_OFFSET, MAX_ENTRIES * 8)
    assert idx.lookup(92) == OffsetPosition(BASE_OFFSET, 0), "not present -> physical position 0"
    rng = random.Random(seed)
    offsets = monotonic_seq(rng, BASE_OFFSET + 1, idx.max_entries)
    positions = monotonic_seq(rng, 0, idx.max_entries)
    for o, p in zip(offsets, positions):
        idx.append(o, p)
    for o, p in zip(offsets, positions):
        assert idx.lookup(o) == (o, p)
    candidates = list(range(BASE_OFFSET, offsets[-1]))
    rng.shuffle(candidates)
    for target in candidates[:30]:
        if target < offsets[0]:
            expected = (BASE_OFFSET, 0)
        else:
            i = bisect.bisect_right(offsets, target) - 1
            expected = (offsets[i], positions[i])
        assert idx.lookup(target) == expected
    idx.close()


def test_case_13_lookup_extreme_cases(index):
    """Case 13 [OffsetIndexTest.lookupExtremeCases]: empty index -> (base, 0); full index: the
    base offset (below entry 0) -> (base, 0), base+maxEntries -> the last entry."""
    assert index.lookup(index.base_offset) == (BASE_OFFSET, 0)
    for i in range(index.max_entries):
        index.append(index.base_offset + i + 1, i)
    assert index.lookup(index.base_offset) == (BASE_OFFSET, 0)
    assert index.lookup(index.base_offset + index.max_entries) == \
        (BASE_OFFSET + MAX_ENTRIES, MAX_ENTRIES - 1)
    assert index.lookup(10**12) == (BASE_OFFSET + MAX_ENTRIES, MAX_ENTRIES - 1)


def test_case_13_entry_by_slot(index):
    """OffsetIndexTest.testEntry / testEntryOverflow."""
    with pytest.raises(IndexError):
        index.entry(0)
    for i in range(index.max_entries):
        index.append(index.base_offset + i, i)
    for i in range(index.max_entries):
        assert index.entry(i) == (BASE_OFFSET + i, i)


def test_randomised_lookup_against_sorted_list_model(tmp_path):
    """Like randomLookupTest, larger (more than the 1024-entry warm section of §2.3) and with
    every offset in range checked against a bisect model, on both indexes."""
    rng = random.Random(20241025)
    n = 3000
    oidx = OffsetIndex(tmp_path / "a.index", 1000, n * 8)
    tidx = TimeIndex(tmp_path / "a.timeindex", 1000, (n + 1) * 12)
    offsets = monotonic_seq(rng, 1000, n)
    positions = monotonic_seq(rng, -1, n)
    stamps = monotonic_seq(rng, 1_700_000_000_000, n)
    for o, p, ts in zip(offsets, positions, stamps):
        oidx.append(o, p)
        assert tidx.maybe_append(ts, o)
    assert oidx.entries == n and tidx.entries == n
    for target in range(990, offsets[-1] + 20):
        i = bisect.bisect_right(offsets, target) - 1
        assert oidx.lookup(target) == ((1000, 0) if i < 0 else (offsets[i], positions[i]))
    for target in [rng.randint(stamps[0] - 50, stamps[-1] + 50) for _ in range(3000)] + \
            stamps[:5] + stamps[-5:]:
        i = bisect.bisect_right(stamps, target) - 1
        assert tidx.lookup(target) == ((-1, 1000) if i < 0 else (stamps[i], offsets[i]))
    oidx.close()
    tidx.close()


def test_last_offset_kept_in_memory_follows_every_change(tmp_path):
    """OffsetIndex keeps its last offset in memory (Kafka's `_lastOffset`) instead of reading it
    back at every append: after random appends, truncations and shrinking resizes it must equal
    what the file says, and the append check must use it."""
    rng = random.Random(20261124)
    path = tmp_path / "m.index"
    idx = OffsetIndex(path, 500, 64 * 8)
    model: list[int] = []           # the offsets in the file, in order
    for _ in range(600):
        op = rng.random()
        if op < 0.6 and len(model) < idx.max_entries:
            offset = (model[-1] if model else 500) + rng.randint(1, 5)
            idx.append(offset, len(model))
            model.append(offset)
        elif op < 0.8:
            target = rng.randint(495, (model[-1] if model else 500) + 3)
            idx.truncate_to(target)
            model = [o for o in model if o < target]
        elif op < 0.9:
            keep = rng.randint(0, len(model))
            idx.resize(keep * 8)            # shrinking the file drops the entries past it
            model = model[:keep]
            idx.resize(64 * 8)
        else:
            idx.close()
            idx = OffsetIndex(path, 500, 64 * 8)
            idx.resize(64 * 8)              # reopened trimmed: room to append again
        expected = model[-1] if model else 500
        assert idx.entries == len(model)
        assert idx.last_offset == expected == idx.last_entry().offset
        if model:
            with pytest.raises(InvalidOffsetError):
                idx.append(model[-1], 0)
    idx.close()


# --------------------------------------------------------------------------------------------
# Case 14
# --------------------------------------------------------------------------------------------

def test_case_14_append_to_full_index_fails(index):
    """Case 14 [OffsetIndexTest.appendTooMany]: IllegalArgumentException on a full index."""
    for i in range(index.max_entries):
        index.append(index.base_offset + i + 1, i)
    assert index.is_full()
    with pytest.raises(IndexFullError):
        index.append(index.max_entries + 1 + BASE_OFFSET, 1)
    assert index.entries == MAX_ENTRIES


def test_case_14_append_out_of_order_fails(index):
    """Case 14 [OffsetIndexTest.appendOutOfOrder]: 51 then 50 -> InvalidOffsetException; an equal
    offset is rejected too (offset <= lastOffset)."""
    index.append(51, 0)
    with pytest.raises(InvalidOffsetError):
        index.append(50, 1)
    with pytest.raises(InvalidOffsetError):
        index.append(51, 1)
    assert index.entries == 1
    index.append(52, 1)
    assert index.entries_list() == [(51, 0), (52, 1)]


# --------------------------------------------------------------------------------------------
# Case 15
# --------------------------------------------------------------------------------------------

def test_case_15_truncate(tmp_path):
    """Case 15 [OffsetIndexTest.truncate]: past the end -> unchanged; at an entry -> that entry
    and later ones go; between entries -> the smaller one stays; truncate() -> empty."""
    idx = OffsetIndex(tmp_path / "t.index", 0, 10 * 8)
    idx.truncate()
    for i in range(1, 10):
        idx.append(i, i)

    idx.truncate_to(12)
    assert idx.lookup(10) == (9, 9), "unchanged by truncate past the end"
    assert idx.last_offset == 9

    idx.append(10, 10)
    idx.truncate_to(10)
    assert idx.lookup(10) == (9, 9), "truncate at the last entry removes it"
    assert idx.last_offset == 9
    idx.append(10, 10)

    idx.truncate_to(9)
    assert idx.lookup(10) == (8, 8), "should truncate off the last entry"
    assert idx.last_offset == 8
    idx.append(9, 9)

    idx.truncate_to(5)
    assert idx.lookup(10) == (4, 4)
    assert idx.last_offset == 4
    idx.append(5, 5)

    idx.truncate()
    assert idx.entries == 0, "full truncation leaves no entries"
    idx.append(0, 0)
    assert idx.entries_list() == [(0, 0)]
    idx.close()


def test_case_15_truncate_between_entries_keeps_smaller(tmp_path):
    """Case 15 / §2.5: entries 10,20,30; truncateTo(25) keeps 10 and 20; file length unchanged."""
    idx = OffsetIndex(tmp_path / "g.index", 0, 10 * 8)
    for o in (10, 20, 30):
        idx.append(o, o * 100)
    idx.truncate_to(25)
    assert idx.entries_list() == [(10, 1000), (20, 2000)]
    assert os.path.getsize(idx.path) == 80
    idx.truncate_to(5)
    assert idx.entries == 0
    idx.close()


def test_case_15_time_index_truncate(tindex):
    """TimeIndexTest.testTruncate: truncate() -> 0; truncateTo(10 + base) (the first entry's
    offset, searched in the offset column) -> 0 entries."""
    append_time_entries(tindex, MAX_ENTRIES - 1)
    tindex.truncate()
    assert tindex.entries == 0
    append_time_entries(tindex, MAX_ENTRIES - 1)
    tindex.truncate_to(10 + BASE_OFFSET)
    assert tindex.entries == 0
    assert tindex.last_entry() == (-1, BASE_OFFSET)


def test_case_15_time_index_truncate_updates_last_entry(tindex):
    """§2.5: truncateTo(o) on the time index removes entries with offset >= o."""
    append_time_entries(tindex, 5)  # offsets 55, 65, 75, 85, 95
    tindex.truncate_to(80)
    assert tindex.entries_list() == [(10, 55), (20, 65), (30, 75)]
    assert tindex.last_entry() == (30, 75)
    # Timestamps must still increase after the truncation point.
    assert tindex.maybe_append(31, 80)
    assert tindex.last_entry() == (31, 80)


# --------------------------------------------------------------------------------------------
# Case 16
# --------------------------------------------------------------------------------------------

def test_case_16_reopen(index):
    """Case 16 [OffsetIndexTest.testReopen]: close + reopen -> same lookups, lastOffset 52,
    2 entries, and an append fails (the reopened file is exactly full)."""
    first, sec = OffsetPosition(51, 0), OffsetPosition(52, 1)
    index.append(*first)
    index.append(*sec)
    index.close()
    reopened = OffsetIndex(index.path, BASE_OFFSET)
    assert reopened.lookup(first.offset) == first
    assert reopened.lookup(sec.offset) == sec
    assert reopened.last_offset == sec.offset
    assert reopened.entries == 2
    with pytest.raises(IndexFullError):
        reopened.append(53, 1)
    reopened.close()


def test_case_16_time_index_reopen(tindex):
    append_time_entries(tindex, 3)
    tindex.close()
    reopened = TimeIndex(tindex.path, BASE_OFFSET)
    assert reopened.entries == 3
    assert reopened.entries_list() == [(10, 55), (20, 65), (30, 75)]
    assert reopened.last_entry() == (30, 75)
    assert reopened.lookup(25) == (20, 65)
    reopened.close()


# --------------------------------------------------------------------------------------------
# Case 17
# --------------------------------------------------------------------------------------------

def test_case_17_fetch_upper_bound_offset(index):
    """Case 17 [OffsetIndexTest.testFetchUpperBoundOffset]: first entry whose position >=
    start.position + size, or none."""
    first = OffsetPosition(BASE_OFFSET, 0)
    second = OffsetPosition(BASE_OFFSET + 1, 10)
    third = OffsetPosition(BASE_OFFSET + 2, 23)
    fourth = OffsetPosition(BASE_OFFSET + 3, 37)

    assert index.fetch_upper_bound_offset(first.position, 5) is None
    for e in (first, second, third, fourth):
        index.append(*e)

    assert index.fetch_upper_bound_offset(first.position, 5) == second
    assert index.fetch_upper_bound_offset(first.position, 10) == second
    assert index.fetch_upper_bound_offset(first.position, 23) == third
    assert index.fetch_upper_bound_offset(first.position, 22) == third
    assert index.fetch_upper_bound_offset(second.position, 24) == fourth
    assert index.fetch_upper_bound_offset(fourth.position, 1) is None
    assert index.fetch_upper_bound_offset(first.position, 200) is None
    assert index.fetch_upper_bound_offset(second.position, 200) is None


# --------------------------------------------------------------------------------------------
# Case 18
# --------------------------------------------------------------------------------------------

def test_case_18_time_index_lookup(tindex):
    """Case 18 [TimeIndexTest.testLookUp]: empty -> (-1, base); before the first -> (-1, base);
    between entries -> the lower one; exact -> that entry."""
    assert tindex.lookup(100) == TimestampOffset(-1, BASE_OFFSET)
    append_time_entries(tindex, MAX_ENTRIES - 1)
    assert tindex.lookup(9) == (-1, BASE_OFFSET)
    assert tindex.lookup(25) == (20, 65)
    assert tindex.lookup(30) == (30, 75)
    assert tindex.lookup(10**9) == (290, 335)


def test_case_18_time_index_entries_and_last_entry(tindex):
    """TimeIndexTest.testEntry / testLastEntry."""
    assert tindex.last_entry() == (-1, BASE_OFFSET)
    tindex.maybe_append(1, 1 + BASE_OFFSET)
    assert tindex.last_entry() == (1, BASE_OFFSET + 1)
    tindex.truncate()
    append_time_entries(tindex, MAX_ENTRIES - 1)
    assert [tindex.entry(i) for i in range(4)] == [(10, 55), (20, 65), (30, 75), (40, 85)]


def test_time_index_only_appends_larger_timestamps(tindex):
    """§2.4: an equal timestamp is silently skipped; a smaller one is an error."""
    assert tindex.maybe_append(100, 50)
    assert not tindex.maybe_append(100, 51)
    assert tindex.entries == 1 and tindex.last_entry() == (100, 50)
    with pytest.raises(KStoreError):  # Kafka: IllegalStateException
        tindex.maybe_append(99, 52)
    assert tindex.entries == 1


# --------------------------------------------------------------------------------------------
# Case 19
# --------------------------------------------------------------------------------------------

def test_case_19_time_index_full_at_max_entries_minus_one(tindex):
    """Case 19 [TimeIndexTest.testIsFull]: one slot is reserved."""
    assert not tindex.is_full()
    append_time_entries(tindex, MAX_ENTRIES - 2)
    assert not tindex.is_full()
    tindex.maybe_append((MAX_ENTRIES - 1) * 10, (MAX_ENTRIES - 1) * 10 + BASE_OFFSET)
    assert tindex.entries == MAX_ENTRIES - 1
    assert tindex.is_full()


def test_case_19_time_index_append(tindex):
    """Case 19 [TimeIndexTest.testAppend]: full -> a normal append fails; skipFullCheck with an
    offset below the last -> InvalidOffsetException; skipFullCheck with a valid one succeeds."""
    append_time_entries(tindex, MAX_ENTRIES - 1)
    with pytest.raises(IndexFullError):
        tindex.maybe_append(10000, 1000)
    with pytest.raises(InvalidOffsetError):
        tindex.maybe_append(10000, (MAX_ENTRIES - 2) * 10, skip_full_check=True)
    tindex.maybe_append(10000, 1000, skip_full_check=True)
    assert tindex.entries == MAX_ENTRIES
    assert tindex.last_entry() == (10000, 1000)


# --------------------------------------------------------------------------------------------
# Case 20 (sanity checks on real, deliberately damaged files)
# --------------------------------------------------------------------------------------------

def write_time_entries(path, entries, extra: bytes = b"") -> None:
    with open(path, "wb") as f:
        for ts, rel in entries:
            f.write(struct.pack(">qi", ts, rel))
        f.write(extra)


def write_offset_entries(path, entries, extra: bytes = b"") -> None:
    with open(path, "wb") as f:
        for rel, pos in entries:
            f.write(struct.pack(">ii", rel, pos))
        f.write(extra)


def test_case_20_time_index_sanity_check_passes_for_good_index(tindex):
    """Case 20 [TimeIndexTest.testSanityCheck]: fresh and 5-entry indexes pass, also reopened."""
    tindex.sanity_check()
    append_time_entries(tindex, 5)
    tindex.sanity_check()
    tindex.trim_to_valid_size()
    tindex.close()
    reopened = TimeIndex(tindex.path, BASE_OFFSET, MAX_ENTRIES * 12)
    assert reopened.entries == 5
    reopened.sanity_check()
    reopened.close()


@pytest.mark.parametrize("damage", ["last_offset_below_base", "last_ts_below_first", "length"])
def test_case_20_time_index_sanity_check_fails(tmp_path, damage):
    """Case 20 [TimeIndexTest.testSanityCheck]: last offset < base, last timestamp < first
    timestamp, or a length that is not a multiple of 12 -> CorruptIndexException."""
    good = [(10, 10), (20, 20), (30, 30), (40, 40), (50, 50)]  # (timestamp, relative offset)
    path = tmp_path / "00000000000000000045.timeindex"
    if damage == "last_offset_below_base":
        write_time_entries(path, good[:4] + [(50, -1)])
    elif damage == "last_ts_below_first":
        write_time_entries(path, good[:4] + [(9, 50)])
    else:
        write_time_entries(path, good, extra=b"\x00" * 11)
    idx = TimeIndex(path, BASE_OFFSET, MAX_ENTRIES * 12)
    with pytest.raises(CorruptIndexError):
        idx.sanity_check()
    idx.close_handler()


@pytest.mark.parametrize("damage", ["last_offset_below_base", "length"])
def test_case_20_offset_index_sanity_check_fails(tmp_path, damage):
    """Case 20 / §2.8: offset index corrupt if lastOffset < baseOffset or length % 8 != 0."""
    path = tmp_path / "00000000000000000045.index"
    if damage == "last_offset_below_base":
        write_offset_entries(path, [(1, 0), (2, 10), (-1, 20)])
    else:
        write_offset_entries(path, [(1, 0), (2, 10)], extra=b"\x00\x00\x00")
    idx = OffsetIndex(path, BASE_OFFSET, MAX_ENTRIES * 8)
    with pytest.raises(CorruptIndexError):
        idx.sanity_check()
    idx.close_handler()


def test_case_20_offset_index_last_offset_equal_to_base_passes(tmp_path):
    """Case 20 [OffsetIndexTest.testSanityLastOffsetEqualToBaseOffset]."""
    idx = OffsetIndex(tmp_path / "00000000000000000020.index", 20, 10 * 8)
    idx.append(20, 0)
    idx.sanity_check()
    idx.close()
    reopened = OffsetIndex(tmp_path / "00000000000000000020.index", 20, 10 * 8)
    assert reopened.entries_list() == [(20, 0)]
    reopened.sanity_check()
    reopened.close()


# --------------------------------------------------------------------------------------------
# File life cycle (§2.2) and layout (§2.1)
# --------------------------------------------------------------------------------------------

def test_preallocation_default_segment_index_bytes(tmp_path):
    """§2.2: with segment.index.bytes = 10485760 a new .index is 10485760 bytes (1,310,720 slots)
    and a new .timeindex 10485756 bytes (873,813 slots); both have 0 entries."""
    oidx = OffsetIndex(tmp_path / "00000000000000000000.index", 0, 10485760)
    tidx = TimeIndex(tmp_path / "00000000000000000000.timeindex", 0, 10485760)
    assert os.path.getsize(oidx.path) == 10485760
    assert os.path.getsize(tidx.path) == 10485756
    assert oidx.max_entries == 1310720 and tidx.max_entries == 873813
    assert oidx.entries == 0 and tidx.entries == 0
    assert not oidx.is_full() and not tidx.is_full()
    oidx.close()
    tidx.close()


def test_preallocation_rounds_down_to_whole_entries(tmp_path):
    """§2.2: length = floor(maxIndexSize / entrySize) * entrySize."""
    oidx = OffsetIndex(tmp_path / "r.index", 0, 100)
    tidx = TimeIndex(tmp_path / "r.timeindex", 0, 100)
    assert os.path.getsize(oidx.path) == 96 and oidx.max_entries == 12
    assert os.path.getsize(tidx.path) == 96 and tidx.max_entries == 8
    oidx.close()
    tidx.close()


def test_trim_to_valid_size(index, tindex):
    """§2.2: trimToValidSize = resize(entries * entrySize); the index is then exactly full."""
    for i in range(3):
        index.append(BASE_OFFSET + 1 + i, 100 * i)
        tindex.maybe_append(10 * (i + 1), BASE_OFFSET + 1 + i)
    assert os.path.getsize(index.path) == MAX_ENTRIES * 8
    index.trim_to_valid_size()
    tindex.trim_to_valid_size()
    assert os.path.getsize(index.path) == 24 and os.path.getsize(tindex.path) == 36
    assert index.max_entries == 3 and index.is_full()
    assert index.entries_list() == [(46, 0), (47, 100), (48, 200)]
    # resize back to maxIndexSize (what truncation / loading does to the active segment)
    assert index.resize(index.max_index_size)
    assert os.path.getsize(index.path) == MAX_ENTRIES * 8
    assert index.entries == 3 and not index.is_full()
    index.append(49, 300)
    assert index.lookup(49) == (49, 300)


def test_close_trims_and_reopen_sees_only_real_entries(tmp_path):
    path = tmp_path / "c.index"
    idx = OffsetIndex(path, 0, 240)
    idx.append(3, 0)
    idx.append(7, 500)
    idx.close()
    assert os.path.getsize(path) == 16
    reopened = OffsetIndex(path, 0, 240)
    assert reopened.entries == 2 and reopened.entries_list() == [(3, 0), (7, 500)]
    reopened.close()


def test_reopen_without_trim_counts_every_slot(tmp_path):
    """§2.2: opening an existing file puts the write position at its end: every slot counts as an
    entry (zero slots read as relative offset 0, position 0). That is why indexes are trimmed."""
    path = tmp_path / "00000000000000000100.index"
    idx = OffsetIndex(path, 100, 240)
    idx.append(103, 0)
    idx.append(107, 500)
    idx.flush()
    idx.close_handler()  # no trim, like a crash
    assert os.path.getsize(path) == 240
    reopened = OffsetIndex(path, 100, 240)
    assert reopened.entries == 30
    assert reopened.is_full()
    assert reopened.entry(0) == (103, 0) and reopened.entry(1) == (107, 500)
    assert reopened.entry(2) == (100, 0) and reopened.entry(29) == (100, 0)
    assert reopened.last_offset == 100
    reopened.close_handler()

    tpath = tmp_path / "00000000000000000100.timeindex"
    tidx = TimeIndex(tpath, 100, 120)
    tidx.maybe_append(5, 101)
    tidx.flush()
    tidx.close_handler()
    treopened = TimeIndex(tpath, 100, 120)
    assert treopened.entries == 10
    assert treopened.last_entry() == (0, 100)
    treopened.close_handler()


def test_relative_offset_overflow(tmp_path):
    """§2.1: relative offset must be in [0, Integer.MAX_VALUE] -> IndexOffsetOverflowException."""
    idx = OffsetIndex(tmp_path / "00000000000000000100.index", 100, 80)
    with pytest.raises(IndexOffsetOverflowError):
        idx.append(100 + INT_MAX + 1, 0)
    with pytest.raises(IndexOffsetOverflowError):
        idx.append(99, 0)
    assert idx.entries == 0
    idx.append(100 + INT_MAX, 0)  # the largest storable offset is fine
    assert idx.entries_list() == [(100 + INT_MAX, 0)]
    idx.close()
    tidx = TimeIndex(tmp_path / "00000000000000000100.timeindex", 100, 120)
    with pytest.raises(IndexOffsetOverflowError):
        tidx.maybe_append(10, 100 + INT_MAX + 1)
    assert tidx.entries == 0
    tidx.close()


def test_offset_index_byte_layout(tmp_path):
    """§2.1: offset 105 in segment 100 at position 4158 -> 00 00 00 05 00 00 10 3e on disk."""
    path = tmp_path / "00000000000000000100.index"
    idx = OffsetIndex(path, 100, 80)
    idx.append(105, 4158)
    idx.flush()
    with open(path, "rb") as f:
        assert f.read(8) == bytes.fromhex("000000050000103e")
    idx.close()
    with open(path, "rb") as f:
        assert f.read() == bytes.fromhex("000000050000103e")


def test_time_index_byte_layout(tmp_path):
    """§2.1: (1700000000123, offset 105) in segment 100 -> 00 00 01 8b cf e5 68 7b 00 00 00 05."""
    path = tmp_path / "00000000000000000100.timeindex"
    idx = TimeIndex(path, 100, 120)
    idx.maybe_append(1700000000123, 105)
    idx.flush()
    with open(path, "rb") as f:
        assert f.read(12) == bytes.fromhex("0000018bcfe5687b00000005")
    idx.close()
    with open(path, "rb") as f:
        assert f.read() == bytes.fromhex("0000018bcfe5687b00000005")


def test_index_reads_entries_written_by_another_writer(tmp_path):
    """Files are the format: entries written with struct (as Kafka would) are read back."""
    path = tmp_path / "00000000000000001000.index"
    write_offset_entries(path, [(5, 0), (12, 4096), (40, 9000)])
    idx = OffsetIndex(path, 1000, 8 * 100)
    assert idx.entries_list() == [(1005, 0), (1012, 4096), (1040, 9000)]
    assert idx.lookup(1013) == (1012, 4096)
    idx.close_handler()


def test_a_closed_log_read_after_its_directory_is_gone_creates_no_file(tmp_path):
    """A view may draw a closed log on its timer thread while the notebook deletes the directory
    (chapter 00's last cell). Reading a closed segment's index opens it read-only: the missing
    file is reported, never recreated as a fresh preallocated one (which made rmtree fail)."""
    import shutil

    from kstore import Log, LogConfig, ManualClock

    clock = ManualClock(1_700_000_000_000)
    log = Log.open(str(tmp_path / "orders-0"),
                   LogConfig({"segment.bytes": 2048, "index.interval.bytes": 256}), clock)
    for i in range(60):
        log.append([(f"k{i}", "v" * 100)])
    segments = list(log.segments)
    log.close()
    entries = [s.offset_index.entries for s in segments]      # a closed log can still be read
    assert sum(entries) > 0
    for s in segments:                     # rmtree half done: the index files gone, the dir not yet
        s.offset_index.close()             # (drops the read-only mappings reopened just above)
        os.remove(s.offset_index.path)
    for s in segments:
        with pytest.raises(FileNotFoundError):
            s.offset_index.entries
    assert not [f for f in os.listdir(tmp_path / "orders-0") if f.endswith(".index")]
    shutil.rmtree(tmp_path / "orders-0")


def _resident_pages(index) -> int:
    """Pages of an index file's mapping in the page cache (mincore(2))."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    length = index.length
    vec = (ctypes.c_ubyte * ((length + 4095) // 4096))()
    anchor = ctypes.c_char.from_buffer(index._mmap)
    try:
        assert libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(length),
                            vec) == 0, os.strerror(ctypes.get_errno())
    finally:
        del anchor     # release the buffer export, or the index could not unmap on close
    return sum(v & 1 for v in vec)


@pytest.mark.skipif(sys.platform != "linux", reason="mincore(2) and this readahead are Linux's")
def test_first_index_entry_does_not_fill_the_preallocated_file(tmp_path):
    """A new segment's .index and .timeindex are 10 MiB sparse files. Their first entries must
    bring one page into memory, not the whole file: without the no-readahead hint the kernel
    zero-fills ~2,000 pages around that first write (~2 ms inside the append that follows a
    roll)."""
    from kstore import Log
    from kstore.records import Record, build_batch
    log = Log.open(str(tmp_path / "t-0"), {"index.interval.bytes": 1})
    try:
        for _ in range(3):
            log.append_as_leader(build_batch([Record(b"k", b"v" * 100, 1_700_000_000_000)]))
        segment = log.active_segment
        for lazy in (segment.offset_index, segment.time_index):
            index = lazy.get()
            assert index.entries >= 1 and index.length > 10_000_000   # preallocated
            assert _resident_pages(index) <= 4, index.path
    finally:
        log.close()

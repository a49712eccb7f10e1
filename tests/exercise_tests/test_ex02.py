"""Exercise 02 — the sparse index: when an entry is added (§2.6), the largest-entry-≤-target
search and the offset index lookup (§2.3). Compared with kstore's LogSegment and OffsetIndex."""

from __future__ import annotations

import math
import os
import shutil
from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

from kstore import LogConfig, ManualClock
from kstore.grading.feedback import Mismatch, expect_equal
from kstore.grading.testing import PROPERTY, extra, scratch_dir, task
from kstore.index import AbstractIndex, OffsetIndex
from kstore.segment import LogSegment


# ------------------------------------------------------------------ the engine's answers
def engine_index_entries(appends: list[tuple[int, int]], interval: int) -> list[tuple[int, int]]:
    """Append `size` bytes per (last_offset, size) to a real LogSegment; read its .index back."""
    d = scratch_dir()
    try:
        config = LogConfig({"index.interval.bytes": interval, "segment.index.bytes": 64 * 1024})
        seg = LogSegment.open(d, 0, config, ManualClock())
        for last_offset, size in appends:
            seg.append(last_offset, 1_700_000_000_000, last_offset, b"\0" * size)
        out = [(e.offset, e.position) for e in seg.offset_index.entries_list()]
        seg.close_handlers()
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def engine_slot(keys: list[int], target: int) -> int:
    return AbstractIndex.largest_lower_bound_slot_for(SimpleNamespace(_entries=len(keys)), target,
                                                      key=keys.__getitem__)


def engine_lookup(entries: list[tuple[int, int]], base_offset: int, target: int) -> tuple[int, int]:
    d = scratch_dir()
    try:
        index = OffsetIndex(os.path.join(d, "00.index"), base_offset, 64 * 1024)
        for offset, position in entries:
            index.append(offset, position)
        found = tuple(index.lookup(target))
        index.close_handler()
        return found
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------ known mistakes
def _entries_variant(appends, interval, *, ge=False, after=False, count_first=False, no_reset=False):
    out, since, position = [], 0, 0
    for last_offset, size in appends:
        if count_first:
            since += size
        due = since >= interval if ge else since > interval
        if due:
            out.append((last_offset, position + size if after else position))
            if not no_reset:
                since = 0
        if not count_first:
            since += size
        position += size
    return out


def entries_mistakes(appends, interval):
    return [
        (">= instead of >: Kafka adds an entry only when the bytes since the last entry are "
         "strictly greater than index.interval.bytes", _entries_variant(appends, interval, ge=True)),
        ("the entry holds the position *after* the append; it must hold the position where the "
         "append starts (the file size before writing)", _entries_variant(appends, interval, after=True)),
        ("off by one append: this append's bytes were counted before the check; Kafka checks the "
         "bytes counted *before* this append, then adds them",
         _entries_variant(appends, interval, count_first=True)),
        ("the counter is never reset to 0 after an entry", _entries_variant(appends, interval, no_reset=True)),
    ]


def _appends(sizes, offsets_per_append=1, first=0):
    out, last = [], first - 1
    for s in sizes:
        last += offsets_per_append
        out.append((last, s))
    return out


ENTRY_VECTORS = [
    ("1000-byte-appends-interval-4096", _appends([1000] * 12), 4096, [(5, 5000), (10, 10000)]),
    ("interval-0-indexes-all-but-the-first", _appends([100] * 4), 0, [(1, 100), (2, 200), (3, 300)]),
    ("exactly-the-interval-is-not-enough", [(0, 4096), (1, 10), (2, 10)], 4096, [(2, 4106)]),
    ("batches-of-10-offsets", _appends([3000] * 5, 10), 4096, [(29, 6000), (49, 12000)]),
    ("first-append-never-indexed", [(0, 100_000), (1, 10)], 4096, [(1, 100_000)]),
    ("interval-2s-1-30-appends", _appends([50] * 30), 99, None),
]


@task("ex02.1", points=5)
@pytest.mark.parametrize("appends, interval, expected", [v[1:] for v in ENTRY_VECTORS],
                         ids=[v[0] for v in ENTRY_VECTORS])
def test_index_entries_vectors(learner, appends, interval, expected):
    engine = engine_index_entries(appends, interval)
    if expected is not None:
        assert engine == expected
    else:
        assert len(engine) == 14    # LogSegmentTest: 30 appends, interval 2s−1 → entries on 3, 5, 7, …
    expect_equal(learner.index_entries(appends, interval), engine,
                 call=f"index_entries({appends!r}, index_interval_bytes={interval})",
                 mistakes=entries_mistakes(appends, interval),
                 normalize=lambda r: [tuple(e) for e in r])


@task("ex02.1", points=5)
@PROPERTY
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(61, 3000)), min_size=1, max_size=40),
       st.sampled_from([0, 100, 500, 1000, 4096]))
def test_index_entries_match_the_engine(learner, steps, interval):
    appends, last = [], -1
    for n, size in steps:
        last += n
        appends.append((last, size))
    expect_equal(learner.index_entries(appends, interval), engine_index_entries(appends, interval),
                 call=f"index_entries({appends!r}, index_interval_bytes={interval})",
                 mistakes=entries_mistakes(appends, interval),
                 normalize=lambda r: [tuple(e) for e in r])


# ------------------------------------------------------------------ ex02.2 largest_lower_bound_slot
KEYS = [10, 20, 30, 40]
SLOT_VECTORS = [("empty", [], 5, -1), ("below-first", KEYS, 5, -1), ("equal-first", KEYS, 10, 0),
                ("between", KEYS, 15, 0), ("equal-middle", KEYS, 30, 2), ("just-below", KEYS, 39, 2),
                ("above-last", KEYS, 99, 3), ("single", [7], 7, 0), ("single-below", [7], 6, -1)]


def slot_mistakes(keys, target):
    import bisect
    return [("this is the smallest slot with key ≥ target; the lookup needs the largest with key ≤ target",
             bisect.bisect_left(keys, target) if bisect.bisect_left(keys, target) < len(keys) else -1),
            ("off by one: this is the slot after the answer (bisect_right without the − 1)",
             bisect.bisect_right(keys, target)),
            ("no answer must be −1, not None", lambda a: a is None)]


@task("ex02.2", points=5)
@pytest.mark.parametrize("keys, target, expected", [v[1:] for v in SLOT_VECTORS], ids=[v[0] for v in SLOT_VECTORS])
def test_largest_lower_bound_slot_vectors(learner, keys, target, expected):
    assert engine_slot(keys, target) == expected
    expect_equal(learner.largest_lower_bound_slot(list(keys), target), expected,
                 call=f"largest_lower_bound_slot({keys!r}, {target})", mistakes=slot_mistakes(keys, target))


@task("ex02.2", points=4)
@PROPERTY
@given(st.lists(st.integers(0, 10_000), max_size=60, unique=True).map(sorted), st.integers(-5, 10_010))
def test_largest_lower_bound_slot_matches_the_engine(learner, keys, target):
    expect_equal(learner.largest_lower_bound_slot(list(keys), target), engine_slot(keys, target),
                 call=f"largest_lower_bound_slot({keys!r}, {target})", mistakes=slot_mistakes(keys, target))


class CountingKeys:
    """A read-only sequence that counts the keys read (an mmap'd index is read the same way)."""

    def __init__(self, n: int):
        self.n, self.reads = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            raise Mismatch("largest_lower_bound_slot sliced the keys: that copies the index; "
                           "read single entries (keys[i]) instead")
        if not -self.n <= i < self.n:
            raise IndexError(i)
        self.reads += 1
        return (i % self.n) * 3


@task("ex02.2", points=1)
@extra
def test_extra_largest_lower_bound_slot_is_a_binary_search(learner):
    keys = CountingKeys(1_000_000)
    got = learner.largest_lower_bound_slot(keys, 1_234_567)
    expect_equal(got, 1_234_567 // 3, call="largest_lower_bound_slot(<1,000,000 keys 0, 3, 6, …>, 1234567)")
    budget = 2 * math.ceil(math.log2(keys.n)) + 4
    if keys.reads > budget:
        raise Mismatch(f"largest_lower_bound_slot read {keys.reads:,} of the 1,000,000 keys; a binary "
                       f"search needs about {math.ceil(math.log2(keys.n))} (at most {budget} allowed)")


# ------------------------------------------------------------------ ex02.3 offset_index_lookup
ENTRIES = [(105, 4158), (110, 8300), (123, 16500)]
LOOKUP_VECTORS = [("empty-index", [], 100, 107), ("below-first-entry", ENTRIES, 100, 104),
                  ("the-base-offset", ENTRIES, 100, 100), ("exact-entry", ENTRIES, 100, 105),
                  ("between-entries", ENTRIES, 100, 107), ("exact-last", ENTRIES, 100, 123),
                  ("past-the-last", ENTRIES, 100, 500)]


def lookup_mistakes(entries, base, target):
    after = [e for e in entries if e[0] >= target]
    return [("no entry ≤ target must give (base_offset, 0): the scan then starts at the segment's "
             "first byte", (0, 0)),
            ("no entry ≤ target must give (base_offset, 0), not None", lambda a: a is None),
            ("this is the first entry ≥ target; the lookup takes the last entry ≤ target",
             tuple(after[0]) if after else (base, 0))]


@task("ex02.3", points=5)
@pytest.mark.parametrize("entries, base, target", [v[1:] for v in LOOKUP_VECTORS], ids=[v[0] for v in LOOKUP_VECTORS])
def test_offset_index_lookup_vectors(learner, entries, base, target):
    expected = engine_lookup(entries, base, target)
    expect_equal(learner.offset_index_lookup(list(entries), base, target), expected,
                 call=f"offset_index_lookup({entries!r}, base_offset={base}, target_offset={target})",
                 mistakes=lookup_mistakes(entries, base, target), normalize=tuple)


@task("ex02.3", points=5)
@PROPERTY
@given(st.integers(0, 10**6), st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 5000)), max_size=30),
       st.integers(-10, 200_000))
def test_offset_index_lookup_matches_the_engine(learner, base, steps, rel_target):
    entries, off, pos = [], base, 0
    for d_off, d_pos in steps:
        off += d_off + 1
        pos += d_pos
        entries.append((off, pos))
    target = max(0, base + rel_target)
    expect_equal(learner.offset_index_lookup(list(entries), base, target), engine_lookup(entries, base, target),
                 call=f"offset_index_lookup({entries!r}, base_offset={base}, target_offset={target})",
                 mistakes=lookup_mistakes(entries, base, target), normalize=tuple)

"""Exercise 04 — finding a message: the segment holding an offset (bisect), offset → position
(index floor + forward scan, §4.2) and timestamp → offset (§4.3). Compared with kstore's Log and
LogSegment on real segment files."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

from kstore.grading.feedback import Mismatch, expect_equal
from kstore.grading.testing import PROPERTY, SegmentView, build_segment, extra, scratch_dir, task
from kstore.log import Log
from kstore.records import Record, build_batch

T = 1_700_000_000_000


# ------------------------------------------------------------------ ex04.1 floor_segment
def engine_floor(bases, offset):
    fake = SimpleNamespace(_bases=list(bases), _segments={b: SimpleNamespace(base_offset=b) for b in bases})
    seg = Log.floor_segment(fake, offset)
    return None if seg is None else seg.base_offset


def floor_mistakes(bases, offset):
    import bisect
    i = bisect.bisect_left(bases, offset)
    return [("an offset equal to a base offset lives in *that* segment (bisect_right, then − 1); "
             "this answer is the segment before it", bases[i - 1] if i and i < len(bases) and bases[i] == offset else object()),
            ("return the segment's base offset, not its position in the list",
             lambda a: isinstance(a, int) and a != engine_floor(bases, offset) and 0 <= a < len(bases) and a not in bases),
            ("no segment holds an offset below the first base offset: return None", lambda a: a == -1),
            ("this is the next segment (the ceiling: the smallest base offset above the offset); the offset "
             "lives in the segment with the largest base offset ≤ it (bisect_right, then − 1)",
             next((b for b in bases if b > offset), object()))]


BASES = [0, 100, 250, 1000]
FLOOR_VECTORS = [("first-offset", BASES, 0), ("inside-first", BASES, 99), ("a-base-offset", BASES, 100),
                 ("inside-middle", BASES, 249), ("last-base", BASES, 1000), ("past-the-end", BASES, 10**12),
                 ("below-all", [50, 80], 10), ("single-segment", [7], 7), ("no-segments", [], 5)]


@task("ex04.1", points=5)
@pytest.mark.parametrize("bases, offset", [v[1:] for v in FLOOR_VECTORS], ids=[v[0] for v in FLOOR_VECTORS])
def test_floor_segment_vectors(learner, bases, offset):
    expect_equal(learner.floor_segment(list(bases), offset), engine_floor(bases, offset),
                 call=f"floor_segment({bases!r}, {offset})", mistakes=floor_mistakes(bases, offset))


@task("ex04.1", points=4)
@PROPERTY
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=50, unique=True).map(sorted), st.integers(0, 10**6 + 5))
def test_floor_segment_matches_the_engine(learner, bases, offset):
    expect_equal(learner.floor_segment(list(bases), offset), engine_floor(bases, offset),
                 call=f"floor_segment({bases!r}, {offset})", mistakes=floor_mistakes(bases, offset))


class CountingBases(list):
    reads = 0

    def __getitem__(self, i):
        CountingBases.reads += 1
        return super().__getitem__(i)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


@task("ex04.1", points=1)
@extra
def test_extra_floor_segment_is_a_binary_search(learner):
    bases = CountingBases(range(0, 10_000_000, 100))
    CountingBases.reads = 0
    expect_equal(learner.floor_segment(bases, 5_555_555), 5_555_500, call="floor_segment(<100,000 segments>, 5555555)")
    if CountingBases.reads > 40:
        raise Mismatch(f"floor_segment read {CountingBases.reads:,} of 100,000 base offsets; a bisect "
                       f"reads about 17 (Kafka keeps segments in a skip list for the same reason)")


# ------------------------------------------------------------------ segments to search
def _batches(counts_and_gaps, base, value_size=20, ts_of=lambda o: T + o):
    """[(n_records, gap_after)] → batch bytes with consecutive offsets (gaps skip offsets)."""
    out, off = [], base
    for n, gap in counts_and_gaps:
        offsets = list(range(off, off + n))
        recs = [Record(f"k{o}".encode(), b"v" * value_size, ts_of(o)) for o in offsets]
        out.append(build_batch(recs, base_offset=offsets[0], offsets=offsets))
        off += n + gap
    return out


def _gap_batches(base):
    recs = lambda offs: [Record(f"k{o}".encode(), b"value", T + o) for o in offs]
    return [build_batch(recs([base, base + 1]), base_offset=base, offsets=[base, base + 1]),
            build_batch(recs([base + 5, base + 7]), base_offset=base + 5, offsets=[base + 5, base + 7]),
            build_batch(recs([base + 8]), base_offset=base + 8)]


def with_segment(batches, base, interval, fn):
    d = scratch_dir()
    seg = build_segment(d, base, batches, interval)
    try:
        return fn(seg)
    finally:
        seg.close_handlers()
        shutil.rmtree(d, ignore_errors=True)


def engine_translate(seg, target):
    found = seg.translate_offset(target)
    return None if found is None else (found.position, found.size)


def translate_mistakes(seg, target):
    locs = list(seg.log.batch_locations())
    by_base = next(((l.position, l.size) for l in locs if l.base_offset >= target), None)
    start = seg.offset_index.lookup(target).position
    at_entry = next(((l.position, l.size) for l in locs if l.position == start), None)
    strict = next(((l.position, l.size) for l in locs if l.last_offset > target), None)
    return [("this is the first batch whose *base* offset ≥ target; a batch holds offsets base..last, "
             "so look for the first batch whose *last* offset ≥ target", by_base),
            ("this is where the index entry points; the index is sparse: scan forward from there to "
             "the batch whose last offset ≥ target", at_entry),
            ("> instead of ≥: the batch whose last offset equals the target holds it", strict)]


def check_translate(learner, batches, base, interval, target):
    def run(seg):
        expected = engine_translate(seg, target)
        view = SegmentView(seg)
        expect_equal(learner.translate_offset(view, target), expected,
                     call=f"translate_offset({view!r}, {target})", mistakes=translate_mistakes(seg, target),
                     inputs={"batches (position, base..last offset, size)":
                             [(l.position, f"{l.base_offset}..{l.last_offset}", l.size)
                              for l in seg.log.batch_locations()][:8],
                             "index entries": [tuple(e) for e in seg.offset_index.entries_list()][:8]},
                     normalize=lambda r: None if r is None else tuple(r))
        return view
    return with_segment(batches, base, interval, run)


TEN_BATCHES = _batches([(5, 0)] * 10, 100)
TRANSLATE_VECTORS = [("first-offset", TEN_BATCHES, 100, 200, 100), ("inside-first-batch", TEN_BATCHES, 100, 200, 104),
                     ("second-batch", TEN_BATCHES, 100, 200, 105), ("inside-a-later-batch", TEN_BATCHES, 100, 200, 127),
                     ("last-offset", TEN_BATCHES, 100, 200, 149), ("past-the-end", TEN_BATCHES, 100, 200, 150),
                     ("below-the-base", TEN_BATCHES, 100, 200, 99), ("no-index-entries", TEN_BATCHES, 100, 10**6, 138),
                     ("offset-in-a-gap", _gap_batches(0), 0, 0, 3), ("inside-a-gappy-batch", _gap_batches(0), 0, 0, 6)]


@task("ex04.2", points=6)
@pytest.mark.parametrize("batches, base, interval, target", [v[1:] for v in TRANSLATE_VECTORS],
                         ids=[v[0] for v in TRANSLATE_VECTORS])
def test_translate_offset_vectors(learner, batches, base, interval, target):
    check_translate(learner, batches, base, interval, target)


@task("ex04.2", points=4)
@PROPERTY
@given(st.integers(0, 10**9), st.lists(st.tuples(st.integers(1, 6), st.integers(0, 3)), min_size=1, max_size=25),
       st.sampled_from([0, 150, 600, 10**6]), st.integers(-3, 200))
def test_translate_offset_matches_the_engine(learner, base, shape, interval, rel_target):
    check_translate(learner, _batches(shape, base), base, interval, max(0, base + rel_target))


@task("ex04.2", points=1)
@extra
def test_extra_translate_offset_starts_at_the_index_entry(learner):
    batches = _batches([(1, 0)] * 300, 0, value_size=40)
    view = check_translate(learner, batches, 0, 1000, 290)
    if view.log.bytes_read > 4000:
        raise Mismatch(f"translate_offset read {view.log.bytes_read:,} bytes of a {view.size:,}-byte "
                       f"segment to find offset 290; starting from the index entry (lookup) it needs "
                       f"under 4,000: use segment.offset_index.lookup(target).position")


# ------------------------------------------------------------------ ex04.3 offset_for_timestamp
def engine_ts(seg, ts):
    found = seg.find_offset_by_timestamp(ts)
    return None if found is None else found.offset


def ts_mistakes(seg, ts):
    records = [r for b in seg.log.batches() for r in b.records()]
    strict = next((r.offset for r in records if r.timestamp > ts), None)
    entry = seg.time_index.lookup(ts)
    return [("> instead of ≥: the first record whose timestamp is at least the target",
             strict if strict != engine_ts(seg, ts) else object()),
            ("this is the offset from the time index; the index is sparse — scan the batches from "
             "that offset for the first record with timestamp ≥ target", entry.offset),
            ("return the record's offset, not its timestamp",
             next((r.timestamp for r in records if r.timestamp >= ts), object()))]


def check_ts(learner, batches, base, interval, ts):
    def run(seg):
        view = SegmentView(seg)
        expect_equal(learner.offset_for_timestamp(view, ts), engine_ts(seg, ts),
                     call=f"offset_for_timestamp({view!r}, {ts})", mistakes=ts_mistakes(seg, ts),
                     inputs={"records (offset, timestamp)":
                             [(r.offset, r.timestamp) for b in seg.log.batches() for r in b.records()][:12]})
    with_segment(batches, base, interval, run)


KAFKA_VECTOR = _batches([(1, 0)] * 10, 40, ts_of=lambda o: o * 10)
TS_VECTORS = [(420, 42), (421, 43), (430, 43), (431, 44), (401, 41), (399, 40), (491, None)]


@task("ex04.3", points=6)
@pytest.mark.parametrize("ts, expected", TS_VECTORS, ids=[f"ts={t}" for t, _ in TS_VECTORS])
def test_offset_for_timestamp_kafka_vectors(learner, ts, expected):
    """LogSegmentTest.testFindOffsetByTimestamp: offsets 40..49 with timestamps offset × 10."""
    assert with_segment(KAFKA_VECTOR, 40, 0, lambda s: engine_ts(s, ts)) == expected
    check_ts(learner, KAFKA_VECTOR, 40, 0, ts)


@task("ex04.3", points=4)
@PROPERTY
@given(st.lists(st.lists(st.integers(0, 500), min_size=1, max_size=4), min_size=1, max_size=20),
       st.sampled_from([0, 200, 10**6]), st.integers(-5, 510))
def test_offset_for_timestamp_matches_the_engine(learner, ts_lists, interval, target):
    batches, off = [], 1000
    for tss in ts_lists:
        recs = [Record(b"k", b"v", T + t) for t in tss]
        batches.append(build_batch(recs, base_offset=off))
        off += len(tss)
    check_ts(learner, batches, 1000, interval, T + target)

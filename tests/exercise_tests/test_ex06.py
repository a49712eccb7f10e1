"""Exercise 06 — retention: which prefix of the log may go (`deletableSegments`, §6.2), the time
rule and the size rule. Compared with kstore.retention, which the log's retention pass uses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

from kstore import retention
from kstore.grading.feedback import expect_equal
from kstore.grading.testing import PROPERTY, task

T = 1_700_000_000_000


class Seg(SimpleNamespace):
    def __repr__(self) -> str:
        return f"Seg(base={self.base_offset}, size={self.size})"


def segs(*specs):
    return [Seg(base_offset=b, size=s, largest_timestamp=ts) for b, s, ts in specs]


def bases(result):
    return None if result is None else [getattr(s, "base_offset", s) for s in result]


def _deletable_variant(segments, predicate, hw, leo, *, no_hw=False, filter_all=False, never_active=False,
                       active_always=False):
    out = []
    for i, s in enumerate(segments):
        nxt = segments[i + 1] if i + 1 < len(segments) else None
        upper = nxt.base_offset if nxt else leo
        last_empty = nxt is None and s.size == 0
        if never_active and nxt is None:
            last_empty = True
        if active_always and nxt is None:
            last_empty = False
        ok = (no_hw or hw >= upper) and predicate(s, nxt) and not last_empty
        if ok:
            out.append(s)
        elif not filter_all:
            break
    return [s.base_offset for s in out]


def deletable_mistakes(segments, predicate, hw, leo):
    return [("the walk must stop at the first segment that stays: only a prefix of the log is deleted",
             _deletable_variant(segments, predicate, hw, leo, filter_all=True)),
            ("a segment may go only when the high watermark has passed its end (the next segment's "
             "base, or the LEO for the active one)", _deletable_variant(segments, predicate, hw, leo, no_hw=True)),
            ("a non-empty active segment can be deleted too (the log rolls a new one); only an *empty* "
             "last segment is always kept", _deletable_variant(segments, predicate, hw, leo, never_active=True)),
            ("an empty last segment is never deleted", _deletable_variant(segments, predicate, hw, leo, active_always=True))]


ALWAYS = lambda s, n: True          # noqa: E731
THREE = segs((0, 100, T), (100, 100, T), (200, 50, T))
DELETABLE_VECTORS = [
    ("everything-old-hw-at-leo", THREE, ALWAYS, 250, 250),
    ("hw-blocks-the-rest", THREE, ALWAYS, 150, 250),
    ("hw-exactly-at-the-next-base", THREE, ALWAYS, 200, 250),
    ("empty-active-segment-stays", segs((0, 100, T), (100, 0, T)), ALWAYS, 100, 100),
    ("stop-at-the-first-kept", segs((0, 100, T), (100, 100, T + 10), (200, 100, T)), lambda s, n: s.largest_timestamp == T, 300, 300),
    ("predicate-sees-the-next-segment", THREE, lambda s, n: n is not None and n.base_offset <= 100, 250, 250),
    ("nothing-qualifies", THREE, lambda s, n: False, 250, 250),
    ("single-non-empty-segment", segs((0, 500, T)), ALWAYS, 40, 40),
]


@task("ex06.1", points=6)
@pytest.mark.parametrize("segments, predicate, hw, leo", [v[1:] for v in DELETABLE_VECTORS],
                         ids=[v[0] for v in DELETABLE_VECTORS])
def test_deletable_segments_vectors(learner, segments, predicate, hw, leo):
    expected = bases(retention.deletable_segments(segments, predicate, high_watermark=hw, log_end_offset=leo))
    expect_equal(bases(learner.deletable_segments(list(segments), predicate, hw, leo)), expected,
                 call=f"deletable_segments({segments!r}, predicate, high_watermark={hw}, log_end_offset={leo})",
                 mistakes=deletable_mistakes(segments, predicate, hw, leo))


@task("ex06.1", points=4)
@PROPERTY
@given(st.lists(st.tuples(st.integers(1, 50), st.integers(0, 300), st.booleans()), min_size=1, max_size=8),
       st.integers(0, 60), st.integers(0, 400))
def test_deletable_segments_matches_the_engine(learner, shape, extra_leo, hw):
    segments, base = [], 0
    keep = set()
    for i, (n, size, deletable) in enumerate(shape):
        segments.append(Seg(base_offset=base, size=size, largest_timestamp=T))
        if not deletable:
            keep.add(base)
        base += n
    leo = base + (extra_leo if segments[-1].size else 0)
    predicate = lambda s, n: s.base_offset not in keep     # noqa: E731
    expected = bases(retention.deletable_segments(segments, predicate, high_watermark=hw, log_end_offset=leo))
    expect_equal(bases(learner.deletable_segments(list(segments), predicate, hw, leo)), expected,
                 call=f"deletable_segments({segments!r}, <deletes all but {sorted(keep)}>, "
                      f"high_watermark={hw}, log_end_offset={leo})",
                 mistakes=deletable_mistakes(segments, predicate, hw, leo))


# ------------------------------------------------------------------ ex06.2 time
def engine_time(segment, now, retention_ms):
    predicate = retention.retention_ms_breached(now, retention_ms)
    return False if predicate is None else predicate(segment, None)


WEEK = 604_800_000
TIME_VECTORS = [("older-than-a-week", T - WEEK - 1, T, WEEK), ("exactly-a-week", T - WEEK, T, WEEK),
                ("recent", T - 1000, T, WEEK), ("retention-minus-one-keeps-forever", 0, T, -1),
                ("retention-zero", T - 1, T, 0), ("timestamp-in-the-future", T + 5000, T, 0)]


def time_mistakes(segment, now, ms):
    age = now - segment.largest_timestamp
    return [(">= instead of >: a segment goes when now − largest timestamp is *more* than retention.ms",
             ms >= 0 and age >= ms),
            ("retention.ms = −1 means keep forever", ms < 0 and age > ms)]


@task("ex06.2", points=5)
@pytest.mark.parametrize("ts, now, ms", [v[1:] for v in TIME_VECTORS], ids=[v[0] for v in TIME_VECTORS])
def test_retention_time_breached_vectors(learner, ts, now, ms):
    s = Seg(base_offset=0, size=100, largest_timestamp=ts)
    expect_equal(learner.retention_time_breached(s, now, ms), engine_time(s, now, ms),
                 call=f"retention_time_breached(<segment with largest_timestamp={ts}>, now_ms={now}, retention_ms={ms})",
                 mistakes=time_mistakes(s, now, ms))


@task("ex06.2", points=5)
@PROPERTY
@given(st.integers(0, 2**42), st.integers(0, 2**42), st.one_of(st.just(-1), st.integers(0, 2**40)))
def test_retention_time_breached_matches_the_engine(learner, ts, now, ms):
    s = Seg(base_offset=0, size=100, largest_timestamp=ts)
    expect_equal(learner.retention_time_breached(s, now, ms), engine_time(s, now, ms),
                 call=f"retention_time_breached(<segment with largest_timestamp={ts}>, now_ms={now}, retention_ms={ms})",
                 mistakes=time_mistakes(s, now, ms))


# ------------------------------------------------------------------ ex06.3 size
def engine_size_count(sizes, retention_bytes):
    predicate = retention.retention_size_breached(sum(sizes), retention_bytes)
    if predicate is None:
        return 0
    n = 0
    for s in sizes:
        if not predicate(Seg(base_offset=0, size=s, largest_timestamp=T), None):
            break
        n += 1
    return n


def _size_variant(sizes, rb, *, strict=False, until_under=False):
    if rb < 0 or sum(sizes) < rb:
        return 0
    diff, n = sum(sizes) - rb, 0
    for s in sizes:
        if until_under:
            if diff <= 0:
                break
            diff -= s
            n += 1
            continue
        if (diff - s > 0) if strict else (diff - s >= 0):
            diff -= s
            n += 1
        else:
            break
    return n


def size_mistakes(sizes, rb):
    return [("> instead of >=: a segment goes while diff − its size ≥ 0 (diff = log size − retention.bytes)",
             _size_variant(sizes, rb, strict=True)),
            ("this deletes until the log is under retention.bytes — one segment too many; Kafka deletes a "
             "segment only if the log is still at least retention.bytes without it",
             _size_variant(sizes, rb, until_under=True)),
            ("retention.bytes = −1 means no size limit", lambda a: rb < 0 and a != 0)]


SIZE_VECTORS = [("kafka-15-appends-3-segments", [5, 5, 5], 10), ("kafka-under-the-limit", [5, 5, 5], 15),
                ("no-limit", [100, 100], -1), ("exactly-the-limit", [40, 60], 100),
                ("one-byte-over", [40, 61], 100), ("two-segments-over", [10, 20, 30, 40], 45),
                ("big-first-segment", [90, 10, 10], 100)]


@task("ex06.3", points=5)
@pytest.mark.parametrize("sizes, rb", [v[1:] for v in SIZE_VECTORS], ids=[v[0] for v in SIZE_VECTORS])
def test_size_breach_count_vectors(learner, sizes, rb):
    expect_equal(learner.size_breach_count(list(sizes), rb), engine_size_count(sizes, rb),
                 call=f"size_breach_count({sizes!r}, retention_bytes={rb})", mistakes=size_mistakes(sizes, rb))


@task("ex06.3", points=5)
@PROPERTY
@given(st.lists(st.integers(0, 500), min_size=1, max_size=10), st.integers(-1, 3000))
def test_size_breach_count_matches_the_engine(learner, sizes, rb):
    expect_equal(learner.size_breach_count(list(sizes), rb), engine_size_count(sizes, rb),
                 call=f"size_breach_count({sizes!r}, retention_bytes={rb})", mistakes=size_mistakes(sizes, rb))

"""Exercise 07 — compaction: which records a cleaning keeps (`shouldRetainRecord`, §7.6), how
segments are grouped for rewriting (`groupSegmentsBySize`, §7.5) and a whole cleaning round over a
segment set — compared with kstore's cleaner cleaning a real log."""

from __future__ import annotations

import os
import shutil
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from kstore import Log, LogConfig, ManualClock
from kstore.cleaner import LogCleaner, group_segments_by_size, should_retain_record
from kstore.grading.feedback import expect_equal
from kstore.grading.testing import PROPERTY, scratch_dir, task
from kstore.records import Record

T = 1_700_000_000_000


def rec(offset, key, value):
    return Record(None if key is None else key.encode() if isinstance(key, str) else key,
                  None if value is None else value.encode() if isinstance(value, str) else value,
                  T + offset, offset=offset)


# ------------------------------------------------------------------ ex07.1 should_retain_record
def _retain_variant(record, horizon, latest, map_latest, now, *, drop_tombstones=False, keep_old=False,
                    le=False, keep_unkeyed=False):
    if record.offset > map_latest:
        return True
    if record.key is None:
        return keep_unkeyed
    if record.offset < latest and not keep_old:
        return False
    if record.value is not None:
        return True
    if drop_tombstones:
        return False
    return horizon is None or (now <= horizon if le else now < horizon)


def retain_mistakes(*args):
    return [("a tombstone is kept until its batch's delete horizon has passed (consumers must see the "
             "delete); only then may it go", _retain_variant(*args, drop_tombstones=True)),
            ("an older record of a key (offset < the latest offset in the map) must go",
             _retain_variant(*args, keep_old=True)),
            ("the horizon has passed when now ≥ horizon: keep a tombstone only while now < horizon",
             _retain_variant(*args, le=True)),
            ("a record without a key has no place in a compacted log: drop it",
             _retain_variant(*args, keep_unkeyed=True))]


RETAIN_VECTORS = [
    ("beyond-the-map", rec(50, "a", "x"), None, 10, 40, T),
    ("no-key", rec(5, None, "x"), None, -1, 40, T),
    ("older-than-the-latest", rec(5, "a", "x"), None, 9, 40, T),
    ("the-latest", rec(9, "a", "x"), None, 9, 40, T),
    ("key-not-in-map", rec(9, "z", "x"), None, -1, 40, T),
    ("tombstone-no-horizon-yet", rec(9, "a", None), None, 9, 40, T),
    ("tombstone-before-horizon", rec(9, "a", None), T + 1000, 9, 40, T),
    ("tombstone-at-horizon", rec(9, "a", None), T, 9, 40, T),
    ("tombstone-after-horizon", rec(9, "a", None), T - 1, 9, 40, T),
    ("old-tombstone", rec(3, "a", None), None, 9, 40, T),
]


@task("ex07.1", points=6)
@pytest.mark.parametrize("record, horizon, latest, map_latest, now", [v[1:] for v in RETAIN_VECTORS],
                         ids=[v[0] for v in RETAIN_VECTORS])
def test_should_retain_record_vectors(learner, record, horizon, latest, map_latest, now):
    args = (record, horizon, latest, map_latest, now)
    expect_equal(learner.should_retain_record(*args), should_retain_record(*args),
                 call=f"should_retain_record({record!r}, batch_delete_horizon={horizon}, "
                      f"latest_offset_for_key={latest}, map_latest_offset={map_latest}, now={now})",
                 mistakes=retain_mistakes(*args))


@task("ex07.1", points=4)
@PROPERTY
@given(st.integers(0, 100), st.one_of(st.none(), st.sampled_from([b"a", b"b"])),
       st.one_of(st.none(), st.just(b"v")), st.one_of(st.none(), st.integers(T - 50, T + 50)),
       st.integers(-1, 100), st.integers(-1, 100))
def test_should_retain_record_matches_the_engine(learner, offset, key, value, horizon, latest, map_latest):
    record = Record(key, value, T, offset=offset)
    args = (record, horizon, latest, map_latest, T)
    expect_equal(learner.should_retain_record(*args), should_retain_record(*args),
                 call=f"should_retain_record({record!r}, batch_delete_horizon={horizon}, "
                      f"latest_offset_for_key={latest}, map_latest_offset={map_latest}, now={T})",
                 mistakes=retain_mistakes(*args))


# ------------------------------------------------------------------ ex07.2 group_segments_by_size
class FakeSegment(SimpleNamespace):
    def __repr__(self) -> str:
        return (f"Seg(base={self.base_offset}, size={self.size}, index={self.offset_index.size_in_bytes}, "
                f"timeindex={self.time_index.size_in_bytes})")


def fake(base, size, index=0, timeindex=0):
    return FakeSegment(base_offset=base, size=size, offset_index=SimpleNamespace(size_in_bytes=index),
                       time_index=SimpleNamespace(size_in_bytes=timeindex))


def grouped(groups):
    return [[s.base_offset for s in g] for g in groups]


def _group_variant(segments, max_size, max_index, first_uncleanable, *, strict=False, no_index=False):
    groups, segs = [], list(segments)
    while segs:
        group = [segs.pop(0)]
        size, idx, tidx = group[0].size, group[0].offset_index.size_in_bytes, group[0].time_index.size_in_bytes
        while segs:
            n = segs[0]
            fits = (size + n.size < max_size) if strict else (size + n.size <= max_size)
            if not no_index:
                fits = fits and idx + n.offset_index.size_in_bytes <= max_index and \
                    tidx + n.time_index.size_in_bytes <= max_index
            if not fits:
                break
            group.append(segs.pop(0))
            size += n.size
            idx += n.offset_index.size_in_bytes
            tidx += n.time_index.size_in_bytes
        groups.append(group)
    return grouped(groups)


def group_mistakes(*args):
    return [("< instead of <=: a group may reach exactly segment.bytes", _group_variant(*args, strict=True)),
            ("the indexes must fit too: the group's .index bytes and .timeindex bytes each ≤ segment.index.bytes",
             _group_variant(*args, no_index=True))]


GROUP_VECTORS = [
    ("all-fit", [fake(0, 100), fake(10, 100), fake(20, 100)], 1000, 1000, 30),
    ("exactly-full", [fake(0, 500), fake(10, 500), fake(20, 1)], 1000, 1000, 30),
    ("split-by-size", [fake(0, 600), fake(10, 300), fake(20, 300), fake(30, 900)], 1000, 1000, 40),
    ("split-by-index", [fake(0, 10, 600), fake(10, 10, 600), fake(20, 10, 100)], 1000, 1000, 30),
    ("split-by-time-index", [fake(0, 10, 0, 700), fake(10, 10, 0, 400)], 1000, 1000, 30),
    ("one-big-segment-alone", [fake(0, 5000), fake(10, 10)], 1000, 1000, 20),
    ("empty-segments-join", [fake(0, 1000), fake(10, 0), fake(20, 0)], 1000, 1000, 30),
]


@task("ex07.2", points=5)
@pytest.mark.parametrize("segments, max_size, max_index, first_uncleanable", [v[1:] for v in GROUP_VECTORS],
                         ids=[v[0] for v in GROUP_VECTORS])
def test_group_segments_by_size_vectors(learner, segments, max_size, max_index, first_uncleanable):
    args = (segments, max_size, max_index, first_uncleanable)
    expect_equal(grouped(learner.group_segments_by_size(list(segments), max_size, max_index, first_uncleanable)),
                 grouped(group_segments_by_size(*args)),
                 call=f"group_segments_by_size({segments!r}, max_size={max_size}, max_index_size={max_index}, "
                      f"first_uncleanable_offset={first_uncleanable})", mistakes=group_mistakes(*args))


@task("ex07.2", points=5)
@PROPERTY
@given(st.lists(st.tuples(st.integers(0, 700), st.integers(0, 400), st.integers(0, 400)), min_size=1, max_size=12),
       st.integers(100, 1500), st.integers(100, 1000))
def test_group_segments_by_size_matches_the_engine(learner, shape, max_size, max_index):
    segments = [fake(i * 100, s, a, b) for i, (s, a, b) in enumerate(shape)]
    args = (segments, max_size, max_index, len(segments) * 100)
    expect_equal(grouped(learner.group_segments_by_size(list(segments), max_size, max_index, len(segments) * 100)),
                 grouped(group_segments_by_size(*args)),
                 call=f"group_segments_by_size({segments!r}, max_size={max_size}, max_index_size={max_index}, "
                      f"first_uncleanable_offset={len(segments) * 100})", mistakes=group_mistakes(*args))


# ------------------------------------------------------------------ ex07.3 compact
def engine_compact(records: list[Record]) -> list[tuple]:
    """Append the records to a real log (one batch each), roll, clean once; what is left."""
    d = scratch_dir()
    try:
        clock = ManualClock(T)
        # cleanup.policy stays "delete" so records without a key can be appended (a compacted
        # topic refuses them); clean_log compacts whatever the policy
        log = Log.open(os.path.join(d, "topic-0"), LogConfig(), clock)
        for r in records:
            log.append([Record(r.key, r.value, r.timestamp)])
        log.roll()
        LogCleaner(d, clock).clean_log(log)
        kept = [(r.offset, r.key, r.value) for r in log.records()]
        log.close()
        return kept
    finally:
        shutil.rmtree(d, ignore_errors=True)


def triples(result):
    return [(r.offset, r.key, r.value) for r in result]


def _compact_variant(records, *, first=False, drop_tombstones=False, keep_unkeyed=False):
    latest = {}
    for r in records:
        if r.key is not None and (not first or r.key not in latest):
            latest[r.key] = r.offset
    out = []
    for r in records:
        if r.key is None:
            if keep_unkeyed:
                out.append(r)
            continue
        if latest[r.key] == r.offset and not (drop_tombstones and r.value is None):
            out.append(r)
    return triples(out)


def compact_mistakes(records):
    return [("this keeps the *first* record of each key; compaction keeps the latest",
             _compact_variant(records, first=True)),
            ("the first cleaning keeps a tombstone (it only gets a delete horizon); it goes in a later "
             "cleaning, after delete.retention.ms", _compact_variant(records, drop_tombstones=True)),
            ("records without a key are dropped", _compact_variant(records, keep_unkeyed=True))]


def records_from(spec):
    return [rec(i, k, v) for i, (k, v) in enumerate(spec)]


COMPACT_VECTORS = [
    ("latest-per-key", [("a", "1"), ("b", "1"), ("a", "2"), ("c", "1"), ("b", "2")]),
    ("kafka-partial-example", [("0", "x"), ("1", "x"), ("0", "y"), ("1", "y"), ("0", "z")]),
    ("tombstone-kept-first-time", [("a", "1"), ("b", "1"), ("a", None)]),
    ("deleted-then-recreated", [("a", "1"), ("a", None), ("a", "3")]),
    ("unkeyed-records-dropped", [("a", "1"), (None, "x"), ("a", "2")]),
    ("one-key-many-times", [("k", str(i)) for i in range(8)]),
    ("nothing-to-drop", [("a", "1"), ("b", "2"), ("c", "3")]),
]


@task("ex07.3", points=6)
@pytest.mark.parametrize("spec", [v[1] for v in COMPACT_VECTORS], ids=[v[0] for v in COMPACT_VECTORS])
def test_compact_vectors(learner, spec):
    records = records_from(spec)
    expect_equal(triples(learner.compact(list(records)) or []), engine_compact(records),
                 call=f"compact({[(r.offset, r.key, r.value) for r in records]!r})",
                 mistakes=compact_mistakes(records))


@task("ex07.3", points=4)
@settings(PROPERTY, max_examples=25)
@given(st.lists(st.tuples(st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d"])),
                          st.one_of(st.none(), st.sampled_from(["1", "2", "3"]))), min_size=1, max_size=15))
def test_compact_matches_the_engine_cleaner(learner, spec):
    records = records_from(spec)
    expect_equal(triples(learner.compact(list(records)) or []), engine_compact(records),
                 call=f"compact({[(r.offset, r.key, r.value) for r in records]!r})",
                 mistakes=compact_mistakes(records))


# ------------------------------------------------------------------ ex07.4 choose_filthiest
from kstore.cleaner import CleanableLog, choose_filthiest  # noqa: E402


def filthiest_mistakes(logs):
    def pick(ratio, eligible, key=None):
        best, best_key = None, None
        for log in logs:
            total = log.clean_bytes + log.cleanable_bytes
            if total == 0:
                continue
            r = ratio(log, total)
            k = r if key is None else key(log)
            if eligible(log, r) and (best_key is None or k > best_key):
                best, best_key = log.name, k
        return best

    def kafka_ok(log, r):
        return r > log.min_cleanable_ratio or (log.needs_compaction_now and log.cleanable_bytes > 0)
    share = lambda log, total: log.cleanable_bytes / total  # noqa: E731
    against_clean = lambda log, total: (log.cleanable_bytes / log.clean_bytes  # noqa: E731
                                        if log.clean_bytes else float("inf"))
    return [("a ratio equal to min.cleanable.dirty.ratio does not qualify: the ratio must be strictly greater",
             pick(share, lambda log, r: r >= log.min_cleanable_ratio
                  or (log.needs_compaction_now and log.cleanable_bytes > 0))),
            ("the dirty ratio is cleanable / (clean + cleanable), the dirty share of the whole log, not "
             "cleanable / clean", pick(against_clean, lambda log, r: r > log.min_cleanable_ratio
                                      or (log.needs_compaction_now and log.cleanable_bytes > 0))),
            ("the cleaner picks the highest dirty *ratio*, not the log with the most dirty bytes",
             pick(share, kafka_ok, key=lambda log: log.cleanable_bytes)),
            ("a log that max.compaction.lag.ms says must be compacted now is cleaned whatever its ratio "
             "(if it has cleanable bytes)", pick(share, lambda log, r: r > log.min_cleanable_ratio))]


def L(name, clean, cleanable, ratio=0.5, now=False):
    return CleanableLog(name, clean, cleanable, ratio, now)


FILTHIEST_VECTORS = [
    ("dirtiest of two eligible", [L("a-0", 100, 300), L("b-0", 100, 900)]),
    ("ratio exactly 0.5 does not qualify", [L("a-0", 500, 500)]),
    ("ratio, not dirty bytes", [L("big-0", 9000, 10000), L("small-0", 10, 90)]),
    ("ratio over the whole log", [L("a-0", 400, 600, 0.55), L("b-0", 0, 100, 0.99)]),
    ("max.compaction.lag.ms forces a clean", [L("a-0", 900, 100, 0.5, True), L("b-0", 900, 0, 0.5, True)]),
    ("an empty log is skipped", [L("empty-0", 0, 0, 0.0, True)]),
    ("per-log min.cleanable.dirty.ratio", [L("a-0", 100, 900, 0.95), L("b-0", 300, 700, 0.1)]),
    ("nothing qualifies", [L("a-0", 800, 200), L("b-0", 600, 400)]),
]


@task("ex07.4", points=6)
@pytest.mark.parametrize("logs", [v[1] for v in FILTHIEST_VECTORS], ids=[v[0] for v in FILTHIEST_VECTORS])
def test_choose_filthiest_vectors(learner, logs):
    expect_equal(learner.choose_filthiest(list(logs)), choose_filthiest(list(logs)),
                 call=f"choose_filthiest({list(logs)})", mistakes=filthiest_mistakes(logs))


LOGS = st.lists(st.builds(CleanableLog, st.sampled_from(["a-0", "b-0", "c-1", "d-2"]), st.integers(0, 1000),
                          st.integers(0, 1000), st.sampled_from([0.0, 0.1, 0.5, 0.75, 0.9]), st.booleans()),
                max_size=5, unique_by=lambda log: log.name)


@task("ex07.4", points=4)
@PROPERTY
@given(LOGS)
def test_choose_filthiest_matches_the_cleaner_manager(learner, logs):
    expect_equal(learner.choose_filthiest(list(logs)), choose_filthiest(list(logs)),
                 call=f"choose_filthiest({logs})", mistakes=filthiest_mistakes(logs))

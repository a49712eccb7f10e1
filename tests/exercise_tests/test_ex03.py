"""Exercise 03 — segment file names (§3.2), the time a segment has waited (§4.1) and the roll
decision (`LogSegment.shouldRoll`, §4.1). Compared with kstore.segment."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

from kstore.grading.feedback import expect_equal
from kstore.grading.testing import PROPERTY, expect_raises, extra, task
from kstore.segment import LogSegment, RollParams, filename_prefix_from_offset, offset_from_file_name

SUFFIXES = [".log", ".index", ".timeindex", ".txnindex", ".snapshot", ".log.deleted", ".index.swap",
            ".log.cleaned"]


# ------------------------------------------------------------------ ex03.1 names
NAME_VECTORS = [(0, ".log"), (42, ".index"), (1_000_000, ".timeindex"), (2**31, ".log.deleted"),
                (2**63 - 1, ".log")]


def name_mistakes(offset, suffix):
    return [("the number must be padded to 20 digits, not 19", f"{offset:019d}{suffix}"),
            ("the offset needs zero-padding to 20 digits (f\"{offset:020d}\")", f"{offset}{suffix}"),
            ("padded with spaces instead of zeros", f"{offset:20d}{suffix}"),
            ("the suffix is missing", f"{offset:020d}")]


@task("ex03.1", points=3)
@pytest.mark.parametrize("offset, suffix", NAME_VECTORS, ids=[f"{o}{s}" for o, s in NAME_VECTORS])
def test_segment_file_name_vectors(learner, offset, suffix):
    expected = filename_prefix_from_offset(offset) + suffix
    expect_equal(learner.segment_file_name(offset, suffix), expected,
                 call=f"segment_file_name({offset}, {suffix!r})", mistakes=name_mistakes(offset, suffix))


PARSE_VECTORS = ["00000000000000000000.log", "00000000000000000042.index",
                 "00000000000000001000.timeindex.cleaned", "00000000000000000170.log.deleted",
                 "09223372036854775807.snapshot"]


@task("ex03.1", points=3)
@pytest.mark.parametrize("name", PARSE_VECTORS)
def test_base_offset_from_file_name_vectors(learner, name):
    expect_equal(learner.base_offset_from_file_name(name), offset_from_file_name(name),
                 call=f"base_offset_from_file_name({name!r})",
                 mistakes=[("the offset is the text before the *first* '.', as an int (a name can "
                            "have two suffixes)", lambda a: isinstance(a, str))])


@task("ex03.1", points=3)
@PROPERTY
@given(st.integers(0, 2**63 - 1), st.sampled_from(SUFFIXES))
def test_names_match_the_engine_and_round_trip(learner, offset, suffix):
    name = learner.segment_file_name(offset, suffix)
    expect_equal(name, filename_prefix_from_offset(offset) + suffix,
                 call=f"segment_file_name({offset}, {suffix!r})", mistakes=name_mistakes(offset, suffix))
    expect_equal(learner.base_offset_from_file_name(name), offset,
                 call=f"base_offset_from_file_name({name!r})")


@task("ex03.1", points=1)
@extra
@pytest.mark.parametrize("bad", ["orders-0", "leader-epoch-checkpoint", ".log", "abc.log"])
def test_extra_base_offset_from_file_name_rejects_other_files(learner, bad):
    expect_raises(learner.base_offset_from_file_name, (bad,), call=f"base_offset_from_file_name({bad!r})",
                  what="ValueError: not a segment file name", exceptions=(ValueError,))


# ------------------------------------------------------------------ ex03.2 time waited
def engine_time_waited(rolling, max_ts, created, now):
    fake = SimpleNamespace(rolling_based_timestamp=rolling, created_ms=created,
                           _load_first_batch_timestamp=lambda: None)
    return LogSegment.time_waited_for_roll(fake, now, max_ts)


T = 1_700_000_000_000
WAIT_VECTORS = [("by-record-timestamps", T, T + 90_000, T - 5_000, T + 1_000),
                ("no-timestamps-wall-clock", -1, -1, T, T + 60_000),
                ("empty-segment-wall-clock", None, T + 90_000, T, T + 30_000),
                ("old-records-new-clock", T - 7 * 86_400_000, T, T - 1000, T),
                ("timestamps-going-backwards", T, T - 10_000, T - 5_000, T)]


def wait_mistakes(rolling, max_ts, created, now):
    return [("always by the wall clock (now − created); with record timestamps Kafka uses them: "
             "max timestamp of the append − the segment's first timestamp", now - created),
            ("always by record timestamps; a segment without timestamps (None or −1) waits by the "
             "wall clock: now − created", max_ts - (rolling if rolling is not None else 0)),
            ("now − first timestamp; Kafka compares the incoming append's max timestamp",
             now - (rolling or 0))]


@task("ex03.2", points=5)
@pytest.mark.parametrize("rolling, max_ts, created, now", [v[1:] for v in WAIT_VECTORS],
                         ids=[v[0] for v in WAIT_VECTORS])
def test_time_waited_for_roll_vectors(learner, rolling, max_ts, created, now):
    expect_equal(learner.time_waited_for_roll(rolling, max_ts, created, now),
                 engine_time_waited(rolling, max_ts, created, now),
                 call=f"time_waited_for_roll(rolling_based_timestamp={rolling}, max_timestamp_in_messages="
                      f"{max_ts}, created_ms={created}, now={now})",
                 mistakes=wait_mistakes(rolling, max_ts, created, now))


@task("ex03.2", points=5)
@PROPERTY
@given(st.one_of(st.none(), st.integers(-1, 2**42)), st.integers(-1, 2**42), st.integers(0, 2**42),
       st.integers(0, 2**42))
def test_time_waited_for_roll_matches_the_engine(learner, rolling, max_ts, created, now):
    expect_equal(learner.time_waited_for_roll(rolling, max_ts, created, now),
                 engine_time_waited(rolling, max_ts, created, now),
                 call=f"time_waited_for_roll({rolling}, {max_ts}, {created}, {now})",
                 mistakes=wait_mistakes(rolling, max_ts, created, now))


# ------------------------------------------------------------------ ex03.3 should_roll
def engine_should_roll(size, messages_size, segment_bytes, time_waited_ms, segment_ms, index_full,
                       base_offset, max_offset_in_messages):
    fake = SimpleNamespace(size=size, roll_jitter_ms=0, base_offset=base_offset,
                           time_waited_for_roll=lambda now, ts: time_waited_ms,
                           offset_index=SimpleNamespace(is_full=lambda: index_full),
                           time_index=SimpleNamespace(is_full=lambda: False))
    fake.can_convert_to_relative_offset = lambda o: LogSegment.can_convert_to_relative_offset(fake, o)
    params = RollParams(segment_ms, segment_bytes, 0, max_offset_in_messages, messages_size, 0)
    return LogSegment.should_roll(fake, params)


def _variant(size, messages_size, segment_bytes, waited, segment_ms, index_full, base, max_off, *,
             ge=False, empty_time=False, no_overflow=False, no_index=False):
    full = size >= segment_bytes - messages_size if ge else size > segment_bytes - messages_size
    timed = (empty_time or size > 0) and waited > segment_ms
    overflow = not no_overflow and not 0 <= max_off - base <= 2**31 - 1
    return full or timed or (index_full and not no_index) or overflow


def roll_mistakes(*args):
    return [(">= instead of >: roll when size > segment.bytes − messages_size (an append that "
             "exactly fills the segment still fits)", _variant(*args, ge=True)),
            ("an empty segment never rolls for time: check size > 0", _variant(*args, empty_time=True)),
            ("a full offset index must roll the segment", _variant(*args, no_index=True)),
            ("the append's last offset must fit in the segment: last − base in [0, 2**31 − 1]",
             _variant(*args, no_overflow=True))]


MB = 1024 * 1024
ROLL_VECTORS = [
    ("fits-exactly", (1000, 24, 1024, 0, 60_000, False, 0, 10), False),
    ("one-byte-too-many", (1000, 25, 1024, 0, 60_000, False, 0, 10), True),
    ("empty-segment-big-append", (0, 2000, 1024, 0, 60_000, False, 0, 10), True),
    ("waited-longer-than-segment-ms", (10, 10, MB, 60_001, 60_000, False, 0, 10), True),
    ("waited-exactly-segment-ms", (10, 10, MB, 60_000, 60_000, False, 0, 10), False),
    ("empty-segment-never-rolls-for-time", (0, 10, MB, 10**9, 60_000, False, 0, 10), False),
    ("offset-index-full", (10, 10, MB, 0, 60_000, True, 0, 10), True),
    ("relative-offset-overflow", (10, 10, MB, 0, 60_000, False, 100, 100 + 2**31), True),
    ("relative-offset-largest-ok", (10, 10, MB, 0, 60_000, False, 100, 100 + 2**31 - 1), False),
    ("nothing-to-do", (500, 100, MB, 1000, 60_000, False, 0, 10), False),
]
ROLL_ARGS = "size, messages_size, segment_bytes, time_waited_ms, segment_ms, index_full, base_offset, max_offset_in_messages"


@task("ex03.3", points=6)
@pytest.mark.parametrize("args, expected", [v[1:] for v in ROLL_VECTORS], ids=[v[0] for v in ROLL_VECTORS])
def test_should_roll_vectors(learner, args, expected):
    assert engine_should_roll(*args) == expected
    expect_equal(learner.should_roll(*args), expected,
                 call="should_roll(" + ", ".join(f"{n}={v}" for n, v in zip(ROLL_ARGS.split(", "), args)) + ")",
                 mistakes=roll_mistakes(*args))


@task("ex03.3", points=4)
@PROPERTY
@given(st.integers(-3, 3), st.integers(1, 3000), st.integers(100, 5000), st.integers(-3, 3),
       st.integers(1, 10_000), st.booleans(), st.integers(0, 2**40), st.integers(-3, 3))
def test_should_roll_matches_the_engine(learner, size_delta, messages_size, segment_bytes, waited_delta,
                                        segment_ms, index_full, base, rel_delta):
    # around every boundary: size vs segment.bytes − messages_size, waited vs segment.ms, 2**31 − 1
    size = 0 if size_delta == -3 else max(0, segment_bytes - messages_size + size_delta)   # −3: empty
    waited = max(0, segment_ms + waited_delta)
    rel = (2**31 - 1 + rel_delta) if rel_delta > 0 else rel_delta * 1000 + 5
    args = (size, messages_size, segment_bytes, waited, segment_ms, index_full, base, base + rel)
    expect_equal(learner.should_roll(*args), engine_should_roll(*args),
                 call="should_roll(" + ", ".join(f"{n}={v}" for n, v in zip(ROLL_ARGS.split(", "), args)) + ")",
                 mistakes=roll_mistakes(*args))

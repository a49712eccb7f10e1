"""Exercise 10 — leader epochs: the epoch cache's end offset for an epoch
(`LeaderEpochFileCache.endOffsetFor`, §10.2) and the follower's truncation point
(`getOffsetTruncationState`, §10.4). Compared with kstore.leader_epoch and kstore.replica_fetcher."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from kstore.grading.feedback import expect_equal
from kstore.grading.testing import PROPERTY, task
from kstore.leader_epoch import EpochEntry, LeaderEpochFileCache
from kstore.replica_fetcher import truncation_offset as engine_truncation


def engine_end_offset(entries, epoch, leo):
    cache = LeaderEpochFileCache(None)
    cache._entries = [EpochEntry(e, o) for e, o in entries]
    return cache.end_offset_for(epoch, leo)


def end_offset_mistakes(entries, epoch, leo):
    own = [o for e, o in entries if e == epoch]
    lower = [e for e, _ in entries if e <= epoch]
    higher = [o for e, o in entries if e > epoch]
    latest = entries[-1][0] if entries else None
    return [("this is where the requested epoch *starts*; the answer is where it *ends*: the start "
             "offset of the first epoch above it", (epoch, own[0]) if own and epoch != latest else object()),
            ("for the latest epoch the end offset is the log end offset (the epoch is still going)",
             (epoch, own[0]) if own and epoch == latest else object()),
            ("answer with the largest epoch ≤ the requested one (the leader may not know the requested "
             "epoch), not the requested epoch itself",
             (epoch, higher[0]) if lower and lower[-1] != epoch and higher else object())]


E1 = [(0, 10), (2, 13), (4, 17)]
E2 = [(5, 11), (6, 12), (7, 13)]
END_VECTORS = [("epoch-1-not-in-cache", E1, 1, 20), ("epoch-2", E1, 2, 20), ("epoch-3-between", E1, 3, 20),
               ("latest-epoch-ends-at-leo", E1, 4, 20), ("above-latest", E1, 5, 20),
               ("undefined-epoch", E1, -1, 20), ("below-every-epoch", E2, 4, 20), ("empty-cache", [], 0, 0),
               ("first-epoch", E1, 0, 20)]
EXPECTED_END = {"epoch-1-not-in-cache": (0, 13), "epoch-2": (2, 17), "epoch-3-between": (2, 17),
                "latest-epoch-ends-at-leo": (4, 20), "below-every-epoch": (4, 11)}


@task("ex10.1", points=6)
@pytest.mark.parametrize("name, entries, epoch, leo", END_VECTORS, ids=[v[0] for v in END_VECTORS])
def test_end_offset_for_vectors(learner, name, entries, epoch, leo):
    expected = engine_end_offset(entries, epoch, leo)
    assert EXPECTED_END.get(name, expected) == expected
    expect_equal(learner.end_offset_for(list(entries), epoch, leo), expected,
                 call=f"end_offset_for({entries!r}, requested_epoch={epoch}, log_end_offset={leo})",
                 mistakes=end_offset_mistakes(entries, epoch, leo), normalize=tuple)


EPOCHS = st.lists(st.tuples(st.integers(1, 3), st.integers(0, 20)), max_size=6).map(
    lambda steps: [(sum(s[0] for s in steps[:i + 1]) - 1, sum(s[1] + 1 for s in steps[:i + 1]) - 1)
                   for i in range(len(steps))])


@task("ex10.1", points=4)
@PROPERTY
@given(EPOCHS, st.integers(-1, 20), st.integers(0, 30))
def test_end_offset_for_matches_the_engine(learner, entries, epoch, extra_leo):
    leo = (entries[-1][1] if entries else 0) + extra_leo
    expect_equal(learner.end_offset_for(list(entries), epoch, leo), engine_end_offset(entries, epoch, leo),
                 call=f"end_offset_for({entries!r}, requested_epoch={epoch}, log_end_offset={leo})",
                 mistakes=end_offset_mistakes(entries, epoch, leo), normalize=tuple)


# ------------------------------------------------------------------ ex10.2 truncation_offset
def truncation_mistakes(args):
    epoch, end, own, leo, hw = args
    return [("this truncates to the high watermark — the rule before KIP-101, which loses acknowledged "
             "records (the follower's HW lags the leader's); with epochs, truncate to min(leader's end "
             "offset, own end offset for that epoch, own LEO)", (hw, True)),
            ("the follower does not have the leader's epoch: cut to its own end offset for the epoch "
             "below and ask again (done = False)",
             (min(own[1], leo), True) if own and own[0] not in (-1, epoch) else object()),
            ("never truncate beyond the follower's own LEO (a min with log_end_offset is missing)",
             lambda a: isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], int) and a[0] > leo)]


TRUNC_VECTORS = [
    ("kip-101-scenario-1-keep-acked-record", (0, 2, (0, 2), 2, 1)),
    ("kip-101-scenario-2-remove-diverged-record", (0, 1, (0, 2), 2, 2)),
    ("leader-ahead-of-follower", (3, 50, (3, 40), 40, 30)),
    ("leader-knows-no-epochs", (-1, -1, None, 9, 4)),
    ("old-protocol-no-epoch-in-answer", (-1, 7, None, 9, 4)),
    ("follower-lacks-the-epoch-ask-again", (2, 13, (1, 5), 15, 3)),
    ("follower-has-no-epochs-at-or-below", (4, 11, (-1, -1), 12, 10)),
    ("own-end-below-leader-end", (5, 100, (5, 80), 90, 60)),
]


@task("ex10.2", points=6)
@pytest.mark.parametrize("args", [v[1] for v in TRUNC_VECTORS], ids=[v[0] for v in TRUNC_VECTORS])
def test_truncation_offset_vectors(learner, args):
    expect_equal(learner.truncation_offset(*args), engine_truncation(*args),
                 call="truncation_offset(leader_epoch={}, leader_end_offset={}, own_end_offset_for_epoch={}, "
                      "log_end_offset={}, high_watermark={})".format(*args),
                 mistakes=truncation_mistakes(args), normalize=lambda r: tuple(r) if isinstance(r, list) else r)


@task("ex10.2", points=4)
@PROPERTY
@given(st.integers(-1, 6), st.integers(-1, 100), st.one_of(st.none(), st.tuples(st.integers(-1, 6), st.integers(-1, 100))),
       st.integers(0, 100), st.integers(0, 100))
def test_truncation_offset_matches_the_engine(learner, epoch, end, own, leo, hw):
    if end == -1 and epoch != -1:
        end = 0
    hw = min(hw, leo)
    args = (epoch, end, own, leo, hw)
    expect_equal(learner.truncation_offset(*args), engine_truncation(*args),
                 call="truncation_offset({}, {}, {}, {}, {})".format(*args),
                 mistakes=truncation_mistakes(args), normalize=lambda r: tuple(r) if isinstance(r, list) else r)


# ------------------------------------------------------------------ ex10.3 the election decision
def engine_election(assignment, isr, live, unclean_enabled):
    """(leader, "clean" | "unclean" | "offline"), from the controller's own rule."""
    from kstore.controller import elect_leader
    leader = elect_leader(list(assignment), list(isr), set(live), unclean_enabled)
    if leader is None:
        return (None, "offline")
    return (leader, "clean" if leader in isr else "unclean")


def election_mistakes(assignment, isr, live, unclean_enabled):
    live_isr = [b for b in isr if b in live]
    first_live = next((b for b in assignment if b in live), None)
    return [("the new leader is the first live ISR member in **assignment** order (the replica list), "
             "not the first of the ISR list", (live_isr[0], "clean") if live_isr else object()),
            ("an ISR member that is down cannot lead: only live replicas are candidates",
             (next((b for b in assignment if b in isr), None), "clean")),
            ("unclean.leader.election.enable is false here: with no live ISR member the partition goes "
             "offline (None, 'offline') instead of electing an out-of-sync replica",
             (first_live, "unclean") if not unclean_enabled and not live_isr else object()),
            ("a live ISR member exists, so the election is clean; an out-of-sync replica may lead only when "
             "no ISR member is alive", (first_live, "unclean") if live_isr else object())]


ELECTION_VECTORS = [
    ("leader dies, next ISR member", ([0, 1, 2], [0, 1, 2], {1, 2}, False)),
    ("assignment order, not ISR order", ([2, 0, 1], [0, 1, 2], {0, 1, 2}, False)),
    ("ISR member down, next one", ([0, 1, 2], [0, 2], {1, 2}, False)),
    ("no live ISR member, unclean off → offline", ([0, 1, 2], [0], {1, 2}, False)),
    ("no live ISR member, unclean on → unclean", ([0, 1, 2], [0], {1, 2}, True)),
    ("unclean on but a live ISR member exists", ([0, 1, 2], [2], {1, 2}, True)),
    ("everyone down", ([0, 1, 2], [0, 1, 2], set(), True)),
]


@task("ex10.3", points=6)
@pytest.mark.parametrize("args", [v[1] for v in ELECTION_VECTORS], ids=[v[0] for v in ELECTION_VECTORS])
def test_election_vectors(learner, args):
    assignment, isr, live, unclean = args
    expect_equal(tuple(learner.elect_leader(list(assignment), list(isr), set(live), unclean)),
                 engine_election(*args),
                 call=f"elect_leader({assignment}, {isr}, {sorted(live)}, unclean={unclean})",
                 mistakes=election_mistakes(*args))


@task("ex10.3", points=4)
@PROPERTY
@given(st.permutations([0, 1, 2, 3]), st.permutations([0, 1, 2, 3]), st.integers(1, 4), st.sets(st.integers(0, 3)),
       st.booleans())
def test_election_matches_the_controller(learner, assignment, joined, isr_size, live, unclean):
    isr = list(joined[:isr_size])             # Kafka lists the ISR in the order replicas (re)joined
    expected = engine_election(assignment, isr, live, unclean)
    expect_equal(tuple(learner.elect_leader(list(assignment), list(isr), set(live), unclean)), expected,
                 call=f"elect_leader({assignment}, {isr}, {sorted(live)}, unclean={unclean})",
                 mistakes=election_mistakes(assignment, isr, live, unclean))

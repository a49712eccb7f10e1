"""Exercise 09 — replication: the leader's high watermark over the ISR (§9.3), the follower's HW
(§9.4), "caught up" and joining the ISR (§9.6). Compared with the rules in kstore.partition."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, strategies as st

from kstore import partition as engine
from kstore.grading.feedback import expect_equal
from kstore.grading.testing import PROPERTY, task


def engine_leader_hw(leos: dict[int, int], isr: list[int], min_isr: int):
    leader, *followers = isr
    return engine.leader_high_watermark(leos[leader], [leos[b] for b in followers], len(isr), min_isr, len(leos))


def hw_mistakes(leos, isr, min_isr):
    under = len(isr) < min(min_isr, len(leos))
    return [("the HW is the smallest LEO in the ISR only; this is the smallest over all replicas — a "
             "replica that left the ISR (crashed, or too slow) must not hold the HW back",
             None if under else min(leos.values())),
            ("while the ISR is smaller than min.insync.replicas (capped at the replication factor) the "
             "HW must not move: return None", None if not under else min(leos[b] for b in isr)),
            ("min.insync.replicas is capped at the replication factor: min(min_isr, number of replicas)",
             None if len(isr) >= min(min_isr, len(leos)) and len(isr) < min_isr else object()),
            ("the HW is the *smallest* LEO of the ISR (what every in-sync replica has), not the largest",
             None if under else max(leos[b] for b in isr))]


HW_VECTORS = [
    ("all-in-sync", {0: 10, 1: 10, 2: 10}, [0, 1, 2], 1),
    ("slowest-isr-follower", {0: 10, 1: 7, 2: 9}, [0, 1, 2], 2),
    ("out-of-isr-replica-ignored", {0: 10, 1: 9, 2: 3}, [0, 1], 2),
    ("leader-alone-min-isr-1", {0: 10, 1: 2, 2: 3}, [0], 1),
    ("under-min-isr", {0: 10, 1: 2, 2: 3}, [0], 2),
    ("min-isr-capped-by-replication-factor", {0: 10, 1: 8}, [0, 1], 3),
    ("follower-not-fetched-yet", {0: 5, 1: -1}, [0, 1], 1),
]


@task("ex09.1", points=6)
@pytest.mark.parametrize("leos, isr, min_isr", [v[1:] for v in HW_VECTORS], ids=[v[0] for v in HW_VECTORS])
def test_leader_high_watermark_vectors(learner, leos, isr, min_isr):
    expect_equal(learner.leader_high_watermark(dict(leos), list(isr), min_isr), engine_leader_hw(leos, isr, min_isr),
                 call=f"leader_high_watermark(leos={leos}, isr={isr}, min_insync_replicas={min_isr})",
                 mistakes=hw_mistakes(leos, isr, min_isr))


@task("ex09.1", points=4)
@PROPERTY
@given(st.lists(st.integers(-1, 1000), min_size=1, max_size=5), st.data(), st.integers(1, 5))
def test_leader_high_watermark_matches_the_engine(learner, leo_list, data, min_isr):
    leos = dict(enumerate(leo_list))
    followers = data.draw(st.lists(st.sampled_from(sorted(leos)), unique=True)) if len(leos) > 1 else []
    isr = [0] + [b for b in followers if b != 0]
    expect_equal(learner.leader_high_watermark(dict(leos), list(isr), min_isr), engine_leader_hw(leos, isr, min_isr),
                 call=f"leader_high_watermark(leos={leos}, isr={isr}, min_insync_replicas={min_isr})",
                 mistakes=hw_mistakes(leos, isr, min_isr))


# ------------------------------------------------------------------ ex09.2 follower HW
FOLLOWER_VECTORS = [(10, 12), (10, 7), (0, 5), (5, 5)]


def follower_mistakes(hw, leo):
    return [("a follower cannot have committed more than it has: HW = min(leader's HW, own LEO)", hw),
            ("the follower's HW comes from the leader's HW (in the fetch response), capped by its own LEO",
             leo)]


@task("ex09.2", points=5)
@pytest.mark.parametrize("leader_hw, follower_leo", FOLLOWER_VECTORS,
                         ids=[f"leader-hw-{h}-leo-{l}" for h, l in FOLLOWER_VECTORS])
def test_follower_high_watermark_vectors(learner, leader_hw, follower_leo):
    expect_equal(learner.follower_high_watermark(leader_hw, follower_leo),
                 engine.follower_high_watermark(leader_hw, follower_leo),
                 call=f"follower_high_watermark(leader_hw={leader_hw}, follower_leo={follower_leo})",
                 mistakes=follower_mistakes(leader_hw, follower_leo))


@task("ex09.2", points=5)
@PROPERTY
@given(st.integers(0, 10**12), st.integers(0, 10**12))
def test_follower_high_watermark_matches_the_engine(learner, leader_hw, follower_leo):
    expect_equal(learner.follower_high_watermark(leader_hw, follower_leo),
                 engine.follower_high_watermark(leader_hw, follower_leo),
                 call=f"follower_high_watermark(leader_hw={leader_hw}, follower_leo={follower_leo})",
                 mistakes=follower_mistakes(leader_hw, follower_leo))


# ------------------------------------------------------------------ ex09.3 is_caught_up
T = 1_700_000_000_000
CAUGHT_VECTORS = [("at-the-leader-leo-long-ago", 10, 10, T - 10**6, T, 30000),
                  ("behind-but-recent", 8, 10, T - 29_999, T, 30000),
                  ("behind-exactly-the-lag", 8, 10, T - 30_000, T, 30000),
                  ("behind-too-long", 8, 10, T - 30_001, T, 30000),
                  ("never-caught-up", -1, 10, 0, T, 30000)]


def caught_mistakes(leo, leader_leo, last, now, lag):
    return [("< instead of <=: a follower is caught up while now − last caught-up time ≤ "
             "replica.lag.time.max.ms", leo == leader_leo or now - last < lag),
            ("a follower at the leader's LEO is caught up, however long ago it last caught up",
             now - last <= lag),
            ("a follower behind the leader is still caught up if it was caught up within "
             "replica.lag.time.max.ms", leo == leader_leo)]


@task("ex09.3", points=5)
@pytest.mark.parametrize("args", [v[1:] for v in CAUGHT_VECTORS], ids=[v[0] for v in CAUGHT_VECTORS])
def test_is_caught_up_vectors(learner, args):
    expect_equal(learner.is_caught_up(*args), engine.is_caught_up(*args),
                 call="is_caught_up(follower_leo={}, leader_leo={}, last_caught_up_ms={}, now={}, "
                      "replica_lag_time_max_ms={})".format(*args), mistakes=caught_mistakes(*args))


@task("ex09.3", points=5)
@PROPERTY
@given(st.integers(-1, 50), st.integers(0, 50), st.integers(0, 100_000), st.integers(0, 100_000),
       st.integers(1, 60_000))
def test_is_caught_up_matches_the_engine(learner, leo, leader_leo, last, now, lag):
    assume(leo <= leader_leo)
    args = (leo, leader_leo, last, now, lag)
    expect_equal(learner.is_caught_up(*args), engine.is_caught_up(*args),
                 call="is_caught_up({}, {}, {}, {}, {})".format(*args), mistakes=caught_mistakes(*args))


# ------------------------------------------------------------------ ex09.4 may_join_isr
JOIN_VECTORS = [("caught-up", 10, 10, 4), ("past-the-hw", 11, 10, 4), ("below-the-hw", 9, 10, 4),
                ("at-hw-but-before-the-epoch", 10, 10, 12), ("at-the-epoch-start", 12, 10, 12)]


def join_mistakes(leo, hw, epoch_start):
    return [("the follower must also hold data of the current leader epoch: LEO ≥ the epoch's start "
             "offset (KIP-101: otherwise it may hold a diverging log)", leo >= hw),
            ("> instead of >=: a follower *at* the HW may join", leo > hw and leo >= epoch_start)]


@task("ex09.4", points=5)
@pytest.mark.parametrize("args", [v[1:] for v in JOIN_VECTORS], ids=[v[0] for v in JOIN_VECTORS])
def test_may_join_isr_vectors(learner, args):
    expect_equal(learner.may_join_isr(*args), engine.may_join_isr(*args),
                 call="may_join_isr(follower_leo={}, leader_hw={}, leader_epoch_start_offset={})".format(*args),
                 mistakes=join_mistakes(*args))


@task("ex09.4", points=5)
@PROPERTY
@given(st.integers(0, 100), st.integers(0, 100), st.integers(0, 100))
def test_may_join_isr_matches_the_engine(learner, leo, hw, epoch_start):
    args = (leo, hw, epoch_start)
    expect_equal(learner.may_join_isr(*args), engine.may_join_isr(*args),
                 call="may_join_isr({}, {}, {})".format(*args), mistakes=join_mistakes(*args))


# ------------------------------------------------------------------ ex09.5 classify_batch
from kstore import producer_state as producers   # noqa: E402

MAX = 2**31 - 1


def engine_classify(cached, current_epoch, producer_epoch, first_seq, last_seq):
    entry = None if cached is None else producers.ProducerEntry(0, current_epoch, tuple(
        producers.BatchMetadata(l, lo, lo - fo, 0) for f, l, fo, lo in cached))
    return producers.decide(entry, producer_epoch, first_seq, last_seq)[0]


def wrong_rule(cached, current, epoch, first, last, *, last_only=False, first_seq_only=False,
               dup_ignores_epoch=False, unknown_needs_zero=False, no_wrap=False, gaps_ok=False,
               new_epoch_any_seq=False, no_epoch_check=False, sequence_first=False):
    """The rule with one classic mistake switched on (what such a submission answers)."""
    if cached is None:
        return "APPEND" if first == 0 or not unknown_needs_zero else "OUT_OF_ORDER_SEQUENCE_NUMBER"
    end = cached[-1][1]
    expected = end + 1 if no_wrap or end != MAX else 0
    in_order = first >= expected if gaps_ok else first == expected
    window = cached[-1:] if last_only else cached
    duplicate = (dup_ignores_epoch or epoch == current) and any(
        b[0] == first and (first_seq_only or b[1] == last) for b in window)
    if sequence_first and epoch == current and not in_order:
        return "OUT_OF_ORDER_SEQUENCE_NUMBER"
    if duplicate:
        return "DUPLICATE"
    if epoch < current and not no_epoch_check:
        return "INVALID_PRODUCER_EPOCH"
    if epoch > current:
        return "APPEND" if first == 0 or new_epoch_any_seq else "OUT_OF_ORDER_SEQUENCE_NUMBER"
    return "APPEND" if in_order else "OUT_OF_ORDER_SEQUENCE_NUMBER"


def classify_mistakes(*args):
    return [
        ("a retry can repeat any of the producer's last 5 batches (up to 5 requests in flight), "
         "not only the last one: compare with every cached batch", wrong_rule(*args, last_only=True)),
        ("check for a duplicate before checking the sequence: a retried batch never follows the "
         "last sequence", wrong_rule(*args, sequence_first=True)),
        ("a duplicate repeats the exact sequence range: same first AND last sequence",
         wrong_rule(*args, first_seq_only=True)),
        ("a duplicate is a batch of the same producer epoch; after an epoch bump sequences start "
         "again at 0", wrong_rule(*args, dup_ignores_epoch=True)),
        ("a producer the partition has no state for (expired, or its data deleted) is accepted at "
         "any sequence since KIP-360", wrong_rule(*args, unknown_needs_zero=True)),
        ("sequences wrap: after Int.MaxValue (2147483647) comes 0", wrong_rule(*args, no_wrap=True)),
        ("a gap is an error too: the next sequence must be exactly last + 1",
         wrong_rule(*args, gaps_ok=True)),
        ("a new (higher) epoch must start at sequence 0", wrong_rule(*args, new_epoch_any_seq=True)),
        ("a batch with an epoch below the producer's current one is fenced: "
         "INVALID_PRODUCER_EPOCH", wrong_rule(*args, no_epoch_check=True)),
    ]


B3 = [(0, 4, 100, 104), (5, 9, 110, 114), (10, 11, 120, 121)]   # (first seq, last seq, first offset, last offset)
CLASSIFY_VECTORS = [
    ("next-in-order", B3, 0, 0, 12, 15),
    ("retry-of-the-last-batch", B3, 0, 0, 10, 11),
    ("retry-of-an-older-batch", B3, 0, 0, 5, 9),
    ("gap", B3, 0, 0, 14, 15),
    ("same-first-seq-other-range", B3, 0, 0, 5, 6),
    ("stale-epoch", B3, 2, 1, 12, 12),
    ("new-epoch-from-zero", B3, 0, 1, 0, 4),
    ("new-epoch-not-from-zero", B3, 0, 1, 12, 13),
    ("unknown-producer-any-sequence", None, 0, 0, 17, 18),
    ("unknown-producer-from-zero", None, 0, 3, 0, 0),
    ("wraps-after-int-max", [(MAX - 3, MAX, 7, 10)], 0, 0, 0, 2),
    ("retry-across-the-wrap", [(MAX - 1, 0, 7, 9), (1, 1, 10, 10)], 0, 0, MAX - 1, 0),
]


@task("ex09.5", points=6)
@pytest.mark.parametrize("args", [v[1:] for v in CLASSIFY_VECTORS], ids=[v[0] for v in CLASSIFY_VECTORS])
def test_classify_batch_vectors(learner, args):
    cached, *rest = args
    expect_equal(learner.classify_batch(None if cached is None else [tuple(b) for b in cached], *rest),
                 engine_classify(*args),
                 call="classify_batch(cached={}, current_epoch={}, producer_epoch={}, first_seq={}, "
                      "last_seq={})".format(*args), mistakes=classify_mistakes(*args))


@st.composite
def producer_histories(draw):
    """Up to 5 cached batches in sequence order (maybe across the wrap), and an incoming batch
    that often repeats one of them or follows them."""
    known = draw(st.booleans())
    current = draw(st.integers(0, 3))
    start = draw(st.sampled_from([0, 3, MAX - 6, MAX - 1]))
    cached, seq, offset = [], start, draw(st.integers(0, 1000))
    for _ in range(draw(st.integers(1, 5))):
        n = draw(st.integers(1, 4))
        last = (seq + n - 1) % (MAX + 1)
        cached.append((seq, last, offset, offset + n - 1))
        seq, offset = (last + 1) % (MAX + 1), offset + n
    epoch = draw(st.sampled_from([current, current, current, current - 1, current + 1]))
    kind = draw(st.sampled_from(["repeat", "next", "other"]))
    if kind == "repeat":
        first, last, _, _ = draw(st.sampled_from(cached))
    elif kind == "next":
        first = seq if epoch == current else 0
        last = (first + draw(st.integers(0, 3))) % (MAX + 1)
    else:
        first = draw(st.integers(0, 30))
        last = first + draw(st.integers(0, 3))
    return (cached if known else None), current, epoch, first, last


@task("ex09.5", points=4)
@PROPERTY
@given(producer_histories())
def test_classify_batch_matches_the_engine(learner, case):
    cached, *rest = case
    expect_equal(learner.classify_batch(None if cached is None else list(cached), *rest),
                 engine_classify(*case),
                 call="classify_batch(cached={}, current_epoch={}, producer_epoch={}, first_seq={}, "
                      "last_seq={})".format(*case), mistakes=classify_mistakes(*case))
# ------------------------------------------------------------------ ex09.6 the acks decision
ACKS_OUTCOMES = {engine.ACKS_INVALID, engine.ACKS_REFUSED, engine.ACKS_NO_RESPONSE, engine.ACKS_AT_ONCE,
                 engine.ACKS_WHEN_REPLICATED}


def acks_mistakes(acks, isr_size, min_isr, rf):
    under_min = isr_size < min_isr
    under_effective = isr_size < min(min_isr, rf)
    return [("min.insync.replicas only matters for acks=all (-1): acks=0 and acks=1 never wait for or check "
             "the ISR", engine.ACKS_REFUSED if acks in (0, 1) and under_effective else object()),
            ("acks=1 is answered after the leader's own append, without waiting for the followers",
             engine.ACKS_WHEN_REPLICATED if acks == 1 else object()),
            ("the ISR is compared with min(min.insync.replicas, replication factor): a topic with fewer "
             "replicas than min.insync.replicas still takes acks=all writes",
             engine.ACKS_REFUSED if acks == -1 and under_min and not under_effective else object()),
            ("with too few in-sync replicas an acks=all write is refused (NOT_ENOUGH_REPLICAS) before "
             "anything is written", engine.ACKS_WHEN_REPLICATED if acks == -1 and under_effective else object()),
            ("acks=0 gets no response at all, not an answer after the append",
             engine.ACKS_AT_ONCE if acks == 0 else object()),
            ("only 0, 1 and -1 (all) are legal: anything else is INVALID_REQUIRED_ACKS",
             lambda a: acks not in (0, 1, -1) and a != engine.ACKS_INVALID)]


ACKS_VECTORS = [
    ("acks=0", (0, 3, 2, 3)), ("acks=1", (1, 3, 2, 3)), ("acks=all, ISR full", (-1, 3, 2, 3)),
    ("acks=all, ISR at the minimum", (-1, 2, 2, 3)), ("acks=all, ISR below the minimum", (-1, 1, 2, 3)),
    ("acks=1, ISR below the minimum", (1, 1, 2, 3)), ("acks=0, ISR below the minimum", (0, 1, 3, 3)),
    ("acks=all, min.insync above the replication factor", (-1, 1, 2, 1)),
    ("acks=all, default min.insync.replicas=1", (-1, 1, 1, 3)),
    ("acks=2", (2, 3, 2, 3)), ("acks=-2", (-2, 3, 1, 3)),
]


@task("ex09.6", points=6)
@pytest.mark.parametrize("args", [v[1] for v in ACKS_VECTORS], ids=[v[0] for v in ACKS_VECTORS])
def test_acks_decision_vectors(learner, args):
    expect_equal(learner.acks_decision(*args), engine.acks_decision(*args),
                 call=f"acks_decision{args}", mistakes=acks_mistakes(*args))


@task("ex09.6", points=4)
@PROPERTY
@given(st.sampled_from([0, 1, -1, 2, -2, 100]), st.integers(0, 5), st.integers(1, 5), st.integers(1, 5))
def test_acks_decision_matches_the_leader(learner, acks, isr_size, min_isr, rf):
    assume(isr_size <= rf)
    expected = engine.acks_decision(acks, isr_size, min_isr, rf)
    assert expected in ACKS_OUTCOMES
    expect_equal(learner.acks_decision(acks, isr_size, min_isr, rf), expected,
                 call=f"acks_decision({acks}, {isr_size}, {min_isr}, {rf})",
                 mistakes=acks_mistakes(acks, isr_size, min_isr, rf))


# ------------------------------------------------------------------ ex09.7 what read_committed keeps
from kstore import completed_fetch   # noqa: E402


def wrong_read_committed(batches, aborted, *, from_the_start=False, never_ends=False, markers=False,
                         any_producer=False, unsorted=False):
    """The consumer's rule with one classic mistake switched on (what such a submission answers)."""
    pending = list(aborted) if unsorted else sorted(aborted, key=lambda a: a[1])
    aborting: set[int] = set()
    if from_the_start:
        aborting, pending = {pid for pid, _ in pending}, []
    out = []
    for base, last, pid, kind in batches:
        if pid != -1:
            while pending and pending[0][1] <= last:
                aborting.add(pending.pop(0)[0])
            if kind == "abort" and not never_ends:
                aborting.discard(pid)
            if kind == "txn" and (pid in aborting or (any_producer and aborting)):
                continue
        if kind in ("data", "txn") or (markers and kind in ("commit", "abort")):
            out.append(base)
    return out


def read_committed_mistakes(batches, aborted):
    return [
        ("a producer is aborting only from its aborted transaction's first offset on: a batch whose last "
         "offset is below the entry's first offset belongs to an earlier transaction of that producer",
         wrong_read_committed(batches, aborted, from_the_start=True)),
        ("the producer's ABORT marker ends its aborted transaction: remove it from the aborting set there, "
         "or its next (committed) transaction is lost", wrong_read_committed(batches, aborted, never_ends=True)),
        ("markers (control batches: commit and abort) are never delivered to the application",
         wrong_read_committed(batches, aborted, markers=True)),
        ("only the aborting producer's batches are dropped: compare each batch's producer id with the "
         "aborting set (other producers' transactions interleave with it)",
         wrong_read_committed(batches, aborted, any_producer=True)),
        ("the aborted transactions may come in any order: take them by first offset (Kafka's consumer keeps "
         "them in a priority queue)", wrong_read_committed(batches, aborted, unsorted=True)),
    ]


READ_COMMITTED_VECTORS = [
    ("no-transactions", [(0, 1, -1, "data"), (2, 2, -1, "data")], []),
    ("one-committed", [(0, 1, 5, "txn"), (2, 2, 5, "commit"), (3, 3, -1, "data")], []),
    ("one-aborted", [(0, 1, 5, "txn"), (2, 2, 5, "txn"), (3, 3, 5, "abort"), (4, 4, -1, "data")], [(5, 0)]),
    ("interleaved-producers", [(0, 0, 7, "txn"), (1, 1, 8, "txn"), (2, 2, 7, "txn"), (3, 3, 7, "abort"),
                               (4, 4, 8, "txn"), (5, 5, 8, "commit")], [(7, 0)]),
    ("aborted-then-committed", [(0, 1, 7, "txn"), (2, 2, 8, "txn"), (3, 3, 7, "abort"), (4, 4, 7, "txn"),
                                (5, 5, 7, "commit"), (6, 6, 8, "commit")], [(7, 0)]),
    ("committed-before-the-aborted-one", [(0, 1, 7, "txn"), (2, 2, 7, "commit"), (3, 3, 7, "txn"),
                                          (4, 4, 7, "abort"), (5, 5, -1, "data")], [(7, 3)]),
    ("fetch-starts-inside-an-aborted-transaction", [(10, 11, 7, "txn"), (12, 12, 8, "txn"),
                                                    (13, 13, 7, "abort"), (14, 14, 8, "commit")], [(7, 4)]),
    ("abort-marker-beyond-the-fetch", [(0, 0, 7, "txn"), (1, 1, -1, "data"), (2, 3, 7, "txn")], [(7, 0)]),
    ("listed-out-of-order", [(0, 0, 7, "txn"), (1, 1, 7, "abort"), (2, 2, 8, "txn"), (3, 3, 7, "txn"),
                             (4, 4, 8, "commit"), (5, 5, 7, "abort"), (6, 6, 9, "txn"), (7, 7, 9, "commit")],
     [(7, 3), (7, 0)]),
    ("idempotent-batch-in-between", [(0, 0, 7, "txn"), (1, 2, 3, "data"), (3, 3, 7, "abort")], [(7, 0)]),
    ("aborts-twice-then-commits", [(0, 0, 7, "txn"), (1, 1, 7, "abort"), (2, 2, 7, "txn"), (3, 3, 7, "abort"),
                                   (4, 4, 7, "txn"), (5, 5, 7, "commit")], [(7, 0), (7, 2)]),
    ("markers-only", [(0, 0, 7, "commit"), (1, 1, 8, "abort")], [(8, 1)]),
]


def _call(batches, aborted) -> str:
    return f"read_committed(batches={batches}, aborted={aborted})"


@task("ex09.7", points=6)
@pytest.mark.parametrize("batches, aborted", [v[1:] for v in READ_COMMITTED_VECTORS],
                         ids=[v[0] for v in READ_COMMITTED_VECTORS])
def test_read_committed_vectors(learner, batches, aborted):
    expect_equal(learner.read_committed([tuple(b) for b in batches], [tuple(a) for a in aborted]),
                 completed_fetch.read_committed(batches, aborted), call=_call(batches, aborted),
                 mistakes=read_committed_mistakes(batches, aborted))


@st.composite
def fetched_logs(draw):
    """A partition's batches as three transactional producers, one idempotent producer and plain
    appends wrote them, and a fetch from one of its batches: (batches from there, the aborted
    transactions the broker lists for that fetch, in any order)."""
    batches, entries, open_first = [], [], {}
    offset = 0
    for _ in range(draw(st.integers(1, 25))):
        op = draw(st.sampled_from(["txn", "txn", "end", "end", "data", "idempotent"]))
        pid = draw(st.sampled_from([7, 8, 9]))
        size = draw(st.integers(1, 3))
        if op == "txn":
            batches.append((offset, offset + size - 1, pid, "txn"))
            open_first.setdefault(pid, offset)
            offset += size
        elif op == "end" and pid in open_first:
            commit = draw(st.booleans())
            batches.append((offset, offset, pid, "commit" if commit else "abort"))
            first = open_first.pop(pid)
            if not commit:
                entries.append((pid, first, offset))
            offset += 1
        elif op in ("data", "idempotent"):
            batches.append((offset, offset + size - 1, -1 if op == "data" else 3, "data"))
            offset += size
    if not batches:
        batches.append((0, 0, -1, "data"))
    start = draw(st.integers(0, len(batches) - 1))
    fetched = batches[start:]
    aborted = [(pid, first) for pid, first, last in entries if last >= fetched[0][0]]
    return fetched, draw(st.permutations(aborted))


@task("ex09.7", points=4)
@PROPERTY
@given(fetched_logs())
def test_read_committed_matches_kafkas_consumer(learner, case):
    batches, aborted = case
    expect_equal(learner.read_committed(list(batches), list(aborted)),
                 completed_fetch.read_committed(batches, aborted), call=_call(batches, aborted),
                 mistakes=read_committed_mistakes(batches, aborted))

"""Idempotent producers in the engine: Kafka's ProducerStateManager rules on leader appends, state
rebuilt by followers and from `.snapshot` files, producer.id.expiration.ms, retention.

The wire-level and real-client tests are in test_idempotence.py."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings, strategies as st

from helpers import T0, records
from kstore import LogConfig, Record
from kstore.clock import ManualClock
from kstore.file_records import FileRecords
from kstore.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from kstore.log import Log
from kstore.log_manager import LogManager
from kstore.producer_snapshot import read_snapshot
from kstore.producer_state import (APPEND, DUPLICATE, INVALID_PRODUCER_EPOCH, INT32_MAX,
                                   NUM_BATCHES_TO_RETAIN, OUT_OF_ORDER_SEQUENCE, decide)
from kstore.records import build_batch

PID = 1000


def batch(seq: int, n: int = 2, pid: int = PID, epoch: int = 0, tag: str = "", ts: int = T0) -> bytes:
    recs = [Record(None, f"{tag or 'v'}{i}".encode(), ts + i) for i in range(n)]
    return build_batch(recs, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def values(log: Log) -> list[bytes]:
    return [r.value for r in log.records()]


# ---------------------------------------------------------------- the sequence rules
def test_a_retried_batch_is_not_appended_again_and_gets_its_first_offsets(make_log):
    log = make_log()
    first = log.append_as_leader(batch(0, 3, tag="a"))
    second = log.append_as_leader(batch(3, 2, tag="b"))
    again = log.append_as_leader(batch(0, 3, tag="a"))       # the response for seq 0 was lost
    assert (again.first_offset, again.last_offset, again.duplicate) == (0, 2, True)
    assert (first.duplicate, second.first_offset) == (False, 3)
    assert log.log_end_offset == 5 and values(log) == [b"a0", b"a1", b"a2", b"b0", b"b1"]


def test_only_the_last_five_batches_are_recognised(make_log):
    log = make_log()
    for i in range(NUM_BATCHES_TO_RETAIN + 1):
        log.append_as_leader(batch(i, 1))
    assert log.append_as_leader(batch(1, 1)).duplicate          # batch 1 is one of the last five
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batch(0, 1))                       # batch 0 fell out of the cache
    assert log.log_end_offset == NUM_BATCHES_TO_RETAIN + 1


@pytest.mark.parametrize("seq", [3, 4, 1, 5])
def test_a_gap_or_an_overlap_is_out_of_order(make_log, seq):
    log = make_log()
    log.append_as_leader(batch(0, 2))
    with pytest.raises(OutOfOrderSequenceError, match="out of order sequence number"):
        log.append_as_leader(batch(seq, 2))   # expected 2; 1 overlaps without matching a batch
    assert log.log_end_offset == 2


def test_a_stale_epoch_is_invalid_and_a_new_epoch_starts_at_zero(make_log):
    log = make_log()
    log.append_as_leader(batch(0, 2, epoch=1))
    with pytest.raises(InvalidProducerEpochError, match="smaller than the last seen epoch 1"):
        log.append_as_leader(batch(2, 2, epoch=0))
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batch(2, 2, epoch=2))             # a new epoch must start at 0
    assert log.append_as_leader(batch(0, 2, epoch=2)).first_offset == 2
    assert log.producer_state.get(PID).producer_epoch == 2


def test_an_unknown_producer_is_accepted_at_any_sequence(make_log):
    """KIP-360: state may have expired or gone with its data; the broker accepts the batch."""
    log = make_log()
    assert log.append_as_leader(batch(17, 2)).first_offset == 0
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batch(20, 2))                     # known now: 19 must be next


def test_sequences_wrap_after_int_max(make_log):
    log = make_log()
    log.append_as_leader(batch(INT32_MAX - 1, 2))              # seqs MAX-1, MAX
    assert log.append_as_leader(batch(0, 2)).first_offset == 2
    assert log.append_as_leader(batch(INT32_MAX - 1, 2)).duplicate
    wrapping = build_batch(records(3), producer_id=PID + 1, producer_epoch=0,
                           base_sequence=INT32_MAX)            # MAX, 0, 1 in one batch
    log.append_as_leader(wrapping)
    assert log.append_as_leader(batch(2, 1, pid=PID + 1)).first_offset == 7


def test_producers_are_independent_and_plain_batches_unchecked(make_log):
    log = make_log()
    log.append_as_leader(batch(0, 1, pid=1))
    log.append_as_leader(batch(0, 1, pid=2))
    log.append_as_leader(build_batch(records(1)))
    log.append_as_leader(build_batch(records(1)))              # no producer id: never a duplicate
    assert log.append_as_leader(batch(0, 1, pid=2)).duplicate
    assert log.log_end_offset == 4


def test_followers_apply_without_checks_and_know_the_producers(make_log):
    leader, follower = make_log(name="t-0"), make_log(name="f-0")
    leader.append_as_leader(batch(0, 2, epoch=3))
    leader.append_as_leader(batch(2, 2, epoch=3))
    follower.append_as_follower(b"".join(b.to_bytes() for b in leader.read(0).batches()))
    # the follower becomes leader: the producer's retry is recognised there too
    assert follower.append_as_leader(batch(2, 2, epoch=3)).first_offset == 2
    with pytest.raises(OutOfOrderSequenceError):
        follower.append_as_leader(batch(5, 1, epoch=3))


# ---------------------------------------------------------------- snapshots and restarts
def snapshot_files(log: Log) -> list[str]:
    return sorted(n for n in os.listdir(log.dir) if n.endswith(".snapshot"))


def test_a_snapshot_is_written_at_roll_and_read_like_kafkas(make_log):
    log = make_log()
    log.append_as_leader(batch(0, 3))
    log.roll()
    assert snapshot_files(log) == ["00000000000000000003.snapshot"]
    with open(os.path.join(log.dir, "00000000000000000003.snapshot"), "rb") as f:
        (entry,) = read_snapshot(f.read())
    assert (entry.producer_id, entry.producer_epoch, entry.last_sequence, entry.last_offset,
            entry.offset_delta, entry.timestamp) == (PID, 0, 2, 2, 2, T0 + 2)


def test_an_empty_log_closes_without_a_snapshot(make_log):
    """Kafka's takeSnapshot writes only past the last snapshot's offset, so an empty partition
    (map end offset 0) has no .snapshot file after a clean close; one record later it has."""
    log = make_log()
    log.close()
    assert snapshot_files(log) == []
    log = make_log()
    log.append_as_leader(batch(0, 1))
    log.close()
    assert snapshot_files(log) == ["00000000000000000001.snapshot"]


@pytest.mark.parametrize("clean", [True, False])
def test_state_survives_a_restart(make_log, clean):
    """Clean: the snapshot at the LEO written at close. Killed: the roll's snapshot plus the batch
    headers above it."""
    log = make_log({"segment.bytes": 400})
    for i in range(12):
        log.append_as_leader(batch(2 * i, 2))
    assert log.number_of_segments > 1
    log.flush()
    if clean:
        log.close()
    else:
        log.close_without_flush()
    reopened = make_log({"segment.bytes": 400}, had_clean_shutdown=clean)
    assert reopened.append_as_leader(batch(22, 2)).first_offset == 22     # a retry of the last batch
    assert reopened.append_as_leader(batch(22, 2)).duplicate
    with pytest.raises(OutOfOrderSequenceError):
        reopened.append_as_leader(batch(30, 2))
    if clean:
        assert "00000000000000000024.snapshot" in snapshot_files(reopened)


def test_a_restart_reads_a_segment_from_the_snapshots_offset_not_from_its_start(make_log,
                                                                                monkeypatch):
    """UnifiedLog.rebuildProducerState reads a segment from the snapshot's offset on
    (segment.read, through the offset index): after a crash, only the batch headers above the
    last snapshot are read, however much of the segment lies below it."""
    log = make_log({"index.interval.bytes": 256})              # one segment, indexed densely
    for i in range(200):
        log.append_as_leader(batch(2 * i, 2))
    log.producer_state.take_snapshot(400)
    for i in range(200, 205):
        log.append_as_leader(batch(2 * i, 2))
    log.flush()
    log.close_without_flush()
    reopened = make_log({"index.interval.bytes": 256}, had_clean_shutdown=False)
    assert reopened.number_of_segments == 1
    read = []
    headers = FileRecords.batch_headers

    def counted(self, start=0, end=None):
        for header in headers(self, start, end):
            read.append(header.base_offset)
            yield header
    monkeypatch.setattr(FileRecords, "batch_headers", counted)
    assert reopened.append_as_leader(batch(408, 2)).duplicate   # the last batch, retried
    assert read == [400, 402, 404, 406, 408]                     # nothing below the snapshot
    assert reopened.append_as_leader(batch(410, 2)).first_offset == 410


def two_batches_with_a_roll_between(log: Log) -> Log:
    log.append_as_leader(batch(0, 2))
    log.roll()
    log.append_as_leader(batch(2, 2))
    return log


def test_a_corrupt_snapshot_is_skipped_for_an_older_one(make_log):
    log = two_batches_with_a_roll_between(make_log())
    log.close()
    newest = os.path.join(log.dir, "00000000000000000004.snapshot")
    with open(newest, "r+b") as f:
        f.seek(20)
        f.write(b"\xff\xff")
    reopened = make_log()
    with pytest.raises(OutOfOrderSequenceError):               # rebuilt from the log above 2
        reopened.append_as_leader(batch(6, 1))
    assert reopened.append_as_leader(batch(2, 2)).duplicate
    assert not os.path.exists(newest)                           # deleted when found corrupt


def test_truncation_drops_snapshots_above_and_rebuilds(make_log):
    log = two_batches_with_a_roll_between(make_log())
    log.roll()
    assert snapshot_files(log) == ["00000000000000000002.snapshot", "00000000000000000004.snapshot"]
    log.truncate_to(2)
    assert snapshot_files(log) == ["00000000000000000002.snapshot"]
    assert log.append_as_leader(batch(2, 2)).first_offset == 2   # not a duplicate any more


@pytest.mark.parametrize("clean", [True, False])
def test_retention_keeps_the_state_until_a_restart_without_its_snapshot(tmp_path, clock, clean):
    """Kafka's behaviour: deleting a producer's batches does not remove its state, so its next
    batch is checked as usual, and a clean shutdown's snapshot keeps it. The deleted segments'
    snapshots go (and those at or below the log start offset at load), so after a crash the
    producer is unknown and its next batch is accepted at whatever sequence it has (KIP-360)."""
    config = {"retention.ms": 1000}
    manager = LogManager.open(str(tmp_path), config, clock)
    log = manager.get_or_create_log("t", 0)
    for i in range(4):
        log.append_as_leader(batch(2 * i, 2, ts=clock.milliseconds()))
    log.roll()
    clock.advance(5000)
    log.append_as_leader(build_batch(records(1, ts=clock.milliseconds())))   # someone else's data
    assert manager.run_retention() > 0 and log.log_start_offset == 8
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batch(20, 1))                       # still known: 8 expected
    assert log.append_as_leader(batch(6, 2)).duplicate           # and its last batch recognised
    if clean:
        manager.shutdown()
    else:
        manager.crash()
    manager = LogManager.open(str(tmp_path), config, clock)
    log = manager.get_or_create_log("t", 0)
    if clean:
        assert log.producer_state.get(PID).last_sequence == 7
        with pytest.raises(OutOfOrderSequenceError):
            log.append_as_leader(batch(20, 1))
    else:
        assert log.producer_state.get(PID) is None
        assert log.append_as_leader(batch(20, 1)).first_offset == 9   # unknown: any sequence
    manager.shutdown()


def test_producers_expire_after_producer_id_expiration_ms(tmp_path, clock):
    manager = LogManager.open(str(tmp_path), {}, clock,
                              broker_config={"producer.id.expiration.ms": 60_000,
                                             "producer.id.expiration.check.interval.ms": 10_000,
                                             "log.initial.task.delay.ms": 0})
    log = manager.get_or_create_log("t", 0)
    log.append_as_leader(batch(0, 2, ts=clock.milliseconds()))
    log.append_as_leader(batch(0, 1, pid=7, ts=clock.milliseconds() + 50_000))
    manager.start_producer_expiration()
    clock.advance(59_000)
    manager.scheduler.run_due()
    assert log.producer_state.get(PID) is not None
    clock.advance(11_000)
    manager.scheduler.run_due()
    assert log.producer_state.get(PID) is None and log.producer_state.get(7) is not None
    assert log.append_as_leader(batch(9, 1)).first_offset == 3   # forgotten: any sequence again
    manager.shutdown()


# ---------------------------------------------------------------- property test against a model
class Model:
    """The rules written as plainly as possible: per producer the epoch and the list of
    (first seq, last seq, first offset) of its batches in this epoch; the last five count."""

    def __init__(self):
        self.producers: dict[int, tuple[int, list]] = {}
        self.next_offset = 0

    def append(self, pid, epoch, seq, n):
        last = (seq + n - 1) % (INT32_MAX + 1)
        if pid not in self.producers:
            self.producers[pid] = (epoch, [])
            return self._store(pid, epoch, seq, last, n)
        current, batches = self.producers[pid]
        for first_seq, last_seq, offset in batches[-5:]:
            if epoch == current and (first_seq, last_seq) == (seq, last):
                return ("dup", offset)
        if epoch < current:
            return ("epoch", None)
        if epoch > current:
            return self._store(pid, epoch, seq, last, n, new_epoch=True) if seq == 0 else ("seq", None)
        expected = 0 if not batches or batches[-1][1] == INT32_MAX else batches[-1][1] + 1
        return self._store(pid, epoch, seq, last, n) if seq == expected else ("seq", None)

    def _store(self, pid, epoch, seq, last, n, new_epoch=False):
        _, batches = self.producers[pid]
        batches = [] if new_epoch else batches
        batches.append((seq, last, self.next_offset))
        self.producers[pid] = (epoch, batches)
        offset, self.next_offset = self.next_offset, self.next_offset + n
        return ("ok", offset)


step = st.tuples(st.sampled_from([1, 2]), st.sampled_from([0, 1, 2]),
                 st.sampled_from([0, 1, 2, 3, 4, 5, 6, 8, INT32_MAX - 1, INT32_MAX]),
                 st.integers(1, 3), st.booleans())


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(step, max_size=25))
def test_the_log_follows_the_model(tmp_path_factory, steps):
    """Random appends (often replaying what was sent before, like a retrying producer) give the
    same answers as the model, and a restart from snapshots gives the same answers after it."""
    directory = tmp_path_factory.mktemp("p") / "t-0"
    clock = ManualClock(T0)   # the records' CreateTime: nobody expires during the test
    log = Log.open(str(directory), LogConfig({"segment.bytes": 600}), clock)
    model, sent = Model(), []
    try:
        for i, (pid, epoch, seq, n, replay) in enumerate(steps):
            if replay and sent:
                pid, epoch, seq, n = sent[i % len(sent)]
            sent.append((pid, epoch, seq, n))
            expected = model.append(pid, epoch, seq, n)
            try:
                info = log.append_as_leader(build_batch(records(n), producer_id=pid,
                                                        producer_epoch=epoch, base_sequence=seq))
                got = ("dup" if info.duplicate else "ok", info.first_offset)
            except OutOfOrderSequenceError:
                got = ("seq", None)
            except InvalidProducerEpochError:
                got = ("epoch", None)
            assert got == expected, (steps[:i + 1], model.producers)
            if i % 7 == 6:   # restart now and then: the snapshot keeps only the last batch, so
                log.close()  # the model forgets all but the last one too
                log = Log.open(str(directory), LogConfig({"segment.bytes": 600}), clock,
                               had_clean_shutdown=True)
                for p, (e, b) in model.producers.items():
                    model.producers[p] = (e, b[-1:])
    finally:
        log.close()


@pytest.mark.parametrize("entry_batches,epoch,first,last,outcome", [
    ([(0, 1)], 0, 0, 1, DUPLICATE),
    ([(0, 1)], 0, 2, 3, APPEND),
    ([(0, 1)], 0, 3, 3, OUT_OF_ORDER_SEQUENCE),
    ([(0, 1)], 1, 0, 0, APPEND),
    ([(0, 1)], 1, 5, 5, OUT_OF_ORDER_SEQUENCE),
])
def test_decide_names_the_outcome(entry_batches, epoch, first, last, outcome):
    from kstore.producer_state import BatchMetadata, ProducerEntry
    entry = ProducerEntry(PID, 0, tuple(BatchMetadata(l, l, l - f, T0) for f, l in entry_batches))
    assert decide(entry, epoch, first, last)[0] == outcome
    assert decide(ProducerEntry(PID, 2, ()), 1, 0, 0)[0] == INVALID_PRODUCER_EPOCH
    assert decide(None, 0, 99, 99)[0] == APPEND

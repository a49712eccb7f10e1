"""Retention (cleanup.policy=delete): cases 40–44 of the reference's §12 and Kafka's rules for the
active segment, `.deleted` files, the log start offset and its checkpoint, and the retention task."""

from __future__ import annotations

import os
import time

import pytest

from helpers import T0, records
from kstore import Log, LogConfig, LogManager, ManualClock, SystemClock
from kstore.checkpoint import OffsetCheckpointFile
from kstore.errors import ConfigError, OffsetOutOfRangeError
from kstore.records import build_batch
from kstore.retention import (deletable_segments, log_start_offset_breached,
                              retention_ms_breached, retention_size_breached)


def one(ts: int = T0, i: int = 0) -> bytes:
    return build_batch(records(1, start=i % 10, ts=ts))   # keys k0..k9: every batch has one size


S = len(one())


def fill(log: Log, n: int, ts: int = T0) -> None:
    for i in range(n):
        log.append_as_leader(one(ts, i))


# ---------------------------------------------------------------- pure rules
class Seg:
    def __init__(self, base, size, ts):
        self.base_offset, self.size, self.largest_timestamp = base, size, ts


def test_deletable_segments_is_a_prefix_below_the_high_watermark():
    segs = [Seg(0, 10, 100), Seg(5, 10, 900), Seg(10, 10, 100), Seg(15, 0, -1)]
    old = retention_ms_breached(now_ms=1000, retention_ms=500)
    assert [s.base_offset for s in deletable_segments(segs, old, high_watermark=15, log_end_offset=15)] == [0]
    everything = lambda s, n: True
    assert [s.base_offset for s in deletable_segments(segs, everything, high_watermark=15, log_end_offset=15)] == [0, 5, 10]
    assert [s.base_offset for s in deletable_segments(segs, everything, high_watermark=9, log_end_offset=15)] == [0]


def test_size_rule_is_diff_minus_segment_size_at_least_zero():
    segs = [Seg(0, 5, 0), Seg(5, 5, 0), Seg(10, 5, 0)]
    rule = retention_size_breached(log_size=15, retention_bytes=10)
    assert [s.base_offset for s in deletable_segments(segs, rule, high_watermark=15, log_end_offset=15)] == [0]
    assert retention_size_breached(log_size=15, retention_bytes=16) is None
    assert retention_size_breached(log_size=15, retention_bytes=-1) is None
    assert retention_ms_breached(0, -1) is None
    start = log_start_offset_breached(10)
    assert [s.base_offset for s in deletable_segments(segs, start, high_watermark=15, log_end_offset=15)] == [0, 5]


# ---------------------------------------------------------------- case 40
def test_case_40_nothing_at_or_above_the_high_watermark_is_deleted(tmp_path, clock):
    log = Log.open(str(tmp_path / "t-0"), {"segment.bytes": 5 * S, "retention.ms": 1000}, clock,
                   single_replica=False)
    fill(log, 15)                      # 3 segments: 0, 5, 10
    clock.advance(10_000)              # everything has expired
    log.update_high_watermark(7)
    assert log.delete_old_segments() == 1           # only [0, 5) lies below the HW
    assert (log.log_start_offset, [s.base_offset for s in log.segments]) == (5, [5, 10])
    with pytest.raises(OffsetOutOfRangeError, match="larger than the high watermark 7"):
        log.maybe_increment_log_start_offset(8)
    log.update_high_watermark(15)
    assert log.delete_old_segments() == 2
    assert log.log_start_offset == 15 <= log.high_watermark


# ---------------------------------------------------------------- case 41
@pytest.mark.parametrize("retention_records,remaining", [(10, 2), (15, 3)])
def test_case_41_size_retention(tmp_path, clock, retention_records, remaining):
    log = Log.open(str(tmp_path / "t-0"), {"segment.bytes": 5 * S,
                                           "retention.bytes": retention_records * S}, clock)
    fill(log, 15)
    assert log.number_of_segments == 3
    log.delete_old_segments()
    assert log.number_of_segments == remaining
    assert log.log_start_offset == 5 * (3 - remaining)


# ---------------------------------------------------------------- case 42 + the active segment
def test_case_42_time_retention_deletes_the_expired_active_segment_too(tmp_path):
    clock = ManualClock(T0)
    log = Log.open(str(tmp_path / "t-0"), {"segment.bytes": 5 * S, "retention.ms": 10_000}, clock)
    fill(log, 15, ts=10)                        # records stamped at t = 10 ms: long expired
    assert log.number_of_segments == 3
    assert log.delete_old_segments() == 3
    assert [s.base_offset for s in log.segments] == [15]     # one fresh, empty segment
    assert log.active_segment.size == 0
    assert (log.log_start_offset, log.log_end_offset) == (15, 15)
    info = log.append([("k", "v")])
    assert info.first_offset == 15                            # the offsets go on
    with pytest.raises(OffsetOutOfRangeError, match="starting from offset: 15"):
        log.read(3, 100)


def test_an_empty_active_segment_is_never_deleted(tmp_path):
    clock = ManualClock(T0)
    log = Log.open(str(tmp_path / "t-0"), {"retention.ms": 1}, clock)
    clock.advance(1_000_000)
    assert log.delete_old_segments() == 0
    assert [s.base_offset for s in log.segments] == [0]


def test_time_retention_judges_a_segment_by_its_newest_record(tmp_path, clock):
    log = Log.open(str(tmp_path / "t-0"), {"segment.bytes": 3 * S, "retention.ms": 1000}, clock)
    log.append_as_leader(one(T0 - 5000, 0))
    log.append_as_leader(one(T0 - 5000, 1))
    log.append_as_leader(one(T0 - 10, 2))       # one fresh record keeps the whole segment
    fill(log, 3, ts=T0 - 5000)                 # second segment: old
    assert log.delete_old_segments() == 0       # the first segment stays, so nothing after it goes


# ---------------------------------------------------------------- case 43
def test_case_43_compact_alone_deletes_only_below_the_log_start_offset(tmp_path):
    clock = ManualClock(T0)
    log = Log.open(str(tmp_path / "t-0"), {"segment.bytes": 5 * S, "retention.ms": 1000,
                                           "retention.bytes": S, "cleanup.policy": "compact"}, clock)
    fill(log, 15, ts=10)
    assert log.delete_old_segments() == 0
    log.maybe_increment_log_start_offset(11)     # DeleteRecords-style move
    assert log.delete_old_segments() == 2
    assert [s.base_offset for s in log.segments] == [10]
    assert [r.offset for r in log.records()] == [11, 12, 13, 14]


# ---------------------------------------------------------------- case 44
def test_case_44_deleted_files_wait_for_file_delete_delay(tmp_path):
    clock = ManualClock(T0)
    log = Log.open(str(tmp_path / "t-0"), {"segment.bytes": 5 * S, "retention.ms": 1000,
                                           "file.delete.delay.ms": 60_000}, clock)
    fill(log, 10, ts=10)
    fill(log, 1, ts=T0)
    assert log.delete_old_segments() == 2
    names = sorted(os.listdir(log.dir))
    assert [n for n in names if n.endswith(".deleted")] == sorted(
        f"{b:020d}{e}.deleted" for b in (0, 5) for e in (".index", ".log", ".timeindex"))
    clock.advance(59_999)
    log.scheduler.run_due()
    assert any(n.endswith(".deleted") for n in os.listdir(log.dir))
    clock.advance(1)
    log.scheduler.run_due()
    assert not any(n.endswith(".deleted") for n in os.listdir(log.dir))


def test_deleted_leftovers_are_removed_on_load(tmp_path):
    clock = ManualClock(T0)
    log = Log.open(str(tmp_path / "t-0"), {"segment.bytes": 5 * S, "retention.ms": 1000}, clock)
    fill(log, 10, ts=10)
    fill(log, 1, ts=T0)
    log.delete_old_segments()
    log.close()                                  # the delayed deletions never ran
    assert any(n.endswith(".deleted") for n in os.listdir(log.dir))
    again = Log.open(str(tmp_path / "t-0"), {"segment.bytes": 5 * S}, clock, log_start_offset=10,
                     had_clean_shutdown=True)
    assert not any(n.endswith(".deleted") for n in os.listdir(log.dir))
    assert len(again.load_report.deleted_files) == 6
    assert [r.offset for r in again.records()] == [10]


def test_a_read_in_progress_survives_the_deletion_of_its_segment(tmp_path):
    clock = ManualClock(T0)
    log = Log.open(str(tmp_path / "t-0"), {"segment.bytes": 5 * S, "retention.ms": 1000}, clock)
    fill(log, 10, ts=10)
    fetch = log.read(0, 10 * S)                  # a fetch holds a slice of segment 0 ...
    fill(log, 1, ts=T0)
    log.delete_old_segments()                    # ... which retention now deletes
    assert [b.base_offset for b in fetch.batches()] == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------- log manager: checkpoint, tasks
def test_retention_pass_updates_the_log_start_offset_checkpoint(tmp_path):
    clock = ManualClock(T0)
    manager = LogManager(str(tmp_path), {"segment.bytes": 5 * S, "retention.ms": 1000}, clock)
    log = manager.get_or_create_log("orders", 0)
    fill(log, 10, ts=10)
    fill(log, 2, ts=T0)                          # the active segment holds fresh records
    assert manager.run_retention() == 2
    checkpoint = OffsetCheckpointFile(str(tmp_path / "log-start-offset-checkpoint"))
    # Kafka lists a log only when its start offset is above its first segment's base offset:
    # here they are equal (10), and a restart takes the start offset from the segment.
    assert checkpoint.read() == {}
    log.maybe_increment_log_start_offset(11)
    manager.run_retention()
    assert checkpoint.read() == {("orders", 0): 11}
    manager.shutdown()
    reopened = LogManager.open(str(tmp_path), {"segment.bytes": 5 * S}, clock)
    assert reopened.get_log("orders", 0).log_start_offset == 11
    assert [r.offset for r in reopened.get_log("orders", 0).records()] == [11]


def test_retention_task_on_the_scheduler_with_a_manual_clock(tmp_path):
    clock = ManualClock(T0)
    manager = LogManager(str(tmp_path), {"segment.bytes": 5 * S, "retention.ms": 60_000}, clock,
                         broker_config={"log.retention.check.interval.ms": 300_000})
    log = manager.get_or_create_log("orders", 0)
    fill(log, 11, ts=T0)
    manager.start_retention()
    clock.advance(29_999)
    manager.scheduler.run_due()
    assert log.number_of_segments == 3           # first run only after log.initial.task.delay.ms
    clock.advance(1)                             # t = 30 s: runs, nothing has expired yet
    manager.scheduler.run_due()
    assert log.number_of_segments == 3
    clock.advance(300_000)                       # t = 330 s: all expired, the periodic run deletes
    manager.scheduler.run_due()                  # every segment, after rolling a fresh one
    assert [s.base_offset for s in log.segments] == [11] and log.log_start_offset == 11
    manager.stop_task("kafka-log-retention")
    assert manager.scheduler.pending() == [(f"delete-file-{b}", T0 + 330_000 + 60_000)
                                           for b in (0, 10, 5)]


def test_retention_in_a_background_thread_with_the_real_clock(tmp_path):
    manager = LogManager(str(tmp_path), {"segment.bytes": 5 * S, "retention.ms": 1,
                                         "file.delete.delay.ms": 0}, SystemClock(),
                         broker_config={"log.retention.check.interval.ms": 20,
                                        "log.initial.task.delay.ms": 0})
    log = manager.get_or_create_log("orders", 0)
    fill(log, 11, ts=int(time.time() * 1000) - 10_000)
    manager.start_retention()
    manager.scheduler.start(poll_ms=5)
    try:
        deadline = time.monotonic() + 10
        while log.log_start_offset < 11 and time.monotonic() < deadline:
            time.sleep(0.01)
        while any(n.endswith(".deleted") for n in os.listdir(log.dir)) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        manager.shutdown()
    assert log.log_start_offset == 11              # everything expired: a fresh segment at 11
    assert not manager.scheduler.running
    assert not any(n.endswith(".deleted") for n in os.listdir(tmp_path / "orders-0"))


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("overrides,message", [
    ({"retention.ms": -5}, "retention.ms: Value must be at least -1"),
    ({"retention.bytes": -7}, "retention.bytes: must be -1"),
    ({"cleanup.policy": "delete,archive"}, "archive"),
    ({"cleanup.policy": ""}, "must not be empty"),
    ({"file.delete.delay.ms": -1}, "file.delete.delay.ms"),
])
def test_bad_retention_settings(overrides, message):
    with pytest.raises(ConfigError, match=message):
        LogConfig(overrides)


def test_bad_broker_settings():
    with pytest.raises(ConfigError, match="log.retention.check.interval.ms"):
        LogManager("/nonexistent-never-created", None, ManualClock(),
                   broker_config={"log.retention.check.interval.ms": 0})
    assert not os.path.exists("/nonexistent-never-created")


def test_shutdown_never_waits_for_a_retention_pass_that_waits_for_it(tmp_path):
    """A retention pass that starts on the scheduler's thread just as `shutdown()` begins takes the
    manager's lock; shutdown must stop and join that thread before it takes the lock itself, or
    each waits for the other forever (seen as a 10-minute hang of the test above)."""
    import threading

    manager = LogManager(str(tmp_path), {"segment.bytes": 5 * S}, SystemClock())
    fill(manager.get_or_create_log("orders", 0), 3)
    started, passes = threading.Event(), []

    def retention_once_shutdown_holds_the_lock() -> None:
        started.set()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:       # until shutdown holds the lock (if it takes it)
            if not manager._lock.acquire(blocking=False):
                break
            manager._lock.release()
            time.sleep(0.005)
        passes.append(manager.run_retention())

    manager.scheduler.schedule("retention-now", retention_once_shutdown_holds_the_lock, 0)
    manager.scheduler.start(poll_ms=5)
    assert started.wait(10)
    stopper = threading.Thread(target=manager.shutdown, daemon=True)
    stopper.start()
    stopper.join(10)
    assert not stopper.is_alive(), "shutdown and the retention pass wait for each other"
    assert len(passes) == 1 and os.path.exists(tmp_path / ".kafka_cleanshutdown")

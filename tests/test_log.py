"""The partition log (Kafka's UnifiedLog/LocalLog): cases 35–39 and 45–49 of the reference's §12,
plus offsets, reads, timestamps, leader epochs, flushing and events."""

from __future__ import annotations

import os

import pytest

from kstore import EventRecorder, Log, LogConfig, Record
from kstore.errors import (CorruptRecordError, InvalidRecordError, LogError, OffsetOutOfRangeError,
                           RecordBatchTooLargeError, RecordTooLargeError)
from kstore.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP, Isolation
from kstore.records import (TIMESTAMP_TYPE_MASK, Compression, RecordBatch, TimestampType,
                            build_batch, build_control_batch, ControlRecordType)

from helpers import T0, records


def batch_of(n: int, start: int = 0, size: int = 10, ts: int = T0, **kw) -> bytes:
    return build_batch(records(n, start, size, ts), **kw)


def one_record_size() -> int:
    return len(batch_of(1))


# ---------------------------------------------------------------- case 35: size-based roll
def test_case_35_size_based_roll(make_log):
    s = one_record_size()
    log = make_log({"segment.bytes": 10 * (s - 1)})
    for _ in range(11):
        log.append_as_leader(batch_of(1))
    assert log.number_of_segments == 2
    assert log.log_end_offset == 11
    assert all(seg.size <= 10 * (s - 1) for seg in log.segments)


def test_segment_bytes_boundary_is_exact(make_log):
    """Roll iff size > segment.bytes − messagesSize: a segment may fill to exactly segment.bytes."""
    s = one_record_size()
    log = make_log({"segment.bytes": 3 * s})
    for _ in range(3):
        log.append_as_leader(batch_of(1))
    assert log.number_of_segments == 1 and log.active_segment.size == 3 * s
    log.append_as_leader(batch_of(1))
    assert [seg.base_offset for seg in log.segments] == [0, 3]


# ---------------------------------------------------------------- case 36: time-based roll
def test_case_36_time_roll_follows_record_timestamps(make_log, clock):
    log = make_log({"segment.ms": 3_600_000})
    log.append_as_leader(batch_of(1, ts=T0))
    log.append_as_leader(batch_of(1, ts=T0 + 3_600_000))       # waited exactly segment.ms: no roll
    assert log.number_of_segments == 1
    log.append_as_leader(batch_of(1, ts=T0 + 3_600_001))       # > segment.ms by record time
    assert log.number_of_segments == 2
    assert clock.milliseconds() == T0                          # the wall clock never moved


def test_case_36_time_roll_uses_wall_clock_without_timestamps(make_log, clock):
    log = make_log({"segment.ms": 1000})
    log.append_as_leader(batch_of(1, ts=-1))
    clock.advance(1001)
    log.append_as_leader(batch_of(1, ts=-1))
    assert log.number_of_segments == 2


def test_case_36_never_rolls_an_empty_segment_and_empty_append_never_rolls(make_log, clock):
    log = make_log({"segment.ms": 1000})
    log.append_as_leader(batch_of(1, ts=T0))
    log.append_as_leader(batch_of(1, ts=T0 + 5000))   # rolls: 2 segments, the new one holds it
    assert log.number_of_segments == 2
    log.roll()                                          # a fresh, empty active segment
    assert log.active_segment.size == 0
    log.append_as_leader(batch_of(1, ts=T0 + 999_999))  # empty segment: no roll for time
    assert log.number_of_segments == 3
    info = log.append_as_leader(b"")
    assert info.num_messages == 0 and log.number_of_segments == 3


# ---------------------------------------------------------------- case 37: read bounds
def test_case_37_read_bounds(make_log):
    log = make_log()
    for i in range(5):
        log.append_as_leader(batch_of(2, start=2 * i))
    assert log.read(log.log_end_offset, 1000).size == 0
    with pytest.raises(OffsetOutOfRangeError, match="upto 10"):
        log.read(11, 1000)
    with pytest.raises(OffsetOutOfRangeError, match="starting from offset: 0"):
        log.read(-1, 1000)
    log.update_high_watermark(4)
    got = [r.offset for r in log.records(isolation=Isolation.HIGH_WATERMARK)]
    assert got == [0, 1, 2, 3]
    assert log.read(4, 1000, Isolation.HIGH_WATERMARK).size == 0
    assert [r.offset for r in log.records()] == list(range(10))


def test_read_below_log_start_offset_names_the_start(make_log):
    log = make_log({"segment.bytes": 200})
    for i in range(6):
        log.append_as_leader(batch_of(1, start=i))
    log.update_high_watermark(6)
    log.maybe_increment_log_start_offset(3)
    with pytest.raises(OffsetOutOfRangeError) as e:
        log.read(2, 100)
    assert "offset 2" in str(e.value) and "starting from offset: 3" in str(e.value)


def test_read_max_bytes_budget_and_min_one_message(make_log):
    log = make_log()
    for i in range(10):
        log.append_as_leader(batch_of(1, start=i))
    size = one_record_size()
    fetch = log.read(0, 3 * size + 5)
    assert fetch.size == 3 * size + 5          # the slice may end inside a batch ...
    assert [b.base_offset for b in fetch.batches()] == [0, 1, 2]   # ... readers drop that part
    tiny = log.read(4, 1)                      # min_one_message: the first batch comes whole
    assert [b.base_offset for b in tiny.batches()] == [4]
    assert log.read(4, 1, min_one_message=False).batches() == []


def test_read_from_the_middle_of_a_batch_returns_the_whole_batch(make_log):
    log = make_log()
    log.append_as_leader(batch_of(5))
    fetch = log.read(3, 10_000)
    (batch,) = fetch.batches()
    assert (batch.base_offset, batch.last_offset) == (0, 4)
    assert [r.offset for r in log.read_records(3)] == [3, 4]


# ---------------------------------------------------------------- case 38: gaps
def test_case_38_read_in_a_gap_returns_the_next_batch(make_log):
    log = make_log({"segment.bytes": 400})
    log.append_as_follower(batch_of(3, base_offset=0))
    log.append_as_follower(batch_of(2, base_offset=10))       # offsets 3..9 never existed
    log.roll()
    log.append_as_follower(batch_of(2, base_offset=30))       # a gap across segments
    assert [b.base_offset for b in log.read(5, 10_000).batches()][0] == 10
    assert [b.base_offset for b in log.read(15, 10_000).batches()][0] == 30
    assert [r.offset for r in log.records()] == [0, 1, 2, 10, 11, 30, 31]


# ---------------------------------------------------------------- case 39: high watermark
def test_case_39_high_watermark_maintenance(make_log):
    """UnifiedLog alone (a replicated partition): appends never move the HW."""
    log = make_log(single_replica=False)
    assert log.high_watermark == 0
    log.append_as_leader(batch_of(3))
    assert log.high_watermark == 0                  # appends do not move it
    assert log.update_high_watermark(100) == 3      # clamped to the LEO
    with pytest.raises(LogError):
        log.maybe_increment_high_watermark(4)
    assert not log.maybe_increment_high_watermark(1)  # only forward
    log.append_as_leader(batch_of(2, start=3))
    log.truncate_to(1)
    assert log.high_watermark == 1                  # lowered by truncation


def test_single_replica_high_watermark_follows_the_log_end_offset(make_log):
    """With the leader alone in the ISR, Kafka's Partition moves the HW to the LEO on append."""
    log = make_log()
    log.append_as_leader(batch_of(3))
    assert log.high_watermark == 3
    assert [r.offset for r in log.records(isolation=Isolation.HIGH_WATERMARK)] == [0, 1, 2]
    log.close()
    assert make_log(had_clean_shutdown=True).high_watermark == 3


# ---------------------------------------------------------------- case 45: index resize at truncation
def test_case_45_index_resized_after_truncating_to_an_older_segment(make_log):
    log = make_log({"segment.bytes": 300, "index.interval.bytes": 1, "segment.index.bytes": 1200})
    for i in range(12):
        log.append_as_leader(batch_of(1, start=i))
    first = log.segments[0]
    assert log.number_of_segments > 2
    assert first.offset_index.length == first.offset_index.entries * 8   # trimmed at roll
    log.truncate_to(1)
    assert log.segments == [first]
    assert first.offset_index.length == 1200 and first.time_index.length == 1200 // 12 * 12
    log.append_as_leader(batch_of(1, start=1))
    assert log.log_end_offset == 2


# ---------------------------------------------------------------- case 46: epochs and truncation
def test_case_46_truncation_removes_epoch_entries_at_or_after_the_target(make_log):
    log = make_log()
    log.append_as_leader(batch_of(2), leader_epoch=0)
    log.append_as_leader(batch_of(2), leader_epoch=1)   # epoch 1 starts at 2
    log.append_as_leader(batch_of(2), leader_epoch=3)   # epoch 3 starts at 4
    assert log.leader_epoch_cache.entries() == [(0, 0), (1, 2), (3, 4)]
    log.truncate_to(4)
    assert log.leader_epoch_cache.entries() == [(0, 0), (1, 2)]
    log.truncate_to(3)
    assert log.leader_epoch_cache.entries() == [(0, 0), (1, 2)]
    with open(os.path.join(log.dir, "leader-epoch-checkpoint")) as f:
        assert f.read() == "0\n2\n0 0\n1 2\n"


def test_case_46_raising_the_log_start_offset_cuts_the_epoch_cache(make_log):
    log = make_log()
    log.append_as_leader(batch_of(3), leader_epoch=0)
    log.append_as_leader(batch_of(3), leader_epoch=1)
    log.update_high_watermark(6)
    log.maybe_increment_log_start_offset(2)
    assert log.leader_epoch_cache.entries() == [(0, 2), (1, 3)]
    log.maybe_increment_log_start_offset(4)
    assert log.leader_epoch_cache.entries() == [(1, 4)]


def test_leader_epoch_is_stamped_on_append(make_log):
    log = make_log()
    log.append([("a", "1")], leader_epoch=7)
    (batch,) = log.read(0, 1000).batches()
    assert batch.partition_leader_epoch == 7
    assert batch.is_valid()


# ---------------------------------------------------------------- case 47: index rebuild, junk
def test_case_47_deleted_index_files_are_rebuilt_identically(make_log, tmp_path):
    config = {"segment.bytes": 2000, "index.interval.bytes": 100}
    log = make_log(config)
    for i in range(60):
        log.append_as_leader(batch_of(1, start=i))        # record i has timestamp T0 + i
    log.close()   # close writes each segment's final time-index entry
    clean = make_log(config, had_clean_shutdown=True)
    before = [(s.offset_index.entries_list(), s.time_index.entries_list()) for s in clean.segments]
    assert before[-1][1][-1] == (T0 + 59, 59)
    clean.close()
    for name in os.listdir(log.dir):
        if name.endswith((".index", ".timeindex")):
            os.remove(os.path.join(log.dir, name))
    reopened = make_log(config, recovery_point=60, had_clean_shutdown=True)
    after = [(s.offset_index.entries_list(), s.time_index.entries_list()) for s in reopened.segments]
    assert after == before
    assert len(reopened.load_report.rebuilt_indexes) == len(before)
    assert [r.offset for r in reopened.records()] == list(range(60))


def test_case_47_junk_after_the_last_batch_is_removed_and_good_records_survive(make_log):
    log = make_log({"index.interval.bytes": 1})
    for i in range(20):
        log.append_as_leader(batch_of(1, start=i))
    good_size = log.active_segment.size
    log.close()
    seg_log = os.path.join(log.dir, "00000000000000000000.log")
    seg_index = os.path.join(log.dir, "00000000000000000000.index")
    with open(seg_log, "ab") as f:
        f.write(os.urandom(1000))
    with open(seg_index, "ab") as f:
        f.write(os.urandom(64))
    reopened = make_log({"index.interval.bytes": 1}, recovery_point=0)
    assert reopened.active_segment.size == good_size
    assert reopened.log_end_offset == 20
    assert [r.offset for r in reopened.records()] == list(range(20))
    assert reopened.load_report.truncated_bytes == 1000
    for entry in reopened.active_segment.offset_index.entries_list():
        loc = next(reopened.active_segment.log.batch_locations(entry.position))
        assert loc.last_offset == entry.offset


# ---------------------------------------------------------------- case 48: orphans and swaps
def test_case_48_orphan_index_files_are_deleted(make_log):
    log = make_log()
    log.append_as_leader(batch_of(3))
    log.close()
    for ext in (".index", ".timeindex"):
        open(os.path.join(log.dir, f"{5:020d}{ext}"), "wb").close()
    reopened = make_log(had_clean_shutdown=True)
    names = sorted(os.listdir(reopened.dir))
    assert not any(n.startswith(f"{5:020d}") for n in names)
    assert set(reopened.load_report.deleted_files) == {f"{5:020d}.index", f"{5:020d}.timeindex"}


def _three_segment_log(make_log):
    log = make_log()
    for i in range(30):
        if i in (10, 20):
            log.roll()
        log.append_as_leader(batch_of(1, start=i))
    assert [s.base_offset for s in log.segments] == [0, 10, 20]
    log.close()
    return log.dir


def _write_cleaned(directory: str, suffix: str) -> None:
    """A 'cleaned' replacement for segments 0 and 10: the odd offsets 1..19, original offsets."""
    kept = [Record(f"k{i}".encode(), b"v", T0 + i) for i in range(1, 20, 2)]
    data = build_batch(kept, base_offset=1, offsets=list(range(1, 20, 2)))
    from kstore.segment import LogSegment
    seg = LogSegment.open(directory, 0, LogConfig({}), __import__("kstore").ManualClock(T0),
                          file_suffix=suffix)
    seg.append(19, T0 + 19, 19, data)
    seg.close()


@pytest.mark.parametrize("phase", ["cleaned", "swap_with_old", "swap_old_deleted", "swap_only_log"])
def test_case_48_crash_during_swap_ends_consistent(make_log, phase):
    directory = _three_segment_log(make_log)
    all_offsets = list(range(30))
    compacted = list(range(1, 20, 2)) + list(range(20, 30))
    if phase == "cleaned":            # crash before the rename to .swap: cleaning is discarded
        _write_cleaned(directory, ".cleaned")
        expected = all_offsets
    else:
        _write_cleaned(directory, ".swap")
        expected = compacted
        if phase == "swap_old_deleted":   # crash after renaming the old segments to .deleted
            for base in (0, 10):
                for ext in (".log", ".index", ".timeindex"):
                    p = os.path.join(directory, f"{base:020d}{ext}")
                    os.replace(p, p + ".deleted")
        if phase == "swap_only_log":      # only the .log had been renamed to .swap
            for ext in (".index", ".timeindex"):
                os.remove(os.path.join(directory, f"{0:020d}{ext}.swap"))
    log = make_log(recovery_point=0)
    assert [r.offset for r in log.records()] == expected
    names = os.listdir(directory)
    assert not [n for n in names if n.endswith((".swap", ".cleaned", ".deleted"))]
    assert [s.base_offset for s in log.segments] == ([0, 10, 20] if phase == "cleaned" else [0, 20])


# ---------------------------------------------------------------- case 49: clean vs unclean
def test_case_49_clean_shutdown_skips_recovery(make_log):
    log = make_log({"index.interval.bytes": 50})
    for i in range(40):
        log.append_as_leader(batch_of(1, start=i))
    log.close()
    reopened = make_log({"index.interval.bytes": 50}, recovery_point=0, had_clean_shutdown=True)
    assert reopened.load_report.recovered_segments == []
    assert reopened.log_end_offset == 40
    assert reopened.recovery_point == 40


def test_case_49_unclean_reopen_rebuilds_the_same_indexes(make_log, clock):
    config = {"index.interval.bytes": 50, "segment.bytes": 1500}
    log = make_log(config)
    for i in range(80):
        log.append_as_leader(batch_of(1, start=i, ts=T0 + 3 * i))
    before = [(s.base_offset, s.offset_index.entries_list(), s.time_index.last_entry())
              for s in log.segments]
    log.flush()
    log.close_without_flush()
    reopened = make_log(config, recovery_point=0)
    assert reopened.load_report.recovered_segments
    after = [(s.base_offset, s.offset_index.entries_list(), s.time_index.last_entry())
             for s in reopened.segments]
    assert after == before
    assert reopened.log_end_offset == 80
    assert reopened.recovery_point == 0     # min(checkpoint, LEO): only a flush moves it


# ---------------------------------------------------------------- appends
def test_append_assigns_offsets_from_the_leo_and_keeps_the_crc(make_log):
    log = make_log()
    produced = build_batch(records(3))
    assert RecordBatch(produced).base_offset == 0
    log.append_as_leader(produced)
    info = log.append_as_leader(produced)
    assert (info.first_offset, info.last_offset) == (3, 5)
    stored = log.read(3, 10_000).batches()[0]
    assert stored.base_offset == 3 and stored.is_valid() and stored.crc == RecordBatch(produced).crc


def test_append_as_follower_keeps_offsets_and_refuses_going_back(make_log):
    log = make_log()
    log.append_as_follower(build_batch(records(2), base_offset=5, partition_leader_epoch=2))
    assert log.log_end_offset == 7
    assert log.leader_epoch_cache.entries() == [(2, 5)]
    with pytest.raises(LogError, match="below the log end offset 7"):
        log.append_as_follower(build_batch(records(1), base_offset=6))


def test_producer_batch_with_nonzero_base_offset_is_rejected(make_log):
    log = make_log()
    with pytest.raises(InvalidRecordError, match="should be 0, but it is 9"):
        log.append_as_leader(build_batch(records(1), base_offset=9))
    assert log.log_end_offset == 0 and log.active_segment.size == 0


def test_corrupt_batch_is_rejected_and_nothing_is_written(make_log):
    log = make_log()
    log.append_as_leader(batch_of(2))
    bad = bytearray(batch_of(2))
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="stored crc"):
        log.append_as_leader(bytes(bad))
    assert log.log_end_offset == 2
    assert [r.offset for r in log.records()] == [0, 1]


def test_partial_trailing_batch_in_an_append_is_trimmed(make_log):
    log = make_log()
    data = batch_of(1) + batch_of(1)[:30]
    info = log.append_as_leader(data)
    assert info.valid_bytes == one_record_size() and log.log_end_offset == 1


def test_size_limits(make_log):
    log = make_log({"max.message.bytes": 200, "segment.bytes": 1000})
    with pytest.raises(RecordTooLargeError, match="max.message.bytes"):
        log.append_as_leader(batch_of(1, size=300))
    many = b"".join(batch_of(1, size=120) for _ in range(8))
    with pytest.raises(RecordBatchTooLargeError, match="maximum configured segment size of 1000"):
        log.append_as_leader(many)
    assert log.log_end_offset == 0


def test_log_append_time(make_log, clock):
    log = make_log({"message.timestamp.type": "LogAppendTime"})
    clock.advance(5000)
    info = log.append_as_leader(batch_of(3, ts=123))
    (batch,) = log.read(0, 10_000).batches()
    assert batch.attributes & TIMESTAMP_TYPE_MASK and batch.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert batch.max_timestamp == T0 + 5000 == info.log_append_time
    assert batch.is_valid()
    assert {r.timestamp for r in batch.records()} == {T0 + 5000}


def test_broker_side_compression_type_recompresses(make_log):
    log = make_log({"compression.type": "gzip"})
    log.append_as_leader(batch_of(5))
    (batch,) = log.read(0, 10_000).batches()
    assert batch.compression is Compression.GZIP and batch.is_valid()
    assert [r.key for r in batch.records()] == [f"k{i}".encode() for i in range(5)]


def test_compressed_producer_batches_are_stored_as_sent(make_log):
    log = make_log()
    for codec in Compression:
        sent = batch_of(4, compression=codec)
        log.append_as_leader(sent)
        stored = log.read(log.log_end_offset - 4, 100_000).batches()[0]
        # Only baseOffset (0-7) and partitionLeaderEpoch (12-15) are rewritten; the CRC still holds.
        assert stored.to_bytes()[8:12] == sent[8:12]
        assert stored.to_bytes()[16:] == sent[16:]
        assert stored.base_offset == log.log_end_offset - 4 and stored.partition_leader_epoch == 0
        assert stored.compression is codec
    assert len(log.records()) == 4 * len(Compression)


def test_compacted_topic_rejects_records_without_key(make_log):
    log = make_log({"cleanup.policy": "compact"})
    with pytest.raises(InvalidRecordError, match="without key"):
        log.append([b"no key"])
    log.append([("k", "v")])
    assert log.log_end_offset == 1


def test_control_batches_are_stored_and_skipped_by_readers(make_log):
    log = make_log()
    log.append_as_leader(batch_of(2, producer_id=4, producer_epoch=0, base_sequence=0))
    log.append_as_leader(build_control_batch(ControlRecordType.COMMIT, timestamp=T0,
                                             producer_id=4, producer_epoch=0))
    log.append_as_leader(batch_of(1, start=2))
    assert log.log_end_offset == 4
    assert [r.offset for r in log.records()] == [0, 1, 3]
    assert [b.is_control for b in log.read(0, 10_000).batches()] == [False, True, False]


# ---------------------------------------------------------------- timestamps
def test_fetch_offset_by_timestamp(make_log):
    log = make_log({"segment.bytes": 400, "index.interval.bytes": 60})
    for i in range(40, 50):
        log.append_as_leader(build_batch([Record(b"k", b"v" * 20, i * 10)]))
    # offsets 0..9 carry timestamps 400..490
    expect = {400: 0, 420: 2, 421: 3, 430: 3, 431: 4, 399: 0, 490: 9}
    for ts, offset in expect.items():
        assert log.fetch_offset_by_timestamp(ts).offset == offset, ts
    assert log.fetch_offset_by_timestamp(491) is None
    assert log.fetch_offset_by_timestamp(EARLIEST_TIMESTAMP).offset == 0
    assert log.fetch_offset_by_timestamp(LATEST_TIMESTAMP).offset == 10
    assert log.fetch_offset_by_timestamp(MAX_TIMESTAMP)[:2] == (490, 9)
    assert log.number_of_segments > 1


# ---------------------------------------------------------------- durability
def test_flush_messages_moves_the_recovery_point(make_log):
    log = make_log({"flush.messages": 3})
    rec = EventRecorder(log.events, kinds={"flush"})
    for i in range(7):
        log.append_as_leader(batch_of(1, start=i))
    assert log.recovery_point == 6
    assert [e.details["recovery_point"] for e in rec.events] == [3, 6]


def test_roll_flushes_the_old_segment(make_log):
    log = make_log({"segment.bytes": 2 * one_record_size()})
    for i in range(3):
        log.append_as_leader(batch_of(1, start=i))
    assert log.recovery_point == 2         # the rolled segment is on disk


def test_preallocated_segment_is_trimmed_on_roll_and_close(make_log):
    size = 64 * 1024
    log = make_log({"preallocate": True, "segment.bytes": size})
    path = os.path.join(log.dir, f"{0:020d}.log")
    assert os.path.getsize(path) == size and log.active_segment.size == 0
    log.append_as_leader(batch_of(3))
    log.close()
    assert os.path.getsize(path) == len(batch_of(3))
    reopened = make_log({"preallocate": True, "segment.bytes": size}, had_clean_shutdown=True)
    assert reopened.log_end_offset == 3


def test_events_for_append_roll_truncate_flush_delete(make_log):
    log = make_log({"segment.bytes": 2 * one_record_size()})
    rec = EventRecorder(log.events)
    for i in range(5):
        log.append_as_leader(batch_of(1, start=i))
    log.truncate_to(1)
    kinds = rec.kinds()
    assert kinds.count("append") == 5
    assert kinds.count("roll") == 2
    assert "flush" in kinds and "truncate" in kinds and "delete" in kinds
    roll = next(e for e in rec.events if e.kind == "roll")
    assert roll.details["new_segment"] == 2 and roll.details["reasons"] == ["segment.bytes"]
    append = next(e for e in rec.events if e.kind == "append")
    assert kinds.count("high_watermark") == 6      # follows each of 5 appends, lowered by truncate
    assert append.details == {"first_offset": 0, "last_offset": 0, "size": one_record_size(),
                              "position": 0, "segment": 0, "batches": 1}


def test_truncated_segments_become_deleted_files_then_disappear(make_log, clock):
    log = make_log({"segment.bytes": 2 * one_record_size(), "file.delete.delay.ms": 60_000})
    for i in range(6):
        log.append_as_leader(batch_of(1, start=i))
    log.truncate_to(1)
    deleted = sorted(n for n in os.listdir(log.dir) if n.endswith(".deleted"))
    assert deleted == sorted(f"{b:020d}{e}.deleted" for b in (2, 4)
                             for e in (".index", ".log", ".timeindex"))
    clock.advance(60_000)
    log.append_as_leader(batch_of(1, start=1))      # the log runs due tasks on append
    assert not [n for n in os.listdir(log.dir) if n.endswith(".deleted")]


def test_truncate_below_the_first_segment_starts_fully_at_the_target(make_log):
    log = make_log()
    log.truncate_fully_and_start_at(10)
    log.append_as_follower(build_batch(records(3), base_offset=10))
    assert [s.base_offset for s in log.segments] == [10]
    log.truncate_to(4)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (4, 4, 4)
    assert [s.base_offset for s in log.segments] == [4]


def test_negative_offsets_are_refused(make_log):
    log = make_log()
    with pytest.raises(ValueError, match="negative offset"):
        log.truncate_to(-1)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-5, 100)


def test_directory_name_must_be_topic_partition(tmp_path, clock):
    with pytest.raises(LogError, match="topic-partition"):
        Log.open(str(tmp_path / "notapartition"), None, clock)


def test_closed_log_refuses_operations(make_log):
    log = make_log()
    log.close()
    with pytest.raises(LogError, match="closed"):
        log.append([b"x"])


def _index_entry_events(log, appends: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(offset, position) of the index_entry events of `appends` one-record appends, and the
    entries the active segment's offset index holds after them."""
    rec = EventRecorder(log.events, kinds={"index_entry"})
    for i in range(appends):
        log.append_as_leader(batch_of(1, start=i))
    events = [(e.details["offset"], e.details["position"]) for e in rec.events]
    return events, [tuple(e) for e in log.active_segment.offset_index.entries_list()]


@pytest.mark.parametrize("rule", ["engine", "learner's rule plugged in"])
def test_each_new_index_entry_is_announced_once_with_its_offset_and_position(make_log, rule):
    """Views of the index learn of a new entry from the log's index_entry event: the segment's
    append says whether it indexed, with kstore's rule and with a learner's rule (chapter 02)."""
    import importlib.util
    from pathlib import Path

    from kstore.grading import live

    log = make_log({"index.interval.bytes": 2 * one_record_size()})
    if rule == "engine":
        events, entries = _index_entry_events(log, 10)
    else:   # the chapter-02 solution's rule, as a learner's saved engine holds it
        path = Path(__file__).resolve().parents[1] / "solutions/my_engine/ch02_sparse_index.py"
        spec = importlib.util.spec_from_file_location("ch02_solution", path)
        solution = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(solution)
        with live.plug(*live.sparse_index(index_entries=solution.index_entries)):
            events, entries = _index_entry_events(log, 10)
    size = one_record_size()
    assert entries == [(3, 3 * size), (6, 6 * size), (9, 9 * size)]
    assert events == entries

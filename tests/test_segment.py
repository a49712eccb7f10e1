"""FileRecords (`.log` files) and LogSegment.

Behaviour cases 8-12 (FileRecordsTest) and 21-34 (LogSegmentTest) of the reference
(docs/kafka-storage-notes.md §12), plus the index-interval rule of §2.6, the
find-by-timestamp vectors of §4.3, the read rules of §4.2, the roll conditions of §4.1 and
recovery (§5.2). Real files in tmp_path, a ManualClock, no mocks, no sleeps.
"""

from __future__ import annotations

import os
import random
import struct

import pytest

from kstore.clock import ManualClock
from kstore.config import LogConfig
from kstore.errors import CorruptRecordError, LogError, LogSegmentOffsetOverflowError
from kstore.file_records import FileRecords
from kstore.index import OffsetIndex, TimeIndex
from kstore.leader_epoch import LeaderEpochFileCache
from kstore.records import Record, RecordBatch, build_batch
from kstore.segment import NO_MAX_POSITION, LogOffsetMetadata, LogSegment, RollParams

INT_MAX = 2**31 - 1
NO_TIMESTAMP = -1
T = 1_700_000_000_000
MiB = 1024 * 1024


def records(offset: int, *values: str, ts: int | None = None) -> bytes:
    """LogSegmentTest.records(offset, values...): one batch, record i at offset+i, timestamp
    offset*10 (null keys)."""
    stamp = offset * 10 if ts is None else ts
    return build_batch([Record(None, v.encode(), stamp) for v in values], base_offset=offset)


def contents(data: bytes) -> list[tuple]:
    """(offset, key, value, timestamp) of every record in a buffer of batches."""
    out = []
    pos = 0
    while pos < len(data):
        b = RecordBatch(data[pos:])
        out += [(r.offset, r.key, r.value, r.timestamp) for r in b.records()]
        pos += b.size_in_bytes
    return out


def read_contents(info) -> list[tuple]:
    return [(r.offset, r.key, r.value, r.timestamp) for b in info.batches() for r in b.records()]


def make_segment(directory, base_offset: int, interval: int = 10, clock=None,
                 index_bytes: int = 1500, **kwargs) -> LogSegment:
    """LogTestUtils.createSegment: index.interval.bytes 10 unless given."""
    os.makedirs(directory, exist_ok=True)
    config = LogConfig({"index.interval.bytes": interval, "segment.index.bytes": index_bytes})
    return LogSegment.open(str(directory), base_offset, config, clock or ManualClock(), **kwargs)


@pytest.fixture
def seg40(tmp_path):
    seg = make_segment(tmp_path / "seg", 40)
    yield seg
    seg.close()


# ============================================================================================
# FileRecords: cases 8-12
# ============================================================================================

VALUES = [b"abcd", b"efgh", b"ijkl"]


def value_batches() -> list[bytes]:
    """FileRecordsTest.append: one batch per value at offsets 0, 1, 2."""
    return [build_batch([Record(None, v, T)], base_offset=i) for i, v in enumerate(VALUES)]


@pytest.fixture
def file_records(tmp_path):
    fr = FileRecords(str(tmp_path / "00000000000000000000.log"))
    for b in value_batches():
        fr.append(b)
    fr.flush()
    yield fr
    fr.close()


def file_values(fr: FileRecords) -> list[bytes]:
    return [r.value for b in fr.batches() for r in b.records()]


def test_case_08_iteration_over_partial_junk(file_records, tmp_path):
    """Case 8 [FileRecordsTest.testIterationOverPartialAndTruncation]: 0, 2, 4, 5, 6 zero bytes
    written after the batches (17 in all, < the 17 header bytes needed) don't change iteration."""
    path = file_records.path
    total = sum(len(b) for b in value_batches())
    for junk in (0, 2, 4, 5, 6):
        with open(path, "ab") as f:
            f.write(bytes(junk))
        reopened = FileRecords(path)
        assert reopened.size_in_bytes() == os.path.getsize(path)
        assert file_values(reopened) == VALUES
        assert [b.position for b in reopened.batches()] == \
            [0, len(value_batches()[0]), len(value_batches()[0]) + len(value_batches()[1])]
        reopened.close_handlers()
    assert os.path.getsize(path) == total + 17


def test_case_08_partial_trailing_batch_is_ignored(tmp_path):
    """Case 8 / §1.9: a file ending in the first k bytes of a 4th batch yields the 3 complete
    batches, whether the header is readable (k >= 17) or not."""
    extra = build_batch([Record(b"k", b"a longer value for the fourth batch", T)], base_offset=3)
    for k in (1, 12, 16, 17, 18, 61, len(extra) - 1):
        path = str(tmp_path / f"partial-{k}.log")
        with open(path, "wb") as f:
            f.write(b"".join(value_batches()) + extra[:k])
        fr = FileRecords(path)
        assert file_values(fr) == VALUES, k
        assert [loc.last_offset for loc in fr.batch_locations()] == [0, 1, 2]
        fr.close_handlers()
    path = str(tmp_path / "complete.log")
    with open(path, "wb") as f:
        f.write(b"".join(value_batches()) + extra)
    fr = FileRecords(path)
    assert [loc.last_offset for loc in fr.batch_locations()] == [0, 1, 2, 3]
    fr.close_handlers()


def test_case_08_length_below_minimum_is_corrupt(tmp_path):
    """§1.9 step 3: a readable header whose length field is < 14 -> CorruptRecordException."""
    path = str(tmp_path / "bad.log")
    with open(path, "wb") as f:
        f.write(b"".join(value_batches()) + bytes(18))
    fr = FileRecords(path)
    with pytest.raises(CorruptRecordError):
        list(fr.batch_locations())
    fr.close_handlers()


def test_case_09_search_for_offset_with_size(file_records):
    """Case 9 [FileRecordsTest.testSearch]: first batch with lastOffset >= target, also for an
    offset in a gap (3 -> the batch at 50)."""
    file_records.append(build_batch([Record(None, b"test", T)], base_offset=50))
    sizes = [b.size_in_bytes for b in file_records.batches()]
    assert len(sizes) == 4
    position = 0
    assert file_records.search_for_offset_with_size(0, 0) == (0, position, sizes[0])
    position += sizes[0]
    assert file_records.search_for_offset_with_size(1, 0) == (1, position, sizes[1])
    assert file_records.search_for_offset_with_size(1, position) == (1, position, sizes[1])
    position += sizes[1] + sizes[2]
    assert file_records.search_for_offset_with_size(3, position) == (50, position, sizes[3])
    assert file_records.search_for_offset_with_size(50, position) == (50, position, sizes[3])
    assert file_records.search_for_offset_with_size(51, 0) is None


def test_case_10_slice_beyond_end_raises(file_records):
    """Case 10 [FileRecordsTest.testOutOfRangeSlice]: slice(size + 1, 15) -> IllegalArgument."""
    with pytest.raises(ValueError):
        file_records.slice(file_records.size_in_bytes() + 1, 15)
    end = file_records.slice(file_records.size_in_bytes(), 15)
    assert end.size == 0


def test_case_10_slice_size_clamped_to_size_at_that_moment(file_records):
    """Case 10 [testRead, testSliceSizeLimitWithConcurrentWrite]: a slice whose size runs past
    the end is clamped to the file size when it is taken; later writes don't grow it."""
    first = len(value_batches()[0])
    size = file_records.size_in_bytes()
    s = file_records.slice(first, size)
    assert s.size == size - first
    assert [b.base_offset for b in s.batches()] == [1, 2]
    s2 = file_records.slice(first, INT_MAX)
    assert s2.size == size - first
    whole = file_records.slice(0, 10**12)
    assert whole.size == size
    file_records.append(build_batch([Record(None, b"more", T)], base_offset=3))
    assert whole.size == size
    assert [b.base_offset for b in whole.batches()] == [0, 1, 2]
    assert file_records.slice(0, 10**12).size == file_records.size_in_bytes() > size
    second = len(value_batches()[1])
    single = file_records.slice(first, second)
    assert single.size == second
    assert [b.base_offset for b in single.batches()] == [1]
    assert file_records.slice(first, second - 1).batches() == []  # testIteratorWithLimits


def test_case_11_truncate_to_same_size_does_not_touch_the_file(file_records):
    """Case 11 [testTruncateNotCalledIfSizeIsSameAsTargetSize]: no OS truncate when the target
    equals the size. Observable without mocks: on Linux ftruncate always bumps the mtime."""
    size = file_records.size_in_bytes()
    os.utime(file_records.path, (1_000_000, 1_000_000))
    assert file_records.truncate_to(size) == 0
    assert os.stat(file_records.path).st_mtime == 1_000_000
    assert os.path.getsize(file_records.path) == size
    assert file_values(file_records) == VALUES


def test_case_11_truncate_beyond_size_raises(file_records):
    """Case 11 [testTruncateNotCalledIfSizeIsBiggerThanTargetSize]: KafkaException."""
    size = file_records.size_in_bytes()
    os.utime(file_records.path, (1_000_000, 1_000_000))
    with pytest.raises(LogError):
        file_records.truncate_to(size + 1)
    assert file_records.size_in_bytes() == size
    assert os.stat(file_records.path).st_mtime == 1_000_000


def test_case_11_truncate_smaller_cuts_the_file(file_records):
    """Case 11 [testTruncateIfSizeIsDifferentToTargetSize, testTruncate]."""
    end = file_records.search_for_offset_with_size(1, 0).position
    assert file_records.truncate_to(end) == sum(len(b) for b in value_batches()[1:])
    assert file_records.size_in_bytes() == end == os.path.getsize(file_records.path)
    assert file_values(file_records) == [b"abcd"]


def test_case_12_preallocated_file_records(tmp_path):
    """Case 12 [FileRecordsTest.testPreallocateTrue, testPreallocateClearShutdown]: a new
    preallocated file is 1 MiB on disk, size 0, writes start at byte 0; close trims it to the
    real size; reopening sees that size."""
    path = str(tmp_path / "pre.log")
    fr = FileRecords(path, preallocate_size=MiB)
    assert fr.size_in_bytes() == 0
    assert os.path.getsize(path) == MiB
    data = value_batches()
    for b in data:
        fr.append(b)
    expected = b"".join(data)
    assert fr.size_in_bytes() == len(expected)
    assert os.path.getsize(path) == MiB
    with open(path, "rb") as f:
        assert f.read(len(expected)) == expected  # write position started at 0
    assert file_values(fr) == VALUES  # the zeros after the data are not read as batches
    fr.close()
    assert os.path.getsize(path) == len(expected)
    reopened = FileRecords(path, preallocate_size=MiB)
    assert reopened.size_in_bytes() == len(expected) == os.path.getsize(path)
    assert file_values(reopened) == VALUES
    reopened.close()


def test_case_12_not_preallocated(tmp_path):
    """FileRecordsTest.testPreallocateFalse: no preallocation -> 0-byte file."""
    fr = FileRecords(str(tmp_path / "np.log"))
    assert fr.size_in_bytes() == 0 and os.path.getsize(fr.path) == 0
    fr.close()


def test_case_12_segment_with_init_file_size_clean_shutdown(tmp_path):
    """Case 12 [LogSegmentTest.testCreateWithInitFileSizeClearShutdown]."""
    d = tmp_path / "pre"
    seg = make_segment(d, 40, init_file_size=MiB, preallocate=True)
    ms = records(50, "hello", "there")
    seg.append(51, NO_TIMESTAMP, -1, ms)
    ms2 = records(60, "alpha", "beta")
    seg.append(61, NO_TIMESTAMP, -1, ms2)
    assert read_contents(seg.read(55, 200)) == contents(ms2)
    old_size = seg.size
    assert old_size == len(ms) + len(ms2)
    assert os.path.getsize(seg.log.path) == MiB
    seg.close()
    assert os.path.getsize(seg.log.path) == old_size
    reopened = make_segment(d, 40, file_already_exists=True, init_file_size=MiB, preallocate=True)
    assert read_contents(reopened.read(55, 200)) == contents(ms2)
    assert reopened.size == old_size == os.path.getsize(reopened.log.path)
    reopened.close()


# ============================================================================================
# LogSegment: cases 21-34
# ============================================================================================

def test_case_21_read_on_empty_segment_is_none(seg40):
    """Case 21 [LogSegmentTest.testReadOnEmptySegment]."""
    assert seg40.read(40, 300) is None


def test_case_21_read_after_last_is_none(seg40):
    """Case 21 [LogSegmentTest.testReadAfterLast]."""
    seg40.append(51, NO_TIMESTAMP, -1, records(50, "hello", "there"))
    assert seg40.read(52, 200) is None


def test_case_22_read_before_first_offset(seg40):
    """Case 22 [LogSegmentTest.testReadBeforeFirstOffset]: data from the first batch."""
    ms = records(50, "hello", "there", "little", "bee")
    seg40.append(53, NO_TIMESTAMP, -1, ms)
    assert read_contents(seg40.read(41, 300)) == contents(ms)
    assert [c[0] for c in contents(ms)] == [50, 51, 52, 53]


def test_case_22_read_from_gap(seg40):
    """Case 22 [LogSegmentTest.testReadFromGap]: 55 is in no batch -> the batch at 60."""
    seg40.append(51, NO_TIMESTAMP, -1, records(50, "hello", "there"))
    ms2 = records(60, "alpha", "beta")
    seg40.append(61, NO_TIMESTAMP, -1, ms2)
    info = seg40.read(55, 200)
    assert read_contents(info) == contents(ms2)
    assert [c[0] for c in read_contents(info)] == [60, 61]


@pytest.mark.parametrize("min_one_message", [True, False])
def test_case_23_read_when_no_max_position(seg40, min_one_message):
    """Case 23 [LogSegmentTest.testReadWhenNoMaxPosition]: empty records, right metadata; at and
    after the end -> null. (Kafka's v1 helper puts offsets 50 and 51 in two shallow entries; the
    append here holds two batches so the second starts at a nonzero position too.)"""
    b50, b51 = records(50, "hello"), records(51, "there")
    seg40.append(51, NO_TIMESTAMP, -1, b50 + b51)
    for offset, position in ((48, 0), (50, 0), (51, len(b50))):
        info = seg40.read(offset, 1, NO_MAX_POSITION, min_one_message)
        assert info.fetch_offset_metadata == LogOffsetMetadata(offset, 40, position)
        assert info.size == 0 and info.batches() == []
    assert seg40.read(52, 1, NO_MAX_POSITION, min_one_message) is None
    assert seg40.read(53, 1, NO_MAX_POSITION, min_one_message) is None


def test_case_24_truncate(seg40):
    """Case 24 [LogSegmentTest.testTruncate]: 30 rounds of append two, truncate the second."""
    offset = 40
    for _ in range(30):
        ms1 = records(offset, "hello")
        seg40.append(offset, NO_TIMESTAMP, -1, ms1)
        ms2 = records(offset + 1, "hello")
        seg40.append(offset + 1, NO_TIMESTAMP, -1, ms2)
        got = read_contents(seg40.read(offset, 10000))
        assert got == contents(ms1) + contents(ms2)
        seg40.truncate_to(offset + 1)
        got = read_contents(seg40.read(offset, 10000))
        assert got == contents(ms1)
        offset += 1
    assert seg40.read_next_offset() == 70


def test_case_24_truncate_to_offset_in_gap(seg40):
    """Case 24 [LogSegmentTest.shouldTruncateEvenIfOffsetPointsToAGapInTheLog]: batches at 40 and
    43, truncateTo(41) removes the batch at 43."""
    ms1 = records(40, "first message")
    seg40.append(40, NO_TIMESTAMP, -1, ms1)
    seg40.append(43, NO_TIMESTAMP, -1, records(43, "message after gap"))
    removed = seg40.truncate_to(41)
    assert removed == len(records(43, "message after gap"))
    info = seg40.read(40, 10000)
    batches = info.batches()
    assert len(batches) == 1 and batches[0].base_offset == 40
    assert seg40.size == len(ms1) == os.path.getsize(seg40.log.path)


def test_case_24_truncate_in_middle_of_batch_removes_whole_batch(seg40):
    """§4.4: truncation is by batch: a target inside a batch removes that whole batch."""
    b1 = records(40, "a", "b", "c")
    seg40.append(42, NO_TIMESTAMP, -1, b1)
    seg40.append(45, NO_TIMESTAMP, -1, records(43, "d", "e", "f"))
    seg40.truncate_to(44)
    assert seg40.size == len(b1)
    assert seg40.read_next_offset() == 43


def test_case_25_truncate_full(tmp_path):
    """Case 25 [LogSegmentTest.testTruncateFull]: truncating below everything empties the
    segment, resets the roll timer, leaves the indexes not full, and re-appending works."""
    clock = ManualClock()
    seg = make_segment(tmp_path / "s", 40, clock=clock)
    seg.append(41, NO_TIMESTAMP, -1, records(40, "hello", "there"))
    clock.advance(500)
    assert seg.time_waited_for_roll(clock.milliseconds(), NO_TIMESTAMP) == 500
    seg.truncate_to(0)
    assert seg.time_waited_for_roll(clock.milliseconds(), NO_TIMESTAMP) == 0
    assert not seg.time_index.is_full()
    assert not seg.offset_index.is_full()
    assert seg.read(0, 1024) is None, "segment should be empty"
    assert seg.size == 0
    again = records(40, "hello", "there")
    seg.append(41, NO_TIMESTAMP, -1, again)
    assert read_contents(seg.read(40, 1024)) == contents(again)
    seg.close()


def test_case_26_truncate_empty_reopened_segment(tmp_path):
    """Case 26 [LogSegmentTest.testTruncateEmptySegment]: closed (indexes trimmed to 0 bytes),
    reopened, truncated: indexes resized so it doesn't roll for fullness; an empty segment doesn't
    roll for time; it does roll when the next offset can't be stored relatively."""
    max_segment_ms = 300000
    clock = ManualClock()
    d = tmp_path / "s"
    seg = make_segment(d, 0, clock=clock)
    seg.close()
    reopened = make_segment(d, 0, clock=clock, file_already_exists=True)
    assert os.path.getsize(reopened.time_index.path) == 0
    assert os.path.getsize(reopened.offset_index.path) == 0
    assert reopened.time_index.size_in_bytes == 0 and reopened.offset_index.size_in_bytes == 0

    clock.advance(500)
    reopened.truncate_to(57)
    assert reopened.time_waited_for_roll(clock.milliseconds(), NO_TIMESTAMP) == 0
    assert not reopened.time_index.is_full()
    assert not reopened.offset_index.is_full()
    params = RollParams(max_segment_ms, INT_MAX, NO_TIMESTAMP, 100, 1024, clock.milliseconds())
    assert not reopened.should_roll(params)

    clock.advance(max_segment_ms + 1)
    assert reopened.time_waited_for_roll(clock.milliseconds(), NO_TIMESTAMP) == max_segment_ms + 1
    params = RollParams(max_segment_ms, INT_MAX, NO_TIMESTAMP, 100, 1024, clock.milliseconds())
    assert not reopened.should_roll(params)

    params = RollParams(max_segment_ms, INT_MAX, NO_TIMESTAMP, INT_MAX + 200, 1024,
                        clock.milliseconds())
    assert reopened.should_roll(params)
    assert reopened.roll_reasons(params) == ["relative offset overflow"]
    reopened.close()


def test_case_27_reload_largest_timestamp_and_next_offset_after_truncation(tmp_path):
    """Case 27 [LogSegmentTest.testReloadLargestTimestampAndNextOffsetAfterTruncation]: interval
    2s-1, 30 appends -> next offset 70, 14 time-index entries; truncateTo(41) -> 0 entries,
    largest timestamp 400 (the remaining batch's), next offset 41."""
    s = len(records(0, "hello"))
    seg = make_segment(tmp_path / "s", 40, interval=2 * s - 1)
    offset = 40
    for _ in range(30):
        seg.append(offset, offset, offset, records(offset, "hello"))
        offset += 1
    assert seg.read_next_offset() == 70
    assert seg.time_index.entries == 30 // 2 - 1
    seg.truncate_to(41)
    assert seg.time_index.entries == 0
    assert seg.largest_timestamp == 400
    assert seg.read_next_offset() == 41
    seg.close()


@pytest.mark.parametrize("base_offset,largest_offset", [
    (0, -2147483648), (0, 2147483648), (1, 0), (100, 10), (2147483648, 0),
    (-2147483648, 0), (2147483648, 4294967296)])
def test_case_28_append_offset_overflow(tmp_path, base_offset, largest_offset):
    """Case 28 [LogSegmentTest.testAppendForLogSegmentOffsetOverflowException]: largest offset below
    the base or more than Integer.MAX_VALUE above it -> LogSegmentOffsetOverflowException, and
    nothing is written."""
    if base_offset < 0:
        # kstore refuses to *name* files for a negative base offset, so build this one by hand.
        d = tmp_path / "neg"
        d.mkdir()
        seg = LogSegment(FileRecords(str(d / "neg.log")),
                         OffsetIndex(str(d / "neg.index"), base_offset, 1000),
                         TimeIndex(str(d / "neg.timeindex"), base_offset, 1500),
                         base_offset, 10, 0, ManualClock())
    else:
        seg = make_segment(tmp_path / "s", base_offset)
    with pytest.raises(LogSegmentOffsetOverflowError):
        seg.append(largest_offset, T, largest_offset, records(0, "hello"))
    assert seg.size == 0 and os.path.getsize(seg.log.path) == 0
    seg.close()


def test_case_29_next_offset_calculation(seg40):
    """Case 29 [LogSegmentTest.testNextOffsetCalculation]."""
    assert seg40.read_next_offset() == 40
    seg40.append(52, NO_TIMESTAMP, -1, records(50, "hello", "there", "you"))
    assert seg40.read_next_offset() == 53


FIND_BY_TIMESTAMP = [(420, 42), (421, 43), (430, 43), (431, 44), (401, 41), (399, 40),
                     (491, None)]


@pytest.mark.parametrize("target,expected", FIND_BY_TIMESTAMP)
def test_case_30_find_offset_by_timestamp(tmp_path, target, expected):
    """Case 30 [LogSegmentTest.testFindOffsetByTimestamp] / §4.3: offsets 40..49 with timestamps
    offset*10, interval 2*size-1 -> 420->42, 421->43, 430->43, 431->44, 401->41, 399->40,
    491->none."""
    message_size = len(records(0, "msg00"))
    seg = make_segment(tmp_path / "s", 40, interval=message_size * 2 - 1)
    for i in range(40, 50):
        seg.append(i, i * 10, i, records(i, f"msg{i}"))
    assert seg.largest_timestamp == 490
    found = seg.find_offset_by_timestamp(target, 0)
    if expected is None:
        assert found is None
    else:
        assert found.offset == expected
        assert found.timestamp == expected * 10
    seg.close()


def test_case_31_recovery_fixes_corrupt_index(tmp_path):
    """Case 31 [LogSegmentTest.testRecoveryFixesCorruptIndex]: garbage from byte 5 of the .index
    to its end; after recover() every offset reads back as the first record."""
    seg = make_segment(tmp_path / "s", 0)
    for i in range(100):
        seg.append(i, NO_TIMESTAMP, -1, records(i, str(i)))
    before = seg.offset_index.entries_list()
    assert len(before) == 99
    write_nonsense(seg.offset_index.path, 5, os.path.getsize(seg.offset_index.path), seed=31)
    assert seg.offset_index.entries_list() != before  # the garbage is really visible
    assert seg.recover() == 0
    assert seg.offset_index.entries_list() == before
    for i in range(100):
        info = seg.read(i, 1, seg.size, True)
        assert info.batches()[0].records()[0].offset == i
    seg.close()


def test_case_31_recovery_fixes_corrupt_time_index(tmp_path):
    """Case 31 [LogSegmentTest.testRecoveryFixesCorruptTimeIndex]."""
    seg = make_segment(tmp_path / "s", 0)
    for i in range(100):
        seg.append(i, i * 10, i, records(i, str(i)))
    write_nonsense(seg.time_index.path, 5, os.path.getsize(seg.time_index.path), seed=311)
    seg.recover()
    for i in range(100):
        assert seg.find_offset_by_timestamp(i * 10, 0).offset == i
        if i < 99:
            assert seg.find_offset_by_timestamp(i * 10 + 1, 0).offset == i + 1
    seg.close()


def write_nonsense(path, position: int, size: int, seed: int) -> None:
    """LogSegmentTest.writeNonsenseToFile: random bytes over [position, position + size)."""
    rng = random.Random(seed)
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(rng.randbytes(size))


@pytest.mark.parametrize("seed", range(10))
def test_case_32_recovery_with_corrupt_message(tmp_path, seed):
    """Case 32 [LogSegmentTest.testRecoveryWithCorruptMessage]: 20 batches; nonsense from a random
    point (within the first 15 bytes of a random batch k) to the end; recovery keeps exactly the
    batches before k and reports the bytes dropped."""
    rng = random.Random(seed)
    seg = make_segment(tmp_path / f"s{seed}", 0)
    for j in range(20):
        seg.append(j, NO_TIMESTAMP, -1, records(j, str(j)))
    k = rng.randrange(20)
    loc = seg.log.search_for_offset_with_size(k, 0)
    position = loc.position + rng.randrange(15)
    size_before = seg.size
    write_nonsense(seg.log.path, position, size_before - position, seed=1000 + seed)
    assert seg.recover() == size_before - loc.position
    assert [b.last_offset for b in seg.log.batches()] == list(range(k))
    assert seg.size == loc.position == os.path.getsize(seg.log.path)
    assert seg.read_next_offset() == k
    seg.close()


def test_case_33_recovery_rebuilds_epoch_cache(tmp_path):
    """Case 33 [LogSegmentTest.testRecoveryRebuildsEpochCache]: batches with epochs 0, 1, 1, 2 at
    104, 106, 108, 110 -> cache [(0,104), (1,106), (2,110)]."""
    seg = make_segment(tmp_path / "s", 0)
    checkpoint = tmp_path / "s" / "leader-epoch-checkpoint"
    cache = LeaderEpochFileCache(str(checkpoint))
    for base, epoch in ((104, 0), (106, 1), (108, 1), (110, 2)):
        batch = build_batch([Record(None, b"a"), Record(None, b"b")], base_offset=base,
                            partition_leader_epoch=epoch)
        seg.append(base + 1, NO_TIMESTAMP, base, batch)
    seg.recover(epoch_cache=cache)
    assert [tuple(e) for e in cache.entries()] == [(0, 104), (1, 106), (2, 110)]
    assert checkpoint.read_text() == "0\n3\n0 104\n1 106\n2 110\n"
    seg.close()


def test_case_34_change_file_suffixes(seg40):
    """Case 34 [LogSegmentTest.testChangeFileSuffixes]: every file gets the suffix; the segment
    keeps working. (kstore has no .txnindex, so there are three files, not four.)"""
    ms = records(40, "hello")
    seg40.append(40, T, 40, ms)
    old = [seg40.log.path, seg40.offset_index.path, seg40.time_index.path]
    seg40.change_file_suffixes("", ".deleted")
    new = [seg40.log.path, seg40.offset_index.path, seg40.time_index.path]
    assert new == [p + ".deleted" for p in old]
    assert all(os.path.exists(p) for p in new)
    assert not any(os.path.exists(p) for p in old)
    assert sorted(os.listdir(os.path.dirname(old[0]))) == sorted(
        os.path.basename(p) for p in new)
    assert read_contents(seg40.read(40, 1000)) == contents(ms)
    seg40.change_file_suffixes(".deleted", "")
    assert [seg40.log.path, seg40.offset_index.path, seg40.time_index.path] == old
    assert all(os.path.exists(p) for p in old)


# ============================================================================================
# §2.6 index interval consequences
# ============================================================================================

def sized_batch(offset: int, size: int, ts: int = T) -> bytes:
    """One record with a null key and a value chosen so the batch is exactly `size` bytes
    (61 header + 9 record overhead for a value of 64..8191 bytes)."""
    data = build_batch([Record(None, b"x" * (size - 70), ts)], base_offset=offset)
    assert len(data) == size
    return data


def test_index_interval_4096_with_1000_byte_appends(tmp_path):
    """§2.6: first entry on the 6th append (5000 > 4096), then every 5th; an entry holds the
    append's last offset and the position where that append started."""
    seg = make_segment(tmp_path / "s", 0, interval=4096)
    for i in range(20):
        seg.append(i, T + i, i, sized_batch(i, 1000, T + i))
    assert seg.offset_index.entries_list() == [(5, 5000), (10, 10000), (15, 15000)]
    assert seg.time_index.entries_list() == [(T + 5, 5), (T + 10, 10), (T + 15, 15)]
    seg.close()


def test_index_interval_two_s_minus_one(tmp_path):
    """§2.6: interval 2s-1 with s-byte appends -> entries on appends 3, 5, 7, ... (30 -> 14)."""
    s = 200
    seg = make_segment(tmp_path / "s", 1000, interval=2 * s - 1)
    for i in range(30):
        seg.append(1000 + i, T + i, 1000 + i, sized_batch(1000 + i, s, T + i))
    assert seg.offset_index.entries == 14
    assert seg.offset_index.entries_list() == [(1000 + a - 1, (a - 1) * s) for a in range(3, 30, 2)]
    assert seg.time_index.entries == 14
    seg.close()


def test_index_interval_zero_indexes_every_append_but_the_first(tmp_path):
    s = 150
    seg = make_segment(tmp_path / "s", 0, interval=0)
    for i in range(10):
        seg.append(i, T + i, i, sized_batch(i, s, T + i))
    assert seg.offset_index.entries_list() == [(k, k * s) for k in range(1, 10)]
    seg.close()


def test_index_entry_holds_last_offset_of_multi_record_append(tmp_path):
    """§2.1 [note]: the offset index stores the append's *last* offset with its *start* position."""
    seg = make_segment(tmp_path / "s", 0, interval=0)
    b1 = records(0, "a", "b", "c")
    b2 = records(3, "d", "e", "f")
    seg.append(2, NO_TIMESTAMP, -1, b1)
    seg.append(5, NO_TIMESTAMP, -1, b2)
    assert seg.offset_index.entries_list() == [(5, len(b1))]
    info = seg.read(3, 10**6)
    assert info.fetch_offset_metadata == LogOffsetMetadata(3, 0, len(b1))
    assert [c[0] for c in read_contents(info)] == [3, 4, 5]
    with open(seg.log.path, "rb") as f:
        assert f.read() == b1 + b2  # the .log is exactly the appended batches
    seg.close()


# ============================================================================================
# §4.2 reads
# ============================================================================================

@pytest.fixture
def two_batches(tmp_path):
    seg = make_segment(tmp_path / "s", 0)
    b1 = build_batch([Record(None, b"v%d" % i, T + i) for i in range(10)], base_offset=0)
    b2 = build_batch([Record(None, b"v%d" % i, T + i) for i in range(10, 20)], base_offset=10)
    seg.append(9, T + 9, 9, b1)
    seg.append(19, T + 19, 19, b2)
    yield seg, b1, b2
    seg.close()


def test_read_from_mid_batch_returns_whole_batch(two_batches):
    """§4.2: a read from offset 5 returns the batch 0..9 from its start (and what follows)."""
    seg, b1, b2 = two_batches
    info = seg.read(5, 10**6)
    assert info.fetch_offset_metadata == LogOffsetMetadata(5, 0, 0)
    assert info.records.position == 0 and info.size == len(b1) + len(b2)
    assert [c[0] for c in read_contents(info)] == list(range(20))
    info = seg.read(15, 10**6)
    assert info.fetch_offset_metadata == LogOffsetMetadata(15, 0, len(b1))
    assert info.batches()[0].base_offset == 10
    assert [c[0] for c in read_contents(info)] == list(range(10, 20))


def test_read_ending_inside_a_batch_drops_partial_batch(two_batches):
    """§4.2: the slice may end inside a batch; FetchDataInfo.batches() drops the partial one."""
    seg, b1, b2 = two_batches
    info = seg.read(0, len(b1) + 10)
    assert info.size == len(b1) + 10
    assert info.records.read_bytes() == (b1 + b2)[:len(b1) + 10]
    assert [b.base_offset for b in info.batches()] == [0]
    # the cut leaves the next batch's header readable (>= 17 bytes) but not its body
    info = seg.read(0, len(b1) + 61)
    assert info.size == len(b1) + 61 < len(b1) + len(b2)
    assert [b.base_offset for b in info.batches()] == [0]
    assert [c[0] for c in read_contents(info)] == list(range(10))
    info = seg.read(0, 10)
    assert info.size == 10 and info.batches() == []


def test_read_min_one_message_returns_first_batch_whole(two_batches):
    """§4.2 step 3: minOneMessage -> max(maxSize, first batch size)."""
    seg, b1, _ = two_batches
    info = seg.read(3, 1, None, True)
    assert info.size == len(b1)
    assert [b.base_offset for b in info.batches()] == [0]


def test_read_respects_max_position(two_batches):
    """§4.2 step 5: fetchSize = min(maxPosition - startPosition, adjustedMaxSize)."""
    seg, b1, b2 = two_batches
    info = seg.read(0, 10**6, len(b1))
    assert info.size == len(b1)
    assert [b.base_offset for b in info.batches()] == [0]
    info = seg.read(0, 0)
    assert info.size == 0 and info.fetch_offset_metadata == LogOffsetMetadata(0, 0, 0)


# ============================================================================================
# §4.1 roll conditions
# ============================================================================================

def params(*, ms=10**9, max_bytes=INT_MAX, max_ts=NO_TIMESTAMP, max_offset=1, size=100, now=0):
    return RollParams(ms, max_bytes, max_ts, max_offset, size, now)


def test_roll_for_segment_bytes(tmp_path):
    """§4.1.1: roll iff size > segment.bytes - messagesSize."""
    clock = ManualClock()
    seg = make_segment(tmp_path / "s", 0, clock=clock)
    b = records(0, "hello")
    seg.append(0, NO_TIMESTAMP, -1, b)
    S, m = len(b), 50
    now = clock.milliseconds()
    over = params(max_bytes=S + m - 1, size=m, now=now)
    assert seg.should_roll(over)
    assert seg.roll_reasons(over) == ["segment.bytes"]
    fits = params(max_bytes=S + m, size=m, now=now)
    assert not seg.should_roll(fits)
    assert seg.roll_reasons(fits) == []
    seg.close()


def test_roll_for_segment_ms_by_record_timestamps(tmp_path):
    """§4.1.2: with timestamps, time waited = incoming max timestamp - first batch's timestamp;
    roll iff > segment.ms - jitter."""
    clock = ManualClock()
    seg = make_segment(tmp_path / "s", 0, clock=clock)
    seg.append(0, T, 0, records(0, "hello", ts=T))
    now = clock.milliseconds()
    assert seg.time_waited_for_roll(now, T + 1001) == 1001
    assert seg.should_roll(params(ms=1000, max_ts=T + 1001, now=now))
    assert seg.roll_reasons(params(ms=1000, max_ts=T + 1001, now=now)) == ["segment.ms"]
    assert not seg.should_roll(params(ms=1000, max_ts=T + 1000, now=now))
    # the wall clock doesn't matter when the segment has timestamps
    clock.advance(10**7)
    assert not seg.should_roll(params(ms=1000, max_ts=T + 1000, now=clock.milliseconds()))
    seg.close()


def test_roll_for_segment_ms_with_jitter(tmp_path):
    seg = make_segment(tmp_path / "s", 0, roll_jitter_ms=300)
    seg.append(0, T, 0, records(0, "hello", ts=T))
    assert seg.should_roll(params(ms=1000, max_ts=T + 701))
    assert not seg.should_roll(params(ms=1000, max_ts=T + 700))
    seg.close()


def test_roll_for_segment_ms_by_wall_clock_without_timestamps(tmp_path):
    """§4.1.2: no timestamp in the first batch -> now - segment creation time."""
    clock = ManualClock()
    seg = make_segment(tmp_path / "s", 0, clock=clock)
    seg.append(0, NO_TIMESTAMP, -1, records(0, "hello", ts=NO_TIMESTAMP))
    clock.advance(1000)
    assert not seg.should_roll(params(ms=1000, now=clock.milliseconds()))
    clock.advance(1)
    assert seg.should_roll(params(ms=1000, now=clock.milliseconds()))
    assert seg.roll_reasons(params(ms=1000, now=clock.milliseconds())) == ["segment.ms"]
    seg.close()


def test_empty_segment_never_rolls_for_time(tmp_path):
    clock = ManualClock()
    seg = make_segment(tmp_path / "s", 0, clock=clock)
    clock.advance(10**9)
    assert not seg.should_roll(params(ms=1, max_ts=T + 10**9, now=clock.milliseconds()))
    seg.close()


def test_roll_for_full_offset_index(tmp_path):
    """§4.1.3 / §2.7: segment.index.bytes 24 -> 3 offset slots; 4 appends with interval 0 fill
    it. No timestamps, so the time index stays empty (and not full)."""
    seg = make_segment(tmp_path / "s", 0, interval=0, index_bytes=24)
    for i in range(3):
        seg.append(i, NO_TIMESTAMP, -1, records(i, "v", ts=NO_TIMESTAMP))
    assert not seg.should_roll(params())
    seg.append(3, NO_TIMESTAMP, -1, records(3, "v", ts=NO_TIMESTAMP))
    assert seg.offset_index.entries == 3 and seg.time_index.entries == 0
    assert seg.should_roll(params())
    assert seg.roll_reasons(params()) == ["offset index full"]
    seg.close()


def test_roll_for_full_time_index(tmp_path):
    """§4.1.4 / §2.4: segment.index.bytes 24 -> 2 time slots, full at 1 entry (one reserved)."""
    seg = make_segment(tmp_path / "s", 0, interval=0, index_bytes=24)
    seg.append(0, 10, 0, records(0, "v", ts=10))
    assert not seg.should_roll(params(max_ts=20))
    seg.append(1, 20, 1, records(1, "v", ts=20))
    assert seg.time_index.entries == 1 and seg.offset_index.entries == 1
    assert seg.should_roll(params(max_ts=20))
    assert seg.roll_reasons(params(max_ts=20)) == ["time index full"]
    # The reserved slot takes the final entry on roll.
    seg.on_become_inactive_segment()
    seg.close()


@pytest.mark.parametrize("max_offset", [1000 + INT_MAX + 1, 999])
def test_roll_for_relative_offset_overflow(tmp_path, max_offset):
    """§4.1.5: the append's last offset can't be stored relative to the base."""
    seg = make_segment(tmp_path / "s", 1000)
    p = params(max_offset=max_offset)
    assert seg.should_roll(p)
    assert seg.roll_reasons(p) == ["relative offset overflow"]
    assert not seg.should_roll(params(max_offset=1000 + INT_MAX))
    seg.close()


def test_on_become_inactive_segment_trims_files(tmp_path):
    """§4.1 roll procedure: final time-index entry, indexes and .log trimmed."""
    seg = make_segment(tmp_path / "s", 0, interval=0, init_file_size=MiB, preallocate=True)
    b0, b1 = records(0, "a", ts=T), records(1, "b", ts=T + 7)
    seg.append(0, T, 0, b0)
    seg.append(1, T + 7, 1, b1)
    seg.append(2, T + 5, 2, records(2, "c", ts=T + 5))
    seg.on_become_inactive_segment()
    assert os.path.getsize(seg.log.path) == seg.size
    assert os.path.getsize(seg.offset_index.path) == 8 * seg.offset_index.entries == 16
    assert seg.time_index.entries_list() == [(T + 7, 1)]
    assert os.path.getsize(seg.time_index.path) == 12
    seg.close()


# ============================================================================================
# §5.2 recovery after damage to the .log
# ============================================================================================

def ten_batch_segment(directory):
    seg = make_segment(directory, 0)
    data = [records(i, f"value-{i}", ts=T + i) for i in range(10)]
    for i, b in enumerate(data):
        seg.append(i, T + i, i, b)
    positions = [sum(len(b) for b in data[:i]) for i in range(10)]
    seg.close()
    return data, positions


@pytest.mark.parametrize("k,cut", [(6, 1), (6, 16), (6, 30), (9, -1), (3, 61)])
def test_recover_after_log_truncated_mid_batch(tmp_path, k, cut):
    """A .log cut inside batch k (a torn write): recovery keeps batches 0..k-1, reports the bytes
    of the partial batch as dropped, and rebuilds the indexes."""
    d = tmp_path / "s"
    data, positions = ten_batch_segment(d)
    log_path = d / "00000000000000000000.log"
    end = positions[k] + (cut if cut > 0 else len(data[k]) + cut)
    os.truncate(log_path, end)
    seg = make_segment(d, 0, file_already_exists=True)
    assert seg.recover() == end - positions[k]
    assert [b.last_offset for b in seg.log.batches()] == list(range(k))
    assert os.path.getsize(log_path) == positions[k] == seg.size
    assert seg.read_next_offset() == k
    assert seg.offset_index.entries_list() == [(i, positions[i]) for i in range(1, k)]
    assert seg.max_timestamp_so_far == T + k - 1
    seg.close()


@pytest.mark.parametrize("k,byte_in_batch", [(0, 70), (4, 21), (4, 40), (7, 57), (9, 62)])
def test_recover_after_flipped_byte(tmp_path, k, byte_in_batch):
    """A flipped CRC-covered byte in batch k: recovery keeps exactly batches 0..k-1 and drops the
    rest of the file (everything after the first bad batch goes)."""
    d = tmp_path / "s"
    data, positions = ten_batch_segment(d)
    log_path = d / "00000000000000000000.log"
    total = os.path.getsize(log_path)
    at = positions[k] + min(byte_in_batch, len(data[k]) - 1)
    with open(log_path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x01]))
    seg = make_segment(d, 0, file_already_exists=True)
    assert seg.recover() == total - positions[k]
    assert [b.last_offset for b in seg.log.batches()] == list(range(k))
    assert os.path.getsize(log_path) == positions[k]
    assert seg.read_next_offset() == k
    seg.close()


def test_recover_after_length_field_below_minimum(tmp_path):
    """A batchLength < 14 (CorruptRecordException while scanning) stops recovery there."""
    d = tmp_path / "s"
    data, positions = ten_batch_segment(d)
    log_path = d / "00000000000000000000.log"
    total = os.path.getsize(log_path)
    with open(log_path, "r+b") as f:
        f.seek(positions[5] + 8)
        f.write(struct.pack(">i", 3))
    seg = make_segment(d, 0, file_already_exists=True)
    assert seg.recover() == total - positions[5]
    assert [b.last_offset for b in seg.log.batches()] == [0, 1, 2, 3, 4]
    seg.close()


def test_recover_undamaged_log_drops_nothing(tmp_path):
    d = tmp_path / "s"
    data, positions = ten_batch_segment(d)
    seg = make_segment(d, 0, file_already_exists=True)
    assert seg.recover() == 0
    assert seg.size == sum(len(b) for b in data)
    assert seg.offset_index.entries_list() == [(i, positions[i]) for i in range(1, 10)]
    assert seg.find_offset_by_timestamp(T + 4, 0).offset == 4
    seg.close()

"""Property tests (hypothesis): the batch format round-trips, varints round-trip, and the log
behaves like a plain list under any sequence of appends, rolls, reads, timestamp lookups,
truncations, flushes and clean or unclean restarts.

Examples: `KSTORE_HYPOTHESIS_EXAMPLES` (default 60); with `CI=true` the runs are derandomized so
CI is deterministic.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kafka.record.memory_records import MemoryRecords as KafkaMemoryRecords
from kafka.record.util import encode_varint as kafka_encode_varint

from kstore import LogManager, ManualClock, Record, varint
from kstore.compression import Compression
from kstore.errors import InvalidRecordError, RecordBatchTooLargeError
from kstore.records import NO_SEQUENCE, MemoryRecords, RecordBatch, TimestampType, build_batch

EXAMPLES = int(os.environ.get("KSTORE_HYPOTHESIS_EXAMPLES", "60"))
CI = os.environ.get("CI") == "true"

SETTINGS = settings(deadline=None, max_examples=EXAMPLES, derandomize=CI, database=None if CI else
                    settings.default.database,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

INT32_MIN, INT32_MAX = varint.INT32_MIN, varint.INT32_MAX
INT64_MIN, INT64_MAX = varint.INT64_MIN, varint.INT64_MAX


# ------------------------------------------------------------------------------ batch round trip
payload = st.none() | st.binary(max_size=300)
headers = st.lists(st.tuples(st.text(max_size=12), st.none() | st.binary(max_size=40)),
                   max_size=4).map(tuple)
# Any timestamps whose pairwise differences still fit a varlong: wide, negative deltas included.
timestamps = st.one_of(st.integers(-(1 << 61), 1 << 61),
                       st.integers(1_600_000_000_000, 1_800_000_000_000), st.just(-1))
records_st = st.lists(st.builds(Record, key=payload, value=payload, timestamp=timestamps,
                                headers=headers), max_size=12)


@st.composite
def batch_args(draw):
    records = draw(records_st)
    args = dict(
        base_offset=draw(st.integers(0, (1 << 62))),
        compression=draw(st.sampled_from(list(Compression))),
        timestamp_type=draw(st.sampled_from(list(TimestampType))),
        partition_leader_epoch=draw(st.integers(-1, INT32_MAX)),
        producer_id=draw(st.just(-1) | st.integers(0, INT64_MAX)),
        producer_epoch=draw(st.just(-1) | st.integers(0, 32767)),
        base_sequence=draw(st.just(NO_SEQUENCE) | st.integers(0, INT32_MAX)
                           | st.integers(INT32_MAX - 12, INT32_MAX)),
        transactional=draw(st.booleans()),
    )
    return records, args


def expected_records(records, args) -> list[Record]:
    max_ts = max((r.timestamp for r in records), default=-1)
    out = []
    for i, r in enumerate(records):
        ts = max_ts if args["timestamp_type"] is TimestampType.LOG_APPEND_TIME else r.timestamp
        # Sequences wrap from Integer.MAX_VALUE to 0.
        seq = NO_SEQUENCE if args["base_sequence"] < 0 else \
            (args["base_sequence"] + i) % (INT32_MAX + 1)
        out.append(Record(r.key, r.value, ts, r.headers, args["base_offset"] + i, seq))
    return out


@SETTINGS
@given(batch_args(), st.integers(min_value=0))
@example(([Record(None, None, 5), Record(b"", b"", -7, (("", None),))],
          dict(base_offset=0, compression=Compression.NONE,
               timestamp_type=TimestampType.CREATE_TIME, partition_leader_epoch=-1,
               producer_id=-1, producer_epoch=-1, base_sequence=INT32_MAX, transactional=False)),
         0)
def test_batch_round_trip(case, flip):
    records, args = case
    buf = build_batch(records, **args)
    batch = RecordBatch(buf)
    assert batch.size_in_bytes == len(buf)
    batch.ensure_valid()
    assert batch.is_valid()
    assert batch.magic == 2
    assert batch.base_offset == args["base_offset"]
    assert batch.records_count == len(records)
    assert batch.last_offset_delta == max(len(records) - 1, 0)
    assert batch.compression is args["compression"]
    assert batch.timestamp_type is args["timestamp_type"]
    assert batch.partition_leader_epoch == args["partition_leader_epoch"]
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == \
        (args["producer_id"], args["producer_epoch"], args["base_sequence"])
    assert batch.is_transactional == args["transactional"] and not batch.is_control
    assert batch.max_timestamp == max((r.timestamp for r in records), default=-1)
    assert batch.records() == expected_records(records, args)
    # The same bytes as a buffer of batches, with a partial trailing copy that must be dropped.
    mem = MemoryRecords(buf + buf[:len(buf) // 2])
    assert [b.to_bytes() for b in mem.batches()] == [buf]
    # A flipped byte in the CRC-covered part (attributes to the end) is detected.
    damaged = bytearray(buf)
    damaged[21 + flip % (len(buf) - 21)] ^= 1 + flip % 255
    assert not RecordBatch(bytes(damaged)).is_valid()


@SETTINGS
@given(batch_args(), st.sampled_from([Compression.NONE, Compression.GZIP]))
def test_kafka_python_reads_our_batches(case, codec):
    records, args = case
    args = dict(args, compression=codec)
    buf = build_batch(records, **args)
    kafka = KafkaMemoryRecords(buf)
    kbatch = kafka.next_batch()
    assert kbatch is not None and kafka.next_batch() is None
    assert kbatch.validate_crc()
    assert kbatch.base_offset == args["base_offset"]
    assert kbatch.producer_id == args["producer_id"]
    assert kbatch.producer_epoch == args["producer_epoch"]
    assert kbatch.base_sequence == args["base_sequence"]
    assert bool(kbatch.is_transactional) == args["transactional"]
    assert kbatch.compression_type == int(codec)
    assert kbatch.max_timestamp == max((r.timestamp for r in records), default=-1)
    got = [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in kbatch]
    want = [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers))
            for r in expected_records(records, args)]
    assert got == want


# ------------------------------------------------------------------------------ varints
# Values around every encoded-length boundary (a new 7-bit group after zig-zag) and the range ends.
def _edges(bits: int) -> list[int]:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    out = {lo, lo + 1, hi - 1, hi, 0}
    for k in range(1, bits // 7 + 2):
        for u in range((1 << (7 * k)) - 2, (1 << (7 * k)) + 3):
            n = varint.zigzag_decode(u)
            if lo <= n <= hi:
                out.add(n)
    return sorted(out)


EDGES32 = _edges(32)
EDGES64 = _edges(64) + [INT32_MAX + 1, INT32_MIN - 1]


def test_varint_edges_all_round_trip():
    for n in EDGES32:
        enc = varint.write_varint(n)
        assert varint.read_varint(enc, 0) == (n, len(enc)) and varint.size_of_varint(n) == len(enc)
    for n in EDGES64:
        enc = varint.write_varlong(n)
        assert varint.read_varlong(enc, 0) == (n, len(enc)) and varint.size_of_varlong(n) == len(enc)
    assert len(varint.write_varint(INT32_MIN)) == 5 and len(varint.write_varlong(INT64_MIN)) == 10


@SETTINGS
@given(st.sampled_from(EDGES32) | st.integers(INT32_MIN, INT32_MAX))
def test_varint_round_trip(n):
    enc = varint.write_varint(n)
    assert varint.read_varint(enc + b"\x7f", 0) == (n, len(enc))
    assert varint.size_of_varint(n) == len(enc) <= varint.MAX_VARINT_BYTES
    theirs = bytearray()
    kafka_encode_varint(n, theirs.append)  # Kafka/kafka-python zig-zag: the same bytes
    assert bytes(theirs) == enc
    # A one-byte prefix of a multi-byte encoding is not a value.
    if len(enc) > 1:
        with pytest.raises(InvalidRecordError):
            varint.read_varint(enc[:-1], 0)


@SETTINGS
@given(st.sampled_from(EDGES64) | st.integers(INT64_MIN, INT64_MAX))
def test_varlong_round_trip(n):
    enc = varlong = varint.write_varlong(n)
    assert varint.read_varlong(b"\x00" + enc, 1) == (n, len(enc) + 1)
    assert varint.size_of_varlong(n) == len(varlong) <= varint.MAX_VARLONG_BYTES
    theirs = bytearray()
    kafka_encode_varint(n, theirs.append)
    assert bytes(theirs) == enc


@SETTINGS
@given(st.integers(INT32_MAX + 1, 1 << 80) | st.integers(-(1 << 80), INT32_MIN - 1))
def test_varint_rejects_out_of_range(n):
    with pytest.raises(ValueError):
        varint.write_varint(n)
    if not INT64_MIN <= n <= INT64_MAX:
        with pytest.raises(ValueError):
            varint.write_varlong(n)
    else:
        # A varlong that does not fit 32 bits is not a varint.
        with pytest.raises(InvalidRecordError):
            varint.read_varint(varint.write_varlong(n), 0)


# ------------------------------------------------------------------------------ the log vs a list
TOPIC, PARTITION = "prop", 0
LOG_CONFIG = {"segment.bytes": 600, "index.interval.bytes": 100, "segment.ms": 400,
              "file.delete.delay.ms": 0}
T0 = 1_700_000_000_000


class LogMachine(RuleBasedStateMachine):
    """The model: a list of records (offset = index) and the (base, last) offsets of each batch."""

    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="kstore-prop-")
        self.clock = ManualClock(T0)
        self.manager = LogManager.open(self.tmp, LOG_CONFIG, self.clock)
        self.log = self.manager.get_or_create_log(TOPIC, PARTITION)
        self.model: list[Record] = []
        self.batches: list[tuple[int, int]] = []
        self.flushed_to = 0

    def teardown(self):
        try:
            for log in self.manager.logs().values():
                if not log.closed:
                    log.close_without_flush()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- helpers
    def _expect_record(self, got: Record, offset: int) -> None:
        want = self.model[offset]
        assert (got.offset, got.key, got.value, got.timestamp, got.headers) == \
            (offset, want.key, want.value, want.timestamp, want.headers), (got, offset)

    def _batch_of(self, offset: int) -> tuple[int, int]:
        return next(b for b in self.batches if b[0] <= offset <= b[1])

    def _reopen(self) -> None:
        self.manager = LogManager.open(self.tmp, LOG_CONFIG, self.clock)
        self.log = self.manager.get_log(TOPIC, PARTITION)
        assert self.log is not None

    # ---- rules
    @rule(sizes=st.lists(st.integers(0, 120), min_size=1, max_size=5),
          steps=st.lists(st.integers(0, 60), min_size=5, max_size=5),
          keyed=st.booleans())
    def append(self, sizes, steps, keyed):
        recs = []
        for i, size in enumerate(sizes):
            self.clock.advance(steps[i])
            off = len(self.model) + i
            recs.append(Record(f"k{off}".encode() if keyed else None,
                               bytes([off % 251]) * size, self.clock.milliseconds(),
                               (("i", str(i).encode()),) if i % 2 else ()))
        if len(build_batch(recs)) > LOG_CONFIG["segment.bytes"]:
            with pytest.raises(RecordBatchTooLargeError):
                self.log.append(recs)
            return
        info = self.log.append(recs)
        first = len(self.model)
        assert (info.first_offset, info.last_offset) == (first, first + len(recs) - 1)
        self.model.extend(recs)
        self.batches.append((first, first + len(recs) - 1))

    @rule()
    def roll(self):
        before = self.log.number_of_segments
        empty = self.log.active_segment.size == 0
        self.log.roll()
        assert self.log.number_of_segments == before + (0 if empty else 1)
        assert self.log.active_segment.base_offset == len(self.model)

    @rule(data=st.data(), max_bytes=st.integers(0, 1500))
    def read(self, data, max_bytes):
        offset = data.draw(st.integers(0, len(self.model)), label="offset")
        fetch = self.log.read(offset, max_bytes)
        batches = fetch.batches()
        if offset == len(self.model):
            assert batches == [] and fetch.size == 0
            return
        base, last = self._batch_of(offset)
        assert batches, "min_one_message: the batch holding the offset comes back whole"
        assert (batches[0].base_offset, batches[0].last_offset) == (base, last)
        assert fetch.size <= max(max_bytes, batches[0].size_in_bytes)
        expected_next = base
        for b in batches:
            b.ensure_valid()
            assert (b.base_offset, b.last_offset) in self.batches
            assert b.base_offset == expected_next
            for r in b.records():
                self._expect_record(r, r.offset)
            expected_next = b.next_offset

    @rule(data=st.data())
    def read_records(self, data):
        offset = data.draw(st.integers(0, len(self.model)), label="offset")
        got = self.log.read_records(offset)
        if offset == len(self.model):
            assert got == []
            return
        assert got and got[0].offset == offset
        for i, r in enumerate(got):
            self._expect_record(r, offset + i)

    @rule(data=st.data())
    def fetch_offset_by_timestamp(self, data):
        stamps = [r.timestamp for r in self.model]
        choices = st.integers(T0 - 5, self.clock.milliseconds() + 5)
        if stamps:
            choices = choices | st.sampled_from(stamps).flatmap(
                lambda t: st.sampled_from([t - 1, t, t + 1]))
        target = data.draw(choices, label="target")
        ans = self.log.fetch_offset_by_timestamp(target)
        want = next((i for i, t in enumerate(stamps) if t >= target), None)
        if want is None:
            assert ans is None, (target, ans)
        else:
            assert ans is not None and (ans.offset, ans.timestamp) == (want, stamps[want]), \
                (target, ans, want)
        assert self.log.fetch_offset_by_timestamp(-1).offset == len(self.model)
        assert self.log.fetch_offset_by_timestamp(-2).offset == 0

    @rule(data=st.data())
    def truncate_to(self, data):
        # Followers truncate to batch boundaries (a target inside a batch would remove the whole
        # batch while the LEO becomes the target, as in Kafka).
        boundaries = [b for b, _ in self.batches] + [len(self.model)]
        target = data.draw(st.sampled_from(boundaries), label="target")
        changed = self.log.truncate_to(target)
        assert changed == (target < len(self.model))
        del self.model[target:]
        self.batches = [b for b in self.batches if b[1] < target]
        self.flushed_to = min(self.flushed_to, target)
        assert self.log.recovery_point <= target

    @rule()
    def flush(self):
        self.log.flush()
        assert self.log.recovery_point == len(self.model)
        self.flushed_to = len(self.model)

    @rule()
    def clean_restart(self):
        self.manager.shutdown()
        assert self.log.closed
        self._reopen()
        assert self.manager.had_clean_shutdown
        assert self.log.recovery_point == len(self.model)
        assert self.log.load_report.recovered_segments == []

    @rule(checkpoint=st.booleans())
    def unclean_restart(self, checkpoint):
        self.log.flush()  # nothing may be lost then
        if checkpoint:
            self.manager.checkpoint_recovery_points()
        self.log.close_without_flush()
        self._reopen()
        assert not self.manager.had_clean_shutdown
        rep = self.log.load_report
        assert rep.truncated_bytes == 0 and rep.removed_after_corruption == [], rep.summary()
        assert rep.recovered_segments, "an unclean restart recovers at least the active segment"
        got = self.log.records()
        assert len(got) == len(self.model)
        for r in got:
            self._expect_record(r, r.offset)

    # ---- invariants
    @invariant()
    def offsets_and_segments(self):
        log = self.log
        assert log.log_end_offset == len(self.model)
        assert log.log_start_offset == 0
        segments = log.segments
        bases = [s.base_offset for s in segments]
        assert bases == sorted(bases) and len(set(bases)) == len(bases)
        assert bases[0] == 0
        for seg, nxt in zip(segments, segments[1:] + [None]):
            assert seg.read_next_offset() == (nxt.base_offset if nxt else len(self.model))
            starts = {loc.position: loc.last_offset for loc in seg.log.batch_locations()}
            assert sum(loc.size for loc in seg.log.batch_locations()) == seg.size
            for e in seg.offset_index.entries_list():
                assert starts.get(e.position) == e.offset, (seg, e)
            # Time index: each entry is (largest timestamp up to its offset, the batch where it
            # was reached); a segment that is no longer active ends with its overall maximum.
            locs = list(seg.log.batch_locations())
            tentries = seg.time_index.entries_list()
            assert all(a.timestamp < b.timestamp for a, b in zip(tentries, tentries[1:]))
            for e in tentries:
                upto = [loc.max_timestamp for loc in locs if loc.last_offset <= e.offset]
                assert upto and max(upto) == e.timestamp, (seg, e)
                assert any(loc.last_offset == e.offset and loc.max_timestamp == e.timestamp
                           for loc in locs), (seg, e)
            if nxt is not None and locs:
                best = max(locs, key=lambda loc: loc.max_timestamp)  # first of equal maxima
                assert tentries and tentries[-1] == (best.max_timestamp, best.last_offset), \
                    (seg, tentries[-1:], best)


LogMachine.TestCase.settings = settings(
    deadline=None, max_examples=EXAMPLES, derandomize=CI,
    stateful_step_count=int(os.environ.get("KSTORE_HYPOTHESIS_STEPS", "30")),
    database=None if CI else settings.default.database,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much])
TestLogAgainstListModel = LogMachine.TestCase


def test_truncation_after_a_restart_keeps_the_segment_max_timestamp(tmp_path):
    """Found by the state machine: after a reopen the segment's max timestamp is loaded lazily
    from the time index; truncating the index first made it look unknown (−1), so the segment
    lost its final time-index entry on the next roll and its largest timestamp (retention.ms)
    fell back to the file's mtime."""
    clock = ManualClock(T0)
    manager = LogManager.open(str(tmp_path), LOG_CONFIG, clock)
    log = manager.get_or_create_log(TOPIC, PARTITION)
    log.append([Record(None, b"a" * 100, T0) for _ in range(4)])
    log.append([Record(None, b"b" * 40, T0) for _ in range(3)])   # rolls: segment 4 holds 4..6
    log.append([Record(None, b"c", T0 + 1)])                       # 7, indexed (T0+1, 7)
    assert [s.base_offset for s in log.segments] == [0, 4]
    manager.shutdown()
    manager = LogManager.open(str(tmp_path), LOG_CONFIG, clock)
    log = manager.get_log(TOPIC, PARTITION)
    log.truncate_to(7)
    seg = log.segments[-1]
    assert (seg.max_timestamp_so_far, seg.offset_of_max_timestamp_so_far) == (T0, 6)
    assert seg.largest_timestamp == T0
    log.roll()
    assert seg.time_index.entries_list() == [(T0, 6)]
    assert log.fetch_offset_by_timestamp(-3).offset == 0
    manager.shutdown()

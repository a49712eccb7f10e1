"""The cleaner's native fast path (kstore/_codec.c) against its pure-Python reference.

Differential property tests, as tests/test_native_codec.py does for the record codec:
`offset_map.map_keys` (building the offset map) and `cleaner.filter_records` (which records a
cleaning keeps) get the same inputs in Python and in C. Where the reference returns, the native
function returns the same value and leaves the offset map the same; where the reference raises,
the native function returns None and changes nothing, so the engine re-runs the reference and the
user sees its exception. Whole cleanings then compare byte for byte, and a learner's
`should_retain_record` plugged into the engine is really called.
"""

from __future__ import annotations

import hashlib
import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kstore import Log, ManualClock, native, records
from kstore import cleaner as cleaner_module
from kstore.cleaner import Cleaner, LogCleaner, filter_records
from kstore.errors import KStoreError
from kstore.grading import live
from kstore.offset_map import SkimpyOffsetMap, map_keys
from kstore.records import NO_SEQUENCE, RECORDS_OFFSET, Record, RecordBatch, build_batch

# The native codec's tests set the rules: the same hypothesis settings, and the module skips (or,
# with CI=true, fails) with one line naming the fix when the extension is not built.
from test_native_codec import C, SETTINGS, damaged, outcome  # noqa: E402

T = 1_700_000_000_000

keys = st.none() | st.sampled_from([b"", b"a", b"b", b"key-000001", b"x" * 70]) | st.binary(max_size=130)
values = st.none() | st.binary(max_size=40)
a_record = st.builds(Record, key=keys, value=values, timestamp=st.integers(T, T + 1000),
                     headers=st.lists(st.tuples(st.text(max_size=4), values), max_size=2).map(tuple))


def section(recs, base_offset):
    batch = RecordBatch(build_batch(recs, base_offset=base_offset))
    return bytes(batch.buffer[RECORDS_OFFSET:])


@st.composite
def offset_maps(draw, base_offset):
    """A map holding some keys (the ones records use and others) at offsets around the batch."""
    entries = {}
    for key in draw(st.lists(keys.filter(lambda k: k is not None), max_size=8)):
        entries[hashlib.md5(key).digest()] = draw(st.integers(0, base_offset + 40))
    return entries


@st.composite
def batches(draw):
    recs = draw(st.lists(a_record, min_size=1, max_size=12))
    base_offset = draw(st.integers(0, 50) | st.just((1 << 62)))
    return section(recs, base_offset), base_offset, len(recs)


# A records section damaged the way the record codec's tests damage it (truncated, bytes changed,
# inserted or deleted, a wrong count), at base offset 10.
damaged_batches = damaged().map(lambda d: (d[0], 10, d[2]))


# ------------------------------------------------------------------------------ map_keys
def table_of(entries: dict):
    table = C.offset_table()
    for digest, offset in entries.items():
        table[digest] = offset
    return table


def compare_map_keys(data, base_offset, count, start, entries, max_entries):
    """The reference on a dict; the native function on a dict and on its OffsetTable."""
    ref_entries, ref_table = dict(entries), table_of(entries)
    expected = outcome(map_keys, data, base_offset, count, start, ref_entries, max_entries)
    # the reference runs on the native table too (a map made natively, cleaned in pure Python)
    assert outcome(map_keys, data, base_offset, count, start, ref_table, max_entries) == expected
    assert dict(ref_table.items()) == ref_entries
    for nat_entries in (dict(entries), table_of(entries)):
        got = C.map_keys(data, base_offset, count, start, nat_entries, max_entries)
        if expected[0] == "ok":
            assert got == expected[1]
            assert dict(nat_entries.items()) == ref_entries
        else:
            assert got is None, expected
            assert dict(nat_entries.items()) == entries   # nothing put before the reference raises


@SETTINGS
@given(st.data(), batches(), st.integers(0, 60), st.integers(0, 12))
def test_map_keys_same_result_and_map(data, batch, start, max_entries):
    raw, base_offset, count = batch
    entries = data.draw(offset_maps(base_offset))
    compare_map_keys(raw, base_offset, count, start, entries, len(entries) + max_entries)
    compare_map_keys(memoryview(bytearray(raw)), base_offset, count, start, entries, 1 << 40)


@SETTINGS
@given(st.data(), damaged_batches)
@example(data=None, batch=(b"", 0, 1))
@example(data=None, batch=(b"\xff\xff\xff\xff\xff\x01", 0, 1))
def test_map_keys_damaged_records_defer_to_the_reference(data, batch):
    raw, base_offset, count = batch
    entries = data.draw(offset_maps(base_offset)) if data is not None else {}
    compare_map_keys(raw, base_offset, count, 0, entries, 100)


# ------------------------------------------------------------------------------ filter_records
def compare_filter(data, base_offset, count, entries, map_latest, horizon, now):
    decoded = outcome(records.decode_records, data, base_offset, 0, None, NO_SEQUENCE, count)
    for nat_entries in (dict(entries), table_of(entries)):
        got = C.filter_records(data, base_offset, count, nat_entries, map_latest, horizon, now)
        if decoded[0] == "ok":
            assert got == filter_records(decoded[1], entries, map_latest, horizon, now) == \
                filter_records(decoded[1], table_of(entries), map_latest, horizon, now)
        else:
            assert got is None, decoded


@SETTINGS
@given(st.data(), batches(), st.integers(-1, 70), st.none() | st.integers(T - 5, T + 5),
       st.integers(T - 5, T + 5))
def test_filter_records_keeps_what_the_reference_keeps(data, batch, map_latest, horizon, now):
    raw, base_offset, count = batch
    entries = data.draw(offset_maps(base_offset))
    compare_filter(raw, base_offset, count, entries, map_latest, horizon, now)


@SETTINGS
@given(st.data(), damaged_batches, st.none() | st.just(T))
def test_filter_records_damaged_records_defer_to_the_reference(data, batch, horizon):
    raw, base_offset, count = batch
    compare_filter(raw, base_offset, count, data.draw(offset_maps(base_offset)), 100, horizon, T)


@SETTINGS
@given(st.binary(max_size=80), st.integers(0, 5))
def test_random_bytes(raw, count):
    compare_map_keys(raw, 0, count, 0, {}, 10)
    compare_filter(raw, 0, count, {}, 10, None, T)


@SETTINGS
@given(st.lists(st.tuples(st.binary(min_size=16, max_size=16) | st.sampled_from([b"\0" * 16, b"\1" * 16]),
                          st.integers(-(1 << 63), (1 << 63) - 1)), max_size=300))
def test_offset_table_is_the_same_mapping_as_a_dict(puts):
    table, reference = C.offset_table(), {}
    for digest, offset in puts:                     # grows past its first 64 slots
        table[digest] = offset
        reference[digest] = offset
        assert len(table) == len(reference)
    assert sorted(table.items()) == sorted(reference.items())
    for digest, _ in puts[:20]:
        assert table[digest] == reference[digest] == table.get(digest, -1)
    assert table.get(b"\2" * 16, -1) == reference.get(b"\2" * 16, -1)
    with pytest.raises(KeyError):
        table[b"\2" * 16]
    with pytest.raises(TypeError, match="16-byte MD5 digest"):
        table[b"short"] = 1
    table.clear()
    assert len(table) == 0 and table.items() == []


def test_the_offset_map_uses_the_table_natively_and_a_dict_in_pure_python():
    assert type(SkimpyOffsetMap(slots=10).entries).__name__ == "OffsetTable"
    with native.pure_python():
        assert type(SkimpyOffsetMap(slots=10).entries) is dict


def test_keys_hashed_sixteen_at_a_time_match_hashlib():
    """map_keys hashes a batch's keys in 16 lanes when they fit one MD5 block (≤ 55 bytes), one by
    one otherwise: every length across that boundary, in groups that leave lanes idle. A key
    with a whole block of the section after it is read in place and masked (the bytes after it
    are the next fields, never zero); the last few are copied first."""
    recs = [Record(os.urandom(n), b"v", T) for n in range(0, 71)]
    data = section(recs, 0)
    in_place = [r.key for r in recs if len(r.key) <= 55 and len(data) - (data.find(r.key) + len(r.key)) >= 64]
    assert len(in_place) > 40 and all(data[data.find(k) + len(k)] != 0 for k in in_place if k)
    table = C.offset_table()
    assert C.map_keys(section(recs, 0), 0, len(recs), 0, table, 1000) == (71, False, 70)
    assert dict(table.items()) == {hashlib.md5(r.key).digest(): i for i, r in enumerate(recs)}


def test_md5_is_hashlibs():
    for n in list(range(0, 140)) + [1000, 4096]:
        data = os.urandom(n)
        assert C.md5(data) == hashlib.md5(data).digest() == SkimpyOffsetMap.hash_key(data)


# ------------------------------------------------------------------------------ whole cleanings
def _compacted_log(directory, clock) -> Log:
    """Keys overwritten in part of a batch (re-encoded), whole batches superseded (dropped), whole
    batches kept (copied), tombstones, records without a key (written while the topic is `delete`:
    a compacted topic refuses them) and headers."""
    config = {"segment.bytes": 4096, "delete.retention.ms": 1000}
    log = Log.open(str(directory / "t-0"), {**config, "cleanup.policy": "delete"}, clock)
    i = 0
    for round_ in range(6):
        for n in (1, 5, 30):
            recs = []
            for _ in range(n):
                key = None if i % 97 == 13 else b"k%d" % ((i * 7) % (11 + round_ * 3))
                value = None if i % 11 == 5 else b"v%d" % i
                recs.append(Record(key, value, T + i, (("h", b"%d" % i),) if i % 3 == 0 else ()))
                i += 1
            log.append_as_leader(build_batch(recs))
    log.close()
    log = Log.open(str(directory / "t-0"), {**config, "cleanup.policy": "compact"}, clock)
    log.roll()
    return log


def _clean_twice(directory, clock) -> tuple[list[bytes], list]:
    log = _compacted_log(directory, clock)
    cleaner = LogCleaner(str(directory), clock)
    stats = [cleaner.clean_log(log).stats]
    clock.advance(2000)            # past the tombstones' delete horizon
    log.append_as_leader(build_batch([Record(b"late", b"v", T + 5000)]))
    log.roll()
    stats.append(cleaner.clean_log(log).stats)
    files = [open(s.log.path, "rb").read() for s in log.segments]
    log.close()
    return files, stats


def _native_same_as_pure_python(cleanings, tmp_path) -> list:
    """`cleanings(directory, clock)` run with the native codec and in pure Python must write the
    same bytes and count the same stats; the native run's stats are returned."""
    native_files, native_stats = cleanings(tmp_path / "native", ManualClock(T + 10_000))
    with native.pure_python():
        pure_files, pure_stats = cleanings(tmp_path / "pure", ManualClock(T + 10_000))
    assert native_files == pure_files
    assert [s.__dict__ for s in native_stats] == [s.__dict__ for s in pure_stats]
    return native_stats


def test_native_and_pure_cleanings_write_the_same_bytes(tmp_path):
    native_stats = _native_same_as_pure_python(_clean_twice, tmp_path)
    first = native_stats[0]
    assert first.records_written < first.records_read and first.tombstones_marked > 0
    assert native_stats[1].tombstones_dropped > 0 and first.invalid_records > 0


def _reclean_from_the_start(directory, clock) -> tuple[list[bytes], list]:
    """Clean (tombstones get their delete horizon), overwrite every key, then clean the whole log
    again from offset 0 (the cleaner's checkpoint removed, as when an operator deletes it): the
    map pass now sees batches carrying a horizon whose records all have newer ones — the filter
    pass drops those whole, and counts their tombstones as dropped."""
    log = _compacted_log(directory, clock)
    stats = [LogCleaner(str(directory), clock).clean_log(log).stats]
    keys = {r.key for r in log.records() if r.key is not None}
    log.append_as_leader(build_batch([Record(k, b"new", T + 9000) for k in sorted(keys)]))
    log.roll()
    os.remove(directory / "cleaner-offset-checkpoint")
    stats.append(LogCleaner(str(directory), clock).clean_log(log).stats)
    files = [open(s.log.path, "rb").read() for s in log.segments]
    log.close()
    return files, stats


def test_batches_superseded_whole_are_dropped_and_counted_as_the_reference_does(tmp_path):
    native_stats = _native_same_as_pure_python(_reclean_from_the_start, tmp_path)
    assert native_stats[1].tombstones_dropped > 0


def test_a_plugged_in_should_retain_record_is_what_the_cleaner_calls(tmp_path):
    calls = []

    def learner_keeps_everything(record, horizon, latest, map_latest, now):
        calls.append(record.offset)
        return True

    clock = ManualClock(T + 10_000)
    log = _compacted_log(tmp_path, clock)
    before = log.records()
    with live.plug(live.compaction(should_retain_record=learner_keeps_everything)):
        assert cleaner_module.should_retain_record is learner_keeps_everything
        LogCleaner(str(tmp_path), clock).clean_log(log)
    assert len(calls) == len(before)
    assert [(r.offset, r.key, r.value) for r in log.records()] == \
        [(r.offset, r.key, r.value) for r in before]     # the learner's rule kept every record
    log.close()


def test_a_malformed_batch_raises_the_references_error_on_both_paths(tmp_path):
    good = build_batch([Record(b"k%d" % i, b"v", T) for i in range(5)])
    bad = RecordBatch(good[:70] + b"\xff" + good[71:])    # a broken key length inside a record
    errors = []
    for context in (native.pure_python, lambda: live.plug()):
        with context():
            m = SkimpyOffsetMap(slots=100)
            with pytest.raises(KStoreError) as e1:
                m.put_batch(bad, 0)
            cleaner = Cleaner(m, ManualClock(T))
            with pytest.raises(KStoreError) as e2:
                cleaner._retained(bad, None, T)
            errors.append((type(e1.value), str(e1.value), type(e2.value), str(e2.value)))
            assert m.size == 0
    assert errors[0] == errors[1]


# ------------------------------------------------------------------------------ buffer walks
# codec.map_batches / filter_batches walk the plain batches of a read buffer (magic 2, no
# compression, neither transactional nor control) and stop at the first other batch, which the
# cleaner's Python loop takes. The references below are that loop for plain batches, written with
# the reference functions; every batch kind is drawn so that the walks must stop where they do.
KINDS = ("plain", "plain", "plain", "idempotent", "transactional", "control", "gzip", "horizon",
         "damaged")


@st.composite
def read_buffers(draw):
    """(buffer of whole batches, their kinds) with consecutive offsets from a drawn base."""
    offset = draw(st.integers(0, 30))
    parts, kinds = [], []
    for kind in draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=6)):
        recs = draw(st.lists(a_record, min_size=1, max_size=6))
        if kind == "control":
            recs = [Record(b"\0\0\0\1", b"\0\0\0\0\0\0", T)]
        raw = bytearray(build_batch(
            recs, base_offset=offset, producer_id=7 if kind in ("idempotent", "transactional",
                                                                  "control") else -1,
            producer_epoch=0 if kind in ("idempotent", "transactional", "control") else -1,
            transactional=kind in ("transactional", "control"), control=kind == "control",
            compression=records.Compression.GZIP if kind == "gzip" else records.Compression.NONE,
            delete_horizon_ms=T if kind == "horizon" else None))
        if kind == "damaged":
            raw[RECORDS_OFFSET] = 0x7f        # the first record's length no longer fits
        parts.append(bytes(raw))
        kinds.append(kind)
        offset += len(recs)
    return b"".join(parts), kinds


def plain_batches(buffer, pos):
    """The batches from `pos` a walk may take, each with its records decoded (or "raises"), up to
    the first batch it must leave to Python (complete, magic 2, count ≥ 0, no compression,
    neither transactional nor control)."""
    while len(buffer) - pos >= RECORDS_OFFSET:
        length = int.from_bytes(buffer[pos + 8:pos + 12], "big", signed=True)
        if length < 49 or 12 + length > len(buffer) - pos:
            return
        batch = RecordBatch(buffer[pos:pos + 12 + length], pos)
        if batch.magic != 2 or batch.attributes & 0x37 or batch.records_count < 0:
            return
        decoded = outcome(batch.records)
        yield batch, decoded[1] if decoded[0] == "ok" else "raises"
        pos += batch.size_in_bytes


def reference_map_walk(buffer, pos, start, stop_offset, entries, max_entries, map_latest):
    read = 0
    for batch, recs in plain_batches(buffer, pos):
        if batch.base_offset >= stop_offset:
            return batch.position, 1, read, map_latest
        if recs == "raises":
            return batch.position, 0, read, map_latest
        n, full, latest = map_keys(batch.records_view(), batch.base_offset, batch.records_count,
                                   start, entries, max_entries)
        read += n
        map_latest = latest if latest >= 0 else map_latest
        if full:
            return batch.position, 2, read, map_latest
        if batch.last_offset >= start:
            map_latest = batch.last_offset
        pos = batch.position + batch.size_in_bytes
    return pos, 0, read, map_latest


def reference_filter_walk(buffer, pos, entries, map_latest, now, upper_bound, producers):
    kept_spans, totals = [], [0, 0, 0, 0, 0]
    for batch, recs in plain_batches(buffer, pos):
        if recs == "raises" or batch.producer_id != -1 and batch.producer_id in producers:
            break
        horizon = batch.delete_horizon_ms
        kept, invalid, dropped, tombstones_kept = filter_records(recs, entries, map_latest, horizon, now)
        if kept and (len(kept) < len(recs) or (tombstones_kept and horizon is None)):
            break
        if not kept and batch.next_offset == upper_bound:
            break
        if kept:
            kept_spans.append((batch.position, batch.position + batch.size_in_bytes,
                               batch.last_offset, batch.max_timestamp))
        for i, n in enumerate((len(recs), len(kept), invalid, dropped, batch.size_in_bytes)):
            totals[i] += n
        pos = batch.position + batch.size_in_bytes
    return (pos, kept_spans, *totals)


@SETTINGS
@given(read_buffers(), st.integers(0, 40), st.integers(0, 60), st.integers(1, 30))
def test_map_batches_walks_as_the_python_loop(buffer_kinds, start, stop_offset, max_entries):
    buffer, _ = buffer_kinds
    reference, table = {}, C.offset_table()
    expected = reference_map_walk(buffer, 0, start, stop_offset, reference, max_entries, -1)
    got = C.map_batches(memoryview(buffer), 0, start, stop_offset, table, max_entries, -1)
    assert got == expected
    assert dict(table.items()) == reference


@SETTINGS
@given(read_buffers(), st.data(), st.integers(-1, 60), st.integers(T - 5, T + 5),
       st.integers(0, 70), st.booleans())
def test_filter_batches_decides_as_the_python_loop(buffer_kinds, data, map_latest, now,
                                                   upper_bound, producer_known):
    buffer, _ = buffer_kinds
    entries = data.draw(offset_maps(30))
    producers = {7: None} if producer_known else {}
    expected = reference_filter_walk(buffer, 0, entries, map_latest, now, upper_bound, producers)
    got = C.filter_batches(memoryview(buffer), 0, table_of(entries), map_latest, now, upper_bound,
                           producers)
    assert got == expected


def reference_skip(buffer, entries, map_latest, now, upper_bound, producers):
    """The batches the filter pass may pass over unread: from the start, plain batches (all
    summarized by a map walk from offset 0 into a map that did not fill) that it drops whole."""
    pos, totals = 0, [0, 0, 0, 0]
    for batch, recs in plain_batches(buffer, 0):
        if recs == "raises" or batch.producer_id != -1 and batch.producer_id in producers or \
                batch.next_offset == upper_bound:
            break
        kept, invalid, dropped, _ = filter_records(recs, entries, map_latest, batch.delete_horizon_ms, now)
        if kept:
            break
        for i, n in enumerate((len(recs), invalid, dropped, batch.size_in_bytes)):
            totals[i] += n
        pos += batch.size_in_bytes
    return (pos, *totals)


@SETTINGS
@given(read_buffers(), st.integers(-1, 60), st.integers(T - 5, T + 5), st.integers(0, 70),
       st.booleans())
def test_skip_batches_passes_over_what_the_filter_drops(buffer_kinds, map_latest, now, upper_bound,
                                                       producer_known):
    buffer, _ = buffer_kinds
    producers = {7: None} if producer_known else {}
    reference, table = {}, C.offset_table()
    expected_map = reference_map_walk(buffer, 0, 0, 1 << 40, reference, 1 << 30, -1)
    assert C.map_batches(buffer, 0, 0, 1 << 40, table, 1 << 30, -1, 3, 0) == expected_map
    assert C.skip_batches(table, 3, 0, map_latest, now, upper_bound, producers) == \
        reference_skip(buffer, reference, map_latest, now, upper_bound, producers)
    assert C.skip_batches(table, 4, 0, map_latest, now, upper_bound, producers) == (0, 0, 0, 0, 0)
    table.clear()                                          # a new round forgets the summaries
    assert C.skip_batches(table, 3, 0, map_latest, now, upper_bound, producers) == (0, 0, 0, 0, 0)


def test_filter_batches_reads_the_digests_the_map_pass_put():
    """The filter pass takes the digests map_batches put from the table's cache (the dirty
    section is hashed once). The cache trusts that it is read over the same records, as in one
    cleaning round: over other records at those offsets it answers for the keys it saw, and
    clear() (the start of every round) forgets it with the entries."""
    old = build_batch([Record(b"k%d" % i, b"v", T) for i in range(10)])
    new = build_batch([Record(b"other%d" % i, b"v", T) for i in range(10)])
    table = C.offset_table()
    assert C.map_batches(old, 0, 0, 1 << 40, table, 100, -1) == (len(old), 0, 10, 9)
    reference = {}
    map_keys(RecordBatch(old).records_view(), 0, 10, 0, reference, 100)
    assert C.filter_batches(old, 0, table, 9, T, 100, {}) == \
        reference_filter_walk(old, 0, reference, 9, T, 100, {})
    assert C.filter_batches(new, 0, table, 9, T, 100, {})[1] == [(0, len(new), 9, T)]   # cached
    table.clear()
    assert C.filter_batches(new, 0, table, 9, T, 100, {}) == \
        reference_filter_walk(new, 0, {}, 9, T, 100, {})                      # hashed: all dropped


@settings(SETTINGS, max_examples=max(10, SETTINGS.max_examples // 5))   # a log per example
@given(st.lists(st.tuples(st.sampled_from(["plain", "plain", "idempotent", "gzip"]),
                          st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=1,
                                   max_size=8)), min_size=1, max_size=12),
       st.sampled_from([24 * 5, 24 * 12, 1 << 20]))
def test_cleanings_with_every_batch_kind_write_the_same_bytes(tmp_path_factory, batches_drawn,
                                                              dedupe_buffer_size):
    """Whole cleanings, native and pure, of logs mixing plain, idempotent and compressed batches
    with tombstones, with offset maps that fill up (a partial round) or not: the same files and
    the same stats."""
    outputs = []
    for context in (lambda: live.plug(), native.pure_python):
        with context():
            directory = tmp_path_factory.mktemp("mixed")
            clock = ManualClock(T + 10_000)
            log = Log.open(str(directory / "t-0"), {"cleanup.policy": "compact", "segment.bytes": 600},
                           clock)
            sequence = 0
            for kind, recs in batches_drawn:
                pid = 5 if kind == "idempotent" else -1
                log.append_as_leader(build_batch(
                    [Record(b"k%d" % k, None if tomb else b"v%d" % k, T) for k, tomb in recs],
                    producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                    base_sequence=sequence if pid >= 0 else -1,
                    compression=records.Compression.GZIP if kind == "gzip" else records.Compression.NONE))
                sequence += len(recs) if pid >= 0 else 0
            log.roll()
            cleaner = LogCleaner(str(directory), clock, dedupe_buffer_size=dedupe_buffer_size)
            stats = cleaner.clean_log(log).stats
            outputs.append(([open(s.log.path, "rb").read() for s in log.segments], stats.__dict__))
            log.close()
    assert outputs[0] == outputs[1]

"""Model-level tests of the widgets (no browser): each view's state and HTML after real engine work.

Every model reads the engine's real files and follows its events; these tests drive the engine
(append, roll, clean, retention, produce, fetch, crash, commit) and check what the models hold
and render. A fixture checks that no event subscriber raised (the bus would swallow it).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import threading
import time

import pytest

from helpers import T0
from kstore import Record, build_batch
from kstore.broker import Broker
from kstore.cleaner import LogCleaner
from kstore.cluster import Cluster
from kstore.compression import Compression
from kstore.records import HEADER_FIELDS
from kstore.replica_fetcher import EPOCH_TRUNCATION, HW_TRUNCATION
from kstore.widgets import (CompactionModel, DirectoryModel, HexModel, IndexModel, LookupModel,
                            OffsetsModel, ProgressModel, QuizModel, ReplicaModel, ZeroCopyModel,
                            bulk_produce, file_kind, measure_transfer, trace_offset,
                            trace_timestamp, track)
from kstore.widgets._base import Redrawer

SMALL = {"segment.bytes": 2048, "index.interval.bytes": 256}


@pytest.fixture
def small_log(make_log, clock):
    """A log of 40 one-record batches (keys user-0..6), 2 KiB segments, an index entry / 256 B."""
    log = make_log(SMALL)
    for i in range(40):
        log.append([(f"user-{i % 7}", f"order {i:04d} ".ljust(30, "."))])
        clock.advance(5)
    yield log
    assert not log.events.errors, log.events.errors


def _selected_spans(html: str) -> list[str]:
    return re.findall(r'<span class="[^"]*\bks-sel\b[^"]*"', html)


def _titles(html: str) -> list[str]:
    return re.findall(r'title="([^"]*)"', html)


# ------------------------------------------------------------------------------------------------
# hex view
# ------------------------------------------------------------------------------------------------

def test_hex_view_names_the_crc_at_byte_17_of_every_batch(small_log):
    seg = small_log.segments[1]
    model = HexModel(small_log, segment=seg.base_offset)
    positions = [loc.position for loc in seg.log.batch_locations()]
    assert len(positions) > 3
    for pos in positions[:2] + positions[-1:]:
        f = model.field_at(pos + 17)
        assert (f.name, f.start, f.end) == ("crc", pos + 17, pos + 21)
        assert f.value.startswith("0x") and f.value.endswith("valid")
    html = model.render_html()
    assert any(t.startswith("crc [bytes 17–20 (batch byte 17)]: 0x") for t in _titles(html))


def test_hex_view_places_every_batch_header_field_and_record_field(small_log):
    model = HexModel(small_log.segments[0])
    for name, off, size, _ in HEADER_FIELDS:
        f = model.field_at(off)
        assert (f.name, f.start, f.end - f.start) == (name, off, size)
    assert model.field_at(0).value.startswith("0 ")                 # baseOffset 0
    assert "RecordBatch v2" in model.field_at(16).value            # magic
    assert "compression none, CreateTime" in model.field_at(21).value
    # records start at byte 61: length varint, attributes, deltas, key, value, headers count
    kinds = []
    pos = 61
    batch_end = model.field_at(8)
    while True:
        f = model.field_at(pos)
        if f is None or f.group != ("record", 0, 0):
            break
        kinds.append((f.kind, f.varint))
        pos = f.end
    assert [k for k, _ in kinds] == ["recordLength", "recordAttributes", "timestampDelta",
                                     "offsetDelta", "keyLength", "key", "valueLength", "value",
                                     "headersCount"]
    assert all(v for k, v in kinds if k.endswith(("Length", "Delta", "Count")))
    key = next(f for f in model.fields() if f.kind == "key")
    assert key.group == ("record", 0, 0) and key.value.startswith("'user-0' (6 bytes)")
    assert "bytes follow; batch = " in batch_end.value


def test_hex_view_highlights_new_bytes_and_follows_the_active_segment(small_log, clock):
    model = HexModel(small_log)                      # the active segment's .log, followed
    seen = []
    model.on_change(lambda m, e: seen.append(e.kind if e else None))
    info = small_log.append([("late", "new bytes")])
    seg = small_log.active_segment
    assert seen == ["append"]
    lo, hi = model.new_range
    assert hi == seg.size and hi - lo > 61
    assert model.start <= lo < model.start + model.page_bytes or model.start <= hi - 1
    assert "ks-new" in model.render_html()
    assert model.field_at(lo).name == "baseOffset"
    assert model.field_at(lo).value.startswith(f"{info.first_offset} ")
    small_log.roll()
    assert seen[-1] == "roll" and model.segment is small_log.active_segment
    assert (model.start, model.new_range, model.size) == (0, None, 0)
    assert "(empty file)" in model.render_html()


def test_hex_view_pages_a_large_file_without_rendering_it_all(make_log, clock):
    log = make_log({"segment.bytes": 1 << 24, "index.interval.bytes": 4096})
    bulk_produce(log, 20_000, batch_records=500, progress=False)
    model = HexModel(log, rows=32)
    assert model.size > 1_000_000 and model.pages == -(-model.size // 512)
    first = model.render_html()
    model.go_to(model.size // 2)
    middle = model.render_html()
    model.last_page()
    assert model.page == model.pages - 1
    # a page renders 32 rows whatever the size of the file
    assert first.count('class="ks-row"') == middle.count('class="ks-row"') == 32
    assert len(middle) < 60_000
    model.prev_page()
    assert model.page == model.pages - 2
    model.first_page()
    assert model.start == 0
    # the window's first batch comes from the offset index, and agrees with a plain header walk
    raw = HexModel(log.active_segment.log.path)
    for pos in (0, 700_000, model.size - 10):
        assert raw._first_batch_at_or_before(pos) == model._first_batch_at_or_before(pos)


def test_hex_view_selection_outlines_a_batch_or_a_record(small_log):
    model = HexModel(small_log.segments[0])
    second = [loc.position for loc in small_log.segments[0].log.batch_locations()][1]
    model.select(("batch", second))
    html = model.render_html()
    assert len(_selected_spans(html)) >= 13           # header fields + record fields
    assert f"selected: batch at byte {second}" in html
    model.select(("record", second, 0))
    html = model.render_html()
    assert f"record 0 of the batch at byte {second}" in html
    assert _selected_spans(html) and all("ks-k-crc" not in s for s in _selected_spans(html))
    f = model.select_at(second + 70)
    assert model.selection == ("record", second, 0) and f.group == ("record", second, 0)
    model.select(None)
    assert not _selected_spans(model.render_html())


def test_hex_view_reports_a_corrupt_crc(small_log, tmp_path):
    src = small_log.segments[0].log.path
    copy = tmp_path / "copy-0" / "00000000000000000000.log"
    copy.parent.mkdir()
    shutil.copyfile(src, copy)
    with open(copy, "r+b") as f:
        f.seek(70)
        byte = f.read(1)
        f.seek(70)
        f.write(bytes([byte[0] ^ 0xFF]))
    f17 = HexModel(str(copy)).field_at(17)
    assert f17.name == "crc" and "INVALID (computed 0x" in f17.value


def test_hex_view_of_indexes_checkpoints_and_compressed_batches(small_log, make_log, clock):
    seg = small_log.segments[0]
    idx = HexModel(small_log, "index", segment=seg.base_offset)
    entries = seg.offset_index.entries_list()
    assert entries
    f = idx.field_at(4)
    assert f.kind == "position" and f.value.startswith(f"{entries[0].position} → the batch at byte")
    assert idx.field_at(0).value == f"{entries[0].offset - seg.base_offset} → offset {entries[0].offset}"
    tix = HexModel(small_log, "timeindex", segment=seg.base_offset)
    assert tix.field_at(0).kind == "timestamp" and tix.field_at(8).kind == "relativeOffset"
    # the active segment's index is preallocated: slots past the entries are unused
    active_idx = HexModel(small_log, "index")
    n = small_log.active_segment.offset_index.entries
    assert active_idx.field_at(n * 8).kind == "unusedSlot"
    before = n
    while small_log.active_segment.offset_index.entries == before:
        small_log.append([("k", "v" * 40)])
    assert active_idx.new_range == (before * 8, (before + 1) * 8)
    # a checkpoint file: version line, count line, entries
    cp = HexModel(os.path.join(small_log.dir, "leader-epoch-checkpoint"))
    assert [(x.kind, x.value) for x in cp.fields() if x.kind != "newline"] == [
        ("cpVersion", "0 (checkpoint format version)"), ("cpCount", "1 entries follow"),
        ("cpEntry", "leader epoch 0 started at offset 0")]
    # a compressed batch: the records are one compressed block
    zlog = make_log({}, name="zipped-0")
    zlog.append([("a", "x" * 100)] * 10, compression=Compression.GZIP)
    z = HexModel(zlog)
    assert z.field_at(61).kind == "compressedRecords" and "10 records, gzip" in z.field_at(61).value


def test_hex_view_reads_files_kafka_wrote(kafka_logs):
    part = next(kafka_logs.glob("*/foo-0"))
    log_file = part / "00000000000000000000.log"
    model = HexModel(str(log_file))
    assert model.field_at(17).name == "crc" and model.field_at(17).value.endswith("valid")
    assert file_kind(str(part / "partition.metadata")) == "properties"
    meta = HexModel(str(part / "partition.metadata")).fields()
    assert meta[0].kind == "metaLine" and "version" in meta[0].value
    snap = HexModel(str(part / "00000000000000000001.snapshot")).fields()
    assert snap[0].kind == "snapshotHeader" and "version 1" in snap[0].value
    rp = HexModel(str(part.parent / "recovery-point-offset-checkpoint")).fields()
    assert any(f.kind == "cpEntry" and "recovery point" in f.value for f in rp)


# ------------------------------------------------------------------------------------------------
# partition directory view
# ------------------------------------------------------------------------------------------------

def test_directory_view_lists_the_new_segment_after_a_roll(small_log):
    model = DirectoryModel(small_log)
    bases = [s.base_offset for s in model.segments()]
    versions = model.version
    new = small_log.roll()
    assert model.version > versions                       # the roll event reached the model
    segs = model.segments()
    assert [s.base_offset for s in segs] == bases + [new.base_offset]
    assert [s.active for s in segs] == [False] * len(bases) + [True]
    html = model.render_html()
    assert f"{new.base_offset:020d}.log" in html and f'data-segments="{len(segs)}"' in html
    names = {f["name"] for f in model.files()}
    assert {f"{new.base_offset:020d}{ext}" for ext in (".log", ".index", ".timeindex")} <= names


def test_directory_view_counts_match_the_log_and_update_incrementally(small_log):
    model = DirectoryModel(small_log)
    segs = model.segments()
    assert sum(s.records for s in segs) == small_log.log_end_offset
    for s, seg in zip(segs, small_log.segments):
        assert (s.size, s.index_entries, s.time_index_entries) == (
            seg.size, seg.offset_index.entries, seg.time_index.entries)
        assert s.first_offset == seg.base_offset and s.last_offset == seg.read_next_offset() - 1
    small_log.append([("a", "b"), ("c", "d")])
    assert model.segments()[-1].records == segs[-1].records + 2
    assert model.offsets()["log end offset"] == small_log.log_end_offset
    assert "leader-epoch-checkpoint" in "".join(model.checkpoints())


def test_directory_view_shows_deleted_files_after_retention(make_log, clock):
    log = make_log({**SMALL, "retention.bytes": 2048, "file.delete.delay.ms": 60_000})
    for i in range(60):
        log.append([(f"k{i}", "v" * 30)])
    model = DirectoryModel(log)
    pinned = HexModel(log, segment=0)
    before = len(model.segments())
    assert log.delete_old_segments() > 0
    assert pinned.fields() == [] and "segment 0 is no longer in the log" in pinned.render_html()
    files = model.files()
    deleted = [f for f in files if f["status"] == "deleted"]
    assert deleted and all(f["name"].endswith(".deleted") for f in deleted)
    assert len(model.segments()) < before
    html = model.render_html()
    assert "ks-st-deleted" in html and f"log start offset <b>{log.log_start_offset}</b>" in html


def test_directory_view_updates_on_truncate_and_clean(small_log, tmp_path, clock):
    model = DirectoryModel(small_log)
    seen = []
    model.on_change(lambda m, e: seen.append(e.kind))
    model.segments()                                   # counted once (the scan cache is filled)
    small_log.truncate_to(10)
    assert "truncate" in seen
    small_log.append([("after", "truncation")] * 5)    # rewritten bytes, not yet rendered
    segs = model.segments()
    assert sum(s.records for s in segs) == 15 == model.offsets()["log end offset"]
    for i in range(30):
        small_log.append([(f"user-{i % 3}", "v" * 30)])
    small_log.roll()
    LogCleaner(str(tmp_path), clock).clean_log(small_log)
    assert "clean" in seen
    assert sum(s.records for s in model.segments()) == len(small_log.records())
    assert any(f["status"] == "deleted" for f in model.files())      # the replaced segments
    assert "cleaner-offset-checkpoint" in model.checkpoints()


# ------------------------------------------------------------------------------------------------
# index view
# ------------------------------------------------------------------------------------------------

def test_index_view_points_each_entry_at_a_batch_and_explains_sparseness(small_log):
    seg = small_log.segments[0]
    model = IndexModel(small_log, seg.base_offset)
    arrows = model.arrows()
    assert len(arrows) == seg.offset_index.entries > 0
    starts = {loc.position: i for i, loc in enumerate(seg.log.batch_locations())}
    for slot, position, batch in arrows:
        assert batch == starts[position]
    stats = model.sparseness()
    assert stats["index entries"] < stats["batches"]
    assert stats["index.interval.bytes"] == 256
    biggest = max(loc.size for loc in seg.log.batch_locations())
    assert stats["longest forward scan (bytes)"] <= 256 + 2 * biggest
    html = model.render_html()
    assert "index.interval.bytes" in html and html.count("← indexed") == len(arrows)
    assert model.png()[:8] == b"\x89PNG\r\n\x1a\n"


def test_index_view_follows_appends_to_the_active_segment(small_log):
    model = IndexModel(small_log)
    n = len(model.entries())
    while small_log.active_segment.offset_index.entries == n:
        small_log.append([("k", "v" * 40)])
    assert len(model.arrows()) == n + 1 and model.version > 0


# ------------------------------------------------------------------------------------------------
# lookup trace
# ------------------------------------------------------------------------------------------------

def _engine_probes(index, target):
    """The slots the engine's own binary search reads (the key of each probed slot, `_key`,
    wrapped around `largest_lower_bound_slot_for`, the search inside `OffsetIndex.lookup`)."""
    slots = []
    original = index._key

    def spy(n):
        slots.append(n)
        return original(n)
    index._key = spy
    try:
        index.largest_lower_bound_slot_for(target)
    finally:
        del index._key
    return slots


def test_lookup_trace_lists_the_probes_of_the_binary_search(make_log, clock):
    log = make_log({"segment.bytes": 1 << 20, "index.interval.bytes": 100})
    for i in range(200):
        log.append([(f"k{i}", "v" * 50)])
    index = log.active_segment.offset_index
    assert index.entries > 60
    for target in (0, 1, 57, 123, 199):
        trace = trace_offset(log, target)
        assert trace.probes == _engine_probes(index, target), target
        assert trace.found == trace.engine and trace.found["base_offset"] == target
    t = trace_offset(log, 123)
    probe_steps = [s for s in t.steps if s.phase == "index" and "probe slot" in s.text]
    assert len(probe_steps) == len(t.probes) - 1 <= math.ceil(math.log2(index.entries))
    assert t.steps[-1].phase == "result"


def test_lookup_trace_agrees_with_the_engine_across_segments_and_gaps(small_log, tmp_path, clock):
    for offset in range(small_log.log_end_offset):
        t = trace_offset(small_log, offset)
        assert t.found == t.engine and t.found["segment"] == small_log.floor_segment(offset).base_offset
    # compaction leaves gaps: a target inside a gap lands on the next batch, as the engine's does
    LogCleaner(str(tmp_path), clock).clean_log(small_log)
    gaps = sorted(set(range(small_log.log_end_offset)) - {r.offset for r in small_log.records()})
    assert gaps
    for offset in gaps[:10] + gaps[-3:]:
        t = trace_offset(small_log, offset)
        assert t.found == t.engine
    out = trace_offset(small_log, small_log.log_end_offset + 5)
    assert out.found is None and "outside" in out.steps[-1].text


def test_lookup_trace_by_timestamp(small_log):
    for ts in (T0, T0 + 3, T0 + 50, T0 + 150, T0 + 195):
        t = trace_timestamp(small_log, ts)
        assert t.found == t.engine, ts
        assert {s.phase for s in t.steps} >= {"segment", "timeindex", "scan", "result"}
    assert trace_timestamp(small_log, T0 + 10**9).found is None


def test_lookup_model_steps_with_a_button_and_recomputes_on_events(small_log):
    model = LookupModel(small_log, 33)
    n = len(model.trace.steps)
    assert model.shown == 1 and 'data-shown="1"' in model.render_html()
    while model.step():
        pass
    assert model.shown == n and model.done
    html = model.render_html()
    assert f"step {n} of {n}" in html and "agrees" in html
    model.reset()
    assert model.shown == 1
    model.set_target(T0 + 100, "timestamp")
    assert model.trace.by == "timestamp"
    model.set_target(small_log.log_end_offset, "offset")
    assert model.trace.found is None
    small_log.append([("x", "y")])                            # the event recomputes the trace
    assert model.trace.found is not None


# ------------------------------------------------------------------------------------------------
# retention and compaction view
# ------------------------------------------------------------------------------------------------

def test_compaction_view_before_and_after_a_cleaning(make_log, clock, tmp_path):
    log = make_log({"segment.bytes": 1024, "cleanup.policy": "compact", "delete.retention.ms": 1000})
    for i in range(40):
        log.append([(f"k{i % 5}", f"v{i}")] if i != 36 else [Record(b"k1", None, clock.milliseconds())])
        clock.advance(10)
    model = CompactionModel(log)
    assert model.before is None and len(model.tracked.records) == 40
    cleaner = LogCleaner(str(tmp_path), clock)
    cleaner.clean_log(log)                                    # not through the model: events
    d = model.diff()
    assert model.passes == 1 and len(model.before.records) == 40
    survivors = {r.offset for r in log.records()}
    assert set(d["kept"]) == survivors and set(d["removed"]) == set(range(40)) - survivors
    assert d["gaps"] and d["gaps"][0][0] == 0
    assert d["segments_rewritten"]
    kept = {k: off for k, _, off in model.surviving_keys()}
    assert kept["k0"] == 35 and kept["k4"] == 39
    html = model.render_html()
    assert html.count("ks-rec ks-removed") == len(d["removed"]) and "gap 0–" in html
    # an append ends the pass; a second cleaning gives the tombstone (now cleanable) a horizon
    log.append([("k9", "late")])
    log.roll()
    clock.advance(10)
    model.run_cleaner()
    tomb = [t for t in model.diff()["tombstones"] if t[1] == b"k1"]
    assert model.passes == 2 and tomb and tomb[0][2] is not None and tomb[0][3] is False
    assert "delete horizon" in model.render_html()
    clock.advance(5000)                                       # past the horizon: marked expired
    assert model.diff()["tombstones"][0][3] is True and "ks-expired" in model.render_html()


def test_compaction_view_shows_a_retention_pass(make_log, clock):
    log = make_log({**SMALL, "retention.bytes": 3000})
    for i in range(60):
        log.append([(f"k{i}", "v" * 30)])
    model = CompactionModel(log)
    n = model.run_retention()
    d = model.diff()
    assert n > 0 and len(d["segments_removed"]) == n
    assert d["log_start_offset"][1] == log.log_start_offset > d["log_start_offset"][0] == 0
    assert d["removed"] == list(range(log.log_start_offset))
    assert "ks-seg-gone" in model.render_html()


# ------------------------------------------------------------------------------------------------
# replica view
# ------------------------------------------------------------------------------------------------

@pytest.fixture
def cluster(tmp_path):
    c = Cluster(str(tmp_path / "cluster"), 3)
    c.create_topic("orders", 1, 3)
    yield c
    errors = [e for b in c.brokers.values() for e in b.events.errors] + c.events.errors
    c.shutdown()
    assert not errors, errors


def test_replica_view_hw_marker_moves_after_the_second_fetch_round(cluster):
    model = ReplicaModel(cluster, "orders")
    model.produce(["a", "b", "c"])
    assert model.markers(0) == {"hw": 0, "leo": 3}
    model.fetch_round()
    assert model.markers(0) == {"hw": 0, "leo": 3}            # the followers have the records...
    assert model.markers(1) == {"hw": 0, "leo": 3}
    html1 = model.render_html()
    model.fetch_round()
    assert model.markers(0) == {"hw": 3, "leo": 3}            # ...the second round reports them
    html2 = model.render_html()
    assert 'data-broker="0" data-role="leader" data-hw="0"' in html1
    assert 'data-broker="0" data-role="leader" data-hw="3"' in html2
    assert html2.count("ks-cell ks-committed") == 3           # committed cells on the leader only
    model.fetch_round()
    assert model.markers(1)["hw"] == 3 == model.markers(2)["hw"]


def test_replica_view_follows_crash_restart_election_and_truncation_mode(cluster):
    model = ReplicaModel(cluster, "orders")
    model.produce(["a", "b"])
    model.fetch_round()
    model.fetch_round()
    model.toggle_broker(0)                                   # crash the leader
    s = model.partition_state()
    assert s["leader"] == 1 and s["leader_epoch"] == 1 and 0 not in s["isr"]
    html = model.render_html()
    assert 'data-broker="0" data-role="offline"' in html and "broker 0 — down" in html
    model.produce(["c"])
    model.toggle_broker(0)                                   # restart: a follower again
    assert "restarted" in model.last_action
    v = model.version
    model.fetch(0)                                           # events from the NEW broker's bus
    assert model.version > v + 1 and model.markers(0)["leo"] == 3
    model.fetch_round()
    model.fetch_round()
    model.elect()                                            # preferred leader (broker 0) back
    assert model.partition_state()["leader"] == 0 and model.partition_state()["leader_epoch"] == 2
    assert "epoch 2: 1→0 (preferred leader election)" in model.render_html()
    assert model.truncation_mode == EPOCH_TRUNCATION
    model.toggle_truncation()
    assert cluster.truncation == HW_TRUNCATION and "truncation by high watermark" in model.render_html()
    # outside the widget, the engine's events still reach it
    v = model.version
    cluster.produce("orders", 0, ["z"], acks=1)
    assert model.version > v


# ------------------------------------------------------------------------------------------------
# zero-copy view
# ------------------------------------------------------------------------------------------------

def test_zero_copy_measurement_runs_both_paths_here(small_log):
    m = measure_transfer(4 << 20, repeats=1)
    copy, zero = m["results"]["read+send"], m["results"]["sendfile"]
    assert copy["syscalls"] >= 2 * (4 << 20) // (64 << 10)       # a read and a send per chunk
    assert zero["syscalls"] < copy["syscalls"]
    assert copy["bytes_through_user_space"] == 4 << 20 and zero["bytes_through_user_space"] == 0
    assert all(r["seconds"] > 0 and r["MB_per_s"] > 0 for r in (copy, zero))
    model = ZeroCopyModel(small_log, size_bytes=1 << 20)
    assert 'data-measured="false"' in model.render_html()
    runs = []
    model.measure(repeats=2, on_run=lambda: runs.append(1))      # what the progress bar counts
    html = model.render_html()
    assert len(runs) == 4 and 'data-measured="true"' in html and "sendfile ÷ read+send" in html
    assert model.png()[:4] == b"\x89PNG"
    # the text states the saving measured, beside the table that shows it (not "half")
    res = model.measurement["results"]
    calls = f"{res['read+send']['syscalls']} → {res['sendfile']['syscalls']}"
    assert f"system calls, {calls}" in html and "half the system calls" not in html
    # nor does the quiz's zero-copy card (the measured saving is thousands of calls, not half)
    from kstore.widgets import DEFAULT_CARDS
    zero_copy = next(c for c in DEFAULT_CARDS if "zero-copy" in c.question)
    assert "half the system calls" not in zero_copy.answer and "one sendfile call" in zero_copy.answer


# ------------------------------------------------------------------------------------------------
# group view
# ------------------------------------------------------------------------------------------------

def test_group_view_follows_a_rebalance_step_by_step(tmp_path, clock):
    from kstore.local_member import LocalGroupMember
    from kstore.widgets import GroupModel
    broker = Broker(str(tmp_path / "broker"), clock=clock)
    try:
        broker.create_topic("orders", 4)
        model = GroupModel(broker, "billing")
        assert (model.state, model.generation, model.members()) == ("Empty", 0, [])
        gm = broker.group_coordinator.membership
        a, b = (LocalGroupMember(gm, "billing", name, ["orders"], partitions_per_topic={"orders": 4})
                for name in ("consumer-a", "consumer-b"))
        a.join(), b.join()
        assert model.state == "PreparingRebalance"
        assert [m["waiting_in"] for m in model.members()] == ["JoinGroup", "JoinGroup"]
        clock.advance(3000)
        gm.tick()
        assert (model.state, model.generation) == ("CompletingRebalance", 1)
        for m in sorted((a, b), key=lambda m: not m.leader):
            m.sync()
        assert model.state == "Stable"
        owners = model.owner_of()
        assert sorted(owners) == [("orders", p) for p in range(4)] and set(owners.values()) == {
            "consumer-a", "consumer-b"}
        assert [m["session_left_ms"] for m in model.members()] == [10000, 10000]
        html = model.render_html()
        assert 'data-state="Stable"' in html and 'data-members="2"' in html and "orders-3" in html
        # b stops heartbeating: after its session, a owns all four
        clock.advance(6000)
        assert a.heartbeat() == "NONE"
        clock.advance(4001)
        gm.tick()
        assert model.state == "PreparingRebalance" and len(model.members()) == 1
        assert a.heartbeat() == "REBALANCE_IN_PROGRESS"
        a.join()
        a.sync()
        assert model.owner_of() == {("orders", p): "consumer-a" for p in range(4)}
        assert model.history == [("Empty", 0), ("PreparingRebalance", 0), ("CompletingRebalance", 1),
                                 ("Stable", 1), ("PreparingRebalance", 1), ("CompletingRebalance", 2),
                                 ("Stable", 2)]
        assert not broker.events.errors
    finally:
        broker.shutdown()


# ------------------------------------------------------------------------------------------------
# offsets view
# ------------------------------------------------------------------------------------------------

def test_offsets_view_committed_offsets_log_end_and_lag(tmp_path, clock):
    broker = Broker(str(tmp_path / "broker"), clock=clock)
    try:
        broker.create_topic("payments", 2)
        model = OffsetsModel(broker)
        assert model.rows() == []
        for _ in range(4):
            broker.produce("payments", 0, build_batch([Record(None, b"p", T0)] * 5))
        gc = broker.group_coordinator
        gc.commit_offsets("billing", {("payments", 0): 12, ("payments", 1): 0})
        rows = {(r["topic"], r["partition"]): r for r in model.rows()}
        assert rows[("payments", 0)]["committed"] == 12 and rows[("payments", 0)]["lag"] == 8
        assert rows[("payments", 1)]["lag"] == 0
        assert rows[("payments", 0)]["coordinator_partition"] == gc.partition_for("billing")
        broker.produce("payments", 0, build_batch([Record(None, b"p", T0)] * 5))
        assert model.lag("billing", "payments", 0) == 13      # the HW moved: lag grew
        gc.commit_offsets("billing", {("payments", 0): 25})
        assert model.lag("billing", "payments", 0) == 0
        assert {g: {tp: c.offset for tp, c in v.items()} for g, v in model.committed.items()} == \
            {g: {tp: om.offset for tp, om in gc.fetch_offsets(g).items()} for g in gc.groups()}
        html = model.render_html()
        cp = gc.partition_for("billing")
        assert f"__consumer_offsets-{cp}" in html and 'data-rows="2"' in html
        assert not broker.events.errors
    finally:
        broker.shutdown()
    again = Broker(str(tmp_path / "broker"), clock=clock)      # rebuilt from the files alone
    try:
        assert OffsetsModel(again).lag("billing", "payments", 0) == 0
    finally:
        again.shutdown()


# ------------------------------------------------------------------------------------------------
# quiz and progress
# ------------------------------------------------------------------------------------------------

def test_quiz_reveal_and_self_score():
    q = QuizModel()
    first = q.card
    assert first.answer not in q.render_html()
    q.reveal()
    assert first.answer.split(".")[0] in q.render_html()
    q.score(True)
    assert q.card is not first and not q.revealed
    q.reveal()
    q.score(False)
    assert q.summary() == {"known": 1, "not_yet": 1, "unseen": len(q.cards) - 2,
                           "total": len(q.cards)}
    q.retry_missed()
    assert q.order == [1] and q.card is q.cards[1]


def test_progress_model_bulk_produce_and_track(make_log):
    now = [0.0]
    p = ProgressModel(100, "grading", "notebooks", clock=lambda: now[0])
    p.update(50)
    now[0] = 2.0
    assert p.fraction == 0.5 and p.rate == 25 and p.eta == 2
    log = make_log({})
    out = bulk_produce(log, 12_345, batch_records=1000, progress=True, display=False)
    assert out["records"] == 12_345 == log.log_end_offset and out["last_offset"] == 12_344
    bar = out["bar"]
    assert bar.model.done == 12_345 and bar.bar.value == 12_345 and bar.bar.bar_style == "success"
    assert "done in" in bar.model.render_text()
    items = list(track(range(7), description="grading", display=False))
    assert items == list(range(7)) and track.last.model.done == 7


# ------------------------------------------------------------------------------------------------
# the ipywidgets side, driven headlessly
# ------------------------------------------------------------------------------------------------

def test_widgets_respond_to_buttons_and_engine_events(small_log, cluster):
    from kstore.widgets import DirectoryView, HexView, LookupView, QuizView, ReplicaView

    hex_view = HexView(small_log, rows=4, min_interval=0)
    html = hex_view.html.value
    hex_view.model.first_page()
    hex_view.next.click()
    assert hex_view.model.start == 64 and hex_view.html.value != html
    small_log.append([("from", "the engine")])                   # an event, no polling
    assert "ks-new" in hex_view.html.value
    d = DirectoryView(small_log, min_interval=0)
    before = d.html.value
    small_log.roll()
    assert d.html.value != before and d.html.value.count('class="ks-active"') == 1
    lv = LookupView(small_log, 5, min_interval=0)
    lv.step_button.click()
    assert 'data-shown="2"' in lv.html.value
    lv.target.value = 7                                            # what Enter in the box does
    assert "lookup of offset 7" in lv.html.value
    rv = ReplicaView(cluster, "orders", min_interval=0)
    rv.produce_button.click()
    assert 'data-leo="1"' in rv.html.value
    rv.toggle_buttons[2].click()
    assert rv.toggle_buttons[2].description == "restart 2" and rv.fetch_buttons[2].disabled
    qv = QuizView()
    assert qv.knew.disabled
    qv.reveal_button.click()
    assert 'data-revealed="true"' in qv.html.value and not qv.knew.disabled


def test_redraws_are_coalesced_and_no_thread_keeps_running(small_log):
    base_threads = threading.active_count()
    draws = []
    r = Redrawer(lambda: draws.append(time.monotonic()), min_interval=0.05)
    for _ in range(200):
        r.request()
    assert len(draws) == 1                                         # one now, one deferred
    deadline = time.monotonic() + 5
    while len(draws) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)
    assert len(draws) == 2
    from kstore.widgets import HexView
    view = HexView(small_log)                                      # default 0.1 s interval
    for i in range(50):
        small_log.append([("burst", str(i))])
    deadline = time.monotonic() + 5                                # the deferred redraw runs once
    while (threading.active_count() > base_threads or "ks-new" not in view.html.value) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert view.redrawer.draws <= 6 and "ks-new" in view.html.value
    assert threading.active_count() == base_threads               # no polling thread left


# ------------------------------------------------------------------------------------------------
# views bound to their moment: snapshot when the cell ran + a timeline of later engine events
# ------------------------------------------------------------------------------------------------

def test_timeline_steps_back_and_forward_through_recorded_states():
    from kstore.events import Event
    from kstore.widgets._base import Timeline

    tl = Timeline(max_frames=50)
    tl.record({"html": "s0"}, seq=10)
    tl.record({"html": "s0"}, seq=11, events=[Event("flush", "d", {}, 11)])   # nothing to see
    assert len(tl.frames) == 1 and tl.frames[0].seq == 11   # the same picture, through seq 11
    tl.record({"html": "s1"}, seq=12, events=[Event("append", "d", {"first_offset": 3,
                                                                    "last_offset": 5}, 12)])
    tl.bind()
    assert tl.status()["bound"] == 1 and tl.status()["bound_seq"] == 12 and not tl.follow
    for i in range(2, 6):
        tl.record({"html": f"s{i}"}, seq=10 + 2 * i, events=[Event("roll", "d", {}, 10 + 2 * i)])
    assert tl.current.values == {"html": "s1"}              # bound: later events do not move it
    assert [tl.step(1).values["html"] for _ in range(5)] == ["s2", "s3", "s4", "s5", "s5"]
    assert [tl.step(-1).values["html"] for _ in range(6)] == ["s4", "s3", "s2", "s1", "s0", "s0"]
    assert tl.frames[1].label == "append offsets 3–5" and tl.frames[0].label == "when built, then flush"
    assert tl.go_bound().values == {"html": "s1"}
    assert tl.go_live().values == {"html": "s5"} and tl.follow
    tl.record({"html": "s6"}, seq=30)
    assert tl.current.values == {"html": "s6"}              # following: new frames are shown


def test_timeline_keeps_the_first_and_bound_frames_when_trimming():
    from kstore.widgets._base import Timeline

    tl = Timeline(max_frames=5)
    for i in range(3):
        tl.record({"v": i}, seq=i)
    tl.bind()                                               # frame 2 is the view's moment
    for i in range(3, 40):
        tl.record({"v": i}, seq=i)
    values = [f.values["v"] for f in tl.frames]
    assert len(values) == 5 and values[0] == 0 and 2 in values and values[-1] == 39
    assert tl.frames[tl.bound].values == {"v": 2} and tl.current.values == {"v": 2}


def test_directory_view_shows_its_moment_and_replays_each_later_event(small_log):
    from kstore.events import last_seq
    from kstore.widgets import DirectoryView

    view = DirectoryView(small_log, min_interval=0)
    moment = view.bind()
    assert moment.seq == last_seq() and view.html.value == DirectoryModel(small_log).render_html()
    expected = [view.html.value]
    for op in (lambda: small_log.append([("k", "after the cell")]), small_log.roll,
               lambda: small_log.append([("k", "later still")])):
        op()
        expected.append(DirectoryModel(small_log).render_html())   # the state after each event
    assert view.html.value == expected[0]                   # still the moment its cell ran
    frames = view.timeline.frames
    assert frames[-1].values["html"] == expected[-1] and frames[-1].seq == last_seq()
    shown = [view.step(1).values["html"] for _ in range(len(frames) - 1 - view.timeline.bound)]
    assert shown[-1] == expected[-1] and view.html.value == expected[-1]
    assert all(s in [f.values["html"] for f in frames] for s in expected)
    view.tl_cell.click()
    assert view.html.value == expected[0] and 'data-frame="' in view.tl_label.value
    assert f'data-bound-seq="{moment.seq}"' in view.tl_label.value
    view.tl_back.click()                                    # frame 0: when it was built
    view.tl_now.click()
    assert view.html.value == expected[-1]
    view.tl_follow.click()                                  # free play: follow the engine
    small_log.append([("k", "live")])
    assert view.html.value == DirectoryModel(small_log).render_html()
    assert 'data-follow="true"' in view.tl_label.value and view.tl_follow.button_style == "success"
    view.tl_follow.click()                                  # stop: stay on this frame
    small_log.append([("k", "not shown")])
    assert view.html.value != DirectoryModel(small_log).render_html() and not view.timeline.follow


def test_every_engine_view_records_a_frame_per_engine_event(small_log, cluster):
    from kstore.widgets import HexView, IndexView, LookupView, ReplicaView

    views = [HexView(small_log, rows=4, min_interval=0), IndexView(small_log, min_interval=0),
             LookupView(small_log, 3, min_interval=0)]
    for v in views:
        v.bind()
    bound = [v.html.value for v in views]
    for i in range(30):                                     # enough bytes for an index entry
        small_log.append([(f"k{i}", "x" * 40)])
    small_log.roll()
    for v, before in zip(views, bound):
        assert v.html.value == before, type(v).__name__
        labels = " ".join(f.label for f in v.timeline.frames)
        # (a lookup of offset 3 looks the same after appends: those fold into one frame)
        assert ("roll" if isinstance(v, LookupView) else "append") in labels, labels
    assert "index entry" in " ".join(f.label for f in views[1].timeline.frames)
    assert "roll" in " ".join(f.label for f in views[0].timeline.frames)
    rv = ReplicaView(cluster, "orders", min_interval=0)
    rv.bind()
    first = rv.html.value
    cluster.crash(2)
    assert rv.html.value == first and "crash broker 2" in rv.timeline.frames[-1].label
    rv.produce_button.click()                               # a user action acts on the present
    assert rv.timeline.at_end and 'data-leo="1"' in rv.html.value


def test_a_user_action_on_a_bound_view_shows_the_present(small_log):
    from kstore.widgets import HexView

    view = HexView(small_log, rows=4, min_interval=0)
    view.bind()
    small_log.append([("k", "v" * 300)])
    view.model.first_page()
    view.next.click()
    assert view.timeline.at_end and view.model.start == 64
    assert view.html.value == view.model.render_html()


def test_a_view_whose_log_was_removed_keeps_its_frames_and_says_why(make_log):
    from kstore.widgets import IndexView

    log = make_log({"index.interval.bytes": 100})
    view = IndexView(log, min_interval=0)
    view.bind()
    for i in range(5):
        log.append([("k", "x" * 120)])
    frames = len(view.timeline.frames)
    log.close()
    shutil.rmtree(log.dir)                                  # what a chapter's cleanup cell does
    view.tl_follow.click()
    assert view.timeline.follow and view.timeline.at_end and len(view.timeline.frames) == frames
    assert "cannot read the engine now" in view.tl_label.value
    assert view.step(-1) is view.timeline.frames[-2]        # the recorded frames still step

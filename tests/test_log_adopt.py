"""Log.adopt_as_leader: a file of producer batches becomes a segment at the log end offset.

The Spark sink's commit uses it for big staged runs (kstore/spark/sink.py). What must hold: the
log afterwards is exactly what appending the same bytes would give (records, offsets, leader
epochs, timestamps, indexes equal to what recovery rebuilds), a file it cannot take changes
nothing, and a SIGKILL at any moment leaves either all of the file in the log or none of it."""

from __future__ import annotations

import os
import random
import sys
import textwrap
import time

import pytest

from kstore import Log, LogConfig, Record
from kstore.errors import CorruptRecordError, InvalidRecordError
from kstore.records import Compression, build_batch

from helpers import T0, start_and_kill


def staged_file(path, batches: int, per_batch: int = 10, start: int = 0, ts: int = T0, **kw) -> list[bytes]:
    """Write `batches` producer batches (base offset 0, as a client sends them); return the values."""
    values = []
    with open(path, "wb") as f:
        for b in range(batches):
            vs = [b"v%06d" % (start + b * per_batch + i) + b"x" * 90 for i in range(per_batch)]
            f.write(build_batch([Record(b"k%d" % i, v, ts + b) for i, v in enumerate(vs)], **kw))
            values += vs
    return values


def index_entries(log: Log) -> list[tuple]:
    out = []
    for s in log.segments:
        out.append((s.base_offset, s.size,
                    [tuple(e) for e in s.offset_index.entries_list()],
                    [tuple(e) for e in s.time_index.entries_list()]))
    return out


def test_an_adopted_file_becomes_the_active_segment_with_the_offsets_an_append_gives(make_log, tmp_path):
    log = make_log()
    log.append([b"a", b"b", b"c"], timestamp=T0)
    path = tmp_path / "run.batches"
    values = staged_file(path, 300)
    size = path.stat().st_size
    info = log.adopt_as_leader(str(path), leader_epoch=0)
    assert not path.exists()                          # renamed into the partition
    assert (info.first_offset, info.last_offset, info.num_messages) == (3, 3002, 3000)
    assert info.rolled and info.valid_bytes == size
    assert [s.base_offset for s in log.segments] == [0, 3]
    assert log.active_segment.size == size
    assert log.log_end_offset == 3003 and log.high_watermark == 3003
    assert os.path.exists(os.path.join(log.dir, "00000000000000000003.log"))
    stored = log.records()
    assert [r.offset for r in stored] == list(range(3003))
    assert [r.value for r in stored][3:] == values
    # appends go on in the adopted segment; lookups inside it go through its index
    log.append([b"after"], timestamp=T0 + 400)
    assert log.active_segment.base_offset == 3
    for offset in (3, 1000, 2999, 3003):
        assert log.read(offset, 200).batches()[0].base_offset <= offset <= \
            log.read(offset, 200).batches()[0].last_offset
    assert log.fetch_offset_by_timestamp(T0 + 150).offset == 3 + 150 * 10


def test_the_adopted_segment_has_the_indexes_recovery_would_build(make_log, tmp_path):
    log = make_log({"index.interval.bytes": 2000})
    log.append([b"a"], timestamp=T0)
    path = tmp_path / "run.batches"
    staged_file(path, 200, ts=T0 + 5)
    log.adopt_as_leader(str(path))
    log.append([b"tail-%d" % i for i in range(30)], timestamp=T0 + 999)
    adopted = index_entries(log)
    assert len(adopted[1][2]) > 50                   # a sparse index, entry every ~2000 bytes
    log.close()
    for name in os.listdir(log.dir):                 # drop the indexes: recovery rebuilds them
        if name.endswith((".index", ".timeindex")):
            os.remove(os.path.join(log.dir, name))
    rebuilt = make_log({"index.interval.bytes": 2000})
    assert [r.value for r in rebuilt.records()][-1] == b"tail-29"
    got = index_entries(rebuilt)
    # recovery indexes batch by batch, as adoption does; the appended tail was one batch
    assert [g[:3] for g in got] == [a[:3] for a in adopted]
    assert [g[3][:-1] for g in got] == [a[3][:-1] for a in adopted]


def test_adoption_stamps_the_leader_epoch_and_log_append_time(make_log, tmp_path, clock):
    log = make_log({"message.timestamp.type": "LogAppendTime"})
    log.append([b"a"], leader_epoch=4)
    path = tmp_path / "run.batches"
    staged_file(path, 20)
    clock.advance(5_000)
    log.adopt_as_leader(str(path), leader_epoch=4)
    batches = list(log.batches())
    assert {b.partition_leader_epoch for b in batches} == {4}
    assert all(b.max_timestamp == clock.milliseconds() for b in batches[1:])
    assert all(r.timestamp == clock.milliseconds() for r in log.records()[1:])


@pytest.mark.parametrize("kind", ["idempotent", "transactional", "recompressed", "too big", "empty"])
def test_a_file_the_leader_must_rewrite_or_cannot_take_is_refused_and_nothing_changes(
        make_log, tmp_path, kind):
    config = {"compression.type": "gzip"} if kind == "recompressed" else \
        {"segment.bytes": 4096} if kind == "too big" else {}
    log = make_log(config)
    log.append([b"a"], timestamp=T0)
    path = tmp_path / "run.batches"
    if kind == "idempotent":
        staged_file(path, 3, producer_id=7, producer_epoch=0, base_sequence=0)
    elif kind == "transactional":
        staged_file(path, 3, producer_id=7, producer_epoch=0, base_sequence=0, transactional=True)
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        staged_file(path, 60)
    before = path.read_bytes()
    files = sorted(os.listdir(log.dir))
    assert log.adopt_as_leader(str(path)) is None
    assert path.read_bytes() == before                 # not even the offsets were stamped
    assert sorted(os.listdir(log.dir)) == files
    assert log.log_end_offset == 1 and len(log.segments) == 1


@pytest.mark.parametrize("damage", ["flipped byte", "cut inside a batch", "offset gap in a record",
                                    "a client's base offset"])
def test_a_damaged_file_raises_and_the_log_is_unchanged(make_log, tmp_path, damage):
    log = make_log()
    log.append([b"a"], timestamp=T0)
    path = tmp_path / "run.batches"
    staged_file(path, 30)
    data = bytearray(path.read_bytes())
    if damage == "flipped byte":
        data[len(data) // 2 + 300] ^= 0x10          # inside the records of a batch (CRC)
    elif damage == "cut inside a batch":
        data = data[:-7]
    elif damage == "a client's base offset":    # neither 0 nor what a failed attempt stamped
        second = int.from_bytes(data[8:12], "big") + 12
        data[second:second + 8] = (12345).to_bytes(8, "big")
    else:                            # a batch claiming 11 records: the CRC must be recomputed
        from kstore.records import crc32c
        data[57:61] = (11).to_bytes(4, "big")
        data[17:21] = crc32c(bytes(data[21:21 + int.from_bytes(data[8:12], "big") - 9])
                             ).to_bytes(4, "big")
    path.write_bytes(bytes(data))
    with pytest.raises((CorruptRecordError, InvalidRecordError)) as e:
        log.adopt_as_leader(str(path))
    assert str(e.value).startswith(f"adopting {path} into topic-0: ")
    assert path.read_bytes() == bytes(data)
    assert log.log_end_offset == 1 and len(log.segments) == 1
    assert [r.value for r in log.records()] == [b"a"]


def test_a_file_stamped_by_an_attempt_that_failed_is_adopted_again(make_log, tmp_path):
    log = make_log()
    log.append([b"a", b"b"], timestamp=T0)
    path = tmp_path / "run.batches"
    values = staged_file(path, 10)
    real_rename = os.rename

    def failing_rename(*a):
        raise OSError("the disk said no")
    os.rename = failing_rename
    try:
        with pytest.raises(OSError):
            log.adopt_as_leader(str(path))
    finally:
        os.rename = real_rename
    assert log.log_end_offset == 2 and path.exists()
    log.adopt_as_leader(str(path))
    assert [r.value for r in log.records()] == [b"a", b"b"] + values
    assert [r.offset for r in log.records()] == list(range(102))


def test_adopting_into_an_empty_log_replaces_its_empty_segment(make_log, tmp_path):
    log = make_log()
    path = tmp_path / "run.batches"
    values = staged_file(path, 5)
    log.adopt_as_leader(str(path))
    assert [s.base_offset for s in log.segments] == [0]
    assert [r.value for r in log.records()] == values
    log.close()
    again = make_log()
    assert [r.value for r in again.records()] == values


# ---- SIGKILL while adopting ----------------------------------------------------------------

CHILD = textwrap.dedent("""
    import os, sys
    from kstore import Log
    log = Log.open(sys.argv[1])
    print("open", flush=True)
    for name in sorted(os.listdir(sys.argv[2])):
        log.adopt_as_leader(os.path.join(sys.argv[2], name))
        log.flush()
""")


def test_sigkill_while_adopting_leaves_each_file_all_in_the_log_or_not_at_all(tmp_path):
    """A child adopts staged files one after the other (each flushed: fsyncs widen the windows);
    it is killed (SIGKILL) a random moment after it opened the log. Then the log is reopened
    (recovery: an adopted segment found without indexes gets them rebuilt) and checked, and the
    next child adopts the files still staged, some of them stamped already. In the end the log
    holds every file's records exactly once, in order, whatever the kills interrupted."""
    rng = random.Random(20261128)
    log_dir, staging = tmp_path / "t-0", tmp_path / "staging"
    staging.mkdir()
    expected = []
    for i in range(60):
        expected += staged_file(staging / f"{i:03d}.batches", rng.randint(1, 80),
                                start=len(expected))
    kills = checks = 0
    deadline = time.monotonic() + 60
    while os.listdir(staging) and time.monotonic() < deadline:
        kills += start_and_kill([sys.executable, "-c", CHILD, str(log_dir), str(staging)],
                                b"open", 0.02, rng)
        with Log.open(str(log_dir)) as log:        # recovers; every record checked so far
            stored = log.records()
            assert [r.value for r in stored] == expected[:len(stored)]
            assert [r.offset for r in stored] == list(range(len(stored)))
            checks += len(stored)
    assert not os.listdir(staging) and kills >= 5, kills
    with Log.open(str(log_dir)) as log:
        assert [r.value for r in log.records()] == expected
        for s in log.segments:
            s.sanity_check()


def test_the_producer_state_covers_the_adopted_batches_and_idempotent_appends_go_on(make_log, tmp_path):
    """The adopted batches carry no producer id: the producer state only moves the offset it
    covers; an idempotent producer's appends before and after keep their sequences."""
    from kstore.records import build_batch as bb
    log = make_log()
    log.append_as_leader(bb([Record(b"k", b"p0", T0)], producer_id=9, producer_epoch=0,
                            base_sequence=0))
    path = tmp_path / "run.batches"
    staged_file(path, 10)
    log.adopt_as_leader(str(path))
    assert log.producer_state.map_end_offset == log.log_end_offset == 101
    retry = log.append_as_leader(bb([Record(b"k", b"p0", T0)], producer_id=9, producer_epoch=0,
                                    base_sequence=0))
    assert retry.duplicate and retry.first_offset == 0
    log.append_as_leader(bb([Record(b"k", b"p1", T0)], producer_id=9, producer_epoch=0,
                            base_sequence=1))
    assert [r.value for r in log.records()][-1] == b"p1" and log.log_end_offset == 102
    log.close()
    again = make_log()
    assert again.producer_state.map_end_offset == 102
    assert again.log_end_offset == 102

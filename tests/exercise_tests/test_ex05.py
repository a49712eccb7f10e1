"""Exercise 05 — recovery after a crash: the valid prefix of a damaged `.log` (the truncation
point) and the offset index rebuilt from it (`LogSegment.recover`, §5.2). Compared with kstore's
own recovery run on the same bytes in a real segment file."""

from __future__ import annotations

import os
import shutil
import struct

import pytest
from hypothesis import given, strategies as st

from kstore import LogConfig, ManualClock
from kstore.grading.feedback import expect_equal
from kstore.grading.testing import PROPERTY, scratch_dir, task
from kstore.records import Record, build_batch, crc32c
from kstore.segment import LogSegment

T = 1_700_000_000_000


def engine_recover(data: bytes, base_offset: int = 0, interval: int = 4096) -> tuple[int, list]:
    """(valid bytes, rebuilt index entries) from kstore's LogSegment.recover on these bytes."""
    d = scratch_dir()
    try:
        with open(os.path.join(d, f"{base_offset:020d}.log"), "wb") as f:
            f.write(data)
        config = LogConfig({"index.interval.bytes": interval, "segment.index.bytes": 256 * 1024})
        seg = LogSegment.open(d, base_offset, config, ManualClock(), file_already_exists=True)
        truncated = seg.recover()
        entries = [(e.offset, e.position) for e in seg.offset_index.entries_list()]
        seg.close_handlers()
        return len(data) - truncated, entries
    finally:
        shutil.rmtree(d, ignore_errors=True)


def batches(sizes: list[int], base: int = 0, per_batch: int = 1) -> list[bytes]:
    out, off = [], base
    for i, size in enumerate(sizes):
        recs = [Record(f"k{off + j}".encode(), bytes([65 + i % 26]) * size, T + off + j) for j in range(per_batch)]
        out.append(build_batch(recs, base_offset=off, partition_leader_epoch=0))
        off += per_batch
    return out


def flip(data: bytes, pos: int) -> bytes:
    return data[:pos] + bytes([data[pos] ^ 0x40]) + data[pos + 1:]


def _valid_variant(data: bytes, *, check_crc=True, crc_from=21, count=False) -> int:
    pos, n = 0, 0
    while len(data) - pos > 17:
        (length,) = struct.unpack_from(">i", data, pos + 8)
        size = 12 + length
        if length < 14 or pos + size > len(data) or size < 61 or data[pos + 16] != 2:
            break
        if check_crc and struct.unpack_from(">I", data, pos + 17)[0] != crc32c(data[pos + crc_from:pos + size]):
            break
        pos += size
        n += 1
    return n if count else pos


def valid_mistakes(data):
    return [("the CRC is not checked: a batch whose bytes changed after it was written must end "
             "the valid part (CRC-32C of bytes 21..end of the batch)", _valid_variant(data, check_crc=False)),
            ("every batch was rejected: the CRC must be CRC-32C over bytes 21 to the end of each batch",
             lambda a: a == 0 and _valid_variant(data) > 0),
            ("this counts batches; return the number of valid *bytes* (where the file is cut)",
             _valid_variant(data, count=True))]


FIVE = batches([30, 200, 5, 120, 60])
CLEAN = b"".join(FIVE)
START = [sum(len(b) for b in FIVE[:i]) for i in range(6)]          # batch start positions


def _set_length(data, pos, length):
    return data[:pos + 8] + struct.pack(">i", length) + data[pos + 12:]


VALID_VECTORS = [
    ("clean-log", CLEAN),
    ("empty-file", b""),
    ("torn-last-batch", CLEAN[:START[4] + 40]),
    ("torn-inside-a-header", CLEAN[:START[4] + 10]),
    ("flipped-byte-in-the-records", flip(CLEAN, START[2] + 65)),
    ("flipped-byte-in-the-crc", flip(CLEAN, START[3] + 18)),
    ("flipped-attributes", flip(CLEAN, START[1] + 21)),
    ("zeros-after-the-end", CLEAN + b"\0" * 300),
    ("garbage-after-the-end", CLEAN + bytes(range(200, 255)) * 3),
    ("length-below-14", _set_length(CLEAN, START[3], 5)),
    ("wrong-magic", CLEAN[:START[2] + 16] + b"\x01" + CLEAN[START[2] + 17:]),
    ("short-batch-length-20", _set_length(CLEAN, START[1], 20)),
]


@task("ex05.1", points=6)
@pytest.mark.parametrize("data", [v[1] for v in VALID_VECTORS], ids=[v[0] for v in VALID_VECTORS])
def test_valid_prefix_length_vectors(learner, data):
    valid, _ = engine_recover(data)
    expect_equal(learner.valid_prefix_length(data), valid,
                 call=f"valid_prefix_length(<{len(data)} bytes>)", mistakes=valid_mistakes(data),
                 inputs={"batch starts": START, "batch sizes": [len(b) for b in FIVE]})


DAMAGE = st.one_of(st.tuples(st.just("cut"), st.floats(0, 1)), st.tuples(st.just("flip"), st.floats(0, 1)),
                   st.tuples(st.just("garbage"), st.binary(min_size=1, max_size=80)),
                   st.tuples(st.just("zeros"), st.integers(1, 500)), st.tuples(st.just("none"), st.none()))


def damage(data: bytes, how) -> bytes:
    kind, arg = how
    if kind == "cut":
        return data[:int(len(data) * arg)]
    if kind == "flip" and len(data) > 21:
        starts, pos = [], 0
        while pos < len(data):
            starts.append(pos)
            pos += 12 + struct.unpack_from(">i", data, pos + 8)[0]
        # only bytes the CRC covers (or the CRC itself): flipping a base offset is another story
        candidates = [p for s in starts for p in range(s + 17, s + 12 + struct.unpack_from(">i", data, s + 8)[0])]
        return flip(data, candidates[int(arg * (len(candidates) - 1))])
    if kind == "garbage":
        return data + arg
    if kind == "zeros":
        return data + b"\0" * arg
    return data


@task("ex05.1", points=4)
@PROPERTY
@given(st.lists(st.integers(0, 300), min_size=0, max_size=8), st.integers(1, 3), DAMAGE)
def test_valid_prefix_length_matches_engine_recovery(learner, sizes, per_batch, how):
    data = damage(b"".join(batches(sizes, per_batch=per_batch)), how)
    valid, _ = engine_recover(data)
    expect_equal(learner.valid_prefix_length(data), valid,
                 call=f"valid_prefix_length(<{len(data)} bytes: {len(sizes)} batches, damage {how[0]}>)",
                 mistakes=valid_mistakes(data))


# ------------------------------------------------------------------ ex05.2 rebuild_index
def _index_variant(data, base, interval, *, ge=False, after=False, base_offset_entry=False):
    entries, pos, last_entry = [], 0, 0
    while pos < len(data):
        b_base, length = struct.unpack_from(">qi", data, pos)
        (delta,) = struct.unpack_from(">i", data, pos + 23)
        size = 12 + length
        due = pos - last_entry >= interval if ge else pos - last_entry > interval
        if due:
            entries.append((b_base if base_offset_entry else b_base + delta, pos + size if after else pos))
            last_entry = pos
        pos += size
    return entries


def index_mistakes(data, base, interval):
    return [(">= instead of >: an entry only when the bytes since the last entry are strictly more "
             "than index.interval.bytes", _index_variant(data, base, interval, ge=True)),
            ("an entry holds the batch's *last* offset (with the position where the batch starts), "
             "as LogSegment.append does", _index_variant(data, base, interval, base_offset_entry=True)),
            ("an entry holds the position where the batch *starts*", _index_variant(data, base, interval, after=True))]


INDEX_VECTORS = [("every-batch-interval-0", batches([50] * 6, 100, 3), 100, 0),
                 ("interval-500", batches([100] * 20, 1000, 2), 1000, 500),
                 ("exactly-the-interval", batches([100] * 12), 0, 4 * len(batches([100])[0])),
                 ("no-entries-for-a-small-log", batches([10, 10]), 0, 4096)]


@task("ex05.2", points=6)
@pytest.mark.parametrize("parts, base, interval", [v[1:] for v in INDEX_VECTORS], ids=[v[0] for v in INDEX_VECTORS])
def test_rebuild_index_vectors(learner, parts, base, interval):
    data = b"".join(parts)
    _, expected = engine_recover(data, base, interval)
    expect_equal(learner.rebuild_index(data, base, interval), expected,
                 call=f"rebuild_index(<{len(data)} bytes, {len(parts)} batches>, base_offset={base}, "
                      f"index_interval_bytes={interval})",
                 mistakes=index_mistakes(data, base, interval), normalize=lambda r: [tuple(e) for e in r],
                 inputs={"batch sizes": [len(p) for p in parts][:10]})


@task("ex05.2", points=4)
@PROPERTY
@given(st.lists(st.integers(0, 400), min_size=1, max_size=25), st.integers(1, 4), st.integers(0, 10**9),
       st.sampled_from([0, 200, 700, 4096]))
def test_rebuild_index_matches_engine_recovery(learner, sizes, per_batch, base, interval):
    data = b"".join(batches(sizes, base, per_batch))
    _, expected = engine_recover(data, base, interval)
    expect_equal(learner.rebuild_index(data, base, interval), expected,
                 call=f"rebuild_index(<{len(data)} bytes, {len(sizes)} batches>, base_offset={base}, "
                      f"index_interval_bytes={interval})",
                 mistakes=index_mistakes(data, base, interval), normalize=lambda r: [tuple(e) for e in r])

"""Exercise 11 — zero-copy fetch: the byte range a fetch returns from a segment (`LogSegment.read`,
§4.2) and sending it with `os.sendfile` (§11). Compared with kstore's LogSegment on real segments,
and checked byte for byte at the other end of a real socket."""

from __future__ import annotations

import shutil

import pytest
from hypothesis import given, strategies as st

from kstore.grading.feedback import Mismatch, expect_bytes, expect_equal
from kstore.grading.sendfile_check import serve_through_socketpair
from kstore.grading.testing import PROPERTY, SegmentView, build_segment, extra, scratch_dir, task
from kstore.records import Record, build_batch

T = 1_700_000_000_000


# ------------------------------------------------------------------ ex11.1 fetch_range
def _batches(sizes, base=0):
    out, off = [], base
    for size in sizes:
        out.append(build_batch([Record(b"k", b"x" * size, T + off)], base_offset=off))
        off += 1
    return out


def engine_range(seg, start, max_bytes, min_one):
    info = seg.read(start, max_bytes, None, min_one)
    return None if info is None else (info.records.position, info.records.size)


def range_mistakes(seg, start, max_bytes, min_one):
    found = seg.translate_offset(start)
    if found is None:
        return []
    pos, first = found.position, found.size
    left = seg.size - pos
    return [("min_one_message: when the first batch is bigger than max_bytes the fetch returns that "
             "whole batch anyway (KIP-74), or a consumer could never make progress",
             (pos, min(left, max_bytes)) if min_one else object()),
            ("the range must stop at the end of the segment: size = min(segment.size − position, ...)",
             (pos, max(max_bytes, first) if min_one else max_bytes)),
            ("with min_one_message=False the size is just min(max_bytes, what is left)",
             (pos, min(left, max(max_bytes, first))) if not min_one else object()),
            ("the range starts at the batch holding the offset (translate_offset), not at the offset's "
             "own bytes: Kafka sends whole batches", lambda a: a is not None and a[0] != pos)]


def check_range(learner, sizes, start, max_bytes, min_one, base=0):
    d = scratch_dir()
    seg = build_segment(d, base, _batches(sizes, base), 200)
    try:
        view = SegmentView(seg, with_translate=True)
        expected = engine_range(seg, start, max_bytes, min_one)    # before the learner's code touches seg
        expect_equal(learner.fetch_range(view, start, max_bytes, min_one), expected,
                     call=f"fetch_range({view!r}, start_offset={start}, max_bytes={max_bytes}, "
                          f"min_one_message={min_one})",
                     inputs={"batches (position, offset, size)":
                             [(l.position, l.base_offset, l.size) for l in seg.log.batch_locations()][:10]},
                     mistakes=range_mistakes(seg, start, max_bytes, min_one),
                     normalize=lambda r: None if r is None else tuple(r))
    finally:
        seg.close_handlers()
        shutil.rmtree(d, ignore_errors=True)


SIZES = [100, 300, 50, 1000, 20]            # value bytes of batches at offsets 0..4
RANGE_VECTORS = [("from-the-start", 0, 10_000, True), ("inside-the-log", 2, 500, True),
                 ("first-batch-too-big-min-one", 3, 100, True), ("first-batch-too-big-no-min-one", 3, 100, False),
                 ("zero-bytes", 1, 0, False), ("to-the-end", 4, 10**6, True), ("past-the-end", 5, 1000, True),
                 ("ends-inside-a-batch", 0, 250, True)]


@task("ex11.1", points=6)
@pytest.mark.parametrize("start, max_bytes, min_one", [v[1:] for v in RANGE_VECTORS], ids=[v[0] for v in RANGE_VECTORS])
def test_fetch_range_vectors(learner, start, max_bytes, min_one):
    check_range(learner, SIZES, start, max_bytes, min_one)


@task("ex11.1", points=4)
@PROPERTY
@given(st.lists(st.integers(0, 600), min_size=1, max_size=10), st.integers(0, 11), st.integers(0, 3000),
       st.booleans(), st.integers(0, 10**9))
def test_fetch_range_matches_the_engine(learner, sizes, start, max_bytes, min_one, base):
    check_range(learner, sizes, base + start, max_bytes, min_one, base)


# ------------------------------------------------------------------ ex11.2 send_range
def serve(learner, data: bytes, position: int, count: int, cap: int | None = None):
    """Call the learner's send_range on one end of a socketpair; collect the other end."""
    return serve_through_socketpair(lambda sock, fd: learner.send_range(sock, fd, position, count), data, cap)


DATA = bytes(range(256)) * 400              # 102,400 bytes


def check_send(learner, data, position, count, cap=None):
    expected = data[position:position + count]
    result, got, calls = serve(learner, data, position, count, cap)
    call = f"send_range(sock, file_fd, position={position}, count={count})" + \
        (f" [os.sendfile sends at most {cap} bytes per call]" if cap else "")
    if calls["sendfile"] == 1 and cap and count > cap and len(got) == cap:
        raise Mismatch(f"{call}\n  os.sendfile sent only {cap} of {count} bytes and send_range stopped: "
                       f"a socket takes what fits; loop until all `count` bytes are sent")
    expect_bytes(got, expected, call=call + "  → bytes received by the peer")
    expect_equal(result, len(expected), call=call + "  → return value",
                 hint="return the number of bytes sent")
    return calls


SEND_VECTORS = [("whole-file", 0, len(DATA), None), ("a-range", 12_345, 5000, None),
                ("partial-sends", 1000, 50_000, 1000), ("one-byte", 77, 1, None),
                ("count-past-the-end", len(DATA) - 100, 1000, None), ("nothing", 500, 0, None)]


@task("ex11.2", points=6)
@pytest.mark.parametrize("position, count, cap", [v[1:] for v in SEND_VECTORS], ids=[v[0] for v in SEND_VECTORS])
def test_send_range_vectors(learner, position, count, cap):
    check_send(learner, DATA, position, count, cap)


@task("ex11.2", points=3)
@PROPERTY
@given(st.integers(0, 5000), st.integers(0, 6000), st.integers(0, 6000), st.one_of(st.none(), st.integers(1, 700)))
def test_send_range_sends_exactly_the_range(learner, size, position, count, cap):
    check_send(learner, DATA[:size], min(position, size), count, cap)


@task("ex11.2", points=1)
@extra
def test_extra_send_range_uses_sendfile(learner):
    """Zero-copy means the bytes never enter Python: every byte must go through os.sendfile."""
    calls = check_send(learner, DATA, 0, len(DATA), 4096)
    if calls["bytes"] != len(DATA):
        raise Mismatch(f"send_range(sock, file_fd, 0, {len(DATA)})\n  only {calls['bytes']:,} of the "
                       f"{len(DATA):,} bytes went through os.sendfile: read()+send() copies them "
                       f"through user space; call os.sendfile(...) (as os.sendfile, so the test sees it)")

"""Exercise 12 — the capstone: the learner's `serve_fetch` sends a fetch's byte range of a segment
file with `os.sendfile` (what kstore's network server does for every Fetch response). Checked byte
for byte at the other end of a real socket, then plugged into a real `KafkaServer` that a real
kafka-python consumer reads a topic through."""

from __future__ import annotations

import shutil

from hypothesis import given, strategies as st
import pytest

from kstore.grading import live
from kstore.grading.feedback import Mismatch, expect_bytes, expect_equal
from kstore.grading.sendfile_check import serve_through_socketpair
from kstore.grading.testing import PROPERTY, extra, scratch_dir, task

DATA = bytes(range(256)) * 400              # 102,400 bytes, every position's byte differs from its neighbours'


def serve(learner, data: bytes, start: int, end: int, cap: int | None = None):
    return serve_through_socketpair(lambda sock, fd: learner.serve_fetch(sock, fd, start, end), data, cap)


def mistakes(data: bytes, start: int, end: int, cap: int | None):
    """The wrong byte strings a named mistake sends."""
    count = max(0, end - start)
    named = [("off by one: the range [start, end) holds end − start bytes, not one more",
              data[start:end + 1]),
             ("off by one: the range [start, end) holds end − start bytes, not one fewer (end is excluded)",
              data[start:end - 1])]
    if cap and count > cap:
        named.append(("after a partial send, the next os.sendfile must start at start + sent: it started "
                      "at `sent`, as if the range began at the start of the file",
                      data[start:start + cap] + data[cap:count]))
        named.append(("os.sendfile sent only part of the range and serve_fetch stopped: a socket takes "
                      "what fits; loop until all end − start bytes are sent", data[start:start + cap]))
    if start:
        named.append(("the range starts at `start` (the first batch's position), not at the beginning "
                      "of the file", data[0:count]))
    return [(why, wrong) for why, wrong in named if wrong != data[start:end]]


def check_serve(learner, data, start, end, cap=None):
    expected = data[start:end]
    call = f"serve_fetch(sock, file_fd, start={start}, end={end})" + \
        (f" [os.sendfile sends at most {cap} bytes per call]" if cap else "")
    result, got, calls = serve(learner, data, start, end, cap)
    for why, wrong in mistakes(data, start, end, cap):
        if got == wrong:
            raise Mismatch(f"{call}\n  the peer received {len(got):,} bytes, expected {len(expected):,}: {why}")
    expect_bytes(got, expected, call=call + "  → bytes received by the peer")
    expect_equal(result, len(expected), call=call + "  → return value",
                 hint="return the number of bytes sent (end − start when the file holds them)")
    return calls


VECTORS = [("worked-example", 1000, 6000, None), ("whole-file", 0, len(DATA), None),
           ("partial-sends", 1000, 51_000, 1000), ("partial-sends-from-0", 0, 30_000, 4096),
           ("one-byte", 77, 78, None), ("empty-range", 500, 500, None),
           ("end-past-the-file", len(DATA) - 100, len(DATA) + 900, None)]


@task("ex12.1", points=6)
@pytest.mark.parametrize("start, end, cap", [v[1:] for v in VECTORS], ids=[v[0] for v in VECTORS])
def test_serve_fetch_vectors(learner, start, end, cap):
    check_serve(learner, DATA, start, end, cap)


@task("ex12.1", points=2)
@PROPERTY
@given(st.integers(0, 5000), st.integers(0, 6000), st.integers(0, 3000), st.one_of(st.none(), st.integers(1, 700)))
def test_serve_fetch_sends_exactly_the_range(learner, size, start, length, cap):
    start = min(start, size)
    check_serve(learner, DATA[:size], start, start + length, cap)


@task("ex12.1", points=1)
@extra
def test_extra_serve_fetch_uses_sendfile(learner):
    """Zero-copy means the bytes never enter Python: every byte must go through os.sendfile."""
    calls = check_serve(learner, DATA, 0, len(DATA), 4096)
    if calls["bytes"] != len(DATA):
        raise Mismatch(f"serve_fetch(sock, file_fd, 0, {len(DATA)})\n  only {calls['bytes']:,} of the "
                       f"{len(DATA):,} bytes went through os.sendfile: reading the file and sending the bytes "
                       f"copies them through user space; call os.sendfile(...) (as os.sendfile, so the test sees it)")


@task("ex12.1", points=3)
@pytest.mark.timeout(120)
def test_a_kafka_python_consumer_reads_through_serve_fetch(learner):
    """The capstone: a KafkaServer sends every fetch's file slice with the learner's serve_fetch; a
    real kafka-python consumer reads back all the records a real producer wrote."""
    root = scratch_dir()
    try:
        run = live.kafka_python_through(lambda sock, fd, start, end: learner.serve_fetch(sock, fd, start, end),
                                        root, records=200, timeout_s=8.0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    bad = run.wrong_return
    if run.consumed != run.produced:
        raise Mismatch("KafkaServer(broker, fetch_sender=serve_fetch) + kafka-python's KafkaConsumer\n"
                       f"  expected: the consumer reads all {len(run.produced)} records the producer wrote; "
                       f"your code: {run.summary()}"
                       + (f"\n  the broker called serve_fetch(sock, fd, start={bad[0]}, end={bad[1]}) and it "
                          f"returned {bad[2]!r}, not {bad[1] - bad[0]}" if bad else ""))
    if bad:
        raise Mismatch(f"KafkaServer(broker, fetch_sender=serve_fetch)\n  the broker called serve_fetch(sock, fd, "
                       f"start={bad[0]}, end={bad[1]}) and it returned {bad[2]!r}, not {bad[1] - bad[0]}: the "
                       f"response had promised the client exactly end − start bytes, so the broker closed the "
                       f"connection (the consumer reconnected and fetched again)")
    if not run.calls:
        raise Mismatch("the broker never called serve_fetch")


# ---------------------------------------------------------------------------------- ex12.2: your engine
_CAPSTONE: dict = {}


def capstone_of(learner):
    """One capstone run per engine (its six checks are six graded tests, and check("ex12") after
    check("ex12.2") asks again): every function the learner saved, plugged into brokers that real
    clients use. While `kstore grade` runs, each of the learner's functions is a call into the
    confined learner process; the engine, the clients, the references and the referee run here."""
    from kstore.grading.capstone import run_capstone
    functions = learner.functions()
    if learner._remote is not None:          # a fresh learner process (after a death) is a new engine
        key = ("remote", id(learner._remote), learner._remote.starts)
    else:                                    # the same code objects: the same engine
        key = tuple(sorted((name, id(getattr(fn, "__code__", fn))) for name, fn in functions.items()))
    if _CAPSTONE.get("key") != key:
        root = scratch_dir("kstore-capstone-")
        try:
            _CAPSTONE.update(key=key, functions=functions, result=run_capstone(functions, root))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return _CAPSTONE["result"]


@task("ex12.2", points=12)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("check", ["clients", "files", "restart", "retention", "compaction", "replication"])
def test_your_engine_matches_kafka(learner, check):
    """Each check of the capstone: the learner's saved engine serves; the feedback names the
    learner's function that answered differently from Kafka's rule (kstore.grading.capstone)."""
    result = capstone_of(learner).results[check]
    if not result.passed:
        raise Mismatch(result.feedback())

"""The log-directory sink's commit adopts big staged runs as segments (Log.adopt_as_leader).

Without a JVM: tasks' staging (`_Writer._stage`) and the driver's commit (`commit_staged`) are
called directly, on real files and a real log directory. What must hold: each task stages every
partition in a file of its own (up to STAGED_FILES_PER_TASK), a run of ADOPT_MIN_BYTES or more
becomes a segment instead of being copied, smaller ones are copied, the log ends up with the same
records in the same order either way, and a commit killed at any point (an exception between
steps, or SIGKILL of the process) is finished exactly by the batch's re-run."""

from __future__ import annotations

import json
import os
import random
import sys
import textwrap
import time

import pyarrow as pa
import pytest

import pyspark  # noqa: F401  (a main dependency)
from pyspark.sql.types import BinaryType, StructField, StructType

from helpers import start_and_kill
from kstore.broker import Broker
from kstore.spark import sink
from kstore.spark.sink import COMMITS_FILE, KStoreStreamWriter, LogDirAppender, commit_staged

SCHEMA = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])


def rows(n: int, start: int = 0) -> pa.RecordBatch:
    keys = [b"key-%d" % (i % 97) for i in range(start, start + n)]
    values = [b"row-%07d-" % i + b"x" * 90 for i in range(start, start + n)]
    return pa.record_batch([pa.array(keys, pa.binary()), pa.array(values, pa.binary())],
                           names=["key", "value"])


def stage(log_dir, batch_id: str, attempt: int, tasks: int = 2, per_task: int = 3000):
    """What Spark's tasks of one micro-batch stage (the same rows on every attempt)."""
    writer = KStoreStreamWriter({"path": str(log_dir), "topic": "out"}, SCHEMA, False)
    return [writer._stage(iter([rows(per_task, t * per_task)]), batch_id, "q", t, f"{attempt}-{t}")
            for t in range(tasks)]


def stored(log_dir, partitions: int) -> dict[int, list[bytes]]:
    with Broker(str(log_dir)) as b:
        return {p: [r.value for r in b.get_log("out", p).records()] for p in range(partitions)}


def segments(log_dir, partition: int) -> list[int]:
    with Broker(str(log_dir)) as b:
        return [s.base_offset for s in b.get_log("out", partition).segments]


class Adopting(LogDirAppender):
    adopt_min_bytes = 1                          # every run alone in its file is adopted

    def __init__(self, *a):
        super().__init__(*a)
        self.adopted, self.appended = [], []

    def adopt(self, tp, path):
        done = super().adopt(tp, path)
        if done:
            self.adopted.append(tp)
        return done

    def append(self, tp, data):
        self.appended.append(tp)
        super().append(tp, data)


@pytest.fixture
def log_dir(tmp_path):
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("out", 4)
    return d


def test_each_task_stages_each_partition_in_a_file_of_its_own(log_dir):
    staged = stage(log_dir, "0", 0)
    for m in staged:
        assert len(m.runs) == 4
        assert len({r.path for r in m.runs}) == 4 and m.files() == sorted(r.path for r in m.runs)
        for run in m.runs:
            assert run.path.endswith(f".out-{run.partition}.batches")
            last_pos, last_size, _ = run.batches[-1]
            assert os.path.getsize(run.path) == last_pos + last_size


def test_big_runs_become_segments_small_ones_are_copied_and_the_records_are_the_same(
        log_dir, tmp_path):
    copied_dir = tmp_path / "copied"
    with Broker(str(copied_dir)) as b:
        b.create_topic("out", 4)
    with Adopting(str(log_dir), 1000) as app:
        commit_staged(app, stage(log_dir, "0", 0), "q", 0)
        assert sorted(app.adopted) == sorted([("out", p) for p in range(4)] * 2)
        assert app.appended == []
    with LogDirAppender(str(copied_dir), 1000) as app:        # 8 MiB minimum: all copied
        commit_staged(app, stage(copied_dir, "0", 0), "q", 0)
    assert stored(log_dir, 4) == stored(copied_dir, 4)
    assert sum(len(v) for v in stored(log_dir, 4).values()) == 6000
    for p in range(4):
        task0 = len([v for v in stored(log_dir, 4)[p] if int(v[4:11]) < 3000])
        # one segment per task's run (the empty first segment replaced by the first run)
        assert segments(log_dir, p) == [0, task0]
        assert segments(copied_dir, p) == [0]
    assert not list((log_dir / sink.STAGING_DIR_NAME).rglob("*.batches"))


def test_a_task_with_more_partitions_than_files_shares_one_file_for_the_rest(
        log_dir, monkeypatch):
    monkeypatch.setattr(sink, "STAGED_FILES_PER_TASK", 2)
    staged = stage(log_dir, "0", 0)
    for m in staged:
        shared = [r for r in m.runs if ".out-" not in os.path.basename(r.path)]
        assert len(shared) == 2 and len(m.files()) == 3
    with Adopting(str(log_dir), 1000) as app:
        commit_staged(app, staged, "q", 0)
        assert len(app.adopted) == 4 and len(set(app.appended)) == 2
    values = sorted(v for vs in stored(log_dir, 4).values() for v in vs)
    assert values == sorted(rows(6000).column(1).to_pylist())
    for m in staged:
        assert not any(os.path.exists(f) for f in m.files())


class _Crash(Exception):
    pass


class CrashingAdopter(Adopting):
    commit_threads = 1                           # one partition after the other: known points

    def __init__(self, *a, crash_after: int):
        super().__init__(*a)
        self.left = crash_after

    def adopt(self, tp, path):
        if self.left == 0:
            raise _Crash()
        self.left -= 1
        return super().adopt(tp, path)


@pytest.mark.parametrize("crash_after", [0, 1, 3, 5, 7])
def test_a_commit_that_dies_between_adoptions_is_finished_by_the_re_run(log_dir, crash_after):
    first = stage(log_dir, "7", 0)
    with pytest.raises(_Crash):
        with CrashingAdopter(str(log_dir), 1000, crash_after=crash_after) as app:
            commit_staged(app, first, "q", 7)
    assert json.loads((log_dir / COMMITS_FILE).read_text())["q"]["state"] == "pending"
    again = stage(log_dir, "7", 1)               # Spark runs the batch again: new files
    with Adopting(str(log_dir), 1000) as app:
        commit_staged(app, again, "q", 7)
        assert len(app.adopted) == 8 - crash_after   # the runs already in are skipped whole
    values = stored(log_dir, 4)
    assert sorted(v for vs in values.values() for v in vs) == sorted(rows(6000).column(1).to_pylist())
    for vs in values.values():                   # task 0's rows before task 1's, per partition
        of_task_1 = [int(v[4:11]) >= 3000 for v in vs]
        assert of_task_1 == sorted(of_task_1)


CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[3])
    from test_spark_sink_adopt import Adopting, stage
    from kstore.spark.sink import commit_staged
    staged = stage(sys.argv[1], "5", int(sys.argv[2]), per_task=int(sys.argv[4]))
    print("staged", flush=True)
    with Adopting(sys.argv[1], 30000) as app:
        commit_staged(app, staged, "q", 5)
""")


def test_sigkill_during_an_adopting_commit_then_the_re_run_finishes_it_exactly(log_dir):
    """The driver's process is killed (SIGKILL) at a random moment of its commit, over and over;
    each time Spark would run the batch again, which stages the same rows in new files and
    commits. The log must end with every row exactly once, in task order per partition."""
    rng = random.Random(5)
    per_task = 20000
    kills, attempt = 0, 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        kills += start_and_kill([sys.executable, "-c", CHILD, str(log_dir), str(attempt),
                                 os.path.dirname(__file__), str(per_task)], b"staged", 0.08, rng)
        attempt += 1
        state = json.loads((log_dir / COMMITS_FILE).read_text()).get("q", {}) \
            if (log_dir / COMMITS_FILE).exists() else {}
        if state.get("state") == "committed" and kills >= 5:
            break
        if state.get("state") == "committed":             # done too soon: start over
            with Broker(str(log_dir)) as b:
                b.delete_topic("out")
                b.create_topic("out", 4)
            (log_dir / COMMITS_FILE).unlink()
    assert kills >= 5
    values = stored(log_dir, 4)
    assert sorted(v for vs in values.values() for v in vs) == \
        sorted(rows(2 * per_task).column(1).to_pylist())
    for vs in values.values():
        of_task_1 = [int(v[4:11]) >= per_task for v in vs]
        assert of_task_1 == sorted(of_task_1)

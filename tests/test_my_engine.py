"""Your engine (issue 21): the learner's saved functions, all plugged in, serving real clients.

* `save()` run on every solution notebook's definitions writes one readable, importable file per
  chapter; a re-save with a failing task leaves that function out.
* `kstore serve --my-engine` with the solutions' engine: unmodified kafka-python and confluent-kafka
  produce and consume; a kill -9 and a restart (the learner's recovery runs) keep every record.
* An empty engine: "all parts are kstore's", and it serves.
* Deliberately wrong submissions (tests/grading/wrong_submissions.py) saved into the engine: a
  real client reads the wrong records, and the diagnosis names the learner's function.
* A kill -9 loop (tests/crash_writer.py) whose log runs on the solutions' engine.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "grading"))

from kafka.admin import KafkaAdminClient, NewTopic  # noqa: E402

import kstore  # noqa: E402
from crash_writer import PARTITION, TOPIC, make_record, record_bytes  # noqa: E402
from kstore import Log, records, varint  # noqa: E402
from kstore.grading.exercises import EXERCISES  # noqa: E402
from kstore.grading.notebooks import exec_definitions  # noqa: E402
from kstore.my_engine import (PARTS, chapter_file, diagnose_fetch, diagnose_recovery, save,  # noqa: E402
                              write_chapter)
from kstore.records import MemoryRecords  # noqa: E402
from test_clients import (ServeProcess, T0, ck_consume, ck_produce, expected, kp_consume,  # noqa: E402
                          kp_produce, make_records)
from test_crash import CRASH_CONFIG, Writer  # noqa: E402
from wrong_submissions import WRONG  # noqa: E402


@pytest.fixture(scope="module")
def solutions_engine(tmp_path_factory) -> Path:
    """A learner who finished every exercise: save() run on each solution notebook."""
    folder = tmp_path_factory.mktemp("learner") / "my_engine"
    for ex in EXERCISES.values():
        save(ex.id, exec_definitions(ex.solution_path), folder, notebook=ex.solution_path, quiet=True)
    return folder


def engine_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture
def brokers():
    started: list[ServeProcess] = []

    def start(log_dir: Path, engine: Path, *overrides: str) -> ServeProcess:
        sp = ServeProcess(log_dir, *overrides, extra_args=("--my-engine", str(engine)))
        started.append(sp)
        return sp.start()
    yield start
    for sp in started:
        sp.kill()


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    """Small segments (3 batches of ~1.5 kB) and a sparse index (an entry every 2 batches): every
    read goes through the learner's segment and index lookups to find where a fetch starts."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs={
            "segment.bytes": "6000", "index.interval.bytes": "2000"})])
    finally:
        admin.close()


# ---------------------------------------------------------------------------------------- saving
def test_save_writes_one_readable_importable_file_per_chapter(solutions_engine):
    files = sorted(p.name for p in solutions_engine.glob("ch*.py"))
    assert files == sorted(chapter_file(ex) for ex in EXERCISES.values())
    for ex in EXERCISES.values():
        text = (solutions_engine / chapter_file(ex)).read_text()
        assert "BEGIN SOLUTION" not in text
        for fn in ex.functions:
            assert f"\ndef {fn}(" in text, (ex.id, fn)
    sys.path.insert(0, str(solutions_engine.parent))
    try:
        from my_engine.ch01_record_batch import encode_record, write_varint
        from my_engine.ch02_sparse_index import offset_index_lookup
    finally:
        sys.path.remove(str(solutions_engine.parent))
    for n in (0, 1, -1, 300, -(1 << 31), (1 << 31) - 1):
        assert write_varint(n) == varint.write_varint(n)
    assert encode_record(3, 7, b"k", None) == records.encode_record(3, 7, b"k", None)
    assert offset_index_lookup([(10, 0), (20, 300)], 5, 25) == (20, 300)


def test_a_resave_with_a_failing_task_leaves_that_function_out(solutions_engine, tmp_path, capsys):
    ex = EXERCISES["ex04"]
    ns = exec_definitions(ex.solution_path)
    exec(WRONG["translate-by-base-offset"][1], ns)
    path = save("ex04", ns, tmp_path / "mine", notebook=ex.solution_path)
    said = capsys.readouterr().out
    assert "floor_segment, offset_for_timestamp" in said and "translate_offset — check(\"ex04.2\")" in said
    text = path.read_text()
    assert "def floor_segment(" in text and "def translate_offset(" not in text


# ---------------------------------------------------------------------------------------- the switch
def test_use_my_engine_reports_the_parts_and_puts_kstore_back(solutions_engine, tmp_path):
    originals = (varint.write_varint, records.encode_record)
    engine = kstore.use_my_engine(str(solutions_engine), quiet=True)
    try:
        assert engine.yours == [name for name, _ in PARTS] and "kstore's: none" in engine.status
        assert varint.write_varint is not originals[0] and varint.write_varint.__wrapped__.__module__ \
            == "kstore_my_engine_ch01_record_batch"
    finally:
        engine.close()
    assert (varint.write_varint, records.encode_record) == originals
    (tmp_path / "empty").mkdir()
    empty = kstore.use_my_engine(str(tmp_path / "empty"), quiet=True)
    try:
        assert empty.status.startswith(f"my engine ({tmp_path / 'empty'}): all parts are kstore's")
        assert varint.write_varint is originals[0]
    finally:
        empty.close()
    partial = engine_copy(solutions_engine, tmp_path / "partial")
    for ex in ("ex07", "ex09", "ex10"):
        (partial / chapter_file(EXERCISES[ex])).unlink()
    (partial / chapter_file(EXERCISES["ex06"])).write_text("def deletable_segments(:\n")
    engine = kstore.use_my_engine(str(partial), quiet=True)
    try:
        assert "varints" in engine.yours and "recovery" in engine.yours
        assert {"compaction rule", "high watermark", "elections", "retention"} <= set(engine.kstores)
        assert "ch06_retention.py could not be loaded (SyntaxError" in engine.status
    finally:
        engine.close()


# ---------------------------------------------------------------------------------------- real clients
def test_serve_my_engine_real_clients_and_kill_9(solutions_engine, brokers, tmp_path):
    sp = brokers(tmp_path / "logs", solutions_engine)
    assert "yours: varints, record, index entries" in sp.read_output()
    assert "kstore's: none" in sp.read_output()
    create_topic(sp.bootstrap, "yours", 2)
    kp_recs, ck_recs = make_records("kp", 60), make_records("ck", 60, T0 + 5000)
    assert kp_produce(sp.bootstrap, "yours", 0, kp_recs, acks="all", codec="none", n_chunks=12) == list(range(60))
    assert ck_produce(sp.bootstrap, "yours", 1, ck_recs, acks="all", codec="lz4", n_chunks=12) == list(range(60))
    segments = sorted((sp.log_dir / "yours-0").glob("*.log"))
    assert len(segments) > 2, "small segments: the learner's roll rule and segment names ran"

    def read_everything() -> None:
        assert kp_consume(sp.bootstrap, "yours", 0, 60) == expected(kp_recs)
        assert ck_consume(sp.bootstrap, "yours", 1) == expected(ck_recs)
        assert kp_consume(sp.bootstrap, "yours", 0, 60 - 37, start=37) == expected(kp_recs)[37:]
        assert kp_consume(sp.bootstrap, "yours", 1, 60 - 45, start=45) == expected(ck_recs)[45:]
    read_everything()
    ran = sp.read_output()
    # (largest_lower_bound_slot runs inside the learner's offset_index_lookup, which calls it itself)
    for fn in ("read_varint", "should_roll", "time_waited_for_roll", "segment_file_name", "index_entries",
               "floor_segment", "translate_offset", "offset_index_lookup", "fetch_range", "acks_decision",
               "leader_high_watermark", "serve_fetch"):
        assert f"ran your {fn} " in ran, fn

    port, before = sp.port, len(sp.read_output())
    sp.kill()                                              # kill -9: no clean shutdown
    assert not (sp.log_dir / ".kafka_cleanshutdown").exists()
    sp.start(port=port)
    restarted = sp.read_output()[before:]
    assert "ran your valid_prefix_length " in restarted and "ran your rebuild_index " in restarted
    read_everything()
    more = make_records("more", 10, T0 + 9000)
    assert kp_produce(sp.bootstrap, "yours", 0, more, acks="all", codec="gzip") == list(range(60, 70))
    assert kp_consume(sp.bootstrap, "yours", 0, 70) == expected(kp_recs) + expected(more, 60)
    assert "raised" not in sp.read_output()
    sp.stop()
    assert diagnose_fetch(solutions_engine, sp.log_dir / "yours-0", 37) == []


def test_an_empty_engine_is_all_kstore_and_serves(brokers, tmp_path):
    """The shipped exercises, each saved as they come (every task a stub): one file per chapter
    saving nothing; the switch says all parts are kstore's and the broker serves; the capstone
    says each check's functions are not implemented yet."""
    from kstore.grading.capstone import CHECKS, run_capstone
    for ex in EXERCISES.values():
        save(ex.id, exec_definitions(ex.exercise_path), tmp_path / "my_engine", notebook=ex.exercise_path,
             quiet=True)
    assert "SAVED = ()" in (tmp_path / "my_engine" / chapter_file(EXERCISES["ex01"])).read_text()
    assert engine_functions(tmp_path / "my_engine") == {}
    cap = run_capstone({}, tmp_path / "capstone")
    assert all("not implemented yet" in cap.results[c].feedback() for c in CHECKS)
    sp = brokers(tmp_path / "logs", tmp_path / "my_engine")
    assert "all parts are kstore's" in sp.read_output()
    recs = make_records("plain", 20)
    assert kp_produce(sp.bootstrap, "plain", 0, recs, acks="all", codec="none") == list(range(20))
    assert ck_consume(sp.bootstrap, "plain", 0) == expected(recs)
    sp.stop()


@pytest.mark.parametrize("wrong, function", [("translate-by-base-offset", "translate_offset"),
                                             ("lookup-smallest-slot-at-least-target", "largest_lower_bound_slot")])
def test_a_wrong_function_in_the_engine_fails_a_real_client_read_naming_it(
        solutions_engine, brokers, tmp_path, wrong, function, capsys):
    task, source, _ = WRONG[wrong]
    ex = EXERCISES[task.split(".")[0]]
    engine = engine_copy(solutions_engine, tmp_path / "my_engine")
    ns = exec_definitions(ex.solution_path)
    exec(source, ns)                    # what a learner who edited their saved file by hand has
    write_chapter(engine, ex, ns, list(ex.functions), notebook=ex.solution_path, sources=(source,))
    assert source.strip() in (engine / chapter_file(ex)).read_text()
    sp = brokers(tmp_path / "logs", engine)
    create_topic(sp.bootstrap, "wrong", 1)
    recs = make_records("w", 60)
    assert kp_produce(sp.bootstrap, "wrong", 0, recs, acks="all", codec="none", n_chunks=12) == list(range(60))
    start = 37
    got = ck_consume(sp.bootstrap, "wrong", 0, start=start)     # reads up to the end of the partition
    assert got != expected(recs)[start:], "the wrong function must show in what a real client reads"
    problems = diagnose_fetch(engine, sp.log_dir / "wrong-0", start)
    assert problems and problems[0].startswith(f"your {function} ({chapter_file(ex)}) answered"), problems
    with capsys.disabled():
        sys.stderr.write(f"\n[my engine] {wrong}: reading from {start} the client got offsets "
                         f"{[r['offset'] for r in got][:3]}...; {problems[0]}\n")
    sp.stop()


# ---------------------------------------------------------------------------------------- kill -9 loop
def test_kill_9_loop_on_the_solutions_engine(solutions_engine, tmp_path, monkeypatch, capsys):
    """tests/test_crash.py's writer, with the learner's functions running its log: SIGKILL at a
    random moment, again and again; every acknowledged record survives the learner's recovery."""
    iterations = int(os.environ.get("KSTORE_MY_ENGINE_KILLS", "50"))
    monkeypatch.setenv("KSTORE_MY_ENGINE", str(solutions_engine))
    rng = random.Random(2121)
    log_dir = tmp_path / "logs"
    starts: list[tuple[int, int]] = []         # (first offset a writer appended, its seed)
    acked, recovered_by_learner = -1, 0
    for it in range(iterations):
        seed = rng.randrange(1 << 30)
        writer = Writer(log_dir, seed, CRASH_CONFIG)
        assert writer.started.wait(60), "writer did not start"
        time.sleep(rng.uniform(0.01, 0.1))
        rc, err = writer.kill()
        lines = writer.lines
        start = next((ln for ln in lines if ln.startswith("START")), None)
        assert start is not None, f"iteration {it}: the writer failed to open the log:\n{err[-2000:]}"
        leo = int(start.split()[1])
        assert leo >= acked + 1, f"iteration {it}: acknowledged offset {acked} lost (log end {leo})"
        ran = next(ln for ln in lines if ln.startswith("YOURS-RAN"))
        recovered_by_learner += "valid_prefix_length" in ran
        starts.append((leo, seed))
        acks = [int(ln.split()[1]) for ln in lines if ln.startswith("ACK")]
        acked = max([acked, *acks])
    assert recovered_by_learner >= iterations - 1      # the first writer found an empty directory
    # the last writer was killed too: a copy is loaded by kstore's own code (no plug in this process)
    check_dir = shutil.copytree(log_dir / f"{TOPIC}-{PARTITION}", tmp_path / "check" / f"{TOPIC}-{PARTITION}")
    log = Log.open(str(check_dir), CRASH_CONFIG)
    try:
        end = log.log_end_offset
        assert end > acked >= 0
        got: dict = {}
        offset = 0
        while offset < end:                # kstore's own reader, read-only: what a restart serves
            for batch in log.read(offset, 1 << 20).records.batches():
                got.update((r.offset, r) for r in batch.records() if r.offset >= offset)
            offset = max(got) + 1
        assert sorted(got) == list(range(end))
        for offset, r in got.items():
            seed = [s for first, s in starts if first <= offset][-1]
            assert record_bytes(offset, r) == record_bytes(offset, make_record(seed, offset)), offset
        with capsys.disabled():
            sys.stderr.write(f"\n[my engine] kill -9 loop: {iterations} kills, the learner's recovery ran "
                             f"{recovered_by_learner} times, {end} records whole and in order, "
                             f"{len(log.segments)} segments, last acknowledged offset {acked}\n")
    finally:
        log.close()


def test_save_in_a_real_kernel_takes_the_source_ipython_kept(tmp_path):
    """The notebook path: exercise 01's setup, solution and save cells on a fresh kernel — the
    source comes from what IPython keeps of each cell, the file lands in my_engine/ beside it."""
    import nbformat
    from nbclient import NotebookClient
    ex = EXERCISES["ex01"]
    nb = nbformat.read(ex.solution_path, as_version=4)
    nb.cells = [c for c in nb.cells if c.cell_type == "code"
                and {"setup", "solution", "save"} & set(c.metadata.get("tags", []))]
    assert any("save" in c.metadata.get("tags", []) for c in nb.cells)
    nb.cells.append(nbformat.v4.new_code_cell("def write_varint(n):\n    return b'?'   # broken on purpose\n"
                                              "save('ex01')"))
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    first = "".join(o.get("text", "") for o in nb.cells[-2].outputs)
    assert "saved to my_engine/ch01_record_batch.py: write_varint, read_varint, write_varlong, " \
           "encode_record, encode_batch" in first, first
    last = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert "not saved (their tests do not pass yet): write_varint — check(\"ex01.1\")" in last, last
    text = (tmp_path / "my_engine" / "ch01_record_batch.py").read_text()
    assert "def encode_batch(" in text and "import crc32c" in text
    assert "SAVED = ('read_varint', 'write_varlong', 'encode_record', 'encode_batch')" in text
    # encode_record calls the broken write_varint: it stays in the file, marked, and is not plugged in
    assert "# Used by the functions above (not plugged into the engine): write_varint" in text
    engine = kstore.use_my_engine(str(tmp_path / "my_engine"), quiet=True)
    try:
        assert "record" in engine.yours and "varints" in engine.kstores
        assert varint.write_varint(1) == b"\x02"
    finally:
        engine.close()


@pytest.mark.parametrize("engine_kind", ["solutions", "recovery-without-crc-check"])
def test_a_torn_batch_after_kill_9_is_cut_by_the_learners_recovery_or_named(
        solutions_engine, brokers, tmp_path, engine_kind, capsys):
    """kill -9, then the tail of the active segment is garbled (what a lost page can leave): the
    learner's recovery must cut the torn batch. The solutions' recovery does, and both clients read
    the rest; a recovery without the CRC check keeps it, a client's CRC check refuses it, and the
    diagnosis names valid_prefix_length."""
    engine = engine_copy(solutions_engine, tmp_path / "my_engine")
    if engine_kind != "solutions":
        task, source, _ = WRONG[engine_kind]
        ex = EXERCISES[task.split(".")[0]]
        ns = exec_definitions(ex.solution_path)
        exec(source, ns)
        write_chapter(engine, ex, ns, list(ex.functions), notebook=ex.solution_path, sources=(source,))
    sp = brokers(tmp_path / "logs", engine)
    recs = make_records("torn", 20)
    assert kp_produce(sp.bootstrap, "torn", 0, recs, acks="all", codec="none", n_chunks=4) == list(range(20))
    port = sp.port
    sp.kill()
    segment = sorted((sp.log_dir / "torn-0").glob("*.log"))[-1]
    data = bytearray(segment.read_bytes())
    last = MemoryRecords(bytes(data)).batches()[-1]
    data[last.position + last.size_in_bytes - 5] ^= 0xFF          # a byte inside the last batch's records
    segment.write_bytes(bytes(data))
    sp.start(port=port)
    kept = expected(recs)[:last.base_offset]
    if engine_kind == "solutions":
        assert ck_consume(sp.bootstrap, "torn", 0) == kept
        assert kp_consume(sp.bootstrap, "torn", 0, len(kept)) == kept
        assert diagnose_recovery(engine, sp.log_dir / "torn-0") == []
    else:
        with pytest.raises(Exception) as refused:
            ck_consume(sp.bootstrap, "torn", 0)
        assert "crc" in str(refused.value).lower() or "corrupt" in str(refused.value).lower(), refused.value
        sp.stop()
        problems = diagnose_recovery(engine, sp.log_dir / "torn-0")
        assert problems and problems[0].startswith(
            "your valid_prefix_length (ch05_crash_recovery.py) keeps"), problems
        with capsys.disabled():
            sys.stderr.write(f"\n[my engine] {engine_kind}: confluent-kafka: {refused.value}; {problems[0]}\n")


# ---------------------------------------------------------------------------------------- the capstone
def engine_functions(folder: Path) -> dict:
    from kstore.my_engine import load_functions
    functions, problems = load_functions(folder, every_saved=True)
    assert problems == []
    return {name: fn for name, (fn, _) in functions.items()}


@pytest.fixture(scope="module")
def solutions_capstone(solutions_engine, tmp_path_factory):
    """The capstone on the engine of a learner who finished every exercise (one run, shared)."""
    from kstore.grading.capstone import run_capstone
    return run_capstone(engine_functions(solutions_engine), tmp_path_factory.mktemp("capstone"))


def test_the_capstone_passes_end_to_end_with_the_solutions_engine(solutions_capstone, capsys):
    from kstore.grading.capstone import CHECKS, HELPERS, NOT_SERVING, OWNER
    cap = solutions_capstone
    assert {c: r.feedback() for c, r in cap.results.items() if not r.passed} == {}
    assert list(cap.results) == list(CHECKS)
    assert cap.yours == [name for name, _ in PARTS]
    # every function with an owner ran in its own check: each check really exercises what it grades
    # (write_varint and write_varlong run inside the learner's encode_record, which calls them itself)
    for name, check in OWNER.items():
        through = [outer for outer, helpers in HELPERS.items() if any(h == name for h, _ in helpers)]
        assert name in cap.calls[check] or any(o in cap.calls[check] for o in through), \
            f"{name} never ran in the {check} check"
    assert set(cap.not_serving) == set(NOT_SERVING)
    for name in NOT_SERVING:
        assert f"{name}: not used by the serving engine" in cap.summary()
        assert not any(name in called for called in cap.calls.values())
    steps = cap.results["clients"].steps
    assert any("confluent-kafka" in s for s in steps) and any("busy socket: your serve_fetch" in s for s in steps)
    assert any("dump-log --deep-iteration printed all" in s for s in cap.results["files"].steps)
    with capsys.disabled():
        sys.stderr.write(f"\n[capstone] solutions' engine: all {len(CHECKS)} checks pass in {cap.seconds} s ("
                         + ", ".join(f"{c} {r.seconds} s" for c, r in cap.results.items()) + ")\n")


def _wrong_engine(solutions_engine: Path, name: str) -> tuple[dict, str, list[str]]:
    """The solutions' functions with one catalogue submission in place of its task's function
    (and the functions of that chapter file seeing each other, as in the learner's saved file)."""
    task, source, _ = WRONG[name]
    ex = EXERCISES[task.split(".")[0]]
    ns = exec_definitions(ex.solution_path)
    exec(source, ns)
    functions = engine_functions(solutions_engine)
    functions.update({f: ns[f] for f in ex.functions})
    from kstore.grading.exercises import TASKS
    return functions, task, list(TASKS[task].functions)


# wrong submissions whose function runs in most checks: there, every check that calls it runs
FULL_RUN = ("roll-greater-or-equal", "recovery-without-crc-check", "hw-from-all-replicas", "serve-resumes-at-sent")


@pytest.mark.timeout(600)
def test_each_wrong_submission_fails_the_capstone_in_its_check_only_naming_it(solutions_engine, solutions_capstone,
                                                                             tmp_path, capsys):
    """Every deliberately wrong submission of the catalogue, saved into the learner's engine: the
    capstone fails in the check that owns the function, with feedback naming it — and only there.
    A check that never calls the function runs the same code as with the solutions (which pass);
    one that calls a function it does not own gets the reference's answer from the referee. The
    check that owns it runs for every submission; for FULL_RUN, every check that calls it runs too
    (the referee's substitution shown working, in CI time). A function no serving engine calls is
    reported as such."""
    from kstore.grading.capstone import HELPERS, NOT_SERVING, OWNER, run_capstone
    rows = []
    for name in sorted(WRONG):
        functions, task, names = _wrong_engine(solutions_engine, name)
        fn = names[0]
        if fn in NOT_SERVING:
            assert not any(fn in called for called in solutions_capstone.calls.values())
            assert f"{fn}: not used by the serving engine" in solutions_capstone.summary()
            rows.append(f"{name}: {fn} not used by the serving engine")
            continue
        outer = next((o for o, hs in HELPERS.items() if any(h == fn for h, _ in hs)), fn)
        owner = OWNER[outer]
        calling = tuple(c for c, called in solutions_capstone.calls.items() if outer in called)
        assert owner in calling
        checks = calling if name in FULL_RUN else (owner,)
        cap = run_capstone(functions, tmp_path / name, checks=checks)
        failed = {c: r for c, r in cap.results.items() if not r.passed}
        assert list(failed) == [owner], (name, {c: r.feedback() for c, r in failed.items()})
        result = failed[owner]
        assert fn in result.blamed, (name, result.feedback())
        assert f"your {fn}" in result.feedback(), (name, result.feedback())
        rows.append(f"{name}: fails '{owner}' only (ran {', '.join(checks)} in {cap.seconds} s) — "
                    + next(ln for ln in result.feedback().splitlines() if f"your {fn}" in ln).strip()[:150])
    with capsys.disabled():
        sys.stderr.write("\n[capstone] " + "\n[capstone] ".join(rows) + "\n")


FROM_SCRATCH = '''
"""My own components (reference classes here: Kafka's, counting their use)."""
from kstore.index import OffsetIndex as KafkasOffsetIndex
from kstore.offset_map import SkimpyOffsetMap


class OffsetIndex(KafkasOffsetIndex):
    opened = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        type(self).opened += 1


class OffsetMap(SkimpyOffsetMap):
    puts = 0

    def put(self, key, offset):
        type(self).puts += 1
        super().put(key, offset)


class RollPolicy:
    decisions = 0

    def should_roll(self, size, messages_size, segment_bytes, time_waited_ms, segment_ms, index_full,
                    base_offset, max_offset_in_messages):
        type(self).decisions += 1
        return (size > segment_bytes - messages_size or (size > 0 and time_waited_ms > segment_ms)
                or index_full or not 0 <= max_offset_in_messages - base_offset <= 2**31 - 1)
'''


def test_from_scratch_classes_plug_in_through_the_same_switch_and_pass_the_capstone(solutions_engine, tmp_path):
    """The "from scratch" path: a learner's own OffsetIndex, cleaner offset map and roll policy
    (here reference classes) in my_engine/from_scratch.py: use_my_engine lists them, the engine
    makes its components with them, and the capstone's checks pass on them."""
    from kstore import cleaner, segment
    from kstore.grading.capstone import run_capstone
    from kstore.my_engine import load_classes
    engine = engine_copy(solutions_engine, tmp_path / "my_engine")
    (engine / "from_scratch.py").write_text(FROM_SCRATCH)
    switched = kstore.use_my_engine(str(engine), quiet=True)
    try:
        for part in ("offset index (your class)", "cleaner's offset map (your class)", "roll policy (your class)"):
            assert part in switched.yours and part in switched.status
        assert segment.OffsetIndex.__module__ == cleaner.SkimpyOffsetMap.__module__ == "kstore_my_engine_from_scratch"
    finally:
        switched.close()
    assert segment.OffsetIndex.__module__ == "kstore.index"
    classes, problems = load_classes(engine)
    assert problems == [] and sorted(classes) == ["OffsetIndex", "OffsetMap", "RollPolicy"]
    cap = run_capstone(engine_functions(engine), tmp_path / "run", classes=classes,
                       checks=("clients", "restart", "compaction"))
    assert {c: r.feedback() for c, r in cap.results.items() if not r.passed} == {}
    assert classes["OffsetIndex"].opened > 0 and classes["OffsetMap"].puts > 0
    assert classes["RollPolicy"].decisions > 0
    # a class that is wrong fails the check that uses it, and the feedback says the class served there
    forgetful = FROM_SCRATCH.replace("type(self).puts += 1\n        super().put(key, offset)", "type(self).puts += 1")
    (engine / "from_scratch.py").write_text(forgetful)                 # an offset map that forgets every key
    classes, _ = load_classes(engine)
    cap = run_capstone(engine_functions(engine), tmp_path / "wrong", classes={"OffsetMap": classes["OffsetMap"]},
                       checks=("compaction",))
    result = cap.results["compaction"]
    assert not result.passed and "your classes served here too: OffsetMap" in result.feedback(), result.feedback()


# ---------------------------------------------------------------------------------------- views
def test_a_view_bound_to_its_moment_shows_whose_engine_made_it(solutions_engine, tmp_path):
    """A view's frame records whether the learner's engine ran it: a badge beside the timeline
    ("your engine: N of M parts yours", the full status line as its tooltip) on the frames made
    while the switch was on, and none on those made after it was switched off."""
    from kstore.widgets import DirectoryView
    log = Log.open(str(tmp_path / "badge-0"), {"segment.bytes": 2048})
    try:
        switched = kstore.use_my_engine(str(solutions_engine), quiet=True)
        try:
            log.append([("k", "written by your engine")])
            view = DirectoryView(log, min_interval=0)
            moment = view.bind()
        finally:
            switched.close()
        assert kstore.my_engine.active() is None
        parts = len(PARTS)
        assert f'class="ks-engine-badge"' in view.tl_label.value
        assert f"your engine: {parts} of {parts} parts yours" in view.tl_label.value
        assert "kstore&#x27;s: none" in view.tl_label.value or "kstore's: none" in view.tl_label.value
        log.append([("k", "written by kstore's own code")])
        later = view.live(False)
        assert later.seq > moment.seq and "ks-engine-badge" not in view.tl_label.value
        view.tl_cell.click()                                   # back to its cell's moment: the badge again
        assert "ks-engine-badge" in view.tl_label.value
    finally:
        log.close()


def test_the_solutions_engine_folder_is_what_the_solutions_save():
    """solutions/my_engine/ (handed in beside the chapter 12 solution when it is graded) is the
    solution notebooks' functions as save() writes them: regenerate it when a solution changes."""
    from kstore.grading.exercises import SOLUTIONS_DIR
    from kstore.my_engine import solutions_engine_files
    folder = SOLUTIONS_DIR / "my_engine"
    expected = solutions_engine_files()
    stale = sorted(n for n, text in expected.items() if not (folder / n).is_file() or (folder / n).read_text() != text)
    assert stale == [], f"solutions/my_engine is stale ({', '.join(stale)}): run `kstore exercises`"


@pytest.mark.timeout(600)
def test_kstore_grade_runs_the_capstone_on_the_handed_in_engine_naming_the_wrong_function(tmp_path):
    """`kstore grade` on chapter 12's solution handed in with a my_engine/ whose ex04 file holds a
    catalogue mistake: the learner's functions run in the confined learner process (each engine
    call a call across the socket), and only the capstone check that owns the function loses
    points, its feedback naming it."""
    from kstore.grading.exercises import SOLUTIONS_DIR
    from kstore.grading.grade import Grader, Settings
    engine = engine_copy(SOLUTIONS_DIR / "my_engine", tmp_path / "my_engine")
    task, source, _ = WRONG["translate-by-base-offset"]
    ex = EXERCISES[task.split(".")[0]]
    ns = exec_definitions(ex.solution_path)
    exec(source, ns)
    write_chapter(engine, ex, ns, list(ex.functions), notebook=ex.solution_path, sources=(source,))
    notebook = tmp_path / EXERCISES["ex12"].notebook
    shutil.copy(EXERCISES["ex12"].solution_path, notebook)
    grader = Grader(Settings(timeout=240, test_timeout=15, cell_timeout=60, jobs=1))
    try:
        [sub] = grader.grade([notebook])
    finally:
        grader.close()
    assert sub.status == "ok", sub.notes
    assert sub.tasks["ex12.1"]["score"] == sub.tasks["ex12.1"]["max"]
    failing = [t for t in sub.tests if t["outcome"] != "passed"]
    assert [t["name"] for t in failing] == ["test_your_engine_matches_kafka[clients]"], failing
    assert "your translate_offset: translate_offset(" in failing[0]["message"], failing[0]["message"]

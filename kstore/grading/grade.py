"""`kstore grade SUBMISSIONS... --out grades.csv [--json grades.json]`: grade submitted notebooks
offline, for instructors.

Each submission gets a harness process (`kstore.grading.worker`: its own read-only copy of the
tests, the reference solutions, the scoring) and a learner process (`kstore.grading.sandbox`: the
notebook's code only, confined in namespaces as `nobody` when run as root) that the tests call
across a plain-data socket. Limits: memory and file size (set in the learner process), per-cell and
per-test time limits, and a wall-clock limit (the parent kills the harness's process group, and
with it the learner's namespace). Whatever a submission does — loop forever, exit, raise at import,
print megabytes, delete files, crash the interpreter, cheat — it gets one row with a `status` and
`notes`, and the grader goes on. Points come from the inventory of the tests, never from what a
process reports, and each test's points are capped. No network, no Docker.

Statuses, most severe first: missing, invalid-notebook, unknown-exercise, timeout (killed at the
wall-clock limit; the tests that finished still count), crashed (a process died: while the cells ran,
or in a task's test — then only that task loses points), exit (a cell
called sys.exit), cell-timeout, cell-error (a cell raised; e.g. an import that fails), test-timeout
(a function looped in a test), output-limit (printed more than --max-output characters), ok.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import notebooks
from .exercises import EXERCISES, TASKS, TESTS_DIR, exercise_for_notebook_name
from .remote import can_confine

STATUS_ORDER = ["missing", "invalid-notebook", "unknown-exercise", "timeout", "crashed", "exit",
                "cell-timeout", "cell-error", "test-timeout", "output-limit", "ok"]


@dataclass
class Submission:
    path: str
    exercise: str | None = None
    status: str = "ok"
    notes: list[str] = field(default_factory=list)
    score: float = 0.0
    max_score: float = 0.0
    tasks: dict[str, dict] = field(default_factory=dict)       # task id → {score, max}
    tests: list[dict] = field(default_factory=list)
    cells: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    output_chars: int = 0
    isolation_gaps: list[str] = field(default_factory=list)   # what could not be enforced
    plagiarism: list[str] = field(default_factory=list)

    def set_status(self, status: str, note: str | None = None) -> None:
        if STATUS_ORDER.index(status) < STATUS_ORDER.index(self.status):
            self.status = status
        if note and note not in self.notes:
            self.notes.append(note)


@dataclass
class Settings:
    timeout: float = 300.0        # wall clock per submission (s)
    test_timeout: float = 10.0    # per test (s)
    cell_timeout: float = 60.0    # per notebook cell (s)
    memory_mb: int = 2048         # RLIMIT_AS of the child
    file_mb: int = 512            # RLIMIT_FSIZE of the child
    max_output: int = 65536       # characters of printed output kept
    jobs: int = 0                 # parallel submissions (0: one per CPU)
    exercise: str | None = None   # force the exercise (otherwise: notebook metadata, then file name)
    no_confine: bool = False      # never use namespaces (they are used when root and `unshare` exist)


def find_notebooks(paths: list[str]) -> list[Path]:
    """Notebooks named on the command line, and those under directories (checkpoints skipped).
    A path that does not exist is kept, to be reported as `missing`."""
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            out.extend(sorted(q for q in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in q.parts))
        else:
            out.append(path)
    return out


class Grader:
    def __init__(self, settings: Settings | None = None, progress=None):
        self.settings = settings or Settings()
        self.progress = progress
        self.session = Path(tempfile.mkdtemp(prefix="kstore-grade-"))
        # The tests are copied first, so a submission that deletes files cannot take them away.
        self.tests_dir = self.session / "exercise_tests"
        shutil.copytree(TESTS_DIR, self.tests_dir, ignore=shutil.ignore_patterns("__pycache__"))
        self._inventory: dict[str, list[dict]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        shutil.rmtree(self.session, ignore_errors=True)

    # ---- what a full score is
    def inventory(self, exercise_id: str) -> list[dict]:
        with self._lock:
            if exercise_id not in self._inventory:
                from .runner import inventory
                run = inventory([exercise_id], tests_dir=self.tests_dir)
                if run.errors or not run.tests:
                    raise RuntimeError(f"cannot list the tests of {exercise_id}: "
                                       f"{'; '.join(run.errors) or 'no tests found'}")
                self._inventory[exercise_id] = [t.to_dict() for t in run.tests]
            return self._inventory[exercise_id]

    def exercise_of(self, path: Path, nb: dict) -> str | None:
        """--exercise, else the notebook's metadata (kstore.exercise), else its file name."""
        ex_id = self.settings.exercise or notebooks.exercise_id_of(nb)
        if ex_id not in EXERCISES:
            by_name = exercise_for_notebook_name(path.name)
            ex_id = by_name.id if by_name else None
        return ex_id

    # ---- one submission
    def grade_one(self, index: int, path: Path) -> Submission:
        sub = Submission(str(path))
        start = time.perf_counter()
        try:
            self._grade(index, path, sub)
        finally:
            sub.seconds = round(time.perf_counter() - start, 2)
        return sub

    def _grade(self, index: int, path: Path, sub: Submission) -> None:
        s = self.settings
        if not path.is_file():
            sub.set_status("missing", f"no such file: {path}")
            return
        try:
            nb = notebooks.load(path)
        except (OSError, ValueError) as e:
            sub.set_status("invalid-notebook", f"cannot read the notebook: {e}")
            return
        ex_id = self.exercise_of(path, nb)
        if ex_id is None:
            sub.set_status("unknown-exercise", "neither the notebook's metadata nor its file name "
                           "says which exercise it is; pass --exercise exNN")
            return
        sub.exercise = ex_id
        inventory = self.inventory(ex_id)
        sub.max_score = round(sum(t["points"] for t in inventory), 4)

        work = self.session / f"work-{index:04d}"
        work.mkdir(mode=0o700)
        tests_copy = work / "tests"                 # this submission's own copy, read-only
        shutil.copytree(self.tests_dir, tests_copy)
        _read_only(tests_copy)
        nb_copy = work / "submission.ipynb"
        from .capstone import with_engine_files      # the capstone's my_engine/, handed in beside it
        nb_copy.write_text(json.dumps(with_engine_files(nb, path, ex_id)), encoding="utf-8")
        stderr_path = work / "stderr.txt"
        confined = not s.no_confine and can_confine()
        # confined: a directory in the learner's private /tmp; otherwise one of its own, outside this
        # session's directory (which the learner's unprivileged user cannot enter)
        scratch = "/tmp/kstore-learner" if confined else tempfile.mkdtemp(prefix="kstore-learner-")
        env = {k: v for k, v in os.environ.items()
               if k in ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "SYSTEMROOT")}
        env.update(HOME=str(work), TMPDIR=str(work), MPLBACKEND="Agg", KSTORE_GRADING="1",
                   PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0", PYTHONUNBUFFERED="1",
                   HYPOTHESIS_STORAGE_DIRECTORY=str(work / "hypothesis"))
        cmd = [sys.executable, "-m", "kstore.grading.worker", "--notebook", str(nb_copy),
               "--exercise", ex_id, "--tests-dir", str(tests_copy),
               "--test-timeout", str(s.test_timeout), "--cell-timeout", str(s.cell_timeout),
               "--memory-mb", str(s.memory_mb), "--file-mb", str(s.file_mb),
               "--max-output", str(s.max_output), "--scratch", scratch, "--hide", str(self.session)]
        if s.no_confine:
            cmd.append("--no-confine")
        timed_out = False
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                    cwd=str(work), env=env, start_new_session=True)
            try:
                out, _ = proc.communicate(timeout=s.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                try:
                    out, _ = proc.communicate(timeout=10)
                except subprocess.TimeoutExpired:   # a grandchild escaped the group and holds the pipe
                    proc.kill()
                    out = b""
        events = []
        for line in out.decode("utf-8", "replace").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        self._assemble(sub, events, inventory, proc.returncode, timed_out, stderr_path)
        _writable(work)
        shutil.rmtree(work, ignore_errors=True)
        if not confined:
            shutil.rmtree(scratch, ignore_errors=True)

    def _assemble(self, sub: Submission, events: list[dict], inventory: list[dict], returncode: int,
                  timed_out: bool, stderr_path: Path) -> None:
        s = self.settings
        tests = {t["nodeid"]: dict(t) for t in inventory}
        done = None
        for ev in events:
            kind = ev.get("event")
            if kind == "cell":
                sub.cells.append({k: ev.get(k) for k in ("index", "task", "status", "error", "seconds")})
                if ev.get("status") == "timeout":
                    sub.set_status("cell-timeout", f"cell {ev['index']}: {ev['error']}")
                elif ev.get("status") == "exit":
                    sub.set_status("exit", f"cell {ev['index']}: {ev['error']}")
                elif ev.get("status") == "error":
                    sub.set_status("cell-error", f"cell {ev['index']}: {ev['error']}")
            elif kind == "test" and ev.get("nodeid") in tests:
                t = tests[ev["nodeid"]]          # points from the inventory, never from the event
                for k in ("outcome", "message", "duration"):
                    t[k] = ev.get(k, t.get(k))
                try:
                    earned = float(ev.get("earned") or 0.0)
                except (TypeError, ValueError):
                    earned = 0.0
                t["earned"] = min(max(earned, 0.0), t["points"]) if t["outcome"] == "passed" else 0.0
                if ev.get("outcome") == "timeout":
                    sub.set_status("test-timeout", f"{ev['task']}: {ev['name']} {ev.get('message', '')}")
            elif kind == "learner-died":
                how = str(ev.get("how"))
                if ev.get("task") is None and how.startswith("killed after"):
                    sub.set_status("timeout", f"the notebook's process was {how}")
                elif ev.get("task") is None:
                    sub.set_status("crashed", f"the notebook's process died while its cells ran ({how})")
                else:
                    sub.set_status("crashed", f"{ev['task']}: the notebook's process died in {ev.get('test')} "
                                   f"({how}); the tasks before kept their points, the next ran in a fresh process")
            elif kind == "plagiarism":
                for note in ev.get("notes") or []:
                    sub.plagiarism.append(str(note))
                    sub.notes.append(f"plagiarism? {note}")
            elif kind == "isolation":
                for what in ev.get("not_enforced") or []:
                    sub.isolation_gaps.append(str(what))
                if sub.isolation_gaps:
                    sub.notes.append("isolation not enforced: " + "; ".join(sub.isolation_gaps))
            elif kind == "fatal":
                sub.set_status("crashed", f"the grader could not start: {ev.get('error')}")
            elif kind == "done":
                done = ev
        if done is not None:
            sub.output_chars = int(done.get("output_chars", 0))
            if sub.output_chars > s.max_output:
                sub.set_status("output-limit", f"printed {sub.output_chars:,} characters; kept the "
                               f"first {s.max_output:,}")
            for e in done.get("errors") or []:
                sub.set_status("crashed", f"tests: {e.strip().splitlines()[-1][:300]}")
        elif timed_out:
            sub.set_status("timeout", f"killed after {s.timeout:g} s (wall clock); "
                           f"the tests that finished before count")
        else:
            tail = _tail(stderr_path)
            how = (f"killed by signal {-returncode} ({signal.Signals(-returncode).name})"
                   if returncode is not None and returncode < 0 else f"exit code {returncode}")
            sub.set_status("crashed", f"the notebook's process died ({how})" +
                           (f": {tail}" if tail else ""))
        for t in tests.values():
            if t.get("outcome") in (None, "not run"):
                t["outcome"], t["earned"] = "not run", 0.0
        sub.tests = list(tests.values())
        for tid in (t.id for t in EXERCISES[sub.exercise].tasks):
            mine = [t for t in sub.tests if t["task"] == tid]
            sub.tasks[tid] = {"score": round(sum(t["earned"] for t in mine), 4),
                              "max": round(sum(t["points"] for t in mine), 4)}
        sub.score = round(sum(v["score"] for v in sub.tasks.values()), 4)

    # ---- many submissions
    def grade(self, paths: list[Path]) -> list[Submission]:
        jobs = self.settings.jobs or os.cpu_count() or 1
        for path in paths:   # list the tests here, in this thread: pytest swaps sys.stdout meanwhile
            try:
                ex_id = self.exercise_of(path, notebooks.load(path))
                if ex_id is not None:
                    self.inventory(ex_id)
            except (OSError, ValueError, RuntimeError):
                pass         # reported in the submission's row
        results: list[Submission | None] = [None] * len(paths)
        with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = {pool.submit(self.grade_one, i, p): i for i, p in enumerate(paths)}
            for n, fut in enumerate(cf.as_completed(futures), 1):
                i = futures[fut]
                try:
                    results[i] = fut.result()
                except Exception as e:   # a bug in the grader itself: still one row
                    results[i] = Submission(str(paths[i]), status="crashed",
                                            notes=[f"grader error: {type(e).__name__}: {e}"])
                if self.progress:
                    self.progress(n, len(paths), results[i])
        return [r for r in results if r is not None]


def _read_only(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)


def _writable(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        try:
            p.chmod(0o700 if p.is_dir() else 0o600)
        except OSError:
            pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _tail(path: Path, n: int = 400) -> str:
    try:
        data = path.read_bytes()[-n:].decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return " ".join(data.split())[-n:]


def _num(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def task_columns(subs: list[Submission]) -> list[str]:
    seen = {tid for s in subs for tid in s.tasks}
    if not seen:
        seen = {t.id for s in subs if s.exercise for t in EXERCISES[s.exercise].tasks}
    return [tid for tid in TASKS if tid in seen]


def write_csv(subs: list[Submission], path: str | Path) -> None:
    cols = task_columns(subs)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["submission", "exercise", "status", "score", "max_score", *cols, "seconds", "notes"])
        for s in subs:
            w.writerow([s.path, s.exercise or "", s.status, _num(s.score), _num(s.max_score),
                        *[_num(s.tasks[c]["score"]) if c in s.tasks else "" for c in cols],
                        _num(s.seconds), " | ".join(s.notes)])


def write_json(subs: list[Submission], path: str | Path, settings: Settings, seconds: float) -> None:
    doc = {"graded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(seconds, 2),
           "settings": asdict(settings), "submissions": [asdict(s) for s in subs]}
    Path(path).write_text(json.dumps(doc, indent=1), encoding="utf-8")


def grade_paths(paths: list[str], settings: Settings | None = None, progress=None) -> list[Submission]:
    grader = Grader(settings, progress)
    try:
        return grader.grade(find_notebooks(paths))
    finally:
        grader.close()


# ---- the command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("submissions", nargs="+", metavar="SUBMISSION",
                   help="notebooks, or directories searched for *.ipynb")
    p.add_argument("--out", default="grades.csv", help="CSV file to write")
    p.add_argument("--json", dest="json_out", default=None, help="also write every test's result as JSON")
    p.add_argument("--exercise", default=None, help="grade every notebook as this exercise (exNN)")
    p.add_argument("--timeout", type=float, default=300.0, help="wall-clock seconds per submission")
    p.add_argument("--test-timeout", type=float, default=10.0, help="seconds per test")
    p.add_argument("--cell-timeout", type=float, default=60.0, help="seconds per notebook cell")
    p.add_argument("--memory-mb", type=int, default=2048, help="address-space limit per submission")
    p.add_argument("--max-output", type=int, default=65536, help="printed characters kept per submission")
    p.add_argument("-j", "--jobs", type=int, default=0, help="submissions graded in parallel (0: CPUs)")
    p.add_argument("--no-confine", action="store_true",
                   help="do not confine the learner's process in namespaces (they are used when run as root)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args: argparse.Namespace) -> int:
    if args.exercise is not None:
        from .exercises import parse_target
        args.exercise = parse_target(args.exercise)[0].id
    settings = Settings(timeout=args.timeout, test_timeout=args.test_timeout,
                        cell_timeout=args.cell_timeout, memory_mb=args.memory_mb,
                        max_output=args.max_output, jobs=args.jobs, exercise=args.exercise,
                        no_confine=args.no_confine)
    paths = find_notebooks(args.submissions)
    if not paths:
        print("kstore grade: no notebooks found", file=sys.stderr)
        return 2

    def progress(n: int, total: int, s: Submission) -> None:
        if not args.quiet:
            print(f"[{n}/{total}] {s.path}  {s.exercise or '-'}  {_num(s.score)}/{_num(s.max_score)}"
                  f"  {s.status}  ({s.seconds:.1f} s)", flush=True)

    start = time.perf_counter()
    grader = Grader(settings, progress)
    try:
        subs = grader.grade(paths)
    finally:
        grader.close()
    seconds = time.perf_counter() - start
    write_csv(subs, args.out)
    if args.json_out:
        write_json(subs, args.json_out, settings, seconds)
    print(f"graded {len(subs)} submission(s) in {seconds:.1f} s → {args.out}"
          + (f" and {args.json_out}" if args.json_out else ""))
    return 0

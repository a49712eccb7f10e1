"""Run the exercise tests (plain pytest files) against a learner's namespace.

`run_tests()` calls `pytest.main` in this process with a plugin that (1) hands the namespace to
the tests' `learner` fixture, (2) selects the tasks asked for, (3) gives each test its points (a
test function's points are split evenly between its parametrised cases), (4) stops a test that runs
too long (SIGALRM; later tests of that task then fail at once), and (5) records each outcome with
the feedback message the test raised.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest

from .exercises import EXERCISES, TESTS_DIR
from .feedback import Mismatch
from .remote import STOPPED, LearnerDied
from .testing import TestTimeout

INI = Path(__file__).with_name("pytest.ini")


@dataclass
class TestOutcome:
    nodeid: str
    name: str              # e.g. "test_write_varint_vectors[n=300]"
    task: str
    extra: bool
    points: float
    earned: float = 0.0
    outcome: str = "not run"   # passed / failed / timeout / error / not run
    message: str = ""
    duration: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunResult:
    tests: list[TestOutcome] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)      # collection / internal errors
    duration: float = 0.0

    def task_scores(self) -> dict[str, tuple[float, float]]:
        scores: dict[str, list[float]] = {}
        for t in self.tests:
            s = scores.setdefault(t.task, [0.0, 0.0])
            s[0] += t.earned
            s[1] += t.points
        return {k: (round(v[0], 4), round(v[1], 4)) for k, v in scores.items()}

    @property
    def score(self) -> float:
        return round(sum(t.earned for t in self.tests), 4)

    @property
    def max_score(self) -> float:
        return round(sum(t.points for t in self.tests), 4)


def _message(excinfo) -> tuple[str, str]:
    """(outcome, feedback) for a failed test."""
    e = excinfo.value
    if isinstance(e, TestTimeout):
        return "timeout", str(e)
    if isinstance(e, Mismatch):
        return "failed", str(e)
    if isinstance(e, pytest.fail.Exception):
        return "failed", str(e)
    if isinstance(e, AssertionError):
        text = str(e).strip() or "assertion failed"
        return "failed", text
    tb = excinfo.traceback[-1] if excinfo.traceback else None
    where = f" (in {Path(str(tb.path)).name}, line {tb.lineno + 1})" if tb is not None else ""
    return "error", f"{type(e).__name__}: {e}{where}"


class LearnerPlugin:
    """The grading plugin; `namespace` is what the tests' `learner` fixture grades."""

    kstore_learner = True

    def __init__(self, namespace: dict[str, Any], *, tasks: Iterable[str] | None = None,
                 test_timeout: float = 10.0, on_result: Callable[[TestOutcome], None] | None = None,
                 remote=None, on_event: Callable[[dict], None] | None = None):
        self.namespace = namespace
        self.remote = remote                 # a RemoteLearner while `kstore grade` runs
        self.on_event = on_event or (lambda ev: None)
        self.dead_tasks: dict[str, str] = {}
        self.restart_failed: str | None = None
        self.tasks = set(tasks) if tasks is not None else None
        self.test_timeout = test_timeout
        self.on_result = on_result
        self.outcomes: dict[str, TestOutcome] = {}
        self.errors: list[str] = []
        self.timed_out_tasks: set[str] = set()
        self._failure: dict[str, tuple[str, str]] = {}

    # ---- collection
    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.errors.append(f"collecting {report.nodeid or 'tests'}: {report.longreprtext[-2000:]}")

    def pytest_collection_modifyitems(self, session, config, items) -> None:
        selected, deselected = [], []
        for item in items:
            marker = item.get_closest_marker("task")
            if marker is None or (self.tasks is not None and marker.args[0] not in self.tasks):
                deselected.append(item)
            else:
                selected.append(item)
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = selected
        groups: dict[tuple, list] = defaultdict(list)
        for item in selected:
            groups[(str(item.path), getattr(item, "originalname", item.name))].append(item)
        for (_path, original), group in groups.items():
            for item in group:
                marker = item.get_closest_marker("task")
                points = float(marker.kwargs.get("points", 1)) / len(group)
                is_extra = item.get_closest_marker("extra") is not None or \
                    original.startswith("test_extra")
                self.outcomes[item.nodeid] = TestOutcome(item.nodeid, item.name, marker.args[0],
                                                         is_extra, round(points, 6))

    # ---- running
    def pytest_runtest_setup(self, item) -> None:
        outcome = self.outcomes.get(item.nodeid)
        if outcome is not None and outcome.task in self.timed_out_tasks:
            pytest.fail("not run: an earlier test of this task ran out of time", pytrace=False)
        if outcome is not None and outcome.task in self.dead_tasks:
            pytest.fail(f"not run: the notebook's process died in an earlier test of this task "
                        f"({self.dead_tasks[outcome.task]})", pytrace=False)
        if self.remote is not None and not self.remote.alive:
            if self.restart_failed is None:
                try:                         # a fresh learner process for this task
                    self.remote.start()
                    self.on_event({"event": "restart", "task": outcome.task if outcome else None})
                except LearnerDied as e:
                    self.restart_failed = e.how
            if self.restart_failed is not None:     # once is enough: do not retry for every test
                pytest.fail(f"not run: the notebook's process could not be started again "
                            f"({self.restart_failed})", pytrace=False)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        use_alarm = self.test_timeout and threading.current_thread() is threading.main_thread()
        if use_alarm:
            marked = item.get_closest_marker("timeout")     # a test that needs longer says so
            limit = max(self.test_timeout, float(marked.args[0])) if marked and marked.args else self.test_timeout

            def on_alarm(signum, frame):
                raise TestTimeout(f"timed out after {limit:g} s (an endless loop?)")
            old = signal.signal(signal.SIGALRM, on_alarm)
            # Re-fire every 0.25 s in case the first one is swallowed by a bare `except:`.
            signal.setitimer(signal.ITIMER_REAL, limit, 0.25)
        try:
            yield
        finally:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = (yield).get_result()
        if call.excinfo is not None and report.failed:
            self._failure[item.nodeid] = _message(call.excinfo)

    def pytest_runtest_logreport(self, report) -> None:
        outcome = self.outcomes.get(report.nodeid)
        if outcome is None:
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome.duration += report.duration
            if report.passed:
                outcome.outcome, outcome.earned = "passed", outcome.points
            elif report.skipped:
                outcome.outcome, outcome.message = "skipped", str(report.longrepr)[-500:]
            else:
                kind, msg = self._failure.get(report.nodeid, ("failed", report.longreprtext[-1500:]))
                outcome.outcome, outcome.message, outcome.earned = kind, msg, 0.0
                if kind == "timeout":
                    self.timed_out_tasks.add(outcome.task)
            proc = self.remote.proc if self.remote is not None else None
            if self.remote is not None and not self.remote.alive and outcome.task not in self.dead_tasks \
                    and outcome.task not in self.timed_out_tasks and not (proc and proc.dead == STOPPED):
                how = (proc.dead if proc is not None and proc.dead else "it stopped")
                self.dead_tasks[outcome.task] = how
                self.on_event({"event": "learner-died", "task": outcome.task, "test": outcome.name, "how": how})
            if self.on_result is not None:
                self.on_result(outcome)


def test_files(exercise_ids: Iterable[str], tests_dir: Path | str | None = None) -> list[str]:
    base = Path(tests_dir) if tests_dir else TESTS_DIR
    return [str(base / EXERCISES[e].test_file) for e in exercise_ids]


def pytest_args(files: list[str], tests_dir: Path | str | None = None) -> list[str]:
    base = str(Path(tests_dir) if tests_dir else TESTS_DIR)
    return [*files, "-c", str(INI), "--rootdir", base, "--confcutdir", base,
            "-p", "no:terminal", "-p", "no:cacheprovider", "-p", "no:timeout",
            "--capture=sys", "-W", "ignore::DeprecationWarning"]


def run_tests(namespace: dict[str, Any], exercise_ids: Iterable[str], *, tasks: Iterable[str] | None = None,
              test_timeout: float = 10.0, on_result: Callable[[TestOutcome], None] | None = None,
              tests_dir: Path | str | None = None, collect_only: bool = False, remote=None,
              on_event: Callable[[dict], None] | None = None) -> RunResult:
    """Run the tests of `exercise_ids` (only `tasks`, if given) against `namespace`, or against the
    learner's process `remote` (a RemoteLearner)."""
    exercise_ids = list(exercise_ids)
    _forget_other_copies(Path(tests_dir) if tests_dir else TESTS_DIR)
    plugin = LearnerPlugin(namespace, tasks=tasks, test_timeout=test_timeout, on_result=on_result,
                           remote=remote, on_event=on_event)
    args = pytest_args(test_files(exercise_ids, tests_dir), tests_dir)
    if collect_only:
        args.append("--collect-only")
    start = time.perf_counter()
    try:
        code = pytest.main(args, plugins=[plugin])
    except SystemExit as e:   # pytest itself exiting (a usage error)
        code = e.code
    result = RunResult(list(plugin.outcomes.values()), list(plugin.errors),
                       time.perf_counter() - start)
    if code in (pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR) and not result.errors:
        result.errors.append(f"pytest could not run the tests (exit code {int(code)})")
    return result


def _forget_other_copies(tests_dir: Path) -> None:
    """pytest imports test_exNN.py as the module `test_exNN`; one imported from another copy of
    the tests (the grader works on a copy) would make it refuse this one ("import file mismatch")."""
    for name, module in list(sys.modules.items()):
        if name.startswith("test_ex") and name[7:].isdigit():
            file = getattr(module, "__file__", None)
            if not file or Path(file).resolve().parent != tests_dir.resolve():
                del sys.modules[name]


def inventory(exercise_ids: Iterable[str], tests_dir: Path | str | None = None) -> RunResult:
    """The tests of some exercises and their points, without running them."""
    return run_tests({}, exercise_ids, tests_dir=tests_dir, collect_only=True)

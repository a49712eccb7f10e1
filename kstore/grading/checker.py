"""`check("ex04.2")` in a notebook: grade the learner's definitions right there.

It runs the tests of that task and of the tasks before it in the same exercise (a regression
check), plus the tasks of earlier exercises whose functions are defined in the notebook, and prints
one line per task with its points, then the feedback of each failing test.
"""

from __future__ import annotations

import os
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

from .exercises import EXERCISES, TASKS, WHOLE_ENGINE_TASKS, parse_target
from .runner import RunResult, run_tests

MAX_MESSAGES_PER_TASK = 2


@dataclass
class CheckResult:
    target: str
    result: RunResult
    focus: list[str]

    @property
    def score(self) -> float:
        return self.result.score

    @property
    def max_score(self) -> float:
        return self.result.max_score

    @property
    def passed(self) -> bool:
        return bool(self.result.tests) and not self.result.errors and \
            all(t.outcome == "passed" for t in self.result.tests)

    def task_passed(self, task_id: str) -> bool:
        tests = [t for t in self.result.tests if t.task == task_id]
        return bool(tests) and all(t.outcome == "passed" for t in tests)

    def __repr__(self) -> str:
        return f"check({self.target!r}): {_num(self.score)}/{_num(self.max_score)} points"

    def _ipython_display_(self) -> None:
        """The report is already printed: a `check(...)` cell shows nothing more."""


def _num(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


def _defined(ns: dict[str, Any], names) -> bool:
    return all(callable(ns.get(n)) for n in names)


def select(target: str, ns: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(tasks to run, the tasks `target` names). A task target brings the tasks before it in its
    exercise; any target brings earlier exercises' tasks whose functions are all defined in `ns`."""
    ex, task = parse_target(target)
    if task is None:
        run = focus = [t.id for t in ex.tasks]
    else:
        run = [t.id for t in ex.tasks[:ex.tasks.index(task) + 1]]
        focus = [task.id]
    earlier = [t.id for other in EXERCISES.values() if other.chapter < ex.chapter
               for t in other.tasks if _defined(ns, t.functions)]
    if any(t.id in WHOLE_ENGINE_TASKS for t in ex.tasks):
        earlier = []          # the capstone's notebook holds every saved function: its own checks grade them
    return earlier + run, focus


def render(result: RunResult, target: str, focus: list[str], verbose: bool = False) -> str:
    ex, task = parse_target(target)
    title = task.title if task else ex.title
    lines = [f'check("{target}") — {title}']
    for err in result.errors:
        lines.append("  ✘ the tests could not run: " + err.strip().splitlines()[-1][:300])
    scores = result.task_scores()
    order = [t for t in TASKS if t in scores]
    regular_extra = [0, 0]
    for tid in order:
        tests = [t for t in result.tests if t.task == tid]
        earned, total = scores[tid]
        failed = [t for t in tests if t.outcome != "passed"]
        mark = "✔" if not failed else "✘"
        note = "" if tid in focus else (f"   (re-run; check(\"{tid}\") for the details)" if failed
                                        else "   (re-run)")
        n_pass = len(tests) - len(failed)
        lines.append(f"  {mark} {tid}  {TASKS[tid].title:<34} {_num(earned):>5} / {_num(total):<4}"
                     f" points  ({n_pass}/{len(tests)} tests){note}")
        if tid not in focus and not verbose:   # an earlier task: its one line is enough
            failed_shown = []
        else:
            failed_shown = failed
        shown = failed_shown if verbose else failed_shown[:MAX_MESSAGES_PER_TASK]
        for t in shown:
            tag = " [extra]" if t.extra else ""
            lines.append(f"      ✘ {t.name}{tag}")
            lines.append(textwrap.indent(t.message.rstrip() or t.outcome, " " * 10))
        if len(failed_shown) > len(shown):
            lines.append(f"      … and {len(failed) - len(shown)} more failing test(s) of {tid}"
                         f" (check(\"{tid}\", verbose=True) shows them all)")
        for t in tests:
            if t.extra:
                regular_extra[0] += t.outcome == "passed"
                regular_extra[1] += 1
    if regular_extra[1]:
        lines.append(f"  extra tests (not named in the notebook; they ship openly in "
                     f"tests/exercise_tests/): {regular_extra[0]}/{regular_extra[1]} passed")
    lines.append(f"  total {_num(result.score)} / {_num(result.max_score)} points "
                 f"({len(result.tests)} tests, {result.duration:.1f} s)")
    return "\n".join(lines)


def check(target: str, namespace: dict[str, Any] | None = None, *, verbose: bool = False,
          test_timeout: float = 10.0, quiet: bool = False) -> CheckResult | None:
    """Grade task `target` ("ex04.2") or a whole exercise ("ex04") against the notebook's
    definitions and print the summary. While `kstore grade` runs a notebook this does nothing."""
    if os.environ.get("KSTORE_GRADING") == "1":
        return None
    ns = namespace if namespace is not None else sys._getframe(1).f_globals
    # hypothesis keeps a cache; keep it out of the notebook's folder
    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                          os.path.join(os.path.expanduser("~"), ".cache", "kstore", "hypothesis"))
    run, focus = select(target, ns)
    exercises = sorted({TASKS[t].exercise_id for t in run})
    result = run_tests(ns, exercises, tasks=run, test_timeout=test_timeout)
    out = CheckResult(target, result, focus)
    if not quiet:
        print(render(result, target, focus, verbose))
    return out

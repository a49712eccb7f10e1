"""Each task graded on its own: the namespace a task's functions run in, and where in the learner's
code an exception came from. Used in the notebook (`check()`, one process) and in the learner's
process while `kstore grade` runs (there the other tasks' functions are stubs that ask the harness).

While a test of task ex04.2 runs, the names of the *other* tasks' functions (ex04.1's
`floor_segment`, ...) refer to the reference solutions, so a learner's `translate_offset` that calls
their own broken `floor_segment` still gets ex04.2's points: one bug costs the points of the task it
is in, and its feedback appears under that task.
"""

from __future__ import annotations

import linecache
import sys
import traceback
import types
from pathlib import Path
from typing import Any, Callable

from .exercises import FUNCTION_TASK, TASKS, WHOLE_ENGINE_TASKS


def isolate(namespace: dict[str, Any], task_id: str, reference: Callable[[str], Any]) -> dict[str, Any]:
    """A copy of `namespace` in which the other tasks' functions are `reference(name)`, and every
    function the learner defined sees that copy as its globals. (A whole-engine task — the
    capstone — keeps every function the learner defined: their engine is what it grades.)"""
    own = set(FUNCTION_TASK) if task_id in WHOLE_ENGINE_TASKS else set(TASKS[task_id].functions)
    exercise_id = TASKS[task_id].exercise_id
    g = dict(namespace)
    replaced = set()
    for name, tid in FUNCTION_TASK.items():
        if name in own:
            continue
        if TASKS[tid].exercise_id == exercise_id or name in namespace:
            try:
                g[name] = reference(name)
                replaced.add(name)
            except Exception:   # no solution notebook (a stripped copy of the course)
                pass
    for name, value in list(g.items()):
        if name in replaced:
            continue
        if isinstance(value, types.FunctionType) and value.__globals__ is namespace:
            clone = types.FunctionType(value.__code__, g, value.__name__, value.__defaults__,
                                       value.__closure__)
            clone.__kwdefaults__ = value.__kwdefaults__
            clone.__dict__.update(value.__dict__)
            clone.__qualname__ = value.__qualname__
            g[name] = clone
    return g


_HERE = str(Path(__file__).resolve().parents[1])   # kstore/


def learner_location(tb) -> str:
    """'\\n  at line 4 of your code: return x[0]' for the innermost frame outside kstore and the tests."""
    frames = traceback.extract_tb(tb)
    for fr in reversed(frames):
        fn = fr.filename or ""
        if fn.startswith(_HERE) or "exercise_tests" in fn or "site-packages" in fn or \
                fn.startswith(sys.prefix) or fn.startswith(getattr(sys, "base_prefix", sys.prefix)):
            continue
        line = (fr.line or linecache.getline(fn, fr.lineno) or "").strip()
        return f"\n  at line {fr.lineno} of your code: {line}" if line else \
            f"\n  at line {fr.lineno} of your code"
    return ""

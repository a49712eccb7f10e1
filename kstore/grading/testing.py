"""What the exercise tests (`tests/exercise_tests/test_exNN.py`) use: the `task` marker, the
hypothesis settings for property tests, and `Learner`, the learner's functions as a test sees them.

Each task is graded on its own. While a test of task ex04.2 runs, the names of the *other* tasks'
functions (ex04.1's `floor_segment`, ...) refer to the reference solutions, so a learner's
`translate_offset` that calls their own broken `floor_segment` still gets ex04.2's points: one bug
costs the points of the task it is in, and its feedback appears under that task.
"""

from __future__ import annotations

import linecache
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, Phase, settings

from . import notebooks
from .exercises import EXERCISES, FUNCTION_TASK, TASKS
from .feedback import Mismatch, call_repr
from .views import CountingFile, SegmentView, build_segment  # noqa: F401  (for the tests)


def task(task_id: str, points: float = 1):
    """Mark a test (function) as grading `task_id`, worth `points` (split evenly between its
    parametrised cases)."""
    if task_id not in TASKS:
        raise KeyError(f"unknown task {task_id!r}")
    return pytest.mark.task(task_id, points=points)


def extra(test):
    """Mark a test the notebook does not name: it ships openly and counts like the others, but the
    report lists it as "extra" (tests named `test_extra_*` are extra too)."""
    return pytest.mark.extra(test)

#: Settings for property tests: deterministic (everyone is graded on the same examples), no
#: deadline (a learner's code may be slow), no database written next to the notebook.
PROPERTY = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck), print_blob=False,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])


class TestTimeout(BaseException):
    """Raised (from SIGALRM) in a test that ran longer than its time limit. A BaseException, so
    neither the learner's `except Exception` nor hypothesis's shrinking swallows it."""


# ------------------------------------------------------------------ reference solutions
_REFERENCES: dict[str, dict[str, Any]] = {}


def reference_namespace(exercise_id: str) -> dict[str, Any]:
    """The solution notebook's definitions (run once per process)."""
    if exercise_id not in _REFERENCES:
        _REFERENCES[exercise_id] = notebooks.exec_definitions(EXERCISES[exercise_id].solution_path)
    return _REFERENCES[exercise_id]


def reference(name: str) -> Callable:
    return reference_namespace(TASKS[FUNCTION_TASK[name]].exercise_id)[name]


# ------------------------------------------------------------------ isolation
def isolate(namespace: dict[str, Any], task_id: str) -> dict[str, Any]:
    """A copy of `namespace` in which the other tasks' functions are the reference ones, and every
    function the learner defined sees that copy as its globals."""
    own = set(TASKS[task_id].functions)
    exercise_id = TASKS[task_id].exercise_id
    g = dict(namespace)
    replaced = set()
    for name, tid in FUNCTION_TASK.items():
        if name in own:
            continue
        same_exercise = TASKS[tid].exercise_id == exercise_id
        if same_exercise or name in namespace:
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


def _learner_location(tb) -> str:
    """' (line 4 of your code: `return x[0]`)' for the innermost frame outside kstore and the tests."""
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


class Guarded:
    """A learner's function as tests call it: exceptions become readable feedback."""

    def __init__(self, name: str, fn: Callable):
        self.name = name
        self.raw = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.raw(*args, **kwargs)
        except Mismatch:
            raise
        except NotImplementedError as e:
            raise Mismatch(f"{call_repr(self.name, *args, **kwargs)}\n  not implemented yet "
                           f"(raised NotImplementedError: {e})") from None
        except RecursionError:
            raise Mismatch(f"{call_repr(self.name, *args, **kwargs)}\n  raised RecursionError "
                           f"(infinite recursion?)") from None
        except MemoryError:
            raise Mismatch(f"{call_repr(self.name, *args, **kwargs)}\n  ran out of memory") from None
        except Exception as e:
            where = _learner_location(e.__traceback__)
            raise Mismatch(f"{call_repr(self.name, *args, **kwargs)}\n  raised "
                           f"{type(e).__name__}: {e}{where}") from None
        except SystemExit as e:
            raise Mismatch(f"{call_repr(self.name, *args, **kwargs)}\n  called sys.exit"
                           f"({e.code!r}); a function must return its answer") from None


class Learner:
    """The functions of one task, as a test uses them: `learner.write_varint(300)`."""

    def __init__(self, namespace: dict[str, Any], task_id: str):
        self.task_id = task_id
        self._ns = namespace
        self._g: dict[str, Any] | None = None

    def _globals(self) -> dict[str, Any]:
        if self._g is None:
            self._g = isolate(self._ns, self.task_id)
        return self._g

    def __getattr__(self, name: str) -> Guarded:
        if name.startswith("_"):
            raise AttributeError(name)
        value = self._globals().get(name)
        if value is None and name not in FUNCTION_TASK:
            raise AttributeError(name)
        if value is None:
            raise Mismatch(f"{name} is not defined\n  define it (run the cell of task {self.task_id}"
                           f" that starts `def {name}(`) and check again")
        if not callable(value):
            raise Mismatch(f"{name} is a {type(value).__name__}, not a function")
        return Guarded(name, value)


def expect_raises(fn: Guarded, args: tuple, *, call: str, what: str,
                  exceptions: tuple[type[BaseException], ...] = (Exception,)) -> None:
    """The learner's function must raise one of `exceptions` (any Exception by default)."""
    try:
        result = fn.raw(*args)
    except NotImplementedError as e:
        raise Mismatch(f"{call}\n  not implemented yet (raised NotImplementedError: {e})") from None
    except exceptions:
        return
    except Exception as e:
        raise Mismatch(f"{call}\n  raised {type(e).__name__}: {e}; expected {what}") from None
    raise Mismatch(f"{call}\n  returned {result!r}; expected it to raise: {what}")


def namespace_for(request) -> dict[str, Any]:
    """The namespace a test grades: the learner's (when the grader runs the tests) or the solution
    notebook's (when the tests run as part of the project's own suite)."""
    for plugin in request.config.pluginmanager.get_plugins():
        if getattr(plugin, "kstore_learner", False):
            return plugin.namespace
    marker = request.node.get_closest_marker("task")
    return reference_namespace(TASKS[marker.args[0]].exercise_id)


def learner_fixture(request) -> Learner:
    marker = request.node.get_closest_marker("task")
    if marker is None:
        raise RuntimeError(f"{request.node.nodeid} has no @task(...) marker")
    return Learner(namespace_for(request), marker.args[0])


def scratch_dir(prefix: str = "kstore-ex-") -> str:
    """A fresh temporary directory (recreating TMPDIR if a learner deleted it)."""
    import tempfile
    tmp = tempfile.gettempdir()
    os.makedirs(tmp, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix)

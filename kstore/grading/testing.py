"""What the exercise tests (`tests/exercise_tests/test_exNN.py`) use: the `task` marker, the
hypothesis settings for property tests, and `Learner`, the learner's functions as a test sees them.

Each task is graded on its own. While a test of task ex04.2 runs, the names of the *other* tasks'
functions (ex04.1's `floor_segment`, ...) refer to the reference solutions, so a learner's
`translate_offset` that calls their own broken `floor_segment` still gets ex04.2's points: one bug
costs the points of the task it is in, and its feedback appears under that task.

Where the learner's functions run. In a notebook (`check()`) and in the project's own suite they
run in the test's process. Under `kstore grade` they run in a separate, confined learner process
(`kstore.grading.sandbox`), and `learner.fn(args)` is a call across a socket. Rules for test
authors, so a test works in both places:

* Call the learner's functions as `learner.fn(...)` (or `expect_raises(learner.fn, ...)`) and
  compare the *return value* in the test; never hand the learner a place to write its answer.
* Plain data (None, bool, int, float, str, bytes, list, tuple, dict, set) is copied across. Named
  tuples arrive as named tuples; a subclass of a plain type arrives as the plain type.
* Anything else a test passes (a `SegmentView`, a `CountingFile`, a segment, a record, a predicate,
  a list subclass that counts reads) stays in the test's process: the learner gets a stand-in whose
  public attribute reads, calls, `len`, indexing, iteration, `in`, `bool`, `repr` are requests back
  to the test's process. So counters such as `view.log.bytes_read` keep working, and identity holds
  within one call (the learner may return the objects it was given: the test gets the originals).
  Private attributes (`_x`), modules and classes are not reachable through a stand-in.
* What the learner returns that is not plain data arrives as a read-only `LearnerObject` with the
  object's public attributes (never the learner's own `__eq__`).
* File descriptors: pass them as ints or as objects with `fileno()`; `os.sendfile` in the learner's
  process is forwarded to the test's process (so a test can patch or count `os.sendfile`), for the
  descriptors the call was given only. Other system calls on the test's descriptors do not work
  from the learner's process: keep such work in the test, or forward it the same way
  (`kstore.grading.sandbox.forwarded_sendfile`, served in `kstore.grading.remote`).
* Exceptions come back as the nearest built-in type (a learner's `ValueError` subclass is a
  `ValueError`), so `expect_raises(..., exceptions=(ValueError,))` works.
* Compute the expected answer *before* calling the learner when the learner gets live objects
  (a segment): their public methods are callable from the learner's side.
* A test must not rely on the learner's process keeping state between calls: after a crash the
  next task's tests run in a fresh process.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, Phase, settings

from . import notebooks
from .exercises import EXERCISES, FUNCTION_TASK, TASKS, WHOLE_ENGINE_TASKS
from .feedback import Mismatch, call_repr
from .isolation import isolate as _isolate, learner_location
from .remote import LearnerDied
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
        ns = notebooks.exec_definitions(EXERCISES[exercise_id].solution_path)
        if any(t.id in WHOLE_ENGINE_TASKS for t in EXERCISES[exercise_id].tasks):
            # the capstone's reference engine: every solution (not whatever my_engine/ the cwd holds)
            ns.update({f: reference(f) for f, tid in FUNCTION_TASK.items()
                       if TASKS[tid].exercise_id != exercise_id})
        _REFERENCES[exercise_id] = ns
    return _REFERENCES[exercise_id]


def reference(name: str) -> Callable:
    return reference_namespace(TASKS[FUNCTION_TASK[name]].exercise_id)[name]


# ------------------------------------------------------------------ isolation
def isolate(namespace: dict[str, Any], task_id: str) -> dict[str, Any]:
    """A copy of `namespace` in which the other tasks' functions are the reference ones."""
    return _isolate(namespace, task_id, reference)


def _where(e: BaseException) -> str:
    """Where in the learner's code `e` came from (told by the learner's process, or from the traceback)."""
    where = getattr(e, "kstore_where", None)
    return where if where is not None else learner_location(e.__traceback__)


def _died(call: str, e: LearnerDied) -> Mismatch:
    return Mismatch(f"{call}\n  the notebook's process died while running it ({e.how}); the rest of this "
                    f"task's tests are not run, the next tasks run in a fresh process")


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
        except LearnerDied as e:
            raise _died(call_repr(self.name, *args, **kwargs), e) from None
        except NotImplementedError as e:
            raise Mismatch(f"{call_repr(self.name, *args, **kwargs)}\n  not implemented yet "
                           f"(raised NotImplementedError: {e})") from None
        except RecursionError:
            raise Mismatch(f"{call_repr(self.name, *args, **kwargs)}\n  raised RecursionError "
                           f"(infinite recursion?)") from None
        except MemoryError:
            raise Mismatch(f"{call_repr(self.name, *args, **kwargs)}\n  ran out of memory") from None
        except Exception as e:
            raise Mismatch(f"{call_repr(self.name, *args, **kwargs)}\n  raised "
                           f"{getattr(e, 'kstore_type', type(e).__name__)}: {e}{_where(e)}") from None
        except SystemExit as e:
            raise Mismatch(f"{call_repr(self.name, *args, **kwargs)}\n  called sys.exit"
                           f"({e.code!r}); a function must return its answer") from None


class RemoteFunction:
    """A learner's function in the learner's process (`kstore grade`): calling it sends the
    arguments there as plain data and brings the answer back the same way."""

    def __init__(self, remote, task_id: str, name: str):
        self.remote, self.task_id, self.__name__ = remote, task_id, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.remote.call(self.task_id, self.__name__, args, kwargs)


class Learner:
    """The functions of one task, as a test uses them: `learner.write_varint(300)`. In the
    notebook (`check()`) and the project's own suite they run here; while `kstore grade` runs, in
    the learner's process (`remote`, a `kstore.grading.remote.RemoteLearner`)."""

    def __init__(self, namespace: dict[str, Any], task_id: str, remote=None):
        self.task_id = task_id
        self._ns = namespace
        self._remote = remote
        self._g: dict[str, Any] | None = None

    def _globals(self) -> dict[str, Any]:
        if self._g is None:
            self._g = isolate(self._ns, self.task_id)
        return self._g

    def _lookup(self, name: str) -> Any:
        if self._remote is None:
            return self._globals().get(name)
        if name in self._remote.names:
            return RemoteFunction(self._remote, self.task_id, name)
        return None

    def functions(self) -> dict[str, Callable]:
        """Every exercise function the learner defined, as plain callables (the capstone plugs
        them into the engine; remote ones are calls into the learner's process)."""
        return {name: fn for name in FUNCTION_TASK if callable(fn := self._lookup(name))}

    def __getattr__(self, name: str) -> Guarded:
        if name.startswith("_"):
            raise AttributeError(name)
        value = self._lookup(name)
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
    except LearnerDied as e:
        raise _died(call, e) from None
    except NotImplementedError as e:
        raise Mismatch(f"{call}\n  not implemented yet (raised NotImplementedError: {e})") from None
    except exceptions:
        return
    except Exception as e:
        raise Mismatch(f"{call}\n  raised {getattr(e, 'kstore_type', type(e).__name__)}: {e}; "
                       f"expected {what}") from None
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
    remote = next((getattr(p, "remote", None) for p in request.config.pluginmanager.get_plugins()
                   if getattr(p, "kstore_learner", False)), None)
    return Learner(namespace_for(request), marker.args[0], remote=remote)


def scratch_dir(prefix: str = "kstore-ex-") -> str:
    """A fresh temporary directory (recreating TMPDIR if a learner deleted it)."""
    import tempfile
    tmp = tempfile.gettempdir()
    os.makedirs(tmp, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix)

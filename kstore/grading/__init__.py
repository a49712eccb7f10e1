"""Graded exercises: `check()` in a notebook, `kstore grade` for instructors, `kstore exercises`
to regenerate `exercises/` from `solutions/`.

    from kstore.grading import check
    check("ex01.1")     # one task (and the tasks before it in the exercise)
    check("ex01")       # the whole exercise

`check` (it runs pytest and hypothesis, the course's test extras) is imported on first use, so the
`kstore` command does not need them.
"""

from .exercises import EXERCISES, TASKS

__all__ = ["CheckResult", "EXERCISES", "TASKS", "check"]


def __getattr__(name: str):
    if name in ("check", "CheckResult"):
        from . import checker
        return getattr(checker, name)
    raise AttributeError(f"module 'kstore.grading' has no attribute {name!r}")

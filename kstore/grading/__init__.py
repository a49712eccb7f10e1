"""Graded exercises: `check()` in a notebook, `kstore grade` for instructors, `kstore exercises`
to regenerate `exercises/` from `solutions/`.

    from kstore.grading import check
    check("ex01.1")     # one task (and the tasks before it in the exercise)
    check("ex01")       # the whole exercise
"""

from .check import CheckResult, check
from .exercises import EXERCISES, TASKS

__all__ = ["CheckResult", "EXERCISES", "TASKS", "check"]

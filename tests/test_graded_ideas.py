"""The core ideas issue 18 found shown but never graded are graded now: each has its task, and
each task has at least three named wrong submissions in the catalogue (tests/test_grading.py
grades them all and checks that each loses points only in its own task, with its named feedback)."""

from __future__ import annotations

from collections import Counter

from grading.wrong_submissions import WRONG
from kstore.grading.exercises import TASKS

# idea -> the task that grades it
GRADED_IDEAS = {
    "cleanable-log selection by dirty ratio": "ex07.4",
    "murmur2 key -> partition": "ex08.6",
    "commit semantics: what a crash re-delivers or loses": "ex08.7",
    "the acks decision (0/1/all, min.insync.replicas)": "ex09.6",
    "the election decision (clean vs unclean)": "ex10.3",
    "capstone: the learner's Fetch serving through sendfile": "ex12.1",
}


def test_every_core_idea_has_a_task_with_three_named_wrong_submissions():
    per_task = Counter(task for task, _source, _feedback in WRONG.values())
    for idea, task in GRADED_IDEAS.items():
        assert task in TASKS, f"{idea}: no task {task}"
        assert per_task[task] >= 3, f"{idea}: {task} has {per_task[task]} wrong submission(s), not 3"
    for name, (task, _source, feedback) in WRONG.items():
        if task in GRADED_IDEAS.values():
            assert feedback.strip(), f"{name} names no feedback to expect"

"""The exercise tests: one plain pytest file per chapter, `test_exNN.py`.

Each test takes the `learner` fixture: the functions of the task it is marked with
(`@task("ex01.3", points=4)`). Run by the grader (`check()` in a notebook, `kstore grade`), the
fixture grades the learner's notebook; run as part of the project's suite (`pytest tests/`), it
grades the solution notebooks in `solutions/`, so the suite proves the solutions pass.
"""

from __future__ import annotations

import pytest

from kstore.grading.testing import learner_fixture


def pytest_configure(config):
    config.addinivalue_line("markers", "task(task_id, points): the task a test grades and its points")
    config.addinivalue_line("markers", "extra: a test the notebook does not name (ships openly)")


@pytest.fixture
def learner(request):
    return learner_fixture(request)

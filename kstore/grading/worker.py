"""Grade one notebook: `python -m kstore.grading.worker` (started by `kstore grade`, one process per
submission). This process is the *harness*: it holds the tests (its own private copy) and the
reference solutions, and never runs a line of the learner's code.

The learner's cells run in a separate process (`kstore.grading.sandbox`, confined where the platform
allows); the tests call the learner's functions there across a socket, with plain data both ways
(`kstore.grading.remote`). When that process dies in a test, the test fails, the rest of that
task's tests are not run, and the next task's tests get a fresh process (cells run again).

Progress and results go to the parent as JSON lines on the original stdout, one per cell and one
per test, so a submission killed half-way still has the results it reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time


def _emit_to(fd: int):
    def emit(obj: dict) -> None:
        data = (json.dumps(obj, default=str) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    return emit


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--notebook", required=True)
    p.add_argument("--exercise", required=True)
    p.add_argument("--tests-dir", default=None)
    p.add_argument("--test-timeout", type=float, default=10.0)
    p.add_argument("--cell-timeout", type=float, default=60.0)
    p.add_argument("--memory-mb", type=int, default=2048)
    p.add_argument("--file-mb", type=int, default=512)
    p.add_argument("--max-output", type=int, default=65536)
    p.add_argument("--scratch", required=True, help="the learner's working directory")
    p.add_argument("--hide", action="append", default=[], help="also hidden from the learner")
    p.add_argument("--no-confine", action="store_true", help="do not use namespaces even as root")
    args = p.parse_args(argv)

    result_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    emit = _emit_to(result_fd)
    start = time.perf_counter()
    emit({"event": "start", "pid": os.getpid()})
    try:
        from kstore.grading import notebooks
        from kstore.grading.remote import LearnerDied, Options, RemoteLearner, default_hidden
        nb = notebooks.load(args.notebook)
    except BaseException as e:
        emit({"event": "fatal", "error": f"{type(e).__name__}: {e}"})
        os._exit(3)

    cells = [(c.index, c.task, c.source) for c in notebooks.code_cells(nb)
             if not any(t in c.tags for t in notebooks.SKIPPED_WHEN_GRADING) and c.source.strip()]
    try:
        from kstore.grading.plagiarism import notes as plagiarism_notes
        emit({"event": "plagiarism", "notes": plagiarism_notes([c[2] for c in cells], args.exercise)})
    except Exception as e:                     # a note is not worth failing the grading for
        emit({"event": "plagiarism", "notes": [], "error": f"{type(e).__name__}: {e}"})
    keep = sorted({os.path.realpath(p) for p in (os.path.dirname(os.path.dirname(notebooks.__file__)),
                                                 sys.prefix, sys.base_prefix, sys.exec_prefix)})
    options = Options(cell_timeout=args.cell_timeout, memory_mb=args.memory_mb, file_mb=args.file_mb,
                      max_output=args.max_output, scratch=args.scratch,
                      hide=default_hidden(args.hide), keep=keep,
                      confine=False if args.no_confine else None)
    remote = RemoteLearner(cells, options, emit)

    def on_cell(ev: dict) -> None:
        emit({"event": "cell", **ev})

    errors: list[str] = []
    died: list[str] = []

    def start_learner() -> None:
        try:
            remote.start(on_cell)
        except LearnerDied as e:
            died.append(e.how)
    learner_start = threading.Thread(target=start_learner, daemon=True)
    learner_start.start()                      # the learner runs its cells while pytest loads here
    try:
        from kstore.grading.runner import run_tests
        from kstore.grading.testing import reference_namespace
        reference_namespace(args.exercise)
    except BaseException as e:
        emit({"event": "fatal", "error": f"{type(e).__name__}: {e}"})
        remote.close()
        os._exit(3)
    learner_start.join()
    started = not died
    if died:
        emit({"event": "learner-died", "task": None, "test": None, "how": died[0]})
    emit({"event": "isolation", **remote.report})

    def on_result(outcome) -> None:
        emit({"event": "test", **outcome.to_dict()})

    if started:
        try:
            run = run_tests({}, [args.exercise], test_timeout=args.test_timeout, on_result=on_result,
                            tests_dir=args.tests_dir, remote=remote, on_event=emit)
            errors = run.errors
        except BaseException as e:
            errors = [f"the tests stopped: {type(e).__name__}: {e}"]
    remote.close()
    emit({"event": "done", "errors": errors, "output_chars": remote.output_chars,
          "seconds": round(time.perf_counter() - start, 3)})
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

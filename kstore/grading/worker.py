"""Grade one notebook in this process: `python -m kstore.grading.worker` (started by `kstore grade`,
one process per submission).

The learner's cells run in an IPython shell (magics work) under limits set here, in the child:
RLIMIT_AS (memory), RLIMIT_FSIZE (file size), a time limit per cell and per test (SIGALRM); the
parent adds the wall-clock limit and kills the whole process group when it runs out. What the
learner prints goes to a capped buffer (only its size is reported). Progress and results go to the
parent as JSON lines on the original stdout, one per cell and one per test, so a submission killed
half-way still has the results it reached.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import time


class CellTimeout(BaseException):
    """A cell ran past --cell-timeout (raised from SIGALRM)."""


class CappedText:
    """A text stream that keeps the first `limit` characters and counts the rest."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, limit: int):
        self.limit = limit
        self.kept: list[str] = []
        self.kept_len = 0
        self.total = 0

    def write(self, s) -> int:
        s = str(s)
        self.total += len(s)
        if self.kept_len < self.limit:
            piece = s[: self.limit - self.kept_len]
            self.kept.append(piece)
            self.kept_len += len(piece)
        return len(s)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return 1

    def readable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


def _limits(memory_mb: int, file_mb: int) -> None:
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if file_mb > 0:
        limit = file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a too-big write fails instead of killing us


def _emit_to(fd: int):
    def emit(obj: dict) -> None:
        data = (json.dumps(obj, default=str) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    return emit


def _shell():
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config
    c = Config()
    c.HistoryManager.enabled = False
    c.InteractiveShell.xmode = "Plain"
    shell = InteractiveShell.instance(config=c)
    try:
        shell.colors = "nocolor"
    except Exception:
        pass
    return shell


def _error_text(e: BaseException | None) -> str:
    if e is None:
        return ""
    if isinstance(e, CellTimeout):
        return str(e)
    if isinstance(e, SystemExit):
        return f"SystemExit: the cell called sys.exit({e.code!r})"
    if isinstance(e, MemoryError):
        return f"MemoryError: over the memory limit{f' ({e})' if str(e) else ''}"
    text = f"{type(e).__name__}: {e}"
    return text if len(text) < 500 else text[:500] + "…"


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
    args = p.parse_args(argv)
    workdir, tmpdir = os.getcwd(), os.environ.get("TMPDIR")

    result_fd = os.dup(1)                         # the parent's pipe; not inherited by children
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)                           # direct writes to fd 1 go nowhere
    emit = _emit_to(result_fd)
    os.environ["KSTORE_GRADING"] = "1"            # check() cells do nothing while grading
    start = time.perf_counter()
    emit({"event": "start", "pid": os.getpid()})
    _limits(args.memory_mb, args.file_mb)

    out = CappedText(args.max_output)
    try:
        from kstore.grading import notebooks
        from kstore.grading.runner import run_tests
        from kstore.grading.testing import reference_namespace
        reference_namespace(args.exercise)         # before any learner code runs
        nb = notebooks.load(args.notebook)
        shell = _shell()
    except BaseException as e:
        emit({"event": "fatal", "error": _error_text(e)})
        os._exit(3)

    real_stdout, real_stderr = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    sys.argv = ["notebook"]                       # the learner's code need not see the grader's paths
    for cell in notebooks.code_cells(nb):
        if any(t in cell.tags for t in notebooks.SKIPPED_WHEN_GRADING) or not cell.source.strip():
            continue
        t0 = time.perf_counter()

        def on_alarm(signum, frame):
            raise CellTimeout(f"the cell ran longer than {args.cell_timeout:g} s (an endless loop?)")
        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, args.cell_timeout)
        error: BaseException | None = None
        try:
            result = shell.run_cell(cell.source, store_history=False, silent=False)
            error = result.error_before_exec or result.error_in_exec
        except BaseException as e:                # an alarm that fired in IPython's own code
            error = e
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
        emit({"event": "cell", "index": cell.index, "task": cell.task,
              "status": "ok" if error is None else ("timeout" if isinstance(error, CellTimeout)
                                                    else "exit" if isinstance(error, SystemExit)
                                                    else "error"),
              "error": _error_text(error), "seconds": round(time.perf_counter() - t0, 3)})

    def on_result(outcome) -> None:
        emit({"event": "test", **outcome.to_dict()})

    for d in (workdir, tmpdir):                   # the learner may have deleted them
        if d:
            os.makedirs(d, exist_ok=True)
    os.chdir(workdir)

    try:
        run = run_tests(shell.user_ns, [args.exercise], test_timeout=args.test_timeout,
                        on_result=on_result, tests_dir=args.tests_dir)
        errors = run.errors
    except BaseException as e:
        errors = [f"the tests stopped: {_error_text(e)}"]
    sys.stdout, sys.stderr = real_stdout, real_stderr
    emit({"event": "done", "errors": errors, "output_chars": out.total,
          "output_head": "".join(out.kept)[:2000], "seconds": round(time.perf_counter() - start, 3)})
    os._exit(0)   # no atexit handlers or leftover non-daemon threads of the learner's


if __name__ == "__main__":
    sys.exit(main())

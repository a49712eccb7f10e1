"""Long operations show progress: a progress line on the CLI's stderr only when it is a terminal
(a real pseudo-terminal here), silent in pipes; the notebooks' helpers draw an ipywidgets bar,
and `run_kstore` / `working` cover waits of unknown length (a `kstore` subprocess, Spark's start)."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys

import pytest

from kstore.cli_progress import ProgressLine, counted
from kstore.widgets.progress import KstoreCommandFailed, ProgressModel, run_kstore, working


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_redraws_in_place_on_a_terminal_only():
    now = [0.0]
    tty = _Tty()
    p = ProgressLine("produce to orders", "records", tty, min_interval=0.5, clock=lambda: now[0])
    for _ in counted(range(10), p):
        now[0] += 0.2                       # a draw every 0.5 s of the fake clock, not every item
    p.finish()
    text = tty.getvalue()
    assert text.startswith("\r") and text.endswith("\n") and text.count("\n") == 1
    assert "produce to orders: 10 records in 2.0 s (5 records/s)" in text.splitlines()[-1]
    assert 1 < text.count("\r") < 10
    pipe = io.StringIO()                     # not a terminal: nothing at all
    q = ProgressLine("produce", "records", pipe, min_interval=0)
    for _ in counted(range(5), q):
        pass
    q.finish()
    assert pipe.getvalue() == "" and q.done == 5


def _run(cmd: list[str], stdin, stderr_tty: bool, stdout=subprocess.DEVNULL,
         stdout_tty: bool = False) -> tuple[int, str]:
    """Run `cmd`; return its exit status and what it wrote to stderr — a pipe, or a real
    pseudo-terminal (then also its stdout when `stdout_tty`: one terminal for both, as in a shell)."""
    if not stderr_tty:
        r = subprocess.run(cmd, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, timeout=120)
        return r.returncode, r.stderr.decode()
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, stdin=stdin, stdout=slave if stdout_tty else stdout,
                                stderr=slave)
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:                # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        return proc.wait(timeout=120), out.decode()
    finally:
        os.close(master)


def _produce(tmp_path, n: int, stderr_tty: bool) -> tuple[int, str]:
    log_dir = str(tmp_path / "logs")
    subprocess.run([sys.executable, "-m", "kstore", "topics", "--log-dir", log_dir, "--create",
                    "--topic", "orders"], check=True, capture_output=True, timeout=60)
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"order {i}\n" for i in range(n)))
    cmd = [sys.executable, "-m", "kstore", "produce", "--log-dir", log_dir, "--topic", "orders"]
    with open(lines, "rb") as stdin:
        return _run(cmd, stdin, stderr_tty)


def test_cli_produce_shows_progress_on_a_terminal_and_nothing_in_a_pipe(tmp_path):
    code, err = _produce(tmp_path / "tty", 30_000, stderr_tty=True)
    assert code == 0
    last = err.replace("\r\n", "\n").split("\r")[-1].strip()
    assert last.startswith("produce to orders: 30,000 records in"), err[-300:]
    code, err = _produce(tmp_path / "pipe", 3_000, stderr_tty=False)
    assert code == 0 and err == ""


def test_cli_consume_shows_progress_only_when_its_records_go_to_a_file(tmp_path):
    code, _ = _produce(tmp_path, 30_000, stderr_tty=False)
    assert code == 0
    cmd = [sys.executable, "-m", "kstore", "consume", "--log-dir", str(tmp_path / "logs"),
           "--topic", "orders", "--from-beginning"]
    # records to a file, stderr on a terminal: the progress line, then Kafka's closing line
    with open(tmp_path / "out.txt", "wb") as out:
        code, err = _run(cmd, subprocess.DEVNULL, stderr_tty=True, stdout=out)
    assert code == 0
    lines = (tmp_path / "out.txt").read_text().splitlines()
    assert len(lines) == 30_000 and lines[0] == "order 0" and lines[-1] == "order 29999"
    text = err.replace("\r\n", "\n")
    assert "\r" in text, err[-300:]
    last_progress = text.split("\r")[-1].splitlines()[0]
    assert last_progress.startswith("consume from orders: 30,000 records in"), err[-300:]
    assert text.rstrip().endswith("Processed a total of 30000 messages")
    # records and stderr on the same terminal: the records are the progress, no line among them
    code, both = _run(cmd, subprocess.DEVNULL, stderr_tty=True, stdout_tty=True)
    assert code == 0 and "consume from orders" not in both and "\r\n" in both
    assert both.replace("\r\n", "\n").count("\n") == 30_001
    # a pipe: only the closing line, as kafka-console-consumer writes it
    code, err = _run(cmd, subprocess.DEVNULL, stderr_tty=False)
    assert code == 0 and err == "Processed a total of 30000 messages\n"


def test_progress_line_beside_a_terminal_stays_silent():
    p = ProgressLine("consume", "records", _Tty(), min_interval=0, beside=_Tty())
    p.update(5)
    p.finish()
    assert not p.enabled and p.stream.getvalue() == "" and p.done == 5
    q = ProgressLine("consume", "records", _Tty(), min_interval=0, beside=io.StringIO())
    q.update(5)
    q.finish()
    assert q.enabled and "consume: 5 records" in q.stream.getvalue()


def test_waits_of_unknown_length_show_the_seconds_passing():
    now = [100.0]
    m = ProgressModel(None, "starting Spark", None, clock=lambda: now[0])
    now[0] += 6.25
    assert m.render_text() == "starting Spark · 6.2 s"
    now[0] += 11
    m.finish()
    assert m.render_text() == "starting Spark · done in 17.2 s"
    f = ProgressModel(None, "starting Spark", None, clock=lambda: now[0])
    f.finish(RuntimeError("Java gateway process exited"))
    assert f.render_text() == "starting Spark · failed after 0.0 s: RuntimeError: Java gateway process exited"
    w = working("a wait", show_after=0, display=False)
    w.finish()
    assert w.shown and w.bar.bar.bar_style == "success" and "a wait · done in" in w.model.render_text()


def test_run_kstore_runs_the_real_command_under_a_bar(tmp_path):
    log_dir = str(tmp_path / "logs")
    subprocess.run([sys.executable, "-m", "kstore", "topics", "--log-dir", log_dir, "--create",
                    "--topic", "orders", "--partitions", "2"], check=True, capture_output=True)
    direct = subprocess.run([sys.executable, "-m", "kstore", "topics", "--log-dir", log_dir,
                             "--describe"], capture_output=True, text=True, check=True)
    done = run_kstore("topics", "--log-dir", log_dir, "--describe", show_after=0)
    assert done.stdout == direct.stdout and "PartitionCount: 2" in done.stdout
    bar = run_kstore.last
    assert bar.shown and bar.model.render_text().startswith("kstore topics · done in ")
    # a quick command under a bar that waits a minute before showing itself: nothing shown
    run_kstore("topics", "--log-dir", log_dir, "--list", show_after=60)
    assert not run_kstore.last.shown
    # a failing command: its own error line in the exception, the bar says it failed
    with pytest.raises(KstoreCommandFailed, match=r"kstore dump-log .*missing\.log exited with "
                                                   r"status 1: .*missing\.log: no such file"):
        run_kstore("dump-log", str(tmp_path / "missing.log"))
    assert run_kstore.last.model.render_text().startswith("kstore dump-log · failed after ")
    assert run_kstore("dump-log", str(tmp_path / "missing.log"), check=False).returncode == 1


def test_stderr_to_sends_a_started_process_stderr_to_a_file_and_restores_it(tmp_path):
    """What chapter 13 does around Spark's start: the JVM keeps the descriptor it was started
    with, so its notices land in the file, not in the notebook; afterwards descriptor 2 is back."""
    from kstore.course import stderr_to

    before = os.fstat(2)
    log = tmp_path / "driver.log"
    with stderr_to(log):
        child = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.3); "
                                  "sys.stderr.write('Setting default log level to WARN\\n')"])
    assert child.wait(30) == 0                  # it wrote after the block: still to the file
    assert log.read_text() == "Setting default log level to WARN\n"
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)

"""Long operations show progress: a progress line on the CLI's stderr only when it is a terminal
(a real pseudo-terminal here), silent in pipes; the notebooks' helpers draw an ipywidgets bar."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys

from kstore.cli_progress import ProgressLine, counted


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


def _produce(tmp_path, n: int, stderr_tty: bool) -> tuple[int, str]:
    log_dir = str(tmp_path / "logs")
    subprocess.run([sys.executable, "-m", "kstore", "topics", "--log-dir", log_dir, "--create",
                    "--topic", "orders"], check=True, capture_output=True, timeout=60)
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"order {i}\n" for i in range(n)))
    cmd = [sys.executable, "-m", "kstore", "produce", "--log-dir", log_dir, "--topic", "orders"]
    with open(lines, "rb") as stdin:
        if not stderr_tty:
            r = subprocess.run(cmd, stdin=stdin, capture_output=True, timeout=120)
            return r.returncode, r.stderr.decode()
        master, slave = pty.openpty()
        try:
            proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.DEVNULL, stderr=slave)
            os.close(slave)
            out = b""
            while True:
                try:
                    chunk = os.read(master, 4096)
                except OSError:                # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            return proc.wait(timeout=120), out.decode()
        finally:
            os.close(master)


def test_cli_produce_shows_progress_on_a_terminal_and_nothing_in_a_pipe(tmp_path):
    code, err = _produce(tmp_path / "tty", 30_000, stderr_tty=True)
    assert code == 0
    last = err.replace("\r\n", "\n").split("\r")[-1].strip()
    assert last.startswith("produce to orders: 30,000 records in"), err[-300:]
    code, err = _produce(tmp_path / "pipe", 3_000, stderr_tty=False)
    assert code == 0 and err == ""

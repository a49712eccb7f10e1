"""Small helpers shared by the test modules (import as `from helpers import ...`)."""

from __future__ import annotations

from pathlib import Path

from kstore import Record

FIXTURES = Path(__file__).parent / "fixtures"
KAFKA_LOGS = FIXTURES / "kafka-kraft-logs"
T0 = 1_700_000_000_000


def records(n: int, start: int = 0, size: int = 10, ts: int = T0) -> list[Record]:
    """n keyed records k<start>..; value = a letter repeated `size` times; timestamps ts+i."""
    return [Record(f"k{i}".encode(), bytes([65 + i % 26]) * size, ts + i)
            for i in range(start, start + n)]


def serve_log_dir(log_dir, cwd=None, port=None, overrides=(), env=None):
    """`kstore serve` on a log directory, on `port` or a free one, with `--override` for each of
    `overrides` ("name=value") and `env` as its environment (None: this one's): (process,
    "127.0.0.1:port") once it accepts connections."""
    import socket
    import subprocess
    import sys
    import time
    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "kstore", "serve", "--log-dir", str(log_dir), "--port",
                             str(port), *(f"--override={o}" for o in overrides)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"kstore serve did not start: {proc.stdout.read()!r}")
            time.sleep(0.1)


def start_and_kill(argv: list[str], ready: bytes, max_delay_s: float, rng) -> bool:
    """Run `argv`; once it prints the line `ready`, wait a random moment up to max_delay_s and
    SIGKILL it if it is still running. True if it was killed (it may have finished first)."""
    import signal
    import subprocess
    import time
    child = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == ready + b"\n"
        time.sleep(rng.uniform(0, max_delay_s))
        killed = child.poll() is None
        if killed:
            child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        child.stdout.close()
    assert child.returncode in (0, -signal.SIGKILL), child.returncode
    return killed

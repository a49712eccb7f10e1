"""`kstore` / `python -m kstore`: the command line, run as a real process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from helpers import records
from kstore import Log
from kstore.records import build_batch


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kstore", *args], capture_output=True, text=True,
                          check=check)


def test_help_lists_dump_log():
    out = run("--help").stdout
    assert "dump-log" in out
    assert run("--version").stdout.startswith("kstore ")


def test_console_script_is_installed():
    exe = shutil.which("kstore", path=os.path.dirname(sys.executable))
    assert exe, "the `kstore` console script is missing from the venv"
    out = subprocess.run([exe, "dump-log", "--help"], capture_output=True, text=True, check=True)
    assert "--print-data-log" in out.stdout and "--index-sanity-check" in out.stdout


def test_dump_log_of_a_kstore_segment(tmp_path, clock):
    log = Log.open(str(tmp_path / "orders-0"), {"index.interval.bytes": 50}, clock)
    for i in range(6):
        log.append_as_leader(build_batch(records(2, start=2 * i)), leader_epoch=3)
    log.close()
    seg = tmp_path / "orders-0" / "00000000000000000000"
    out = run("dump-log", f"{seg}.log", "--print-data-log").stdout
    assert out.count("baseOffset:") == 6 and out.count("| offset:") == 12
    assert "partitionLeaderEpoch: 3" in out and "isvalid: true" in out
    assert "key: k0 payload: AAAAAAAAAA" in out
    idx = run("dump-log", f"--files={seg}.index,{seg}.timeindex").stdout
    assert "offset: " in idx and "timestamp: " in idx
    assert "Mismatches" not in run("dump-log", f"{seg}.index").stderr


def test_dump_log_reports_invalid_trailing_bytes_and_bad_files(tmp_path, clock):
    log = Log.open(str(tmp_path / "t-0"), None, clock)
    log.append_as_leader(build_batch(records(2)))
    log.close()
    seg = tmp_path / "t-0" / "00000000000000000000.log"
    with open(seg, "ab") as f:
        f.write(b"\x00" * 30)
    # a zeroed tail stops the dump (Kafka's tool dies there too): said, and a non-zero exit
    zeroed = run("dump-log", str(seg), check=False)
    assert "Found 30 invalid bytes at the end of 00000000000000000000.log" in zeroed.stdout
    assert "stopped at position" in zeroed.stderr and zeroed.returncode == 1
    bad = run("dump-log", str(tmp_path / "missing.log"), check=False)
    assert bad.returncode == 1 and "no such file" in bad.stderr
    (tmp_path / "x.txt").write_text("hi")
    other = run("dump-log", str(tmp_path / "x.txt"), check=False)
    assert other.returncode == 1 and "Ignoring unknown file" in other.stderr
    assert run("dump-log", check=False).returncode == 2      # no files given
    assert run(check=False).returncode == 2                  # no command given

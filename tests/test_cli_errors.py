"""Bad command lines get one clear line and exit 1, and create nothing; dump-log reads KRaft
snapshots and prints header keys as Kafka's DumpLogSegments does."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import KAFKA_LOGS
from kstore.broker import Broker
from kstore.records import Record, build_batch

ROOT = Path(__file__).resolve().parents[1]


def kstore_process(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kstore", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


@pytest.fixture
def kstore(capsys):
    """The `kstore` command's main() in this process (the same code as the console script; one
    test below runs the real process)."""
    from kstore.cli import main

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        code = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)
    return run


def assert_one_line(run: subprocess.CompletedProcess, *fragments: str) -> None:
    assert run.returncode == 1, (run.returncode, run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("tool", [
    ["get-offsets"], ["topics", "--list"], ["topics", "--describe"],
    ["consumer-groups", "--list"], ["consumer-groups", "--describe", "--group", "g"],
    ["consume", "--topic", "t"],
])
def test_read_only_tools_refuse_a_missing_log_dir_and_create_nothing(tmp_path, tool, kstore):
    missing = tmp_path / "nonexistent" / "dir"
    run = kstore(*tool, "--log-dir", str(missing))
    assert_one_line(run, f"log directory {missing} does not exist")
    assert not (tmp_path / "nonexistent").exists()


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli") / "logs"
    with Broker(str(d)) as broker:
        broker.create_topic("t", 1)
        broker.produce("t", 0, build_batch([Record(b"k", b"v", 1_700_000_000_000)]))
    return d


@pytest.mark.parametrize("args,fragments", [
    (["consume", "--topic", "t", "--partition", "0", "--offset", "-5"],
     ["the offset value '-5' is incorrect", "non-negative"]),
    (["consume", "--topic", "t", "--partition", "0", "--offset", "x1"],
     ["the offset value 'x1' is incorrect"]),
    (["consume", "--topic", "t", "--timestamp", "-5"], ["--timestamp", "not -5"]),
    (["get-offsets", "--time", "-5"], ["malformed --time '-5'", "-1 or latest"]),
    (["get-offsets", "--time", "soon"], ["malformed --time 'soon'"]),
    (["topics", "--create", "--topic", "u", "--replication-factor", "0"],
     ["replication factor must be between 1 and 32767 inclusive, not 0"]),
    (["topics", "--create", "--topic", "u", "--replication-factor", "-1"],
     ["replication factor must be between 1 and 32767"]),
    (["topics", "--create", "--topic", "u", "--partitions", "0"], ["partitions must be greater than 0"]),
])
def test_bad_numbers_get_one_line(log_dir, args, fragments, kstore):
    run = kstore(*args, "--log-dir", str(log_dir))
    assert_one_line(run, *fragments)
    assert kstore("topics", "--list", "--log-dir", str(log_dir)).stdout == "t\n"   # no topic u


def test_the_kafka_spellings_of_times_still_work(log_dir, kstore):
    for time, expected in (("-1", "t:0:1"), ("-2", "t:0:0"), ("-3", "t:0:0"), ("0", "t:0:0")):
        run = kstore("get-offsets", "--time", time, "--log-dir", str(log_dir))
        assert run.returncode == 0 and run.stdout.strip() == expected, (time, run.stderr)


def test_dump_log_prints_kraft_snapshots_as_kafka_does(tmp_path):
    kstore = kstore_process
    bootstrap = KAFKA_LOGS / "e856b9a" / "bootstrap.checkpoint"
    run = kstore("dump-log", "--deep-iteration", str(bootstrap))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[1] == "KRaft bootstrap snapshot"
    assert lines[2].startswith("baseOffset: 0 lastOffset: 0 count: 1 ")
    assert "isControl: true" in lines[2] and "isvalid: true" in lines[2]
    assert lines[3].endswith('headerKeys: [] SnapshotHeader {"version":0,"lastContainedLogTimestamp":0}')
    assert lines[-1].endswith('headerKeys: [] SnapshotFooter {"version":0}')
    assert len([line for line in lines if line.startswith("baseOffset:")]) == 3
    # a metadata snapshot is named <end offset>-<epoch>.checkpoint
    snapshot = tmp_path / "00000000000000000116-0000000003.checkpoint"
    shutil.copy(bootstrap, snapshot)
    run = kstore("dump-log", str(snapshot))
    assert run.returncode == 0 and run.stdout.splitlines()[1] == "Snapshot end offset: 116, epoch: 3"


def test_dump_log_header_keys_as_kafka_prints_them(tmp_path):
    kstore = kstore_process
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(build_batch([Record(b"k", b"v", 1_700_000_000_000,
                                            headers=(("a", b"1"), ("b", None), ("c", b"")))]))
    run = kstore("dump-log", "--deep-iteration", str(segment))
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1].endswith("headerKeys: [a,b,c]")


def test_the_real_command_prints_one_line_and_creates_nothing(tmp_path):
    missing = tmp_path / "nonexistent" / "dir"
    run = kstore_process("get-offsets", "--log-dir", str(missing))
    assert_one_line(run, f"kstore get-offsets: LogError: log directory {missing} does not exist")
    assert not (tmp_path / "nonexistent").exists()


@pytest.mark.parametrize("override, fragment", [
    ("socket.send.buffer.bytes=-5",
     "Invalid value -5 for configuration socket.send.buffer.bytes: Value must be at least -1"),
    ("num.partitions=many", "Invalid value 'many' for configuration num.partitions"),
])
def test_serve_with_a_bad_override_says_one_line_and_starts_nothing(tmp_path, override, fragment):
    """The config is checked first: no log line, no log directory, no port taken."""
    log_dir = tmp_path / "logs"
    run = kstore_process("serve", "--log-dir", str(log_dir), "--port", "0", "--override", override)
    assert_one_line(run, fragment)
    assert run.stdout == "" and not log_dir.exists()

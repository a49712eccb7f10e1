"""A Kafka operator's tools on damaged copies of a log dir a real Kafka broker wrote.

Each case damages a copy of tests/fixtures/kafka-kraft-logs/e856b9a the way disks, crashes and
hurried hands do, then runs kstore's command line on it. The bar: one clear line naming the
problem, a non-zero exit when the tool cannot do its job, no byte of the directory changed by a
tool that refuses or only reads, and a broker that says what its recovery cut.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from kstore.broker import Broker
from kstore.metadata_image import load_metadata_image
from test_broker_clients import snapshot as tree_contents
from test_cli_errors import assert_one_line, kstore  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[1]
FOO_LOG = "foo-0/00000000000000000000.log"
METADATA = "__cluster_metadata-0"
METADATA_INDEX = f"{METADATA}/00000000000000000000.index"
METADATA_LOG = f"{METADATA}/00000000000000000000.log"


def kstore_process(*args: str) -> subprocess.CompletedProcess:
    """The real command; `serve` must refuse at once, and a broker that started instead fails
    the test on the timeout rather than hanging it."""
    return subprocess.run([sys.executable, "-m", "kstore", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)


def refused(tool: list[str], log_dir: Path, kstore) -> subprocess.CompletedProcess:  # noqa: F811
    run = kstore_process if tool[0] == "serve" else kstore
    return run(*tool, "--log-dir", str(log_dir))


@pytest.fixture
def log_dir(kafka_logs) -> Path:
    return kafka_logs / "e856b9a"


def flip(path: Path, position: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- meta.properties
@pytest.mark.parametrize("damage", ["garbage", "no node.id", "missing"])
def test_a_kraft_dir_without_a_usable_meta_properties_is_refused_and_left_alone(log_dir, damage,
                                                                              kstore):  # noqa: F811
    """Guessing node 0 served Kafka's partitions as hosted by nobody, under a new cluster id."""
    props = log_dir / "meta.properties"
    if damage == "missing":
        props.unlink()
    else:
        props.write_text("\x00\x01garbage" if damage == "garbage" else "cluster.id=x\nversion=1\n")
    before = tree_contents(log_dir)
    for tool in (["get-offsets"], ["topics", "--describe"], ["serve", "--port", "0"]):
        run = refused(tool, log_dir, kstore)
        assert_one_line(run, "meta.properties", "missing" if damage == "missing" else "node.id")
    assert tree_contents(log_dir) == before


# ---------------------------------------------------------------- the KRaft metadata log
def _missing_index(log_dir: Path) -> None:
    (log_dir / METADATA_INDEX).unlink()


def _odd_index(log_dir: Path) -> None:
    with open(log_dir / METADATA_INDEX, "r+b") as f:
        f.truncate(5)


def _log_shorter_than_its_index(log_dir: Path) -> None:
    with open(log_dir / METADATA_LOG, "r+b") as f:   # the index points at position 4123
        f.truncate(4000)


@pytest.mark.parametrize("damage", [_missing_index, _odd_index, _log_shorter_than_its_index],
                         ids=["missing-index", "odd-index", "log-shorter-than-index"])
def test_a_damaged_metadata_log_index_stops_neither_the_tools_nor_the_broker(log_dir, damage):
    """kstore only replays KRaft's log (from its .log files): its index is not needed, and
    it was the reason every tool and `kstore serve` refused the whole directory."""
    damage(log_dir)
    metadata_before = tree_contents(log_dir / METADATA)
    run = kstore_process("get-offsets", "--log-dir", str(log_dir))
    assert run.returncode == 0 and run.stdout == "foo:0:3\n", run.stderr
    warning = run.stderr.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith(f"{METADATA} not loaded"), run.stderr
    assert "read-only tools never rebuild" not in warning[0]   # no advice that does not apply
    with Broker(str(log_dir)) as broker:   # the broker `kstore serve` runs
        assert broker.describe_topic("foo").topic_id == "fZi4qEpCTsik-rzkyV0Ypg"
        assert broker.list_offsets("foo", 0, -1).offset == 3
    assert tree_contents(log_dir / METADATA) == metadata_before


def test_a_damaged_metadata_batch_is_named_with_its_file_and_offset(log_dir, kstore):  # noqa: F811
    flip(log_dir / METADATA_LOG, 5000, 0xFF)
    before = tree_contents(log_dir)
    for tool in (["topics", "--list"], ["serve", "--port", "0"]):
        run = refused(tool, log_dir, kstore)
        assert_one_line(run, str(log_dir / METADATA_LOG), "batch at offset 67")
    after = tree_contents(log_dir)
    assert after.pop(".lock", b"") == b""   # the empty lock file a starting broker takes, as Kafka's
    assert after == before


# ---------------------------------------------------------------- where the log dir is
def test_a_log_dir_that_is_a_file_gets_one_line(tmp_path, kstore):  # noqa: F811
    path = tmp_path / "logs"
    path.write_text("not a directory")
    for tool in (["serve", "--port", "0"], ["topics", "--list"], ["produce", "--topic", "t"]):
        run = refused(tool, path, kstore)
        assert_one_line(run, f"log directory {path} is not a directory")
    assert path.read_text() == "not a directory"


def test_a_file_the_broker_cannot_open_gets_one_line_not_a_traceback(log_dir):
    """Permissions, a directory where a file should be...: the OS error, with its path. (A
    `.lock` directory stands in for an unwritable file, which root could still write.)"""
    (log_dir / ".lock").mkdir()
    run = kstore_process("serve", "--port", "0", "--log-dir", str(log_dir))
    assert_one_line(run, "kstore serve: IsADirectoryError", str(log_dir / ".lock"))


# ---------------------------------------------------------------- recovery says what it did
def test_recovery_of_a_kafka_log_says_what_it_cut(log_dir, caplog):
    (log_dir / ".kafka_cleanshutdown").unlink()           # a crash...
    with open(log_dir / FOO_LOG, "r+b") as f:
        f.truncate(120)                                    # ...in the middle of the 2nd batch
    with caplog.at_level(logging.WARNING, logger="kstore"):
        with Broker(str(log_dir)) as broker:
            assert broker.list_offsets("foo", 0, -1).offset == 2   # the whole 1st batch is kept
    said = [r.getMessage() for r in caplog.records if r.name == "kstore.log_manager"]
    assert said == ["foo-0: truncated 40 invalid byte(s) at the end of segment 0"]
    assert (log_dir / FOO_LOG).stat().st_size == 80


def test_a_clean_load_says_nothing(log_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="kstore"):
        Broker(str(log_dir)).close()
    assert [r for r in caplog.records if r.name == "kstore.log_manager"] == []


# ---------------------------------------------------------------- dump-log
def test_dump_log_of_a_damaged_batch_prints_what_is_before_it_and_fails(log_dir):
    segment = log_dir / FOO_LOG
    flip(segment, 149)                                     # inside the 2nd batch's last record
    run = kstore_process("dump-log", "--deep-iteration", str(segment))
    assert run.returncode == 1
    lines = run.stdout.splitlines()
    assert lines[2].startswith("baseOffset: 0 lastOffset: 1 ") and lines[2].endswith("isvalid: true")
    assert lines[5].startswith("baseOffset: 2 ") and lines[5].endswith("isvalid: false")
    assert run.stderr.strip().splitlines() == [
        "00000000000000000000.log: stopped at position 80: found invalid number of record "
        "headers -1"]


def test_dump_log_prints_a_producer_snapshot_as_kafka_does(log_dir):
    run = kstore_process("dump-log", str(log_dir / "foo-0" / "00000000000000000003.snapshot"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[1] == (   # currentTxnFirstOffset is a Java OptionalLong
        "producerId: 0 producerEpoch: 0 coordinatorEpoch: -1 currentTxnFirstOffset: "
        "OptionalLong.empty lastTimestamp: 1725272041932 firstSequence: 2 lastSequence: 2 "
        "lastOffset: 2 offsetDelta: 0 timestamp: 1725272041932")


# ---------------------------------------------------------------- bad command lines
@pytest.mark.parametrize("args,fragments", [
    (["serve", "--port", "99999"], ["--port must be between 0 and 65535", "not 99999"]),
    (["serve", "--port", "-1"], ["--port must be between 0 and 65535"]),
    (["serve", "--port", "0", "--broker-id", "-1"], ["--broker-id must be between 0 and 2147483647"]),
    (["consumer-groups", "--describe"], ["need --group"]),
    (["produce", "--topic", "foo", "--compression-codec", "brotli"],
     ["--compression-codec: unknown compression type 'brotli'"]),
    (["produce", "--topic", "foo", "--linger-ms", "-1"], ["--linger-ms must be 0 or more"]),
    (["produce", "--topic", "foo", "--partition", "-2"], ["--partition must be 0 or more"]),
    (["consumer-groups", "--reset-offsets", "--group", "g", "--topic", "foo:x", "--to-earliest",
      "--execute"], ["--topic 'foo:x'", "partition numbers"]),
])
def test_bad_arguments_get_one_line_and_change_nothing(log_dir, args, fragments, kstore):  # noqa: F811
    before = tree_contents(log_dir)
    assert_one_line(refused(args, log_dir, kstore), *fragments)
    assert tree_contents(log_dir) == before


def test_a_cluster_broker_needs_a_fixed_port(tmp_path):
    """It registers host:port for the other brokers before binding: port 0 was registered."""
    run = kstore_process("serve", "--cluster-dir", str(tmp_path / "c"), "--broker-id", "0",
                         "--port", "0")
    assert_one_line(run, "--cluster-dir needs a fixed --port")
    assert not (tmp_path / "c").exists()


def test_max_messages_minus_one_means_no_limit_as_in_kafka(log_dir, kstore):  # noqa: F811
    run = kstore("consume", "--log-dir", str(log_dir), "--topic", "foo", "--from-beginning",
                 "--max-messages", "-1")
    assert run.returncode == 0 and run.stdout == "m1\nm2\nm3\n", run.stderr


# ---------------------------------------------------------------- kafka-consumer-groups' columns
def test_consumer_groups_tables_have_kafkas_column_widths(tmp_path, kstore):  # noqa: F811
    """ConsumerGroupCommand pads with printf: names to at least 15, PARTITION to 10, offsets
    to 15, the last column not at all; an operator's scripts cut its output by column."""
    from kstore.records import Record, build_batch
    log_dir = tmp_path / "logs"
    with Broker(str(log_dir)) as broker:
        broker.create_topic("t", 1)
        broker.produce("t", 0, build_batch([Record(b"k", b"v", 1_700_000_000_000)] * 3))
        broker.group_coordinator.commit_offsets("g", {("t", 0): 1})
    offsets = "\n%-15s %-15s %-10s %-15s %-15s %-15s %-15s %-15s %s"
    run = kstore("consumer-groups", "--log-dir", str(log_dir), "--describe", "--group", "g")
    assert run.returncode == 0, run.stderr
    assert run.stdout == (offsets % ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET",
                                     "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID")
                          + offsets % ("g", "t", 0, 1, 3, 2, "-", "-", "-") + "\n")
    run = kstore("consumer-groups", "--log-dir", str(log_dir), "--describe", "--group", "g",
                 "--members")
    assert run.stdout == "\n%-15s %-15s %-15s %-15s %-15s \n" % (
        "GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS")
    run = kstore("consumer-groups", "--log-dir", str(log_dir), "--reset-offsets", "--group", "g",
                 "--topic", "t", "--to-earliest", "--dry-run")
    reset = "\n%-15s %-15s %-10s %s"
    assert run.stdout == (reset % ("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")
                          + reset % ("g", "t", 0, 0) + "\n")


# ---------------------------------------------------------------- kafka-dump-log.sh's options
def test_dump_log_options_an_operator_copies_from_kafka(log_dir, tmp_path):
    segment = log_dir / FOO_LOG
    run = kstore_process("dump-log", "--print-data-log", "--skip-record-metadata", str(segment))
    assert run.returncode == 0, run.stderr
    # Kafka's own spacing: without a key the line starts with " payload:"
    assert [line for line in run.stdout.splitlines() if "payload" in line] == [
        " payload: m1", " payload: m2", " payload: m3"]
    run = kstore_process("dump-log", "--max-bytes", "100", str(segment))   # only the 80-byte batch
    lines = run.stdout.splitlines()
    assert run.returncode == 0 and len(lines) == 3 and lines[2].startswith("baseOffset: 0 ")
    index = tmp_path / "00000000000000000000.index"
    index.write_bytes((1).to_bytes(4, "big") + (80).to_bytes(4, "big"))   # offset 1 is not at 80
    (tmp_path / "00000000000000000000.log").write_bytes(segment.read_bytes())
    run = kstore_process("dump-log", "--verify-index-only", str(index))
    assert run.stdout.splitlines()[1:] == []   # no entries printed, only the mismatch
    assert run.stderr.splitlines() == [f"Mismatches in :{index}", "  Index offset: 1, log offset: 2"]
    assert kstore_process("dump-log", "--max-message-size", "1048576", str(segment)).returncode == 0


def test_dump_log_lists_non_consecutive_offsets_as_kafka_does(tmp_path):
    from kstore.records import Record, build_batch
    segment = tmp_path / "00000000000000000000.log"   # a compacted log: offsets 0, 1, then 5
    segment.write_bytes(build_batch([Record(b"a", b"1", 1), Record(b"b", b"2", 2)])
                        + build_batch([Record(b"a", b"3", 3)], base_offset=5))
    run = kstore_process("dump-log", "--deep-iteration", str(segment))
    assert run.returncode == 0 and run.stdout.count("| offset:") == 3
    assert run.stderr.splitlines() == [f"Non-consecutive offsets in {segment}",
                                       "  1 is followed by 5"]


def test_dump_log_checks_a_time_index_against_its_segment(log_dir):
    """Kafka's tool checks each time index entry against the batch it points at; the files the
    real broker wrote pass, a damaged entry is listed in Kafka's words."""
    timeindex = log_dir / METADATA / "00000000000000000000.timeindex"
    run = kstore_process("dump-log", str(timeindex))
    assert run.returncode == 0 and run.stderr == "" and run.stdout.count("timestamp: ") == 3
    data = bytearray(timeindex.read_bytes())
    data[12:20] = (1725272038000).to_bytes(8, "big")   # the 2nd entry now goes back in time
    timeindex.write_bytes(bytes(data))
    run = kstore_process("dump-log", str(timeindex))
    assert run.returncode == 0
    assert run.stderr.splitlines() == [
        f"Found timestamp mismatch in :{timeindex}",
        "  Index timestamp: 1725272038000, log timestamp: 1725272048281",
        f"Found out of order timestamp in :{timeindex}",
        "  Index timestamp: 1725272038000, Previously indexed timestamp: 1725272038072"]


@pytest.mark.parametrize("args,fragment", [
    (["--config", "retention.ms=abc"], "Invalid value 'abc' for configuration retention.ms"),
    (["--config", "no.such=1"], "Unknown topic config name: no.such"),
    (["--config", "retention.ms"], "--config takes name=value, got 'retention.ms'"),
    (["--topic", "a b"], "topic name 'a b' is illegal"),
])
def test_a_refused_create_writes_nothing_in_a_new_log_dir(tmp_path, args, fragment, kstore):  # noqa: F811
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    run = kstore("topics", "--log-dir", str(log_dir), "--create", "--topic", "t", *args)
    assert_one_line(run, fragment)
    assert list(log_dir.iterdir()) == []   # no meta.properties, checkpoints, metadata file


# ---------------------------------------------------------------- serving a Kafka dir
def test_new_producer_ids_start_above_those_kafka_handed_out(log_dir):
    """The metadata log's ProducerIdsRecord says Kafka's controller gave out ids 0-999; a
    producer of the Kafka broker (id 0 in foo-0's snapshot) must not meet a new one with its id."""
    assert load_metadata_image(str(log_dir)).next_producer_id == 1000
    with Broker(str(log_dir)) as broker:
        assert broker.allocate_producer_id() == 1000


def test_the_broker_says_when_it_drops_a_torn_producer_snapshot(log_dir, caplog):
    with open(log_dir / "foo-0" / "00000000000000000003.snapshot", "r+b") as f:
        f.truncate(20)
    with caplog.at_level(logging.WARNING, logger="kstore"):
        with Broker(str(log_dir)) as broker:
            assert broker.list_offsets("foo", 0, -1).offset == 3
    said = [r.getMessage() for r in caplog.records if r.name.startswith("kstore.")]
    assert len(said) == 1 and said[0].startswith(
        "foo-0: deleted unreadable producer snapshot 00000000000000000003.snapshot (")


def test_recovery_says_when_every_segment_is_gone(log_dir, caplog):
    (log_dir / FOO_LOG).unlink()                           # a segment lost with its data
    with caplog.at_level(logging.WARNING, logger="kstore"):
        with Broker(str(log_dir)) as broker:
            assert broker.list_offsets("foo", 0, -1).offset == 0
    said = [r.getMessage() for r in caplog.records if r.name.startswith("kstore.")]
    assert "foo-0: no segment (.log) file was left: the log starts empty at offset 0" in said
    assert "foo-0: deleted 00000000000000000000.index" in said


def test_serve_on_port_0_prints_the_port_it_got_and_a_real_client_reads_there(log_dir):
    """An operator starts `kstore serve --port 0` on a copy of Kafka's dir (its metadata index
    lost), reads the port from the banner and points confluent-kafka at it. The banner said
    port 0, and came before the socket was bound."""
    import re
    import signal
    from test_clients import ck_consume
    (log_dir / METADATA_INDEX).unlink()
    proc = subprocess.Popen([sys.executable, "-m", "kstore", "serve", "--log-dir", str(log_dir),
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=ROOT)
    try:
        lines = []
        for line in proc.stdout:   # ends when the process does: a refused start fails below
            lines.append(line)
            if " serving " in line:
                break
        banner = re.search(r"serving .* on 127\.0\.0\.1:(\d+) ", lines[-1])
        assert banner and int(banner.group(1)) > 0, "".join(lines)
        records = ck_consume(f"127.0.0.1:{banner.group(1)}", "foo", 0)
        assert [r["value"] for r in records] == [b"m1", b"m2", b"m3"]
    finally:
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0 and "stopped cleanly" in rest
    assert any(line.startswith("[") and f"WARNING {METADATA} not loaded" in line for line in lines)


# ---------------------------------------------------------------- kstore's own metadata file
@pytest.fixture
def kstore_dir(tmp_path) -> Path:
    from kstore.records import Record, build_batch
    log_dir = tmp_path / "logs"
    with Broker(str(log_dir)) as broker:
        broker.create_topic("t", 2)
        broker.produce("t", 1, build_batch([Record(b"k", b"v", 1_700_000_000_000)]))
    return log_dir


def test_a_torn_metadata_file_gets_one_line(kstore_dir, kstore):  # noqa: F811
    (kstore_dir / "kstore-cluster-metadata.json").write_text("{garbage")
    before = tree_contents(kstore_dir)
    for tool in (["topics", "--describe"], ["serve", "--port", "0"]):
        run = refused(tool, kstore_dir, kstore)
        assert_one_line(run, "kstore-cluster-metadata.json is not valid JSON")
    assert tree_contents(kstore_dir) == before


def test_a_lost_metadata_file_is_not_replaced_by_a_new_empty_cluster(kstore_dir, kstore):  # noqa: F811
    """Kafka refuses a dir whose meta.properties names another cluster; kstore started a new
    one there, and topic t, still on disk, vanished from every tool and client."""
    (kstore_dir / "kstore-cluster-metadata.json").unlink()
    before = tree_contents(kstore_dir)
    for tool in (["topics", "--describe"], ["serve", "--port", "0"]):
        run = refused(tool, kstore_dir, kstore)
        assert_one_line(run, "meta.properties says the directory belongs to cluster",
                        "kstore-cluster-metadata.json, which holds its topics, is missing")
    assert tree_contents(kstore_dir) == before


def test_a_refused_start_leaves_the_directory_unlocked(log_dir):
    """In a notebook the process lives on: a broker that refused to start held the lock, and
    every retry, even after the damage was repaired, found the directory "in use"."""
    props = log_dir / "meta.properties"
    good = props.read_text()
    props.write_text("garbage\n")
    with pytest.raises(Exception, match="no valid node.id"):
        Broker(str(log_dir))
    (log_dir / "kstore-cluster-metadata.json").write_text("{")   # fails after the lock is taken
    props.write_text(good)
    with pytest.raises(Exception, match="not valid JSON"):
        Broker(str(log_dir))
    (log_dir / "kstore-cluster-metadata.json").unlink()
    with Broker(str(log_dir)) as broker:                         # repaired: it starts
        assert broker.list_offsets("foo", 0, -1).offset == 3


def test_the_engine_in_a_notebook_stays_quiet_and_the_tools_speak(log_dir):
    """The recovery warnings are for `kstore serve` and the CLI; the engine used as a library
    (the chapters) writes nothing to stderr, whatever it repairs."""
    (log_dir / ".kafka_cleanshutdown").unlink()
    with open(log_dir / FOO_LOG, "r+b") as f:
        f.truncate(120)
    code = ("from kstore.broker import Broker\n"
            f"Broker({str(log_dir)!r}).close()\n")
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=ROOT, timeout=60)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    (log_dir / METADATA_INDEX).unlink()
    run = kstore_process("topics", "--list", "--log-dir", str(log_dir))
    assert run.stdout == "foo\n" and run.stderr.startswith(f"{METADATA} not loaded")


@pytest.mark.parametrize("name,reset", [
    ("recovery-point-offset-checkpoint", "resetting the recovery checkpoint to 0"),
    ("log-start-offset-checkpoint", "resetting to the base offset of the first segment"),
])
def test_an_unreadable_offset_checkpoint_costs_recovery_not_the_start(log_dir, name, reset, caplog):
    """Kafka's LogManager warns and resets (it refused to start in kstore); after a crash the
    reset recovery point means every segment is recovered: the torn tail is still cut."""
    (log_dir / name).write_text("0\n1\nfoo zero 3\n")
    (log_dir / ".kafka_cleanshutdown").unlink()
    with open(log_dir / FOO_LOG, "ab") as f:
        f.write(b"\x00" * 64)
    with caplog.at_level(logging.WARNING, logger="kstore"):
        with Broker(str(log_dir)) as broker:
            assert broker.list_offsets("foo", 0, -1).offset == 3
            assert broker.list_offsets("foo", 0, -2).offset == 0
    said = [r.getMessage() for r in caplog.records if r.name == "kstore.log_manager"]
    assert said[0].startswith(f"Error occurred while reading {name}, {reset}: ")
    assert "foo-0: truncated 64 invalid byte(s) at the end of segment 0" in said[1]
    assert (log_dir / FOO_LOG).stat().st_size == 150

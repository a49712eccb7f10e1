"""A flipped byte inside a stored record value is caught by every read path kstore owns.

Kafka's consumers check each batch's CRC-32C (`check.crcs`, default true) and raise
CorruptRecordException; kstore's Consumer, `kstore consume` (offline and against `kstore serve`)
and the Spark source's two readers do the same, with one error naming topic, partition, offset
and, where the bytes came from a file, the file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kstore.broker import Broker
from kstore.consumer import Consumer
from kstore.errors import CorruptRecordError
from kstore.producer import Producer
from kstore.records import MemoryRecords, batch_crc_mismatch, check_batch
from kstore.remote_broker import RemoteBroker
from test_clients import serve_processes  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[1]
TOPIC = "crc"
VALUES = [f"value-{i:03d}" for i in range(30)]
CORRUPT_VALUE = "value-017"
FLIPPED_VALUE = "value-117"      # what the flip turns it into


@pytest.fixture
def corrupt_dir(tmp_path) -> tuple[Path, int]:
    """A log dir whose `crc-0` holds VALUES in several batches, one byte of one value flipped.
    Returns the dir and the base offset of the damaged batch."""
    log_dir = tmp_path / "logs"
    with Broker(str(log_dir)) as broker:
        broker.create_topic(TOPIC, 1)
        producer = Producer(broker, batch_size=200, linger_ms=0)
        for v in VALUES:
            producer.send(TOPIC, v)
        producer.close()
    segment = log_dir / f"{TOPIC}-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    at = data.index(CORRUPT_VALUE.encode()) + len("value-")
    data[at] ^= 0x01                       # '0' -> '1': still valid UTF-8, only the CRC knows
    segment.write_bytes(bytes(data))
    damaged = next(b for b in MemoryRecords(bytes(data)).batches()
                   if b.position <= at < b.position + b.size_in_bytes)
    assert len(MemoryRecords(bytes(data)).batches()) > 2   # good batches on both sides
    return log_dir, damaged.base_offset


def expected_message(base_offset: int) -> str:
    return f"Record batch for partition {TOPIC}-0 at offset {base_offset}"


def test_one_function_checks_a_batch(corrupt_dir):
    log_dir, base = corrupt_dir
    data = (log_dir / f"{TOPIC}-0" / "00000000000000000000.log").read_bytes()
    batches = MemoryRecords(data).batches()
    bad = [b for b in batches if batch_crc_mismatch(b.buffer) is not None]
    assert [b.base_offset for b in bad] == [base]
    stored, computed = batch_crc_mismatch(bad[0].buffer)
    with pytest.raises(CorruptRecordError) as e:
        check_batch(bad[0].buffer, topic=TOPIC, partition=0, file="x.log", file_position=7)
    assert str(e.value) == (f"{expected_message(base)} (file x.log, position 7) is invalid, "
                            f"cause: Record is corrupt (stored crc = {stored}, computed crc = "
                            f"{computed})")


def test_consumer_raises_naming_topic_partition_offset_and_file(corrupt_dir):
    log_dir, base = corrupt_dir
    with Broker(str(log_dir), read_only=True) as broker:
        consumer = Consumer(broker, auto_offset_reset="earliest")
        consumer.assign([(TOPIC, 0)])
        got = []
        with pytest.raises(CorruptRecordError) as e:
            while batch := consumer.poll():
                got.extend(r.value.decode() for r in batch)
        message = str(e.value)
        assert message.startswith(expected_message(base))
        assert "00000000000000000000.log, position" in message and "stored crc" in message
        assert got == VALUES[:base]            # everything before the damaged batch, no more
        # check.crcs=false hands the damaged value over, as Kafka's consumer does
        unchecked = Consumer(broker, auto_offset_reset="earliest", check_crcs=False)
        unchecked.assign([(TOPIC, 0)])
        values = [r.value.decode() for b in iter(unchecked.poll, []) for r in b]
        assert len(values) == len(VALUES) and FLIPPED_VALUE in values


def kstore(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kstore", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def assert_one_line_error(run: subprocess.CompletedProcess, base: int, with_file: bool) -> None:
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert lines[0].startswith("kstore consume: CorruptRecordError: " + expected_message(base))
    assert ("00000000000000000000.log" in lines[0]) == with_file
    assert FLIPPED_VALUE not in run.stdout   # the damaged value is never printed
    assert run.stdout.splitlines() == VALUES[:base]


def test_kstore_consume_offline_and_against_a_broker(corrupt_dir, serve_processes):  # noqa: F811
    log_dir, base = corrupt_dir
    offline = kstore("consume", "--log-dir", str(log_dir), "--topic", TOPIC, "--from-beginning")
    assert_one_line_error(offline, base, with_file=True)
    unchecked = kstore("consume", "--log-dir", str(log_dir), "--topic", TOPIC, "--from-beginning",
                       "--consumer-property", "check.crcs=false")
    assert unchecked.returncode == 0 and len(unchecked.stdout.splitlines()) == len(VALUES)
    assert FLIPPED_VALUE in unchecked.stdout
    server = serve_processes(log_dir)
    online = kstore("consume", "--bootstrap-server", server.bootstrap, "--topic", TOPIC,
                    "--from-beginning", "--timeout-ms", "2000")
    assert_one_line_error(online, base, with_file=False)
    with RemoteBroker(server.bootstrap) as remote:   # the library path: RemoteBroker + Consumer
        consumer = Consumer(remote, auto_offset_reset="earliest")
        consumer.assign([(TOPIC, 0)])
        with pytest.raises(CorruptRecordError, match=expected_message(base)):
            for _ in range(50):
                consumer.poll()


def test_spark_source_readers_raise(corrupt_dir, serve_processes):  # noqa: F811
    pytest.importorskip("pyarrow")
    from kstore.spark.backends import LogDirBackend, NetworkBackend
    log_dir, base = corrupt_dir
    with LogDirBackend(str(log_dir)) as backend:
        with pytest.raises(CorruptRecordError) as e:
            list(backend.read_arrow(TOPIC, 0, 0, len(VALUES), include_headers=False))
    assert str(e.value).startswith(expected_message(base) + " (file ")
    assert "00000000000000000000.log, position" in str(e.value)
    server = serve_processes(log_dir)
    with NetworkBackend(server.bootstrap) as backend:
        with pytest.raises(CorruptRecordError, match=expected_message(base) + " is invalid"):
            list(backend.read_arrow(TOPIC, 0, 0, len(VALUES), include_headers=False))


def test_spark_source_kafka_check_crcs_false_reads_the_damaged_value(corrupt_dir, serve_processes):  # noqa: F811
    """`kafka.check.crcs=false` (Kafka's consumer option, default true) skips the check, as a
    Kafka consumer does: the flipped value comes through as it is stored."""
    pytest.importorskip("pyarrow")
    from kstore.spark.backends import LogDirBackend, NetworkBackend
    from kstore.spark.options import parse_source_options
    log_dir, _base = corrupt_dir
    assert parse_source_options({"path": str(log_dir), "subscribe": TOPIC}, False).check_crcs
    assert not parse_source_options({"path": str(log_dir), "subscribe": TOPIC,
                                     "kafka.check.crcs": "false"}, False).check_crcs
    server = serve_processes(log_dir)
    for backend in (LogDirBackend(str(log_dir)), NetworkBackend(server.bootstrap)):
        with backend:
            batches = list(backend.read_arrow(TOPIC, 0, 0, len(VALUES), include_headers=False,
                                              check_crcs=False))
        values = [v.decode() for b in batches for v in b.column(1).to_pylist()]
        assert values == [FLIPPED_VALUE if v == CORRUPT_VALUE else v for v in VALUES]

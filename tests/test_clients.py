"""The network broker against real Kafka clients and real sockets (issue 6).

Everything here talks to a listening broker over 127.0.0.1 — no mocks:

* `kstore serve` child PROCESSES (free ports found by binding to port 0; stopped with SIGTERM and
  required to exit 0 after a clean shutdown) for the client tests and the fault tests;
* an in-process `KafkaServer.start_in_thread()` where a test must read the server's `.stats`
  (zero-copy vs copy path) or needs a small `idle_timeout_s` (stalled connections).

1. kafka-python 3.x and confluent-kafka 2.x (librdkafka), unmodified: acks=1 and acks=all
   (idempotent), every compression codec each offers (checked in the stored batches), consumers
   with assign() from the beginning / an offset / a timestamp, commits with a group id, a broker
   restart resuming from the committed offsets, librdkafka's check.crcs=true (and a corrupted
   batch that the CRC checks must catch, so the clean runs mean something).
2. The stored files, after the broker stopped: kstore's engine (LogManager) and kafka-python's
   record parser (MemoryRecords, validate_crc() before iterating) read back every record.
3. Protocol-level checks with kstore's codec on a raw socket: zero-copy vs copy Fetch, long poll,
   min/max bytes, per-partition limits, HW/LSO, error codes, ApiVersions negotiation.
4. Faults against one running broker while a healthy kafka-python client keeps producing and
   consuming: malformed / truncated / oversized frames, unknown APIs, a seeded fuzz loop, clients
   vanishing mid-request and mid-response, stalls, 50 concurrent clients, pipelining — the broker
   stays up, the healthy client is unaffected, and the stored data of other topics is unchanged.

Every socket read has a timeout and every wait a deadline, so nothing can hang.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import confluent_kafka as ck
import kafka.errors
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.record.memory_records import MemoryRecords as KafkaPythonMemoryRecords
from kafka.structs import OffsetAndMetadata

from kstore import protocol as P
from kstore.broker import Broker
from kstore.compression import Compression, compress
from kstore.errors import ConfigError
from kstore.log_manager import LogManager
from kstore.records import MemoryRecords, Record, build_batch
from kstore.server import KafkaServer

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[1]
API = P.API_KEYS
E = P.ERRORS
# Record timestamps: an hour ago, well inside retention.ms (7 days). Fixed old timestamps would
# let the broker's retention task delete the test data half-way through the run.
T0 = (int(time.time()) - 3600) * 1000
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
MAX_REQUEST_SIZE = 104857600        # socket.request.max.bytes, the server's default


# ==========================================================================================
# Processes and sockets
# ==========================================================================================
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Conn:
    """A raw Kafka connection speaking kstore's codec: size-prefixed frames, header v1."""

    def __init__(self, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.cid = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Conn":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def frame(self, key: int, version: int, body: dict, cid: int | None = None) -> tuple[int, bytes]:
        if cid is None:
            self.cid += 1
            cid = self.cid
        payload = P.encode_request(key, version, cid, "kstore-test", body)
        return cid, struct.pack(">i", len(payload)) + payload

    def send(self, key: int, version: int, body: dict) -> int:
        cid, data = self.frame(key, version, body)
        self.sock.sendall(data)
        return cid

    def recv_exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def recv_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self.recv_exactly(4))
        assert 4 <= size < 1 << 30, f"implausible response size {size}"
        return self.recv_exactly(size)

    def recv(self, key: int, version: int, cid: int) -> dict:
        got, body = P.decode_response(key, version, self.recv_frame())
        assert got == cid, f"correlation id {got}, expected {cid}"
        return body

    def call(self, key: int, version: int, body: dict) -> dict:
        return self.recv(key, version, self.send(key, version, body))

    def closed_by_peer(self, timeout: float = 5.0) -> bytes | None:
        """Read until the broker closes the connection: the bytes received, or None on timeout."""
        self.sock.settimeout(timeout)
        got = bytearray()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return bytes(got)
                got += chunk
        except (ConnectionResetError, BrokenPipeError):
            return bytes(got)
        except socket.timeout:
            return None
        return None


def api_versions_ok(port: int, timeout: float = 5.0) -> bool:
    try:
        with Conn(port, timeout) as c:
            return c.call(API["ApiVersions"], 2, {})["error_code"] == 0
    except (OSError, ConnectionError, P.ProtocolError):
        return False


class ServeProcess:
    """`python -m kstore serve` as a child process on a free loopback port."""

    def __init__(self, log_dir: Path, *overrides: str, copy_fetch: bool = False, extra_args: tuple = ()):
        self.log_dir = Path(log_dir)
        self.extra_args = tuple(extra_args)     # e.g. ("--my-engine", FOLDER)
        self.overrides = overrides
        self.copy_fetch = copy_fetch
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.output = self.log_dir.parent / f"{self.log_dir.name}.serve-output.txt"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, port: int | None = None, timeout_s: float = 30.0) -> "ServeProcess":
        for _ in range(3):   # another process may take a free port between probe and bind
            self.port = port or free_port()
            cmd = [sys.executable, "-m", "kstore", "serve", "--log-dir", str(self.log_dir),
                   "--port", str(self.port)]
            if self.copy_fetch:
                cmd.append("--copy-fetch")
            for o in self.overrides:
                cmd += ["--override", o]
            cmd += self.extra_args
            with open(self.output, "ab") as out:
                self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self.proc.poll() is None:
                if api_versions_ok(self.port, 2.0):
                    return self
                time.sleep(0.05)
            if self.proc.poll() is None:
                self.kill()
                break
            time.sleep(0.5)
        raise AssertionError(f"kstore serve did not start on port {self.port}:\n{self.read_output()}")

    def read_output(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def stop(self, timeout_s: float = 30.0) -> str:
        """SIGTERM; the broker must shut down cleanly (exit status 0, clean-shutdown message)."""
        assert self.running(), f"the broker is not running:\n{self.read_output()}"
        before = len(self.read_output())
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"kstore serve ignored SIGTERM for {timeout_s} s") from None
        out = self.read_output()[before:]
        assert rc == 0, f"kstore serve exited with {rc}:\n{out}"
        assert "stopped cleanly" in out, out
        assert (self.log_dir / ".kafka_cleanshutdown").exists()
        return out

    def kill(self) -> None:
        if self.running():
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def serve_processes():
    """Start `kstore serve` processes; whatever a test leaves running is killed afterwards."""
    started: list[ServeProcess] = []

    def start(log_dir: Path, *overrides: str, **kwargs) -> ServeProcess:
        sp = ServeProcess(log_dir, *overrides, **kwargs)
        started.append(sp)
        return sp.start()

    yield start
    for sp in started:
        sp.kill()


# ==========================================================================================
# Records and the two clients
# ==========================================================================================
def make_records(tag: str, n: int, ts0: int = T0) -> list[dict]:
    """Compressible values; null keys, a null value, an empty value, binary bytes, unicode and
    repeated header keys, records without headers; CreateTime timestamps 10 ms apart."""
    out = []
    for i in range(n):
        key = None if i % 7 == 3 else f"{tag}-key-{i}".encode() + bytes([i % 256, 0, 255])
        if i == 5:
            value = None
        elif i == 6:
            value = b""
        else:
            value = f"{tag}|{i:05d}|".encode() + b"a compressible payload, " * 10 + bytes(range(8))
        headers = [] if i % 4 == 1 else [("trace", f"t{i}".encode()), ("ключ-ü", b"\x00\xff"),
                                         ("trace", b"")]
        out.append({"key": key, "value": value, "headers": headers, "timestamp": ts0 + 10 * i})
    return out


def expected(recs: list[dict], base: int = 0) -> list[dict]:
    return [{"offset": base + i, **r} for i, r in enumerate(recs)]


def chunks(items: list, n: int) -> list[list]:
    size = -(-len(items) // n)
    return [items[i:i + size] for i in range(0, len(items), size)]


def kp_produce(bootstrap: str, topic: str, partition: int, recs: list[dict], *, acks, codec: str,
               n_chunks: int = 3) -> list[int]:
    """kafka-python's producer, defaults otherwise (acks='all' is its idempotent default)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=acks, linger_ms=5,
                             compression_type=None if codec == "none" else codec,
                             request_timeout_ms=10000, max_block_ms=10000)
    try:
        assert producer.config["enable_idempotence"] == (acks == "all")
        futures = []
        for chunk in chunks(recs, n_chunks):
            for r in chunk:
                futures.append(producer.send(topic, key=r["key"], value=r["value"],
                                             headers=r["headers"], partition=partition,
                                             timestamp_ms=r["timestamp"]))
            producer.flush(timeout=15)
        return [f.get(timeout=15).offset for f in futures]
    finally:
        producer.close(timeout=5)


def ck_produce(bootstrap: str, topic: str, partition: int, recs: list[dict], *, acks, codec: str,
               n_chunks: int = 3) -> list[int]:
    """confluent-kafka's producer: acks=all with enable.idempotence=true, or acks=1."""
    producer = ck.Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                            "acks": "all" if acks == "all" else "1", "linger.ms": 5,
                            "enable.idempotence": acks == "all", "message.timeout.ms": 15000})
    reports: list = []

    def on_delivery(err, msg):
        reports.append((err, msg.offset()))

    for chunk in chunks(recs, n_chunks):
        for r in chunk:
            producer.produce(topic, key=r["key"], value=r["value"], headers=r["headers"] or None,
                             partition=partition, timestamp=r["timestamp"], on_delivery=on_delivery)
        assert producer.flush(15) == 0, "confluent-kafka could not deliver within 15 s"
    assert [err for err, _ in reports if err is not None] == []
    return [offset for _, offset in reports]


def kp_record(m) -> dict:
    assert m.timestamp_type == 0, "CreateTime"
    return {"offset": m.offset, "key": m.key, "value": m.value, "headers": list(m.headers),
            "timestamp": m.timestamp}


def ck_record(m) -> dict:
    ts_type, ts = m.timestamp()
    assert ts_type == ck.TIMESTAMP_CREATE_TIME
    return {"offset": m.offset(), "key": m.key(), "value": m.value(),
            "headers": list(m.headers() or []), "timestamp": ts}


def kp_consumer(bootstrap: str, group: str | None = None, **extra) -> KafkaConsumer:
    return KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                         auto_offset_reset="earliest", fetch_max_wait_ms=100, check_crcs=True,
                         request_timeout_ms=10000, **extra)


def kp_read(consumer: KafkaConsumer, n: int, timeout_s: float = 20.0) -> list[dict]:
    """Poll until n records came, then make sure no more come (no duplicates, nothing extra)."""
    out: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        for msgs in consumer.poll(timeout_ms=200).values():
            out.extend(kp_record(m) for m in msgs)
    for msgs in consumer.poll(timeout_ms=300).values():
        out.extend(kp_record(m) for m in msgs)
    return out


def kp_consume(bootstrap: str, topic: str, partition: int, n: int, start="beginning",
               group: str | None = None) -> list[dict]:
    consumer = kp_consumer(bootstrap, group)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        if start == "beginning":
            consumer.seek_to_beginning(tp)
        elif start is not None:
            consumer.seek(tp, start)
        return kp_read(consumer, n)
    finally:
        consumer.close()


def ck_consumer(bootstrap: str, group: str | None = None, **extra) -> ck.Consumer:
    return ck.Consumer({"bootstrap.servers": bootstrap,
                        "group.id": group or f"reader-{uuid.uuid4().hex[:8]}",
                        "enable.auto.commit": False, "check.crcs": True,
                        "enable.partition.eof": True, "fetch.wait.max.ms": 100,
                        "auto.offset.reset": "earliest", **extra})


def ck_read(consumer: ck.Consumer, timeout_s: float = 20.0) -> list[dict]:
    """Consume until librdkafka reports the end of the partition; any other error fails."""
    out: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for m in consumer.consume(500, 0.2):
            if m.error() is None:
                out.append(ck_record(m))
            elif m.error().code() == ck.KafkaError._PARTITION_EOF:
                return out
            else:
                raise AssertionError(f"confluent-kafka consumer error: {m.error()}")
    raise AssertionError(f"no end of partition within {timeout_s} s ({len(out)} records)")


def ck_consume(bootstrap: str, topic: str, partition: int, start=ck.OFFSET_BEGINNING,
               group: str | None = None) -> list[dict]:
    consumer = ck_consumer(bootstrap, group)
    try:
        consumer.assign([ck.TopicPartition(topic, partition, start)])
        return ck_read(consumer)
    finally:
        consumer.close()


def stored_batches(partition_dir: Path) -> list:
    """Every batch of a partition's .log files, parsed by kstore (read-only, the broker may run)."""
    out = []
    for path in sorted(partition_dir.glob("*.log")):
        out.extend(MemoryRecords(path.read_bytes()).batches())
    return out


def compression_would_not_help(batch, codec: str) -> bool:
    """librdkafka sends a batch uncompressed when compressing it would not make it smaller (a
    one-record batch, when linger splits a chunk under load): allowed, if that is really so."""
    if batch.compression != Compression.NONE:
        return False
    records = bytes(batch.buffer[61:batch.size_in_bytes])   # after the 61-byte batch header
    return len(compress(Compression.from_name(codec), records)) >= len(records)


def assert_stored_as_produced(partition_dir: Path, codec: str, idempotent: bool, n: int) -> list:
    batches = stored_batches(partition_dir)
    assert sum(b.records_count for b in batches) == n
    assert len(batches) >= 3, "each chunk was flushed on its own: at least three batches"
    for b in batches:
        assert b.is_valid()
        assert b.compression == Compression.from_name(codec) or compression_would_not_help(b, codec), \
            (b, codec)
        assert b.magic == 2 and b.partition_leader_epoch == 0
    if idempotent:
        assert len({b.producer_id for b in batches}) == 1 and batches[0].producer_id >= 0
        assert batches[0].base_sequence == 0
        for prev, b in zip(batches, batches[1:]):
            assert b.base_sequence == prev.last_sequence + 1
    else:
        assert all(b.producer_id == -1 and b.base_sequence == -1 for b in batches)
    return batches


def test_serve_on_a_port_in_use_fails_with_the_reason(tmp_path):
    """`kstore serve` must not report success (exit 0) when it cannot listen."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "kstore", "serve", "--log-dir",
                                 str(tmp_path / "logs"), "--port", str(port)], cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "cannot listen" in result.stderr and str(port) in result.stderr


# ==========================================================================================
# 1. Real clients against `kstore serve`
# ==========================================================================================
PRODUCED: dict[str, dict[int, list[dict]]] = {}   # topic -> partition -> expected records


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One `kstore serve` process for the client tests (auto-created topics get 2 partitions)."""
    sp = ServeProcess(tmp_path_factory.mktemp("clients") / "logs", "num.partitions=2").start()
    yield sp
    if sp.running():
        sp.stop()


def produce_both_acks(sp: ServeProcess, producer: str, codec: str) -> str:
    """Partition 0 with acks=1, partition 1 with acks=all (idempotent), 30 records each."""
    topic = f"{producer}-{codec}"
    produce = kp_produce if producer == "kp" else ck_produce
    PRODUCED[topic] = {}
    for partition, acks in ((0, 1), (1, "all")):
        recs = make_records(f"{topic}/{partition}", 30, T0 + 1000 * partition)
        assert produce(sp.bootstrap, topic, partition, recs, acks=acks, codec=codec) == list(range(30))
        PRODUCED[topic][partition] = expected(recs)
    return topic


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("producer", ["kp", "ck"])
def test_produce_every_codec_with_acks_1_and_all_and_consume_with_both_clients(served, producer, codec):
    topic = produce_both_acks(served, producer, codec)
    for partition, idempotent in ((0, False), (1, True)):
        want = PRODUCED[topic][partition]
        assert_stored_as_produced(served.log_dir / f"{topic}-{partition}", codec, idempotent, 30)
        assert kp_consume(served.bootstrap, topic, partition, len(want)) == want
        assert ck_consume(served.bootstrap, topic, partition) == want


def test_consume_from_an_offset_and_from_a_timestamp(served):
    topic = "seek"
    recs = make_records(topic, 60)
    assert kp_produce(served.bootstrap, topic, 0, recs, acks="all", codec="lz4", n_chunks=6) \
        == list(range(60))
    want = expected(recs)
    PRODUCED[topic] = {0: want}
    tp = TopicPartition(topic, 0)

    # from an offset in the middle of a batch: the clients drop the records below it
    assert kp_consume(served.bootstrap, topic, 0, 60 - 37, start=37) == want[37:]
    assert ck_consume(served.bootstrap, topic, 0, start=37) == want[37:]
    assert kp_consume(served.bootstrap, topic, 0, 0, start=60) == []
    assert ck_consume(served.bootstrap, topic, 0, start=ck.OFFSET_END) == []

    # earliest / latest (ListOffsets -2 / -1)
    consumer = kp_consumer(served.bootstrap)
    try:
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 60}
        # from a timestamp: the first offset whose timestamp is >= the target
        cases = {T0 + 250: 25, T0 + 255: 26, T0 - 10_000: 0, T0 + 590: 59, T0 + 591: None}
        for target, offset in cases.items():
            found = consumer.offsets_for_times({tp: target})[tp]
            assert (found.offset if found else None) == offset, target
            if found:
                assert found.timestamp == T0 + 10 * offset
        consumer.assign([tp])
        consumer.seek(tp, consumer.offsets_for_times({tp: T0 + 255})[tp].offset)
        assert kp_read(consumer, 60 - 26) == want[26:]
    finally:
        consumer.close()

    consumer = ck_consumer(served.bootstrap)
    try:
        lo_hi = consumer.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=10)
        assert lo_hi == (0, 60)
        for target, offset in cases.items():
            [found] = consumer.offsets_for_times([ck.TopicPartition(topic, 0, target)], timeout=10)
            assert found.error is None
            assert found.offset == (ck.OFFSET_END if offset is None else offset), target
        [found] = consumer.offsets_for_times([ck.TopicPartition(topic, 0, T0 + 255)], timeout=10)
        consumer.assign([found])
        assert ck_read(consumer) == want[26:]
    finally:
        consumer.close()


def test_commit_and_read_back_committed_offsets_with_a_group(served):
    topic = "commits"
    for partition in (0, 1):
        recs = make_records(f"{topic}{partition}", 20)
        assert ck_produce(served.bootstrap, topic, partition, recs, acks="all", codec="none") \
            == list(range(20))
        PRODUCED.setdefault(topic, {})[partition] = expected(recs)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)

    # kafka-python: commit with metadata, read it back; overwrite it
    consumer = kp_consumer(served.bootstrap, "group-kp")
    try:
        consumer.assign([tp0, tp1])
        assert consumer.committed(tp0) is None
        consumer.commit({tp0: OffsetAndMetadata(17, "kp-meta", -1)})
        assert consumer.committed(tp0) == 17
        assert consumer.committed(tp0, metadata=True).metadata == "kp-meta"
        assert consumer.committed(tp1) is None
        consumer.commit({tp0: OffsetAndMetadata(11, "kp-meta-2", -1), tp1: OffsetAndMetadata(3, "", -1)})
        assert (consumer.committed(tp0), consumer.committed(tp1)) == (11, 3)
    finally:
        consumer.close()

    # confluent-kafka: synchronous commit, committed()
    consumer = ck_consumer(served.bootstrap, "group-ck")
    try:
        consumer.assign([ck.TopicPartition(topic, 1, ck.OFFSET_BEGINNING)])
        [before] = consumer.committed([ck.TopicPartition(topic, 1)], timeout=10)
        assert before.offset == ck.OFFSET_INVALID
        result = consumer.commit(offsets=[ck.TopicPartition(topic, 1, 9, metadata="ck-meta")],
                                 asynchronous=False)
        assert [(r.offset, r.error) for r in result] == [(9, None)]
        [after] = consumer.committed([ck.TopicPartition(topic, 1)], timeout=10)
        assert (after.offset, after.metadata, after.error) == (9, "ck-meta", None)
    finally:
        consumer.close()

    # each client reads the other's commits, and starts from them when assign() has no offset
    consumer = kp_consumer(served.bootstrap, "group-ck")
    try:
        consumer.assign([tp1])
        c = consumer.committed(tp1, metadata=True)
        # confluent-kafka 2.x sends the metadata string with its C terminator ("ck-meta\0": the
        # size passed to librdkafka counts the NUL), and the broker keeps the bytes it was sent
        assert (c.offset, c.metadata) in ((9, "ck-meta"), (9, "ck-meta\x00"))
        assert kp_read(consumer, 11) == PRODUCED[topic][1][9:]
    finally:
        consumer.close()
    consumer = ck_consumer(served.bootstrap, "group-kp")
    try:
        committed = consumer.committed([ck.TopicPartition(topic, 0), ck.TopicPartition(topic, 1)],
                                       timeout=10)
        # (librdkafka returns empty metadata as None)
        assert [(c.offset, c.metadata or "") for c in committed] == [(11, "kp-meta-2"), (3, "")]
        consumer.assign([ck.TopicPartition(topic, 0)])    # no offset: the committed one
        assert ck_read(consumer) == PRODUCED[topic][0][11:]
    finally:
        consumer.close()


def test_restart_the_broker_and_resume_from_committed_offsets(tmp_path, serve_processes):
    sp = serve_processes(tmp_path / "logs", "num.partitions=2")
    topic = "resume"
    kp_recs, ck_recs = make_records("kp", 40), make_records("ck", 40, T0 + 5000)
    assert kp_produce(sp.bootstrap, topic, 0, kp_recs, acks="all", codec="gzip") == list(range(40))
    assert ck_produce(sp.bootstrap, topic, 1, ck_recs, acks="all", codec="zstd") == list(range(40))
    tp0 = TopicPartition(topic, 0)

    consumer = kp_consumer(sp.bootstrap, "resume-kp")
    try:
        consumer.assign([tp0])
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 12 and time.monotonic() < deadline:
            got += [kp_record(m) for ms in consumer.poll(200, max_records=12 - len(got)).values()
                    for m in ms]
        assert got == expected(kp_recs)[:12]
        consumer.commit()   # the consumer's position: 12
        assert consumer.committed(tp0) == 12
    finally:
        consumer.close()
    consumer = ck_consumer(sp.bootstrap, "resume-ck")
    try:
        consumer.assign([ck.TopicPartition(topic, 1, ck.OFFSET_BEGINNING)])
        consumer.commit(offsets=[ck.TopicPartition(topic, 1, 7, metadata="seven")], asynchronous=False)
    finally:
        consumer.close()
    before = {p: stored_batches(sp.log_dir / f"{topic}-{p}") for p in (0, 1)}
    pids = {p: before[p][0].producer_id for p in (0, 1)}

    port = sp.port
    sp.stop()
    sp.start(port=port)                # same log dir, same address

    after = {p: stored_batches(sp.log_dir / f"{topic}-{p}") for p in (0, 1)}
    assert {p: [b.to_bytes() for b in after[p]] for p in (0, 1)} == \
        {p: [b.to_bytes() for b in before[p]] for p in (0, 1)}
    assert kp_consume(sp.bootstrap, topic, 0, 28, start=None, group="resume-kp") == expected(kp_recs)[12:]
    assert ck_consume(sp.bootstrap, topic, 1, start=ck.OFFSET_INVALID, group="resume-ck") \
        == expected(ck_recs)[7:]
    consumer = ck_consumer(sp.bootstrap, "resume-ck")
    try:
        [c] = consumer.committed([ck.TopicPartition(topic, 1)], timeout=10)
        assert (c.offset, c.metadata) == (7, "seven")
    finally:
        consumer.close()

    # producing goes on where the log ended, with producer ids never handed out before
    more = make_records("more", 10, T0 + 9000)
    assert kp_produce(sp.bootstrap, topic, 0, more, acks="all", codec="none") == list(range(40, 50))
    assert ck_produce(sp.bootstrap, topic, 1, more, acks="all", codec="none") == list(range(40, 50))
    for p in (0, 1):
        new = stored_batches(sp.log_dir / f"{topic}-{p}")[len(before[p]):]
        assert new and all(b.producer_id > max(pids.values()) for b in new)
    assert kp_consume(sp.bootstrap, topic, 0, 50) == expected(kp_recs) + expected(more, 40)
    assert ck_consume(sp.bootstrap, topic, 1) == expected(ck_recs) + expected(more, 40)
    sp.stop()


def test_the_clients_crc_checks_catch_a_corrupted_stored_batch(tmp_path, serve_processes):
    """The control for every clean consume above: corrupt one byte of a stored record (the
    broker does not recheck after a clean shutdown) and both clients must refuse it."""
    sp = serve_processes(tmp_path / "logs")
    recs = make_records("crc", 30)
    assert kp_produce(sp.bootstrap, "crc", 0, recs, acks=1, codec="none") == list(range(30))
    sp.stop()
    segment = tmp_path / "logs" / "crc-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    batches = MemoryRecords(bytes(data)).batches()
    target = data.index(b"compressible", batches[1].position)   # a value in the 2nd batch
    assert target < batches[1].position + batches[1].size_in_bytes
    data[target] ^= 0x20                                          # 'c' -> 'C'
    segment.write_bytes(bytes(data))
    sp.start()

    # librdkafka, check.crcs=false: the corrupt batch is delivered as is; true: an error
    consumer = ck_consumer(sp.bootstrap, **{"check.crcs": False})
    try:
        consumer.assign([ck.TopicPartition("crc", 0, ck.OFFSET_BEGINNING)])
        got = ck_read(consumer)
        want = expected(recs)
        assert [r["offset"] for r in got] == list(range(30)) and got != want
        assert [i for i in range(30) if got[i] != want[i]] == \
            [i for i in range(30) if b"Compressible" in (got[i]["value"] or b"")]
    finally:
        consumer.close()
    consumer = ck_consumer(sp.bootstrap)
    try:
        consumer.assign([ck.TopicPartition("crc", 0, ck.OFFSET_BEGINNING)])
        # "MessageSet at offset 10 (... bytes) failed CRC32C check (original ... != calculated ...)"
        with pytest.raises(AssertionError, match="(?i)crc|checksum|bad.?msg"):
            ck_read(consumer, timeout_s=10)
    finally:
        consumer.close()
    consumer = kp_consumer(sp.bootstrap)
    try:
        consumer.assign([TopicPartition("crc", 0)])
        consumer.seek_to_beginning()
        with pytest.raises(kafka.errors.CorruptRecordError, match="failed crc check"):
            kp_read(consumer, 30, timeout_s=10)
    finally:
        consumer.close()
    sp.stop()


def test_stored_files_are_readable_by_kstore_and_by_kafka_python(served, tmp_path):
    """After the clients: stop the broker, read every partition file they wrote with kstore's
    engine and with kafka-python's record parser; then the broker serves them again."""
    for producer in ("kp", "ck"):
        for codec in CODECS:
            if f"{producer}-{codec}" not in PRODUCED:     # this test run on its own
                produce_both_acks(served, producer, codec)
    port = served.port
    served.stop()
    copy = tmp_path / "copy"
    shutil.copytree(served.log_dir, copy)     # LogManager.open may write: keep the original

    manager = LogManager.open(str(copy))
    try:
        for topic, partitions in PRODUCED.items():
            for partition, want in partitions.items():
                log = manager.get_log(topic, partition)
                assert log is not None and log.log_end_offset == len(want)
                got = [{"offset": r.offset, "key": r.key, "value": r.value,
                        "headers": [(k, v) for k, v in r.headers], "timestamp": r.timestamp}
                       for r in log.records()]
                assert got == want, (topic, partition)
    finally:
        manager.shutdown()

    codes = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
    for topic, partitions in PRODUCED.items():
        for partition, want in partitions.items():
            got, codecs = [], set()
            for path in sorted((served.log_dir / f"{topic}-{partition}").glob("*.log")):
                records = KafkaPythonMemoryRecords(path.read_bytes())
                while (batch := records.next_batch()) is not None:
                    assert batch.validate_crc(), (path, batch.base_offset)   # before iterating
                    codecs.add(batch.compression_type)
                    got += [{"offset": r.offset, "key": r.key, "value": r.value,
                             "headers": list(r.headers), "timestamp": r.timestamp} for r in batch]
            assert got == want, (topic, partition)
            codec = topic.partition("-")[2]
            if codec in codes:   # librdkafka may leave a batch uncompressed (see above)
                assert codes[codec] in codecs and codecs <= {codes[codec], 0}

    served.start(port=port)
    assert ck_consume(served.bootstrap, "kp-zstd", 1) == PRODUCED["kp-zstd"][1]


# ==========================================================================================
# 3. Fetch and ApiVersions at the protocol level (kstore's codec on a raw socket)
# ==========================================================================================
@pytest.fixture
def inproc(tmp_path):
    """A Broker, and in-process KafkaServers on it (started on demand; their .stats readable)."""
    broker = Broker(str(tmp_path / "logs"))
    servers: list[KafkaServer] = []

    def start(**kwargs) -> KafkaServer:
        server = KafkaServer(broker, "127.0.0.1", 0, **kwargs).start_in_thread()
        servers.append(server)
        return server

    yield broker, start
    for server in servers:
        server.stop()
    broker.shutdown()


def eventually(predicate, timeout_s: float = 3.0) -> bool:
    """The server thread counts a send after its last byte left, which the client may already
    have read: give the counter a moment."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def sent_since(server: KafkaServer, before: tuple[int, int]) -> tuple[int, int]:
    return (server.stats.bytes_sent_sendfile - before[0], server.stats.bytes_sent_copy - before[1])


def produce_raw(conn: Conn, topic: str, partition: int, batch: bytes, *, acks: int = 1,
                version: int = 3) -> dict:
    body = {"transactional_id": None, "acks": acks, "timeout_ms": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}]}
    response = conn.call(API["Produce"], version, body)
    [topic_response] = response["responses"]
    [partition_response] = topic_response["partition_responses"]
    return partition_response


def fetch_body(parts, *, max_wait_ms: int = 0, min_bytes: int = 1, max_bytes: int = 0x7FFFFFFF) -> dict:
    """parts: (topic, partition, fetch_offset, partition_max_bytes) tuples."""
    topics: dict[str, list] = {}
    for topic, partition, offset, pmax in parts:
        topics.setdefault(topic, []).append({"partition": partition, "fetch_offset": offset,
                                             "partition_max_bytes": pmax})
    return {"replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes,
            "max_bytes": max_bytes, "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]}


def by_partition(fetch_response: dict) -> dict:
    return {(t["topic"], p["partition_index"]): p for t in fetch_response["responses"]
            for p in t["partitions"]}


def random_batch(n: int, value_size: int, rng: random.Random, compression=Compression.NONE,
                 ts: int = T0) -> bytes:
    return build_batch([Record(b"key-%d" % i, rng.randbytes(value_size), ts + i) for i in range(n)],
                       compression=compression)


def same_batch(stored: bytes, sent: bytes) -> bool:
    """Stored as sent: only baseOffset (0-7) and partitionLeaderEpoch (12-15) are rewritten."""
    return len(stored) == len(sent) and stored[8:12] == sent[8:12] and stored[16:] == sent[16:]


def segment_bytes(log_dir: Path, topic: str, partition: int) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((Path(log_dir) / f"{topic}-{partition}").glob("*.log")))


def test_zero_copy_fetch_uses_sendfile_and_the_copy_path_sends_identical_bytes(inproc):
    broker, start = inproc
    broker.create_topic("zc", 2)
    rng = random.Random(1)
    codecs = [Compression.NONE, Compression.GZIP, Compression.LZ4, Compression.ZSTD, Compression.SNAPPY]
    server = start()
    assert server.zero_copy
    with Conn(server.port) as c:
        for i in range(10):
            batch = random_batch(20, 1500, rng, codecs[i % 5])
            assert produce_raw(c, "zc", i % 2, batch)["error_code"] == 0
    files = {p: segment_bytes(broker.log_dir, "zc", p) for p in (0, 1)}
    body = fetch_body([("zc", 0, 0, 1 << 20), ("zc", 1, 0, 1 << 20)])

    def fetch_all(server: KafkaServer) -> dict[int, bytes]:
        frames = {}
        with Conn(server.port) as c:
            for version in (4, 11):
                stats = (server.stats.bytes_sent_sendfile, server.stats.bytes_sent_copy)
                cid, frame = c.frame(API["Fetch"], version, body, cid=1000 + version)
                c.sock.sendall(frame)
                frames[version] = c.recv_frame()
                _, response = P.decode_response(API["Fetch"], version, frames[version])
                parts = by_partition(response)
                for p in (0, 1):
                    assert parts[("zc", p)]["error_code"] == 0
                    assert parts[("zc", p)]["records"] == files[p]     # the segment, byte for byte
                record_bytes = len(files[0]) + len(files[1])
                want = (record_bytes, 0) if server.zero_copy else (0, record_bytes)
                assert eventually(lambda: sent_since(server, stats) == want), sent_since(server, stats)
        return frames

    zero_copy_frames = fetch_all(server)
    server.stop()
    copying = start(zero_copy=False)
    assert fetch_all(copying) == zero_copy_frames    # whole responses identical, byte for byte


@pytest.mark.parametrize("zero_copy", [True, False], ids=["sendfile", "copy"])
def test_a_large_fetch_to_a_slow_reader_arrives_whole(inproc, zero_copy):
    """~8 MB of records to a client with a small receive buffer that starts reading late: the
    sendfile path must wait for the socket (EAGAIN) and resume, never drop or repeat bytes."""
    broker, start = inproc
    broker.create_topic("big", 1)
    server = start(zero_copy=zero_copy)
    rng = random.Random(2)
    with Conn(server.port) as c:
        for _ in range(12):
            assert produce_raw(c, "big", 0, random_batch(7, 100_000, rng))["error_code"] == 0
    data = segment_bytes(broker.log_dir, "big", 0)
    assert len(data) > 8_000_000
    before = (server.stats.bytes_sent_sendfile, server.stats.bytes_sent_copy)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
    sock.settimeout(20)
    sock.connect(("127.0.0.1", server.port))
    c = Conn.__new__(Conn)
    c.sock, c.cid = sock, 0
    with c:
        cid = c.send(API["Fetch"], 11, fetch_body([("big", 0, 0, 64 << 20)], max_bytes=64 << 20))
        time.sleep(0.5)                         # the broker's send blocks meanwhile
        response = c.recv(API["Fetch"], 11, cid)
    assert by_partition(response)[("big", 0)]["records"] == data
    want = (len(data), 0) if zero_copy else (0, len(data))
    assert eventually(lambda: sent_since(server, before) == want), sent_since(server, before)


def test_real_clients_get_identical_records_over_the_sendfile_and_the_copy_path(inproc):
    broker, start = inproc
    broker.create_topic("paths", 1)
    server = start()
    recs = make_records("paths", 40)
    assert kp_produce(f"127.0.0.1:{server.port}", "paths", 0, recs, acks="all", codec="snappy") \
        == list(range(40))
    want = expected(recs)
    for zero_copy in (True, False):
        if not zero_copy:
            server.stop()
            server = start(zero_copy=False)
        bootstrap = f"127.0.0.1:{server.port}"
        before = (server.stats.bytes_sent_sendfile, server.stats.bytes_sent_copy)
        assert kp_consume(bootstrap, "paths", 0, 40) == want
        assert ck_consume(bootstrap, "paths", 0) == want
        size = len(segment_bytes(broker.log_dir, "paths", 0))
        # each client fetched the whole segment at least once, through one path only
        if zero_copy:
            assert eventually(lambda: sent_since(server, before)[0] >= 2 * size)
            assert sent_since(server, before)[1] == 0
        else:
            assert eventually(lambda: sent_since(server, before)[1] >= 2 * size)
            assert sent_since(server, before)[0] == 0


@pytest.mark.parametrize("appender", ["network producer", "another thread, in process"])
def test_a_long_poll_returns_as_soon_as_a_producer_appends(inproc, appender):
    """The append wakes the waiting fetch whether it comes through the server's own event loop
    (a Produce request) or from another thread of the process (a notebook's producer), where the
    server learns of it through the broker's events."""
    broker, start = inproc
    broker.create_topic("poll", 1)
    server = start()
    result: dict = {}

    def long_poll():
        with Conn(server.port, timeout=15) as c:
            t = time.monotonic()
            result["response"] = c.call(API["Fetch"], 11, fetch_body([("poll", 0, 0, 1 << 20)],
                                                                      max_wait_ms=5000))
            result["started"], result["answered"] = t, time.monotonic()

    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(0.6)
    batch = random_batch(3, 200, random.Random(3))
    produced_at = time.monotonic()
    if appender == "network producer":
        with Conn(server.port) as c:
            assert produce_raw(c, "poll", 0, batch)["error_code"] == 0
    else:
        broker.produce("poll", 0, batch, acks=1)
    poller.join(15)
    assert not poller.is_alive() and "response" in result
    assert result["answered"] - produced_at < 1.0, "the append must wake the waiting fetch"
    assert result["answered"] - result["started"] < 3.0
    part = by_partition(result["response"])[("poll", 0)]
    assert part["error_code"] == 0 and part["high_watermark"] == 3
    assert same_batch(part["records"], batch)


@pytest.mark.parametrize("pieces", ["one write", "random pieces"])
def test_requests_are_framed_across_receive_buffer_boundaries(inproc, pieces):
    """The broker receives a connection's bytes in 8 KiB chunks (kstore.server._Channel): small
    requests around Produce requests larger than a chunk, all in one write or dribbled in random
    pieces (a size prefix split, a frame ending just past a chunk). Each is answered, in order,
    and each batch is stored byte for byte as sent."""
    broker, start = inproc
    broker.create_topic("frames", 1)
    server = start()
    rng = random.Random(31 if pieces == "one write" else 32)
    sizes = [300_000, 8 * 1024 - 200, 70_000, 10, 1_000_000, 5, 9_000]   # bytes per record value
    batches = [random_batch(1, n, rng) for n in sizes]
    plan = []
    for i, batch in enumerate(batches):
        plan.append((API["ApiVersions"], 2, {}))
        plan.append((API["Produce"], 3, {"transactional_id": None, "acks": 1, "timeout_ms": 10000,
                                         "topic_data": [{"name": "frames", "partition_data": [
                                             {"index": 0, "records": batch}]}]}))
    with Conn(server.port, timeout=20) as c:
        data, cids = bytearray(), []
        for n, (key, version, body) in enumerate(plan):
            cid, frame = c.frame(key, version, body, cid=500 + n)
            data += frame
            cids.append((cid, key, version))
        if pieces == "one write":
            c.sock.sendall(data)
        else:
            at = 0
            while at < len(data):
                n = rng.choice([1, 3, 4, 5, rng.randrange(1, 200_000)])
                c.sock.sendall(data[at:at + n])
                at += n
                if rng.random() < 0.1:
                    time.sleep(0.002)
        offsets = []
        for cid, key, version in cids:
            got, body = P.decode_response(key, version, c.recv_frame())
            assert got == cid, "answers must come in request order"
            if key == API["Produce"]:
                part = body["responses"][0]["partition_responses"][0]
                assert part["error_code"] == 0
                offsets.append(part["base_offset"])
    assert offsets == list(range(len(batches)))
    stored = broker.get_log("frames", 0).read(0, 64 << 20).records.to_memory_records().batches()
    assert [same_batch(b.to_bytes(), sent) for b, sent in zip(stored, batches)] == [True] * len(batches)
    assert server.stats.closed_for_errors == 0


@pytest.mark.parametrize("prefix_bytes_in_first_chunk", [0, 1, 2, 3, 4])
def test_a_size_prefix_split_at_the_end_of_the_receive_buffer(tmp_path, prefix_bytes_in_first_chunk):
    """_Channel's buffer boundary, made to happen: the first receive fills the 8 KiB buffer
    exactly, with 0-4 bytes of the next request's size prefix at its end; frames after it are
    smaller and larger than the buffer. Every frame comes back whole and in order."""
    from kstore.server import _Channel
    chunk = _Channel.CHUNK
    first = chunk - 4 - prefix_bytes_in_first_chunk   # frame 1 + 0-4 prefix bytes = one chunk
    rng = random.Random(prefix_bytes_in_first_chunk)
    # the frame whose prefix straddles is over 64 KiB: its prefix differs from the first one's
    # in its first two bytes
    frames = [rng.randbytes(n) for n in (first, 9 * chunk + 5, 7, chunk - 4, 0, 1, chunk)]
    data = b"".join(struct.pack(">i", len(f)) + f for f in frames)
    broker = Broker(str(tmp_path / "logs"))
    server = KafkaServer(broker, "127.0.0.1", 0)
    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(data[:chunk])                  # all there before the first receive
        writer = threading.Thread(target=theirs.sendall, args=(data[chunk:],))

        async def receive_all():
            ours.setblocking(False)
            channel = _Channel(asyncio.get_running_loop(), ours, asyncio.current_task())
            writer.start()
            try:
                return [await channel.next_frame(server.max_request_size) for _ in frames]
            finally:
                channel.close()

        got = asyncio.run(receive_all())
        writer.join()
        assert [bytes(f) for f in got] == frames
    finally:
        ours.close()
        theirs.close()
        broker.shutdown()


def test_fetch_waits_up_to_max_wait_ms_for_min_bytes(inproc):
    broker, start = inproc
    broker.create_topic("wait", 1)
    server = start()
    rng = random.Random(4)
    with Conn(server.port, timeout=15) as c, Conn(server.port) as producer:
        def timed_fetch(**kwargs) -> tuple[float, dict]:
            t = time.monotonic()
            response = c.call(API["Fetch"], 11, fetch_body([("wait", 0, 0, 1 << 20)], **kwargs))
            return time.monotonic() - t, by_partition(response)[("wait", 0)]

        # nothing to read: the full max_wait_ms, then an empty answer
        elapsed, part = timed_fetch(max_wait_ms=700)
        assert 0.65 <= elapsed < 2.5 and part["error_code"] == 0 and not part["records"]

        first = random_batch(3, 100, rng)
        assert produce_raw(producer, "wait", 0, first)["error_code"] == 0
        size = len(first)
        # min_bytes reached: at once, even with a long max_wait
        elapsed, part = timed_fetch(max_wait_ms=5000, min_bytes=size)
        assert elapsed < 1.0 and same_batch(part["records"], first)
        # min_bytes not reached: waits max_wait_ms, then returns what there is
        elapsed, part = timed_fetch(max_wait_ms=700, min_bytes=size + 1)
        assert 0.65 <= elapsed < 2.5 and same_batch(part["records"], first)

        # an append that does not reach min_bytes does not end the wait ...
        threading.Timer(0.3, lambda: produce_raw(producer, "wait", 0, random_batch(2, 100, rng))).start()
        elapsed, part = timed_fetch(max_wait_ms=1500, min_bytes=20_000)
        assert 1.4 <= elapsed < 3.5 and MemoryRecords(part["records"]).batches()[-1].last_offset == 4
        # ... one that does, does
        threading.Timer(0.3, lambda: produce_raw(producer, "wait", 0, random_batch(2, 12_000, rng))).start()
        elapsed, part = timed_fetch(max_wait_ms=5000, min_bytes=20_000)
        assert elapsed < 1.5 and MemoryRecords(part["records"]).batches()[-1].last_offset == 6


def test_fetch_honours_response_and_partition_byte_limits(inproc):
    broker, start = inproc
    broker.create_topic("lim", 2)
    server = start()
    rng = random.Random(5)
    with Conn(server.port) as c:
        for p in (0, 1):
            for _ in range(4):
                assert produce_raw(c, "lim", p, random_batch(5, 200, rng))["error_code"] == 0
        files = {p: segment_bytes(broker.log_dir, "lim", p) for p in (0, 1)}
        sizes = {p: [b.size_in_bytes for b in MemoryRecords(files[p]).batches()] for p in (0, 1)}

        def fetch(parts, **kwargs) -> dict:
            response = c.call(API["Fetch"], 11, fetch_body(parts, **kwargs))
            return {key: p["records"] or b"" for key, p in by_partition(response).items()}

        # a partition limit that falls inside a batch: the slice is cut there (the client drops
        # the partial batch), raw file bytes from the first batch on
        limit = sizes[0][0] + sizes[0][1] // 2
        got = fetch([("lim", 0, 0, limit)])[("lim", 0)]
        assert got == files[0][:limit]
        assert len(MemoryRecords(got).batches()) == 1
        kp_batches = KafkaPythonMemoryRecords(got)
        assert kp_batches.next_batch() is not None and kp_batches.next_batch() is None
        # a limit below the first batch: the first partition with data still gets one whole
        # batch (KIP-74); after that the limits hold strictly
        got = fetch([("lim", 0, 0, 10), ("lim", 1, 0, 10)])
        assert got == {("lim", 0): files[0][:sizes[0][0]], ("lim", 1): files[1][:10]}
        # the response limit is shared, in request order
        got = fetch([("lim", 0, 0, 1 << 20), ("lim", 1, 0, 1 << 20)], max_bytes=len(files[0]) + 100)
        assert got == {("lim", 0): files[0], ("lim", 1): files[1][:100]}
        got = fetch([("lim", 0, 0, 1 << 20), ("lim", 1, 0, 1 << 20)], max_bytes=50)
        assert got == {("lim", 0): files[0][:sizes[0][0]], ("lim", 1): b""}
        # from an offset inside the second batch: from that batch's first byte
        got = fetch([("lim", 1, 7, 1 << 20)])[("lim", 1)]
        assert got == files[1][sizes[1][0]:]


def test_fetch_reports_the_high_watermark_and_log_start(inproc):
    broker, start = inproc
    broker.create_topic("hw", 1)
    server = start()
    with Conn(server.port) as c:
        for _ in range(3):
            assert produce_raw(c, "hw", 0, random_batch(4, 50, random.Random(6)))["error_code"] == 0
        for version in (4, 5, 11):
            for offset, has_data in ((0, True), (5, True), (12, False)):
                response = c.call(API["Fetch"], version, fetch_body([("hw", 0, offset, 1 << 20)]))
                part = by_partition(response)[("hw", 0)]
                assert (part["error_code"], part["high_watermark"], part["last_stable_offset"]) == (0, 12, 12)
                assert part["log_start_offset"] == (0 if version >= 5 else -1)
                assert not part["aborted_transactions"]
                assert bool(part["records"]) == has_data
        latest = c.call(API["ListOffsets"], 5, {"replica_id": -1, "topics": [
            {"name": "hw", "partitions": [{"partition_index": 0, "timestamp": -1}]}]})
        assert latest["topics"][0]["partitions"][0]["offset"] == 12


def test_fetch_errors_offset_out_of_range_and_unknown_topic_or_partition(inproc):
    broker, start = inproc
    broker.create_topic("err", 2)
    server = start()
    with Conn(server.port) as c:
        assert produce_raw(c, "err", 0, random_batch(5, 50, random.Random(7)))["error_code"] == 0
        for offset in (6, 10**12, -1):
            response = c.call(API["Fetch"], 11, fetch_body([("err", 0, offset, 1 << 20)]))
            part = by_partition(response)[("err", 0)]
            assert part["error_code"] == E["OFFSET_OUT_OF_RANGE"] and not part["records"], offset
        for topic, partition in (("no-such-topic", 0), ("err", 2), ("err", -1)):
            response = c.call(API["Fetch"], 11, fetch_body([(topic, partition, 0, 1 << 20)]))
            part = by_partition(response)[(topic, partition)]
            assert part["error_code"] == E["UNKNOWN_TOPIC_OR_PARTITION"] and not part["records"]
        assert not (Path(broker.log_dir) / "no-such-topic-0").exists()    # a fetch creates nothing
        # an error answers at once, even in a long poll; the good partitions come along
        t = time.monotonic()
        response = c.call(API["Fetch"], 11, fetch_body([("err", 0, 0, 1 << 20), ("err", 1, 0, 1 << 20),
                                                        ("err", 7, 0, 1 << 20)], max_wait_ms=5000,
                                                       min_bytes=1 << 20))
        assert time.monotonic() - t < 1.0
        parts = by_partition(response)
        assert [parts[("err", p)]["error_code"] for p in (0, 1, 7)] == [0, 0, E["UNKNOWN_TOPIC_OR_PARTITION"]]
        assert len(MemoryRecords(parts[("err", 0)]["records"]).batches()) == 1


def test_produce_refuses_corrupt_batches_and_what_kafka_refuses_from_clients(inproc):
    broker, start = inproc
    broker.create_topic("bad", 1)
    server = start()
    recs = [Record(b"k%d" % i, b"value-%d" % i, T0 + i, (("h", b"%d" % i),)) for i in range(3)]
    good = build_batch(recs)
    with Conn(server.port) as c:
        # one flipped byte anywhere but the partitionLeaderEpoch (not covered by the CRC; the
        # leader overwrites it): baseOffset (must be 0 from a client), length, magic, CRC, the
        # CRC-covered header and records
        for pos in range(len(good)):
            if 12 <= pos < 16:
                continue
            bad = bytearray(good)
            bad[pos] ^= 0xFF
            assert produce_raw(c, "bad", 0, bytes(bad))["error_code"] == E["CORRUPT_MESSAGE"], pos
        # valid CRCs, but not what a client may write (Kafka: InvalidRecordException, which
        # Produce v8+ reports as INVALID_RECORD and older versions as CORRUPT_MESSAGE)
        forged = {
            "no records at all": None, "an empty records field": b"",
            "only part of a batch": good[:40],
            "a control batch": build_batch([Record(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", T0)],
                                           control=True),
            "an offset range that disagrees with the count": build_batch(recs, last_offset_delta=5),
            "a producer id without a sequence": build_batch(recs, producer_id=5, producer_epoch=0),
        }
        for name, records in forged.items():
            for version, code in ((3, E["CORRUPT_MESSAGE"]), (8, E["INVALID_RECORD"])):
                assert produce_raw(c, "bad", 0, records, version=version)["error_code"] == code, name
        assert latest_offset(c, "bad", 0) == 0, "nothing was appended"
        assert produce_raw(c, "bad", 0, good)["base_offset"] == 0
        assert latest_offset(c, "bad", 0) == 3
        still_usable(c)
    assert server.stats.closed_for_errors == 0


def test_negative_limits_and_odd_timestamps_get_an_answer_not_a_dropped_connection(inproc):
    broker, start = inproc
    broker.create_topic("odd", 1)
    server = start()
    with Conn(server.port) as c:
        assert produce_raw(c, "odd", 0, random_batch(3, 10, random.Random(13)))["error_code"] == 0
        for pmax, max_bytes in ((-1, 1 << 20), (1 << 20, -1), (-(2**31), -(2**31))):
            response = c.call(API["Fetch"], 11, fetch_body([("odd", 0, 0, pmax)], max_bytes=max_bytes))
            # Kafka: LogSegment.read's IllegalArgumentException -> UNKNOWN_SERVER_ERROR
            assert by_partition(response)[("odd", 0)]["error_code"] == E["UNKNOWN_SERVER_ERROR"]
        for timestamp in (-7, -100, -(2**63)):
            response = c.call(API["ListOffsets"], 5, {"replica_id": -1, "topics": [
                {"name": "odd", "partitions": [{"partition_index": 0, "timestamp": timestamp}]}]})
            assert response["topics"][0]["partitions"][0]["partition_index"] == 0
        still_usable(c)
    assert server.stats.closed_for_errors == 0


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def header_v2_frame(key: int, version: int, cid: int, body: bytes, client_id: bytes = b"flexible") -> bytes:
    """A flexible request: header v2 (client id, then an empty tagged-field section) + body."""
    payload = struct.pack(">hhih", key, version, cid, len(client_id)) + client_id + b"\x00" + body
    return struct.pack(">i", len(payload)) + payload


def header_v1_frame(key: int, version: int, cid: int, body: bytes = b"") -> bytes:
    payload = struct.pack(">hhih", key, version, cid, 4) + b"test" + body
    return struct.pack(">i", len(payload)) + payload


def still_usable(c: Conn) -> None:
    response = c.call(API["Metadata"], 4, {"topics": None, "allow_auto_topic_creation": False})
    assert response["brokers"] and response["brokers"][0]["node_id"] == 0


def test_accepted_connections_get_the_socket_buffer_sizes_of_the_config(tmp_path):
    """socket.send.buffer.bytes / socket.receive.buffer.bytes are set on every accepted connection
    as Kafka's Acceptor sets them (default 102400; Linux reports twice what was asked, its
    bookkeeping included); -1 leaves the kernel's own sizing; below -1 is refused by name."""
    def accepted_buffers(config: dict | None) -> tuple[int, int]:
        broker = Broker(str(tmp_path / f"logs-{len(list(tmp_path.iterdir()))}"), config=config)
        server = KafkaServer(broker, "127.0.0.1", 0).start_in_thread()
        try:
            with Conn(server.port) as c:
                assert c.call(API["ApiVersions"], 2, {})["error_code"] == 0
                (channel,) = server._open
                return (channel.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                        channel.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
        finally:
            server.stop()
            broker.shutdown()

    assert accepted_buffers(None) == (2 * 102400, 2 * 102400)
    assert accepted_buffers({"socket.send.buffer.bytes": 65536,
                             "socket.receive.buffer.bytes": 32768}) == (2 * 65536, 2 * 32768)
    with socket.create_server(("127.0.0.1", 0)) as listener:   # what the kernel gives by itself
        with socket.create_connection(listener.getsockname()) as _, listener.accept()[0] as plain:
            kernel = (plain.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                      plain.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
    assert accepted_buffers({"socket.send.buffer.bytes": -1,
                             "socket.receive.buffer.bytes": -1}) == kernel
    with pytest.raises(ConfigError, match="socket.send.buffer.bytes"):
        Broker(str(tmp_path / "bad"), config={"socket.send.buffer.bytes": -2})


def test_api_versions_lists_our_ranges(inproc):
    _, start = inproc
    server = start()
    with Conn(server.port) as c:
        for version in (0, 1, 2):
            response = c.call(API["ApiVersions"], version, {})
            assert response["error_code"] == 0
            assert {a["api_key"]: (a["min_version"], a["max_version"]) for a in response["api_keys"]} \
                == P.SUPPORTED
        assert P.SUPPORTED[API["Metadata"]][1] >= 4 and P.SUPPORTED[API["Produce"]][0] <= 3


def test_metadata_all_topics_is_an_empty_list_in_v0_and_null_from_v1(inproc):
    broker, start = inproc
    broker.create_topic("m1", 2)
    broker.create_topic("m2", 1)
    server = start()
    with Conn(server.port) as c:
        def names(version: int, topics) -> list[str]:
            response = c.call(API["Metadata"], version, {"topics": topics, "allow_auto_topic_creation": False})
            return sorted(t["name"] for t in response["topics"])
        assert names(0, []) == ["m1", "m2"]
        for version in range(1, 9):
            assert names(version, None) == ["m1", "m2"] and names(version, []) == []
            assert names(version, [{"name": "m2"}]) == ["m2"]


@pytest.mark.parametrize("version", [3, 4, 5])
def test_a_flexible_api_versions_request_gets_the_v0_unsupported_version_reply(inproc, version):
    _, start = inproc
    server = start()
    body = uvarint(len(b"kstore-test") + 1) + b"kstore-test" + uvarint(4) + b"1.0" + b"\x00"
    ranges = sorted(P.SUPPORTED.items())
    want = struct.pack(">ihi", 77, E["UNSUPPORTED_VERSION"], len(ranges)) + b"".join(
        struct.pack(">hhh", key, lo, hi) for key, (lo, hi) in ranges)
    with Conn(server.port) as c:
        c.sock.sendall(header_v2_frame(API["ApiVersions"], version, 77, body))
        reply = c.recv_frame()
        assert reply == want                        # response header v0 + ApiVersionsResponse v0
        assert P.decode_response(API["ApiVersions"], 0, reply)[1]["error_code"] == 35
        # what the clients do next: retry with a version we listed, on the same connection
        assert c.call(API["ApiVersions"], 2, {})["error_code"] == 0
        still_usable(c)


def test_unknown_api_keys_and_unsupported_versions_get_an_error_and_the_connection_stays_usable(inproc):
    _, start = inproc
    server = start()
    unknown_keys = [4, 48, 19, 32, 50, 68, 1000, 32767, -1, -32768]
    unsupported = [(API["Produce"], v) for v in (0, 1, 2)] + [(API["Fetch"], v) for v in (0, 3)] + \
        [(API["ListOffsets"], 0), (API["OffsetCommit"], 0), (API["OffsetCommit"], 1),
         (API["OffsetFetch"], 0)]
    flexible = [(API["Produce"], 9), (API["Fetch"], 12), (API["Fetch"], 17), (API["Metadata"], 9),
                (API["Metadata"], 12), (API["ListOffsets"], 6), (API["FindCoordinator"], 3),
                (API["OffsetCommit"], 8), (API["OffsetFetch"], 6), (API["InitProducerId"], 2)]
    with Conn(server.port) as c:
        cid = 500
        frames = [header_v1_frame(k, 0, 0, b"\x00\x01\x02\x03") for k in unknown_keys] + \
                 [header_v1_frame(k, v, 0, b"\x00" * 40) for k, v in unsupported] + \
                 [header_v2_frame(k, v, 0, b"\x00" * 40) for k, v in flexible]
        for frame in frames:
            cid += 1
            frame = frame[:8] + struct.pack(">i", cid) + frame[12:]      # set the correlation id
            c.sock.sendall(frame)
            assert c.recv_frame() == struct.pack(">ih", cid, E["UNSUPPORTED_VERSION"]), frame[4:8]
            still_usable(c)
    assert server.stats.closed_for_errors == 0


# ==========================================================================================
# 4. Faults and bad input
# ==========================================================================================
def metadata_frame(cid: int = 1, topics=("stable",), version: int = 4) -> bytes:
    body = {"topics": [{"name": t} for t in topics], "allow_auto_topic_creation": False}
    payload = P.encode_request(API["Metadata"], version, cid, "kstore-test", body)
    return struct.pack(">i", len(payload)) + payload


def produce_frame(topic: str, partition: int, batch: bytes, cid: int = 1, version: int = 3,
                  acks: int = 1) -> bytes:
    body = {"transactional_id": None, "acks": acks, "timeout_ms": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}]}
    payload = P.encode_request(API["Produce"], version, cid, "kstore-test", body)
    return struct.pack(">i", len(payload)) + payload


def reframe(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def rst_close(sock: socket.socket) -> None:
    """Close with a TCP reset instead of a FIN (SO_LINGER 0): a client that vanishes."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def latest_offset(c: Conn, topic: str, partition: int) -> int:
    response = c.call(API["ListOffsets"], 1, {"replica_id": -1, "topics": [
        {"name": topic, "partitions": [{"partition_index": partition, "timestamp": -1}]}]})
    part = response["topics"][0]["partitions"][0]
    assert part["error_code"] == 0
    return part["offset"]


def test_stalled_connections_are_closed_after_the_idle_timeout_without_blocking_others(inproc):
    broker, start = inproc
    broker.create_topic("stall", 1)
    rng = random.Random(8)
    server = start(idle_timeout_s=1.5)
    with Conn(server.port) as c:
        for _ in range(4):
            assert produce_raw(c, "stall", 0, random_batch(8, 100_000, rng))["error_code"] == 0
    valid = metadata_frame(topics=("stall",))
    stalls = {"half a size prefix": b"\x00\x00", "a size prefix, no request": struct.pack(">i", 100),
              "half a request": valid[:len(valid) // 2], "nothing at all": b"",
              "a large allowed frame, barely started": struct.pack(">i", 50_000_000) + b"x" * 1000}
    closed_before = server.stats.connections_closed
    socks = {}
    for name, data in stalls.items():
        socks[name] = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        socks[name].sendall(data)
    # a client that stops reading in the middle of a 3 MB response must not hold up the others
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    reader.connect(("127.0.0.1", server.port))
    reader.sendall(Conn.frame(Conn.__new__(Conn), API["Fetch"], 11,
                              fetch_body([("stall", 0, 0, 8 << 20)], max_bytes=8 << 20), cid=1)[1])
    t0 = time.monotonic()
    time.sleep(0.3)
    for name, s in socks.items():          # not closed yet: the timeout is 1.5 s
        s.setblocking(False)
        with pytest.raises(BlockingIOError):
            s.recv(1, socket.MSG_PEEK)
        s.setblocking(True)
    # a healthy client keeps going, fast, the whole time
    with Conn(server.port) as c:
        n = 0
        while time.monotonic() - t0 < 3.0:
            t = time.monotonic()
            assert produce_raw(c, "stall", 0, random_batch(1, 100, rng))["error_code"] == 0
            assert c.call(API["ApiVersions"], 2, {})["error_code"] == 0
            assert time.monotonic() - t < 1.0    # a blocked loop would hold it >= 1.5 s
            n += 1
            time.sleep(0.05)
        assert n > 10
    for name, s in socks.items():          # each closed by the broker after ~1.5 s idle
        s.settimeout(3)
        assert s.recv(1) == b"", name
        s.close()
    assert eventually(lambda: server.stats.connections_closed - closed_before >= len(stalls) + 1)
    rst_close(reader)


@pytest.fixture(scope="module")
def fault_env(tmp_path_factory):
    """One `kstore serve` process (auto topic creation off) with pre-created topics: `stable`
    (data that must never change), `live` (a healthy client produces and consumes on it through
    every fault test), `sink` (where fuzzed produce requests go) and `conc` (concurrency)."""
    log_dir = tmp_path_factory.mktemp("faults") / "logs"
    broker = Broker(str(log_dir))
    rng = random.Random(60)
    broker.create_topic("stable", 2)
    broker.create_topic("live", 1)
    broker.create_topic("sink", 2)
    broker.create_topic("conc", 4)
    for i, codec in enumerate(Compression):
        for p in (0, 1):
            broker.produce("stable", p, random_batch(10, 300, rng, codec), acks=1)
    for _ in range(4):   # a few MB in stable-1: responses that cannot fit in the socket buffers
        broker.produce("stable", 1, random_batch(8, 100_000, rng), acks=1)
    broker.group_coordinator          # creates __consumer_offsets
    broker.shutdown()
    env = type("FaultEnv", (), {})()
    env.log_dir = log_dir
    env.topic_dirs = sorted(p.name for p in log_dir.iterdir() if p.is_dir())
    env.stable_files = {p: segment_bytes(log_dir, "stable", p) for p in (0, 1)}
    env.snapshot = lambda: {str(f.relative_to(log_dir)): f.read_bytes()
                            for d in ("stable-0", "stable-1") for f in sorted((log_dir / d).iterdir())}
    env.before = env.snapshot()
    env.sp = ServeProcess(log_dir, "auto.create.topics.enable=false").start()
    env.healthy = HealthyClient(env.sp.bootstrap, "live").start()
    yield env
    env.healthy.stop()
    if env.sp.running():       # the last test stops it; if it did not run, stop cleanly here
        try:
            env.sp.stop()
        finally:
            env.sp.kill()


class HealthyClient:
    """A kafka-python producer (idempotent, acks=all) and consumer on their own topic, on their
    own threads, for as long as the fault tests run: every value must come back, in order."""

    def __init__(self, bootstrap: str, topic: str):
        self.bootstrap, self.topic = bootstrap, topic
        self.produced: list[bytes] = []
        self.consumed: list[bytes] = []
        self.errors: list[str] = []
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._producer_done = threading.Event()
        self._threads = [threading.Thread(target=self._produce, daemon=True),
                         threading.Thread(target=self._consume, daemon=True)]

    def start(self) -> "HealthyClient":
        for t in self._threads:
            t.start()
        assert self.wait_for_progress((0, 0)), f"the healthy client never got going: {self.errors}"
        return self

    def _produce(self) -> None:
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=0,
                                 request_timeout_ms=10000, max_block_ms=10000)
        try:
            i = 0
            while not self._stop.is_set():
                value = b"healthy-%08d" % i
                t = time.monotonic()
                try:
                    producer.send(self.topic, value=value, partition=0).get(timeout=15)
                except Exception as e:          # recorded, and fails the final check
                    self.errors.append(f"produce {i}: {e!r}")
                else:
                    self.latencies.append(time.monotonic() - t)
                    self.produced.append(value)
                i += 1
                time.sleep(0.01)
        finally:
            producer.close(timeout=5)
            self._producer_done.set()

    def _consume(self) -> None:
        consumer = kp_consumer(self.bootstrap)
        try:
            tp = TopicPartition(self.topic, 0)
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            deadline = None
            while True:
                if self._producer_done.is_set():
                    deadline = deadline or time.monotonic() + 15
                    if len(self.consumed) >= len(self.produced) or time.monotonic() > deadline:
                        return
                try:
                    for msgs in consumer.poll(timeout_ms=100).values():
                        self.consumed.extend(m.value for m in msgs)
                except Exception as e:
                    self.errors.append(f"consume: {e!r}")
                    time.sleep(0.1)
        finally:
            consumer.close()

    def mark(self) -> tuple[int, int]:
        return len(self.produced), len(self.consumed)

    def wait_for_progress(self, mark: tuple[int, int], timeout_s: float = 15.0) -> bool:
        return eventually(lambda: len(self.produced) >= mark[0] + 3 and len(self.consumed) >= mark[1] + 3,
                          timeout_s)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def check_unaffected(env, mark: tuple[int, int]) -> None:
    """The broker process is up, answers a new connection, still serves `stable` unchanged, and
    the healthy client made progress and saw no error since `mark`."""
    assert env.sp.running(), env.sp.read_output()
    with Conn(env.sp.port) as c:
        assert c.call(API["ApiVersions"], 2, {})["error_code"] == 0
        still_usable(c)
        response = c.call(API["Fetch"], 11, fetch_body([("stable", 0, 0, 16 << 20),
                                                         ("stable", 1, 0, 16 << 20)]))
        parts = by_partition(response)
        assert [parts[("stable", p)]["records"] for p in (0, 1)] == [env.stable_files[0], env.stable_files[1]]
    assert env.healthy.wait_for_progress(mark), "the healthy client stopped making progress"
    assert env.healthy.errors == []
    assert max(env.healthy.latencies) < 5.0


def test_malformed_frames_close_only_their_own_connection(fault_env):
    mark = fault_env.healthy.mark()
    valid = metadata_frame()[4:]
    batch = random_batch(2, 50, random.Random(9))
    produce = produce_frame("sink", 0, batch)[4:]
    header = struct.pack(">hhih", API["Metadata"], 4, 1, 4) + b"test"
    cases = {
        "an empty frame": b"",
        "a one-byte frame": b"\x00",
        "a header cut after the version": struct.pack(">hh", 3, 4),
        "a header cut inside the correlation id": struct.pack(">hhh", 3, 4, 0),
        "a client id longer than the frame": struct.pack(">hhih", 3, 4, 1, 1000) + b"abc",
        "a client id of length -2": struct.pack(">hhih", 3, 4, 1, -2),
        "a topic array of a million, no topics": header + struct.pack(">i", 1_000_000),
        "a topic array of length -5": header + struct.pack(">i", -5) + b"\x00",
        "a topic name that is not UTF-8": header + struct.pack(">ih", 1, 2) + b"\xff\xfe" + b"\x00",
        "a valid request with bytes after it": valid + b"junk!",
        "a produce cut inside its records": produce[:-10],
        "a produce whose records length is -7": produce[:produce.index(batch) - 4] + struct.pack(">i", -7),
        "a produce whose records run past the frame": produce[:produce.index(batch) - 4]
        + struct.pack(">i", len(batch) + 100) + batch,
    }
    with Conn(fault_env.sp.port) as bystander:
        sink_end = latest_offset(bystander, "sink", 0)
        for name, payload in cases.items():
            with Conn(fault_env.sp.port, timeout=5) as c:
                c.sock.sendall(reframe(payload))
                assert c.closed_by_peer(5.0) == b"", f"{name}: no reply, the connection closed"
            still_usable(bystander)
        assert latest_offset(bystander, "sink", 0) == sink_end
    check_unaffected(fault_env, mark)


def test_truncated_frames_and_clients_that_vanish_mid_request_or_mid_response(fault_env):
    mark = fault_env.healthy.mark()
    port = fault_env.sp.port
    batch = random_batch(3, 2000, random.Random(10))
    frames = [metadata_frame(), produce_frame("sink", 1, batch)]
    with Conn(port) as bystander:
        sink_end = latest_offset(bystander, "sink", 1)
        for frame in frames:
            for cut in sorted({1, 2, 3, 4, 5, 9, len(frame) // 2, len(frame) - 1}):
                # half-close after a partial frame: the broker closes without answering
                with Conn(port, timeout=5) as c:
                    c.sock.sendall(frame[:cut])
                    c.sock.shutdown(socket.SHUT_WR)
                    assert c.closed_by_peer(5.0) == b"", cut
                # or the client vanishes (FIN, or a reset)
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(frame[:cut])
                s.close()
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(frame[:cut])
                rst_close(s)
            still_usable(bystander)
        assert latest_offset(bystander, "sink", 1) == sink_end, "a partial produce appended"

        # vanish while a long poll waits: the broker's late answer goes nowhere
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            hw = latest_offset(bystander, "stable", 0)
            s.sendall(Conn.frame(Conn.__new__(Conn), API["Fetch"], 11,
                                 fetch_body([("stable", 0, hw, 1 << 20)], max_wait_ms=700), cid=1)[1])
            rst_close(s)
        # vanish in the middle of a multi-megabyte zero-copy response
        for i in range(10):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
            s.settimeout(5)
            s.connect(("127.0.0.1", port))
            s.sendall(Conn.frame(Conn.__new__(Conn), API["Fetch"], 11,
                                 fetch_body([("stable", 1, 0, 16 << 20)], max_bytes=16 << 20), cid=1)[1])
            assert len(s.recv(1000)) > 0
            rst_close(s) if i % 2 else s.close()
        time.sleep(1.0)     # let the long polls expire into their closed sockets
        still_usable(bystander)
    check_unaffected(fault_env, mark)


def test_oversized_and_negative_size_prefixes_close_the_connection_at_once(fault_env):
    mark = fault_env.healthy.mark()
    port = fault_env.sp.port
    for size in (MAX_REQUEST_SIZE + 1, 500_000_000, 2**31 - 1, -1, -100, -2**31):
        with Conn(port, timeout=5) as c:
            t = time.monotonic()
            c.sock.sendall(struct.pack(">i", size))       # and nothing more
            assert c.closed_by_peer(3.0) == b"", size
            assert time.monotonic() - t < 2.0
    # the limit itself is allowed: the broker waits for the rest of that frame
    with Conn(port, timeout=5) as c:
        c.sock.sendall(struct.pack(">i", MAX_REQUEST_SIZE) + b"\x00\x03\x00\x04")
        assert c.closed_by_peer(1.0) is None
    check_unaffected(fault_env, mark)


def test_unknown_api_keys_keep_the_connection_usable_on_the_process_broker(fault_env):
    mark = fault_env.healthy.mark()
    with Conn(fault_env.sp.port) as c:
        for i, key in enumerate((20, 45, 60, 999, -7)):   # DeleteTopics v0 (gone in Kafka 4), ...
            c.sock.sendall(header_v1_frame(key, 0, 900 + i, b"\x01\x02"))
            assert c.recv_frame() == struct.pack(">ih", 900 + i, E["UNSUPPORTED_VERSION"])
            still_usable(c)
    check_unaffected(fault_env, mark)


def fuzz_templates(rng: random.Random) -> list[bytes]:
    """Valid framed requests of every API and version the broker implements (produce and commit
    only to `sink`, everything else read-only)."""
    stable = [{"name": "stable"}]
    fetch_parts = [("stable", 0, 0, 4096), ("sink", 1, 0, 4096), ("stable", 1, 3, 100)]
    bodies = []
    for v in range(0, 3):
        bodies.append((API["ApiVersions"], v, {}))
    for v in range(0, 9):
        bodies.append((API["Metadata"], v, {"topics": stable + [{"name": "sink"}],
                                            "allow_auto_topic_creation": False}))
    for v in range(4, 12):
        bodies.append((API["Fetch"], v, fetch_body(fetch_parts, max_wait_ms=0)))
    for v in range(1, 6):
        bodies.append((API["ListOffsets"], v, {"replica_id": -1, "topics": [
            {"name": "stable", "partitions": [{"partition_index": 0, "timestamp": t}
                                              for t in (-1, -2, T0)]}]}))
    for v in range(0, 3):
        bodies.append((API["FindCoordinator"], v, {"key": "fuzz-group"}))
    for v in range(1, 6):
        bodies.append((API["OffsetFetch"], v, {"group_id": "fuzz-group",
                                               "topics": [{"name": "sink", "partition_indexes": [0, 1]}]}))
    for v in range(2, 8):
        bodies.append((API["OffsetCommit"], v, {"group_id": "fuzz-group", "topics": [
            {"name": "sink", "partitions": [{"partition_index": 0, "committed_offset": 1,
                                              "committed_metadata": "m"}]}]}))
    for v in range(0, 3):
        bodies.append((API["ListGroups"], v, {}))
    for v in range(1, 4):
        bodies.append((API["DescribeConfigs"], v, {"resources": [
            {"resource_type": 2, "resource_name": "stable", "configuration_keys": None},
            {"resource_type": 4, "resource_name": "", "configuration_keys": ["num.partitions"]}],
            "include_synonyms": True, "include_documentation": True}))
    for v in range(0, 2):
        bodies.append((API["InitProducerId"], v, {"transactional_id": None, "transaction_timeout_ms": 1000}))
    for v in range(3, 9):
        batch = random_batch(2, 40, rng, Compression(v % 5))
        bodies.append((API["Produce"], v, {"transactional_id": None, "acks": 1, "timeout_ms": 1000,
                                           "topic_data": [{"name": "sink", "partition_data": [
                                               {"index": v % 2, "records": batch}]}]}))
    return [reframe(P.encode_request(k, v, 7, "fuzz", b)) for k, v, b in bodies]


def mutate(frame: bytes, templates: list[bytes], rng: random.Random) -> bytes:
    data = bytearray(frame)
    op = rng.randrange(7)
    if op == 0:                       # flip a few random bytes (the size prefix included)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= rng.randint(1, 255)
    elif op == 1:                     # flip bytes in the body, keep the size prefix honest
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(4, len(data))] = rng.randrange(256)
    elif op == 2:                     # truncate
        data = data[:rng.randrange(len(data))]
    elif op == 3:                     # random bytes inserted, the size prefix adjusted
        pos = rng.randrange(4, len(data) + 1)
        data[pos:pos] = rng.randbytes(rng.randint(1, 64))
        data[0:4] = struct.pack(">i", len(data) - 4)
    elif op == 4:                     # an int16/int32 field set to an extreme
        pos = rng.randrange(4, len(data) - 4)
        data[pos:pos + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00"])
    elif op == 5:                     # a valid request followed by a mutated one
        data = bytearray(rng.choice(templates)) + mutate(frame, templates, rng)
    else:                             # two requests spliced together
        other = rng.choice(templates)
        cut = rng.randrange(4, len(data))
        data = data[:cut] + other[rng.randrange(4, len(other)):]
        data[0:4] = struct.pack(">i", len(data) - 4)
    return bytes(data)


def well_formed_frames(data: bytes) -> bool:
    pos = 0
    while pos < len(data):
        if len(data) - pos < 8:
            return False
        (size,) = struct.unpack_from(">i", data, pos)
        if size < 4 or pos + 4 + size > len(data):
            return False
        pos += 4 + size
    return True


def test_fuzz_random_bytes_and_mutated_requests(fault_env):
    """600 connections (seeded): pure garbage, garbage behind a plausible header, and valid
    requests of every API/version mutated. Each sends, half-closes and reads until the broker
    closes. The broker must stay up; whatever it answers must be whole response frames."""
    mark = fault_env.healthy.mark()
    port = fault_env.sp.port
    templates = fuzz_templates(random.Random(11))
    seed = 20_240_606

    def one(i: int) -> str:
        rng = random.Random(seed * 1000 + i)
        kind = i % 3
        if kind == 0:
            data = rng.randbytes(rng.randint(0, 3000))
        elif kind == 1:
            key = rng.choice(list(P.SUPPORTED) + [rng.randint(-5, 100)])    # a valid header v1,
            header = struct.pack(">hhih", key, rng.randint(-1, 12), i, 4) + b"fuzz"  # garbage body
            data = reframe(header + rng.randbytes(rng.randint(0, 500)))
        else:
            data = mutate(rng.choice(templates), templates, rng)
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            try:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
            except OSError:                      # EPIPE, ECONNRESET, ENOTCONN
                return "closed"                   # closed by the broker while we were sending
            got = bytearray()
            s.settimeout(4)
            try:
                while chunk := s.recv(65536):
                    got += chunk
            except ConnectionResetError:
                pass
            except socket.timeout:
                return "timeout"                  # e.g. a fetch whose max_wait_ms was mutated up
            assert well_formed_frames(bytes(got)), (i, data[:64], bytes(got[:64]))
            return "answered" if got else "closed"
        finally:
            s.close()

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(one, range(600)))
    counts = {k: outcomes.count(k) for k in ("answered", "closed", "timeout")}
    print("fuzz", counts, "answered by kind:", [outcomes[k::3].count("answered") for k in range(3)])
    assert counts["answered"] >= 50 and counts["closed"] >= 200 and counts["timeout"] <= 30, counts
    check_unaffected(fault_env, mark)


def test_fifty_concurrent_clients(fault_env):
    """50 threads, each on its own connection, start together: ApiVersions, Metadata, Produce
    (its own batch, a codec and version of its own) and a Fetch that must return that batch."""
    mark = fault_env.healthy.mark()
    port = fault_env.sp.port
    with Conn(port) as c:
        start_offsets = {p: latest_offset(c, "conc", p) for p in range(4)}
    barrier = threading.Barrier(50, timeout=30)

    def client(i: int) -> tuple[int, int]:
        with Conn(port, timeout=20) as c:
            barrier.wait()
            assert c.call(API["ApiVersions"], i % 3, {})["error_code"] == 0
            md = c.call(API["Metadata"], 4 + i % 5, {"topics": [{"name": "conc"}],
                                                      "allow_auto_topic_creation": False})
            assert [len(t["partitions"]) for t in md["topics"]] == [4]
            batch = build_batch([Record(b"client-%d" % i, b"value-%d-%d|" % (i, j) * 20, T0 + j)
                                 for j in range(5)], compression=Compression(i % 5))
            pr = produce_raw(c, "conc", i % 4, batch, version=3 + i % 6)
            assert pr["error_code"] == 0
            response = c.call(API["Fetch"], 4 + i % 8,
                              fetch_body([("conc", i % 4, pr["base_offset"], len(batch))]))
            records = by_partition(response)[("conc", i % 4)]["records"]
            assert same_batch(records[:len(batch)], batch)
            return i % 4, pr["base_offset"]

    t = time.monotonic()
    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(client, range(50)))
    assert time.monotonic() - t < 60
    with Conn(port) as c:
        for p in range(4):
            bases = sorted(b for q, b in results if q == p)
            assert bases == list(range(start_offsets[p], start_offsets[p] + 5 * len(bases), 5))
            assert latest_offset(c, "conc", p) == start_offsets[p] + 5 * len(bases)
    check_unaffected(fault_env, mark)


def test_pipelined_requests_are_answered_in_order(fault_env):
    """Sixty requests in one write: a long-polling Fetch first, then produces (one with acks=0,
    which gets no answer), commits and reads of what came before. The answers come in request
    order, each correct for the state the requests before it left."""
    mark = fault_env.healthy.mark()
    rng = random.Random(12)
    with Conn(fault_env.sp.port, timeout=20) as c:
        end = latest_offset(c, "sink", 1)
        plan = [(API["Fetch"], 11, fetch_body([("sink", 1, end, 1 << 20)], max_wait_ms=500), "poll")]
        expected_end = end
        for i in range(10):
            acks = 0 if i == 4 else 1
            batch = random_batch(2, 30, rng)
            plan.append((API["Produce"], 3 + i % 6, {"acks": acks, "timeout_ms": 5000, "topic_data": [
                {"name": "sink", "partition_data": [{"index": 1, "records": batch}]}]},
                ("produce", expected_end, acks)))
            expected_end += 2
            plan.append((API["ListOffsets"], 1 + i % 5, {"replica_id": -1, "topics": [
                {"name": "sink", "partitions": [{"partition_index": 1, "timestamp": -1}]}]},
                ("end", expected_end)))
            plan.append((API["OffsetCommit"], 2 + i % 6, {"group_id": "pipeline", "topics": [
                {"name": "sink", "partitions": [{"partition_index": 1, "committed_offset": 100 + i,
                                                  "committed_metadata": None}]}]}, "commit"))
            plan.append((API["OffsetFetch"], 1 + i % 5, {"group_id": "pipeline", "topics": [
                {"name": "sink", "partition_indexes": [1]}]}, ("committed", 100 + i)))
            plan.append((API["ApiVersions"], i % 3, {}, "versions"))
        plan.append((API["Fetch"], 11, fetch_body([("sink", 1, end, 1 << 20)]), ("fetched", expected_end)))
        assert len(plan) == 52
        data, order = bytearray(), []
        for n, (key, version, body, check) in enumerate(plan):
            cid, frame = c.frame(key, version, body, cid=10_000 + n)
            data += frame
            if not (key == API["Produce"] and body["acks"] == 0):
                order.append((cid, key, version, check))
        t = time.monotonic()
        c.sock.sendall(data)
        for cid, key, version, check in order:
            got, body = P.decode_response(key, version, c.recv_frame())
            assert got == cid, "answers must come in request order"
            if check == "poll":
                assert time.monotonic() - t >= 0.45       # nothing was answered before it
                assert not by_partition(body)[("sink", 1)]["records"]
            elif check[0] == "produce":
                part = body["responses"][0]["partition_responses"][0]
                assert (part["error_code"], part["base_offset"]) == (0, check[1])
            elif check[0] == "end":
                assert body["topics"][0]["partitions"][0]["offset"] == check[1]
            elif check[0] == "committed":
                assert body["topics"][0]["partitions"][0]["committed_offset"] == check[1]
            elif check[0] == "fetched":
                batches = MemoryRecords(by_partition(body)[("sink", 1)]["records"]).batches()
                assert batches[-1].next_offset == check[1] and len(batches) == 10
    check_unaffected(fault_env, mark)


def test_after_the_faults_the_healthy_client_got_everything_and_stored_data_is_unchanged(fault_env):
    """Runs last: stop the healthy client, stop the broker (SIGTERM, clean), compare."""
    healthy = fault_env.healthy
    healthy.stop()
    assert healthy.errors == []
    assert len(healthy.produced) >= 6       # (hundreds when every fault test ran)
    assert healthy.consumed == healthy.produced, "every value, once, in order"
    fault_env.sp.stop()
    assert fault_env.snapshot() == fault_env.before, "the `stable` partition files changed"
    dirs = sorted(p.name for p in fault_env.log_dir.iterdir() if p.is_dir())
    assert dirs == fault_env.topic_dirs, "a topic appeared (auto-creation is off)"
    manager = LogManager.open(str(fault_env.log_dir))
    try:
        for p in (0, 1):
            log = manager.get_log("stable", p)
            assert log.read(0, 64 << 20).records.read_bytes() == fault_env.stable_files[p]
    finally:
        manager.shutdown()

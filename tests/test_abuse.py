"""`kstore serve` under abuse, on loopback: a huge CreateTopics, thousands of idle connections,
running out of descriptors, slow-loris partial frames, oversized and garbage frames from several
connections at once. After each: a normal client produces and consumes within seconds, the
broker's descriptors (/proc/PID/fd) stay bounded, the stored data is unchanged, and the broker
restarts on the same log dir.

Counts are bounded for CI; KSTORE_ABUSE_SCALE=N multiplies them for a longer run.
"""

from __future__ import annotations

import hashlib
import os
import resource
import socket
import struct
import threading
import time
import uuid
from pathlib import Path

import pytest

from kstore.broker import Broker
from kstore.producer import Producer
from test_clients import kp_consume, kp_produce, make_records, serve_processes  # noqa: F401

SCALE = max(1, int(os.environ.get("KSTORE_ABUSE_SCALE", "1")))
KEEP = [f"kept-{i}".encode() for i in range(20)]


@pytest.fixture(scope="module", autouse=True)
def raise_own_open_file_limit():
    """The test process opens thousands of sockets too: raise its soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def log_dir(tmp_path) -> Path:
    """A log dir with data that must survive every abuse unchanged."""
    d = tmp_path / "logs"
    with Broker(str(d)) as broker:
        broker.create_topic("keep", 1)
        producer = Producer(broker)
        for v in KEEP:
            producer.send("keep", v)
        producer.close()
    return d


def data_hashes(log_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(log_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((log_dir / "keep-0").glob("*.log"))}


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def open_sockets(pid: int) -> int:
    """The process's sockets only: files it opens and closes meanwhile (segments, indexes,
    checkpoints) do not blur a count of held connections."""
    def is_socket(fd: str) -> bool:
        try:
            return os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:            # closed between the listing and the look
            return False
    return sum(map(is_socket, os.listdir(f"/proc/{pid}/fd")))


def settled_sockets(pid: int, timeout_s: float = 5.0) -> int:
    """The socket count once the start-up probe's connection is gone: the probe's client has
    closed it when start() returns, but the broker may take a moment to see its end."""
    deadline = time.monotonic() + timeout_s
    count = open_sockets(pid)
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = open_sockets(pid)
        if now == count:
            return count
        count = now
    return count


def assert_healthy(server, log_dir: Path, hashes: dict, fd_bound: int, timeout_s: float = 30):
    """A normal client produces and consumes; descriptors bounded; stored data unchanged."""
    deadline = time.monotonic() + timeout_s
    topic = f"probe-{uuid.uuid4().hex[:6]}"
    recs = make_records("probe", 5)
    kp_produce(server.bootstrap, topic, 0, recs, acks="all", codec="none")
    got = kp_consume(server.bootstrap, topic, 0, len(recs))
    assert [r["value"] for r in got] == [r["value"] for r in recs]
    assert [r["value"] for r in kp_consume(server.bootstrap, "keep", 0, len(KEEP))] == KEEP
    assert time.monotonic() < deadline, "the broker took too long to serve a normal client"
    fds = wait_for(lambda: open_fds(server.proc.pid) <= fd_bound, 20,
                   lambda: open_fds(server.proc.pid))
    assert fds <= fd_bound
    assert data_hashes(log_dir) == hashes


def wait_for(done, timeout_s: float, value):
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.1)
    return value()


def restart_and_check(server, log_dir: Path, hashes: dict) -> None:
    server.stop()
    server.start()
    assert [r["value"] for r in kp_consume(server.bootstrap, "keep", 0, len(KEEP))] == KEEP
    assert data_hashes(log_dir) == hashes


def close_then_check(server, log_dir: Path, hashes: dict, baseline: int, socks) -> None:
    """Once the abusers are gone: a normal client is served, descriptors are back near where
    they started, and the broker restarts on the same log dir."""
    for s in socks:
        s.close()
    assert_healthy(server, log_dir, hashes, baseline + 20)
    restart_and_check(server, log_dir, hashes)


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
    return s


def closed_now(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except BlockingIOError:
        return False


def closed_by_peer(s: socket.socket, timeout_s: float = 10) -> bool:
    s.settimeout(timeout_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


# ------------------------------------------------------------------------------ partitions
def test_huge_create_topics_is_refused_and_many_partitions_stay_cheap(log_dir, serve_processes):
    from kafka.admin import KafkaAdminClient, NewPartitions, NewTopic
    from kafka.errors import PolicyViolationError
    hashes = data_hashes(log_dir)
    many = 500 * SCALE
    limit = max(2000, 2 * many)
    server = serve_processes(log_dir, f"max.broker.partitions={limit}")
    baseline = open_fds(server.proc.pid)
    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=60000)
    try:
        started = time.monotonic()
        with pytest.raises(PolicyViolationError) as e:
            admin.create_topics([NewTopic("huge", 10_000, 1)])
        assert f"max.broker.partitions={limit}" in str(e.value)
        assert time.monotonic() - started < 10          # refused up front, nothing written
        assert not any(p.name.startswith("huge-") for p in log_dir.iterdir())
        admin.create_topics([NewTopic("many", many, 1)])
        with pytest.raises(PolicyViolationError):
            admin.create_partitions({"many": NewPartitions(limit + 1)})
    finally:
        admin.close()
    # Lazy indexes: an idle partition costs its .log descriptor only, not three.
    assert open_fds(server.proc.pid) <= baseline + many + 50
    assert_healthy(server, log_dir, hashes, baseline + many + 50)
    server.stop()
    server.start()
    assert open_fds(server.proc.pid) <= baseline + many + 50   # and so after a restart
    assert_healthy(server, log_dir, hashes, baseline + many + 50)


# ------------------------------------------------------------------------------ connections
def test_thousands_of_idle_connections_opened_and_closed(log_dir, serve_processes):
    hashes = data_hashes(log_dir)
    server = serve_processes(log_dir)
    baseline = open_fds(server.proc.pid)
    # several thousand; a longer run is capped below both processes' descriptor limits
    count = min(3000 * SCALE, resource.getrlimit(resource.RLIMIT_NOFILE)[1] - 2000)
    sockets = settled_sockets(server.proc.pid)
    socks = [connect(server.port) for _ in range(count)]
    assert wait_for(lambda: open_sockets(server.proc.pid) >= sockets + count, 30,
                    lambda: open_sockets(server.proc.pid)) >= sockets + count   # every one held
    assert_healthy(server, log_dir, hashes, baseline + count + 50)   # while they are held
    close_then_check(server, log_dir, hashes, baseline, socks)


def test_max_connections_per_ip_closes_the_extra_ones(log_dir, serve_processes):
    hashes = data_hashes(log_dir)
    server = serve_processes(log_dir, "max.connections.per.ip=50")
    baseline = open_fds(server.proc.pid)
    socks = [connect(server.port) for _ in range(200)]
    time.sleep(1)
    closed = [closed_now(s) for s in socks]
    assert sum(closed) == 150            # Kafka: over the limit, the connection is closed at once
    assert open_fds(server.proc.pid) <= baseline + 50 + 5
    for s in socks:
        s.close()
    assert_healthy(server, log_dir, hashes, baseline + 20)
    assert "Rejected connection from 127.0.0.1" in server.read_output()


def test_max_connections_makes_new_clients_wait_not_fail(log_dir, serve_processes):
    from test_clients import api_versions_ok
    server = serve_processes(log_dir, "max.connections=20")
    held = [connect(server.port) for _ in range(20)]
    time.sleep(0.5)
    assert not api_versions_ok(server.port, 1.0)      # waits in the backlog, unanswered
    for s in held[:5]:
        s.close()
    assert api_versions_ok(server.port, 10.0)          # accepted once a slot is free
    for s in held[5:]:
        s.close()


def test_accept_loop_survives_running_out_of_descriptors(log_dir, serve_processes):
    hashes = data_hashes(log_dir)
    server = serve_processes(log_dir)
    pid = server.proc.pid
    limit = open_fds(pid) + 100
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
    # more than the broker can hold; the rest wait in the listen backlog (128)
    socks = [connect(server.port) for _ in range(160)]
    wait_for(lambda: "accept failed" in server.read_output(), 20, lambda: None)
    output = server.read_output()
    assert output.count("accept failed (Too many open files)") == 1   # said once
    for s in socks:
        s.close()
    assert_healthy(server, log_dir, hashes, limit)          # accepts again once fds are free
    assert "accepting connections again" in server.read_output()
    restart_and_check(server, log_dir, hashes)


# ------------------------------------------------------------------------------ frames
def test_slow_loris_partial_frames(log_dir, serve_processes):
    hashes = data_hashes(log_dir)
    server = serve_processes(log_dir, "connections.max.idle.ms=3000")
    baseline = open_fds(server.proc.pid)
    socks = []
    for i in range(200 * SCALE):
        s = connect(server.port)
        # half a size prefix, or a size and part of the frame, then silence
        s.sendall(b"\x00\x00" if i % 2 else struct.pack(">i", 100) + b"\x00\x12\x00")
        socks.append(s)
    assert_healthy(server, log_dir, hashes, baseline + len(socks) + 50)   # others still served
    assert all(closed_by_peer(s, 20) for s in socks)     # each stalled frame times out alone
    close_then_check(server, log_dir, hashes, baseline, socks)


def test_oversized_and_garbage_frames_from_many_connections_at_once(log_dir, serve_processes):
    hashes = data_hashes(log_dir)
    server = serve_processes(log_dir, "socket.request.max.bytes=1048576")
    baseline = open_fds(server.proc.pid)
    rng = __import__("random").Random(16)
    frames = [
        struct.pack(">i", 0x7FFFFFFF) + b"x" * 100,            # far above socket.request.max.bytes
        struct.pack(">i", 1048577) + b"\x00" * 1000,            # one byte above
        struct.pack(">i", -1),                                   # negative size
        struct.pack(">i", 0),                                    # empty frame
        struct.pack(">i", 8) + b"\xff" * 8,                      # a header that does not parse
        struct.pack(">i", 30) + struct.pack(">hhi", 0, 99, 1) + b"\x00" * 22,   # Produce v99
    ]
    outcomes = []

    def attack(i: int) -> None:
        for j in range(20 * SCALE):
            s = connect(server.port)
            frame = frames[(i + j) % len(frames)] if j % 3 else \
                struct.pack(">i", 64) + bytes(rng.getrandbits(8) for _ in range(64))
            try:
                s.sendall(frame)
                outcomes.append(closed_by_peer(s, 10) or s.recv(65536) != b"")
            except OSError:
                outcomes.append(True)   # reset by the broker while sending: closed too
            finally:
                s.close()

    threads = [threading.Thread(target=attack, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(outcomes) == 8 * 20 * SCALE and all(outcomes)
    close_then_check(server, log_dir, hashes, baseline, [])


# ------------------------------------------------------------------------------ the bookkeeping
def test_connection_quotas_count_per_address_with_overrides():
    from kstore.connection_quotas import ConnectionQuotas, TooManyConnectionsError, parse_overrides
    from kstore.errors import ConfigError
    assert parse_overrides("10.0.0.1:5, ::1:7") == {"10.0.0.1": 5, "::1": 7}
    with pytest.raises(ConfigError, match="max.connections.per.ip.overrides"):
        parse_overrides("10.0.0.1")
    quotas = ConnectionQuotas(3, 1, {"10.0.0.9": 2})
    quotas.inc("10.0.0.1")
    with pytest.raises(TooManyConnectionsError, match="maximum of 1 connections"):
        quotas.inc("10.0.0.1")
    quotas.inc("10.0.0.9")
    quotas.inc("10.0.0.9")
    assert quotas.at_max_connections()
    quotas.dec("10.0.0.9")
    assert not quotas.at_max_connections() and quotas.per_ip == {"10.0.0.1": 1, "10.0.0.9": 1}


def test_a_handler_bug_is_logged_and_closes_only_its_connection(tmp_path, caplog):
    """An exception no handler expected (a bug) is in the broker's log with its stack, naming the
    request; that connection closes and the others carry on. A scheduled task that keeps failing
    is logged when it first fails, not every 50 ms."""
    from kstore import protocol as P
    from kstore.server import KafkaServer
    from test_clients import Conn

    broker = Broker(str(tmp_path / "logs"))
    server = KafkaServer(broker, "127.0.0.1", 0).start_in_thread()
    caplog.set_level("INFO", logger="kstore.server")
    try:
        def broken(version, body, header):
            raise KeyError("a bug")
        server._handler_table = {**server._handlers(), P.API_KEYS["ListGroups"]: broken}
        with Conn(server.port) as ok, Conn(server.port) as hit:
            assert ok.call(P.API_KEYS["ApiVersions"], 2, {})["error_code"] == 0
            hit.send(P.API_KEYS["ListGroups"], 2, {})
            assert hit.closed_by_peer() == b""
            assert ok.call(P.API_KEYS["Metadata"], 4, {"topics": None})["brokers"]   # still served
        (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
        assert "Unexpected error handling request ListGroups v2 (correlation id 1, client " \
               "'kstore-test') from 127.0.0.1" in record.getMessage()
        assert "KeyError: 'a bug'" in caplog.text

        caplog.clear()
        purgatory = broker.replica_manager.check_purgatory
        broker.replica_manager.check_purgatory = lambda: 1 / 0
        time.sleep(0.6)                                      # about a dozen timer rounds
        broker.replica_manager.check_purgatory = purgatory
        errors = [r for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and "scheduled tasks" in errors[0].getMessage()
        assert "ZeroDivisionError" in caplog.text
    finally:
        server.stop()
        broker.shutdown()

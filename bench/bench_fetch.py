"""Read path over the network: zero-copy Fetch vs the copy path vs plain sendfile; real clients.

1. Fetch throughput over loopback, for fetch sizes 64 KiB … 16 MiB, in one run, on ONE segment
   file (~256 MB × scale of 100-byte records in ~16 KB batches, just written, so in the page
   cache). Four servers run at the same time, each in its own process:
   * kstore sendfile — `kstore serve` (KafkaServer, zero_copy=True): Fetch v11 requests from a raw
     socket client built with `kstore.protocol`; the broker writes the response header from memory
     and the record bytes with os.sendfile;
   * kstore copy — `kstore serve --copy-fetch` (zero_copy=False) on a copy of the log dir (a log
     dir takes one broker): the record bytes are read into Python bytes and sent;
   * plain sendfile, request/response — a tiny blocking server (this file, --plain-sendfile-server)
     that answers each 12-byte request (position, count) with one os.sendfile of that range of the
     same segment file: the same round trips with no Kafka protocol, no asyncio, no log lookup;
     like the kstore clients, its client keeps one connection for the whole run;
   * plain sendfile, stream — the same server streaming the file with os.sendfile in chunks of the
     fetch size, no requests at all. The faster of the two plain modes is "the physical limit" the
     ratios divide by (with 2 CPUs, streaming needs both at once and can lose to request/response).
   Every server sets the same socket buffers on its connections: the broker's defaults, Kafka's
   socket.send.buffer.bytes = socket.receive.buffer.bytes = 102400 (the plain server is given the
   same values). Part 1b repeats the ≥ 1 MiB sizes for kstore sendfile and the plain modes with
   -1 (the kernel sizes and grows the buffers): faster and much less even on loopback, and the
   broker's own work per fetch weighs more there.
   For each size, 7 trials of 0.3 s × scale per mode, the modes interleaved (rotated) so that
   background load hits all of them alike. MB/s is given as the best trial and as the median of
   the trials; CPU is summed over all trials. The ratio to plain sendfile that the goal uses is
   median ÷ median: on loopback a single trial can run twice as fast as the others (one plain
   trial did, 4.2 vs 1.8-2.0 GB/s), and a best-of ratio then measures that one trial's luck.
   Both ratios are stored. The kstore clients walk the log like a consumer (next fetch offset =
   after the last complete batch received, back to 0 at the end). Throughput counts record bytes
   delivered (MB = 10^6 bytes). The first response of every kstore trial is checked byte for byte
   against the segment file.

   How CPU time is measured: each server process's total CPU time comes from its CPU-time clock
   (clock_getcpuclockid(3) + time.clock_gettime: nanoseconds, all threads), the user/system split
   from /proc/<pid>/stat (utime/stime, what getrusage reports for a process; 10 ms ticks). The
   client is one thread: time.thread_time() and getrusage(RUSAGE_THREAD). Both are reported as
   CPU seconds per GB delivered. sendfile moves the bytes inside the kernel (system time, almost
   no user time per byte); the copy path adds a pread into a Python bytes object and a send from
   it. Loopback TCP processing is charged to whichever process is in the kernel when it runs, so
   server + client ("total") is the fairest sum.

2. End-to-end: records/s for kafka-python and confluent-kafka producing, then consuming, N
   100-byte records (random values, key None, no compression, idempotent acks=all producers) to
   one partition of a `kstore serve` process, plus the broker's CPU seconds per phase.
   N = 1,000,000 × scale for confluent-kafka; kafka-python (pure Python: 1M records take ~40 s
   here, which would double the benchmark's runtime) uses 250,000 × scale by default —
   KSTORE_BENCH_E2E_FULL=1 makes it 1,000,000 × scale too. The counts used are printed and stored
   in the JSON ("e2e_records", "e2e_note").

Run:  .venv/bin/python bench/bench_fetch.py      (env KSTORE_BENCH_SCALE scales volumes/durations)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import os
import random
import resource
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import MB, SCALE, now  # noqa: E402

from kstore import protocol as P  # noqa: E402

KiB, MiB = 1024, 1024 * 1024
FETCH_SIZES = (64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB)
LOG_BYTES = max(32 * MiB, int(256 * MiB * SCALE))
TRIALS = 7
TRIAL_SECONDS = 0.3 * max(SCALE, 0.2)       # per trial; trials of the four modes interleaved
RECORDS_PER_BATCH = 150          # ~16.5 KB batches: several per 64 KiB fetch
VALUE_SIZE = 100
TOPIC = "fetch-bench"
E2E_FULL = os.environ.get("KSTORE_BENCH_E2E_FULL") == "1"
E2E_RECORDS = {"confluent-kafka": max(10_000, int(1_000_000 * SCALE)),
               "kafka-python": max(10_000, int((1_000_000 if E2E_FULL else 250_000) * SCALE))}
CLK_TCK = os.sysconf("SC_CLK_TCK")
MODES = ("kstore_sendfile", "kstore_copy", "plain_sendfile_rr", "plain_sendfile_stream")
OS_MODES = ("kstore_sendfile", "plain_sendfile_rr", "plain_sendfile_stream")
LABELS = {"kstore_sendfile": "kstore broker serving Fetch, sendfile (client decodes no records)",
          "kstore_copy": "kstore broker serving Fetch, copy path (client decodes no records)",
          "plain_sendfile_rr": "plain sendfile, request/response",
          "plain_sendfile_stream": "plain sendfile, stream"}


# ------------------------------------------------------------------------------ processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def process_clock(pid: int) -> int:
    """The CPU-time clock of another process (clock_getcpuclockid(3)): nanosecond resolution."""
    clock = ctypes.c_int()
    if _libc.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
        raise OSError(ctypes.get_errno(), f"clock_getcpuclockid({pid})")
    return clock.value


def process_cpu(pid: int, clock: int) -> tuple[float, float, float]:
    """(total, user, system) CPU seconds of a whole process: the total from its CPU clock, the
    user/system split from /proc/<pid>/stat (utime, stime: what getrusage reports, in ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return time.clock_gettime(clock), int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def thread_cpu() -> tuple[float, float, float]:
    """(total, user, system) CPU seconds of the calling thread."""
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return time.thread_time(), r.ru_utime, r.ru_stime


def wait_listening(proc: subprocess.Popen, port: int, timeout_s: float = 30.0) -> None:
    deadline = now() + timeout_s
    while now() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not listen on {port} within {timeout_s} s")


class Server:
    """A server child process (kstore serve, or this file's plain sendfile server)."""

    def __init__(self, args: list[str], log: Path, env: dict | None = None):
        self.port = free_port()
        self.log = open(log, "ab")
        self.proc = subprocess.Popen([sys.executable, *args, "--port", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=common.ROOT,
                                     env={**os.environ, **(env or {})})
        wait_listening(self.proc, self.port)
        self.clock = process_clock(self.proc.pid)

    def cpu(self) -> tuple[float, float, float]:
        return process_cpu(self.proc.pid, self.clock)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def kstore_serve(log_dir: Path, *extra: str, pure_python: bool = False) -> Server:
    """`kstore serve` in its own process; pure_python=True sets KSTORE_PURE_PYTHON=1 (the broker
    then validates and stamps batches with the pure-Python codec)."""
    env = {"KSTORE_PURE_PYTHON": "1"} if pure_python else {"KSTORE_PURE_PYTHON": ""}
    return Server(["-m", "kstore", "serve", "--log-dir", str(log_dir), *extra],
                  log_dir.parent / "serve-output.txt", env=env)


def plain_sendfile_server(path: str, port: int, send_buffer: int = -1, receive_buffer: int = -1) -> None:
    """`bench_fetch.py --plain-sendfile-server FILE --port N [--send-buffer B --receive-buffer B]`:
    a blocking thread per connection (the benchmark keeps a request/response connection open and
    opens stream connections beside it; one is busy at a time); each 12-byte request (int64
    position, int32 count) is answered with os.sendfile of that range; a negative count streams
    the whole file round and round in chunks of -count. The buffer sizes are set on each accepted
    connection as the broker sets socket.send/receive.buffer.bytes (-1: the OS default)."""
    import threading

    fd = os.open(path, os.O_RDONLY)
    file_size = os.fstat(fd).st_size
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(8)

    def serve(conn: socket.socket) -> None:
        out = conn.fileno()
        try:
            while True:
                req = b""
                while len(req) < 12:
                    chunk = conn.recv(12 - len(req))
                    if not chunk:
                        raise ConnectionError
                    req += chunk
                position, count = struct.unpack(">qi", req)
                if count >= 0:
                    sent = 0
                    while sent < count:
                        sent += os.sendfile(out, fd, position + sent, count - sent)
                else:
                    position = 0
                    while True:
                        n = min(-count, file_size - position)
                        position += os.sendfile(out, fd, position, n)
                        if position >= file_size:
                            position = 0
        except (ConnectionError, OSError):
            conn.close()

    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for buffer_size, option in ((send_buffer, socket.SO_SNDBUF), (receive_buffer, socket.SO_RCVBUF)):
            if buffer_size != -1:
                conn.setsockopt(socket.SOL_SOCKET, option, buffer_size)
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


# ------------------------------------------------------------------------------ the data
def build_log(log_dir: Path) -> tuple[Path, int, int]:
    """One partition, ~LOG_BYTES of 100-byte random records in ~16 KB batches: 64 distinct
    batches appended round-robin (the log assigns offsets). Returns (segment file, size, HW)."""
    from kstore.broker import Broker
    from kstore.records import Record, build_batch

    rng = random.Random(42)
    ts = int(time.time() * 1000)
    templates = [build_batch([Record(None, rng.randbytes(VALUE_SIZE), ts) for _ in range(RECORDS_PER_BATCH)])
                 for _ in range(64)]
    broker = Broker(str(log_dir))
    try:
        broker.create_topic(TOPIC, 1)
        written = 0
        i = 0
        while written < LOG_BYTES:
            batch = templates[i % len(templates)]
            broker.produce(TOPIC, 0, batch, acks=1)     # as a Produce request would
            written += len(batch)
            i += 1
        hw = broker.get_log(TOPIC, 0).high_watermark
        assert hw == i * RECORDS_PER_BATCH
    finally:
        broker.shutdown()
    segment = next((log_dir / f"{TOPIC}-0").glob("*.log"))
    return segment, segment.stat().st_size, hw


# ------------------------------------------------------------------------------ clients
def recv_into_exactly(sock: socket.socket, view: memoryview, n: int) -> None:
    got = 0
    while got < n:
        k = sock.recv_into(view[got:n])
        if k == 0:
            raise ConnectionError("server closed the connection")
        got += k


_LENGTH = struct.Struct(">i")


def next_offset(buf, start: int, end: int) -> int:
    """The offset after the last complete batch in buf[start:end] (−1: none complete). Only the
    lengths are read on the way; base offset and last offset delta of the last batch alone."""
    pos, last = start, -1
    length_at = _LENGTH.unpack_from
    while end - pos >= 61:
        size = 12 + length_at(buf, pos + 8)[0]
        if pos + size > end:
            break
        last, pos = pos, pos + size
    if last < 0:
        return -1
    return struct.unpack_from(">q", buf, last)[0] + struct.unpack_from(">i", buf, last + 23)[0] + 1


class KstoreClient:
    """A raw-socket Fetch v11 client that walks the log like a consumer."""

    def __init__(self, port: int, hw: int):
        self.sock = connect(port)
        self.buf = bytearray(max(FETCH_SIZES) + 64 * KiB)
        self.view = memoryview(self.buf)
        self.hw, self.cid = hw, 0
        self._request = None   # (fetch size, framed request, position of its fetch offset)
        self.head = 4 + 4 + 2 + 4 + 4 + 2 + len(TOPIC) + 4 + 4   # correlation id .. partition index
        self.records_at = self.head + 2 + 8 + 8 + 8 + 4 + 4 + 4   # error .. records length

    def fetch(self, offset: int, size: int) -> tuple[int, int]:
        """One Fetch round trip: (where the records start in self.buf, their length). The request
        is encoded once per fetch size with kstore.protocol; each fetch patches its correlation id
        and fetch offset in place (a client's cost per request is not what is measured)."""
        self.cid += 1
        if self._request is None or self._request[0] != size:
            body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": size,
                    "topics": [{"topic": TOPIC, "partitions": [
                        {"partition": 0, "fetch_offset": -7777, "partition_max_bytes": size}]}]}
            req = P.encode_request(P.API_KEYS["Fetch"], 11, 0, "bench", body)
            framed = bytearray(struct.pack(">i", len(req)) + req)
            self._request = (size, framed, framed.index(struct.pack(">q", -7777)))
        _, framed, at = self._request
        struct.pack_into(">i", framed, 8, self.cid)          # size, api key, version, cid
        struct.pack_into(">q", framed, at, offset)
        self.sock.sendall(framed)
        recv_into_exactly(self.sock, self.view, 4)
        (frame,) = struct.unpack_from(">i", self.buf, 0)
        recv_into_exactly(self.sock, self.view, frame)
        (cid,) = struct.unpack_from(">i", self.buf, 0)
        (error,) = struct.unpack_from(">h", self.buf, self.head)
        (aborted,) = struct.unpack_from(">i", self.buf, self.head + 2 + 24)
        (length,) = struct.unpack_from(">i", self.buf, self.records_at - 4)
        if cid != self.cid or error or aborted != -1 or self.records_at + length != frame:
            raise RuntimeError(f"unexpected fetch response (cid {cid}, error {error})")
        return self.records_at, length

    def trial(self, server: Server, size: int, seconds: float, segment: bytes) -> dict:
        start, length = self.fetch(0, size)       # warm-up, and a check of the bytes served
        if self.view[start:start + length] != segment[:length]:
            raise RuntimeError("the fetched records differ from the segment file")
        offset = 0

        def one_fetch() -> int:
            nonlocal offset
            start, length = self.fetch(offset, size)
            nxt = next_offset(self.buf, start, start + length)
            offset = nxt if 0 <= nxt < self.hw else 0
            return length

        return timed_requests(one_fetch, server, seconds)

    def close(self) -> None:
        self.sock.close()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class PlainClient:
    """The plain request/response client: like the kstore clients, ONE connection for the whole
    run. (Until Nov 2026 each trial opened a new one; a fresh loopback connection's buffers start
    small and grow differently each time, and at 1 MiB that alone moved a trial between 1.5 and
    4.3 GB/s.)"""

    def __init__(self, port: int):
        self.sock = connect(port)
        self.view = memoryview(bytearray(max(FETCH_SIZES)))

    def trial(self, server: Server, size: int, file_size: int, seconds: float) -> dict:
        sock, view = self.sock, self.view
        sock.sendall(struct.pack(">qi", 0, size))
        recv_into_exactly(sock, view, size)
        position = 0

        def one_request() -> int:
            nonlocal position
            count = min(size, file_size - position)
            sock.sendall(struct.pack(">qi", position, count))
            recv_into_exactly(sock, view, count)
            position = position + count if position + count < file_size else 0
            return count

        return timed_requests(one_request, server, seconds)

    def close(self) -> None:
        self.sock.close()


def stream_trial(port: int, server: Server, size: int, seconds: float) -> dict:
    """The plain server streaming the file in chunks of `size`, no requests: a connection per
    trial (closing it is what stops the stream)."""
    sock = connect(port)
    view = memoryview(bytearray(size))
    try:
        total, n = 0, 0
        sock.sendall(struct.pack(">qi", 0, -size))
        recv_into_exactly(sock, view, size)      # warm-up
        c0, s0, t0 = thread_cpu(), server.cpu(), now()
        while True:
            k = sock.recv_into(view)
            if k == 0:
                raise ConnectionError("plain server closed")
            total += k
            n += 1
            if (n & 15) == 0 and now() - t0 >= seconds:
                break
        elapsed = now() - t0
        return _trial(total, total // size, elapsed, c0, thread_cpu(), s0, server.cpu())
    finally:
        sock.close()


def timed_requests(one_request, server: Server, seconds: float) -> dict:
    """Request after request on one connection (`one_request()` returns the record bytes it
    got) until `seconds` have passed; the kstore and the plain clients time the same way."""
    total, n = 0, 0
    c0, s0, t0 = thread_cpu(), server.cpu(), now()
    while True:
        total += one_request()
        n += 1
        elapsed = now() - t0
        if elapsed >= seconds:
            break
    return _trial(total, n, elapsed, c0, thread_cpu(), s0, server.cpu())


def _trial(total, n, elapsed, c0, c1, s0, s1) -> dict:
    return {"bytes": total, "requests": n, "seconds": elapsed,
            "server_cpu": [b - a for a, b in zip(s0, s1)], "client_cpu": [b - a for a, b in zip(c0, c1)]}


def _point(size: int, trials: list[dict]) -> dict:
    """MB/s: the best trial (the least disturbed by other processes) and the median trial (what
    one outlying trial cannot move); CPU per GB: all trials."""
    best = max(trials, key=lambda t: t["bytes"] / t["seconds"])
    rates = [t["bytes"] / t["seconds"] / MB for t in trials]
    gb = sum(t["bytes"] for t in trials) / 1e9
    cpu = {side: [sum(t[side][i] for t in trials) / gb for i in range(3)]
           for side in ("server_cpu", "client_cpu")}
    return {"fetch_size": size, "MB_s": best["bytes"] / best["seconds"] / MB,
            "requests_per_s": best["requests"] / best["seconds"],
            "MB_s_median": statistics.median(rates), "MB_s_trials": rates,
            "statistic": f"MB/s best and median of {len(trials)} trials; CPU over all trials",
            "server_cpu_s_per_GB": cpu["server_cpu"][0], "server_user_s_per_GB": cpu["server_cpu"][1],
            "server_sys_s_per_GB": cpu["server_cpu"][2], "client_cpu_s_per_GB": cpu["client_cpu"][0],
            "client_user_s_per_GB": cpu["client_cpu"][1], "client_sys_s_per_GB": cpu["client_cpu"][2],
            "total_cpu_s_per_GB": cpu["server_cpu"][0] + cpu["client_cpu"][0],
            "bytes": sum(t["bytes"] for t in trials), "seconds": sum(t["seconds"] for t in trials)}


def socket_buffers(setting: str) -> dict[str, int]:
    """The socket buffer sizes both kinds of server get: the broker's defaults (Kafka's
    socket.send.buffer.bytes / socket.receive.buffer.bytes, 102400) or "os" (-1: the kernel sizes
    the buffers and grows them with the traffic)."""
    from kstore.config import BROKER_KEYS
    names = ("socket.send.buffer.bytes", "socket.receive.buffer.bytes")
    return {n: (BROKER_KEYS[n].default if setting == "broker defaults" else -1) for n in names}


def bench_fetch_paths(tmp: Path, log_dir: Path, segment_path: Path, hw: int, setting: str,
                      sizes: tuple[int, ...], modes: tuple[str, ...]) -> dict:
    """Trials of `modes` at `sizes`, interleaved; every server with the same socket buffers."""
    import shutil

    buffers = socket_buffers(setting)
    overrides = [a for n, v in buffers.items() for a in ("--override", f"{n}={v}")]
    segment = segment_path.read_bytes()
    file_size = len(segment)
    servers = {"kstore_sendfile": kstore_serve(log_dir, *overrides)}
    if "kstore_copy" in modes:
        copy_dir = tmp / "logs-copy"             # the copy-path broker needs its own log dir (lock)
        if not copy_dir.exists():
            shutil.copytree(log_dir, copy_dir)
            (copy_dir / ".lock").unlink(missing_ok=True)
        servers["kstore_copy"] = kstore_serve(copy_dir, "--copy-fetch", *overrides)
    servers["plain"] = Server([__file__, "--plain-sendfile-server", str(segment_path),
                               "--send-buffer", str(buffers["socket.send.buffer.bytes"]),
                               "--receive-buffer", str(buffers["socket.receive.buffer.bytes"])],
                              tmp / "plain-output.txt")
    rows: dict[str, list] = {m: [] for m in modes}
    clients: dict = {}
    try:
        clients = {m: KstoreClient(servers[m].port, hw) for m in modes if m.startswith("kstore")}
        clients["plain_sendfile_rr"] = PlainClient(servers["plain"].port)
        for size in sizes:
            trials: dict[str, list] = {m: [] for m in modes}
            for k in range(TRIALS):
                order = modes[k % len(modes):] + modes[:k % len(modes)]   # rotate: fair to drift
                for mode in order:
                    if mode.startswith("kstore"):
                        trials[mode].append(clients[mode].trial(servers[mode], size, TRIAL_SECONDS, segment))
                    elif mode == "plain_sendfile_rr":
                        trials[mode].append(clients[mode].trial(servers["plain"], size, file_size,
                                                                TRIAL_SECONDS))
                    else:
                        trials[mode].append(stream_trial(servers["plain"].port, servers["plain"], size,
                                                         TRIAL_SECONDS))
            for mode in modes:
                rows[mode].append(_point(size, trials[mode]))
                _print_row(mode, rows[mode][-1])
    finally:
        for c in clients.values():
            c.close()
        for server in servers.values():
            server.stop()
    for i in range(len(sizes)):
        limit = max(rows["plain_sendfile_stream"][i]["MB_s"], rows["plain_sendfile_rr"][i]["MB_s"])
        typical = max(rows["plain_sendfile_stream"][i]["MB_s_median"],
                      rows["plain_sendfile_rr"][i]["MB_s_median"])
        for mode in modes:
            rows[mode][i]["ratio_vs_plain_best"] = rows[mode][i]["MB_s"] / limit
            rows[mode][i]["ratio_vs_plain_median"] = rows[mode][i]["MB_s_median"] / typical
        if "kstore_copy" in modes:
            s, c = rows["kstore_sendfile"][i], rows["kstore_copy"][i]
            s["ratio_sendfile_over_copy"] = s["MB_s"] / c["MB_s"]
            s["ratio_cpu_copy_over_sendfile"] = c["server_cpu_s_per_GB"] / s["server_cpu_s_per_GB"]
    return {"socket_buffers": buffers, "rows": rows}


def build_fetch_log(tmp: Path) -> tuple[Path, Path, int, dict]:
    log_dir = tmp / "logs"
    t = now()
    segment_path, file_size, hw = build_log(log_dir)
    with open(segment_path, "rb") as f:
        first = f.read(12)
    batch_bytes = struct.unpack_from(">i", first, 8)[0] + 12
    info = {"segment_bytes": file_size, "records": hw, "records_per_batch": RECORDS_PER_BATCH,
            "batch_bytes": batch_bytes, "batches": file_size // batch_bytes,
            "value_bytes": VALUE_SIZE, "build_seconds": now() - t}
    print(f"    log: {file_size / MB:.0f} MB, {hw:,} records in {info['batches']:,} batches of "
          f"{batch_bytes:,} B (built in {info['build_seconds']:.1f} s)", flush=True)
    return log_dir, segment_path, hw, info


def _buffers(buffers: dict[str, int]) -> str:
    return ", ".join(f"{name}={value}" for name, value in buffers.items())


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def _print_row(mode: str, r: dict) -> None:
    print(f"    {LABELS[mode]:<36} {_size(r['fetch_size']):>7}: {r['MB_s']:8.0f} MB/s "
          f"{r['requests_per_s']:8.0f} req/s   CPU s/GB: server {r['server_cpu_s_per_GB']:.3f} "
          f"(user {r['server_user_s_per_GB']:.3f}, sys {r['server_sys_s_per_GB']:.3f}), "
          f"client {r['client_cpu_s_per_GB']:.3f}", flush=True)


# ------------------------------------------------------------------------------ end to end
def e2e(tmp: Path) -> dict:
    import confluent_kafka as ck
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    log_dir = tmp / "e2e-logs"
    server = kstore_serve(log_dir, "--override", "num.partitions=1")
    bootstrap = f"127.0.0.1:{server.port}"
    rng = random.Random(7)
    values = [rng.randbytes(VALUE_SIZE) for _ in range(1000)]
    out = {}
    try:
        # ---- kafka-python
        n = E2E_RECORDS["kafka-python"]
        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=10, batch_size=256 * KiB,
                                 max_request_size=2 * MiB)
        producer.send("e2e-kp", value=values[0], partition=0).get(30)     # connect, metadata
        cpu0, t0 = server.cpu(), now()
        for i in range(1, n):
            producer.send("e2e-kp", value=values[i % 1000], partition=0)
        producer.flush(600)
        prod = _e2e_row(n - 1, now() - t0, cpu0, server.cpu())
        producer.close(10)
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                 max_partition_fetch_bytes=8 * MiB, fetch_max_bytes=50 * MiB)
        tp = TopicPartition("e2e-kp", 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got, cpu0, t0 = 0, server.cpu(), now()
        last = None
        while got < n and now() - t0 < 600:
            for msgs in consumer.poll(timeout_ms=1000, max_records=100_000).values():
                got += len(msgs)
                last = msgs[-1]
        cons = _e2e_row(got, now() - t0, cpu0, server.cpu())
        consumer.close()
        if got != n or last.offset != n - 1 or last.value != values[(n - 1) % 1000]:
            raise RuntimeError(f"kafka-python consumed {got} of {n} records")
        out["kafka-python"] = {"records": n, "produce": prod, "consume": cons,
                               "producer_config": "acks=all (idempotent default), linger_ms=10, "
                                                  "batch_size=256KiB, no compression",
                               "consumer_config": "assign, max_partition_fetch_bytes=8MiB, "
                                                  "check_crcs=True (default)"}
        _print_e2e("kafka-python", out["kafka-python"])

        # ---- confluent-kafka
        n = E2E_RECORDS["confluent-kafka"]
        prod = ck_produce(server, n, values)
        # librdkafka backs a partition's fetcher off (fetch.queue.backoff.ms, 1 s by default) once
        # its queue holds queued.min.messages; that, not the broker, would cap this run.
        consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                                "enable.auto.commit": False, "enable.partition.eof": False,
                                "fetch.queue.backoff.ms": 0, "fetch.error.backoff.ms": 0,
                                "queued.min.messages": 1_000_000})
        consumer.assign([ck.TopicPartition("e2e-ck", 0, ck.OFFSET_BEGINNING)])
        got, cpu0, t0 = 0, server.cpu(), now()
        last = None
        while got < n and now() - t0 < 600:
            for m in consumer.consume(10_000, 1.0):
                if m.error():
                    raise RuntimeError(f"confluent-kafka consumer: {m.error()}")
                got += 1
                last = m
        cons = _e2e_row(got, now() - t0, cpu0, server.cpu())
        consumer.close()
        if got != n or last.offset() != n - 1 or last.value() != values[(n - 1) % 1000]:
            raise RuntimeError(f"confluent-kafka consumed {got} of {n} records")
        out["confluent-kafka"] = {"records": n, "produce": prod, "consume": cons,
                                  "producer_config": "acks=all, enable.idempotence=true, "
                                                     "linger.ms=10, batch.size=1000000, no compression",
                                  "consumer_config": "assign, fetch.queue.backoff.ms=0, "
                                                     "fetch.error.backoff.ms=0, "
                                                     "queued.min.messages=1000000, check.crcs=false"}
        _print_e2e("confluent-kafka", out["confluent-kafka"])
        # Is the client the bound? The same records from two producer processes at once, and
        # from one process handing librdkafka 1000 records per call (produce_batch).
        for key, procs, batched in (("confluent-kafka-2-producers", 2, False),
                                    ("confluent-kafka-produce-batch", 1, True)):
            x = ck_produce_parallel(server, n, procs, batched)
            out[key] = {"records": x["records"], "produce": x,
                        "producer_config": f"as confluent-kafka; {procs} producer process(es), "
                                           f"{x['client_api']}"}
            print(f"    {key:<30} produce {x['records']:>9,} records in {x['seconds']:6.2f} s = "
                  f"{x['records_per_s']:>10,.0f} records/s; broker {x['broker_cores']:.2f} cores, "
                  f"{x['broker_cpu_us_per_record']:.2f} us/record", flush=True)
    finally:
        server.stop()
    # The same produce run against a broker running the pure-Python codec (the goal table's
    # pure-Python column).
    pure = kstore_serve(tmp / "e2e-logs-pure", "--override", "num.partitions=1", pure_python=True)
    try:
        n = E2E_RECORDS["confluent-kafka"]
        row = {"records": n, "produce": ck_produce(pure, n, values),
               "producer_config": "as confluent-kafka; broker with KSTORE_PURE_PYTHON=1"}
        out["confluent-kafka-pure-broker"] = row
        x = row["produce"]
        print(f"    {'confluent-kafka':<16} produce  {x['records']:>9,} records in {x['seconds']:6.2f} s = "
              f"{x['records_per_s']:>10,.0f} records/s to a pure-Python-codec broker; broker CPU "
              f"{x['broker_cpu_us_per_record']:.2f} us/record", flush=True)
    finally:
        pure.stop()
    return out


def ck_produce(server: Server, n: int, values: list[bytes]) -> dict:
    """confluent-kafka producing n 100-byte records to partition 0 of topic e2e-ck; the row for
    the n-1 records after the first (which waits for the connection and metadata)."""
    import confluent_kafka as ck
    producer = ck.Producer({"bootstrap.servers": f"127.0.0.1:{server.port}", "linger.ms": 10,
                            "batch.size": 1_000_000, "enable.idempotence": True,
                            "queue.buffering.max.messages": 2_000_000,
                            "queue.buffering.max.kbytes": 1_048_576})
    producer.produce("e2e-ck", value=values[0], partition=0)
    producer.flush(30)
    cpu0, t0 = server.cpu(), now()
    for i in range(1, n):
        while True:
            try:
                producer.produce("e2e-ck", value=values[i % 1000], partition=0)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(600):
        raise RuntimeError("confluent-kafka could not deliver everything")
    return _e2e_row(n - 1, now() - t0, cpu0, server.cpu())


_RUNS = itertools.count()


def ck_producer_process(port: int, n: int, topic: str, batched: bool) -> None:
    """`bench_fetch.py --ck-producer PORT N TOPIC [batched]`: one confluent-kafka producer
    process (as in ck_produce, values from the same seed) that connects, prints "ready", waits
    for a line on stdin, produces n records (with produce(), or produce_batch() of 1000 when
    batched), flushes and prints its own seconds."""
    import confluent_kafka as ck
    rng = random.Random(7)
    values = [rng.randbytes(VALUE_SIZE) for _ in range(1000)]
    producer = ck.Producer({"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 10,
                            "batch.size": 1_000_000, "enable.idempotence": True,
                            "queue.buffering.max.messages": 2_000_000,
                            "queue.buffering.max.kbytes": 1_048_576})
    producer.produce(topic, value=values[0], partition=0)
    producer.flush(30)
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = now()
    if batched:   # one call hands librdkafka 1000 records: the Python loop is not the bound
        messages = [{"value": v} for v in values]
        left = n
        while left > 0:
            chunk = messages if left >= len(messages) else messages[:left]
            try:
                left -= producer.produce_batch(topic, chunk, partition=0)
            except BufferError:
                producer.poll(0.01)
            producer.poll(0)
    else:
        produce = producer.produce
        for i in range(n):
            try:
                produce(topic, value=values[i % 1000], partition=0)
            except BufferError:
                producer.poll(0.01)
                produce(topic, value=values[i % 1000], partition=0)
            if i % 10000 == 0:
                producer.poll(0)
    if producer.flush(600):
        raise RuntimeError("confluent-kafka could not deliver everything")
    print(f"{now() - t0}", flush=True)


def ck_produce_parallel(server: Server, n: int, processes: int, batched: bool = False) -> dict:
    """`processes` confluent-kafka producer processes at once, n records in all, to partition 0
    of one topic: whether the client (a Python loop calling produce) or the broker is the bound.
    Records/s = n ÷ wall time from the common start to the last flush; the broker's CPU over it."""
    topic = f"e2e-ck-x{processes}{'-batched' if batched else ''}-{next(_RUNS)}"   # a fresh topic
    procs = [subprocess.Popen([sys.executable, __file__, "--ck-producer", str(server.port),
                               str(n // processes), topic, *(["batched"] if batched else [])],
                              stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=common.ROOT)
             for _ in range(processes)]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a confluent-kafka producer process did not start")
        cpu0, t0 = server.cpu(), now()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            p.stdout.readline()
            if p.wait(600) != 0:
                raise RuntimeError("a confluent-kafka producer process failed")
        row = _e2e_row(n // processes * processes, now() - t0, cpu0, server.cpu())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    # A failed delivery only reaches a delivery callback: count what the partition holds.
    import confluent_kafka as ck
    consumer = ck.Consumer({"bootstrap.servers": f"127.0.0.1:{server.port}", "group.id": "check"})
    try:
        _, high = consumer.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=30)
    finally:
        consumer.close()
    if high != processes + n // processes * processes:   # + one warm-up record per process
        raise RuntimeError(f"{topic} holds {high} records, expected "
                           f"{processes + n // processes * processes}")
    row["producer_processes"] = processes
    row["client_api"] = "produce_batch of 1000" if batched else "produce per record"
    return row


def _e2e_row(n: int, seconds: float, cpu0, cpu1) -> dict:
    broker_cpu = cpu1[0] - cpu0[0]
    return {"records": n, "seconds": seconds, "records_per_s": n / seconds,
            "payload_MB_s": n * VALUE_SIZE / seconds / MB, "broker_cpu_s": broker_cpu,
            "broker_cores": broker_cpu / seconds,
            "broker_cpu_us_per_record": broker_cpu / n * 1e6}


def _print_e2e(client: str, r: dict) -> None:
    for phase in ("produce", "consume"):
        x = r[phase]
        print(f"    {client:<16} {phase:<8} {x['records']:>9,} records in {x['seconds']:6.2f} s = "
              f"{x['records_per_s']:>10,.0f} records/s ({x['payload_MB_s']:.1f} MB/s payload); "
              f"broker CPU {x['broker_cpu_us_per_record']:.2f} us/record", flush=True)


# ------------------------------------------------------------------------------ main
def main() -> dict:
    load = os.getloadavg()[0]
    print(f"== fetch benchmark (scale {SCALE:g}; load average {load:.1f} on {os.cpu_count()} CPUs"
          f"{': other work competes, throughput will be noisy' if load > 0.5 * (os.cpu_count() or 1) else ''}) ==")
    with common.scratch_dir("fetch") as tmp:
        print(f"-- 1. Fetch throughput over loopback: {TRIALS} interleaved trials of "
              f"{TRIAL_SECONDS:.2f} s per mode and size (MB/s: best trial; ratios to plain sendfile: "
              f"median ÷ median, then best ÷ best; CPU: all trials). Each "
              f"server is its own process (CPU clock + /proc/<pid>/stat), the client one thread "
              f"(thread CPU clock + getrusage RUSAGE_THREAD)")
        log_dir, segment_path, hw, info = build_fetch_log(tmp)
        main_run = bench_fetch_paths(tmp, log_dir, segment_path, hw, "broker defaults",
                                     FETCH_SIZES, MODES)
        rows = main_run["rows"]
        print(f"    every server with the broker's default socket buffers: "
              f"{_buffers(main_run['socket_buffers'])}")
        print(f"    {'fetch size':>10} | {'sendfile MB/s':>13} {'copy MB/s':>10} {'plain rr':>9} "
              f"{'plain stream':>12} | {'sendfile/copy':>13} {'sendfile/plain median, best':>27} | "
              f"server CPU s/GB sendfile / copy (copy/sendfile)")
        for i, size in enumerate(FETCH_SIZES):
            s, c = rows["kstore_sendfile"][i], rows["kstore_copy"][i]
            rr, st = rows["plain_sendfile_rr"][i], rows["plain_sendfile_stream"][i]
            print(f"    {_size(size):>10} | {s['MB_s']:>13.0f} {c['MB_s']:>10.0f} {rr['MB_s']:>9.0f} "
                  f"{st['MB_s']:>12.0f} | {s['ratio_sendfile_over_copy']:>13.2f} "
                  f"{s['ratio_vs_plain_median']:>20.2f}, {s['ratio_vs_plain_best']:.2f} | "
                  f"{s['server_cpu_s_per_GB']:.3f} / "
                  f"{c['server_cpu_s_per_GB']:.3f} ({s['ratio_cpu_copy_over_sendfile']:.2f}x)")
        os_sizes = tuple(size for size in FETCH_SIZES if size >= MiB)
        print(f"-- 1b. The same at {', '.join(map(_size, os_sizes))}, every server with the socket "
              f"buffers the OS sizes and grows itself (socket.send.buffer.bytes=-1, "
              f"socket.receive.buffer.bytes=-1): the broker's own cost per fetch shows here",
              flush=True)
        os_run = bench_fetch_paths(tmp, log_dir, segment_path, hw, "os", os_sizes, OS_MODES)
        for i, size in enumerate(os_sizes):
            s = os_run["rows"]["kstore_sendfile"][i]
            rr, st = os_run["rows"]["plain_sendfile_rr"][i], os_run["rows"]["plain_sendfile_stream"][i]
            print(f"    {_size(size):>10} | sendfile {s['MB_s_median']:>6.0f} MB/s, plain rr "
                  f"{rr['MB_s_median']:>6.0f}, plain stream {st['MB_s_median']:>6.0f} (medians) | "
                  f"sendfile/plain {s['ratio_vs_plain_median']:.2f} (median), "
                  f"{s['ratio_vs_plain_best']:.2f} (best)")
        e2e_counts = dict(E2E_RECORDS)
        note = ("" if E2E_FULL or E2E_RECORDS["kafka-python"] == E2E_RECORDS["confluent-kafka"] else
                f"kafka-python uses {E2E_RECORDS['kafka-python']:,} records, not 1M x scale "
                f"(pure-Python client: 1M takes ~40 s; KSTORE_BENCH_E2E_FULL=1 for the full count)")
        print(f"-- 2. end to end, 100-byte records, one partition: "
              f"{', '.join(f'{k} {v:,}' for k, v in e2e_counts.items())} records"
              + (f"\n    NOTE: {note}" if note else ""), flush=True)
        ends = e2e(tmp)
    data = {
        "description": "Fetch over loopback: kstore sendfile vs copy path vs plain os.sendfile "
                       "(request/response and stream) by fetch size, with CPU s/GB; end-to-end "
                       "records/s for kafka-python and confluent-kafka against kstore serve",
        "units": {"MB": "10^6 bytes", "GB": "10^9 bytes", "cpu": "CPU seconds per GB delivered"},
        "cpu_measurement": "servers are separate processes: utime+stime from /proc/<pid>/stat "
                           "around each point; the client is one thread: getrusage(RUSAGE_THREAD)",
        "trials": TRIALS, "trial_seconds": TRIAL_SECONDS,
        "plain_best": "ratio_vs_plain_best divides the best trial by the faster of the two plain "
                      "sendfile modes' best trials; ratio_vs_plain_median divides the median trial "
                      "by the faster of their median trials (the goal's statistic)",
        "log": info, "fetch_sizes": list(FETCH_SIZES), "modes": LABELS,
        "socket_buffers": main_run["socket_buffers"], "fetch": rows,
        "fetch_os_buffers": {"fetch_sizes": list(os_sizes), **os_run},
        "e2e_records": e2e_counts, "e2e_note": note or None, "e2e": ends,
    }
    path = common.write_json("fetch", data)
    png = common.plot("fetch", lambda axes: _draw(axes, rows, ends), ncols=3, width=5.2)
    print(f"-> {path.relative_to(common.ROOT)}, {png.relative_to(common.ROOT)}")
    return data


def summary(data: dict) -> str:
    """One line for run_all.py."""
    rows = data["fetch"]
    big, small = rows["kstore_sendfile"][-1], rows["kstore_sendfile"][0]
    copy_big = rows["kstore_copy"][-1]
    e = data["e2e"]
    return (f"broker serving rate (the client decodes no records): "
            f"{_size(big['fetch_size'])} fetches {big['MB_s']:.0f} MB/s sendfile vs "
            f"{copy_big['MB_s']:.0f} copy ({big['ratio_sendfile_over_copy']:.2f}x, server CPU "
            f"{big['server_cpu_s_per_GB']:.2f} vs {copy_big['server_cpu_s_per_GB']:.2f} s/GB) = "
            f"{big['ratio_vs_plain_median']:.2f}x plain sendfile (medians; best trials "
            f"{big['ratio_vs_plain_best']:.2f}x; every server with the broker's default socket "
            f"buffers); with OS-sized buffers sendfile/plain "
            + ", ".join(f"{_size(r['fetch_size'])} {r['ratio_vs_plain_median']:.2f}x"
                        for r in data["fetch_os_buffers"]["rows"]["kstore_sendfile"])
            + f"; {_size(small['fetch_size'])}: "
            f"{small['MB_s']:.0f} MB/s; e2e records/s produce/consume (clients decode): "
            + ", ".join(f"{k} {common.fmt_rate(v['produce']['records_per_s'])}/"
                        f"{common.fmt_rate(v['consume']['records_per_s'])} ({v['records']:,})"
                        for k, v in e.items() if "consume" in v)
            + "".join(f"; {k} produce {common.fmt_rate(v['produce']['records_per_s'])}"
                      for k, v in e.items() if "consume" not in v))


def _draw(axes, rows, ends) -> None:
    colors = {"kstore_sendfile": "tab:blue", "kstore_copy": "tab:orange",
              "plain_sendfile_rr": "tab:gray", "plain_sendfile_stream": "black"}
    xs = [s / KiB for s in FETCH_SIZES]
    ax = axes[0]
    for mode in MODES:
        ax.plot(xs, [r["MB_s"] for r in rows[mode]], marker="o", color=colors[mode], label=LABELS[mode],
                ls="--" if mode.startswith("plain") else "-")
    for x, r in zip(xs, rows["kstore_sendfile"]):
        ax.annotate(f"{r['ratio_sendfile_over_copy']:.2f}x", (x, r["MB_s"]), fontsize=7,
                    textcoords="offset points", xytext=(0, 5), ha="center")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [_size(s) for s in FETCH_SIZES])
    ax.set_xlabel("fetch size (label: sendfile ÷ copy)")
    ax.set_ylabel("MB/s of record bytes")
    ax.set_title("Fetch throughput over loopback")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)

    ax = axes[1]
    for mode in MODES:
        ax.plot(xs, [r["server_cpu_s_per_GB"] for r in rows[mode]], marker="o", color=colors[mode],
                label=f"{LABELS[mode]}: server", ls="--" if mode.startswith("plain") else "-")
        ax.plot(xs, [r["server_user_s_per_GB"] or float("nan") for r in rows[mode]], ":",
                color=colors[mode])     # (a user time of 0 ticks is left out of the log plot)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs, [_size(s) for s in FETCH_SIZES])
    ax.set_xlabel("fetch size (dotted: user time only)")
    ax.set_ylabel("server CPU seconds per GB")
    ax.set_title("Server CPU per GB delivered")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)

    ax = axes[2]
    labels, vals = [], []
    for client, r in ends.items():
        for phase in (p for p in ("produce", "consume") if p in r):
            labels.append(f"{client}\n{phase}")
            vals.append(r[phase]["records_per_s"])
    bars = ax.bar(range(len(vals)), vals,
                  color=["tab:green", "tab:olive", "tab:purple", "tab:pink", "tab:brown"][:len(vals)])
    for b, v in zip(bars, vals):
        ax.annotate(common.fmt_rate(v), (b.get_x() + b.get_width() / 2, v), ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(range(len(vals)), labels, fontsize=7)
    ax.set_ylabel("records/s (100-byte records)")
    ax.set_title("End to end against kstore serve")
    ax.grid(True, axis="y", alpha=0.3)


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "--plain-sendfile-server":
        def _opt(name: str) -> int:
            return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else -1
        plain_sendfile_server(sys.argv[2], _opt("--port"), _opt("--send-buffer"), _opt("--receive-buffer"))
    elif len(sys.argv) in (5, 6) and sys.argv[1] == "--ck-producer":
        ck_producer_process(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], len(sys.argv) == 6)
    else:
        main()

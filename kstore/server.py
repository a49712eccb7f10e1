"""`kstore serve`: the broker on the network, speaking Kafka's binary protocol.

Mirrors the request path of Kafka's `SocketServer` + `KafkaApis`:
* frames are an int32 size followed by a request (header v1: api key, version, correlation id,
  client id); a size above `socket.request.max.bytes`, a negative size, a header or body that does
  not parse, or a client that stalls mid-frame closes *that* connection only;
* each connection's requests are answered in order (pipelining allowed); many connections are
  served concurrently by one asyncio event loop, which also runs the broker's timers;
* Produce stores producer batches as sent (base offset and leader epoch rewritten, CRC checked:
  CORRUPT_MESSAGE otherwise); acks=0 gets no response;
* **Fetch is zero-copy**: the response header is written from memory, and each partition's record
  bytes go from the segment file to the socket with `os.sendfile` — never through Python bytes.
  `zero_copy=False` reads them into memory and sends them (the copy path chapter 11 compares).
  A fetch waits up to `max_wait_ms` for `min_bytes`, woken by new appends.
The wire structs come from the schema-driven codec in `kstore.protocol`; the admin requests
(CreateTopics, CreatePartitions, DescribeConfigs, ListGroups) are in `kstore.admin_apis`
(DeleteTopics, DeleteRecords, AlterConfigs, IncrementalAlterConfigs in `kstore.admin_change_apis`), the
consumer group requests (JoinGroup, SyncGroup, Heartbeat, ...) in `kstore.group_apis`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass

from . import protocol as P
from .admin_apis import AdminApis
from .admin_change_apis import AdminChangeApis
from .broker import Broker, normalize_acks
from .connection_quotas import ConnectionQuotas, TooManyConnectionsError
from .errors import (CorruptRecordError, error_code, InvalidRecordError, InvalidRequiredAcksError, KStoreError,
                     NotLeaderOrFollowerError, OffsetOutOfRangeError, UnknownTopicOrPartitionError)
from .file_records import FileSlice
from .group_apis import GroupApis, client_host
from .group_coordinator import OffsetAndMetadata, java_length
from .log import Isolation
from .topic import validate_topic_name
from .transaction_apis import TransactionApis

API = P.API_KEYS
E = P.ERRORS
log = logging.getLogger("kstore.server")
# accept() errors that mean "out of descriptors or memory now", not "this client failed"
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
ACCEPT_WARNING_INTERVAL_S = 60.0   # while descriptors stay short, say so at most this often
PLUGGED_SEND_TIMEOUT_S = 30        # a plugged fetch_sender's socket: SO_SNDTIMEO


def _request_name(frame) -> str:
    """`Fetch v11 (correlation id 7, client 'rdkafka')` for a log line."""
    try:
        header = P.decode_request_header(frame)
        return (f"{P.API_NAMES.get(header.api_key, header.api_key)} v{header.api_version} "
                f"(correlation id {header.correlation_id}, client {header.client_id!r})")
    except P.ProtocolError:
        return "(unparsable)"


@dataclass
class ServerStats:
    connections_opened: int = 0
    connections_closed: int = 0
    requests: int = 0
    closed_for_errors: int = 0
    bytes_sent_sendfile: int = 0
    bytes_sent_copy: int = 0
    connections_rejected: int = 0      # over max.connections.per.ip
    accept_errors: int = 0             # accept() out of descriptors / memory


_SIZE = struct.Struct(">i")
_NO_BYTES = bytearray()


class _BadFrameSize(Exception):
    """A request size prefix below 0 or above socket.request.max.bytes."""


class _Channel:
    """A client connection's receiving side (Kafka's KafkaChannel with its NetworkReceive, and
    the read interest its Selector keeps).

    * Bytes are received in chunks into one buffer: a request usually arrives with its size
      prefix in a single `recv`, and a client that pipelines requests has the next one waiting
      there. A request larger than the buffer is completed straight into its own buffer. The
      buffer is small (8 KiB, allocated when the client first sends), so thousands of idle
      connections cost little: Fetch, Metadata, offset and group requests fit in it.
    * The read interest stays registered with the event loop from one request to the next, as
      Kafka's Selector keeps OP_READ set. Waiting for a request then costs one future;
      `loop.sock_recv_into` would add the descriptor to epoll and remove it again each time.
      The readiness callback receives the bytes itself, as `sock_recv_into`'s does: a report
      that is stale when it runs finds nothing to read and leaves the waiter waiting. Readiness
      is level-triggered: if bytes arrive while nobody waits (a request is being handled), the
      callback drops the registration so the loop does not spin; the next wait adds it back.
    * `waiting_since` (loop time; None while not waiting) is what the idle sweep reads.
    """

    CHUNK = 8 * 1024

    __slots__ = ("loop", "sock", "fd", "task", "waiter", "view", "registered", "waiting_since",
                 "waited", "buf", "start", "end")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, task: asyncio.Task):
        self.loop, self.sock, self.fd, self.task = loop, sock, sock.fileno(), task
        self.waiter: asyncio.Future | None = None
        self.view: memoryview | None = None
        self.registered = False
        self.waiting_since: float | None = None
        self.waited = False              # whether this request had to be waited for
        self.buf = _NO_BYTES             # until the client first sends
        self.start = self.end = 0        # the received bytes not yet taken: buf[start:end]

    # ---- the buffered bytes
    @property
    def buffered(self) -> int:
        return self.end - self.start

    def take(self, n: int) -> bytearray:
        """The next n buffered bytes, in a buffer of their own (a request may keep it)."""
        out = self.buf[self.start:self.start + n]
        self.start += n
        return out

    async def next_frame(self, max_size: int) -> bytearray | None:
        """The next request (without its size prefix), or None when the client closed.
        Raises _BadFrameSize for a size below 0 or above `max_size` (socket.request.max.bytes)."""
        self.waited = False
        while self.buffered < 4:
            if not await self.receive():
                return None
        (size,) = _SIZE.unpack_from(self.buf, self.start)
        if size < 0 or size > max_size:
            raise _BadFrameSize(size)
        self.start += 4
        if self.buffered >= size:
            frame = self.take(size)
        else:
            frame = await self._complete_frame(self.take(self.buffered), size)
        if not self.waited:
            # A request that was already here (a client pipelining them): let the loop serve
            # the other connections before this one is handled.
            await asyncio.sleep(0)
        return frame

    async def _complete_frame(self, head: bytearray, n: int) -> bytearray | None:
        """A request larger than what arrived with its size: the rest is received straight into
        its own buffer (a Produce request's batches are validated, stamped with offsets and
        written to the segment from it). The buffer grows as bytes arrive: a size prefix alone
        allocates at most 1 MiB."""
        got = len(head)
        buf = bytearray(min(n, max(got, 1 << 20)))
        buf[:got] = head
        while got < n:
            if got == len(buf):
                grown = bytearray(min(n, 2 * len(buf)))
                grown[:got] = buf
                buf = grown
            # Waiting for the client: until bytes come, or until the idle sweep cancels this
            # wait and the connection closes (stalled in a frame).
            k = await self.recv_into(memoryview(buf)[got:])
            if not k:
                return None
            got += k
        return buf

    async def receive(self) -> int:
        """Receive what the client has sent (waiting until it sends something) after the
        buffered bytes; 0 when it closed the connection."""
        if self.start == self.end:
            self.start = self.end = 0
            if self.buf is _NO_BYTES:
                self.buf = bytearray(self.CHUNK)
        elif self.end == len(self.buf):      # full: move the unread bytes to the front
            n = self.end - self.start
            self.buf[:n] = self.buf[self.start:self.end]
            self.start, self.end = 0, n
        k = await self.recv_into(memoryview(self.buf)[self.end:])
        self.end += k
        return k

    async def recv_into(self, view: memoryview) -> int:
        """Bytes into `view`: at once when some are here, else after waiting for them."""
        try:
            return self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return await self._wait_recv_into(view)

    # ---- waiting
    async def _wait_recv_into(self, view: memoryview) -> int:
        waiter = self.loop.create_future()
        self.waiter, self.view, self.waiting_since = waiter, view, self.loop.time()
        self.waited = True
        if not self.registered:
            self.loop.add_reader(self.fd, self._ready)
            self.registered = True
        try:
            return await waiter
        finally:
            self.waiter = self.view = self.waiting_since = None

    def _ready(self) -> None:
        waiter = self.waiter
        if waiter is None:
            self.loop.remove_reader(self.fd)
            self.registered = False
            return
        if waiter.done():
            return
        try:
            n = self.sock.recv_into(self.view)
        except (BlockingIOError, InterruptedError):
            return                                 # stale: keep waiting
        except Exception as e:
            waiter.set_exception(e)
        else:
            waiter.set_result(n)

    def close(self) -> None:
        if self.registered and not self.loop.is_closed():
            self.loop.remove_reader(self.fd)
            self.registered = False


class KafkaServer(AdminApis, AdminChangeApis, GroupApis, TransactionApis):
    fetch_sender = None   # or a learner's serve_fetch (`kstore serve --my-engine`, live.fetch_serving)
    on_listening = None   # called with the bound port once the server accepts connections

    def __init__(self, broker: Broker, host: str = "127.0.0.1", port: int = 9092, *,
                 zero_copy: bool = True, max_request_size: int | None = None,
                 idle_timeout_s: float | None = None, advertised_host: str | None = None,
                 fetch_sender=None):
        """Limits come from the broker config (socket.request.max.bytes, connections.max.idle.ms,
        max.connections, max.connections.per.ip[.overrides]); the arguments override the first
        two. `fetch_sender(sock, file_fd, start, end) -> bytes sent`, when given, sends each fetched
        file slice instead of the server's own sendfile loop (chapter 12's capstone: the learner's
        function serving real clients); see `_sendfile_plugged`."""
        self.broker = broker
        self.host, self.port = host, port
        self.advertised_host = advertised_host or host
        self.zero_copy = zero_copy
        if fetch_sender is not None:
            self.fetch_sender = fetch_sender
        config = broker.config
        self.max_request_size = (config["socket.request.max.bytes"] if max_request_size is None
                                 else max_request_size)
        self.idle_timeout_s = (config["connections.max.idle.ms"] / 1000 if idle_timeout_s is None
                               else idle_timeout_s)
        self.quotas = ConnectionQuotas.from_config(config)
        self._accept_warned_at = -ACCEPT_WARNING_INTERVAL_S
        self._accept_recovery_pending = False
        self.stats = ServerStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task] = set()
        # The open connections; the idle sweep closes one whose wait for its client's bytes is
        # older than connections.max.idle.ms.
        self._open: set[_Channel] = set()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._data_waiters: set[asyncio.Event] = set()
        self._handler_table: dict | None = None
        self._unsubscribe = None

    # ------------------------------------------------------------------ lifecycle
    def start_in_thread(self) -> "KafkaServer":
        """Run the server on its own thread (for notebooks and tests); returns once listening."""
        self._thread = threading.Thread(target=lambda: asyncio.run(self.serve()), daemon=True,
                                        name=f"kstore-server-{self.port}")
        self._thread.start()
        if not self._ready.wait(30):
            raise KStoreError("the server did not start listening")
        if self._startup_error is not None:
            raise self._startup_error
        return self

    _startup_error: BaseException | None = None

    async def serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError as e:
            self._startup_error = KStoreError(f"cannot listen on {self.host}:{self.port}: {e}")
            self._ready.set()
            return
        self._listener = sock
        self.port = sock.getsockname()[1]
        if threading.current_thread() is threading.main_thread():
            import signal
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._stop_event.set)
        self._unsubscribe = self.broker.events.subscribe(self._on_new_data,
                                                         kinds={"append", "high_watermark"})
        timers = asyncio.create_task(self._timers())
        idle = asyncio.create_task(self._expire_idle_connections())
        accept = asyncio.create_task(self._accept_loop())
        self._ready.set()
        if self.on_listening is not None:   # the real port, also when asked for port 0
            self.on_listening(self.port)
        await self._stop_event.wait()
        accept.cancel()
        timers.cancel()
        idle.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(accept, timers, idle, *self._tasks, return_exceptions=True)
        sock.close()
        if self._unsubscribe:
            self._unsubscribe()

    def stop(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop_event.set)
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    async def _timers(self) -> None:
        """The broker's scheduled tasks (retention, cleaner, checkpoints) on the event loop."""
        last_error = None
        while True:
            try:
                self.broker.logs.scheduler.run_due()
                self.broker.replica_manager.check_purgatory()
                if self.broker._coordinator is not None:   # session and rebalance timers
                    self.broker._coordinator.membership.tick()
                txn = self.broker._txn_coordinator
                if txn is not None and txn.abort_check_due():   # transaction timeouts
                    await asyncio.get_running_loop().run_in_executor(None, txn.abort_timed_out)
                if txn is not None and txn.expiry_check_due():  # transactional.id.expiration.ms
                    await asyncio.get_running_loop().run_in_executor(
                        None, txn.remove_expired_transactional_ids)
            except Exception as e:
                # Logged (with its stack) when it first happens, not every 50 ms after that: as
                # Kafka's scheduler logs an uncaught exception in a task, and runs it again.
                if repr(e) != last_error:
                    log.exception("Uncaught exception in the broker's scheduled tasks")
                last_error = repr(e)
            else:
                last_error = None
            await asyncio.sleep(0.05)

    async def _expire_idle_connections(self) -> None:
        """Close connections whose client sent nothing for connections.max.idle.ms — between
        requests, or stalled in the middle of one. Kafka's Selector keeps the channels in order
        of last activity and closes the idle ones as it polls; here a sweep every tenth of the
        limit (at most 1 s) cancels such a connection's wait. No timer is armed per read: a
        wait costs a timestamp on the connection's channel, not a timer on the event loop's
        heap."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(1.0, max(self.idle_timeout_s / 10, 0.01)))
            oldest_allowed = loop.time() - self.idle_timeout_s
            for channel in list(self._open):
                since = channel.waiting_since
                if since is not None and since <= oldest_allowed:
                    channel.waiting_since = None
                    channel.task.cancel()   # its connection closes (the CancelledError path)

    def _on_new_data(self, event) -> None:
        """An append or a HW move, on whatever thread made it: wake the fetches waiting for
        data. Nothing is scheduled while no fetch waits (most appends): a fetch registers its
        waiter before it reads again, so an append it missed is one that read sees."""
        if self._data_waiters:
            self._loop.call_soon_threadsafe(self._wake_fetches)

    def _wake_fetches(self) -> None:
        for waiter in list(self._data_waiters):
            waiter.set()

    # ------------------------------------------------------------------ connections
    async def _accept_loop(self) -> None:
        """Kafka's Acceptor: honour the connection quotas, and survive running out of file
        descriptors — back off, say so once, keep serving the open connections, accept again
        when descriptors are free (the waiting clients sit in the listen backlog meanwhile)."""
        loop = asyncio.get_running_loop()
        backoff = 0.0
        while True:
            await self.quotas.wait_for_slot()          # max.connections: stop accepting
            try:
                conn, address = await loop.sock_accept(self._listener)
            except OSError as e:
                if e.errno not in _OUT_OF_RESOURCES:
                    if e.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                        continue                       # that client gave up; not our problem
                    raise
                self.stats.accept_errors += 1
                now = time.monotonic()
                if now - self._accept_warned_at >= ACCEPT_WARNING_INTERVAL_S:   # once, not per try
                    log.warning("accept failed (%s); not accepting new connections until "
                                "descriptors are free, open connections are still served",
                                os.strerror(e.errno))
                    self._accept_warned_at, self._accept_recovery_pending = now, True
                backoff = min(max(backoff * 2, 0.05), 1.0)
                await asyncio.sleep(backoff)
                continue
            backoff = 0.0
            if self._accept_recovery_pending:
                log.warning("accepting connections again")
                self._accept_recovery_pending = False
            ip = address[0] if isinstance(address, tuple) else str(address)
            try:
                self.quotas.inc(ip)
            except TooManyConnectionsError as e:   # max.connections.per.ip: closed at once
                self.stats.connections_rejected += 1
                if self.stats.connections_rejected == 1 or self.stats.connections_rejected % 1000 == 0:
                    log.info("%s (%d rejected so far)", e, self.stats.connections_rejected)
                conn.close()
                continue
            try:
                conn.setblocking(False)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._set_buffer_sizes(conn)
            except OSError:   # reset before we could set it up: drop it, keep accepting
                conn.close()
                self.quotas.dec(ip)
                continue
            self.stats.connections_opened += 1
            task = asyncio.create_task(self._connection(conn, ip))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _set_buffer_sizes(self, conn: socket.socket) -> None:
        """socket.send.buffer.bytes / socket.receive.buffer.bytes, as Kafka's Acceptor sets them
        on an accepted connection (-1: leave the OS default, which Linux grows with the traffic)."""
        for name, option in (("socket.send.buffer.bytes", socket.SO_SNDBUF),
                             ("socket.receive.buffer.bytes", socket.SO_RCVBUF)):
            size = self.broker.config[name]
            if size != -1:
                conn.setsockopt(socket.SOL_SOCKET, option, size)

    async def _connection(self, conn: socket.socket, ip: str) -> None:
        channel = _Channel(asyncio.get_running_loop(), conn, asyncio.current_task())
        self._open.add(channel)
        try:
            client_host.set(conn.getpeername()[0])
            while True:
                try:
                    frame = await channel.next_frame(self.max_request_size)
                except _BadFrameSize:
                    self.stats.closed_for_errors += 1
                    return   # Kafka: InvalidReceiveException, the connection is closed
                if frame is None:
                    return
                try:
                    chunks = await self._handle(frame)
                except P.ProtocolError:
                    self.stats.closed_for_errors += 1
                    return   # a request that does not parse closes its connection
                except Exception:
                    # A bug in a handler: said in the log with its stack (Kafka's KafkaApis logs
                    # "Unexpected error handling request" too), and only this connection closes.
                    # Kafka would answer UNKNOWN_SERVER_ERROR; kstore has no generic error body.
                    self.stats.closed_for_errors += 1
                    log.exception("Unexpected error handling request %s from %s; closing the "
                                  "connection", _request_name(frame), ip)
                    return
                self.stats.requests += 1
                if chunks is not None:
                    await self._send(conn, chunks)
        except (ConnectionError, OSError, asyncio.CancelledError):
            return
        finally:
            channel.close()   # before the descriptor is closed (and perhaps reused)
            self._open.discard(channel)
            self.stats.connections_closed += 1
            conn.close()
            self.quotas.dec(ip)

    async def _send(self, conn: socket.socket, chunks: list) -> None:
        """One response: its size, then its chunks. The byte chunks between file slices go out in
        one gathering write (sendmsg), the size prefix with them; a file slice goes with
        os.sendfile, the bytes before it flagged MSG_MORE so the kernel packs them with the file's
        first bytes. A 1-partition Fetch is two syscalls (Kafka also writes a response's buffers
        with gathering writes and transferTo)."""
        total = sum(len(c) if isinstance(c, (bytes, bytearray)) else c.size for c in chunks)
        pending: list = [struct.pack(">i", total)]
        for chunk in chunks:
            if isinstance(chunk, (bytes, bytearray)):
                pending.append(chunk)
            elif self.zero_copy:
                await self._send_buffers(conn, pending, socket.MSG_MORE)
                pending = []
                if self.fetch_sender is None:
                    await self._sendfile(conn, chunk)
                else:
                    await self._sendfile_plugged(conn, chunk)
            else:
                data = chunk.read_bytes()            # the copy path: through user space
                pending.append(data)
                self.stats.bytes_sent_copy += len(data)
        if pending:
            await self._send_buffers(conn, pending, 0)

    async def _send_buffers(self, conn: socket.socket, buffers: list, flags: int) -> None:
        """Gathering writes until every buffer is sent (usually the first takes them all)."""
        left = [buffers]

        def step() -> bool:
            n = conn.sendmsg(left[0], (), flags)
            if n == sum(map(len, left[0])):
                return True
            left[0] = _unsent(left[0], n)
            return False
        await self._until_sent(conn, step)

    async def _sendfile(self, conn: socket.socket, piece: FileSlice) -> None:
        """Page cache → socket with os.sendfile (Kafka's FileChannel.transferTo)."""
        out, fd = conn.fileno(), piece.file.fd
        sent = [0]

        def step() -> bool:
            n = os.sendfile(out, fd, piece.position + sent[0], piece.size - sent[0])
            if n == 0:
                raise ConnectionError("the segment file is shorter than the slice being sent")
            sent[0] += n
            return sent[0] == piece.size
        await self._until_sent(conn, step)
        self.stats.bytes_sent_sendfile += sent[0]

    async def _until_sent(self, conn: socket.socket, step) -> None:
        """Call `step()` (one non-blocking send; True once everything is sent) until it is done.
        While the socket buffer is full (a big response over Kafka's 100 KB
        socket.send.buffer.bytes takes several rounds), the event loop calls it straight from
        its writability callback: one sendfile/sendmsg per wakeup, with no epoll registration,
        future and coroutine switch per round (that cost ~6 % of the 1 MiB Fetch rate)."""
        if _try_step(step):
            return
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def on_writable() -> None:
            if done.done():          # finished: never send again before the writer is removed
                return
            try:
                finished = _try_step(step)
            except Exception as e:   # a reset connection...: raised in the waiting coroutine
                done.set_exception(e)
                return
            if finished:
                done.set_result(None)
        loop.add_writer(conn.fileno(), on_writable)
        try:
            await done
        finally:
            loop.remove_writer(conn.fileno())

    async def _sendfile_plugged(self, conn: socket.socket, piece: FileSlice) -> None:
        """The slice sent by a plugged-in `fetch_sender` (a learner's code, which expects a plain
        blocking socket). It runs on a worker thread, so the event loop serves other connections
        meanwhile; this connection's next request is read only after it returns. A send timeout
        bounds a client that stops reading; a short send closes the connection (the response's
        size was already promised)."""
        conn.setblocking(True)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", PLUGGED_SEND_TIMEOUT_S, 0))
        try:
            sent = await asyncio.to_thread(self.fetch_sender, conn, piece.file.fd, piece.position,
                                           piece.position + piece.size)
        except Exception as e:   # the learner's bug closes this connection, not the server
            log.error("the plugged fetch sender raised %s: %s; closing the connection", type(e).__name__, e)
            raise ConnectionError(str(e)) from e
        finally:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 0, 0))
            conn.setblocking(False)
        if sent != piece.size:
            log.error("the plugged fetch sender returned %r for a %d-byte slice; closing the connection",
                      sent, piece.size)
            raise ConnectionError(f"fetch sender sent {sent!r} of {piece.size} bytes")
        self.stats.bytes_sent_sendfile += sent

    # ------------------------------------------------------------------ dispatch
    async def _handle(self, frame: bytes) -> list | None:
        header = P.decode_request_header(frame)
        key, version = header.api_key, header.api_version
        if key == API["ApiVersions"] and version > P.SUPPORTED[key][1]:
            return [P.encode_api_versions_unsupported(header.correlation_id)]
        if key not in P.SUPPORTED or not P.SUPPORTED[key][0] <= version <= P.SUPPORTED[key][1]:
            # No body of that API/version can be built: the correlation id and the error code.
            return [struct.pack(">ih", header.correlation_id, E["UNSUPPORTED_VERSION"])]
        body = P.decode_request(key, version, frame, header.size)
        if self._handler_table is None:   # built once: not a dict of bound methods per request
            self._handler_table = self._handlers()
        handler = self._handler_table[key]
        response = await handler(version, body, header)
        if response is None:
            return None
        return P.encode_response(key, version, header.correlation_id, response)

    def _handlers(self) -> dict:
        return {API["ApiVersions"]: self._api_versions, API["Metadata"]: self._metadata,
                API["Produce"]: self._produce, API["Fetch"]: self._fetch,
                API["ListOffsets"]: self._list_offsets, API["FindCoordinator"]: self._find_coordinator,
                API["OffsetCommit"]: self._offset_commit, API["OffsetFetch"]: self._offset_fetch,
                API["InitProducerId"]: self._init_producer_id,
                API["OffsetsForLeaderEpoch"]: self._offsets_for_leader_epoch,
                API["CreateTopics"]: self._create_topics,
                API["CreatePartitions"]: self._create_partitions,
                API["DescribeConfigs"]: self._describe_configs, API["ListGroups"]: self._list_groups,
                API["DeleteRecords"]: self._delete_records, API["AlterConfigs"]: self._alter_configs,
                API["IncrementalAlterConfigs"]: self._incremental_alter_configs,
                API["DeleteTopics"]: self._delete_topics,
                API["DescribeLogDirs"]: self._describe_log_dirs,
                **self._group_handlers(), **self._transaction_handlers()}

    # ------------------------------------------------------------------ APIs
    async def _api_versions(self, version, body, header) -> dict:
        return {"error_code": 0, "throttle_time_ms": 0,
                "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi}
                             for k, (lo, hi) in sorted(P.SUPPORTED.items())]}

    def _broker_list(self) -> list[dict]:
        out = []
        for b in self.broker.metadata.children("/brokers/ids"):
            node = self.broker.metadata.get(f"/brokers/ids/{b}")
            out.append({"node_id": int(b), "host": node["host"] if int(b) != self.broker.broker_id
                        else self.advertised_host,
                        "port": node["port"] if int(b) != self.broker.broker_id else self.port,
                        "rack": None})
        return out

    async def _metadata(self, version, body, header) -> dict:
        requested = body.get("topics")
        if version == 0 and not requested:
            requested = None    # v0 has no null array: an empty one means all topics
        allow_create = body.get("allow_auto_topic_creation", True)
        names = (self.broker.topics(include_internal=True) if requested is None
                 else [t["name"] for t in requested])
        topics = []
        for name in names:
            topics.append(self._topic_metadata(name, allow_create and requested is not None))
        return {"throttle_time_ms": 0, "brokers": self._broker_list(),
                "cluster_id": self.broker.cluster_id,
                "controller_id": (self.broker.metadata.get("/controller") or {}).get("brokerid", -1),
                "topics": topics, "cluster_authorized_operations": -2147483648}

    def _topic_metadata(self, name: str, allow_create: bool) -> dict:
        empty = {"name": name, "is_internal": False, "partitions": [],
                 "topic_authorized_operations": -2147483648}
        try:
            validate_topic_name(name)
        except KStoreError:
            return {**empty, "error_code": E["INVALID_TOPIC_EXCEPTION"]}
        if self.broker.metadata.topic(name) is None:
            if allow_create and self.broker.config["auto.create.topics.enable"]:
                try:
                    self.broker.ensure_topic(name)
                except KStoreError as e:
                    return {**empty, "error_code": error_code(e)}
            else:
                return {**empty, "error_code": E["UNKNOWN_TOPIC_OR_PARTITION"]}
        info = self.broker.describe_topic(name)
        return {"error_code": 0, "name": name, "is_internal": info.internal,
                "topic_authorized_operations": -2147483648,
                "partitions": [{"error_code": 0 if p.leader >= 0 else E["LEADER_NOT_AVAILABLE"],
                                "partition_index": p.partition, "leader_id": p.leader,
                                "leader_epoch": p.leader_epoch, "replica_nodes": p.replicas,
                                "isr_nodes": p.isr, "offline_replicas": []}
                               for p in info.partitions]}

    async def _produce(self, version, body, header) -> dict | None:
        acks = body["acks"]
        responses = []
        waiting = []
        try:
            normalize_acks(acks)
            acks_error = None
        except InvalidRequiredAcksError:
            acks_error = E["INVALID_REQUIRED_ACKS"]
        for topic in body["topic_data"]:
            parts = []
            for pd in topic["partition_data"]:
                entry = {"index": pd["index"], "error_code": 0, "base_offset": -1,
                         "log_append_time_ms": -1, "log_start_offset": -1, "record_errors": [],
                         "error_message": None}
                parts.append(entry)
                if acks_error is not None:
                    entry["error_code"] = acks_error
                    continue
                try:
                    _check_client_batches(pd["records"] or b"", version)
                    result = self.broker.produce_request(topic["name"], pd["index"],
                                                         pd["records"] or b"", acks,
                                                         body.get("timeout_ms", 30000))
                except KStoreError as e:
                    entry["error_code"], entry["error_message"] = self._produce_error(e, version), str(e)
                    continue
                waiting.append((entry, result))
            responses.append({"name": topic["name"], "partition_responses": parts})
        for entry, result in waiting:
            while not result.done:   # acks=all in a cluster: wait for the ISR without blocking others
                await asyncio.sleep(0.002)
            if result.error is not None:
                entry["error_code"] = self._produce_error(result.error, version)
                entry["error_message"] = str(result.error)
            if result.info is not None:
                entry["base_offset"] = result.info.first_offset
                entry["log_append_time_ms"] = result.info.log_append_time
                entry["log_start_offset"] = result.info.log_start_offset
        if acks == 0:
            return None   # acks=0: no response at all
        return {"responses": responses, "throttle_time_ms": 0}

    @staticmethod
    def _produce_error(e: BaseException, version: int) -> int:
        if isinstance(e, InvalidRecordError) and version < 8:
            return E["CORRUPT_MESSAGE"]
        return error_code(e)

    async def _fetch(self, version, body, header) -> dict:
        """Answer at once when min_bytes are there (or an error, or max_wait_ms is 0); else wait
        for appends up to max_wait_ms, reading again after each (Kafka's DelayedFetch)."""
        deadline = time.monotonic() + max(body.get("max_wait_ms", 0), 0) / 1000
        min_bytes = body.get("min_bytes", 1)
        responses, total = self._read_fetch(body)
        if total < min_bytes and deadline > time.monotonic() and not self._has_errors(responses):
            responses = await self._delayed_fetch(body, min_bytes, deadline)
        return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": responses}

    async def _delayed_fetch(self, body, min_bytes: int, deadline: float) -> list:
        waiter = asyncio.Event()
        self._data_waiters.add(waiter)   # before reading again: no append can slip between
        try:
            while True:
                waiter.clear()
                responses, total = self._read_fetch(body)
                remaining = deadline - time.monotonic()
                if total >= min_bytes or remaining <= 0 or self._has_errors(responses):
                    return responses
                try:
                    await asyncio.wait_for(waiter.wait(), remaining)
                except asyncio.TimeoutError:
                    pass
        finally:
            self._data_waiters.discard(waiter)

    @staticmethod
    def _has_errors(responses) -> bool:
        return any(p["error_code"] for t in responses for p in t["partitions"])

    def _read_fetch(self, body) -> tuple[list, int]:
        read_committed = body.get("isolation_level", 0) == 1
        isolation = Isolation.TXN_COMMITTED if read_committed else Isolation.HIGH_WATERMARK
        remaining = body.get("max_bytes", 52428800)
        replica_id = body.get("replica_id", -1)
        total, first_with_data = 0, True
        responses = []
        for topic in body["topics"]:
            parts = []
            for fp in topic["partitions"]:
                entry = {"partition_index": fp["partition"], "error_code": 0, "high_watermark": -1,
                         "last_stable_offset": -1, "log_start_offset": -1,
                         "aborted_transactions": None, "preferred_read_replica": -1, "records": b""}
                parts.append(entry)
                try:
                    if replica_id >= 0:
                        self._follower_fetch(topic["topic"], fp, entry, replica_id)
                        continue
                    log = self.broker.leader_log(topic["topic"], fp["partition"])
                    limit = min(fp["partition_max_bytes"], remaining)
                    data = log.read(fp["fetch_offset"], limit, isolation, min_one_message=first_with_data)
                    entry["high_watermark"] = log.high_watermark
                    entry["last_stable_offset"] = log.last_stable_offset
                    entry["log_start_offset"] = log.log_start_offset
                    if read_committed:   # the client drops these producers' aborted records
                        entry["aborted_transactions"] = [
                            {"producer_id": t.producer_id, "first_offset": t.first_offset}
                            for t in log.collect_aborted_transactions(
                                fp["fetch_offset"], entry["last_stable_offset"])]
                    if data.records is not None and data.records.size > 0:
                        entry["records"] = data.records
                        total += data.records.size
                        remaining = max(0, remaining - data.records.size)
                        first_with_data = False
                    else:
                        entry["records"] = b""
                except (KStoreError, ValueError) as e:   # ValueError: a negative size limit;
                    entry["error_code"] = error_code(e)   # Kafka answers UNKNOWN_SERVER_ERROR
            responses.append({"topic": topic["topic"], "partitions": parts})
        return responses, total

    def _follower_fetch(self, topic: str, fp: dict, entry: dict, replica_id: int) -> None:
        """A follower broker fetching over the network (replica_id ≥ 0): LOG_END isolation, and its
        fetch offset reports its LEO to the leader."""
        p = self.broker.replica_manager.partition(topic, fp["partition"])
        result = p.fetch_records(replica_id, fp["fetch_offset"], fp["partition_max_bytes"],
                                 current_leader_epoch=fp.get("current_leader_epoch", -1))
        self.broker.replica_manager.check_purgatory()
        entry["high_watermark"] = entry["last_stable_offset"] = result.high_watermark
        entry["log_start_offset"] = result.log_start_offset
        entry["records"] = result.data.records if result.data and result.data.records else b""

    async def _list_offsets(self, version, body, header) -> dict:
        topics = []
        for topic in body["topics"]:
            parts = []
            for lp in topic["partitions"]:
                entry = {"partition_index": lp["partition_index"], "error_code": 0,
                         "timestamp": -1, "offset": -1, "leader_epoch": -1}
                try:
                    if body.get("replica_id", -1) >= 0 and lp["timestamp"] in (-1, -2):
                        # a follower asks for the leader's log end / start, not the HW
                        log = self.broker.leader_log(topic["name"], lp["partition_index"])
                        entry["offset"] = (log.log_end_offset if lp["timestamp"] == -1
                                           else log.log_start_offset)
                        parts.append(entry)
                        continue
                    found = self.broker.list_offsets(topic["name"], lp["partition_index"], lp["timestamp"],
                                                     read_committed=body.get("isolation_level") == 1)
                    entry["timestamp"], entry["offset"] = found.timestamp, found.offset
                    entry["leader_epoch"] = -1 if found.leader_epoch is None else found.leader_epoch
                except (KStoreError, ValueError) as e:   # ValueError: an unknown negative
                    entry["error_code"] = error_code(e)   # timestamp; an error, not a dropped link
                parts.append(entry)
            topics.append({"name": topic["name"], "partitions": parts})
        return {"throttle_time_ms": 0, "topics": topics}

    async def _find_coordinator(self, version, body, header) -> dict:
        """The leader of the group's `__consumer_offsets` partition coordinates the group; key
        type 1: the leader of the transactional id's `__transaction_state` partition."""
        if body.get("key_type", 0) == 1:
            coordinator = self.broker.transaction_coordinator   # creates __transaction_state
        else:
            coordinator = self.broker.group_coordinator   # creates __consumer_offsets on first use
        node_id = coordinator.coordinator_for(body.get("key", ""))
        brokers = {b["node_id"]: b for b in self._broker_list()}
        if node_id not in brokers:
            return {"throttle_time_ms": 0, "error_code": E["COORDINATOR_NOT_AVAILABLE"],
                    "error_message": "the coordinator's partition has no leader",
                    "node_id": -1, "host": "", "port": -1}
        return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "node_id": node_id,
                "host": brokers[node_id]["host"], "port": brokers[node_id]["port"]}

    async def _offset_commit(self, version, body, header) -> dict:
        coordinator = self.broker.group_coordinator
        group = body["group_id"]
        retention = body.get("retention_time_ms", -1)
        now = self.broker.clock.milliseconds()
        expire = now + retention if retention is not None and retention >= 0 else None
        topics, valid = self._commit_entries(body["topics"])
        member_error = None if not group else coordinator.membership.validate_commit(
            group, body.get("generation_id_or_member_epoch", -1), body.get("member_id", ""),
            body.get("group_instance_id"))
        if not group or member_error:   # INVALID_GROUP_ID, or the member/generation check failed
            for t in topics:
                for p in t["partitions"]:
                    p["error_code"] = E[member_error or "INVALID_GROUP_ID"]
        elif valid:
            try:   # appended with acks=all: answer only once the ISR has the commit
                prepared = coordinator.prepare_commit(
                    group, valid, expire_timestamp=expire,
                    generation_id=body.get("generation_id_or_member_epoch", -1),
                    member_id=body.get("member_id", ""), instance_id=body.get("group_instance_id"))
                result = self.broker.produce_request(
                    "__consumer_offsets", prepared.partition, prepared.batch, -1,
                    body.get("timeout_ms", 30000) if "timeout_ms" in body else 30000)
                while not result.done:
                    await asyncio.sleep(0.002)
                coordinator.complete_commit(prepared, result)
            except KStoreError as e:
                for t in topics:
                    for p in t["partitions"]:
                        if (t["name"], p["partition_index"]) in valid:
                            p["error_code"] = error_code(e)
        return {"throttle_time_ms": 0, "topics": topics}

    def _commit_entries(self, requested: list) -> tuple[list, dict]:
        """The per-partition answers of an (Txn)OffsetCommit with the partition and metadata
        checks done, and the offsets that passed them."""
        limit = self.broker.group_coordinator.config.offset_metadata_max_bytes
        topics, valid = [], {}
        for topic in requested:
            parts = []
            for cp in topic["partitions"]:
                entry = {"partition_index": cp["partition_index"], "error_code": 0}
                parts.append(entry)
                tp = (topic["name"], cp["partition_index"])
                try:
                    self.broker.get_log(*tp)
                except KStoreError as e:
                    entry["error_code"] = error_code(e)
                    continue
                metadata = cp.get("committed_metadata") or ""
                if java_length(metadata) > limit:
                    entry["error_code"] = E["OFFSET_METADATA_TOO_LARGE"]
                    continue
                valid[tp] = OffsetAndMetadata(cp["committed_offset"], metadata,
                                              cp.get("committed_leader_epoch", -1))
            topics.append({"name": topic["name"], "partitions": parts})
        return topics, valid

    async def _offset_fetch(self, version, body, header) -> dict:
        coordinator = self.broker.group_coordinator
        try:
            committed = coordinator.fetch_offsets(body["group_id"])
        except KStoreError as e:   # NOT_COORDINATOR: the client looks the coordinator up again
            return {"throttle_time_ms": 0, "topics": [], "error_code": error_code(e)}
        requested = body.get("topics")
        if requested is None:    # all of the group's topics
            wanted: dict[str, list[int]] = {}
            for (t, p) in committed:
                wanted.setdefault(t, []).append(p)
        else:
            wanted = {t["name"]: t["partition_indexes"] for t in requested}
        topics = []
        for name, partitions in wanted.items():
            parts = []
            for p in partitions:
                om = committed.get((name, p))
                parts.append({"partition_index": p, "committed_offset": om.offset if om else -1,
                              "committed_leader_epoch": om.leader_epoch if om else -1,
                              "metadata": om.metadata if om else "", "error_code": 0})
            topics.append({"name": name, "partitions": parts})
        return {"throttle_time_ms": 0, "topics": topics, "error_code": 0}

    async def _init_producer_id(self, version, body, header) -> dict:
        if body.get("transactional_id") is not None:
            return await self._init_transactional_producer_id(version, body)
        return {"throttle_time_ms": 0, "error_code": 0,
                "producer_id": self.broker.allocate_producer_id(), "producer_epoch": 0}

    async def _offsets_for_leader_epoch(self, version, body, header) -> dict:
        topics = []
        for topic in body["topics"]:
            parts = []
            for op in topic["partitions"]:
                entry = {"error_code": 0, "partition": op["partition"], "leader_epoch": -1,
                         "end_offset": -1}
                try:
                    epoch, end = self.broker.replica_manager.last_offset_for_leader_epoch(
                        (topic["topic"], op["partition"]), op["leader_epoch"],
                        op.get("current_leader_epoch", -1))
                    entry["leader_epoch"], entry["end_offset"] = epoch, end
                except KStoreError as e:
                    entry["error_code"] = error_code(e)
                parts.append(entry)
            topics.append({"topic": topic["topic"], "partitions": parts})
        return {"throttle_time_ms": 0, "topics": topics}


def _try_step(step) -> bool:
    """Run one send step until it would block: True when everything is sent."""
    while True:
        try:
            if step():
                return True
        except (BlockingIOError, InterruptedError):
            return False


def _unsent(buffers: list, sent: int) -> list[memoryview]:
    """What is left of `buffers` after a gathering write took its first `sent` bytes."""
    views = [memoryview(b) for b in buffers if len(b)]
    while sent:
        if sent >= len(views[0]):
            sent -= len(views.pop(0))
        else:
            views[0], sent = views[0][sent:], 0
    return views


def _check_client_batches(records: bytes, version: int = 3) -> None:
    """What Kafka refuses from a client (ProduceRequest.validateRecords, and LogValidator's
    AppendOrigin.CLIENT checks) with InvalidRecordException: no complete batch at all, more than
    one batch for a partition (an idempotent producer's sequences are checked per batch, and a
    retry must be the same single batch), an offset range that disagrees with the record count,
    control batches (only coordinators write markers), and a producer id without a base sequence."""
    from .records import MemoryRecords
    batches = MemoryRecords(records).batches()
    if not batches:
        raise InvalidRecordError("produce requests must have at least one record batch per partition")
    if len(batches) > 1 and version >= 3:
        raise InvalidRecordError(f"produce requests with version {version} are only allowed to "
                                 f"contain exactly one record batch per partition")
    for batch in batches:
        if batch.magic < 2:
            continue
        if batch.records_count <= 0 or batch.last_offset_delta + 1 != batch.records_count:
            raise InvalidRecordError(
                f"inconsistent batch offset range [0, {batch.last_offset_delta}] and count of "
                f"records {batch.records_count}")
        if batch.is_control:
            raise InvalidRecordError("clients are not allowed to write control records")
        if batch.producer_id >= 0 and batch.base_sequence < 0:
            raise InvalidRecordError(f"invalid sequence number {batch.base_sequence} in record "
                                     f"batch with producerId {batch.producer_id}")


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit, as Kafka's start scripts expect an operator
    to (`ulimit -n`): every partition holds open files, every client a socket. Returns the
    (old, new) soft limit."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, target
    return soft, soft


def configure_logging() -> None:
    """Broker log lines on stdout, in the shape of Kafka's server.log."""
    if not logging.getLogger("kstore").handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)s %(message)s (%(name)s)"))
        logging.getLogger("kstore").addHandler(handler)
        logging.getLogger("kstore").setLevel(logging.INFO)


def serve(log_dir: str, host: str = "127.0.0.1", port: int = 9092, zero_copy: bool = True,
          broker_config: dict | None = None) -> None:
    """Run a broker on `log_dir` until interrupted (the `kstore serve` command)."""
    configure_logging()
    old, new = raise_open_file_limit()
    log.info("open file limit (RLIMIT_NOFILE): %d%s", new,
             f" (raised from {old} to the hard limit)" if new != old else " (the hard limit)")
    broker = Broker(log_dir, config=broker_config, host=host, port=port)
    server = KafkaServer(broker, host, port, zero_copy=zero_copy)
    broker.logs.start_retention()
    broker.logs.start_producer_expiration()
    broker.logs.start_cleaner()
    # printed once listening: with --port 0 the port the OS chose, never a port not yet bound
    server.on_listening = lambda bound: print(
        f"kstore broker {broker.broker_id} (cluster {broker.cluster_id}) serving {log_dir} on "
        f"{host}:{bound} ({'zero-copy' if zero_copy else 'copy'} fetch)", flush=True)
    try:
        asyncio.run(server.serve())
        if server._startup_error is not None:
            raise server._startup_error   # e.g. the port is taken: exit 1 with the reason, not 0
    finally:
        broker.shutdown()   # clean shutdown on SIGTERM / Ctrl-C: checkpoints and the marker
        print("kstore broker stopped cleanly", flush=True)

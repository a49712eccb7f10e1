"""A small blocking Kafka client: what a follower broker uses to replicate over the network.

One request at a time per connection: size-prefixed frames encoded with `kstore.protocol`. On top
of it, `NetworkReplicaClient` gives the replica fetcher the same three calls it makes in-process
(fetch as a follower, OffsetsForLeaderEpoch, the leader's log end/start), so the fetching and
truncation code is the same whether the leader is in this process or behind a socket.
"""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass

from . import protocol as P
from .errors import BrokerNotAvailableError, KStoreError, OffsetOutOfRangeError, error_for_code

API = P.API_KEYS

def raise_for(code: int, what: str) -> None:
    if code:
        raise error_for_code(code, what)


MAX_RESPONSE_SIZE = 256 * 1024 * 1024   # a larger size prefix is not a Kafka response
IOV_MAX = 1024                           # buffers one sendmsg may take (Linux's UIO_MAXIOV)


def send_buffers(sock: socket.socket, buffers: list) -> None:
    """`sendall` of several buffers in order, without joining them: a gathering write (sendmsg),
    repeated from where a partial one stopped."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        sent = sock.sendmsg(views[:IOV_MAX])
        while sent:
            first = len(views[0])
            if sent < first:
                views[0] = views[0][sent:]
                break
            sent -= first
            del views[0]


class KafkaConnection:
    def __init__(self, host: str, port: int, client_id: str = "kstore", timeout: float = 10.0):
        self.host, self.port, self.client_id, self.timeout = host, port, client_id, timeout
        self._sock: socket.socket | None = None
        self._correlation = 0
        self._lock = threading.Lock()

    def _connect(self) -> socket.socket:
        if self._sock is None:
            try:
                self._sock = socket.create_connection((self.host, self.port), self.timeout)
            except OSError as e:
                raise BrokerNotAvailableError(f"cannot reach {self.host}:{self.port}: {e}") from None
        return self._sock

    def request(self, api_key: int, version: int, body: dict, timeout: float | None = None,
                expect_response: bool = True) -> dict | None:
        """Send one request and wait for its response (None, without waiting, when the request
        gets none: a Produce with acks=0)."""
        with self._lock:
            sock = self._connect()
            self._correlation += 1
            chunks = P.encode_request_chunks(api_key, version, self._correlation,
                                             self.client_id, body)
            try:
                sock.settimeout(timeout or self.timeout)
                send_buffers(sock, [struct.pack(">i", sum(map(len, chunks))), *chunks])
                if not expect_response:
                    return None
                (size,) = struct.unpack(">i", self._recv(sock, 4))
                if not 4 <= size <= MAX_RESPONSE_SIZE:
                    raise P.ProtocolError(f"a response size of {size} bytes")
                correlation, response = P.decode_response(api_key, version, self._recv(sock, size))
            except (OSError, struct.error) as e:
                self.close()
                raise BrokerNotAvailableError(f"{self.host}:{self.port}: {e}") from None
            except P.ProtocolError as e:   # e.g. the port belongs to something else than Kafka
                self.close()
                raise KStoreError(f"{self.host}:{self.port} did not answer like a Kafka broker: "
                                  f"{e}") from None
            if correlation != self._correlation:
                self.close()
                raise KStoreError(f"correlation id {correlation} answers request {self._correlation}")
            return response

    @staticmethod
    def _recv(sock: socket.socket, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class _Records:
    def __init__(self, data: bytes):
        self.data = data
        self.size = len(data)

    def read_bytes(self) -> bytes:
        return self.data


@dataclass
class _FetchData:
    records: _Records | None

    @property
    def size(self) -> int:
        return self.records.size if self.records else 0


@dataclass
class NetworkFetchResult:
    """The shape the replica fetcher expects from a leader's answer."""
    fetch_offset: int
    high_watermark: int
    log_start_offset: int
    data: _FetchData | None
    error: Exception | None = None
    diverging_epoch: object = None
    delayed_pending: bool = False


class NetworkReplicaClient:
    """A follower's view of one remote leader broker."""

    FETCH_VERSION = 11
    EPOCH_VERSION = 3
    LIST_OFFSETS_VERSION = 5

    def __init__(self, host: str, port: int, replica_id: int):
        self.conn = KafkaConnection(host, port, client_id=f"kstore-replica-{replica_id}")
        self.replica_id = replica_id

    def fetch_for_follower(self, replica_id, tp, fetch_offset, max_bytes, last_fetched_epoch,
                           current_leader_epoch, max_wait_ms=0, min_bytes=1, on_complete=None):
        body = {"replica_id": replica_id, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes,
                "max_bytes": max_bytes, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                "topics": [{"topic": tp[0], "partitions": [{
                    "partition": tp[1], "current_leader_epoch": current_leader_epoch if
                    current_leader_epoch is not None else -1, "fetch_offset": fetch_offset,
                    "log_start_offset": -1, "partition_max_bytes": max_bytes}]}],
                "forgotten_topics_data": [], "rack_id": ""}
        response = self.conn.request(API["Fetch"], self.FETCH_VERSION, body,
                                     timeout=10 + max_wait_ms / 1000)
        part = response["responses"][0]["partitions"][0]
        code = part["error_code"]
        if code == P.ERRORS["OFFSET_OUT_OF_RANGE"]:
            raise OffsetOutOfRangeError(f"fetch offset {fetch_offset} of {tp[0]}-{tp[1]} is out of range")
        raise_for(code, f"fetch {tp[0]}-{tp[1]} at {fetch_offset}")
        records = part.get("records") or b""
        return NetworkFetchResult(fetch_offset, part["high_watermark"], part["log_start_offset"],
                                  _FetchData(_Records(records)))

    def last_offset_for_leader_epoch(self, tp, epoch, current_leader_epoch=None):
        if epoch is None:
            return -1, -1
        body = {"replica_id": self.replica_id, "topics": [{"topic": tp[0], "partitions": [{
            "partition": tp[1], "current_leader_epoch": -1 if current_leader_epoch is None
            else current_leader_epoch, "leader_epoch": epoch}]}]}
        response = self.conn.request(API["OffsetsForLeaderEpoch"], self.EPOCH_VERSION, body)
        part = response["topics"][0]["partitions"][0]
        raise_for(part["error_code"], f"OffsetsForLeaderEpoch {tp[0]}-{tp[1]}")
        return part["leader_epoch"], part["end_offset"]

    def log_end_and_start(self, tp):
        out = []
        for ts in (-1, -2):
            body = {"replica_id": self.replica_id, "isolation_level": 0, "topics": [{
                "name": tp[0], "partitions": [{"partition_index": tp[1], "current_leader_epoch": -1,
                                               "timestamp": ts}]}]}
            response = self.conn.request(API["ListOffsets"], self.LIST_OFFSETS_VERSION, body)
            part = response["topics"][0]["partitions"][0]
            raise_for(part["error_code"], f"ListOffsets {tp[0]}-{tp[1]}")
            out.append(part["offset"])
        return out[0], out[1]

    def close(self) -> None:
        self.conn.close()


class NetworkTransport:
    """Finds a leader's address in the shared metadata and keeps one client per broker."""

    def __init__(self, metadata, own_id: int):
        self.metadata = metadata
        self.own_id = own_id
        self.local = None                    # this broker's own replica manager
        self._clients: dict[int, NetworkReplicaClient] = {}

    def leader_replica_manager(self, broker_id: int):
        if broker_id == self.own_id and self.local is not None:
            return self.local
        node = self.metadata.get(f"/brokers/ids/{broker_id}")
        if node is None:
            raise BrokerNotAvailableError(f"broker {broker_id} is not registered")
        client = self._clients.get(broker_id)
        if client is None or (client.conn.host, client.conn.port) != (node["host"], node["port"]):
            client = self._clients[broker_id] = NetworkReplicaClient(node["host"], node["port"], self.own_id)
        return client

    def close(self) -> None:
        for c in self._clients.values():
            c.close()

"""A minimal Kafka protocol client for the Spark source and sink (`kafka.bootstrap.servers`).

Four requests are enough: Metadata (topics and partition counts, never auto-creating a topic),
ListOffsets (earliest / latest = high watermark / by timestamp), Fetch (raw record-batch bytes,
which `kstore.spark.decode` turns into Arrow columns exactly as it does for files) and Produce.
The bytes are built and parsed by the engine's own schema-driven codec, `kstore.protocol`.

It talks to one broker: the first reachable address of the bootstrap list. That is all a
`kstore serve` cluster of one needs; a real multi-broker cluster would need requests routed to each
partition's leader (Metadata says who leads), which this client does not do.
"""

from __future__ import annotations

import itertools
import socket
import struct

from .. import protocol as P
from ..errors import KStoreError

API = P.API_KEYS
ERRORS_BY_CODE = {code: name for name, code in P.ERRORS.items()}

METADATA_V = 4        # v4+: allow_auto_topic_creation (always false here)
LIST_OFFSETS_V = 2    # v2+: isolation_level
FETCH_V = 5           # v5+: log_start_offset in the response
PRODUCE_V = 3         # v3: RecordBatch v2


class BrokerError(KStoreError):
    """An error code in a response (the Kafka name is in `.name`)."""

    def __init__(self, code: int, what: str):
        self.code, self.name = code, ERRORS_BY_CODE.get(code, str(code))
        super().__init__(f"{what}: {self.name} (error code {code})")


class WireClient:
    def __init__(self, bootstrap_servers: str, timeout_s: float = 30.0, client_id: str = "kstore-spark"):
        self.bootstrap_servers = bootstrap_servers
        self.timeout_s = timeout_s
        self.client_id = client_id
        self._ids = itertools.count(1)
        self._sock = self._connect()

    def _connect(self) -> socket.socket:
        errors = []
        for address in [a.strip() for a in self.bootstrap_servers.split(",") if a.strip()]:
            host, _, port = address.rpartition(":")
            try:
                sock = socket.create_connection((host or "127.0.0.1", int(port)), timeout=self.timeout_s)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except (OSError, ValueError) as e:
                errors.append(f"{address}: {e}")
        raise ConnectionError(f"cannot reach any kstore broker in kafka.bootstrap.servers="
                              f"{self.bootstrap_servers!r} ({'; '.join(errors) or 'no address'})")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> "WireClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- framing
    def _recv(self, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            chunk = self._sock.recv(min(n - got, 4 * 1024 * 1024))
            if not chunk:
                raise ConnectionError(f"the broker at {self.bootstrap_servers} closed the connection")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def request(self, api: str, version: int, body: dict, expect_response: bool = True) -> dict | None:
        correlation_id = next(self._ids)
        frame = P.encode_request(API[api], version, correlation_id, self.client_id, body)
        self._sock.sendall(struct.pack(">i", len(frame)) + frame)
        if not expect_response:
            return None
        (size,) = struct.unpack(">i", self._recv(4))
        got_id, response = P.decode_response(API[api], version, self._recv(size))
        if got_id != correlation_id:
            raise ConnectionError(f"{api} response for correlation id {got_id}, expected {correlation_id}")
        return response

    # ---- the four requests
    def topic_partitions(self) -> dict[str, int]:
        """topic → partition count for every topic the broker hosts."""
        body = {"topics": None, "allow_auto_topic_creation": False}
        response = self.request("Metadata", METADATA_V, body)
        return {t["name"]: len(t["partitions"]) for t in response["topics"] if t["error_code"] == 0}

    def list_offsets(self, requests: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """(topic, partition) → timestamp (−2 earliest, −1 latest) ⇒ offset (−1: none)."""
        by_topic: dict[str, list] = {}
        for (t, p), ts in requests.items():
            by_topic.setdefault(t, []).append({"partition_index": p, "timestamp": ts})
        body = {"replica_id": -1, "isolation_level": 0,
                "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}
        response = self.request("ListOffsets", LIST_OFFSETS_V, body)
        out = {}
        for topic in response["topics"]:
            for part in topic["partitions"]:
                if part["error_code"]:
                    raise BrokerError(part["error_code"],
                                      f"ListOffsets {topic['name']}-{part['partition_index']}")
                out[(topic["name"], part["partition_index"])] = part["offset"]
        return out

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 8 * 1024 * 1024,
              max_wait_ms: int = 0) -> dict:
        """One partition's fetch: {error_code, high_watermark, log_start_offset, records}."""
        body = {"replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 1, "max_bytes": max_bytes,
                "isolation_level": 0,
                "topics": [{"topic": topic, "partitions": [
                    {"partition": partition, "fetch_offset": offset, "log_start_offset": -1,
                     "partition_max_bytes": max_bytes}]}]}
        response = self.request("Fetch", FETCH_V, body)
        return response["responses"][0]["partitions"][0]

    def produce(self, topic: str, partition: int, records: bytes, acks: int = -1,
                timeout_ms: int = 30000) -> int:
        """Append batches; returns the base offset the broker assigned."""
        body = {"transactional_id": None, "acks": acks, "timeout_ms": timeout_ms,
                "topic_data": [{"name": topic, "partition_data": [{"index": partition,
                                                                    "records": records}]}]}
        response = self.request("Produce", PRODUCE_V, body)
        part = response["responses"][0]["partition_responses"][0]
        if part["error_code"]:
            raise BrokerError(part["error_code"], f"Produce to {topic}-{partition}")
        return part["base_offset"]

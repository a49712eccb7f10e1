"""Cluster metadata in the shape of Kafka's ZooKeeper layout, kept in one JSON file.

Before KRaft, Kafka kept its metadata in ZooKeeper under well-known paths; kstore keeps the same
tree (so the course can show it) in `<log dir>/kstore-cluster-metadata.json`, written atomically:

    /cluster/id                                   {"version": "1", "id": "<cluster id>"}
    /controller                                   {"version": 2, "brokerid": 0, "timestamp": "..."}
    /controller_epoch                             1
    /brokers/ids/0                                {"host": "127.0.0.1", "port": 9092, ...}
    /brokers/topics/orders                        {"version": 3, "topic_id": "...",
                                                   "partitions": {"0": [0], "1": [0]}, ...}
    /brokers/topics/orders/partitions/0/state     {"controller_epoch": 1, "leader": 0,
                                                   "version": 1, "leader_epoch": 0, "isr": [0]}
    /config/topics/orders                         {"version": 1, "config": {...}}

Modern Kafka (KRaft) keeps this as records in the `__cluster_metadata` log instead: TopicRecord,
PartitionRecord, ConfigRecord, ... (the real Kafka log dirs in tests/fixtures have one).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import threading
import time
import uuid
from typing import Any

from .checkpoint import atomic_write, file_lock
from .errors import LogError

METADATA_FILE = "kstore-cluster-metadata.json"


def new_uuid_string() -> str:
    """A random id in Kafka's `Uuid.toString` form: URL-safe base64 of 16 bytes, no padding.
    Like Kafka, never one that starts with '-' (it would look like a command-line option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


class MetadataStore:
    """A tiny ZooKeeper-like tree: paths → JSON values, persisted on every change."""

    def __init__(self, path: str, persist: bool = True):
        """`persist=False` (offline read-only tools): read the file once, keep every change in
        memory, never write the file or its lock."""
        self.path = str(path)
        self.persist = persist
        self._lock = threading.RLock()
        self._nodes: dict[str, Any] = {}
        self._stamp = None
        self._depth = 0
        self._refresh(force=True)

    # Reads see the file as it is now (other processes may have written it); writes happen in a
    # transaction: an exclusive lock on `<file>.lock`, re-read, change, atomic replace.
    def _refresh(self, force: bool = False) -> None:
        if not self.persist and not force:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            with open(self.path, encoding="utf-8") as f:
                try:
                    self._nodes = json.load(f)
                except ValueError as e:   # a torn or hand-edited file: name it, no traceback
                    raise LogError(f"{self.path} is not valid JSON ({e})") from None
            self._stamp = stamp

    @contextlib.contextmanager
    def transaction(self):
        with self._lock:
            if self._depth or not self.persist:   # nested: the file lock is already ours
                self._depth += 1
                try:
                    yield self
                finally:
                    self._depth -= 1
                return
            with file_lock(self.path + ".lock"):
                try:
                    self._depth = 1
                    self._refresh()
                    yield self
                finally:
                    self._depth = 0

    def get(self, path: str, default: Any = None) -> Any:
        self._refresh()
        return self._nodes.get(path, default)

    def exists(self, path: str) -> bool:
        self._refresh()
        return path in self._nodes

    def set(self, path: str, value: Any) -> None:
        self.set_many({path: value})

    def set_many(self, values: dict[str, Any]) -> None:
        with self.transaction():
            self._nodes.update(values)
            self._save()

    def delete(self, path: str) -> None:
        with self.transaction():
            for p in [p for p in self._nodes if p == path or p.startswith(path + "/")]:
                del self._nodes[p]
            self._save()

    def children(self, path: str) -> list[str]:
        self._refresh()
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix):].split("/", 1)[0] for p in self._nodes if p.startswith(prefix)})

    def tree(self) -> dict[str, Any]:
        self._refresh()
        return dict(sorted(self._nodes.items()))

    def _save(self) -> None:
        if not self.persist:
            return
        atomic_write(self.path, json.dumps(dict(sorted(self._nodes.items())), indent=1,
                                           sort_keys=True) + "\n")
        st = os.stat(self.path)
        self._stamp = (st.st_mtime_ns, st.st_size, st.st_ino)

    # ---- the ZooKeeper-era paths
    def ensure_cluster(self, broker_id: int, host: str, port: int, now_ms: int | None = None) -> str:
        """Create the cluster id, register the broker and make it the controller if needed."""
        with self.transaction():
            updates: dict[str, Any] = {}
            if not self.exists("/cluster/id"):
                updates["/cluster/id"] = {"version": "1", "id": new_uuid_string()}
            updates[f"/brokers/ids/{broker_id}"] = {
                "version": 5, "host": host, "port": port, "jmx_port": -1,
                "endpoints": [f"PLAINTEXT://{host}:{port}"], "rack": None,
                "timestamp": str(now_ms if now_ms is not None else int(time.time() * 1000))}
            if not self.exists("/controller"):
                updates["/controller"] = {"version": 2, "brokerid": broker_id, "timestamp": str(
                    now_ms if now_ms is not None else int(time.time() * 1000))}
                updates["/controller_epoch"] = self.get("/controller_epoch", 0) + 1
            self.set_many(updates)
            return self.get("/cluster/id")["id"]

    @property
    def cluster_id(self) -> str | None:
        node = self.get("/cluster/id")
        return node["id"] if node else None

    @property
    def controller_epoch(self) -> int:
        return self.get("/controller_epoch", 0)

    def topics(self) -> list[str]:
        return [t for t in self.children("/brokers/topics")]

    def topic(self, name: str) -> dict | None:
        return self.get(f"/brokers/topics/{name}")

    def partition_state(self, topic: str, partition: int) -> dict | None:
        return self.get(f"/brokers/topics/{topic}/partitions/{partition}/state")

    def topic_config(self, topic: str) -> dict:
        node = self.get(f"/config/topics/{topic}")
        return dict(node["config"]) if node else {}

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
import json
import os
import threading
import time
import uuid
from typing import Any

from .checkpoint import atomic_write

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

    def __init__(self, path: str):
        self.path = str(path)
        self._lock = threading.RLock()
        self._nodes: dict[str, Any] = {}
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                self._nodes = json.load(f)

    def get(self, path: str, default: Any = None) -> Any:
        return self._nodes.get(path, default)

    def exists(self, path: str) -> bool:
        return path in self._nodes

    def set(self, path: str, value: Any) -> None:
        with self._lock:
            self._nodes[path] = value
            self._save()

    def set_many(self, values: dict[str, Any]) -> None:
        with self._lock:
            self._nodes.update(values)
            self._save()

    def delete(self, path: str) -> None:
        with self._lock:
            for p in [p for p in self._nodes if p == path or p.startswith(path + "/")]:
                del self._nodes[p]
            self._save()

    def children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix):].split("/", 1)[0] for p in self._nodes if p.startswith(prefix)})

    def tree(self) -> dict[str, Any]:
        return dict(sorted(self._nodes.items()))

    def _save(self) -> None:
        atomic_write(self.path, json.dumps(self.tree(), indent=1, sort_keys=True) + "\n")

    # ---- the ZooKeeper-era paths
    def ensure_cluster(self, broker_id: int, host: str, port: int) -> str:
        """Create the cluster id, register the broker and make it the controller if needed."""
        with self._lock:
            updates: dict[str, Any] = {}
            if not self.exists("/cluster/id"):
                updates["/cluster/id"] = {"version": "1", "id": new_uuid_string()}
            updates[f"/brokers/ids/{broker_id}"] = {
                "version": 5, "host": host, "port": port, "jmx_port": -1,
                "endpoints": [f"PLAINTEXT://{host}:{port}"], "rack": None,
                "timestamp": str(int(time.time() * 1000))}
            if not self.exists("/controller"):
                updates["/controller"] = {"version": 2, "brokerid": broker_id,
                                          "timestamp": str(int(time.time() * 1000))}
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

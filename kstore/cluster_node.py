"""One broker process of a multi-broker cluster on this machine (`kstore serve --cluster-dir`).

The processes share `<cluster dir>/zookeeper.json` (the ZooKeeper-shaped metadata, written under a
file lock) and each keeps its own log directory `<cluster dir>/broker-<id>`. Each process:
* serves clients with Kafka's protocol (`KafkaServer`) on its own loopback port;
* heartbeats (touches `<cluster dir>/heartbeats/<id>` every `heartbeat_ms`) — the stand-in for a
  ZooKeeper session; a broker silent for `broker.session.timeout.ms` is dead;
* watches the metadata and applies every leadership decision about its replicas (LeaderAndIsr);
* fetches, as a follower, from the leaders over real sockets (Fetch with its replica id, and
  OffsetsForLeaderEpoch to truncate) on a fetcher thread;
* when it is the lowest live broker, acts as the controller: elects leaders for partitions whose
  leader died, shrinks ISRs, and bumps the controller epoch when it takes over.
Kill one process (even with SIGKILL) and the others carry on.
"""

from __future__ import annotations

import os
import threading
import time

from .broker import Broker
from .controller import Controller
from .errors import KStoreError
from .metadata import MetadataStore
from .network_client import NetworkTransport
from .server import KafkaServer


class _RemoteBroker:
    """The controller's view of a broker in another process: alive = its heartbeat is fresh.
    Decisions reach it through the metadata it watches, so nothing is pushed."""

    def __init__(self, node: "ClusterNode", broker_id: int):
        self.node, self.broker_id = node, broker_id

    @property
    def alive(self) -> bool:
        return self.node.is_alive(self.broker_id)

    def become_leader_or_follower(self, *args) -> None:
        pass


class _WatchingController(Controller):
    def __init__(self, metadata, brokers, clock):   # no election at construction: the node decides
        self.metadata, self.brokers, self.clock = metadata, brokers, clock
        self.elections = []


class ClusterNode:
    def __init__(self, cluster_dir: str, broker_id: int, port: int, host: str = "127.0.0.1",
                 broker_config: dict | None = None, session_timeout_ms: int = 6000,
                 heartbeat_ms: int = 500, zero_copy: bool = True):
        self.cluster_dir = os.path.abspath(cluster_dir)
        self.broker_id = broker_id
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_ms = heartbeat_ms
        os.makedirs(os.path.join(self.cluster_dir, "heartbeats"), exist_ok=True)
        self.metadata = MetadataStore(os.path.join(self.cluster_dir, "zookeeper.json"))
        self.transport = NetworkTransport(self.metadata, broker_id)
        self._beat()
        self.broker = Broker(os.path.join(self.cluster_dir, f"broker-{broker_id}"), broker_id=broker_id,
                             config=broker_config, metadata=self.metadata, transport=self.transport,
                             host=host, port=port)
        self.transport.local = self.broker.replica_manager
        self.controller = _WatchingController(self.metadata, _Brokers(self), self.broker.clock)
        self.broker.controller = self.controller
        self.server = KafkaServer(self.broker, host, port, zero_copy=zero_copy)
        self._stop = threading.Event()
        self._known_live: set[int] = set()
        self._applied: dict[tuple[str, int], tuple] = {}
        self._threads: list[threading.Thread] = []

    # ---- liveness
    def _heartbeat_path(self, broker_id: int) -> str:
        return os.path.join(self.cluster_dir, "heartbeats", str(broker_id))

    def _beat(self) -> None:
        path = self._heartbeat_path(self.broker_id)
        with open(path, "a"):
            pass
        os.utime(path)

    def is_alive(self, broker_id: int) -> bool:
        if broker_id == self.broker_id:
            return not self._stop.is_set()
        try:
            age_ms = (time.time() - os.path.getmtime(self._heartbeat_path(broker_id))) * 1000
        except FileNotFoundError:
            return False
        return age_ms <= self.session_timeout_ms

    def registered(self) -> list[int]:
        return [int(b) for b in self.metadata.children("/brokers/ids")]

    # ---- the watch loop: heartbeat, controller duties, apply decisions
    def _watch_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_ms / 1000):
            try:
                self._beat()
                live = {b for b in self.registered() if self.is_alive(b)}
                if live and min(live) == self.broker_id:
                    self._controller_duties(live)
                self._apply_decisions()
            except Exception as e:          # keep the broker alive; report once per kind
                self.last_error = f"{type(e).__name__}: {e}"

    def _controller_duties(self, live: set[int]) -> None:
        with self.metadata.transaction():
            if self.controller.controller_id != self.broker_id:
                self.controller._become_controller(self.broker_id)
                self._known_live = set()
            for b in sorted(self._known_live - live):
                self.controller.on_broker_failure(b)
            for b in sorted(live - self._known_live):
                if self._known_live:            # a broker that came back
                    self.controller.on_broker_startup(b)
                else:                           # just took over: elect where leaders are dead
                    pass
            for topic, p, replicas in list(self.controller.partitions()):
                s = self.controller.state(topic, p)
                if s["leader"] >= 0 and s["leader"] not in live:
                    self.controller._elect(topic, p, replicas, s, f"leader {s['leader']} is not alive")
                elif s["leader"] < 0 and any(b in live for b in replicas):
                    self.controller._elect(topic, p, replicas, s, "offline partition")
                else:
                    dead_in_isr = [b for b in s["isr"] if b not in live and b != s["leader"]]
                    if dead_in_isr:
                        self.controller._write_state(topic, p, s["leader"], s["leader_epoch"],
                                                     [b for b in s["isr"] if b in live])
            self._known_live = live

    def _apply_decisions(self) -> None:
        for topic in self.metadata.topics():
            node = self.metadata.topic(topic)
            overrides = self.metadata.topic_config(topic)
            if self.broker.logs.topic_configs.get(topic, {}) != overrides:   # altered elsewhere
                self.broker.apply_topic_config(topic, overrides)
            for p, replicas in node["partitions"].items():
                if self.broker_id not in replicas:
                    continue
                s = self.metadata.partition_state(topic, int(p))
                key = (topic, int(p))
                decision = (s["leader"], s["leader_epoch"], tuple(s["isr"]))
                if self._applied.get(key) != decision:
                    self.broker.become_leader_or_follower(topic, int(p), s["leader"],
                                                          s["leader_epoch"], s["isr"], replicas)
                    self._applied[key] = decision

    # ---- the fetcher loop
    def _fetch_loop(self) -> None:
        fetcher = self.broker.replica_manager.fetcher
        while not self._stop.is_set():
            states = list(fetcher.states)
            if not states:
                time.sleep(0.05)
                continue
            fetched = 0
            for tp in states:
                # One partition per request here (Kafka batches all of a leader's partitions in
                # one Fetch), so no waiting at the leader: a round that brings nothing pauses.
                try:
                    step = fetcher.step(tp, max_wait_ms=0)
                    fetched += step.records
                except Exception:
                    time.sleep(0.01)    # the leader moved or died: the metadata will tell us
            if not fetched:
                time.sleep(0.02)

    # ---- running
    def run(self) -> None:
        """Serve until SIGTERM/SIGINT (blocking)."""
        self._threads = [threading.Thread(target=self._watch_loop, daemon=True, name="watch"),
                         threading.Thread(target=self._fetch_loop, daemon=True, name="fetcher")]
        self._apply_decisions()
        for t in self._threads:
            t.start()
        import asyncio
        try:
            asyncio.run(self.server.serve())
        finally:
            self._stop.set()
            for t in self._threads:
                t.join(timeout=5)
            self.transport.close()
            self.broker.shutdown()


class _Brokers(dict):
    """broker id -> _RemoteBroker for every registered broker (looked up live)."""

    def __init__(self, node: ClusterNode):
        super().__init__()
        self.node = node

    def _refresh(self) -> None:
        for b in self.node.registered():
            if b not in self:
                dict.__setitem__(self, b, _RemoteBroker(self.node, b))

    def get(self, key, default=None):
        self._refresh()
        return dict.get(self, key, default)

    def items(self):
        self._refresh()
        return dict.items(self)

    def __getitem__(self, key):
        self._refresh()
        return dict.__getitem__(self, key)

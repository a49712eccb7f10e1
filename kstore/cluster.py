"""A cluster of brokers on one machine: each with its own log directory, replicating by fetching.

The same engine code runs in two ways:
* **stepped** (deterministic; what chapters, exercises and tests use): nothing happens unless you
  say so — `produce(...)`, `fetch(follower, ...)` ("follower 2 fetches now"), `replicate()`,
  `crash(b)`, `restart(b)`, `advance(ms)` ("clock advances 30 s", which runs due tasks: ISR
  expiration, HW checkpoints, timeouts);
* **running** (`start()` / `stop()`, with the real clock): each broker's fetcher has its own thread
  and fetches continuously with Kafka's fetch wait; timers run on their own.
Every broker keeps real files: segments, `leader-epoch-checkpoint`, `replication-offset-checkpoint`,
`recovery-point-offset-checkpoint`. The shared metadata is the ZooKeeper-shaped store in
`<root>/zookeeper.json`.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from .broker import Broker, _LocalTransport
from .clock import Clock, ManualClock, SystemClock
from .controller import Controller
from .errors import BrokerNotAvailableError, KStoreError, NotLeaderOrFollowerError
from .events import EventBus
from .log import Isolation, as_record
from .metadata import MetadataStore
from .records import Record, build_batch
from .replica_fetcher import EPOCH_TRUNCATION, FollowerStep
from .replica_manager import ProduceResult


@dataclass(frozen=True)
class ReplicaView:
    """One replica of a partition as the course shows it."""
    broker_id: int
    alive: bool
    role: str                  # leader / follower / offline
    log_end_offset: int
    high_watermark: int
    log_start_offset: int
    leader_epoch: int
    epochs: list               # leader-epoch cache entries
    remote_leos: dict          # (leader only) follower id -> LEO from its last fetch
    values: list               # (offset, value) of every record, for small logs


class Cluster:
    def __init__(self, root: str, num_brokers: int = 3, *, clock: Clock | None = None,
                 broker_config: dict | None = None, topic_defaults: dict | None = None,
                 truncation: str = EPOCH_TRUNCATION):
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)
        self.clock = clock or ManualClock()
        self.broker_config = dict(broker_config or {})
        self.topic_defaults = topic_defaults
        self.truncation = truncation
        # Cluster-level events (crash, restart, election, truncation_mode) for widgets; each
        # broker keeps its own bus for its logs' events.
        self.events = EventBus()
        self.metadata = MetadataStore(os.path.join(self.root, "zookeeper.json"))
        self.brokers: dict[int, Broker] = {}
        self.transport = _LocalTransport(self.brokers)
        self.controller = Controller(self.metadata, self.brokers, self.clock)
        self._threads: list[threading.Thread] = []
        self._running = threading.Event()
        for b in range(num_brokers):
            self._open_broker(b)
        self.controller = Controller(self.metadata, self.brokers, self.clock)
        for broker in self.brokers.values():
            broker.controller = self.controller

    # ------------------------------------------------------------------ brokers
    def broker_dir(self, broker_id: int) -> str:
        return os.path.join(self.root, f"broker-{broker_id}")

    def _open_broker(self, broker_id: int) -> Broker:
        broker = Broker(self.broker_dir(broker_id), broker_id=broker_id, clock=self.clock,
                        config=self.broker_config, topic_defaults=self.topic_defaults,
                        metadata=self.metadata, transport=self.transport,
                        port=9092 + broker_id, truncation_mode=self.truncation)
        broker.controller = self.controller
        self.brokers[broker_id] = broker
        return broker

    def live_brokers(self) -> list[int]:
        return sorted(b for b, broker in self.brokers.items() if broker.alive)

    def crash(self, broker_id: int, lose_unflushed: bool = False, notify_controller: bool = True) -> list:
        """Kill a broker (kill -9; or a power loss with `lose_unflushed`). The controller notices
        at once (its ZooKeeper session ends) and re-elects where it led — unless
        `notify_controller=False`: a restart quicker than the session timeout goes unnoticed."""
        broker = self.brokers[broker_id]
        if not broker.alive:
            raise KStoreError(f"broker {broker_id} is already down")
        broker.crash(lose_unflushed)
        elections = self.controller.on_broker_failure(broker_id) if notify_controller else []
        self._check_purgatories()
        self.events.emit("crash", self.root, broker=broker_id, elections=elections)
        return elections

    def restart(self, broker_id: int) -> list:
        """Start a crashed broker again on its files: recovery, HW from its checkpoint, then the
        controller makes it a follower or elects it. A follower truncates at once (by leader epoch,
        or to its HW in the old mode), before its first fetch."""
        if self.brokers[broker_id].alive:
            raise KStoreError(f"broker {broker_id} is running")
        self._open_broker(broker_id)
        elections = self.controller.on_broker_startup(broker_id)
        fetcher = self.brokers[broker_id].replica_manager.fetcher
        self.last_truncations = []
        for tp, state in sorted(fetcher.states.items()):
            if state.needs_truncation:
                try:
                    self.last_truncations.append(fetcher.truncate(tp))
                except KStoreError:
                    pass   # the leader is not reachable: the first fetch round will truncate
        self._check_purgatories()
        self.events.emit("restart", self.root, broker=broker_id, elections=elections)
        return elections

    def bounce(self, broker_id: int, lose_unflushed: bool = False) -> list:
        """Crash and restart a broker before the controller notices (it stays in the ISRs)."""
        self.crash(broker_id, lose_unflushed, notify_controller=False)
        return self.restart(broker_id)

    def set_truncation(self, mode: str) -> None:
        """Leader-epoch truncation (Kafka ≥ 0.11) or high-watermark truncation (before)."""
        self.truncation = mode
        for broker in self.brokers.values():
            broker.replica_manager.fetcher.truncation_mode = mode
        self.events.emit("truncation_mode", self.root, mode=mode)

    # ------------------------------------------------------------------ topics
    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 3,
                     configs: dict | None = None):
        return self.brokers[self.controller.controller_id].create_topic(
            name, partitions, replication_factor, configs)

    def leader(self, topic: str, partition: int = 0) -> int:
        return self.metadata.partition_state(topic, partition)["leader"]

    def replicas(self, topic: str, partition: int = 0) -> list[int]:
        return self.metadata.topic(topic)["partitions"][str(partition)]

    def isr(self, topic: str, partition: int = 0) -> list[int]:
        return self.metadata.partition_state(topic, partition)["isr"]

    # ------------------------------------------------------------------ data
    def produce(self, topic: str, partition: int, values, acks=-1, timeout_ms: int = 30000) -> ProduceResult:
        """Produce to the current leader; `values` is a list of values / (key, value) / Records,
        or a ready batch. Returns the request's result (done at once for acks 0/1)."""
        leader = self.leader(topic, partition)
        if leader < 0 or not self.brokers[leader].alive:
            result = ProduceResult(topic, partition, acks if acks != "all" else -1)
            result.complete(NotLeaderOrFollowerError(f"{topic}-{partition} has no leader"))
            return result
        data = values if isinstance(values, (bytes, bytearray)) else build_batch(
            [as_record(v, self.clock.milliseconds()) for v in values])
        return self.brokers[leader].produce_request(topic, partition, bytes(data), acks, timeout_ms)

    def fetch(self, broker_id: int, topic: str, partition: int = 0, wait_ms: int = 0) -> FollowerStep:
        """One fetch round by a follower ("follower 2 fetches now"). With `wait_ms` > 0 a fetch
        that finds nothing waits at the leader; new data or `advance()` completes it."""
        broker = self.brokers[broker_id]
        if not broker.alive:
            raise BrokerNotAvailableError(f"broker {broker_id} is down")
        return broker.replica_manager.fetcher.step((topic, partition), max_wait_ms=wait_ms)

    def replicate(self, topic: str | None = None, rounds: int = 1) -> list[FollowerStep]:
        """Every live follower of every (or one topic's) partition takes `rounds` fetch rounds."""
        steps = []
        for _ in range(rounds):
            for b in self.live_brokers():
                fetcher = self.brokers[b].replica_manager.fetcher
                for tp in sorted(fetcher.states):
                    if topic is None or tp[0] == topic:
                        steps.append(fetcher.step(tp, max_wait_ms=0))
        return steps

    def consume(self, topic: str, partition: int = 0, offset: int | None = None) -> list[Record]:
        """What a consumer can read from the leader: records below the high watermark."""
        broker = self.brokers[self.leader(topic, partition)]
        log = broker.leader_log(topic, partition)
        return log.records(offset, isolation=Isolation.HIGH_WATERMARK)

    def advance(self, ms: int) -> None:
        """Move the (manual) clock and run what became due: timers, timeouts, waiting requests."""
        if not isinstance(self.clock, ManualClock):
            raise KStoreError("advance() needs a ManualClock; a running cluster keeps real time")
        self.clock.advance(ms)
        for b in self.live_brokers():
            self.brokers[b].logs.scheduler.run_due()
        self._check_purgatories()

    def _check_purgatories(self) -> None:
        for b in self.live_brokers():
            self.brokers[b].replica_manager.check_purgatory()

    def elect_preferred_leader(self, topic: str, partition: int = 0):
        election = self.controller.elect_preferred_leader(topic, partition)
        self.events.emit("election", self.root, topic=topic, partition=partition, election=election)
        return election

    # ------------------------------------------------------------------ views
    def state(self, topic: str, partition: int = 0, with_values: bool = True) -> list[ReplicaView]:
        s = self.metadata.partition_state(topic, partition)
        out = []
        for b in self.replicas(topic, partition):
            broker = self.brokers[b]
            if not broker.alive:
                out.append(ReplicaView(b, False, "offline", -1, -1, -1, -1, [], {}, []))
                continue
            p = broker.replica_manager.partitions.get((topic, partition))
            if p is None:
                continue
            log = p.log
            values = [(r.offset, r.value) for r in log.records()] if with_values else []
            out.append(ReplicaView(
                b, True, "leader" if b == s["leader"] else "follower", log.log_end_offset,
                log.high_watermark, log.log_start_offset, p.leader_epoch,
                [tuple(e) for e in log.leader_epoch_cache.entries()],
                {r: st.log_end_offset for r, st in p.remote.items()} if p.is_leader else {}, values))
        return out

    def describe(self, topic: str, partition: int = 0) -> str:
        s = self.metadata.partition_state(topic, partition)
        lines = [f"{topic}-{partition}: leader {s['leader']}, leader epoch {s['leader_epoch']}, "
                 f"ISR {s['isr']}, controller {self.controller.controller_id} "
                 f"(epoch {self.controller.controller_epoch})"]
        for r in self.state(topic, partition):
            if not r.alive:
                lines.append(f"  broker {r.broker_id}: down")
                continue
            remote = f" remote LEOs {r.remote_leos}" if r.remote_leos else ""
            lines.append(f"  broker {r.broker_id} ({r.role}): LEO {r.log_end_offset} HW "
                         f"{r.high_watermark} epochs {r.epochs}{remote}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ running mode
    def start(self, poll_ms: int = 5) -> None:
        """Run the cluster live: a fetcher thread per broker and a timer thread (real clock)."""
        if isinstance(self.clock, ManualClock):
            raise KStoreError("a running cluster needs the real clock: Cluster(..., clock=SystemClock())")
        if self._running.is_set():
            return
        self._running.set()

        def fetch_loop(broker_id: int) -> None:
            while self._running.is_set():
                broker = self.brokers.get(broker_id)
                if broker is None or not broker.alive:
                    time.sleep(poll_ms / 1000)
                    continue
                fetcher = broker.replica_manager.fetcher
                for tp in list(fetcher.states):
                    try:
                        fetcher.step(tp)
                    except KStoreError:
                        pass   # the leader moved or died: the controller will tell us
                time.sleep(poll_ms / 1000)

        def timer_loop() -> None:
            while self._running.is_set():
                for b in self.live_brokers():
                    broker = self.brokers.get(b)
                    try:
                        broker.logs.scheduler.run_due()
                        broker.replica_manager.check_purgatory()
                    except Exception:
                        pass
                time.sleep(poll_ms / 1000)

        self._threads = [threading.Thread(target=fetch_loop, args=(b,), daemon=True,
                                          name=f"replica-fetcher-{b}") for b in self.brokers]
        self._threads.append(threading.Thread(target=timer_loop, daemon=True, name="cluster-timers"))
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._running.clear()
        for t in self._threads:
            t.join(timeout=10)
        self._threads = []

    def shutdown(self) -> None:
        self.stop()
        for b in self.live_brokers():
            self.brokers[b].shutdown()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


__all__ = ["Cluster", "ReplicaView", "SystemClock"]

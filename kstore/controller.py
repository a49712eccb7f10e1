"""The controller: who leads each partition, in which leader epoch, with which ISR.

Mirrors the ZooKeeper-era `KafkaController` (and the decisions KRaft's QuorumController makes):
* a broker that dies loses its leaderships: for each such partition the new leader is the first
  *live* replica in assignment order that is *in the ISR*; with
  `unclean.leader.election.enable=true` and no such replica, the first live replica at all (it may
  lack committed records: data loss, for availability);
* every leader change bumps the partition's leader epoch; a dead follower leaves the ISR;
* leaders report ISR changes (AlterPartition); a restarted broker becomes a follower again, or the
  leader of a partition that had none;
* when the controller's own broker dies, the next live broker takes over and the controller epoch
  goes up (so brokers can ignore a stale controller);
* every decision is written to the ZooKeeper-shaped metadata (`/brokers/topics/.../state`,
  `/controller`, `/controller_epoch`) and pushed to the replicas (LeaderAndIsr).
"""

from __future__ import annotations

from dataclasses import dataclass


def elect_leader(assignment: list[int], isr: list[int], live: set[int], unclean: bool) -> int | None:
    """The new leader: the first live ISR member in assignment order; with unclean election, the
    first live replica; None when nobody may lead (the partition goes offline)."""
    for b in assignment:
        if b in live and b in isr:
            return b
    if unclean:
        for b in assignment:
            if b in live:
                return b
    return None


@dataclass
class Election:
    topic: str
    partition: int
    old_leader: int
    new_leader: int
    leader_epoch: int
    isr: list[int]
    unclean: bool
    reason: str


class Controller:
    def __init__(self, metadata, brokers: dict, clock):
        self.metadata = metadata
        self.brokers = brokers          # broker id -> Broker (live or not; see .alive)
        self.clock = clock
        self.elections: list[Election] = []
        live = self.live_brokers()
        current = (metadata.get("/controller") or {}).get("brokerid")
        if current not in live and live:
            self._become_controller(min(live))

    # ---- liveness
    def live_brokers(self) -> set[int]:
        return {b for b, broker in self.brokers.items() if broker.alive}

    @property
    def controller_id(self) -> int:
        return (self.metadata.get("/controller") or {}).get("brokerid", -1)

    @property
    def controller_epoch(self) -> int:
        return self.metadata.controller_epoch

    def _become_controller(self, broker_id: int) -> None:
        self.metadata.set_many({
            "/controller": {"version": 2, "brokerid": broker_id,
                            "timestamp": str(self.clock.milliseconds())},
            "/controller_epoch": self.metadata.controller_epoch + 1})

    # ---- state
    def partitions(self):
        for topic in self.metadata.topics():
            node = self.metadata.topic(topic)
            for p, replicas in node["partitions"].items():
                yield topic, int(p), replicas

    def state(self, topic: str, partition: int) -> dict:
        return dict(self.metadata.partition_state(topic, partition))

    def _write_state(self, topic: str, partition: int, leader: int, leader_epoch: int, isr: list[int]) -> None:
        self.metadata.set(f"/brokers/topics/{topic}/partitions/{partition}/state", {
            "controller_epoch": self.controller_epoch, "leader": leader, "version": 1,
            "leader_epoch": leader_epoch, "isr": list(isr)})

    def _push(self, topic: str, partition: int) -> None:
        """Send LeaderAndIsr to every live replica."""
        replicas = self.metadata.topic(topic)["partitions"][str(partition)]
        s = self.state(topic, partition)
        for b in replicas:
            broker = self.brokers.get(b)
            if broker is not None and broker.alive:
                broker.become_leader_or_follower(topic, partition, s["leader"], s["leader_epoch"],
                                                 s["isr"], replicas)

    # ---- events
    def on_broker_failure(self, broker_id: int) -> list[Election]:
        """A broker died (its ZooKeeper session expired): re-elect where it led, shrink ISRs."""
        if self.controller_id == broker_id or self.controller_id not in self.live_brokers():
            live = self.live_brokers()
            if live:
                self._become_controller(min(live))
        done = []
        for topic, p, replicas in self.partitions():
            s = self.state(topic, p)
            if broker_id not in replicas:
                continue
            if s["leader"] == broker_id:
                done.append(self._elect(topic, p, replicas, s, f"broker {broker_id} failed"))
            elif broker_id in s["isr"]:
                isr = [b for b in s["isr"] if b != broker_id]
                self._write_state(topic, p, s["leader"], s["leader_epoch"], isr)
                self._push(topic, p)
        return [e for e in done if e is not None]

    def on_broker_startup(self, broker_id: int) -> list[Election]:
        """A broker came back: it follows the current leaders; offline partitions get a leader."""
        done = []
        for topic, p, replicas in self.partitions():
            if broker_id not in replicas:
                continue
            s = self.state(topic, p)
            if s["leader"] < 0 or s["leader"] not in self.live_brokers():
                done.append(self._elect(topic, p, replicas, s, f"broker {broker_id} started"))
            else:
                self._push(topic, p)
        return [e for e in done if e is not None]

    def _elect(self, topic: str, p: int, replicas: list[int], s: dict, reason: str) -> Election | None:
        live = self.live_brokers()
        log_config = self._topic_unclean(topic)
        leader = elect_leader(replicas, s["isr"], live, unclean=False)
        unclean = False
        if leader is None and log_config:
            leader = elect_leader(replicas, s["isr"], live, unclean=True)
            unclean = leader is not None
        if leader is None:
            # Offline: no leader; the ISR keeps the last members so a clean election can follow.
            isr = [b for b in s["isr"] if b in live] or s["isr"]
            self._write_state(topic, p, -1, s["leader_epoch"], isr)
            self._push(topic, p)
            return None
        isr = [leader] if unclean else [b for b in s["isr"] if b in live]
        epoch = s["leader_epoch"] + 1
        self._write_state(topic, p, leader, epoch, isr)
        election = Election(topic, p, s["leader"], leader, epoch, isr, unclean, reason)
        self.elections.append(election)
        self._push(topic, p)
        return election

    def _topic_unclean(self, topic: str) -> bool:
        config = self.metadata.topic_config(topic)
        value = config.get("unclean.leader.election.enable", False)
        return value is True or str(value).lower() == "true"

    def alter_partition(self, topic: str, partition: int, leader_epoch: int, isr: list[int]) -> bool:
        """A leader changes the ISR (AlterPartition); refused if its leader epoch is stale."""
        s = self.state(topic, partition)
        if s["leader_epoch"] != leader_epoch:
            return False
        self._write_state(topic, partition, s["leader"], leader_epoch, isr)
        return True

    def elect_preferred_leader(self, topic: str, partition: int) -> Election | None:
        """Move leadership back to the first replica of the assignment if it is alive and in sync."""
        replicas = self.metadata.topic(topic)["partitions"][str(partition)]
        s = self.state(topic, partition)
        preferred = replicas[0]
        if s["leader"] == preferred or preferred not in self.live_brokers() or preferred not in s["isr"]:
            return None
        epoch = s["leader_epoch"] + 1
        self._write_state(topic, partition, preferred, epoch, s["isr"])
        election = Election(topic, partition, s["leader"], preferred, epoch, s["isr"], False,
                            "preferred leader election")
        self.elections.append(election)
        self._push(topic, partition)
        return election

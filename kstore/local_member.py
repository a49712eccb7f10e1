"""A group member in-process: the client side of the classic group protocol, without a network.

Mirrors the state Kafka's `AbstractCoordinator` / `ConsumerCoordinator` keep for a member
(memberId, generation, the assignment) and the calls they make, but talks to the coordinator's
`GroupMembership` directly, so a notebook can step a rebalance with the injected clock:

    a.join()        # JoinGroup: answered now, or held until the rebalance completes
    gm.tick()       # the coordinator's timers (after clock.advance(...))
    a.sync()        # SyncGroup: the leader runs the assignor and sends everyone's partitions
    a.heartbeat()   # 0, or REBALANCE_IN_PROGRESS (27) when the member must join again
`kstore.consumer_coordinator` is the same member over the network.
"""

from __future__ import annotations

from typing import Callable

from .assignors import range_assign
from .consumer_protocol import decode_assignment, decode_subscription, encode_assignment, \
    encode_subscription
from .protocol import ERROR_NAMES


class LocalGroupMember:
    def __init__(self, membership, group_id: str, client_id: str, topics: list[str], *,
                 partitions_per_topic: Callable[[str], int] | dict | None = None,
                 assignor: Callable = range_assign, session_timeout_ms: int = 10000,
                 rebalance_timeout_ms: int = 30000, instance_id: str | None = None):
        self.membership, self.group_id, self.client_id = membership, group_id, client_id
        self.topics, self.assignor, self.instance_id = list(topics), assignor, instance_id
        self._counts = partitions_per_topic or {}
        self.session_timeout_ms, self.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
        self.member_id, self.generation = "", -1
        self.leader = False
        self.assignment: list[tuple[str, int]] = []
        self.last_error = "NONE"
        self._join_answer: dict | None = None
        self._members: list[dict] = []

    def _count(self, topic: str) -> int:
        return self._counts(topic) if callable(self._counts) else self._counts.get(topic, 0)

    # ---- JoinGroup
    def join(self) -> bool:
        """Send JoinGroup (v5, so no MEMBER_ID_REQUIRED round); True if answered already."""
        self._join_answer = None
        self.membership.join_group({
            "group_id": self.group_id, "session_timeout_ms": self.session_timeout_ms,
            "rebalance_timeout_ms": self.rebalance_timeout_ms, "member_id": self.member_id,
            "group_instance_id": self.instance_id, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": encode_subscription(self.topics)}]},
            self.client_id, "/127.0.0.1", 3, self._joined)
        return self.joined

    def _joined(self, answer: dict) -> None:
        self._join_answer = answer
        self.last_error = ERROR_NAMES[answer["error_code"]]
        if answer["error_code"] == 0:
            self.member_id, self.generation = answer["member_id"], answer["generation_id"]
            self.leader = answer["leader"] == self.member_id
            self._members = answer["members"]

    @property
    def joined(self) -> bool:
        return self._join_answer is not None

    # ---- SyncGroup
    def sync(self) -> bool:
        """Send SyncGroup (the leader with everyone's assignment); True if answered already."""
        assignments = []
        if self.leader:
            subscriptions = {m["member_id"]: decode_subscription(m["metadata"]).topics
                             for m in self._members}
            counts = {t: self._count(t) for ts in subscriptions.values() for t in ts}
            result = self.assignor(subscriptions, counts)
            assignments = [{"member_id": m, "assignment": encode_assignment(list(tps))}
                           for m, tps in result.items()]
        self._synced = False
        self.membership.sync_group({"group_id": self.group_id, "generation_id": self.generation,
                                    "member_id": self.member_id, "group_instance_id": self.instance_id,
                                    "assignments": assignments}, self._sync_answer)
        return self._synced

    def _sync_answer(self, answer: dict) -> None:
        self._synced = True
        self.last_error = ERROR_NAMES[answer["error_code"]]
        if answer["error_code"] == 0:
            self.assignment = decode_assignment(answer["assignment"]).partitions

    # ---- Heartbeat / LeaveGroup
    def heartbeat(self) -> str:
        code = self.membership.heartbeat({"group_id": self.group_id, "generation_id": self.generation,
                                          "member_id": self.member_id,
                                          "group_instance_id": self.instance_id})["error_code"]
        self.last_error = ERROR_NAMES[code]
        return self.last_error

    def leave(self) -> str:
        [result] = self.membership.leave_group(self.group_id, [
            {"member_id": self.member_id, "group_instance_id": self.instance_id}])
        self.assignment = []
        self.last_error = ERROR_NAMES[result["error_code"]]
        return self.last_error

    def __repr__(self) -> str:
        parts = ", ".join(f"{t}-{p}" for t, p in sorted(self.assignment)) or "nothing"
        role = " (leader)" if self.leader else ""
        return f"{self.client_id}{role}: generation {self.generation}, owns {parts}"

"""The member side of a consumer group, for kstore's own consumer: Kafka's `ConsumerCoordinator`
(and `AbstractCoordinator`).

What `kstore consume --group G --bootstrap-server ...` does instead of assign():
* FindCoordinator, then JoinGroup (v5) with the subscription; from v4 the first answer is
  MEMBER_ID_REQUIRED with our member id, and we join again with it. The answer is held by the
  coordinator until the rebalance completes;
* the leader (the coordinator says who) computes the assignment with the range assignor and
  sends it in SyncGroup; every member's SyncGroup answer carries its partitions;
* between polls it heartbeats every heartbeat.interval.ms; REBALANCE_IN_PROGRESS means "rejoin",
  ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID mean "rejoin as a new member". Before rejoining it
  commits its positions (with its generation and member id, which the coordinator checks);
* close() sends LeaveGroup, so the others rebalance at once rather than after session.timeout.ms.
Join/sync run on a connection of their own, with a timeout longer than the rebalance can take.
"""

from __future__ import annotations

from .assignors import range_assign
from .clock import Clock, SystemClock
from .consumer_protocol import decode_assignment, decode_subscription, encode_assignment, \
    encode_subscription
from .errors import KStoreError, error_for_code
from .network_client import KafkaConnection
from .protocol import API_KEYS as API, ERRORS as E

REJOIN = (E["REBALANCE_IN_PROGRESS"], E["ILLEGAL_GENERATION"], E["UNKNOWN_MEMBER_ID"],
          E["MEMBER_ID_REQUIRED"])
# The coordinator moved or is loading (a new __consumer_offsets leader): find it again, retry.
COORDINATOR_MOVED = (E["COORDINATOR_LOAD_IN_PROGRESS"], E["COORDINATOR_NOT_AVAILABLE"],
                     E["NOT_COORDINATOR"])


class ConsumerCoordinator:
    def __init__(self, broker, group_id: str, topics: list[str], *, client_id: str = "kstore-consumer",
                 session_timeout_ms: int = 45000, rebalance_timeout_ms: int = 300000,
                 heartbeat_interval_ms: int = 3000, clock: Clock | None = None):
        self.broker, self.group_id, self.topics = broker, group_id, list(topics)
        self.client_id = client_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.clock = clock or SystemClock()
        self.member_id, self.generation_id = "", -1
        self.needs_join = True
        self._conn: KafkaConnection | None = None
        self._next_heartbeat = 0

    # ---- the coordinator connection
    def _request(self, api: str, version: int, body: dict) -> dict:
        if self._conn is None:
            node = self.broker.retrying(   # FindCoordinator, while the offsets topic is set up
                lambda: self.broker.group_coordinator._coordinator(self.group_id), COORDINATOR_MOVED)
            host, port = self.broker._brokers[node]
            self._conn = KafkaConnection(host, port, self.client_id,
                                         timeout=self.rebalance_timeout_ms / 1000 + 10)
        response = self._conn.request(API[api], version, body)
        if response.get("error_code") in COORDINATOR_MOVED:
            self._forget_coordinator()
        return response

    def _forget_coordinator(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def commit_identity(self) -> dict:
        """What OffsetCommit must carry for this member (checked by the coordinator)."""
        return {"generation_id": self.generation_id, "member_id": self.member_id}

    # ---- joining
    def ensure_active(self, consumer) -> bool:
        """Join (or rejoin) if needed and hand the consumer its partitions; True if it changed."""
        if not self.needs_join:
            return False
        if consumer.assignment() and self.generation_id >= 0:
            try:
                consumer.commit()           # before the partitions may move to someone else
            except KStoreError:
                pass                        # the generation is gone: the next owner re-reads
        partitions = self._join_and_sync()
        consumer.assign(partitions)
        self.needs_join = False
        self._next_heartbeat = self.clock.milliseconds() + self.heartbeat_interval_ms
        return True

    def _join_and_sync(self) -> list[tuple[str, int]]:
        deadline = self.clock.milliseconds() + self.rebalance_timeout_ms
        while True:
            joined = self._request("JoinGroup", 5, {
                "group_id": self.group_id, "session_timeout_ms": self.session_timeout_ms,
                "rebalance_timeout_ms": self.rebalance_timeout_ms, "member_id": self.member_id,
                "group_instance_id": None, "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": encode_subscription(self.topics)}]})
            code = joined["error_code"]
            if code == E["MEMBER_ID_REQUIRED"]:
                self.member_id = joined["member_id"]
                continue
            if code == E["UNKNOWN_MEMBER_ID"]:
                self.member_id = ""
                continue
            if code in COORDINATOR_MOVED and self.clock.milliseconds() < deadline:
                self.clock.sleep(100)       # retry.backoff.ms, then look the coordinator up again
                continue
            if code:
                raise error_for_code(code, f"JoinGroup of group '{self.group_id}'")
            self.member_id, self.generation_id = joined["member_id"], joined["generation_id"]
            assignments = []
            if joined["leader"] == self.member_id:
                assignments = self._assign(joined["members"])
            synced = self._request("SyncGroup", 3, {
                "group_id": self.group_id, "generation_id": self.generation_id,
                "member_id": self.member_id, "group_instance_id": None,
                "assignments": assignments})
            if synced["error_code"] in REJOIN:
                continue                    # the group moved on while we synced: join again
            if synced["error_code"]:
                raise error_for_code(synced["error_code"], f"SyncGroup of group '{self.group_id}'")
            return decode_assignment(synced["assignment"]).partitions

    def _assign(self, members: list[dict]) -> list[dict]:
        subscriptions = {m["member_id"]: decode_subscription(m["metadata"]).topics for m in members}
        counts = {t: self.broker.partition_count(t) for ts in subscriptions.values() for t in ts}
        result = range_assign(subscriptions, counts,
                              {m["member_id"]: m["group_instance_id"] for m in members})
        return [{"member_id": m, "assignment": encode_assignment(tps)} for m, tps in result.items()]

    # ---- staying in
    def poll_heartbeat(self) -> None:
        """Heartbeat when due; a rebalance or a lost membership sets needs_join."""
        now = self.clock.milliseconds()
        if self.needs_join or now < self._next_heartbeat:
            return
        self._next_heartbeat = now + self.heartbeat_interval_ms
        code = self._request("Heartbeat", 3, {"group_id": self.group_id,
                                              "generation_id": self.generation_id,
                                              "member_id": self.member_id,
                                              "group_instance_id": None})["error_code"]
        if code in (E["UNKNOWN_MEMBER_ID"], E["ILLEGAL_GENERATION"]):
            self.member_id, self.generation_id = "", -1   # fenced: join as a new member
        if code in REJOIN:
            self.needs_join = True
        elif code in COORDINATOR_MOVED:
            self.needs_join = True          # rejoin at the coordinator found next
        elif code:
            raise error_for_code(code, f"Heartbeat of group '{self.group_id}'")

    def leave(self) -> None:
        if self.member_id and self._conn is not None:
            try:
                self._request("LeaveGroup", 3, {"group_id": self.group_id, "members": [
                    {"member_id": self.member_id, "group_instance_id": None}]})
            except (KStoreError, OSError):
                pass                        # the session timeout will remove us anyway
        if self._conn is not None:
            self._conn.close()
            self._conn = None

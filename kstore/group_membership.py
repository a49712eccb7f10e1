"""The classic group membership protocol: JoinGroup, SyncGroup, Heartbeat, LeaveGroup.

Mirrors the membership half of Kafka's classic `GroupCoordinator` (handleJoinGroup,
handleSyncGroup, handleHeartbeat, handleLeaveGroup, the DelayedJoin / InitialDelayedJoin /
DelayedHeartbeat purgatories), with time from the injected clock and timers driven by `tick()`:

* a JoinGroup is *held*: its answer (a callback) is kept until the rebalance completes — when every
  known member has rejoined, or the rebalance timeout passes (members that did not rejoin are
  dropped). The first rebalance of an empty group waits `group.initial.rebalance.delay.ms`
  longer for more members (extended by each new joiner, up to the rebalance timeout), so a fleet
  of consumers starting together rebalances once, not once per consumer;
* from JoinGroup v4 a new dynamic member first gets a member id with MEMBER_ID_REQUIRED and
  joins again with it (KIP-394), so a client that times out cannot leave ghost members behind;
* the leader's SyncGroup carries every member's assignment; the group is stored in
  `__consumer_offsets` (a GroupMetadata record) and each held SyncGroup gets its member's bytes;
* a member that neither heartbeats nor waits in a JoinGroup/SyncGroup for `session.timeout.ms`
  is removed, which starts a rebalance; heartbeats during a rebalance answer
  REBALANCE_IN_PROGRESS, which is how the other members learn they must rejoin;
* static members (`group.instance.id`) keep their assignment across restarts: rejoining with the
  same instance id replaces the old member id (which is fenced: FENCED_INSTANCE_ID) without a
  rebalance when the group is stable.
Every answer is a dict with the fields of the response of the same name, `error_code` first.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Callable

from . import protocol as P
from .group_metadata import (COMPLETING_REBALANCE, DEAD, EMPTY, PREPARING_REBALANCE, STABLE,
                             GroupMetadata, MemberMetadata)

E = P.ERRORS
# An operator follows rebalances in the broker's log, as in Kafka's server.log: one INFO line
# when a rebalance starts (with its reason), when it completes, and when a member goes.
log = logging.getLogger(__name__)
Callback = Callable[[dict], None]


class GroupMembership:
    """All classic groups of one coordinator; `store(group)` persists a group's metadata."""

    def __init__(self, clock, config, store: Callable[[GroupMetadata], None] | None = None,
                 new_uuid: Callable[[], str] = lambda: str(uuid.uuid4()), events=None):
        self.clock = clock
        self.events = events        # an EventBus: a "group" event when a group visibly changes
        self.config = config        # a mapping of the group.* broker configs
        self.store = store or (lambda group: None)
        self.new_uuid = new_uuid
        self.groups: dict[str, GroupMetadata] = {}
        self.lock = threading.RLock()

    def _now(self) -> int:
        return self.clock.milliseconds()

    def group(self, group_id: str) -> GroupMetadata | None:
        return self.groups.get(group_id)

    # ---- "group" events for the views (state, generation, leader, members, assignments)
    def _snapshot(self) -> dict:
        return {gid: (g.state, g.generation_id, g.leader_id,
                      tuple((m.member_id, m.assignment) for m in g.members.values()))
                for gid, g in self.groups.items()}

    def _notify(self, before: dict) -> None:
        if self.events is None:
            return
        after = self._snapshot()
        for gid in sorted(set(before) | set(after)):
            if before.get(gid) != after.get(gid):
                state = after[gid][0] if gid in after else DEAD
                self.events.emit("group", gid, state=state,
                                 generation=after[gid][1] if gid in after else -1)

    # ------------------------------------------------------------------ JoinGroup
    def join_group(self, request: dict, client_id: str, client_host: str, version: int,
                   answer: Callback) -> None:
        with self.lock:
            before = self._snapshot()
            try:
                self._join_group(request, client_id, client_host, version, answer)
            finally:
                self._notify(before)

    def _join_group(self, request, client_id, client_host, version, answer) -> None:
        error = self._validate_join(request)
        if error is not None:
            return answer(self._join_error(error, request.get("member_id", "")))
        group = self.groups.get(request["group_id"])
        if group is None or group.is_in(DEAD):
            group = self.groups[request["group_id"]] = GroupMetadata(request["group_id"],
                                                                     state_timestamp=self._now())
        protocols = [(p["name"], bytes(p["metadata"])) for p in request["protocols"]]
        if not group.supports(request["protocol_type"], protocols):
            return answer(self._join_error("INCONSISTENT_GROUP_PROTOCOL", request["member_id"]))
        if len(group.members) >= self.config["group.max.size"] and \
                request["member_id"] not in group.members:
            return answer(self._join_error("GROUP_MAX_SIZE_REACHED", request["member_id"]))
        if not request["member_id"]:
            self._join_unknown(group, request, protocols, client_id, client_host, version, answer)
        else:
            self._join_known(group, request, protocols, client_id, client_host, answer)
        self._try_complete_join(group)

    def _validate_join(self, request: dict) -> str | None:
        if not request["group_id"]:
            return "INVALID_GROUP_ID"
        timeout = request["session_timeout_ms"]
        if not (self.config["group.min.session.timeout.ms"] <= timeout
                <= self.config["group.max.session.timeout.ms"]):
            return "INVALID_SESSION_TIMEOUT"
        if not request["protocol_type"] or not request["protocols"]:
            return "INCONSISTENT_GROUP_PROTOCOL"
        return None

    @staticmethod
    def _join_error(name: str, member_id: str) -> dict:
        return {"error_code": E[name], "generation_id": -1, "protocol_name": "", "leader": "",
                "member_id": member_id, "members": []}

    def _join_unknown(self, group, request, protocols, client_id, client_host, version, answer):
        instance_id = request.get("group_instance_id")
        if instance_id is not None:
            member_id = f"{instance_id}-{self.new_uuid()}"
            if instance_id in group.static_members:
                return self._replace_static(group, instance_id, member_id, request, protocols, answer)
        else:
            member_id = f"{client_id}-{self.new_uuid()}"
            if version >= 4:   # KIP-394: answer with the id; the member joins again with it
                group.pending_members[member_id] = self._now() + request["session_timeout_ms"]
                log.info("Dynamic member with unknown member id joins group %s in %s state. Created "
                         "a new member id %s and requested the member to rejoin with it.",
                         group.group_id, group.state, member_id)
                return answer(self._join_error("MEMBER_ID_REQUIRED", member_id))
        member = MemberMetadata(member_id, instance_id, client_id, client_host,
                                self._rebalance_timeout(request), request["session_timeout_ms"],
                                request["protocol_type"], protocols)
        self._add_and_rebalance(group, member, answer)

    @staticmethod
    def _rebalance_timeout(request: dict) -> int:
        timeout = request.get("rebalance_timeout_ms", -1)
        return request["session_timeout_ms"] if timeout is None or timeout < 0 else timeout

    def _add_and_rebalance(self, group: GroupMetadata, member: MemberMetadata, answer) -> None:
        member.awaiting_join = answer
        member.heartbeat_deadline = self._now() + member.session_timeout_ms
        group.add(member)
        reason = f"adding new member {member.member_id} with group instance id {member.group_instance_id}"
        if group.is_in(PREPARING_REBALANCE) and group.initial_join:
            # InitialDelayedJoin: each newcomer buys the group another delay, within the timeout
            limit = group.rebalance_start + max(group.max_rebalance_timeout(),
                                                self.config["group.initial.rebalance.delay.ms"])
            group.join_deadline = min(self._now() + self.config["group.initial.rebalance.delay.ms"],
                                      limit)
        self._maybe_prepare_rebalance(group, reason)

    def _replace_static(self, group, instance_id, member_id, request, protocols, answer) -> None:
        old_id = group.static_members[instance_id]
        old = group.members[old_id]
        if old.awaiting_join is not None:   # the fenced incarnation's held join ends here
            old.awaiting_join(self._join_error("FENCED_INSTANCE_ID", old_id))
            old.awaiting_join = None
        if old.awaiting_sync is not None:
            old.awaiting_sync({"error_code": E["FENCED_INSTANCE_ID"], "assignment": b""})
            old.awaiting_sync = None
        member = group.replace_static(instance_id, member_id)
        member.session_timeout_ms = request["session_timeout_ms"]
        member.rebalance_timeout_ms = self._rebalance_timeout(request)
        member.heartbeat_deadline = self._now() + member.session_timeout_ms
        if group.is_in(STABLE) and member.matches(protocols):
            # same subscription: no rebalance; it gets the current generation (and SyncGroup
            # will hand it the assignment the old incarnation had)
            self.store(group)
            return answer(self._join_response(group, member))
        member.protocols = protocols
        member.awaiting_join = answer
        self._maybe_prepare_rebalance(group, f"static member {instance_id} rejoined as {member_id}")

    def _join_known(self, group, request, protocols, client_id, client_host, answer) -> None:
        member_id = request["member_id"]
        if member_id in group.pending_members:
            member = MemberMetadata(member_id, request.get("group_instance_id"), client_id,
                                    client_host, self._rebalance_timeout(request),
                                    request["session_timeout_ms"], request["protocol_type"], protocols)
            return self._add_and_rebalance(group, member, answer)
        error = self._check_member(group, member_id, request.get("group_instance_id"))
        if error is not None:
            return answer(self._join_error(error, member_id))
        member = group.members[member_id]
        member.heartbeat_deadline = self._now() + member.session_timeout_ms
        if group.is_in(PREPARING_REBALANCE):
            member.protocols, member.awaiting_join = protocols, answer
        elif group.is_in(COMPLETING_REBALANCE, STABLE):
            if member.matches(protocols) and (group.is_in(COMPLETING_REBALANCE)
                                              or member_id != group.leader_id):
                # nothing changed: the member just missed the join answer; send it again
                answer(self._join_response(group, member))
            else:
                member.protocols, member.awaiting_join = protocols, answer
                self._maybe_prepare_rebalance(group, (
                    f"leader {member_id} re-joining group during {group.state}"
                    if member_id == group.leader_id else
                    f"updating metadata for member {member_id} during {group.state}"))

    def _check_member(self, group, member_id: str, instance_id: str | None) -> str | None:
        if instance_id is not None and instance_id in group.static_members \
                and group.static_members[instance_id] != member_id:
            return "FENCED_INSTANCE_ID"
        if member_id not in group.members or group.is_in(EMPTY, DEAD):
            return "UNKNOWN_MEMBER_ID"
        return None

    # ------------------------------------------------------------------ rebalances
    def _maybe_prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        if group.is_in(STABLE, COMPLETING_REBALANCE, EMPTY):
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        now = self._now()
        log.info("Preparing to rebalance group %s in state %s with old generation %d (reason: %s)",
                 group.group_id, group.state, group.generation_id, reason)
        if group.is_in(COMPLETING_REBALANCE):   # the assignment being synced is void now
            for member in group.members.values():
                member.assignment = b""
                if member.awaiting_sync is not None:
                    member.awaiting_sync({"error_code": E["REBALANCE_IN_PROGRESS"], "assignment": b""})
                    member.awaiting_sync = None
        group.initial_join = group.is_in(EMPTY)
        group.rebalance_start = now
        group.sync_deadline = None
        if group.initial_join:
            group.join_deadline = now + self.config["group.initial.rebalance.delay.ms"]
        else:
            group.join_deadline = now + group.max_rebalance_timeout()
        group.transition_to(PREPARING_REBALANCE, now)

    def _try_complete_join(self, group: GroupMetadata) -> None:
        """Complete the join phase when everyone is in (not during the initial delay) or time is up."""
        if not group.is_in(PREPARING_REBALANCE):
            return
        now = self._now()
        if now >= group.join_deadline or (group.all_joined() and not group.initial_join):
            self._complete_join(group)

    def _complete_join(self, group: GroupMetadata) -> None:
        now = self._now()
        late = [m.member_id for m in group.members.values() if m.awaiting_join is None]
        for member_id in late:
            group.remove(member_id)                 # did not rejoin in time
        if late:
            log.info("Group %s removed members who did not rejoin in time: %s",
                     group.group_id, ", ".join(late))
        group.pending_members.clear()
        group.generation_id += 1
        group.join_deadline = None
        if not group.members:
            group.protocol_name, group.leader_id = None, None
            group.transition_to(EMPTY, now)
            self.store(group)
            log.info("Group %s with generation %d is now empty", group.group_id, group.generation_id)
            return
        group.protocol_name = group.select_protocol()
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.transition_to(COMPLETING_REBALANCE, now)
        group.sync_deadline = now + group.max_rebalance_timeout()
        log.info("Stabilized group %s generation %d with %d members",
                 group.group_id, group.generation_id, len(group.members))
        for member in group.members.values():
            answer, member.awaiting_join = member.awaiting_join, None
            member.heartbeat_deadline = now + member.session_timeout_ms
            answer(self._join_response(group, member))

    def _join_response(self, group: GroupMetadata, member: MemberMetadata) -> dict:
        is_leader = member.member_id == group.leader_id
        members = [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                    "metadata": m.metadata(group.protocol_name)}
                   for m in group.members.values()] if is_leader else []
        return {"error_code": 0, "generation_id": group.generation_id,
                "protocol_name": group.protocol_name or "", "leader": group.leader_id or "",
                "member_id": member.member_id, "members": members}

    # ------------------------------------------------------------------ SyncGroup
    def sync_group(self, request: dict, answer: Callback) -> None:
        with self.lock:
            before = self._snapshot()
            try:
                self._sync_group(request, answer)
            finally:
                self._notify(before)

    def _sync_group(self, request: dict, answer: Callback) -> None:
        group = self.groups.get(request["group_id"])
        error = self._check_generation(group, request)
        if error is None and group.is_in(PREPARING_REBALANCE):
            error = "REBALANCE_IN_PROGRESS"
        if error is not None:
            return answer({"error_code": E[error], "assignment": b""})
        member = group.members[request["member_id"]]
        if group.is_in(STABLE):
            return answer({"error_code": 0, "assignment": member.assignment})
        member.awaiting_sync = answer
        member.heartbeat_deadline = self._now() + member.session_timeout_ms
        if member.member_id == group.leader_id:
            log.info("Assignment received from leader %s for group %s for generation %d. The group "
                     "has %d members, %d of which are static.", member.member_id, group.group_id,
                     group.generation_id, len(group.members), len(group.static_members))
            assignments = {a["member_id"]: bytes(a["assignment"]) for a in request["assignments"]}
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            self._complete_sync(group)

    def _complete_sync(self, group: GroupMetadata) -> None:
        self.store(group)
        group.sync_deadline = None
        group.transition_to(STABLE, self._now())
        for member in group.members.values():
            if member.awaiting_sync is not None:
                answer, member.awaiting_sync = member.awaiting_sync, None
                answer({"error_code": 0, "assignment": member.assignment})

    def _check_generation(self, group, request: dict) -> str | None:
        """UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID / ILLEGAL_GENERATION, in Kafka's order."""
        if group is None or group.is_in(DEAD):
            return "UNKNOWN_MEMBER_ID" if group is None else "COORDINATOR_NOT_AVAILABLE"
        error = self._check_member(group, request["member_id"], request.get("group_instance_id"))
        if error is not None:
            return error
        if request["generation_id"] != group.generation_id:
            return "ILLEGAL_GENERATION"
        return None

    # ------------------------------------------------------------------ Heartbeat
    def heartbeat(self, request: dict) -> dict:
        with self.lock:
            group = self.groups.get(request["group_id"])
            error = self._check_generation(group, request)
            if error is None:
                member = group.members[request["member_id"]]
                member.heartbeat_deadline = self._now() + member.session_timeout_ms
                if group.is_in(PREPARING_REBALANCE):
                    error = "REBALANCE_IN_PROGRESS"   # the signal to rejoin
            return {"error_code": E[error] if error else 0}

    # ------------------------------------------------------------------ LeaveGroup
    def leave_group(self, group_id: str, members: list[dict]) -> list[dict]:
        """Each {"member_id", "group_instance_id"} leaves; returns one answer per member."""
        with self.lock:
            before = self._snapshot()
            try:
                return self._leave_group(group_id, members)
            finally:
                self._notify(before)

    def _leave_group(self, group_id: str, members: list[dict]) -> list[dict]:
        group = self.groups.get(group_id)
        results = []
        for identity in members:
            member_id, instance_id = identity["member_id"], identity.get("group_instance_id")
            error = None
            if group is None or group.is_in(DEAD):
                error = "UNKNOWN_MEMBER_ID"
            elif instance_id is not None:
                current = group.static_members.get(instance_id)
                if current is None:
                    error = "UNKNOWN_MEMBER_ID"
                elif member_id and member_id != current:
                    error = "FENCED_INSTANCE_ID"
                else:
                    member_id = current
            elif member_id not in group.members:
                error = "UNKNOWN_MEMBER_ID" if member_id not in group.pending_members else None
            if error is None and group is not None:
                group.pending_members.pop(member_id, None)
                if member_id in group.members:
                    log.info("Member %s has left group %s through explicit LeaveGroup",
                             member_id, group.group_id)
                    self._remove_member(group, member_id, f"removing member {member_id} on LeaveGroup")
            results.append({"member_id": member_id, "group_instance_id": instance_id,
                            "error_code": E[error] if error else 0})
        return results

    def _remove_member(self, group: GroupMetadata, member_id: str, reason: str) -> None:
        member = group.remove(member_id)
        if member is not None and member.awaiting_join is not None:
            member.awaiting_join(self._join_error("UNKNOWN_MEMBER_ID", member_id))
        if member is not None and member.awaiting_sync is not None:
            member.awaiting_sync({"error_code": E["UNKNOWN_MEMBER_ID"], "assignment": b""})
        if group.is_in(STABLE, COMPLETING_REBALANCE):
            self._prepare_rebalance(group, reason)
        self._try_complete_join(group)   # e.g. the last member left: the group is Empty now

    # ------------------------------------------------------------------ timers
    def tick(self) -> None:
        """Expire sessions and finish rebalances whose time is up (the purgatories' timers)."""
        with self.lock:
            before = self._snapshot()
            try:
                self._tick()
            finally:
                self._notify(before)

    def _tick(self) -> None:
        now = self._now()
        for group in list(self.groups.values()):
            for member_id, deadline in list(group.pending_members.items()):
                if now >= deadline:
                    del group.pending_members[member_id]
            for member in list(group.members.values()):
                waiting = member.awaiting_join is not None or member.awaiting_sync is not None
                if not waiting and now >= member.heartbeat_deadline:   # session expired
                    log.info("Member %s in group %s has failed, removing it from the group",
                             member.member_id, group.group_id)
                    self._remove_member(group, member.member_id,
                                        f"removing member {member.member_id} on heartbeat expiration")
            if group.is_in(COMPLETING_REBALANCE) and group.sync_deadline is not None \
                    and now >= group.sync_deadline:
                # the leader never sent the assignment: drop who did not sync, start over
                late = [m.member_id for m in group.members.values() if m.awaiting_sync is None]
                for member_id in late:
                    group.remove(member_id)
                self._prepare_rebalance(group, "members did not send SyncGroup before the "
                                               f"rebalance timeout: {', '.join(late)}")
            self._try_complete_join(group)

    def next_deadline(self) -> int | None:
        """The earliest clock time at which `tick()` has something to do (for the course)."""
        times = []
        for group in self.groups.values():
            times += list(group.pending_members.values())
            times += [m.heartbeat_deadline for m in group.members.values()
                      if m.awaiting_join is None and m.awaiting_sync is None]
            times += [t for t in (group.join_deadline, group.sync_deadline) if t is not None]
        return min(times, default=None)

    # ------------------------------------------------------------------ commits, admin
    def validate_commit(self, group_id: str, generation_id: int, member_id: str,
                        instance_id: str | None = None) -> str | None:
        """Kafka's doCommitOffsets checks: None when the commit may go ahead, else the error."""
        with self.lock:
            group = self.groups.get(group_id)
            if group is None:
                return None if generation_id < 0 else "ILLEGAL_GENERATION"
            if group.is_in(DEAD):
                return "COORDINATOR_NOT_AVAILABLE"
            if generation_id < 0 and group.is_in(EMPTY):
                return None   # an admin / assign() commit to a group with no members
            if instance_id is not None and group.static_members.get(instance_id, member_id) != member_id:
                return "FENCED_INSTANCE_ID"
            if member_id not in group.members:
                return "UNKNOWN_MEMBER_ID"
            if generation_id != group.generation_id:
                return "ILLEGAL_GENERATION"
            if group.is_in(COMPLETING_REBALANCE):
                return "REBALANCE_IN_PROGRESS"
            member = group.members[member_id]
            member.heartbeat_deadline = max(member.heartbeat_deadline,
                                            self._now() + member.session_timeout_ms)
            return None

    def state_of(self, group_id: str) -> str:
        group = self.groups.get(group_id)
        return group.state if group is not None else EMPTY

    def delete(self, group_id: str) -> str | None:
        """Mark a group Dead (DeleteGroups); NON_EMPTY_GROUP while it has members."""
        with self.lock:
            group = self.groups.get(group_id)
            if group is not None and not group.is_in(EMPTY, DEAD):
                return "NON_EMPTY_GROUP"
            if group is not None:
                group.transition_to(DEAD, self._now())
                del self.groups[group_id]
            return None

    def load(self, group: GroupMetadata) -> None:
        """A group read back from `__consumer_offsets`: its members get a fresh session."""
        now = self._now()
        for member in group.members.values():
            member.heartbeat_deadline = now + member.session_timeout_ms
        self.groups[group.group_id] = group

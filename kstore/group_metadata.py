"""One consumer group's membership state: Kafka's classic `GroupMetadata` / `MemberMetadata`.

Mirrors `kafka.coordinator.group.GroupMetadata` (today `ClassicGroup`) and `MemberMetadata`:
* a group is in one of five states, and only these moves are legal (`VALID_PREVIOUS`):
  Empty -> PreparingRebalance -> CompletingRebalance -> Stable, back to PreparingRebalance when
  a member joins, leaves or times out, and Dead once the group is deleted;
* every completed rebalance starts a new *generation* (`generation_id` + 1); the first member to
  join a generation's rebalance is its *leader*, and only the leader receives the other members'
  subscriptions, computes the assignment client-side and hands it back in SyncGroup;
* the protocol (assignor) is the one every member supports, chosen by vote: each member votes for
  the first of its own protocols that all support (`selectProtocol`).
The broker never reads the subscriptions or assignments: they are opaque bytes it relays, which
is why range, roundrobin and cooperative-sticky all work unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

EMPTY, PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE, DEAD = (
    "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead")

# GroupState's validPreviousStates: the state a group must be in to move to the key.
VALID_PREVIOUS: dict[str, set[str]] = {
    EMPTY: {PREPARING_REBALANCE},
    PREPARING_REBALANCE: {STABLE, COMPLETING_REBALANCE, EMPTY},
    COMPLETING_REBALANCE: {PREPARING_REBALANCE},
    STABLE: {COMPLETING_REBALANCE},
    DEAD: {STABLE, PREPARING_REBALANCE, COMPLETING_REBALANCE, EMPTY, DEAD},
}


class IllegalStateTransition(Exception):
    """A move VALID_PREVIOUS does not allow: a bug in the coordinator, never a client's fault."""


@dataclass
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]          # (assignor name, subscription bytes), by preference
    assignment: bytes = b""
    heartbeat_deadline: int = 0                 # clock ms after which the session has expired
    awaiting_join: Callable | None = None       # the held JoinGroup answer
    awaiting_sync: Callable | None = None       # the held SyncGroup answer

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        raise KeyError(f"member {self.member_id} does not support protocol {protocol}")

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return list(self.protocols) == list(protocols)

    def vote(self, candidates: set[str]) -> str:
        """The first of this member's protocols that every member supports."""
        return next(name for name in self.protocol_names() if name in candidates)


@dataclass
class GroupMetadata:
    group_id: str
    state: str = EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    state_timestamp: int = -1
    members: dict[str, MemberMetadata] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)   # instance id -> member id
    pending_members: dict[str, int] = field(default_factory=dict)  # member id -> expiry (ms)
    join_deadline: int | None = None        # when the PreparingRebalance phase gives up waiting
    initial_join: bool = False              # the phase began from Empty (initial delay applies)
    rebalance_start: int = 0
    sync_deadline: int | None = None        # when CompletingRebalance gives up on SyncGroup

    # ---- state
    def transition_to(self, state: str, now: int) -> None:
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalStateTransition(
                f"group {self.group_id} cannot move from {self.state} to {state}")
        self.state = state
        self.state_timestamp = now

    def is_in(self, *states: str) -> bool:
        return self.state in states

    # ---- members
    def add(self, member: MemberMetadata) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        if member.is_static:
            self.static_members[member.group_instance_id] = member.member_id
        self.pending_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> MemberMetadata | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if member.is_static and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        if self.leader_id == member_id:
            # the next leader: a member still waiting to join, else any member
            waiting = [m for m in self.members.values() if m.awaiting_join is not None]
            self.leader_id = (waiting or list(self.members.values()) or [None])[0]
            self.leader_id = self.leader_id.member_id if self.leader_id else None
        return member

    def replace_static(self, instance_id: str, new_member_id: str) -> MemberMetadata:
        """A static member restarted: its old member id is fenced, its assignment kept."""
        old_id = self.static_members[instance_id]
        member = self.members.pop(old_id)
        member.member_id = new_member_id
        self.members[new_member_id] = member
        self.static_members[instance_id] = new_member_id
        if self.leader_id == old_id:
            self.leader_id = new_member_id
        return member

    def all_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join is not None
                                                for m in self.members.values())

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Can a member with these protocols join? (Same type, and one protocol in common.)"""
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        names = {name for name, _ in protocols}
        return protocol_type == self.protocol_type and bool(names & self.candidate_protocols())

    def candidate_protocols(self) -> set[str]:
        sets = [set(m.protocol_names()) for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """Kafka's selectProtocol: each member votes; most votes wins (ties: first counted)."""
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = member.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: votes[name])

    def max_rebalance_timeout(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def subscribed_topics(self) -> set[str] | None:
        """The topics the members subscribe to (consumer protocol only; None if unknown)."""
        if self.protocol_type != "consumer" or self.protocol_name is None:
            return None
        from .consumer_protocol import decode_subscription
        topics: set[str] = set()
        for member in self.members.values():
            try:
                topics.update(decode_subscription(member.metadata(self.protocol_name)).topics)
            except (KeyError, ValueError):
                return None
        return topics


# ---- what DescribeGroups shows (and the consumer-groups tool prints)
@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: list[tuple[str, int]]


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    coordinator: int
    members: list[MemberDescription]


def _assigned(data: bytes, consumer: bool) -> list[tuple[str, int]]:
    from .consumer_protocol import decode_assignment
    if not consumer or not data:
        return []
    try:
        return decode_assignment(data).partitions
    except ValueError:
        return []


def describe_group(group: GroupMetadata | None, group_id: str, state: str,
                   coordinator: int) -> GroupDescription:
    """A group as DescribeGroups shows it (assignments only once the group is Stable)."""
    if group is None:
        return GroupDescription(group_id, state, "", "", coordinator, [])
    stable = group.state == STABLE
    consumer = group.protocol_type == "consumer"
    return GroupDescription(group_id, state, group.protocol_type or "",
                            (group.protocol_name or "") if stable else "", coordinator,
                            [MemberDescription(m.member_id, m.group_instance_id, m.client_id,
                                               m.client_host,
                                               _assigned(m.assignment, consumer) if stable else [])
                             for m in group.members.values()])


def describe_described_group(entry: dict, coordinator: int) -> GroupDescription:
    """The same from a DescribeGroups response entry (the network tools)."""
    consumer = entry["protocol_type"] == "consumer"
    return GroupDescription(entry["group_id"], entry["group_state"], entry["protocol_type"],
                            entry["protocol_data"], coordinator,
                            [MemberDescription(m["member_id"], m["group_instance_id"], m["client_id"],
                                               m["client_host"],
                                               _assigned(m["member_assignment"], consumer))
                             for m in entry["members"]])

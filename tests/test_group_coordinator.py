"""The classic group coordinator's rules, stepped with a manual clock (issue 14), and the same
rules on the wire with kstore's codec on raw sockets.

The engine: the state machine (Empty -> PreparingRebalance -> CompletingRebalance -> Stable),
the initial rebalance delay, held JoinGroup/SyncGroup answers, heartbeats answering
REBALANCE_IN_PROGRESS / ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID, session expiry, MEMBER_ID_REQUIRED,
static member replacement (FENCED_INSTANCE_ID), commit checks, GroupMetadata records reloaded
after a restart and decoded by dump-log, and a property test against a small model.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kstore import ManualClock, protocol as P
from kstore.broker import Broker
from kstore.errors import KStoreError
from kstore.consumer_protocol import decode_assignment, encode_assignment, encode_subscription
from kstore.coordinator_records import GroupMetadataKey, decode_group_metadata_value, decode_key
from kstore.group_membership import GroupMembership
from kstore.server import KafkaServer
from test_clients import Conn

E = P.ERRORS
API = P.API_KEYS
T0 = 1_700_000_000_000
CONFIG = {"group.min.session.timeout.ms": 6000, "group.max.session.timeout.ms": 1800000,
          "group.initial.rebalance.delay.ms": 3000, "group.max.size": 10}


class Member:
    """One client's view: sends requests to the membership, keeps the last answers."""

    def __init__(self, gm: GroupMembership, client_id: str, instance_id: str | None = None,
                 topics=("t",), session_ms: int = 10000, version: int = 3):
        self.gm, self.client_id, self.instance_id = gm, client_id, instance_id
        self.topics, self.session_ms, self.version = list(topics), session_ms, version
        self.member_id, self.generation = "", -1
        self.join_answer = self.sync_answer = None

    def join(self):
        self.join_answer = None

        def got(response):
            self.join_answer = response
            if response["error_code"] in (0, E["MEMBER_ID_REQUIRED"]):
                self.member_id = response["member_id"]
                self.generation = response["generation_id"]
        self.gm.join_group({"group_id": "g", "session_timeout_ms": self.session_ms,
                            "rebalance_timeout_ms": 20000, "member_id": self.member_id,
                            "group_instance_id": self.instance_id, "protocol_type": "consumer",
                            "protocols": [{"name": "range",
                                           "metadata": encode_subscription(self.topics)}]},
                           self.client_id, "/127.0.0.1", self.version, got)
        return self.join_answer

    def sync(self, assignments=None):
        self.sync_answer = None
        self.gm.sync_group({"group_id": "g", "generation_id": self.generation,
                            "member_id": self.member_id, "group_instance_id": self.instance_id,
                            "assignments": [{"member_id": m, "assignment": encode_assignment(a)}
                                            for m, a in (assignments or {}).items()]},
                           lambda r: setattr(self, "sync_answer", r))
        return self.sync_answer

    def heartbeat(self, generation=None, member_id=None) -> int:
        return self.gm.heartbeat({"group_id": "g", "member_id": member_id or self.member_id,
                                  "generation_id": self.generation if generation is None else generation,
                                  "group_instance_id": self.instance_id})["error_code"]


@pytest.fixture
def gm(clock) -> GroupMembership:
    counter = iter(range(1000))
    return GroupMembership(clock, CONFIG, new_uuid=lambda: f"u{next(counter)}")


def stable_pair(gm, clock):
    """Two members through the initial delay to a stable generation 1: m1 leads."""
    m1, m2 = Member(gm, "c1"), Member(gm, "c2")
    assert m1.join() is None and m2.join() is None        # held during the initial delay
    clock.advance(3000)
    gm.tick()
    assert m1.join_answer["leader"] == m1.member_id and len(m1.join_answer["members"]) == 2
    assert m2.join_answer["members"] == []                 # only the leader sees subscriptions
    assert m2.sync() is None                               # held until the leader syncs
    m1.sync({m1.member_id: [("t", 0), ("t", 1)], m2.member_id: [("t", 2), ("t", 3)]})
    assert decode_assignment(m2.sync_answer["assignment"]).partitions == [("t", 2), ("t", 3)]
    return m1, m2


def test_initial_delay_then_generation_one(gm, clock):
    m1 = Member(gm, "c1")
    m1.join()
    assert gm.group("g").state == "PreparingRebalance" and m1.join_answer is None
    clock.advance(2000)
    m2 = Member(gm, "c2")
    m2.join()                          # a newcomer extends the delay by another 3 s
    clock.advance(1500)
    gm.tick()
    assert m1.join_answer is None
    clock.advance(1500)
    gm.tick()
    assert gm.group("g").state == "CompletingRebalance"
    assert m1.generation == m2.generation == 1
    assert m1.join_answer["protocol_name"] == "range"


def test_rebalance_heartbeats_and_generation_checks(gm, clock):
    m1, m2 = stable_pair(gm, clock)
    group = gm.group("g")
    assert group.state == "Stable" and m1.heartbeat() == 0
    m3 = Member(gm, "c3")
    m3.join()
    assert group.state == "PreparingRebalance"
    assert m1.heartbeat() == m2.heartbeat() == E["REBALANCE_IN_PROGRESS"]
    assert m1.sync() and m1.sync_answer["error_code"] == E["REBALANCE_IN_PROGRESS"]
    m1.join()
    assert m1.join_answer is None      # held: m2 has not rejoined yet
    m2.join()                          # the last one: completes at once (no initial delay now)
    assert group.state == "CompletingRebalance" and m3.generation == 2
    assert m1.heartbeat(generation=1) == E["ILLEGAL_GENERATION"]
    assert m1.heartbeat(member_id="nobody") == E["UNKNOWN_MEMBER_ID"]
    assert gm.validate_commit("g", 2, m2.member_id) == "REBALANCE_IN_PROGRESS"
    m1.sync({m1.member_id: [("t", 0)], m2.member_id: [("t", 1)], m3.member_id: [("t", 2), ("t", 3)]})
    assert gm.validate_commit("g", 1, m2.member_id) == "ILLEGAL_GENERATION"
    assert gm.validate_commit("g", 2, "ghost") == "UNKNOWN_MEMBER_ID"
    assert gm.validate_commit("g", -1, "") == "UNKNOWN_MEMBER_ID"   # members: no admin commits
    assert gm.validate_commit("g", 2, m2.member_id) is None
    assert gm.validate_commit("other", -1, "") is None               # a group nobody joined


def test_session_expiry_and_leave(gm, clock):
    m1, m2 = stable_pair(gm, clock)
    clock.advance(9000)
    assert m1.heartbeat() == 0        # m1 keeps its session, m2 goes quiet
    clock.advance(1500)
    gm.tick()
    group = gm.group("g")
    assert m2.member_id not in group.members and group.state == "PreparingRebalance"
    m1.join()
    assert group.generation_id == 2 and group.state == "CompletingRebalance"
    assert m1.join_answer["leader"] == m1.member_id
    m1.sync({m1.member_id: [("t", p) for p in range(4)]})
    assert gm.leave_group("g", [{"member_id": m1.member_id}])[0]["error_code"] == 0
    assert group.state == "Empty" and group.generation_id == 3
    assert gm.leave_group("g", [{"member_id": m1.member_id}])[0]["error_code"] == E["UNKNOWN_MEMBER_ID"]
    assert gm.validate_commit("g", -1, "") is None                   # empty again: allowed


def test_the_broker_log_tells_each_rebalance_with_its_reason(gm, clock, caplog):
    """What an operator reads in the broker's log (as in Kafka's server.log): why each rebalance
    started, the generation it stabilized at, and how each member went."""
    caplog.set_level("INFO", logger="kstore.group_membership")
    m1, m2 = stable_pair(gm, clock)
    m1.heartbeat()
    clock.advance(10_500)          # m2 goes quiet past its 10 s session; m1 is still waiting
    m1.heartbeat()
    gm.tick()
    m1.join()
    gm.leave_group("g", [{"member_id": m1.member_id}])
    lines = [r.getMessage() for r in caplog.records if r.name == "kstore.group_membership"]
    assert lines == [
        "Preparing to rebalance group g in state Empty with old generation 0 "
        "(reason: adding new member c1-u0 with group instance id None)",
        "Stabilized group g generation 1 with 2 members",
        "Assignment received from leader c1-u0 for group g for generation 1. "
        "The group has 2 members, 0 of which are static.",
        "Member c2-u1 in group g has failed, removing it from the group",
        "Preparing to rebalance group g in state Stable with old generation 1 "
        "(reason: removing member c2-u1 on heartbeat expiration)",
        "Stabilized group g generation 2 with 1 members",
        "Member c1-u0 has left group g through explicit LeaveGroup",
        "Preparing to rebalance group g in state CompletingRebalance with old generation 2 "
        "(reason: removing member c1-u0 on LeaveGroup)",
        "Group g with generation 3 is now empty"]


def test_member_id_required_from_join_group_v4(gm, clock):
    m = Member(gm, "c1", version=4)
    assert m.join()["error_code"] == E["MEMBER_ID_REQUIRED"]
    assert m.member_id.startswith("c1-") and gm.group("g").state == "Empty"
    m.join()
    clock.advance(3000)
    gm.tick()
    assert m.join_answer["error_code"] == 0 and m.join_answer["member_id"] == m.member_id


def test_static_member_replacement_keeps_assignment_and_fences_old_id(gm, clock):
    s1, s2 = Member(gm, "c1", instance_id="host-a"), Member(gm, "c2", instance_id="host-b")
    s1.join(), s2.join()
    clock.advance(3000)
    gm.tick()
    leader, other = (s1, s2) if s1.join_answer["leader"] == s1.member_id else (s2, s1)
    other.sync()
    leader.sync({s1.member_id: [("t", 0), ("t", 1)], s2.member_id: [("t", 2), ("t", 3)]})
    old_id = s2.member_id
    restarted = Member(gm, "c2", instance_id="host-b")       # same instance, new process
    restarted.join()
    group = gm.group("g")
    assert restarted.join_answer["error_code"] == 0 and restarted.member_id != old_id
    assert group.state == "Stable" and group.generation_id == 1     # no rebalance
    assert decode_assignment(restarted.sync()["assignment"]).partitions == [("t", 2), ("t", 3)]
    assert s2.heartbeat() == E["FENCED_INSTANCE_ID"]
    assert gm.validate_commit("g", 1, old_id, "host-b") == "FENCED_INSTANCE_ID"
    assert gm.leave_group("g", [{"member_id": old_id, "group_instance_id": "host-b"}])[0][
        "error_code"] == E["FENCED_INSTANCE_ID"]


def test_invalid_joins(gm):
    bad = Member(gm, "c1", session_ms=1000)
    bad.join()
    assert bad.join_answer["error_code"] == E["INVALID_SESSION_TIMEOUT"]
    m = Member(gm, "c2")
    m.join()
    odd = Member(gm, "c3")
    odd.gm.join_group({"group_id": "g", "session_timeout_ms": 10000, "member_id": "",
                       "protocol_type": "connect", "protocols": [{"name": "x", "metadata": b""}]},
                      "c3", "/h", 3, lambda r: setattr(odd, "join_answer", r))
    assert odd.join_answer["error_code"] == E["INCONSISTENT_GROUP_PROTOCOL"]


# ---- restart: the group is read back from __consumer_offsets
def test_restart_reloads_groups_and_dump_log_decodes_them(tmp_path, clock):
    log_dir = str(tmp_path / "logs")
    with Broker(log_dir, clock=clock, config={"group.initial.rebalance.delay.ms": 0}) as broker:
        broker.create_topic("t", 4)
        gm = broker.group_coordinator.membership
        m1, m2 = Member(gm, "c1", instance_id="i-1"), Member(gm, "c2")
        m1.join()
        gm.tick()
        m2.join()
        m1.join()
        m1.sync({m1.member_id: [("t", 0), ("t", 1)], m2.member_id: [("t", 2), ("t", 3)]})
        broker.group_coordinator.commit_offsets("g", {("t", 0): 5}, generation_id=m2.generation,
                                                member_id=m2.member_id)
        partition = broker.group_coordinator.partition_for("g")
    with Broker(log_dir, clock=clock) as broker:
        group = broker.group_coordinator.membership.group("g")
        assert group.state == "Stable" and group.generation_id == 2
        assert group.leader_id == m1.member_id and group.protocol_name == "range"
        assert group.static_members == {"i-1": m1.member_id}
        assert decode_assignment(group.members[m2.member_id].assignment).partitions == [("t", 2), ("t", 3)]
        assert broker.group_coordinator.fetch_offsets("g")[("t", 0)].offset == 5
        log = broker.get_log("__consumer_offsets", partition)
        values = [decode_group_metadata_value(r.value) for r in log.records()
                  if isinstance(decode_key(r.key), GroupMetadataKey)]
        assert [v.generation for v in values][-1] == 2 and len(values[-1].members) == 2
        # members carry on with their generation; one that does not come back is dropped once
        # its (restored) session runs out
        clock.advance(5000)
        m1.gm = broker.group_coordinator.membership
        assert m1.heartbeat() == 0
        clock.advance(5001)
        m1.gm.tick()
        assert group.state == "PreparingRebalance" and list(group.members) == [m1.member_id]
    seg = sorted((tmp_path / "logs" / f"__consumer_offsets-{partition}").glob("*.log"))[0]
    out = subprocess.run([sys.executable, "-m", "kstore", "dump-log", "--files", str(seg),
                          "--offsets-decoder"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 'key:{"type":"2","data":{"group":"g"}}' in out.stdout.replace(" ", "")
    assert '"protocolType":"consumer"' in out.stdout.replace(" ", "")


# ---- the wire: held JoinGroup does not block other connections; commit checks
def test_wire_join_is_held_without_blocking_and_commits_are_checked(tmp_path):
    broker = Broker(str(tmp_path / "logs"), config={"group.initial.rebalance.delay.ms": 1500})
    server = KafkaServer(broker, "127.0.0.1", 0).start_in_thread()
    try:
        broker.create_topic("t", 2)
        join = {"group_id": "wg", "session_timeout_ms": 10000, "rebalance_timeout_ms": 10000,
                "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": encode_subscription(["t"])}]}
        with Conn(server.port) as a, Conn(server.port) as b:
            first = a.call(API["JoinGroup"], 5, join)
            assert first["error_code"] == E["MEMBER_ID_REQUIRED"]
            cid = a.send(API["JoinGroup"], 5, {**join, "member_id": first["member_id"]})
            # while a's JoinGroup is held (1.5 s initial delay), b is answered at once
            assert b.call(API["ApiVersions"], 2, {})["error_code"] == 0
            described = b.call(API["DescribeGroups"], 4, {"groups": ["wg"]})["groups"][0]
            assert described["group_state"] == "PreparingRebalance"
            joined = a.recv(API["JoinGroup"], 5, cid)
            assert joined["error_code"] == 0 and joined["generation_id"] == 1
            member = joined["member_id"]
            sync = a.call(API["SyncGroup"], 3, {
                "group_id": "wg", "generation_id": 1, "member_id": member,
                "assignments": [{"member_id": member, "assignment": encode_assignment([("t", 0), ("t", 1)])}]})
            assert decode_assignment(sync["assignment"]).partitions == [("t", 0), ("t", 1)]

            def commit(generation, member_id):
                r = a.call(API["OffsetCommit"], 7, {
                    "group_id": "wg", "generation_id_or_member_epoch": generation, "member_id": member_id,
                    "topics": [{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 3,
                                                            "committed_metadata": ""}]}]})
                return r["topics"][0]["partitions"][0]["error_code"]
            assert commit(0, member) == E["ILLEGAL_GENERATION"]
            assert commit(1, "someone") == E["UNKNOWN_MEMBER_ID"]
            assert commit(-1, "") == E["UNKNOWN_MEMBER_ID"]
            assert commit(1, member) == 0
            assert a.call(API["Heartbeat"], 3, {"group_id": "wg", "generation_id": 1,
                                                "member_id": member})["error_code"] == 0
            assert a.call(API["DeleteGroups"], 1, {"groups_names": ["wg"]})["results"][0][
                "error_code"] == E["NON_EMPTY_GROUP"]
            left = a.call(API["LeaveGroup"], 3, {"group_id": "wg", "members": [
                {"member_id": member, "group_instance_id": None}]})
            assert left["members"][0]["error_code"] == 0
            listed = a.call(API["ListGroups"], 2, {})["groups"]
            assert {"group_id": "wg", "protocol_type": "consumer"} in listed
            deleted = a.call(API["OffsetDelete"], 0, {"group_id": "wg", "topics": [
                {"name": "t", "partitions": [{"partition_index": 0}]}]})
            assert deleted["error_code"] == 0 and deleted["topics"][0]["partitions"][0]["error_code"] == 0
            assert a.call(API["DeleteGroups"], 1, {"groups_names": ["wg"]})["results"][0]["error_code"] == 0
            assert a.call(API["DeleteGroups"], 1, {"groups_names": ["wg"]})["results"][0][
                "error_code"] == E["GROUP_ID_NOT_FOUND"]
    finally:
        server.stop()
        broker.shutdown()


# ---- a property test: random operations against a small model of the rules
OPS = st.lists(st.tuples(st.sampled_from(["join", "sync", "heartbeat", "leave", "wait"]),
                         st.integers(0, 2)), max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_state_machine_against_model(ops):
    """Whatever clients do: only legal state moves; the generation never goes back; a Stable
    group's members all answered the current generation's join; every held answer is answered
    by the time the group is Stable or Empty; heartbeat errors are the model's."""
    clock = ManualClock(T0)
    counter = iter(range(10_000))
    gm = GroupMembership(clock, CONFIG, new_uuid=lambda: f"u{next(counter)}")
    members = [Member(gm, f"c{i}") for i in range(3)]
    last_generation = 0   # (an illegal state move would raise IllegalStateTransition)
    for op, i in ops:
        m = members[i]
        if op == "join":
            m.join()
        elif op == "sync":
            group = gm.group("g")
            leader = group is not None and group.leader_id == m.member_id
            m.sync({x.member_id: [("t", k)] for k, x in enumerate(members)} if leader else None)
        elif op == "heartbeat":
            code = m.heartbeat()
            group = gm.group("g")
            if group is None or m.member_id not in group.members:
                assert code == E["UNKNOWN_MEMBER_ID"]
            elif m.generation != group.generation_id:
                assert code == E["ILLEGAL_GENERATION"]
            else:
                assert code == (E["REBALANCE_IN_PROGRESS"] if group.state == "PreparingRebalance" else 0)
        elif op == "leave":
            gm.leave_group("g", [{"member_id": m.member_id}])
        else:
            clock.advance(4000)
            gm.tick()
        group = gm.group("g")
        if group is None:
            continue
        assert group.generation_id >= last_generation
        last_generation = group.generation_id
        if group.state in ("Stable", "Empty"):
            assert all(x.awaiting_join is None and x.awaiting_sync is None
                       for x in group.members.values())
        if group.state == "Stable":
            assert group.leader_id in group.members
        if group.state == "Empty":
            assert not group.members


def test_a_newly_elected_coordinator_reloads_the_group(tmp_path, clock):
    """In a 3-broker cluster the group lives on the leader of its __consumer_offsets partition;
    that broker crashes, another is elected, and its coordinator knows the group — generation,
    leader, members and their assignments — from the replicated GroupMetadata record."""
    from kstore.cluster import Cluster
    from kstore.coordinator_records import partition_for
    with Cluster(str(tmp_path / "cluster"), 3, clock=clock,
                 broker_config={"group.initial.rebalance.delay.ms": 0}) as cluster:
        cluster.create_topic("t", 2, 3)
        first = cluster.brokers[0].group_coordinator       # creates __consumer_offsets
        p = partition_for("g", first.num_partitions)
        old = cluster.brokers[cluster.leader("__consumer_offsets", p)]
        gm = old.group_coordinator.membership
        a, b = Member(gm, "c1"), Member(gm, "c2")
        a.join()
        gm.tick()
        b.join()
        a.join()
        a.sync({a.member_id: [("t", 0)], b.member_id: [("t", 1)]})
        cluster.replicate(rounds=3)
        cluster.crash(old.broker_id)
        new = cluster.brokers[cluster.leader("__consumer_offsets", p)]
        assert new is not old
        state = new.group_coordinator.group_state("g")     # first use: replays the partition
        group = new.group_coordinator.membership.group("g")
        assert state == "Stable" and group.generation_id == 2 and group.leader_id == a.member_id
        assert decode_assignment(group.members[b.member_id].assignment).partitions == [("t", 1)]
        b.gm = new.group_coordinator.membership           # b carries on at the new coordinator
        assert b.heartbeat() == 0


def test_offsets_of_a_group_with_members_do_not_expire_and_an_emptied_group_counts_from_then(tmp_path, clock):
    with Broker(str(tmp_path / "logs"), clock=clock, config={"group.initial.rebalance.delay.ms": 0}) as broker:
        broker.create_topic("t", 1)
        coordinator = broker.group_coordinator
        retention_ms = coordinator.config.offsets_retention_minutes * 60_000
        gm = coordinator.membership
        m = Member(gm, "c1")
        m.join()
        gm.tick()
        m.sync({m.member_id: [("t", 0)]})
        with pytest.raises(KStoreError, match="UNKNOWN_MEMBER_ID"):   # not a member: refused
            coordinator.commit_offsets("g", {("t", 0): 1})
        coordinator.commit_offsets("g", {("t", 0): 1}, generation_id=m.generation, member_id=m.member_id)
        clock.advance(retention_ms + 1)
        m.heartbeat()
        assert coordinator.expire_offsets() == 0           # Stable: kept
        gm.leave_group("g", [{"member_id": m.member_id}])
        clock.advance(retention_ms - 1)
        assert coordinator.expire_offsets() == 0           # empty for less than the retention
        clock.advance(1)
        assert coordinator.expire_offsets() == 2           # the offset and the group's tombstone
        assert coordinator.fetch_offsets("g") == {}


def test_course_log_lines_collect_the_coordinators_lines_from_now_on(gm, clock):
    """Chapter 08's `log_lines`: what the coordinator logs after the call, as `kstore serve` would
    print it; calling it again (a cell run twice) starts a new list and stops filling the old."""
    import logging
    from kstore.course import log_lines
    logger = logging.getLogger("kstore.group_membership")
    level, handlers = logger.level, list(logger.handlers)
    try:
        first = log_lines("kstore.group_membership")
        m1 = Member(gm, "c1")
        m1.join()
        assert first == ["INFO Preparing to rebalance group g in state Empty with old generation 0 "
                         "(reason: adding new member c1-u0 with group instance id None) "
                         "(kstore.group_membership)"]
        second = log_lines("kstore.group_membership")
        clock.advance(3000)
        gm.tick()
        assert second == ["INFO Stabilized group g generation 1 with 1 members "
                          "(kstore.group_membership)"]
        assert len(first) == 1
    finally:
        logger.setLevel(level)
        logger.handlers[:] = handlers

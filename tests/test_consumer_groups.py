"""Consumer groups with real clients: kafka-python, confluent-kafka (librdkafka), aiokafka and
`kcat -G`, unmodified, with subscribe() against a `kstore serve` process (issue 14).

Each client: two members of one group on a 4-partition topic get disjoint assignments covering
all four partitions; when one closes, the other owns all four; a member that stops heartbeating
(SIGSTOP, a frozen process) loses its partitions within the session timeout; a later member
resumes exactly from the committed offsets; across all members no record is lost.
The broker runs with group.initial.rebalance.delay.ms=0 (the delay itself is tested on the
in-process coordinator with a manual clock in test_group_coordinator.py) and 6 s sessions.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import time
import uuid

import confluent_kafka as ck
import kafka.errors
import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from test_clients import ROOT, ServeProcess

pytestmark = pytest.mark.timeout(180)

SESSION_MS = 6000
PARTITIONS = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sp = ServeProcess(tmp_path_factory.mktemp("groups") / "logs",
                      "group.initial.rebalance.delay.ms=0").start()
    yield sp
    sp.stop()


def new_topic(server, records: int) -> str:
    topic = f"g-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    admin.close()
    produce(server, topic, 0, records)
    return topic


def produce(server, topic: str, start: int, n: int) -> None:
    producer = KafkaProducer(bootstrap_servers=server.bootstrap)
    for i in range(start, start + n):
        producer.send(topic, str(i).encode(), partition=i % PARTITIONS)
    producer.flush()
    producer.close()


# ---- one small interface over the three clients: poll -> [(partition, offset, value)]
class KafkaPythonMember:
    def __init__(self, bootstrap, group, topic):
        self.c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                               auto_offset_reset="earliest", enable_auto_commit=False,
                               session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500)

    def poll(self):
        got = self.c.poll(timeout_ms=200)
        return [(r.partition, r.offset, r.value.decode()) for rs in got.values() for r in rs]

    def assignment(self):
        return {tp.partition for tp in self.c.assignment()}

    def commit(self):
        if self.c.assignment():
            try:
                self.c.commit()
            except kafka.errors.CommitFailedError:   # a rebalance moved the partitions meanwhile
                pass

    def close(self):
        self.c.close()


class ConfluentMember:
    def __init__(self, bootstrap, group, topic):
        self.c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                              "auto.offset.reset": "earliest", "enable.auto.commit": False,
                              "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500})
        self.c.subscribe([topic])

    def poll(self):
        msgs = self.c.consume(num_messages=500, timeout=0.2)
        return [(m.partition(), m.offset(), m.value().decode()) for m in msgs if not m.error()]

    def assignment(self):
        return {tp.partition for tp in self.c.assignment()}

    def commit(self):
        try:
            self.c.commit(asynchronous=False)
        except ck.KafkaException as e:   # nothing consumed since the last commit
            if e.args[0].code() not in (ck.KafkaError._NO_OFFSET, ck.KafkaError.REBALANCE_IN_PROGRESS,
                                        ck.KafkaError.ILLEGAL_GENERATION,
                                        ck.KafkaError.UNKNOWN_MEMBER_ID):
                raise

    def close(self):
        self.c.close()


class AiokafkaMember:
    """aiokafka on its own event loop; the loop runs (and heartbeats) while we poll."""

    def __init__(self, bootstrap, group, topic):
        import aiokafka
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self._start(aiokafka, bootstrap, group, topic))

    async def _start(self, aiokafka, bootstrap, group, topic):
        self.c = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                           auto_offset_reset="earliest", enable_auto_commit=False,
                                           session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500)
        await self.c.start()

    def poll(self):
        got = self.loop.run_until_complete(self.c.getmany(timeout_ms=200))
        return [(r.partition, r.offset, r.value.decode()) for rs in got.values() for r in rs]

    def assignment(self):
        return {tp.partition for tp in self.c.assignment()}

    def commit(self):
        import aiokafka.errors
        if self.c.assignment():
            try:
                self.loop.run_until_complete(self.c.commit())
            except aiokafka.errors.CommitFailedError:   # a rebalance moved the partitions
                pass

    def close(self):
        self.loop.run_until_complete(self.c.stop())
        self.loop.close()


CLIENTS = {"kafka-python": KafkaPythonMember, "confluent-kafka": ConfluentMember,
           "aiokafka": AiokafkaMember}


def poll_until(members, condition, seen: dict, timeout_s: float, what: str) -> None:
    """Poll (and commit) every member until `condition()`; fail naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for m in members:
            for partition, offset, value in m.poll():
                seen.setdefault(value, (partition, offset))
            m.commit()
        if condition():
            return
    raise AssertionError(f"{what} did not happen within {timeout_s} s: "
                         f"{[sorted(m.assignment()) for m in members]}, {len(seen)} records seen")


@pytest.mark.parametrize("client", CLIENTS)
def test_two_members_split_then_one_takes_over_and_a_later_member_resumes(server, client):
    topic, group = new_topic(server, 400), f"group-{client}"
    make = CLIENTS[client]
    a, b = make(server.bootstrap, group, topic), make(server.bootstrap, group, topic)
    seen: dict[str, tuple[int, int]] = {}

    def split():
        sa, sb = a.assignment(), b.assignment()
        return sa and sb and not (sa & sb) and sa | sb == set(range(PARTITIONS))
    poll_until([a, b], split, seen, 60, "two members splitting the four partitions")
    a.close()
    poll_until([b], lambda: b.assignment() == set(range(PARTITIONS)), seen, SESSION_MS / 1000 + 2,
               "the remaining member owning all four partitions after the other closed")
    produce(server, topic, 400, 100)
    poll_until([b], lambda: len(seen) == 500, seen, 60, "reading all 500 records")
    b.commit()
    b.close()

    produce(server, topic, 500, 100)
    later, fresh = make(server.bootstrap, group, topic), {}
    poll_until([later], lambda: len(fresh) >= 100, fresh, 60, "the later member reading on")
    later.close()
    # it resumed exactly at the committed offsets: only the 100 new records, each once
    assert sorted(fresh, key=int) == [str(i) for i in range(500, 600)]
    assert {p: o for v, (p, o) in fresh.items() if int(v) < 504} == {0: 125, 1: 125, 2: 125, 3: 125}
    assert set(seen) | set(fresh) == {str(i) for i in range(600)}     # no record lost


def test_a_member_that_stops_heartbeating_loses_its_partitions(server, tmp_path):
    """A frozen kafka-python process (SIGSTOP): the confluent-kafka member gets all four within
    the session timeout, and reads every record, including the frozen member's share."""
    topic, group = new_topic(server, 200), "group-frozen"
    script = tmp_path / "member.py"
    script.write_text(
        "import sys\nfrom kafka import KafkaConsumer\n"
        f"c = KafkaConsumer({topic!r}, bootstrap_servers={server.bootstrap!r}, group_id={group!r},"
        f" auto_offset_reset='earliest', enable_auto_commit=False, session_timeout_ms={SESSION_MS},"
        " heartbeat_interval_ms=500)\n"
        "while True:\n"
        "    c.poll(timeout_ms=200)\n"
        "    if c.assignment(): print(sorted(tp.partition for tp in c.assignment()), flush=True)\n")
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT)
    try:
        survivor, seen = ConfluentMember(server.bootstrap, group, topic), {}

        def split():
            return survivor.assignment() and len(survivor.assignment()) < PARTITIONS
        poll_until([survivor], split, seen, 60, "the two members splitting the partitions")
        child.send_signal(signal.SIGSTOP)   # no more heartbeats, and no LeaveGroup either
        poll_until([survivor], lambda: survivor.assignment() == set(range(PARTITIONS)), seen,
                   SESSION_MS / 1000 * 2 + 5, "the survivor owning all four partitions")
        poll_until([survivor], lambda: len(seen) == 200, seen, 30, "reading every record")
        survivor.close()
    finally:
        child.kill()
        child.wait(10)


@pytest.mark.skipif(shutil.which("kcat") is None and not __import__("os").environ.get("CI"),
                    reason="kcat is not installed (apt-get install -y kcat)")
def test_kcat_balanced_consumer(server):
    """`kcat -G` (librdkafka's balanced consumer): reads all, commits; a second run reads nothing
    old, only what was produced after the first run's commits."""
    topic = new_topic(server, 80)
    cmd = ["kcat", "-b", server.bootstrap, "-G", "kcat-group", topic, "-e", "-q", "-f", "%p %o %s\\n",
           "-X", "auto.offset.reset=earliest", "-X", f"session.timeout.ms={SESSION_MS}"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    values = sorted(int(line.split()[2]) for line in first.stdout.splitlines())
    assert values == list(range(80))
    produce(server, topic, 80, 8)
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    assert sorted(int(line.split()[2]) for line in second.stdout.splitlines()) == list(range(80, 88))

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
import threading
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


def know_partitions_before_joining(consumer: KafkaConsumer, topic: str) -> None:
    """Have a kafka-python consumer learn its topic's partitions before its first poll joins.

    kafka-python (3.0.12, and its main branch in 2026) joins before it has fetched metadata for
    its subscription, so a leader assigns nothing, sees the partitions a moment later and rejoins
    at once: two rebalances per group start, against any broker. That second join can wedge the
    client: if `poll(timeout_ms)` runs out while it is in flight, the leader's assignment has
    already cleared the "metadata changed" flag, no later poll awaits the join, and the member
    stays "rebalancing" with heartbeats off until the broker drops it (session.timeout.ms). One
    metadata fetch first (a public call any application may make) means one rebalance, and no
    such join. The broker side is the same either way."""
    assert consumer.partitions_for_topic(topic) == set(range(PARTITIONS))


# ---- one small interface over the three clients: poll -> [(partition, offset, value)]
class KafkaPythonMember:
    def __init__(self, bootstrap, group, topic):
        self.c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                               auto_offset_reset="earliest", enable_auto_commit=False,
                               session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500)
        know_partitions_before_joining(self.c, topic)

    def poll(self):
        return self.rows(self.c.poll(timeout_ms=200))

    @staticmethod
    def rows(got: dict) -> list:
        return [(r.partition, r.offset, r.value.decode()) for rs in got.values() for r in rs]

    def assignment(self):
        return {tp.partition for tp in self.c.assignment()}

    def commit(self):
        if self.c.assignment():
            try:
                self.c.commit()
            # a rebalance moved the partitions meanwhile, or (kafka-python 3) this member is itself
            # rejoining, which it refuses to commit through, as the Java consumer does
            except (kafka.errors.CommitFailedError, kafka.errors.RebalanceInProgressError):
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


class AiokafkaMember(KafkaPythonMember):
    """aiokafka as an asyncio application runs it: on an event loop that keeps running (here in a
    thread of its own), so its heartbeat task runs between our polls too."""

    def __init__(self, bootstrap, group, topic):
        import aiokafka
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.c = self._run(self._start(aiokafka, bootstrap, group, topic))

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(60)

    @staticmethod
    async def _start(aiokafka, bootstrap, group, topic):
        consumer = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                             auto_offset_reset="earliest", enable_auto_commit=False,
                                             session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500)
        await consumer.start()
        return consumer

    def poll(self):
        return self.rows(self._run(self.c.getmany(timeout_ms=200)))

    def commit(self):
        import aiokafka.errors
        if self.c.assignment():
            try:
                self._run(self.c.commit())
            except aiokafka.errors.CommitFailedError:   # a rebalance moved the partitions
                pass

    def close(self):
        self._run(self.c.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
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
        f"c.partitions_for_topic({topic!r})   # see know_partitions_before_joining\n"
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
        # and the broker's log says why, as Kafka's does
        assert f"in group {group} has failed, removing it from the group" in server.read_output()
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


# ---- the consumer-groups tool and `kstore consume --group` against live members
def kstore(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "kstore", *args], capture_output=True,
                            text=True, timeout=timeout, cwd=ROOT)
    if check and result.returncode != 0:
        raise AssertionError(f"kstore {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def test_consumer_groups_tool_describes_resets_and_deletes(server):
    topic, group = new_topic(server, 40), "tool-group"
    where = ["--bootstrap-server", server.bootstrap]
    a, b = KafkaPythonMember(server.bootstrap, group, topic), KafkaPythonMember(server.bootstrap, group, topic)
    seen: dict = {}
    try:
        poll_until([a, b], lambda: len(a.assignment()) == len(b.assignment()) == 2 and len(seen) == 40,
                   seen, 60, "two members reading everything")
        members = rows(kstore("consumer-groups", *where, "--describe", "--group", group,
                              "--members", "--verbose").stdout)
        assert members[0] == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"]
        assert sorted(r[4] for r in members[1:]) == ["2", "2"]
        assert all(r[2] == "/127.0.0.1" and r[1].startswith(r[3] + "-") for r in members[1:])
        state = rows(kstore("consumer-groups", *where, "--describe", "--group", group, "--state").stdout)
        assert [group, "Stable"] in rows(kstore("consumer-groups", *where, "--list", "--state").stdout)
        assert state[1][0] == group and state[1][-3:] == ["range", "Stable", "2"]
        offsets = rows(kstore("consumer-groups", *where, "--describe", "--group", group).stdout)
        ids = {r[1]: r for r in members[1:]}
        assert len(offsets) == 5 and all(r[3] == "10" and r[5] == "0" and r[6] in ids for r in offsets[1:])
        refused = kstore("consumer-groups", *where, "--reset-offsets", "--group", group,
                         "--all-topics", "--to-earliest", "--execute", check=False)
        assert refused.returncode == 1
        assert refused.stderr.strip() == (f"Error: Assignments can only be reset if the group "
                                          f"'{group}' is inactive, but the current state is Stable.")
        deleted = kstore("consumer-groups", *where, "--delete", "--group", group, check=False)
        assert deleted.returncode == 1 and "The group is not empty." in deleted.stderr
    finally:
        a.close()
        b.close()
    dry = kstore("consumer-groups", *where, "--reset-offsets", "--group", group, "--topic",
                 f"{topic}:0,1", "--to-offset", "3", "--dry-run")
    assert rows(dry.stdout)[1:] == [[group, topic, "0", "3"], [group, topic, "1", "3"]]
    assert "has no active members" not in dry.stdout
    described = rows(kstore("consumer-groups", *where, "--describe", "--group", group).stdout)
    assert [r[3] for r in described[1:]] == ["10"] * 4          # a dry run changes nothing
    kstore("consumer-groups", *where, "--reset-offsets", "--group", group, "--all-topics",
           "--to-earliest", "--execute")
    described = rows(kstore("consumer-groups", *where, "--describe", "--group", group).stdout)
    assert [(r[3], r[5], r[6]) for r in described[1:]] == [("0", "10", "-")] * 4
    kstore("consumer-groups", *where, "--reset-offsets", "--group", group, "--topic", topic,
           "--to-datetime", "2000-01-01T00:00:00.000", "--execute")
    kstore("consumer-groups", *where, "--reset-offsets", "--group", group, "--topic", topic,
           "--to-latest", "--execute")
    described = rows(kstore("consumer-groups", *where, "--describe", "--group", group).stdout)
    assert [(r[3], r[5]) for r in described[1:]] == [("10", "0")] * 4
    assert kstore("consumer-groups", *where, "--delete", "--group", group).stdout.strip() == \
        f"Deletion of requested consumer groups ('{group}') was successful."
    assert group not in kstore("consumer-groups", *where, "--list").stdout.split()


def test_kstore_consume_with_a_group_subscribes(server):
    """Two `kstore consume --group` processes share the topic: each gets two partitions (the
    leader's range assignment), together they print every record once."""
    topic, group = new_topic(server, 80), "cli-group"
    cmd = [sys.executable, "-m", "kstore", "consume", "--bootstrap-server", server.bootstrap,
           "--topic", topic, "--group", group, "--from-beginning", "--timeout-ms", "8000",
           "--property", "print.partition=true"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT) for _ in range(2)]
    deadline = time.monotonic() + 60
    members = []
    while time.monotonic() < deadline:
        members = rows(kstore("consumer-groups", "--bootstrap-server", server.bootstrap,
                              "--describe", "--group", group, "--members", check=False).stdout)[1:]
        if len(members) == 2 and sorted(r[4] for r in members) == ["2", "2"]:
            break
        time.sleep(0.5)
    outs = [p.communicate(timeout=90)[0] for p in procs]
    assert sorted(r[4] for r in members) == ["2", "2"], members
    lines = [line.split() for out in outs for line in out.splitlines()]
    assert sorted(int(v) for _, v in lines) == list(range(80))      # every record, once
    by_process = [{line.split()[0] for line in out.splitlines()} for out in outs]
    assert not (by_process[0] & by_process[1])                      # disjoint partitions


def test_static_members_restart_without_a_rebalance(server):
    """librdkafka with group.instance.id (KIP-345): a static member that closes and comes back
    within the session timeout gets its partitions back, and the other member is not disturbed
    (no rebalance: its on_assign runs once)."""
    topic, group = new_topic(server, 40), "static-group"
    assigned = {"a": [], "b": []}

    def member(name):
        c = ck.Consumer({"bootstrap.servers": server.bootstrap, "group.id": group,
                         "group.instance.id": f"instance-{name}", "auto.offset.reset": "earliest",
                         "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500})
        c.subscribe([topic], on_assign=lambda _c, tps: assigned[name].append(
            sorted(tp.partition for tp in tps)))
        return c

    a, b = member("a"), member("b")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                a.assignment() and b.assignment() and len(a.assignment()) + len(b.assignment()) == 4):
            a.poll(0.1), b.poll(0.1)
        first_a, rebalances_b = sorted(tp.partition for tp in a.assignment()), len(assigned["b"])
        assert first_a and rebalances_b >= 1
        a.close()                                    # a static member sends no LeaveGroup
        a = member("a")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not a.assignment():
            a.poll(0.1), b.poll(0.1)
        for _ in range(10):
            a.poll(0.1), b.poll(0.1)
        assert sorted(tp.partition for tp in a.assignment()) == first_a
        assert len(assigned["b"]) == rebalances_b     # b never rebalanced
    finally:
        a.close()
        b.close()


def test_consumer_groups_tool_offline_on_a_log_dir(tmp_path, capsys):
    """The same tool on a log directory (no broker running; run in-process here): describe,
    reset, delete; bad input gets one line naming the problem and changes nothing."""
    from kstore.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    where = ["--log-dir", str(tmp_path / "logs")]
    run("topics", *where, "--create", "--topic", "t", "--partitions", "2")
    subprocess.run([sys.executable, "-m", "kstore", "produce", *where, "--topic", "t"],
                   input="".join(f"v{i}\n" for i in range(10)), text=True, check=True, cwd=ROOT)
    assert run("consume", *where, "--topic", "t", "--group", "g", "--from-beginning")[0] == 0
    state = rows(run("consumer-groups", *where, "--describe", "--group", "g", "--state")[1])
    assert state[1][-2:] == ["Empty", "0"]
    before = rows(run("consumer-groups", *where, "--describe", "--group", "g")[1])
    assert [r[5] for r in before[1:]] == ["0", "0"]
    for bad, message in [(["--to-datetime", "yesterday"], "--to-datetime 'yesterday' is not"),
                         (["--to-offset", "3", "--to-latest"], "exactly one of"),
                         (["--topic", "t:7", "--to-earliest"], "topic 't' has no partition 7")]:
        args = bad if "--topic" in bad else ["--all-topics", *bad]
        code, _, err = run("consumer-groups", *where, "--reset-offsets", "--group", "g", *args, "--execute")
        assert code != 0 and message in err
        assert len(err.strip().splitlines()) == 1, err
    assert rows(run("consumer-groups", *where, "--describe", "--group", "g")[1]) == before
    run("consumer-groups", *where, "--reset-offsets", "--group", "g", "--all-topics", "--to-earliest",
        "--execute")
    after = rows(run("consumer-groups", *where, "--describe", "--group", "g")[1])
    assert [r[3] for r in after[1:]] == ["0", "0"] and sum(int(r[5]) for r in after[1:]) == 10
    code, _, err = run("consumer-groups", *where, "--describe", "--group", "nobody")
    assert code == 1 and "Consumer group 'nobody' does not exist." in err
    assert run("consumer-groups", *where, "--delete", "--group", "g")[0] == 0
    assert run("consumer-groups", *where, "--list")[1].split() == []

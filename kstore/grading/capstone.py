"""Chapter 12's capstone: the learner's whole engine — every function they saved, plugged in at once
(`kstore.my_engine`) — serves unmodified Kafka clients, survives a crash, deletes and compacts by
the learner's rules, replicates, and leaves files that Kafka's own tools read.

Six checks, each a graded test of exercise 12 (task ex12.2), run in one pass over one set of
brokers:

    clients      kafka-python and confluent-kafka produce and consume; kstore's own producer writes
                 records with your encoder; a busy socket serves fetches through your sendfile loops
    files        `kstore dump-log` and kafka-python's batch decoder read every segment; segment and
                 `__consumer_offsets` partition names are Kafka's
    restart      the broker dies (no clean shutdown) with a torn write at the end of its log; your
                 recovery runs at the restart; the consumer reads every record, the commits survive
    retention    retention by time and by size deletes the segments Kafka's rules delete
    compaction   the cleaner keeps what Kafka keeps and picks the log Kafka picks
    replication  three brokers: acks, the high watermark, the ISR, elections, truncation

How a misbehaving function is named. Every learner function the engine calls goes through a
*referee*: it asks the reference solution the same question (before the learner, so the learner
cannot change the arguments first) and, when the answers differ, records it. Each function belongs
to ONE check (`OWNER`): in its own check the learner's answer is what the engine uses — so a wrong
function shows in what the real clients get, and the feedback names it with the call, the answer,
and Kafka's answer — while in the other checks the referee hands the engine the reference answer
(one bug costs the points of the check it belongs to, as in every exercise). Functions with side
effects (the sendfile loops) cannot be asked twice: outside their check the reference sends.

Learner code never runs here when graded: under `kstore grade` the functions are `RemoteFunction`s
(calls across the socket into the confined learner process); the referee and the references run in
the harness. In the project's own tests and with `kstore serve --my-engine` they are plain callables.
"""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

CHECKS = ("clients", "files", "restart", "retention", "compaction", "replication")

TITLES = {
    "clients": "kafka-python and confluent-kafka produce and consume on your engine",
    "files": "dump-log and kafka-python's decoder read your engine's files as Kafka's",
    "restart": "kill the broker, restart it: your recovery runs and nothing acknowledged is lost",
    "retention": "retention deletes the segments Kafka's rules delete",
    "compaction": "the cleaner keeps what Kafka keeps and picks the log Kafka picks",
    "replication": "three brokers of your engine: acks, high watermark, ISR, elections, truncation",
}

OWNER: dict[str, str] = {}
for _check, _names in {
    "clients": ("write_varint", "read_varint", "write_varlong", "encode_record", "index_entries",
                "largest_lower_bound_slot", "offset_index_lookup", "time_waited_for_roll", "should_roll",
                "floor_segment", "translate_offset", "offset_for_timestamp", "fetch_range", "send_range",
                "serve_fetch", "partition_for_key", "encode_offset_commit", "classify_batch"),
    "files": ("segment_file_name", "partition_for"),
    "restart": ("valid_prefix_length", "rebuild_index", "base_offset_from_file_name", "decode_offset_commit"),
    "retention": ("deletable_segments", "retention_time_breached", "size_breach_count"),
    "compaction": ("should_retain_record", "group_segments_by_size", "choose_filthiest"),
    "replication": ("leader_high_watermark", "follower_high_watermark", "is_caught_up", "may_join_isr",
                    "acks_decision", "end_offset_for", "truncation_offset", "elect_leader"),
}.items():
    OWNER.update(dict.fromkeys(_names, _check))

# Saved functions a serving engine does not call, and why (the capstone lists them; their own
# exercise's tests grade them).
NOT_SERVING = {
    "encode_batch": "kstore builds batches with its MemoryRecordsBuilder (records.build_batch), which "
                    "encodes each record with your encode_record; the batch header and CRC are kstore's",
    "compact": "the cleaner's copy loop (Cleaner.clean_segments) is kstore's; it keeps records by your "
               "should_retain_record and groups segments by your group_segments_by_size",
    "range_assign": "partition assignment runs in the clients (the group leader's consumer computes it "
                    "and the broker only relays it), so a broker never calls an assignor",
    "read_committed": "a read_committed consumer drops aborted transactions' records itself (Kafka's "
                      "CompletedFetch); the broker only sends the aborted-transactions list. kstore's own "
                      "consumer and Spark source use yours when your engine is switched on",
    "after_crash": "it predicts what a consumer re-reads after a crash; the consumer decides that, "
                   "not the broker",
}

# When a function's answer is wrong, the helpers it calls (in the learner's own file) are asked
# too: (helper, the helper's arguments from the outer call's). java_string_hashcode has no seam
# of its own; the files check finds it through partition_for.
HELPERS: dict[str, list[tuple[str, Callable[[tuple], list[tuple]]]]] = {
    "partition_for": [("java_string_hashcode", lambda a: [(a[0],)])],
    "offset_index_lookup": [("largest_lower_bound_slot", lambda a: [([e[0] for e in a[0]], a[2])])],
    "encode_record": [("write_varint", lambda a: [(a[0],), (-1,), (-(1 << 31),), (300,)]),
                      ("write_varlong", lambda a: [(a[1],), (-1,), (1 << 40,), (-(1 << 40),)])],
}
SIDE_EFFECTS = ("serve_fetch", "send_range")
DEFERRED_PER_FUNCTION = 64      # questions asked inside a learner call, put to the learner afterwards


# ================================================================================ the referee
@dataclass
class Divergence:
    check: str                   # the check that was running
    name: str
    call: str
    yours: str
    expected: str

    def line(self) -> str:
        return f"your {self.name}: {self.call} answered {self.yours}; Kafka's rule answers {self.expected}"


def _plain(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return tuple(_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (set, frozenset)):
        return frozenset(x)
    return x


def _short(x: Any, limit: int = 160) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _call_text(name: str, args: tuple, kwargs: dict) -> str:
    parts = [_short(a, 60) for a in args] + [f"{k}={_short(v, 60)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


class Referee:
    """Runs the engine's calls to the learner's functions (see the module docstring)."""

    def __init__(self, learner: dict[str, Callable], reference: Callable[[str], Callable]):
        self.learner = learner
        self.reference = reference
        self.check = "clients"
        self.reference_mode = False          # every answer the reference's (the expected run)
        self.divergences: list[Divergence] = []
        self.calls: dict[str, set[str]] = {c: set() for c in CHECKS}
        self._lock = threading.RLock()
        self._inside = threading.local()     # a learner call in progress on this thread
        self.kstores_classes: list = []         # patches that put kstore's classes back (reference runs)
        self._deferred: dict[str, int] = {}     # questions asked inside learner calls, per function


    def wrap(self, name: str) -> Callable:
        def referee(*args, **kwargs):
            with self._lock:
                check = self.check
                self.calls[check].add(name)
                mine = OWNER.get(name) == check and not self.reference_mode
            inside = self._inside
            if getattr(inside, "depth", 0):
                # the engine asked from inside a learner call (a view's method the learner's function
                # called): the reference answers now — a graded learner process serves one call at a
                # time — and the learner's function is asked the same question once that call is over
                expected = self.reference(name)(*args, **kwargs)
                if name not in SIDE_EFFECTS and not getattr(inside, "draining", False) \
                        and self._deferred.setdefault(name, 0) < DEFERRED_PER_FUNCTION:
                    self._deferred[name] += 1
                    inside.queue.append((name, check, args, kwargs, expected))
                return expected
            inside.depth, inside.queue = 1, []
            try:
                return self._referee(name, check, mine, args, kwargs)
            finally:
                self._ask_deferred(inside)
                inside.depth = 0
        referee.__name__ = referee.__qualname__ = name
        referee.__wrapped__ = self.learner[name]
        return referee

    def _ask_deferred(self, inside) -> None:
        """The questions the engine asked during a learner call, now put to the learner."""
        inside.draining = True
        try:
            for name, check, args, kwargs, expected in inside.queue:
                try:
                    yours = self.learner[name](*args, **kwargs)
                except Exception as e:
                    self._record(check, name, args, kwargs, f"an exception: {type(e).__name__}: {e}", expected)
                    continue
                if _plain(yours) != _plain(expected):
                    self._record(check, name, args, kwargs, _short(yours), expected)
        finally:
            inside.draining, inside.queue = False, []

    def _referee(self, name: str, check: str, mine: bool, args: tuple, kwargs: dict) -> Any:
        if name in SIDE_EFFECTS:              # (sock, file_fd, start, end) / (sock, file_fd, position, count)
            if not mine:
                return self.reference(name)(*args, **kwargs)
            promised = args[3] - args[2] if name == "serve_fetch" else args[3]
            try:
                sent = self.learner[name](*args, **kwargs)
            except Exception as e:
                self._record(check, name, args, kwargs, f"an exception: {type(e).__name__}: {e}",
                             f"{promised} (bytes sent)")
                raise
            if sent != promised:
                self._record(check, name, args, kwargs, _short(sent), f"{promised} (bytes sent)")
            return sent
        expected = self.reference(name)(*args, **kwargs)
        try:
            yours = self.learner[name](*args, **kwargs)
        except Exception as e:
            self._record(check, name, args, kwargs, f"an exception: {type(e).__name__}: {e}", expected)
            if mine:
                raise
            return expected
        if _plain(yours) != _plain(expected):
            self._record(check, name, args, kwargs, _short(yours), expected)
            if mine:
                return yours
        return expected if not mine else yours

    def _record(self, check, name, args, kwargs, yours: str, expected) -> None:
        with self._lock:
            if any(d.name == name for d in self.divergences):
                return                           # the first wrong answer says it
            self.divergences.append(Divergence(check, name, _call_text(name, args, kwargs), yours,
                                               _short(expected)))
            for helper, helper_args in HELPERS.get(name, ()):
                if helper not in self.learner or any(d.name == helper for d in self.divergences):
                    continue
                for hargs in helper_args(args):
                    want = self.reference(helper)(*hargs)
                    try:
                        got = self.learner[helper](*hargs)
                    except Exception as e:
                        got = f"an exception: {type(e).__name__}: {e}"
                    if _plain(got) != _plain(want):
                        self.divergences.append(Divergence(check, helper, _call_text(helper, hargs, {}),
                                                           _short(got), _short(want)))
                        break

    def owned_divergences(self, check: str) -> list[Divergence]:
        return [d for d in self.divergences if OWNER.get(d.name, OWNER.get(_outer(d.name), "")) == check]


def _outer(helper: str) -> str:
    return next((outer for outer, hs in HELPERS.items() if any(h == helper for h, _ in hs)), "")


# ================================================================================ results
@dataclass
class CheckResult:
    check: str
    problems: list[str] = field(default_factory=list)     # what the clients/tools saw go wrong
    blamed: list[str] = field(default_factory=list)       # the learner's functions that misbehaved
    lines: list[str] = field(default_factory=list)        # the feedback naming them
    missing: list[str] = field(default_factory=list)      # this check's functions not saved
    steps: list[str] = field(default_factory=list)        # what went right (for the notebook)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.problems and not self.blamed and not self.missing

    def feedback(self) -> str:
        out = [f"capstone check '{self.check}': {TITLES[self.check]}"]
        out += [f"  {p}" for p in self.problems]
        out += [f"  {ln}" for ln in self.lines]
        if self.missing:
            out.append(f"  not implemented yet in your engine (not saved; kstore's code served them): "
                       f"{', '.join(self.missing)} — save(...) in their exercise notebooks, and hand in "
                       f"my_engine/ with this notebook; this check runs once all of them are saved")
        return "\n".join(out)


@dataclass
class Capstone:
    results: dict[str, CheckResult]
    yours: list[str]
    not_serving: dict[str, str]
    seconds: float
    calls: dict[str, set[str]] = field(default_factory=dict)    # check → the learner's functions it called

    def summary(self) -> str:
        lines = [f"{'✔' if r.passed else '✘'} {c}: {TITLES[c]}" for c, r in self.results.items()]
        lines += [f"  {name}: not used by the serving engine — {why}" for name, why in self.not_serving.items()]
        return "\n".join(lines)


# ================================================================================ helpers
T0 = 1_700_000_000_000


def _values(prefix: str, n: int, size: int = 90) -> list[bytes]:
    return [f"{prefix}-{i:04d} ".encode() + bytes((i * 7 + j) % 251 for j in range(size)) for i in range(n)]


def _kp_read(bootstrap: str, topic: str, partition: int, n: int, start: int | None = None,
             timeout_s: float = 8.0) -> list[tuple[int, bytes | None, bytes | None]]:
    from kafka import KafkaConsumer, TopicPartition
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, check_crcs=True,
                             auto_offset_reset="earliest", fetch_max_wait_ms=100, request_timeout_ms=10000)
    out: list = []
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start) if start is not None else consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + timeout_s
        while len(out) < n and time.monotonic() < deadline:
            for msgs in consumer.poll(timeout_ms=200).values():
                out += [(m.offset, m.key, m.value) for m in msgs]
        return out
    finally:
        consumer.close()


def _ck_read(bootstrap: str, topic: str, partition: int, start: int, timeout_s: float = 8.0) -> list:
    import confluent_kafka as ck
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "capstone-reader",
                            "enable.auto.commit": False, "check.crcs": True, "enable.partition.eof": True,
                            "fetch.wait.max.ms": 100, "auto.offset.reset": "earliest"})
    out: list = []
    try:
        consumer.assign([ck.TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for m in consumer.consume(500, 0.2):
                if m.error() is None:
                    out.append((m.offset(), m.key(), m.value()))
                elif m.error().code() == ck.KafkaError._PARTITION_EOF:
                    return out
                else:
                    raise RuntimeError(f"confluent-kafka: {m.error()}")
        raise RuntimeError(f"confluent-kafka saw no end of partition in {timeout_s:g} s ({len(out)} records)")
    finally:
        consumer.close()


def _commit(bootstrap: str, group: str, topic: str, partition: int, offset: int) -> int | None:
    """kafka-python commits `offset` for `group` and reads the committed offset back."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                             request_timeout_ms=10000)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(offset, "capstone", -1)})
        return consumer.committed(tp)
    finally:
        consumer.close()


def _committed(bootstrap: str, group: str, topic: str, partition: int) -> int | None:
    from kafka import KafkaConsumer, TopicPartition
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                             request_timeout_ms=10000)
    try:
        return consumer.committed(TopicPartition(topic, partition))
    finally:
        consumer.close()


def _diff(what: str, got: list, want: list) -> str | None:
    if got == want:
        return None
    if len(got) != len(want):
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    else:
        first = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    shown = got[first] if first < len(got) else "nothing"
    return (f"{what}: {len(got)} records, expected {len(want)}; the first difference is record #{first}: "
            f"got {_short(shown, 90)}, expected {_short(want[first] if first < len(want) else 'nothing', 90)}")


@contextlib.contextmanager
def _broker(log_dir: Path, serve: bool = True):
    from ..broker import Broker
    from ..server import KafkaServer
    broker = Broker(str(log_dir), config={"num.partitions": 1})
    server = KafkaServer(broker, "127.0.0.1", 0).start_in_thread() if serve else None
    state = {"crashed": False}
    try:
        yield broker, (f"127.0.0.1:{server.port}" if server else None), state
    finally:
        if server is not None:
            server.stop()
        if not state["crashed"]:
            broker.shutdown()


GROUPS = ("polygenelubricants", "capstone-grüße-€")   # Java hashCode MIN_VALUE; not ASCII (UTF-16 ≠ UTF-8)
SMALL = {"segment.bytes": "6000", "index.interval.bytes": "2000"}


# ================================================================================ the checks
def _check_clients(root: Path, ref: Referee, res: CheckResult, state: dict) -> None:
    from kafka import KafkaProducer
    import confluent_kafka as ck
    from .. import partitioner
    from ..producer import Producer
    from . import live
    log_dir = root / "clients"
    with _broker(log_dir) as (broker, bootstrap, _):
        broker.create_topic("capstone", 3, 1, dict(SMALL))   # 3: toPositive ≠ Python %
        keys = [f"key-{i:02d}".encode() for i in range(24)]
        values = _values("kp", 24)
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, request_timeout_ms=10000)
        try:
            futures = [producer.send("capstone", key=k, value=v, timestamp_ms=T0 + 10 * i)
                       for i, (k, v) in enumerate(zip(keys, values))]
            producer.flush(15)
            placed = {k: f.get(15).partition for k, f in zip(keys, futures)}
        finally:
            producer.close(5)
        res.steps.append(f"kafka-python produced {len(keys)} keyed records (its murmur2 partitioner)")
        # kstore's own producer: your partitioner places the same keys, your encoder writes the records
        # (timestamps going back, and one more than 2^31 ms ahead: negative and 64-bit deltas)
        with Producer(broker, acks="all", linger_ms=3_600_000, batch_size=1 << 20) as own:   # one batch
            for i, k in enumerate(keys):
                own.send("capstone", value=b"own-" + values[i][:40], key=k,
                         timestamp_ms=T0 - 5_000 * (i % 3) + (3_000_000_000 if i == 23 else 0))
        mine = {k: partitioner.partition_for_key(k, 3) for k in keys}
        wrong = [k for k in keys if mine[k] != placed[k]]
        if wrong:
            k = wrong[0]
            res.problems.append(f"kafka-python's producer put key {k!r} in partition {placed[k]}; your engine's "
                                f"producer put it in partition {mine[k]} ({len(wrong)} of {len(keys)} keys "
                                f"disagree): clients must agree where a key lives")
        expect = {p: [] for p in (0, 1, 2)}
        for k, v in zip(keys, values):
            expect[placed[k]].append((k, v))
        for i, k in enumerate(keys):
            expect[mine[k]].append((k, b"own-" + values[i][:40]))
        ck_values = _values("ck", 30)
        cp = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                          "compression.type": "lz4", "linger.ms": 5, "message.timeout.ms": 15000,
                          "log_level": 2})
        errors: list = []
        for i, v in enumerate(ck_values):
            cp.produce("capstone", key=b"ck", value=v, partition=1, timestamp=T0 + 20_000 + i,
                       on_delivery=lambda err, msg: errors.append(err) if err else None)
            if i % 10 == 9:
                cp.flush(15)
        if cp.flush(15) or errors:
            res.problems.append(f"confluent-kafka could not deliver: {errors[:1] or 'timed out'}")
        del cp                                  # librdkafka's producer goes before the broker does
        expect[1] += [(b"ck", v) for v in ck_values]
        res.steps.append("kstore's producer (your encoder) and confluent-kafka (lz4, idempotent) produced")
        for p in (0, 1, 2):
            got = _kp_read(bootstrap, "capstone", p, len(expect[p]))
            problem = _diff(f"kafka-python read partition {p}", [(k, v) for _, k, v in got], expect[p])
            if problem:
                res.problems.append(problem)
                break                       # one wrong read says it; the others would wait as long
            if p == 1 and not problem:
                start = len(expect[1]) - 17
                try:
                    tail = _ck_read(bootstrap, "capstone", 1, start)
                    problem = _diff(f"confluent-kafka read partition 1 from offset {start}",
                                    [(k, v) for _, k, v in tail], expect[1][start:])
                except Exception as e:
                    problem = f"confluent-kafka reading partition 1 from offset {start}: {e}"
                if problem:
                    res.problems.append(problem)
        from kafka import KafkaConsumer, TopicPartition
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=10000)
        try:
            found = consumer.offsets_for_times({TopicPartition("capstone", 1): T0 + 20_005})
            got = next(iter(found.values()))
            want = len(expect[1]) - len(ck_values) + 5
            if got is None or got.offset != want:
                res.problems.append(f"kafka-python's offsets_for_times(T0 + 20005) on partition 1 answered "
                                    f"{got and got.offset}, expected offset {want}")
        finally:
            consumer.close()
        committed = _commit(bootstrap, "capstone-group", "capstone", 1, 7)
        if committed != 7:
            res.problems.append(f"kafka-python committed offset 7 for its group and read back {committed}")
        res.steps.append("both clients read every record back; a group committed its offset")
        _exact_sizes(broker, bootstrap, ref, res)
    _compare_runs(ref, res, root / "idempotence", _idempotence_run, "idempotent producers")
    # a busy socket: os.sendfile sends at most 500 bytes a call, so each loop must resume correctly
    senders: list[tuple[str, Callable | None]] = []
    if "serve_fetch" in state["wrapped"]:
        senders.append(("serve_fetch", state["wrapped"]["serve_fetch"]))
    if "send_range" in state["wrapped"]:
        send_range = state["wrapped"]["send_range"]
        senders.append(("send_range", lambda sock, fd, start, end: send_range(sock, fd, start, end - start)))
    for name, sender in senders:
        run_dir = root / f"busy-{name}"
        run_dir.mkdir()
        run = live.kafka_python_through(sender, str(run_dir), records=60, timeout_s=8, busy_socket=500)
        if run.consumed != run.produced or run.wrong_return:
            said = run.summary() if name == "serve_fetch" else \
                run.summary().replace("serve_fetch(sock, fd, ", "send_range(sock, fd, start, end − start) for (")
            res.problems.append(f"a busy socket (os.sendfile sends at most 500 bytes a call), fetches sent by "
                                f"your {name}: {said}")
            res.blamed.append(name)
        else:
            res.steps.append(f"a busy socket: your {name} sent {len(run.calls)} fetch ranges whole")


def _exact_sizes(broker, bootstrap: str, ref: Referee, res: CheckResult) -> None:
    """Batches of one known size S on a topic with index.interval.bytes = 2·S and segment.bytes =
    3·S: the index and roll rules meet their limits exactly (where > and >= part)."""
    from ..records import Record, build_batch
    with _reference_mode(ref):
        batches = [build_batch([Record(b"exact", b"x" * 100 + bytes([i]), T0 + i)]) for i in range(12)]
    size = len(batches[0])
    broker.create_topic("exact", 1, 1, {"index.interval.bytes": str(2 * size), "segment.bytes": str(3 * size)})
    for batch in batches:
        broker.produce("exact", 0, batch, acks=-1)
    got = _kp_read(bootstrap, "exact", 0, 7, start=5)
    problem = _diff("kafka-python read topic 'exact' from offset 5", [o for o, _, _ in got], list(range(5, 12)))
    if problem:
        res.problems.append(problem)
    else:
        res.steps.append(f"12 batches of exactly {size} bytes (index interval {2 * size}, segments of "
                         f"{3 * size} bytes): indexed, rolled and read from the middle")


def _idempotence_run(root: Path) -> dict:
    """What an idempotent producer's retries meet on the leader: a retry of an older batch, of
    the last one, a producer the partition forgot (KIP-360), and a sequence wrapping past
    Int.MaxValue (the scenarios real clients meet after lost responses and expirations)."""
    from ..clock import ManualClock
    from ..errors import KStoreError
    from ..log import Log
    from ..records import Record, build_batch
    clock = ManualClock(T0)
    log = Log.open(str(root / "idempotent-0"), clock=clock)
    try:
        def send(seq: int, n: int, producer_id: int = 7):
            batch = build_batch([Record(None, b"v%d" % i, clock.milliseconds()) for i in range(n)],
                                producer_id=producer_id, producer_epoch=0, base_sequence=seq)
            try:
                return log.append_as_leader(batch).first_offset
            except KStoreError as e:
                return type(e).__name__
        out = {"first appends (offsets)": [send(0, 2), send(2, 2), send(4, 1)],
               "a retry of the first batch, then of the last": [send(0, 2), send(4, 1)],
               "an unknown producer starting at sequence 5": send(5, 1, producer_id=9)}
        out["a sequence wrapping past 2147483647"] = [send(2**31 - 2, 2, producer_id=8), send(0, 1, producer_id=8)]
        out["log end offset"] = log.log_end_offset
        return out
    finally:
        log.close()


def _check_files(root: Path, ref: Referee, res: CheckResult, state: dict) -> None:
    """Kafka's own reader (kafka-python's record decoder, CRC checked) and `kstore dump-log` (run as
    its own process, kstore's code only) read every segment a broker of your engine wrote, and the
    groups' commits sit in the `__consumer_offsets` partition Kafka places them in."""
    import re
    from kafka.record.memory_records import MemoryRecords as KafkaRecords
    from ..producer import Producer
    from ..records import MemoryRecords
    log_dir = root / "logs"
    with _broker(log_dir) as (broker, bootstrap, _):
        broker.create_topic("files", 2, 1, dict(SMALL))
        with Producer(broker, acks="all", linger_ms=0) as own:
            for i, value in enumerate(_values("f", 60)):
                own.send("files", value=value, key=f"f{i % 7}".encode(), partition=i % 2, timestamp_ms=T0 + i)
        for group in GROUPS:
            committed = _commit(bootstrap, group, "files", 0, 7)
            if committed != 7:
                res.problems.append(f"group {group!r} committed offset 7 and read back {committed}")
    files = sorted(log_dir.glob("files-*/*.log"))
    decoded = 0
    for path in files:
        if not re.fullmatch(r"\d{20}\.log", path.name):
            res.problems.append(f"{path.parent.name}/{path.name}: Kafka names a segment by its base offset, "
                                f"20 digits with leading zeros (00000000000000000000.log)")
            continue
        data = path.read_bytes()
        ours = list(MemoryRecords(data).batches())
        if ours and ours[0].base_offset != int(path.stem):
            res.problems.append(f"{path.parent.name}/{path.name} starts with offset {ours[0].base_offset}, "
                                f"not the offset its name says")
        theirs = KafkaRecords(data)
        count = 0
        try:
            while theirs.has_next():
                batch = theirs.next_batch()
                if not batch.validate_crc():
                    raise ValueError(f"CRC mismatch in the batch at offset {batch.base_offset}")
                count += sum(1 for _ in batch)
        except Exception as e:
            res.problems.append(f"kafka-python's decoder could not read {path.parent.name}/{path.name}: "
                                f"{type(e).__name__}: {e}")
            continue
        if count != sum(b.records_count for b in ours):
            res.problems.append(f"kafka-python's decoder read {count} records in {path.parent.name}/{path.name}; "
                                f"the batches say {sum(b.records_count for b in ours)}")
        decoded += count
    res.steps.append(f"kafka-python's decoder read {decoded} records in {len(files)} segments, every CRC right")
    dump = subprocess.run([sys.executable, "-m", "kstore", "dump-log", "--deep-iteration",
                           "--files", ",".join(str(p) for p in files)],
                          capture_output=True, text=True, timeout=60)
    if dump.returncode != 0 or dump.stdout.count("| offset:") != decoded:
        res.problems.append(f"kstore dump-log (exit {dump.returncode}) printed {dump.stdout.count('| offset:')} "
                            f"records of {decoded}: {(dump.stderr or dump.stdout).strip()[-300:]}")
    else:
        res.steps.append(f"kstore dump-log --deep-iteration printed all {decoded} records")
    from ..group_coordinator import OFFSETS_TOPIC
    for group in GROUPS:
        kafkas = ref.reference("partition_for")(group, 50)
        where = [p.parent.name for p in log_dir.glob(f"{OFFSETS_TOPIC}-*/*.log") if group.encode() in p.read_bytes()]
        if where != [f"{OFFSETS_TOPIC}-{kafkas}"]:
            res.problems.append(f"group {group!r}'s commits are in {where or 'no partition'}; Kafka keeps them "
                                f"in {OFFSETS_TOPIC}-{kafkas} (Utils.abs(groupId.hashCode) % 50), where another "
                                f"broker would look")


def _tear_tail(partition_dir: Path) -> int:
    """What a kill -9 in the middle of an append leaves: after the last whole batch, a copy of it
    with one payload byte changed (its CRC no longer matches) and half of another batch header."""
    from ..records import MemoryRecords
    path = sorted(partition_dir.glob("*.log"))[-1]
    data = path.read_bytes()
    last = list(MemoryRecords(data).batches())[-1]
    start = len(data) - last.size_in_bytes
    copy = bytearray(data[start:])
    struct.pack_into(">q", copy, 0, last.last_offset + 1)
    copy[-1] ^= 0xFF
    with open(path, "ab") as f:
        f.write(bytes(copy) + bytes(copy[:30]))
    return len(copy) + 30


def _check_restart(root: Path, ref: Referee, res: CheckResult, state: dict) -> None:
    from kafka import KafkaProducer
    log_dir = root / "restart"
    values = _values("r", 40)
    with _broker(log_dir) as (broker, bootstrap, st):
        broker.create_topic("restart", 1, 1, dict(SMALL))
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2, batch_size=800,
                                 request_timeout_ms=10000)
        try:
            offsets = [f.get(15).offset for f in [producer.send("restart", value=v) for v in values]]
        finally:
            producer.close(5)
        committed = _commit(bootstrap, "restart-group", "restart", 0, 12)
        broker.crash()                      # no clean shutdown: the loader recovers at the restart
        st["crashed"] = True
    torn = _tear_tail(log_dir / "restart-0")
    res.steps.append(f"40 records acknowledged (offsets {offsets[0]}–{offsets[-1]}), a commit at 12; the broker "
                     f"died with a torn write ({torn} bytes) at the end of its log")
    with _broker(log_dir) as (broker, bootstrap, _):
        got = _kp_read(bootstrap, "restart", 0, 40)
        problem = _diff("after the restart, kafka-python read", [(o, v) for o, _, v in got],
                        list(zip(range(40), values)))
        if problem:
            res.problems.append(problem)
        after = _committed(bootstrap, "restart-group", "restart", 0)
        if after != committed:
            res.problems.append(f"the group committed offset {committed} before the crash; after the restart "
                                f"it reads {after}")
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", request_timeout_ms=10000)
        try:
            more = producer.send("restart", value=b"after the restart").get(15).offset
        finally:
            producer.close(5)
        if more != 40:
            res.problems.append(f"the first record after the restart got offset {more}; the log ended at 40 "
                                f"(recovery must cut the torn write, not keep it)")
    if "valid_prefix_length" in ref.learner and "valid_prefix_length" not in ref.calls["restart"]:
        res.problems.append("the restart did not run your recovery (no segment was recovered)")
    res.steps.append("the restart recovered the log with your code: every acknowledged record and the "
                     "commit survived, the torn write was cut")


def _retention_run(root: Path) -> dict:
    from ..clock import ManualClock
    from ..log import Log
    out = {}
    cases = {"time": ({"retention.ms": 60_000}, [T0, T0 + 10_000, T0 + 190_000, T0 + 195_000]),
             "everything-old": ({"retention.ms": 60_000}, [T0, T0 + 1_000]),
             "size": ({"retention.bytes": 2_500}, [T0 + 199_000] * 5)}
    for name, (config, stamps) in cases.items():
        clock = ManualClock(T0 + 200_000)
        log = Log.open(str(root / f"{name}-0"), {"segment.bytes": 1 << 20, **config}, clock)
        try:
            for i, ts in enumerate(stamps):
                if i:
                    log.roll()
                log.append([(f"k{i}{j}".encode(), b"v" * 200) for j in range(4)], timestamp=ts)
            log.update_high_watermark(log.log_end_offset)
            deleted = log.delete_old_segments()
            out[name] = {"deleted": deleted, "log start offset": log.log_start_offset,
                         "segments": [s.base_offset for s in log.segments]}
        finally:
            log.close()
    return out


def _check_retention(root: Path, ref: Referee, res: CheckResult, state: dict) -> None:
    _compare_runs(ref, res, root / "retention", _retention_run, "retention")


def _compaction_run(root: Path) -> dict:
    from ..clock import ManualClock
    from ..log_manager import LogManager
    from . import live
    clock = ManualClock(T0)
    logs = LogManager(str(root / "logs"), {"segment.bytes": 1200}, clock)
    try:
        log = logs.get_or_create_log("compacted", 0, {"cleanup.policy": "compact",
                                                      "delete.retention.ms": 86_400_000})
        for rnd in range(3):
            for k in range(8):
                value = None if (rnd == 2 and k in (3, 5)) else f"v{rnd}-{k}".encode() * 8
                log.append([(f"k{k}".encode(), value)], timestamp=T0 + rnd * 1000 + k)
        log.roll()
        clock.advance(1000)
        logs.cleaner.clean_log(log)
        kept = [(r.offset, r.key, r.value) for b in log.read(0, 1 << 20).records.batches() for r in b.records()]
    finally:
        logs.shutdown()
    ratios, order = live.cleaner_choices(str(root / "choices"))
    return {"records a consumer reads after the cleaning": kept, "logs the cleaner picks, in order": order}


def _check_compaction(root: Path, ref: Referee, res: CheckResult, state: dict) -> None:
    _compare_runs(ref, res, root / "compaction", _compaction_run, "compaction")


def _replication_run(root: Path) -> dict:
    from ..replica_fetcher import EPOCH_TRUNCATION
    from . import live
    acks = live.acks_scenarios(str(root / "acks"))
    elections = live.election_scenarios(str(root / "elections"))
    kip101 = live.kip101_scenario_1(str(root / "kip101"), EPOCH_TRUNCATION)
    return {"acks": acks, "elections": elections, "an election when the ISR is not in assignment order":
            _isr_order_election(root / "isr-order"),
            "KIP-101 (a follower restarts, then the leader fails)": {k: kip101[k] for k in ("acked", "values")}}


def _isr_order_election(root: Path) -> dict:
    """Replicas [0, 1, 2]. Kafka's leader appends a follower that rejoins the ISR at its end, so its
    AlterPartition may say ISR [0, 2, 1] (kstore's own leader keeps assignment order; the request
    here is what Kafka's would send). The leader dies: Kafka elects the first live ISR member in
    *assignment* order, broker 1 — not the first of the ISR list."""
    from ..clock import ManualClock
    from ..cluster import Cluster
    cluster = Cluster(str(root), num_brokers=3, clock=ManualClock(T0))
    try:
        cluster.create_topic("order", 1, 3)
        cluster.produce("order", 0, ["a"], acks="all")
        cluster.replicate(rounds=3)
        cluster.brokers[0].alter_partition_isr("order", 0, 0, [0, 2, 1])
        isr = cluster.isr("order")
        cluster.crash(0)
        return {"ISR before the leader died": isr, "new leader": cluster.leader("order")}
    finally:
        cluster.shutdown()


def _check_replication(root: Path, ref: Referee, res: CheckResult, state: dict) -> None:
    _compare_runs(ref, res, root / "replication", _replication_run, "replication")


def _compare_runs(ref: Referee, res: CheckResult, root: Path, run: Callable[[Path], dict], what: str) -> None:
    """The same scenario twice: with Kafka's rules (the reference answers) and with yours."""
    with _reference_mode(ref):
        expected = run(root / "kafka")
    got = run(root / "yours")
    for key, want in expected.items():
        if _plain(got.get(key)) != _plain(want):
            res.problems.append(f"{key}: your engine: {_short(got.get(key), 400)}; Kafka's rules: {_short(want, 400)}")
    if not res.problems:
        res.steps.append(f"{what}: " + "; ".join(f"{k} as Kafka's" for k in expected))


@contextlib.contextmanager
def _reference_mode(ref: Referee):
    from . import live
    with ref._lock:
        ref.reference_mode = True
    try:
        with live.plug(ref.kstores_classes):     # and kstore's own components, not the learner's classes
            yield
    finally:
        with ref._lock:
            ref.reference_mode = False


RUNNERS = {"clients": _check_clients, "files": _check_files, "restart": _check_restart,
           "retention": _check_retention, "compaction": _check_compaction, "replication": _check_replication}


# ================================================================================ the run
def run_capstone(functions: dict[str, Callable], root: str | os.PathLike, *,
                 reference: Callable[[str], Callable] | None = None,
                 checks: tuple[str, ...] = CHECKS, classes: dict[str, type] | None = None) -> Capstone:
    """Run `checks` on an engine with `functions` (name → the learner's function) plugged in, and
    the learner's own component `classes` (`kstore.my_engine.CLASS_SEAMS`; judged by the checks'
    outcomes). `reference(name)` gives Kafka's answer for each function (the solutions; the default)."""
    from .. import my_engine
    from . import live
    if reference is None:
        from .testing import reference
    started = time.perf_counter()
    root = Path(root)
    fns, yours, _ = my_engine.plugged(functions)
    ref = Referee(dict(functions), reference)       # all of them: helpers are asked about too
    wrapped = {n: ref.wrap(n) for n in fns}
    state: dict = {"wrapped": wrapped}
    results = {c: CheckResult(c) for c in checks}
    classes = dict(classes or {})
    yours += [my_engine.CLASS_SEAMS[c][0] for c in classes]
    function_patches, class_patches = my_engine._patches(live, wrapped), my_engine.class_patches(classes)
    with live.plug(function_patches):
        ref.kstores_classes = [live.Patch(p.target, p.name, p.target.__dict__[p.name]) for p in class_patches]
    with live.plug(function_patches, class_patches):
        for check in checks:
            res = results[check]
            ref.check = check
            res.missing = [n for n, c in OWNER.items() if c == check and n not in fns]
            if res.missing:                 # kstore's code would pass for the learner: not run
                continue
            work = root / check
            work.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            try:
                RUNNERS[check](work, ref, res, state)
            except Exception as e:          # the engine failed with the learner's code: say so, go on
                res.problems.append(f"the engine failed: {type(e).__name__}: {_short(str(e), 300)}")
            res.seconds = round(time.perf_counter() - t0, 2)
    for check, res in results.items():
        mine = ref.owned_divergences(check)
        res.lines = [d.line() for d in mine]
        res.blamed = list(dict.fromkeys(res.blamed + [d.name for d in mine]))
        if res.problems and not res.blamed:
            ran = sorted(n for n in ref.calls[check] if OWNER.get(n) == check)
            res.lines.append(f"your functions that ran here: {', '.join(ran) or 'none'} (each answered as "
                             f"Kafka's rule does whenever it was asked)")
            if classes:
                res.lines.append(f"your classes served here too: {', '.join(classes)} (from_scratch.py)")
    not_serving = {n: why for n, why in NOT_SERVING.items() if n in functions}
    return Capstone(results, yours, not_serving, round(time.perf_counter() - started, 1), ref.calls)


# ================================================================================ grading a notebook
ENGINE_FOLDER = "my_engine"
MAX_ENGINE_FILE = 1 << 20


def with_engine_files(nb: dict, notebook_path: str | os.PathLike, exercise_id: str) -> dict:
    """The notebook `kstore grade` runs for a whole-engine exercise: a first cell that writes the
    learner's `my_engine/` files (handed in next to the notebook) into the learner's working
    directory, so the notebook's `load_engine("my_engine")` finds them in the confined process —
    which cannot read the submission's folder itself. Other exercises: the notebook unchanged."""
    import json
    import re
    from .exercises import EXERCISES, WHOLE_ENGINE_TASKS
    if not any(t.id in WHOLE_ENGINE_TASKS for t in EXERCISES[exercise_id].tasks):
        return nb
    folder = Path(notebook_path).parent / ENGINE_FOLDER
    files = {}
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            if re.fullmatch(r"(ch\d\d_\w+|__init__)\.py", path.name) and path.is_file() \
                    and path.stat().st_size <= MAX_ENGINE_FILE:
                files[path.name] = path.read_text(encoding="utf-8", errors="replace")
    source = ("# written by kstore grade: the my_engine/ files handed in with this notebook\n"
              "import os as _os\n"
              f"_os.makedirs({ENGINE_FOLDER!r}, exist_ok=True)\n"
              f"for _name, _text in {json.dumps(files, ensure_ascii=True)}.items():\n"
              f"    with open(_os.path.join({ENGINE_FOLDER!r}, _name), 'w', encoding='utf-8') as _f:\n"
              "        _f.write(_text)\n")
    cell = {"cell_type": "code", "metadata": {"tags": ["engine-files"]}, "source": source,
            "outputs": [], "execution_count": None}
    return {**nb, "cells": [cell, *nb["cells"]]}

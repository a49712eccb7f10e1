"""Plug a learner's functions into the live engine, so an exercise that passes runs real appends,
lookups, retention passes, cleanings and replication — and one that is wrong fails where you see it.

Everything here is a context manager that swaps an engine function for the learner's (and puts the
engine's back on exit, even after an error):

    with live.demo("your encoder writes a real log") as d:
        with live.plug(live.record_encoding(write_varint, read_varint, write_varlong, encode_record)):
            log.append(...)                     # the engine now encodes with the learner's code
        d.expect(condition, "what should be true")

`demo()` prints ✔ lines as the demo goes and, if the engine fails with the learner's code, a ✘ line
with the error instead of a traceback: the notebook keeps running.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class Patch:
    target: Any        # a module or a class
    name: str
    value: Any


@contextlib.contextmanager
def plug(*patches: Patch | list[Patch]) -> Iterator[None]:
    """Apply patches (the engine uses the learner's functions) and undo them on exit."""
    flat: list[Patch] = []
    for p in patches:
        flat.extend(p if isinstance(p, list) else [p])
    saved = []
    try:
        for p in flat:
            saved.append((p.target, p.name, p.target.__dict__.get(p.name, _MISSING)))
            setattr(p.target, p.name, p.value)
        yield
    finally:
        for target, name, old in reversed(saved):
            if old is _MISSING:
                delattr(target, name)
            else:
                setattr(target, name, old)


_MISSING = object()


class DemoFailed(Exception):
    """Raised by `Demo.expect` when the engine, running the learner's code, does not do what it should."""


class Demo:
    def __init__(self, title: str):
        self.title = title
        self.ok = True

    def step(self, text: str) -> None:
        print(f"  ✔ {text}")

    def note(self, text: str) -> None:
        print(f"    {text}")

    def expect(self, condition: bool, text: str, why: str = "", actual: str = "") -> None:
        """Print ✔ text, or stop the demo with one line in two plain clauses:
        `✘ expected: <text>; your code: <actual>` (`actual`, else `why`, says what happened; an
        f-string `text` that shows the state reads well in both clauses)."""
        if condition:
            self.step(text)
        else:
            raise DemoFailed(f"expected: {text}; your code: {actual or why or 'not so'}")


@contextlib.contextmanager
def demo(title: str) -> Iterator[Demo]:
    """A live demo: its failure is printed (✘ ...) instead of raised, so the notebook goes on."""
    d = Demo(title)
    print(f"▶ {title}")
    try:
        yield d
    except DemoFailed as e:
        d.ok = False
        print(f"  ✘ {e}")
        print("  the engine ran your code and it went wrong here: run check(...) for the details")
    except NotImplementedError as e:
        d.ok = False
        print(f"  ✘ expected: {title}; your code: not written yet (NotImplementedError: {e}) — finish the "
              f"task first")
    except Exception as e:
        d.ok = False
        tb = traceback.extract_tb(e.__traceback__)
        where = f" (in {tb[-1].name}, {tb[-1].filename.split('/')[-1]}:{tb[-1].lineno})" if tb else ""
        print(f"  ✘ expected: {title}; your code: the engine failed with it, {type(e).__name__}: {e}{where}")
        print("  run check(...) above for the feedback on your functions")
    else:
        print("  done ✔")


@contextlib.contextmanager
def scratch(prefix: str = "kstore-demo-") -> Iterator[str]:
    """A temporary directory for a demo's partition directories, removed afterwards."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def hexdump(data: bytes, width: int = 16, limit: int = 256) -> str:
    lines = []
    for i in range(0, min(len(data), limit), width):
        chunk = data[i:i + width]
        lines.append(f"{i:04x}  {chunk.hex(' '):<{width * 3}} "
                     f"{''.join(chr(b) if 32 <= b < 127 else '.' for b in chunk)}")
    if len(data) > limit:
        lines.append(f"… ({len(data) - limit} more bytes)")
    return "\n".join(lines)


# ------------------------------------------------------------------ chapter plugs
def record_encoding(write_varint: Callable, read_varint: Callable, write_varlong: Callable,
                    encode_record: Callable) -> list[Patch]:
    """Ch. 01: the engine encodes (and reads) records with the learner's varints and encoder."""
    from .. import records, varint
    return [Patch(varint, "write_varint", write_varint), Patch(varint, "read_varint", read_varint),
            Patch(varint, "write_varlong", write_varlong),
            Patch(records, "encode_record", encode_record)]


class _LazyKeys:
    """The keys of an index, read on demand (the learner's binary search reads a few of them)."""

    def __init__(self, n: int, key: Callable[[int], int]):
        self.n, self.key, self.reads = n, key, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        self.reads += 1
        return self.key(i)


def sparse_index(index_entries: Callable | None = None, largest_lower_bound_slot: Callable | None = None,
                 offset_index_lookup: Callable | None = None) -> list[Patch]:
    """Ch. 02: the learner decides where `.index` entries go and serves the index lookups."""
    from ..index import AbstractIndex, OffsetIndex, OffsetPosition, TimestampOffset
    from ..segment import LogSegment
    patches = []
    if index_entries is not None:
        def append(self, largest_offset, largest_timestamp, shallow_offset_of_max_timestamp, records):
            if not records:
                return False
            history = self.__dict__.setdefault("_learner_appends", [])
            if self.log.size_in_bytes() == 0:
                self.rolling_based_timestamp = largest_timestamp
                history.clear()
            elif not history:    # a segment reopened after a restart: the learner's rule sees its batches
                history.extend((loc.last_offset, loc.size) for loc in self.log.batch_locations(0))
            self._ensure_offset_in_range(largest_offset)
            self.log.append(records)
            if largest_timestamp > self.max_timestamp_so_far:
                self._max_ts_so_far = TimestampOffset(largest_timestamp, shallow_offset_of_max_timestamp)
            history.append((largest_offset, len(records)))
            entries = index_entries(list(history), self.index_interval_bytes)
            if len(entries) > self.offset_index.entries:       # the learner's rule says: index this one
                offset, position = entries[-1]
                self.offset_index.append(offset, position)
                self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far)
                return True    # the log tells views of the new entry
            return False
        patches.append(Patch(LogSegment, "append", append))
    if largest_lower_bound_slot is not None:
        def slot_for(self, target, key=None):
            return largest_lower_bound_slot(_LazyKeys(self._entries, key or self._key), target)
        patches.append(Patch(AbstractIndex, "largest_lower_bound_slot_for", slot_for))
    if offset_index_lookup is not None:
        def lookup(self, target_offset):
            entries = [(e.offset, e.position) for e in self.entries_list()]
            return OffsetPosition(*offset_index_lookup(entries, self.base_offset, target_offset))
        patches.append(Patch(OffsetIndex, "lookup", lookup))
    return patches


def segment_rolling(segment_file_name: Callable | None = None, base_offset_from_file_name: Callable | None = None,
                    time_waited_for_roll: Callable | None = None, should_roll: Callable | None = None) -> list[Patch]:
    """Ch. 03: the engine names segment files, and decides when to roll, with the learner's code."""
    from .. import log_loader, segment as seg_mod
    from ..segment import LogSegment
    patches = []
    if segment_file_name is not None:
        def prefix(offset: int) -> str:
            name = segment_file_name(offset, ".log")
            if not name.endswith(".log"):
                raise ValueError(f"segment_file_name({offset}, '.log') returned {name!r}")
            return name[:-len(".log")]
        patches.append(Patch(seg_mod, "filename_prefix_from_offset", prefix))
    if base_offset_from_file_name is not None:
        def parse(name: str) -> int:
            import os
            return base_offset_from_file_name(os.path.basename(name))
        patches += [Patch(seg_mod, "offset_from_file_name", parse), Patch(log_loader, "offset_from_file_name", parse)]
    if time_waited_for_roll is not None:
        def waited(self, now, message_timestamp):
            self._load_first_batch_timestamp()
            return time_waited_for_roll(self.rolling_based_timestamp, message_timestamp, self.created_ms, now)
        patches.append(Patch(LogSegment, "time_waited_for_roll", waited))
    if should_roll is not None:
        def roll(self, p):
            return should_roll(self.size, p.messages_size, p.max_segment_bytes,
                               self.time_waited_for_roll(p.now, p.max_timestamp_in_messages),
                               p.max_segment_ms - self.roll_jitter_ms,
                               self.offset_index.is_full() or self.time_index.is_full(),
                               self.base_offset, p.max_offset_in_messages)
        patches.append(Patch(LogSegment, "should_roll", roll))
    return patches


def finding_messages(floor_segment: Callable | None = None, translate_offset: Callable | None = None,
                     offset_for_timestamp: Callable | None = None) -> list[Patch]:
    """Ch. 04: the log finds segments, positions and timestamps with the learner's functions."""
    import struct
    from ..file_records import LogOffsetPosition
    from ..log import Log
    from ..segment import LogSegment, TimestampAndOffset
    from .views import SegmentView
    patches = []
    if floor_segment is not None:
        def floor(self, offset):
            base = floor_segment(list(self._bases), offset)
            return None if base is None else self._segments[base]
        patches.append(Patch(Log, "floor_segment", floor))
    if translate_offset is not None:
        def translate(self, offset, starting_file_position=0):
            found = translate_offset(SegmentView(self), offset)
            if found is None:
                return None
            position, size = found
            (base_offset,) = struct.unpack(">q", self.log.read(position, 8))
            return LogOffsetPosition(base_offset, position, size)
        patches.append(Patch(LogSegment, "translate_offset", translate))
    if offset_for_timestamp is not None:
        def by_timestamp(self, timestamp, starting_offset=None):
            offset = offset_for_timestamp(SegmentView(self), timestamp)
            if offset is None:
                return None
            for batch in self.log.batches():
                if batch.base_offset <= offset <= batch.last_offset:
                    for r in batch.records():
                        if r.offset == offset:
                            epoch = batch.partition_leader_epoch
                            return TimestampAndOffset(r.timestamp, r.offset, epoch if epoch >= 0 else None)
            return TimestampAndOffset(-1, offset, None)
        patches.append(Patch(LogSegment, "find_offset_by_timestamp", by_timestamp))
    return patches


def crash_recovery(valid_prefix_length: Callable, rebuild_index: Callable) -> list[Patch]:
    """Ch. 05: `LogSegment.recover` (run by the log loader after an unclean shutdown) cuts the
    `.log` where the learner's function says and rebuilds the offset index with the learner's rule."""
    from ..index import TimestampOffset
    from ..segment import LogSegment

    def recover(self, epoch_cache=None, max_message_size=None):
        size = self.log.size_in_bytes()
        data = self.log.read(0, size)
        valid = valid_prefix_length(data)
        if not 0 <= valid <= size:
            raise ValueError(f"valid_prefix_length returned {valid} for a {size}-byte file")
        entries = rebuild_index(data[:valid], self.base_offset, self.index_interval_bytes)
        self.offset_index.reset()
        self.time_index.reset()
        for offset, position in entries:
            self.offset_index.append(offset, position)
        best = TimestampOffset(-1, self.base_offset)
        for batch in self.log.batch_headers(0, valid):
            if batch.max_timestamp > best.timestamp:
                best = TimestampOffset(batch.max_timestamp, batch.last_offset)
            if epoch_cache is not None and batch.partition_leader_epoch >= 0:
                latest = epoch_cache.latest_epoch()
                if latest is None or batch.partition_leader_epoch > latest:
                    epoch_cache.assign(batch.partition_leader_epoch, batch.base_offset)
        self._max_ts_so_far = best
        truncated = size - valid
        if truncated:
            self.log.truncate_to(valid)
        self.recovery_error = "cut by your valid_prefix_length" if truncated else None
        self.offset_index.trim_to_valid_size()
        self.time_index.maybe_append(best.timestamp, best.offset, skip_full_check=True)
        self.time_index.trim_to_valid_size()
        self.bytes_since_last_index_entry = 0
        self.rolling_based_timestamp = None
        return truncated

    return [Patch(LogSegment, "recover", recover)]


def retention_rules(deletable_segments: Callable | None = None, retention_time_breached: Callable | None = None,
                    size_breach_count: Callable | None = None) -> list[Patch]:
    """Ch. 06: the log's retention pass (`Log.delete_old_segments`) asks the learner's functions."""
    from .. import retention
    patches = []
    if deletable_segments is not None:
        def walk(segments, predicate, *, high_watermark, log_end_offset):
            return deletable_segments(list(segments), predicate, high_watermark, log_end_offset)
        patches.append(Patch(retention, "deletable_segments", walk))
    if retention_time_breached is not None:
        def time_rule(now_ms, retention_ms):
            return lambda segment, _next: retention_time_breached(segment, now_ms, retention_ms)
        patches.append(Patch(retention, "retention_ms_breached", time_rule))
    if size_breach_count is not None:
        def size_rule(log_size, retention_bytes):
            seen: dict[int, int] = {}          # base offset → size (asked twice, it answers the same)

            def predicate(segment, _next):
                seen[segment.base_offset] = segment.size
                prefix = [size for base, size in sorted(seen.items()) if base <= segment.base_offset]
                # what is not seen yet counts as one more segment: the count depends only on the prefix
                sizes = prefix + [max(0, log_size - sum(prefix))]
                return size_breach_count(sizes, retention_bytes) >= len(prefix)
            return predicate
        patches.append(Patch(retention, "retention_size_breached", size_rule))
    return patches


def compaction(should_retain_record: Callable | None = None,
               group_segments_by_size: Callable | None = None,
               choose_filthiest: Callable | None = None) -> list[Patch]:
    """Ch. 07: the cleaner keeps records, groups segments, and picks the log to clean by the
    learner's rules."""
    from .. import cleaner
    patches = []
    if choose_filthiest is not None:
        patches.append(Patch(cleaner, "choose_filthiest", choose_filthiest))
    if should_retain_record is not None:
        patches.append(Patch(cleaner, "should_retain_record", should_retain_record))
    if group_segments_by_size is not None:
        patches.append(Patch(cleaner, "group_segments_by_size", group_segments_by_size))
    return patches


def cleaner_choices(root: str) -> tuple[dict[str, float], list[str]]:
    """Four compacted logs with known dirty ratios — `even` exactly 0.5, `big` 0.75 with the most dirty
    bytes, `small` 1.0, `lagging` 0.2 but older than its max.compaction.lag.ms — and the logs the
    cleaner thread picks, round after round, until none qualifies."""
    from ..clock import ManualClock
    from ..log_manager import LogManager
    clock = ManualClock(1_700_000_000_000)
    logs = LogManager(root, {"segment.bytes": 1 << 20}, clock)
    try:
        def fill(name, clean, dirty, config=None):
            log = logs.get_or_create_log(name, 0, {"cleanup.policy": "compact", **(config or {})})
            for i in range(clean):                    # distinct keys: a cleaning keeps every byte
                log.append([(f"c{i:03d}", "v" * 20)])
            if clean:
                log.roll()
                logs.cleaner.clean_log(log)
            for i in range(dirty):
                log.append([(f"d{i:03d}", "v" * 20)])
            log.roll()
        fill("even", 4, 4)
        fill("big", 4, 12)
        fill("small", 0, 3)
        fill("lagging", 8, 2, {"max.compaction.lag.ms": 5_000})
        clock.advance(60_000)
        ratios = {t.log.topic: round(t.cleanable_ratio, 3)
                  for t in logs.cleaner.logs_to_clean(logs.logs().values())}
        order = []
        while len(order) < 6 and (done := logs.cleaner.clean_filthiest(logs.logs().values())) is not None:
            order.append(done.log.topic)
        return ratios, order
    finally:
        logs.shutdown()


def key_partitioning(partition_for_key: Callable) -> list[Patch]:
    """Ch. 08: the producer's partitioner places keyed records with the learner's function."""
    from .. import partitioner
    return [Patch(partitioner, "partition_for_key", partition_for_key)]


def committed_offsets(partition_for: Callable | None = None, encode_offset_commit: Callable | None = None,
                      decode_offset_commit: Callable | None = None) -> list[Patch]:
    """Ch. 08: the group coordinator places groups, and writes and reads `__consumer_offsets`
    records, with the learner's functions."""
    from .. import group_coordinator
    from ..coordinator_records import OffsetCommitKey, OffsetCommitValue
    patches = []
    if partition_for is not None:
        patches.append(Patch(group_coordinator, "partition_for", partition_for))
    if encode_offset_commit is not None:
        original_key, original_value = OffsetCommitKey.encode, OffsetCommitValue.encode

        def encode_key(self, version: int = 1) -> bytes:
            if version != 1:
                return original_key(self, version)
            return encode_offset_commit(self.group, self.topic, self.partition, 0, -1, "", 0)[0]

        def encode_value(self) -> bytes:
            if self.expire_timestamp is not None:      # value v1: not part of the exercise
                return original_value(self)
            return encode_offset_commit("", "", 0, self.offset, self.leader_epoch, self.metadata,
                                        self.commit_timestamp)[1]
        patches += [Patch(OffsetCommitKey, "encode", encode_key), Patch(OffsetCommitValue, "encode", encode_value)]
    if decode_offset_commit is not None:
        any_key = OffsetCommitKey("group", "topic", 0).encode()

        def decode_value(value: bytes) -> OffsetCommitValue:
            _, _, _, offset, epoch, metadata, ts = decode_offset_commit(any_key, value)
            return OffsetCommitValue(offset, metadata, ts, epoch)
        patches.append(Patch(group_coordinator, "decode_offset_commit_value", decode_value))
    return patches


def replication_rules(leader_high_watermark: Callable | None = None, follower_high_watermark: Callable | None = None,
                      is_caught_up: Callable | None = None, may_join_isr: Callable | None = None) -> list[Patch]:
    """Ch. 09: the leader moves its HW, followers set theirs, and the ISR shrinks and grows, by the
    learner's rules. The leader hands its rule the LEO of *every* replica and the ISR."""
    from .. import partition as part_mod, replica_fetcher
    from ..partition import Partition
    patches = []
    if leader_high_watermark is not None:
        def maybe_increment_leader_hw(self) -> bool:
            with self.lock:
                if not self.is_leader:
                    return False
                leos = {self.broker_id: self.log.log_end_offset}
                leos.update({b: st.log_end_offset for b, st in self.remote.items()})
                new_hw = leader_high_watermark(leos, list(self.isr), self.min_insync_replicas)
                if new_hw is None or new_hw <= self.high_watermark:
                    return False
                self.log.maybe_increment_high_watermark(min(new_hw, self.log.log_end_offset))
                self.hw_changed.notify_all()
                return True
        patches.append(Patch(Partition, "maybe_increment_leader_hw", maybe_increment_leader_hw))
    if follower_high_watermark is not None:
        patches.append(Patch(replica_fetcher, "follower_high_watermark", follower_high_watermark))
    if is_caught_up is not None:
        patches.append(Patch(part_mod, "is_caught_up", is_caught_up))
    if may_join_isr is not None:
        patches.append(Patch(part_mod, "may_join_isr", may_join_isr))
    return patches


def producer_decisions(classify_batch: Callable) -> list[Patch]:
    """Ch. 09: the leader's check of an idempotent producer's batch (duplicate, stale epoch, out of
    order, append) is the learner's rule; a DUPLICATE is answered with the matching cached batch."""
    from .. import producer_state

    def decide(entry, epoch, first_seq, last_seq):
        cached = None if entry is None else [(b.first_seq, b.last_seq, b.first_offset, b.last_offset)
                                             for b in entry.batches]
        outcome = classify_batch(cached, None if entry is None else entry.producer_epoch, epoch,
                                 first_seq, last_seq)
        same = [b for b in (entry.batches if entry else ()) if b.first_seq == first_seq]
        return outcome, (same[0] if outcome == "DUPLICATE" and same else None)
    return [Patch(producer_state, "decide", decide)]


def acks_rules(acks_decision: Callable) -> list[Patch]:
    """Ch. 09: leaders decide what to do with a produce request's `acks` by the learner's rule."""
    from .. import partition as part_mod
    return [Patch(part_mod, "acks_decision", acks_decision)]


def read_committed_rule(read_committed: Callable) -> list[Patch]:
    """Ch. 09 (ex09.7): kstore's consumer and Spark source drop aborted transactions' records by the
    learner's rule (Kafka's CompletedFetch does this in the client; the broker only sends the
    aborted-transactions list)."""
    from .. import completed_fetch
    return [Patch(completed_fetch, "read_committed", read_committed)]


def acks_scenarios(root: str) -> dict:
    """Three brokers. `t` (3 replicas, min.insync.replicas=2) and `single` (1 replica, min.insync 2):
    which produce requests are answered at once, which wait for the followers, which are refused
    once the followers stopped fetching."""
    from ..clock import ManualClock
    from ..cluster import Cluster
    cluster = Cluster(root, num_brokers=3, clock=ManualClock(1_700_000_000_000))
    out = {}
    try:
        cluster.create_topic("t", 1, 3, {"min.insync.replicas": 2})
        cluster.create_topic("single", 1, 1, {"min.insync.replicas": 2})
        one, every = cluster.produce("t", 0, ["a1"], acks=1), cluster.produce("t", 0, ["aall"], acks="all")
        out["acks=1 done before replication"] = one.done and one.error is None
        out["acks=all done before replication"] = every.done
        cluster.replicate("t", rounds=2)
        out["acks=all done after replication"] = every.done and every.error is None
        single = cluster.produce("single", 0, ["s"], acks="all")
        out["single acks=all"] = "ok" if single.done and single.error is None else type(single.error).__name__
        cluster.produce("t", 0, ["lagging"], acks=1)
        for _ in range(9):                         # the followers stop fetching: the ISR shrinks to [leader]
            cluster.advance(5_000)
        out["ISR after the followers stopped"] = cluster.isr("t")
        refused = cluster.produce("t", 0, ["refused?"], acks="all")
        out["acks=all with ISR below min"] = type(refused.error).__name__ if refused.error else "accepted"
        still = cluster.produce("t", 0, ["still"], acks=1)
        out["acks=1 with ISR below min"] = "ok" if still.done and still.error is None else type(still.error).__name__
        return out
    finally:
        cluster.shutdown()


def leader_epochs(end_offset_for: Callable | None = None, truncation_offset: Callable | None = None) -> list[Patch]:
    """Ch. 10: leaders answer OffsetsForLeaderEpoch, and followers truncate, with the learner's code."""
    from .. import replica_fetcher
    from ..leader_epoch import LeaderEpochFileCache
    patches = []
    if end_offset_for is not None:
        def answer(self, requested_epoch, log_end_offset):
            with self._lock:
                return tuple(end_offset_for([tuple(e) for e in self._entries], requested_epoch, log_end_offset))
        patches.append(Patch(LeaderEpochFileCache, "end_offset_for", answer))
    if truncation_offset is not None:
        patches.append(Patch(replica_fetcher, "truncation_offset", truncation_offset))
    return patches


def elections(elect_leader: Callable) -> list[Patch]:
    """Ch. 10: the controller decides every leader election with the learner's rule. The learner's
    function returns (leader, "clean" | "unclean" | "offline"); the controller asks it the way it asks
    its own `elect_leader`: first without, then (if the topic allows) with unclean election."""
    from .. import controller

    def decide(assignment, isr, live, unclean):
        return elect_leader(list(assignment), list(isr), set(live), unclean)[0]
    return [Patch(controller, "elect_leader", decide)]


def election_scenarios(root: str) -> dict:
    """Three brokers, three topics led by broker 0. `safe` and `risky` (unclean election allowed) have
    followers that stopped fetching (ISR [0]); `c`'s followers are in sync. Broker 1 goes down, then
    broker 0: `c` needs a clean election, `safe` must go offline, `risky` elects broker 2 uncleanly."""
    from ..clock import ManualClock
    from ..cluster import Cluster
    cluster = Cluster(root, num_brokers=3, clock=ManualClock(1_700_000_000_000))
    try:
        cluster.create_topic("c", 1, 3)
        cluster.create_topic("safe", 1, 3)
        cluster.create_topic("risky", 1, 3, {"unclean.leader.election.enable": True})
        for topic in ("c", "safe", "risky"):
            cluster.produce(topic, 0, ["committed"], acks="all")
        cluster.replicate(rounds=3)
        for topic in ("safe", "risky"):       # followers stop fetching; the leader drops them from the ISR
            cluster.produce(topic, 0, ["only on the leader"], acks=1)
        for _ in range(9):
            cluster.advance(5_000)
        cluster.crash(1)                      # a follower of all three goes down
        isr_before = {t: cluster.isr(t) for t in ("c", "safe", "risky")}
        cluster.crash(0)                      # the leader of all three
        out = {"isr_before": isr_before}
        for topic in ("c", "safe", "risky"):
            out[topic] = {"leader": cluster.leader(topic), "isr": cluster.isr(topic),
                          "alive": cluster.leader(topic) in cluster.live_brokers()}
        return out
    finally:
        cluster.shutdown()


def kip101_scenario_1(root: str, truncation: str) -> dict:
    """KIP-101 scenario 1 on a stepped 2-broker cluster: an acknowledged record, a follower restart,
    a leader failure. Returns what every replica holds at the end, and what happened."""
    from ..cluster import Cluster
    c = Cluster(root, num_brokers=2, truncation=truncation)
    try:
        c.create_topic("kip101", 1, 2, {"min.insync.replicas": 1})
        c.produce("kip101", 0, ["m0"])
        c.replicate(rounds=2)
        c.advance(5000)                                   # both checkpoint HW 1
        acked = c.produce("kip101", 0, ["m1"])            # acks=all
        c.fetch(1, "kip101")                              # B gets m1 (HW 1)
        c.fetch(1, "kip101")                              # A learns B has m1: HW 2, m1 acknowledged
        c.advance(5000)
        steps = [f"m1 acknowledged to the producer: {acked.done and acked.error is None}",
                 c.describe("kip101")]
        c.bounce(1)                                       # B restarts
        steps.append(f"B restarts: {c.last_truncations[0].detail}")
        c.crash(0)                                        # A dies: B becomes leader
        c.restart(0)
        steps.append(f"A fails, B leads; A comes back: {c.last_truncations[0].detail if c.last_truncations else '-'}")
        c.replicate(rounds=2)
        values = {r.broker_id: [v.decode() for _, v in r.values] for r in c.state("kip101")}
        return {"acked": acked.done and acked.error is None, "values": values, "steps": steps,
                "consumed": [r.value.decode() for r in c.consume("kip101")]}
    finally:
        c.shutdown()


def kip101_scenario_2(root: str, truncation: str) -> dict:
    """KIP-101 scenario 2: both replicas lose power; the follower (which lost an unflushed record)
    comes back first and leads. Returns what every replica holds at offset 0 and 1."""
    from ..cluster import Cluster
    c = Cluster(root, num_brokers=2, truncation=truncation)
    try:
        c.create_topic("kip101", 1, 2, {"min.insync.replicas": 1})
        c.produce("kip101", 0, ["m0"])
        c.replicate(rounds=2)
        c.brokers[1].get_log("kip101", 0).flush()         # B's disk has m0 only
        c.produce("kip101", 0, ["m1"])
        c.replicate(rounds=2)
        c.brokers[0].get_log("kip101", 0).flush()         # A's disk has m0, m1
        c.advance(5000)
        c.crash(1, lose_unflushed=True, notify_controller=False)
        c.crash(0, lose_unflushed=True)                   # power loss on both
        c.restart(1)                                      # B first: leader of epoch 1, without m1
        c.produce("kip101", 0, ["m2"])                    # m2 lands at offset 1
        c.restart(0)
        detail = c.last_truncations[0].detail if c.last_truncations else "-"
        c.replicate(rounds=2)
        values = {r.broker_id: [v.decode() for _, v in r.values] for r in c.state("kip101")}
        return {"values": values, "steps": [f"A comes back as a follower: {detail}"]}
    finally:
        c.shutdown()


class _Fd:
    """A socket as the learner's send_range sees it: something with `fileno()`."""

    def __init__(self, fd: int):
        self._fd = fd

    def fileno(self) -> int:
        return self._fd


def zero_copy(fetch_range: Callable | None = None, send_range: Callable | None = None) -> list[Patch]:
    """Ch. 11: segment reads pick their byte range, and file slices are sent, with the learner's code."""
    from ..file_records import FileSlice
    from ..segment import FetchDataInfo, LogOffsetMetadata, LogSegment, _NO_MAX_POSITION
    from .views import SegmentView
    patches = []
    if fetch_range is not None:
        def read(self, start_offset, max_size, max_position=None, min_one_message=False):
            found = fetch_range(SegmentView(self, with_translate=True), start_offset, max_size, min_one_message)
            if found is None:
                return None
            position, size = found
            if max_position is _NO_MAX_POSITION:
                size = 0
            elif max_position is not None:
                size = max(0, min(size, max_position - position))
            return FetchDataInfo(LogOffsetMetadata(start_offset, self.base_offset, position),
                                 self.log.slice(position, size))
        patches.append(Patch(LogSegment, "read", read))
    if send_range is not None:
        def send_to(self, sock_fd, offset=0, count=None):
            count = self.size - offset if count is None else count
            return send_range(_Fd(sock_fd), self.file.fd, self.position + offset, count)
        patches.append(Patch(FileSlice, "send_to", send_to))
    return patches


def fetch_serving(serve_fetch: Callable) -> list[Patch]:
    """Ch. 12: every KafkaServer sends its Fetch responses' file slices with the learner's code."""
    from ..server import KafkaServer
    return [Patch(KafkaServer, "fetch_sender", staticmethod(serve_fetch))]


@dataclass
class ServedFetches:
    """What `kafka_python_through` saw: the values produced and consumed, and the plugged calls."""
    produced: list[str]
    consumed: list[str]
    calls: list[tuple[int, int, Any]]        # (start, end, what the fetch sender returned)
    error: str | None                        # what the consumer raised, if it did

    @property
    def wrong_return(self) -> tuple[int, int, Any] | None:
        """The first call that returned something other than end − start (the bytes the response
        had promised), or None."""
        return next(((s, e, r) for s, e, r in self.calls if not isinstance(r, BaseException) and r != e - s), None)

    def summary(self) -> str:
        """What went wrong, in one clause (for `Demo.expect` and the tests' feedback)."""
        if self.error:
            return f"the consumer failed after {len(self.consumed)} records: {self.error}"
        if self.wrong_return:
            s, e, r = self.wrong_return
            return (f"serve_fetch(sock, fd, {s}, {e}) returned {r!r}, not {e - s}, so the broker closed the "
                    f"connection (the response had promised {e - s} bytes); the consumer had read "
                    f"{len(self.consumed)} records")
        wrong = next((i for i, (a, b) in enumerate(zip(self.consumed, self.produced)) if a != b), None)
        if wrong is not None:
            return f"record #{wrong} came back as {self.consumed[wrong]!r}, not {self.produced[wrong]!r}"
        return f"the consumer read {len(self.consumed)} of {len(self.produced)} records before giving up"


def kafka_python_through(fetch_sender: Callable | None, root: str, records: int = 300,
                         fetch_bytes: int = 2048, timeout_s: float = 15.0,
                         busy_socket: int | None = None) -> ServedFetches:
    """Ch. 12's capstone: a broker on 127.0.0.1 (a `KafkaServer` on a free port) whose Fetch
    responses send their file slices with `fetch_sender(sock, file_fd, start, end)`; kafka-python's
    KafkaProducer writes `records` values and a KafkaConsumer (small fetches, so record batches are
    cut at the end of many responses) reads them back through it. `fetch_sender=None`: the server's
    own (`KafkaServer.fetch_sender`, which `fetch_serving` plugs). `busy_socket=n`: while the
    consumer reads, `os.sendfile` sends at most n bytes a call, as a socket with a full send
    buffer would (partial sends, which a fast loopback socket seldom makes)."""
    import os
    from kafka import KafkaConsumer, KafkaProducer

    from ..broker import Broker
    from ..server import KafkaServer
    calls: list[tuple[int, int, Any]] = []

    def sender(sock, file_fd, start, end):
        try:
            result = fetch_sender(sock, file_fd, start, end)
        except BaseException as e:          # the server closes the connection; the demo says why
            calls.append((start, end, e))
            raise
        calls.append((start, end, result))
        return result

    def sender_failed() -> bool:              # raised, or sent a count the response had not promised
        return any(isinstance(r, BaseException) or r != e - s for s, e, r in calls)

    produced = [f"reading {i:04d} " + "·" * (i % 40) for i in range(records)]
    consumed: list[str] = []
    error = None
    broker = Broker(f"{root}/logs", config={"num.partitions": 1})
    server = KafkaServer(broker, "127.0.0.1", 0,
                         fetch_sender=sender if fetch_sender is not None else None).start_in_thread()
    bootstrap = f"127.0.0.1:{server.port}"
    try:
        producer = KafkaProducer(bootstrap_servers=bootstrap, batch_size=1024, linger_ms=5)
        for value in produced:
            producer.send("readings", value.encode())
        producer.flush(timeout_s)
        producer.close(timeout_s)
        consumer = KafkaConsumer("readings", bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                 max_partition_fetch_bytes=fetch_bytes, fetch_max_bytes=fetch_bytes,
                                 request_timeout_ms=int(timeout_s * 1000) + 1000)
        deadline = time.monotonic() + timeout_s
        real_sendfile = os.sendfile
        if busy_socket:
            os.sendfile = lambda out_fd, in_fd, offset, count: real_sendfile(out_fd, in_fd, offset,
                                                                             min(count, busy_socket))
        try:
            while len(consumed) < len(produced) and time.monotonic() < deadline and not sender_failed():
                for messages in consumer.poll(timeout_ms=200).values():
                    consumed += [m.value.decode(errors="replace") for m in messages]
        except Exception as e:                  # a corrupt response: kafka-python says why
            error = f"{type(e).__name__}: {e}"
        finally:
            os.sendfile = real_sendfile
            consumer.close()
    finally:
        server.stop()
        broker.shutdown()
    failed = next((r for _, _, r in calls if isinstance(r, BaseException)), None)
    if failed is not None and error is None:
        error = f"serve_fetch raised {type(failed).__name__}: {failed}"
    return ServedFetches(produced, consumed, calls, error)

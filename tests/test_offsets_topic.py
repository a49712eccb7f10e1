"""Committed offsets in `__consumer_offsets` (reference §8): the bytes of every record, where they go,
what survives a crash, what compaction and expiration leave, and what bad commits do (nothing).

The `.log` files are read here with a decoder written from the batch layout (§1.2, §1.6) and the
message schemas (§8.3), not with kstore's decoders.
"""

from __future__ import annotations

import os
import select
import signal
import struct
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from kstore import ManualClock
from kstore.broker import Broker
from kstore.consumer import Consumer
from kstore.coordinator_records import (GroupMetadataKey, OffsetCommitKey, OffsetCommitValue,
                                        decode_key, decode_offset_commit_value, partition_for)
from kstore.errors import CommitFailedError, InvalidGroupIdError, LogError
from kstore.file_records import FileRecords
from kstore.group_coordinator import (OFFSETS_TOPIC, CoordinatorConfig, GroupCoordinator,
                                      OffsetAndMetadata)

T0 = 1_700_000_000_000
DAY = 86_400_000
RETENTION_MS = 10080 * 60_000          # offsets.retention.minutes = 7 days
VENV_PYTHON = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"


# ------------------------------------------------------------------------------------------
# An independent reader: raw segment bytes → records → OffsetCommit / GroupMetadata structs
# ------------------------------------------------------------------------------------------
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    return (value >> 1) ^ -(value & 1), pos       # zigzag


def raw_batches(data: bytes):
    """Yield (header dict, [record dicts]) for every v2 batch in a segment's bytes."""
    pos = 0
    while pos + 12 <= len(data):
        base_offset, batch_length = struct.unpack_from(">qi", data, pos)
        end = pos + 12 + batch_length
        if batch_length < 49 or end > len(data):
            break
        (leader_epoch, magic, crc, attributes, last_delta, base_ts, max_ts, producer_id,
         producer_epoch, base_seq, count) = struct.unpack_from(">ibIhiqqqhii", data, pos + 12)
        assert magic == 2
        assert attributes & 0x07 == 0, "offsets topic batches are uncompressed"
        header = dict(base_offset=base_offset, attributes=attributes, last_offset_delta=last_delta,
                      base_timestamp=base_ts, max_timestamp=max_ts, count=count,
                      control=bool(attributes & 0x20), delete_horizon=bool(attributes & 0x40))
        records = []
        p = pos + 61
        for _ in range(count):
            length, p = _varint(data, p)
            rec_end = p + length
            p += 1                                   # record attributes
            ts_delta, p = _varint(data, p)
            off_delta, p = _varint(data, p)
            klen, p = _varint(data, p)
            key = None if klen < 0 else data[p:p + klen]
            p += max(klen, 0)
            vlen, p = _varint(data, p)
            value = None if vlen < 0 else data[p:p + vlen]
            p += max(vlen, 0)
            nheaders, p = _varint(data, p)
            assert nheaders == 0
            assert p == rec_end
            records.append(dict(offset=base_offset + off_delta, timestamp=base_ts + ts_delta,
                                key=key, value=value))
        assert p == end
        yield header, records
        pos = end


def segment_files(partition_dir: Path) -> list[Path]:
    return sorted(partition_dir.glob("*.log"))


def raw_records(partition_dir: Path, files: list[Path] | None = None) -> list[dict]:
    out = []
    for f in files if files is not None else segment_files(partition_dir):
        for _, records in raw_batches(f.read_bytes()):
            out.extend(records)
    return out


def _string(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from(">h", buf, pos)
    assert n >= 0
    return buf[pos + 2:pos + 2 + n].decode("utf-8"), pos + 2 + n


def parse_key(key: bytes):
    (version,) = struct.unpack_from(">h", key, 0)
    if version in (0, 1):
        group, pos = _string(key, 2)
        topic, pos = _string(key, pos)
        (partition,) = struct.unpack_from(">i", key, pos)
        assert pos + 4 == len(key)
        return ("offset", group, topic, partition)
    if version == 2:
        group, pos = _string(key, 2)
        assert pos == len(key)
        return ("group", group)
    raise AssertionError(f"unexpected key version {version}")


def parse_value(value: bytes) -> dict:
    (version,) = struct.unpack_from(">h", value, 0)
    (offset,) = struct.unpack_from(">q", value, 2)
    pos = 10
    out = {"version": version, "offset": offset, "leader_epoch": None, "expire": None}
    if version == 3:
        (out["leader_epoch"],) = struct.unpack_from(">i", value, pos)
        pos += 4
    out["metadata"], pos = _string(value, pos)
    (out["commit_ts"],) = struct.unpack_from(">q", value, pos)
    pos += 8
    if version == 1:
        (out["expire"],) = struct.unpack_from(">q", value, pos)
        pos += 8
    assert pos == len(value), f"v{version}: {len(value) - pos} trailing bytes"
    return out


def latest_by_key(records: list[dict]) -> dict:
    """What a replay of the partition concludes: latest value per key, tombstones remove."""
    state = {}
    for r in records:
        k = parse_key(r["key"])
        if r["value"] is None:
            state.pop(k, None)
        else:
            state[k] = parse_value(r["value"])
    return state


def offsets_dir(broker: Broker, partition: int) -> Path:
    return Path(broker.log_dir) / f"{OFFSETS_TOPIC}-{partition}"


def leos(broker: Broker) -> list[int]:
    return [broker.get_log(OFFSETS_TOPIC, p).log_end_offset for p in range(50)]


@pytest.fixture
def clock():
    return ManualClock(T0)


@pytest.fixture
def broker(tmp_path, clock):
    b = Broker(str(tmp_path / "logs"), clock=clock)
    yield b
    b.shutdown()


# ------------------------------------------------------------------------------------------
# §8.3 bytes
# ------------------------------------------------------------------------------------------
KEY_BYTES = bytes.fromhex("0001" "0008") + b"my-group" + bytes.fromhex("0006") + b"orders" + \
    bytes.fromhex("00000000")
VALUE_BYTES = bytes.fromhex("0003" "000000000000002a" "00000000" "0000" "0000018bcfe56800")


def test_the_reference_example_bytes():
    assert len(KEY_BYTES) == 24 and len(VALUE_BYTES) == 24
    assert struct.unpack(">q", VALUE_BYTES[-8:])[0] == 1_700_000_000_000
    assert OffsetCommitKey("my-group", "orders", 0).encode() == KEY_BYTES
    assert OffsetCommitValue(42, "", 1_700_000_000_000, 0).encode() == VALUE_BYTES
    assert decode_key(KEY_BYTES) == OffsetCommitKey("my-group", "orders", 0)
    v = decode_offset_commit_value(VALUE_BYTES)
    assert (v.offset, v.metadata, v.commit_timestamp, v.leader_epoch, v.expire_timestamp) == \
        (42, "", 1_700_000_000_000, 0, None)
    # the test's own decoder agrees
    assert parse_key(KEY_BYTES) == ("offset", "my-group", "orders", 0)
    assert parse_value(VALUE_BYTES) == {"version": 3, "offset": 42, "leader_epoch": 0,
                                        "metadata": "", "commit_ts": T0, "expire": None}


def test_a_commit_writes_exactly_those_bytes_into_the_groups_partition(broker):
    broker.create_topic("orders", 1)
    gc = broker.group_coordinator
    assert gc.partition_for("my-group") == partition_for("my-group") == 12
    gc.commit_offsets("my-group", {("orders", 0): OffsetAndMetadata(42, "", leader_epoch=0)})
    files = segment_files(offsets_dir(broker, 12))
    assert [f.name for f in files] == ["00000000000000000000.log"]
    batches = list(raw_batches(files[0].read_bytes()))
    assert len(batches) == 1
    header, records = batches[0]
    assert header["base_offset"] == 0 and header["count"] == 1 and not header["control"]
    assert records[0]["key"] == KEY_BYTES
    assert records[0]["value"] == VALUE_BYTES
    assert records[0]["timestamp"] == T0
    # kstore's own reader sees the same batch
    kbatches = list(FileRecords(str(files[0])).batches())
    assert len(kbatches) == 1 and kbatches[0].records()[0].key == KEY_BYTES
    # no other partition of the topic got anything
    assert [p for p, leo in enumerate(leos(broker)) if leo] == [12]


def test_default_leader_epoch_is_minus_one_and_metadata_is_kept(broker):
    broker.create_topic("orders", 2)
    gc = broker.group_coordinator
    gc.commit_offsets("g1", {("orders", 1): OffsetAndMetadata(7, "checkpoint é")})
    records = raw_records(offsets_dir(broker, partition_for("g1")))
    assert parse_key(records[0]["key"]) == ("offset", "g1", "orders", 1)
    assert parse_value(records[0]["value"]) == {"version": 3, "offset": 7, "leader_epoch": -1,
                                                "metadata": "checkpoint é", "commit_ts": T0,
                                                "expire": None}


def test_value_v1_with_an_expire_timestamp(broker, clock):
    broker.create_topic("orders", 1)
    gc = broker.group_coordinator
    gc.commit_offsets("g-exp", {("orders", 0): OffsetAndMetadata(9, "m", leader_epoch=3)},
                      expire_timestamp=T0 + 1000)
    p = partition_for("g-exp")
    [record] = raw_records(offsets_dir(broker, p))
    expected = (struct.pack(">hq", 1, 9) + struct.pack(">h", 1) + b"m" +
                struct.pack(">qq", T0, T0 + 1000))
    assert record["value"] == expected and len(expected) == 29
    assert parse_value(record["value"]) == {"version": 1, "offset": 9, "leader_epoch": None,
                                            "metadata": "m", "commit_ts": T0, "expire": T0 + 1000}
    assert OffsetCommitValue(9, "m", T0, 3, T0 + 1000).encode() == expected   # v1 has no epoch
    om = gc.fetch_offsets("g-exp", [("orders", 0)])[("orders", 0)]
    assert (om.offset, om.expire_timestamp) == (9, T0 + 1000)
    # an explicit expire timestamp wins over offsets.retention.minutes
    clock.advance(999)
    assert gc.expire_offsets() == 0
    clock.advance(1)
    assert gc.expire_offsets() == 2          # the offset tombstone + the group tombstone
    assert gc.fetch_offsets("g-exp") == {}


def test_group_metadata_key_v2_bytes():
    assert GroupMetadataKey("my-group").encode() == bytes.fromhex("0002" "0008") + b"my-group"
    assert decode_key(bytes.fromhex("0002" "0008") + b"my-group") == GroupMetadataKey("my-group")
    assert parse_key(GroupMetadataKey("g").encode()) == ("group", "g")


# ------------------------------------------------------------------------------------------
# The topic
# ------------------------------------------------------------------------------------------
def test_the_offsets_topic_has_50_compacted_partitions_with_100_mib_segments(broker):
    assert OFFSETS_TOPIC not in broker.topics(include_internal=True)
    broker.group_coordinator
    info = broker.describe_topic(OFFSETS_TOPIC)
    assert info.partition_count == 50 and info.internal
    assert info.configs["cleanup.policy"] == "compact"
    assert int(info.configs["segment.bytes"]) == 104857600
    assert info.configs["compression.type"] == "producer"
    assert OFFSETS_TOPIC in broker.topics(include_internal=True)
    assert OFFSETS_TOPIC not in broker.topics()
    for p in range(50):
        log = broker.get_log(OFFSETS_TOPIC, p)
        assert log.config.cleanup_policy == ("compact",)
        assert log.config.segment_bytes == 104857600
        assert (offsets_dir(broker, p) / "partition.metadata").read_text() == \
            f"version: 0\ntopic_id: {info.topic_id}"
    assert not (Path(broker.log_dir) / f"{OFFSETS_TOPIC}-50").exists()


def test_coordinator_config_sets_the_offsets_topic_segment_bytes(broker):
    gc = GroupCoordinator(broker, CoordinatorConfig(offsets_topic_segment_bytes=4096,
                                                    offsets_topic_num_partitions=5))
    assert gc.num_partitions == 5
    assert broker.partition_count(OFFSETS_TOPIC) == 5
    assert broker.get_log(OFFSETS_TOPIC, 0).config.segment_bytes == 4096
    assert gc.partition_for("my-group") == partition_for("my-group", 5) == 1906497762 % 5 == 2


def test_commits_of_many_groups_land_in_their_partitions(broker):
    broker.create_topic("orders", 3)
    gc = broker.group_coordinator
    groups = [f"group-{i}" for i in range(40)] + ["my-group", "test-group", "g\U0001F600"]
    for i, g in enumerate(groups):
        gc.commit_offsets(g, {("orders", i % 3): i + 1})
    seen = {}
    for p in range(50):
        for r in raw_records(offsets_dir(broker, p)):
            kind, group, topic, part = parse_key(r["key"])
            assert partition_for(group) == p, group
            seen[group] = (topic, part, parse_value(r["value"])["offset"])
    assert seen == {g: ("orders", i % 3, i + 1) for i, g in enumerate(groups)}


# ------------------------------------------------------------------------------------------
# Commit, kill -9, restart
# ------------------------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import sys, time
    from kstore import ManualClock
    from kstore.broker import Broker
    from kstore.group_coordinator import OffsetAndMetadata
    clock = ManualClock(1_700_000_000_000)
    broker = Broker(sys.argv[1], clock=clock)
    broker.create_topic("orders", 4)
    broker.create_topic("payments", 2)
    gc = broker.group_coordinator
    for round_ in range(5):                       # later commits overwrite earlier ones
        for g in range(6):
            offsets = {("orders", p): OffsetAndMetadata(100 * g + 10 * round_ + p, f"r{round_}")
                       for p in range(4)}
            offsets[("payments", g % 2)] = OffsetAndMetadata(1000 + g + round_, "", leader_epoch=g)
            gc.commit_offsets(f"group-{g}", offsets)
        clock.advance(1000)
    gc.commit_offsets("doomed", {("orders", 0): 5})
    clock.advance(7 * 24 * 3600 * 1000)
    gc.commit_offsets("survivor", {("orders", 1): 77})
    expired = gc.expire_offsets()                 # "doomed" and group-* expire, "survivor" stays
    print("EXPIRED", expired, flush=True)
    print("COMMITTED", flush=True)
    time.sleep(120)
""")


def start_child_and_wait_for(script: str, log_dir: Path, tmp_path: Path, marker: str = "COMMITTED",
                             timeout_s: float = 60.0) -> tuple[subprocess.Popen, list[str]]:
    """Start a child Python on `script`, return once it printed `marker` (its earlier lines too).
    stderr goes to a file (a full pipe must never block the child); a deadline bounds the wait."""
    err = open(tmp_path / "child-stderr.txt", "w")
    child = subprocess.Popen([str(VENV_PYTHON), "-c", script, str(log_dir)], stdout=subprocess.PIPE,
                             stderr=err, cwd=str(Path(__file__).resolve().parents[1]))
    err.close()
    fd = child.stdout.fileno()
    received = b""
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            lines = received.decode().splitlines()
            if marker in lines:
                return child, lines
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"no {marker!r} from the child within {timeout_s} s: "
                                     f"{(tmp_path / 'child-stderr.txt').read_text()}")
            chunk = os.read(fd, 4096)        # unbuffered: select and the data stay in step
            if not chunk:
                raise AssertionError(f"child exited early: {(tmp_path / 'child-stderr.txt').read_text()}")
            received += chunk
    except BaseException:
        kill_child(child)
        raise


def kill_child(child: subprocess.Popen) -> None:
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    child.stdout.close()


def test_commit_kill_restart_every_committed_offset_is_back(tmp_path):
    log_dir = tmp_path / "logs"
    child, lines = start_child_and_wait_for(CHILD, log_dir, tmp_path)
    try:
        with pytest.raises(LogError, match="in use"):     # the live child holds the dir's .lock
            Broker(str(log_dir), clock=ManualClock(T0))
    finally:
        kill_child(child)
    assert child.returncode == -signal.SIGKILL
    assert lines[0] == "EXPIRED 38"     # 6 groups × 5 offsets + group tombstones (6), doomed 1+1
    assert not (log_dir / ".kafka_cleanshutdown").exists()

    # Before restarting: the raw files already say what a replay must find.
    raw_state = {}
    for p in range(50):
        raw_state.update(latest_by_key(raw_records(log_dir / f"{OFFSETS_TOPIC}-{p}")))
    assert raw_state == {("offset", "survivor", "orders", 1):
                         {"version": 3, "offset": 77, "leader_epoch": -1, "metadata": "",
                          "commit_ts": T0 + 5000 + 7 * DAY, "expire": None}}

    clock = ManualClock(T0 + 8 * DAY)
    broker = Broker(str(log_dir), clock=clock)
    try:
        gc = broker.group_coordinator
        assert gc.loaded_records == 6 * 5 * 5 + 1 + 1 + 38
        assert gc.groups() == ["survivor"]
        survivor = gc.fetch_offsets("survivor")
        assert list(survivor) == [("orders", 1)]
        assert survivor[("orders", 1)].offset == 77
        assert survivor[("orders", 1)].commit_timestamp == T0 + 5000 + 7 * DAY
        for g in range(6):
            assert gc.fetch_offsets(f"group-{g}") == {}
        assert gc.fetch_offsets("doomed", [("orders", 0)]) == {("orders", 0): None}
    finally:
        broker.shutdown()


CHILD_NO_EXPIRY = textwrap.dedent("""
    import sys, time
    from kstore import ManualClock
    from kstore.broker import Broker
    from kstore.group_coordinator import OffsetAndMetadata
    clock = ManualClock(1_700_000_000_000)
    broker = Broker(sys.argv[1], clock=clock)
    broker.create_topic("orders", 4)
    broker.create_topic("payments", 2)
    gc = broker.group_coordinator
    for round_ in range(5):
        for g in range(6):
            offsets = {("orders", p): OffsetAndMetadata(100 * g + 10 * round_ + p, f"r{round_}")
                       for p in range(4)}
            offsets[("payments", g % 2)] = OffsetAndMetadata(1000 + g + round_, "", leader_epoch=g)
            gc.commit_offsets(f"group-{g}", offsets)
        clock.advance(1000)
    print("COMMITTED", flush=True)
    time.sleep(120)
""")


def test_kill_restart_keeps_the_latest_commit_of_each_partition_with_metadata_and_epoch(tmp_path):
    log_dir = tmp_path / "logs"
    child, _ = start_child_and_wait_for(CHILD_NO_EXPIRY, log_dir, tmp_path)
    kill_child(child)
    assert child.returncode == -signal.SIGKILL
    broker = Broker(str(log_dir), clock=ManualClock(T0 + DAY))
    try:
        gc = broker.group_coordinator
        assert gc.groups() == [f"group-{g}" for g in range(6)]
        for g in range(6):
            got = gc.fetch_offsets(f"group-{g}")
            expected = {("orders", p): (100 * g + 40 + p, "r4", -1, T0 + 4000) for p in range(4)}
            expected[("payments", g % 2)] = (1000 + g + 4, "", g, T0 + 4000)
            assert {tp: (om.offset, om.metadata, om.leader_epoch, om.commit_timestamp)
                    for tp, om in got.items()} == expected
        # and a consumer of the group starts from there
        consumer = Consumer(broker, group_id="group-3", enable_auto_commit=False)
        consumer.assign([("orders", 2)])
        assert consumer.committed(("orders", 2)).offset == 342
    finally:
        broker.shutdown()


# ------------------------------------------------------------------------------------------
# Compaction keeps one record per key
# ------------------------------------------------------------------------------------------
def test_many_commits_then_compaction_leave_one_record_per_key(tmp_path, clock):
    broker = Broker(str(tmp_path / "logs"), clock=clock)
    try:
        broker.create_topic(OFFSETS_TOPIC, 50, 1, {"cleanup.policy": "compact", "segment.bytes": 2048})
        broker.create_topic("orders", 3)
        gc = broker.group_coordinator
        assert gc.num_partitions == 50
        p = partition_for("busy-group")
        for i in range(300):
            gc.commit_offsets("busy-group", {("orders", i % 3): i})
            clock.advance(10)
        log = broker.get_log(OFFSETS_TOPIC, p)
        assert log.log_end_offset == 300
        assert log.number_of_segments > 10
        before = raw_records(offsets_dir(broker, p))
        assert len(before) == 300

        results = broker.logs.run_cleaner()
        assert [(r.log.topic, r.log.partition) for r in results] == [(OFFSETS_TOPIC, p)]

        files = segment_files(offsets_dir(broker, p))
        active_file = offsets_dir(broker, p) / f"{log.active_segment.base_offset:020d}.log"
        assert files[-1] == active_file
        cleaned = raw_records(offsets_dir(broker, p), files[:-1])
        active = raw_records(offsets_dir(broker, p), files[-1:])
        # exactly one record per (group, topic, partition) below the active segment...
        keys = [parse_key(r["key"]) for r in cleaned]
        assert sorted(keys) == [("offset", "busy-group", "orders", q) for q in range(3)]
        # ...and it is the latest commit of that key below the active segment
        active_base = log.active_segment.base_offset
        for r in cleaned:
            _, _, _, q = parse_key(r["key"])
            latest_below = max(i for i in range(300) if i % 3 == q and i < active_base)
            assert r["offset"] == latest_below
            assert parse_value(r["value"])["offset"] == latest_below
        # the active segment is untouched (never cleaned)
        assert [r["offset"] for r in active] == list(range(active_base, 300))
        assert len(raw_records(offsets_dir(broker, p))) == 3 + len(active)
        assert len(active) < 20
        # a replay of what is left still gives the latest offsets
        state = latest_by_key(cleaned + active)
        assert {k[3]: v["offset"] for k, v in state.items()} == {0: 297, 1: 298, 2: 299}
    finally:
        broker.shutdown()
    broker = Broker(str(tmp_path / "logs"), clock=clock)
    try:
        got = broker.group_coordinator.fetch_offsets("busy-group")
        assert {tp: om.offset for tp, om in got.items()} == \
            {("orders", 0): 297, ("orders", 1): 298, ("orders", 2): 299}
    finally:
        broker.shutdown()


# ------------------------------------------------------------------------------------------
# Expiration: tombstones, then compaction removes them after delete.retention.ms
# ------------------------------------------------------------------------------------------
def test_expiry_writes_tombstones_and_cleaning_past_delete_retention_removes_them(broker, clock):
    broker.create_topic("orders", 3)
    gc = broker.group_coordinator
    gc.commit_offsets("expiring", {("orders", q): 10 + q for q in range(3)})
    p = gc.partition_for("expiring")
    pdir = offsets_dir(broker, p)
    log = broker.get_log(OFFSETS_TOPIC, p)

    clock.advance(RETENTION_MS - 1)
    assert gc.expire_offsets() == 0
    assert log.log_end_offset == 3
    clock.advance(1)
    assert gc.expire_offsets() == 4
    assert gc.fetch_offsets("expiring") == {} and "expiring" not in gc.groups()
    records = raw_records(pdir)
    assert [r["value"] is None for r in records] == [False] * 3 + [True] * 4
    assert [parse_key(r["key"]) for r in records[3:]] == \
        [("offset", "expiring", "orders", q) for q in range(3)] + [("group", "expiring")]
    assert all(r["timestamp"] == T0 + RETENTION_MS for r in records[3:])

    # First cleaning: the commits go, the tombstones stay, marked with a delete horizon.
    log.roll()
    first_clean_time = clock.milliseconds()
    broker.logs.cleaner.clean_log(log)
    batches = [b for f in segment_files(pdir) for b in raw_batches(f.read_bytes())]
    kept = [r for _, rs in batches for r in rs]
    assert [r["offset"] for r in kept] == [3, 4, 5, 6]
    assert all(r["value"] is None for r in kept)
    [(header, _)] = [(h, rs) for h, rs in batches if rs]
    assert header["delete_horizon"]
    assert header["base_timestamp"] == first_clean_time + 86_400_000    # delete.retention.ms

    # Before the horizon, a new cleaning keeps them (all but the one a newer commit superseded).
    clock.advance(86_400_000 - 1)
    gc.commit_offsets("expiring", {("orders", 0): 50})
    log.roll()
    broker.logs.cleaner.clean_log(log)
    assert [(r["offset"], r["value"] is None) for r in raw_records(pdir)] == \
        [(4, True), (5, True), (6, True), (7, False)]

    # Past the horizon, the next cleaning drops them.
    clock.advance(1)
    gc.commit_offsets("expiring", {("orders", 1): 60})
    log.roll()
    broker.logs.cleaner.clean_log(log)
    left = raw_records(pdir)
    assert [r["offset"] for r in left] == [7, 8]
    assert all(r["value"] is not None for r in left)
    assert {parse_key(r["key"])[3]: parse_value(r["value"])["offset"] for r in left} == {0: 50, 1: 60}
    assert {tp: om.offset for tp, om in gc.fetch_offsets("expiring").items()} == \
        {("orders", 0): 50, ("orders", 1): 60}


def test_only_expired_offsets_get_tombstones_and_the_group_stays(broker, clock):
    broker.create_topic("orders", 2)
    gc = broker.group_coordinator
    gc.commit_offsets("half", {("orders", 0): 1})
    clock.advance(DAY)
    gc.commit_offsets("half", {("orders", 1): 2})
    clock.advance(RETENTION_MS - DAY)
    assert gc.expire_offsets() == 1
    records = raw_records(offsets_dir(broker, gc.partition_for("half")))
    assert [(parse_key(r["key"]), r["value"] is None) for r in records] == [
        (("offset", "half", "orders", 0), False), (("offset", "half", "orders", 1), False),
        (("offset", "half", "orders", 0), True)]
    assert {tp: om.offset for tp, om in gc.fetch_offsets("half").items()} == {("orders", 1): 2}
    assert gc.groups() == ["half"]


def test_the_periodic_expiry_task_runs_on_the_scheduler(broker, clock):
    broker.create_topic("orders", 1)
    gc = broker.group_coordinator
    gc.commit_offsets("periodic", {("orders", 0): 3})
    gc.start_expiry()
    p = gc.partition_for("periodic")
    log = broker.get_log(OFFSETS_TOPIC, p)
    clock.advance(RETENTION_MS - 1)          # checks every 10 minutes: nothing expired yet
    broker.logs.scheduler.run_due()
    assert log.log_end_offset == 1
    clock.advance(600_000)                   # the next check is past the retention
    broker.logs.scheduler.run_due()
    assert log.log_end_offset == 3
    assert gc.fetch_offsets("periodic") == {}
    gc.shutdown()


# ------------------------------------------------------------------------------------------
# Bad commits: clear errors, nothing written
# ------------------------------------------------------------------------------------------
def test_bad_commits_are_refused_and_nothing_is_written(broker):
    broker.create_topic("orders", 2)
    gc = broker.group_coordinator
    gc.commit_offsets("g", {("orders", 0): 5})
    before_leos = leos(broker)
    before_files = {p: [(f.name, f.stat().st_size) for f in segment_files(offsets_dir(broker, p))]
                    for p in range(50)}
    before_cache = gc.fetch_offsets("g")

    cases = [
        ({("nope", 0): 1}, ["nope-0", "UnknownTopicOrPartitionError"]),
        ({("orders", 2): 1}, ["orders-2", "UnknownTopicOrPartitionError"]),
        ({("orders", -1): 1}, ["orders--1", "UnknownTopicOrPartitionError"]),
        ({("orders", 1): -1}, ["orders-1", "InvalidCommitOffsetError", "-1"]),
        ({("orders", 1): OffsetAndMetadata(3, "x" * 4097)}, ["orders-1", "OffsetMetadataTooLargeError", "4096"]),
        # Kafka counts UTF-16 code units (String.length()): 2049 emoji are 4098 units
        ({("orders", 1): OffsetAndMetadata(3, "\U0001F600" * 2049)}, ["OffsetMetadataTooLargeError"]),
        # a good entry next to a bad one is not written either
        ({("orders", 0): 6, ("orders", 1): -5}, ["orders-1", "InvalidCommitOffsetError"]),
    ]
    for offsets, words in cases:
        with pytest.raises(CommitFailedError) as e:
            gc.commit_offsets("g", offsets)
        for w in words:
            assert w in str(e.value), (w, str(e.value))
        assert "nothing written" in str(e.value)

    # every problem of one commit is listed
    with pytest.raises(CommitFailedError) as e:
        gc.commit_offsets("g", {("nope", 0): 1, ("orders", 9): 1, ("orders", 0): -3,
                                ("orders", 1): OffsetAndMetadata(1, "m" * 5000)})
    msg = str(e.value)
    for w in ("nope-0", "orders-9", "orders-0", "InvalidCommitOffsetError", "orders-1",
              "OffsetMetadataTooLargeError"):
        assert w in msg, w

    for group in ("", None, 42):
        with pytest.raises(InvalidGroupIdError):
            gc.commit_offsets(group, {("orders", 0): 1})

    # through a consumer too
    consumer = Consumer(broker, group_id="g", enable_auto_commit=False)
    consumer.assign([("orders", 0)])
    with pytest.raises(CommitFailedError):
        consumer.commit({("orders", 0): 1, ("orders", 7): 1})

    assert leos(broker) == before_leos
    assert {p: [(f.name, f.stat().st_size) for f in segment_files(offsets_dir(broker, p))]
            for p in range(50)} == before_files
    assert gc.fetch_offsets("g") == before_cache
    assert not (Path(broker.log_dir) / "nope-0").exists()
    assert broker.topics() == ["orders"]

    # the limits themselves are accepted: 4096 UTF-16 units, even as 8192 UTF-8 bytes
    gc.commit_offsets("g", {("orders", 1): OffsetAndMetadata(0, "é" * 4096)})
    gc.commit_offsets("g", {("orders", 1): OffsetAndMetadata(1, "x" * 4096)})
    assert sum(leos(broker)) == sum(before_leos) + 2
    assert gc.fetch_offsets("g", [("orders", 1)])[("orders", 1)].metadata == "x" * 4096

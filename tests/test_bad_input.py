"""Bad input gets a clear error that names the problem, and nothing already stored is lost:
impossible configs, malformed checkpoint files (case 60), illegal topic names, corrupt files."""

from __future__ import annotations

import os

import pytest

from kstore import Log, LogConfig, LogManager
from kstore.checkpoint import (LeaderEpochCheckpointFile, OffsetCheckpointFile, format_checkpoint,
                               parse_checkpoint)
from kstore.errors import CheckpointError, ConfigError, CorruptRecordError, InvalidTopicError
from kstore.records import MemoryRecords, RecordBatch, build_batch
from kstore.topic import validate_topic_name

from helpers import records


# ---------------------------------------------------------------- configuration
@pytest.mark.parametrize("overrides,message", [
    ({"segment.byte": 100}, "Unknown topic config name: segment.byte"),
    ({"segment.bytes": 10}, "segment.bytes: Value must be at least 14"),
    ({"segment.bytes": "1GB"}, "Invalid value '1GB' for configuration segment.bytes: expected type int"),
    ({"segment.bytes": 1 << 40}, "not a 32-bit integer"),
    ({"index.interval.bytes": -1}, "index.interval.bytes: Value must be at least 0"),
    ({"segment.index.bytes": 3}, "segment.index.bytes: Value must be at least 4"),
    ({"segment.ms": 0}, "segment.ms: Value must be at least 1"),
    ({"flush.messages": 0}, "flush.messages: Value must be at least 1"),
    ({"retention.ms": -2}, "retention.ms: Value must be at least -1"),
    ({"cleanup.policy": "compress"}, "cleanup.policy: Invalid value(s) compress"),
    ({"message.timestamp.type": "AppendTime"}, "String must be one of: CreateTime, LogAppendTime"),
    ({"compression.type": "brotli"}, "compression.type"),
    ({"min.cleanable.dirty.ratio": 1.5}, "between 0.0 and 1.0"),
    ({"preallocate": "yes"}, "expected type boolean"),
    ({"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 5}, "must be at least min.compaction.lag.ms"),
])
def test_impossible_configs_are_refused_with_the_name_of_the_problem(overrides, message):
    with pytest.raises(ConfigError) as e:
        LogConfig(overrides)
    assert message in str(e.value)


def test_config_defaults_are_kafkas():
    c = LogConfig()
    assert (c.segment_bytes, c.segment_ms, c.segment_index_bytes, c.index_interval_bytes) == \
        (1073741824, 604800000, 10485760, 4096)
    assert (c.retention_ms, c.retention_bytes, c.file_delete_delay_ms, c.max_message_bytes) == \
        (604800000, -1, 60000, 1048588)
    assert c.flush_messages == c.flush_ms == (1 << 63) - 1
    assert c.cleanup_policy == ("delete",) and c["message.timestamp.type"] == "CreateTime"
    assert LogConfig({"segment.bytes": "2048", "preallocate": "true"}).segment_bytes == 2048


def test_a_bad_config_writes_nothing(tmp_path, clock):
    with pytest.raises(ConfigError):
        Log.open(str(tmp_path / "t-0"), {"segment.bytes": 1}, clock)
    assert not (tmp_path / "t-0").exists()


# ---------------------------------------------------------------- checkpoints (case 60)
def test_case_60_checkpoint_round_trip_empty_and_unknown_version(tmp_path):
    f = OffsetCheckpointFile(str(tmp_path / "recovery-point-offset-checkpoint"))
    f.write({("orders", 1): 987, ("orders", 0): 1234})
    assert (tmp_path / "recovery-point-offset-checkpoint").read_text() == "0\n2\norders 0 1234\norders 1 987\n"
    assert f.read() == {("orders", 0): 1234, ("orders", 1): 987}
    assert not (tmp_path / "recovery-point-offset-checkpoint.tmp").exists()
    (tmp_path / "empty").write_text("")
    assert OffsetCheckpointFile(str(tmp_path / "empty")).read() == {}
    (tmp_path / "v1").write_text("1\n0\n")
    with pytest.raises(CheckpointError, match="unrecognised version .* 1"):
        OffsetCheckpointFile(str(tmp_path / "v1")).read()


@pytest.mark.parametrize("text,message", [
    ("0\n2\norders 0 5\n", "expected 2 entries"),
    ("0\n1\norders 0\n", "malformed line"),
    ("0\n1\norders zero 5\n", "malformed line"),
    ("x\n", "malformed version line"),
    ("0\nmany\n", "malformed count line"),
])
def test_malformed_checkpoints_name_the_problem(tmp_path, text, message):
    (tmp_path / "cp").write_text(text)
    with pytest.raises(CheckpointError, match=message):
        OffsetCheckpointFile(str(tmp_path / "cp")).read()


def test_checkpoint_reader_accepts_any_whitespace():
    assert parse_checkpoint("0\n1\nfoo\t0   7\n", 3) == [["foo", "0", "7"]]
    assert format_checkpoint([(0, 0), (3, 120)]) == "0\n2\n0 0\n3 120\n"


def test_corrupt_leader_epoch_checkpoint_stops_the_load_with_its_path(tmp_path, clock):
    d = tmp_path / "t-0"
    d.mkdir()
    (d / "leader-epoch-checkpoint").write_text("0\n1\n0\n")
    with pytest.raises(CheckpointError, match="leader-epoch-checkpoint"):
        Log.open(str(d), None, clock)
    assert LeaderEpochCheckpointFile(str(tmp_path / "nope")).read() == []


# ---------------------------------------------------------------- topic names
@pytest.mark.parametrize("name,message", [
    ("../x", "illegal"), ("a/b", "illegal"), (".", "cannot be '.'"), ("..", "cannot be '..'"),
    ("t" * 250, "longer than 249"), ("ordres-é", "illegal"), ("", "empty"), ("has space", "illegal"),
    ("null\x00byte", "illegal"),
])
def test_invalid_topic_names(name, message):
    with pytest.raises(InvalidTopicError, match=message):
        validate_topic_name(name)


def test_legal_topic_names():
    for name in ("orders", "a.b_c-D9", "t" * 249, "__consumer_offsets", "..."):
        assert validate_topic_name(name) == name


def test_no_topic_name_escapes_the_log_dir(tmp_path, clock):
    manager = LogManager(str(tmp_path / "logs"), None, clock)
    for bad in ("../escape", "..", "a/../../b"):
        with pytest.raises(InvalidTopicError):
            manager.get_or_create_log(bad, 0)
    with pytest.raises(InvalidTopicError):
        manager.get_or_create_log("ok", -1)
    assert sorted(os.listdir(tmp_path)) == ["logs"]
    assert os.listdir(tmp_path / "logs") == []


# ---------------------------------------------------------------- corrupt bytes
def test_wrong_crc_is_reported_with_both_values():
    data = bytearray(build_batch(records(2)))
    data[30] ^= 1
    with pytest.raises(CorruptRecordError, match=r"stored crc = 0x[0-9a-f]{8}, computed crc = 0x"):
        RecordBatch(bytes(data)).ensure_valid()


def test_impossible_batch_length_is_corrupt():
    data = bytearray(build_batch(records(1)))
    data[8:12] = (5).to_bytes(4, "big")
    with pytest.raises(CorruptRecordError, match="record size 5 is less than the minimum"):
        MemoryRecords(bytes(data)).batches()


def test_unknown_magic_is_corrupt():
    data = bytearray(build_batch(records(1)))
    data[16] = 7
    with pytest.raises(CorruptRecordError, match="invalid magic found in record: 7"):
        MemoryRecords(bytes(data)).batches()


def test_truncated_batch_is_not_a_batch():
    data = build_batch(records(3))
    assert MemoryRecords(data[:-1]).batches() == []
    with pytest.raises(CorruptRecordError, match="smaller than the minimum allowed overhead"):
        RecordBatch(data[:40])


def test_a_corrupt_segment_never_loses_the_good_batches_before_it(tmp_path, clock):
    log = Log.open(str(tmp_path / "t-0"), None, clock)
    for i in range(10):
        log.append_as_leader(build_batch(records(1, start=i)))
    sizes = [b.size_in_bytes for b in log.read(0, 1 << 20).batches()]
    log.close()
    path = tmp_path / "t-0" / "00000000000000000000.log"
    data = bytearray(path.read_bytes())
    data[sum(sizes[:6]) + 40] ^= 0xFF                     # inside batch 6
    path.write_bytes(bytes(data))
    reopened = Log.open(str(tmp_path / "t-0"), None, clock, recovery_point=0)
    assert [r.offset for r in reopened.records()] == [0, 1, 2, 3, 4, 5]
    assert reopened.load_report.truncated_bytes == sum(sizes[6:])
    (base, cut, error) = reopened.load_report.recovered_segments[0]
    assert (base, cut) == (0, sum(sizes[6:])) and "crc" in error
    reopened.close()

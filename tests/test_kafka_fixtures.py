"""Kafka's files, read by kstore: log directories written by a real Kafka 3.x broker (KRaft).

Expected numbers are those of tests/fixtures/kafka-kraft-logs/README.md, which an independent
decoder (kafka-python) produced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kstore import LogManager
from kstore.checkpoint import LeaderEpochCheckpointFile, OffsetCheckpointFile
from kstore.file_records import FileRecords
from kstore.index import OffsetIndex, TimeIndex

# (snapshot, partition) -> (bytes, batches, records, control records, first offset, last offset)
README_TABLE = {
    ("510714e", "__cluster_metadata-0"): (9333, 123, 129, 1, 0, 128),
    ("510714e", "foo-0"): (80, 1, 1, 0, 0, 0),
    ("e856b9a", "__cluster_metadata-0"): (8630, 109, 116, 2, 0, 115),
    ("e856b9a", "foo-0"): (150, 2, 3, 0, 0, 2),
}
INDEX_ENTRIES = {
    ("e856b9a", "__cluster_metadata-0"): [(56, 4123)],
    ("510714e", "__cluster_metadata-0"): [(57, 4154), (114, 8258)],
    ("e856b9a", "foo-0"): [],
    ("510714e", "foo-0"): [],
}
TIME_INDEX_ENTRIES = {
    ("e856b9a", "__cluster_metadata-0"): [(1725272038072, 56), (1725272048281, 80),
                                          (1725272098040, 115)],
    ("e856b9a", "foo-0"): [(1725272041932, 2)],
}
SEGMENT = "00000000000000000000"


@pytest.mark.parametrize("snapshot,partition", sorted(README_TABLE))
def test_segment_files_as_kafka_wrote_them(kafka_logs, snapshot, partition):
    size, n_batches, n_records, n_control, first, last = README_TABLE[(snapshot, partition)]
    path = kafka_logs / snapshot / partition / f"{SEGMENT}.log"
    assert os.path.getsize(path) == size
    records = FileRecords(str(path), file_already_exists=True)
    batches = list(records.batches())
    assert len(batches) == n_batches
    assert all(b.magic == 2 and b.is_valid() for b in batches)
    decoded = [r for b in batches for r in b.records()]
    assert len(decoded) == n_records
    assert sum(b.records_count for b in batches if b.is_control) == n_control
    assert (decoded[0].offset, decoded[-1].offset) == (first, last)
    records.close_handlers()
    index = OffsetIndex(str(path).replace(".log", ".index"), 0, writable=False)
    assert [tuple(e) for e in index.entries_list()] == INDEX_ENTRIES[(snapshot, partition)]
    if (snapshot, partition) in TIME_INDEX_ENTRIES:
        tindex = TimeIndex(str(path).replace(".log", ".timeindex"), 0, writable=False)
        assert [tuple(e) for e in tindex.entries_list()] == TIME_INDEX_ENTRIES[(snapshot, partition)]


@pytest.mark.parametrize("snapshot", ["e856b9a", "510714e"])
def test_log_directory_opens_as_a_kstore_log_dir(kafka_logs, snapshot):
    log_dir = kafka_logs / snapshot
    marker = json.loads((log_dir / ".kafka_cleanshutdown").read_text())
    assert marker["version"] == 0
    manager = LogManager.open(str(log_dir))
    assert manager.broker_epoch == marker["brokerEpoch"]
    assert manager.had_clean_shutdown
    assert not (log_dir / ".kafka_cleanshutdown").exists()   # removed at startup, as Kafka does
    assert sorted(manager.logs()) == [("__cluster_metadata", 0), ("foo", 0)]
    for (topic, partition), log in manager.logs().items():
        size, n_batches, n_records, n_control, first, last = README_TABLE[(snapshot, f"{topic}-{partition}")]
        assert log.load_report.recovered_segments == []          # clean shutdown: no recovery
        assert (log.log_start_offset, log.log_end_offset) == (first, last + 1)
        assert log.recovery_point == last + 1
        data = [r for r in log.records()]
        assert len(data) == n_records - n_control                 # readers skip control batches
        # Index lookups through the real Kafka index files find every offset.
        for offset in range(first, last + 1):
            batch = log.read(offset, 1).batches()[0]
            assert batch.base_offset <= offset <= batch.last_offset
    foo = manager.get_log("foo", 0)
    expected_payloads = {"e856b9a": [b"m1", b"m2", b"m3"], "510714e": None}[snapshot]
    if expected_payloads:
        assert [r.value for r in foo.records()] == expected_payloads
        assert [r.sequence for r in foo.records()] == [0, 1, 2]
    manager.shutdown()
    # kstore's shutdown writes Kafka's checkpoint formats back.
    rp = OffsetCheckpointFile(str(log_dir / "recovery-point-offset-checkpoint")).read()
    assert rp[("foo", 0)] == README_TABLE[(snapshot, "foo-0")][5] + 1
    assert json.loads((log_dir / ".kafka_cleanshutdown").read_text()) == marker


def test_checkpoint_files_as_kafka_wrote_them(kafka_logs):
    d = kafka_logs / "e856b9a"
    assert LeaderEpochCheckpointFile(str(d / "foo-0" / "leader-epoch-checkpoint")).read() == [(0, 0), (2, 3)]
    assert OffsetCheckpointFile(str(d / "recovery-point-offset-checkpoint")).read() == {("foo", 0): 3}
    assert OffsetCheckpointFile(str(d / "replication-offset-checkpoint")).read() == {("foo", 0): 3}
    assert OffsetCheckpointFile(str(d / "log-start-offset-checkpoint")).read() == {}
    assert OffsetCheckpointFile(str(d / "cleaner-offset-checkpoint")).read() == {}   # empty file
    assert (d / "foo-0" / "partition.metadata").read_text() == "version: 0\ntopic_id: fZi4qEpCTsik-rzkyV0Ypg"


def test_epoch_cache_is_cut_at_the_log_end_offset_on_load(kafka_logs):
    """Kafka's LogLoader calls truncateFromEnd(LEO): the entry (2, 3) starts at LEO 3, so it goes
    (the broker re-adds it when it becomes leader in epoch 2). kstore does the same."""
    manager = LogManager.open(str(kafka_logs / "e856b9a"))
    assert manager.get_log("foo", 0).leader_epoch_cache.entries() == [(0, 0)]
    meta = manager.get_log("__cluster_metadata", 0)
    assert meta.leader_epoch_cache.entries() == [(1, 0), (2, 81)]


def test_appending_to_a_kafka_written_log_continues_its_offsets(kafka_logs, clock):
    manager = LogManager.open(str(kafka_logs / "e856b9a"), clock=clock)
    foo = manager.get_log("foo", 0)
    info = foo.append([("k", "m4")], leader_epoch=2)
    assert info.first_offset == 3
    manager.shutdown()
    again = LogManager.open(str(kafka_logs / "e856b9a"))
    assert [r.value for r in again.get_log("foo", 0).records()] == [b"m1", b"m2", b"m3", b"m4"]


def _dump(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "kstore", "dump-log", *args],
                         capture_output=True, text=True, check=True)
    return out.stdout


def test_dump_log_prints_kafka_files(kafka_logs):
    d = kafka_logs / "e856b9a" / "foo-0"
    out = _dump(str(d / f"{SEGMENT}.log"), "--print-data-log")
    lines = out.splitlines()
    assert lines[0] == f"Dumping {d / (SEGMENT + '.log')}"
    assert lines[1] == "Log starting offset: 0"
    assert lines[2] == ("baseOffset: 0 lastOffset: 1 count: 2 baseSequence: 0 lastSequence: 1 "
                        "producerId: 0 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: false "
                        "isControl: false deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: "
                        "1725272040952 size: 80 magic: 2 compresscodec: none crc: 1495201167 isvalid: true")
    assert lines[3] == ("| offset: 0 CreateTime: 1725272040411 keySize: -1 valueSize: 2 sequence: 0 "
                        "headerKeys: [] payload: m1")
    assert sum(1 for line in lines if line.startswith("| offset:")) == 3
    idx = _dump(str(kafka_logs / "e856b9a" / "__cluster_metadata-0" / f"{SEGMENT}.index"))
    assert "offset: 56 position: 4123" in idx
    tidx = _dump(str(kafka_logs / "e856b9a" / "__cluster_metadata-0" / f"{SEGMENT}.timeindex"))
    assert tidx.splitlines()[1:] == ["timestamp: 1725272038072 offset: 56",
                                     "timestamp: 1725272048281 offset: 80",
                                     "timestamp: 1725272098040 offset: 115"]
    ck = _dump(str(d / "leader-epoch-checkpoint"), str(kafka_logs / "e856b9a" / "recovery-point-offset-checkpoint"))
    assert "epoch: 2 startOffset: 3" in ck and "topic: foo partition: 0 offset: 3" in ck
    snap = _dump(str(d / "00000000000000000003.snapshot"))
    assert "producerId: 0 producerEpoch: 0" in snap and "lastSequence: 2 lastOffset: 2" in snap
    meta = _dump(str(kafka_logs / "e856b9a" / "__cluster_metadata-0" / f"{SEGMENT}.log"), "--deep-iteration")
    assert meta.count("isControl: true") == 2 and "controlType: LEADER_CHANGE(2)" in meta
    sanity = _dump(str(kafka_logs / "510714e" / "__cluster_metadata-0" / f"{SEGMENT}.index"),
                   "--index-sanity-check")
    assert "passed sanity check." in sanity

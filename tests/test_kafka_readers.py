"""Kafka's readers read kstore: segments kstore writes decode with kafka-python's and aiokafka's
record parsers (two independent code bases), with valid CRCs and the same records back."""

from __future__ import annotations

import os
import random

import pytest
from aiokafka.record.memory_records import MemoryRecords as AioMemoryRecords
from kafka.record.memory_records import MemoryRecords as KafkaPythonMemoryRecords

from kstore import Log, LogConfig, Record
from kstore.compression import Compression
from kstore.records import build_batch

from helpers import T0


def _random_records(rng: random.Random, n: int, ts: int) -> list[Record]:
    out = []
    for i in range(n):
        key = None if rng.random() < 0.2 else rng.randbytes(rng.randrange(0, 40))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.randrange(0, 300))
        headers = tuple((f"h{j}", None if rng.random() < 0.3 else rng.randbytes(rng.randrange(0, 9)))
                        for j in range(rng.randrange(0, 3)))
        out.append(Record(key, value, ts + rng.randrange(-1000, 1000), headers))
    return out


def _decode_all(parser_cls, data: bytes):
    records = parser_cls(data)
    out = []
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()            # before iterating: iteration decompresses in place
        for r in batch:
            out.append((batch.base_offset, r.offset, r.timestamp, r.key, r.value,
                        tuple((k, v) for k, v in r.headers)))
    return out


@pytest.mark.parametrize("parser", [KafkaPythonMemoryRecords, AioMemoryRecords],
                         ids=["kafka-python", "aiokafka"])
@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.kafka_name)
def test_segments_written_by_kstore_decode_with_kafka_parsers(tmp_path, clock, parser, codec):
    rng = random.Random(hash(codec.kafka_name) & 0xFFFF)
    log = Log.open(str(tmp_path / "t-0"), LogConfig({"segment.bytes": 20_000}), clock)
    expected = []
    for epoch in range(3):
        for _ in range(8):
            recs = _random_records(rng, rng.randrange(1, 20), T0)
            info = log.append_as_leader(build_batch(recs, compression=codec,
                                                    producer_id=77, producer_epoch=1,
                                                    base_sequence=info_seq(expected)),
                                        leader_epoch=epoch)
            for i, r in enumerate(recs):
                expected.append((info.first_offset + i, r.timestamp, r.key, r.value, r.headers))
    log.close()
    segment_files = sorted(n for n in os.listdir(tmp_path / "t-0") if n.endswith(".log"))
    assert len(segment_files) > 1
    decoded = []
    for name in segment_files:
        data = (tmp_path / "t-0" / name).read_bytes()
        decoded.extend(_decode_all(parser, data))
    assert [(o, ts, k, v, h) for _, o, ts, k, v, h in decoded] == expected


def info_seq(expected: list) -> int:
    return len(expected)


def test_kafka_python_builder_output_is_stored_byte_for_byte(tmp_path, clock):
    """The other direction: a batch built by kafka-python's builder is stored as sent (only the
    base offset and leader epoch rewritten) and stays CRC-valid."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i in range(5):
        builder.append(i, timestamp=T0 + i, key=f"k{i}".encode(), value=b"v" * i, headers=[])
    sent = bytes(builder.build())
    log = Log.open(str(tmp_path / "t-0"), None, clock)
    log.append([("x", "y")])
    log.append_as_leader(sent)
    log.close()
    data = (tmp_path / "t-0" / "00000000000000000000.log").read_bytes()
    stored = data[len(data) - len(sent):]
    assert stored[16:] == sent[16:] and stored[8:12] == sent[8:12]
    assert int.from_bytes(stored[:8], "big") == 1
    (batch,) = [b for b in [KafkaPythonMemoryRecords(stored).next_batch()]]
    assert batch.validate_crc()
    assert [r.offset for r in batch] == [1, 2, 3, 4, 5]

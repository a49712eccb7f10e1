"""The Spark source's engine side, without a JVM: the read-only log-dir reader, RecordBatch → Arrow
decoding, option parsing, the read-time data-loss rules and the sink's exactly-once commit.
(tests/test_spark.py runs the same source inside real Spark.)"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

import pyspark  # noqa: E402,F401  (a main dependency)

from helpers import KAFKA_LOGS, T0  # noqa: E402
from kstore.broker import Broker  # noqa: E402
from kstore.compression import Compression  # noqa: E402
from kstore.records import (ControlRecordType, Record, build_batch,  # noqa: E402
                            build_control_batch)
from kstore.spark.backends import Location, LogDirBackend  # noqa: E402
from kstore.spark.decode import ARROW_SCHEMA, ARROW_SCHEMA_WITH_HEADERS  # noqa: E402
from kstore.spark.logdir import LogDirReader  # noqa: E402
from kstore.spark.options import (KStoreOptionError, parse_sink_options,  # noqa: E402
                                  parse_source_options)
from kstore.spark.sink import (COMMITS_FILE, KStoreSinkError, LogDirAppender,  # noqa: E402
                               StagedRun, StagedWrite, commit_staged)
from kstore.spark.source import (KStoreDataLossError, KStoreRange, project, read_range,  # noqa: E402
                                 split_ranges)


def snapshot(directory) -> dict:
    out = {}
    for root, dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = f.read()
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), directory) + "/"] = None
    return out


def engine(log_dir, topic) -> list[tuple]:
    """(partition, offset, key, value, timestamp, headers) of every record, read by the engine."""
    with Broker(str(log_dir)) as b:
        return [(p, r.offset, r.key, r.value, r.timestamp, tuple(r.headers))
                for p in range(b.partition_count(topic)) for r in b.get_log(topic, p).records()]


def arrow_rows(batches) -> list[tuple]:
    out = []
    for batch in batches:
        d = batch.to_pydict()
        for i in range(batch.num_rows):
            headers = d["headers"][i] if "headers" in d else None
            out.append((d["partition"][i], d["offset"][i], d["key"][i], d["value"][i],
                        int(d["timestamp"][i].timestamp() * 1000 + 0.5),
                        tuple((h["key"], h["value"]) for h in headers) if headers else ()))
    return out


def read_all(log_dir, topic, include_headers=True) -> list[tuple]:
    backend = LogDirBackend(str(log_dir))
    out = []
    for p in range(backend.topic_partitions()[topic]):
        start, end = backend.offset_ranges([(topic, p)])[(topic, p)]
        out += arrow_rows(read_range(KStoreRange(backend.location, topic, p, start, end,
                                                 include_headers=include_headers)))
    return out


@pytest.fixture
def mixed(tmp_path) -> Path:
    """Two partitions; every codec, headers, null keys and values, a transaction marker, several
    segments with index entries."""
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("mixed", 2, configs={"segment.bytes": 4096, "index.interval.bytes": 256})
        for p in range(2):
            offset_ts = T0
            for i, codec in enumerate([Compression.NONE, Compression.GZIP, Compression.SNAPPY,
                                       Compression.LZ4, Compression.ZSTD] * 4):
                recs = [Record(None if j % 7 == 0 else f"k{j}".encode(),
                               None if j % 11 == 0 else (f"v{p}-{i}-{j}-" * 3).encode(),
                               offset_ts + j, (("h", b"x"), ("n", None)) if j % 3 == 0 else ())
                        for j in range(i * 10, i * 10 + 10)]
                b.produce("mixed", p, build_batch(recs, compression=codec))
                if i == 5:
                    b.produce("mixed", p, build_control_batch(
                        ControlRecordType.COMMIT, timestamp=T0, producer_id=1, producer_epoch=0))
    return d


def test_reader_returns_exactly_the_engines_records_every_codec(mixed):
    expected = engine(mixed, "mixed")
    assert len(expected) == 2 * 200
    assert read_all(mixed, "mixed") == expected


def test_decoding_yields_arrow_record_batches_with_sparks_kafka_schema(mixed):
    backend = LogDirBackend(str(mixed))
    batches = list(backend.read_arrow("mixed", 0, 0, 10**9, include_headers=False))
    assert batches and all(isinstance(b, pa.RecordBatch) for b in batches)
    assert all(b.schema.equals(ARROW_SCHEMA) for b in batches)
    with_headers = list(backend.read_arrow("mixed", 0, 0, 10**9, include_headers=True))
    assert with_headers[0].schema.equals(ARROW_SCHEMA_WITH_HEADERS)
    # offsets are contiguous but for the transaction marker (a control batch: not a record)
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(60)) + list(range(61, 201))


def test_the_native_record_walk_gives_what_the_python_walk_gives(mixed):
    """ColumnBuilder walks record lengths in C (`record_lengths` in kstore/_codec.c) when it is
    built: the same batches as the Python walk, and a malformed records section still fails with
    the Python walk's error."""
    from kstore import native
    from kstore.errors import InvalidRecordError
    from kstore.records import RECORD_BATCH_OVERHEAD
    from kstore.spark.decode import ColumnBuilder
    if getattr(native.codec, "record_lengths", None) is None:
        pytest.skip("the native codec is not built: `pip install -e .` with a C compiler")
    fast = read_all(mixed, "mixed")
    with native.pure_python():
        assert read_all(mixed, "mixed") == fast
    section = build_batch([Record(b"k", b"v" * i, T0) for i in range(50)])[RECORD_BATCH_OVERHEAD:]
    assert native.codec.record_lengths(section, 49) is None      # does not fill the section
    assert len(native.codec.record_lengths(section, 50)) == 50 * 8
    builder = ColumnBuilder("t", 0)
    with pytest.raises(InvalidRecordError, match="declares 49 records"):
        builder._record_lengths(section, 49, 0)


@pytest.mark.parametrize("columns", [["key"], ["value"], ["timestamp"], ["headers"],
                                     ["key", "headers", "timestampType"], ["topic", "partition"],
                                     ["offset"], ["value", "timestamp", "key"]])
@pytest.mark.parametrize("start,end", [(0, 10**9), (5, 17), (59, 61)])
def test_pruned_decoding_builds_only_the_columns_asked_for_with_the_same_values(
        mixed, columns, start, end):
    """Column pruning in the decoder: only the selected columns (and `offset`, by which a reader
    follows its progress) are built, in the fixed order, equal to the same columns of a full
    decode — across codecs, headers, null keys and values, a marker and mid-batch bounds."""
    from kstore.spark.decode import decoded_schema
    backend = LogDirBackend(str(mixed))
    full = pa.Table.from_batches(list(backend.read_arrow("mixed", 1, start, end, True)))
    pruned = list(backend.read_arrow("mixed", 1, start, end, True, columns=columns))
    names = [n for n in ARROW_SCHEMA_WITH_HEADERS.names if n in columns or n == "offset"]
    assert all(b.schema.names == names for b in pruned)
    assert decoded_schema(True, columns).names == names
    assert pa.Table.from_batches(pruned, schema=decoded_schema(True, columns)).equals(
        full.select(names))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(1 << 63), (1 << 63) - 1) | st.integers(-300, 300)
                | st.integers(-20000, 20000), min_size=1, max_size=40))
def test_columnar_varints_decode_every_length_like_the_record_codec(values):
    """`_varints` (whole columns: one byte, two bytes, then the general rounds) against the
    engine's own varint writer, with filler bytes between the varints."""
    import numpy as np
    from kstore.spark.decode import _varints
    from kstore.varint import write_varlong
    buf, positions = bytearray(), []
    for i, v in enumerate(values):
        buf += b"\xff" * (i % 3)
        positions.append(len(buf))
        buf += write_varlong(v)
    got, sizes = _varints(np.frombuffer(bytes(buf), dtype=np.uint8), np.array(positions))
    assert got.tolist() == values
    assert sizes.tolist() == [len(write_varlong(v)) for v in values]


_fields_records = st.lists(st.builds(
    Record, st.none() | st.binary(max_size=20) | st.binary(min_size=120, max_size=300),
    st.none() | st.binary(max_size=20) | st.binary(min_size=100, max_size=3000),
    st.integers(T0 - (1 << 40), T0 + (1 << 40)),
    st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=2)),
    min_size=1, max_size=30)


def _section_and_lengths(records):
    """A records section as build_batch lays it out, and each record's zig-zag length."""
    import numpy as np
    from kstore.records import RECORD_BATCH_OVERHEAD
    from kstore.spark.decode import ColumnBuilder
    section = bytearray(build_batch(records)[RECORD_BATCH_OVERHEAD:])
    builder = ColumnBuilder("t", 0)
    builder._batches = [(len(records), 0, T0, None, None, None)]
    lengths = []
    builder._walk(bytes(section), len(records), lengths.append, 0)
    return builder, section, np.array(lengths, dtype=np.int64)


def _native_fields_agree(builder, data: bytes, zz) -> bool:
    """`record_fields` in C gives the numpy reference's eight columns, or None where the
    reference raises (and the builder then raises the reference's error). True when C answered."""
    import numpy as np
    from kstore import native
    from kstore.errors import InvalidRecordError
    try:
        expected = np.array(builder._fields(np.frombuffer(data, np.uint8), zz))
    except (InvalidRecordError, IndexError):
        expected = None
    found = native.codec.record_fields(data, zz)
    if found is not None:
        assert expected is not None
        assert np.array_equal(np.frombuffer(found, dtype=np.int64).reshape(8, len(zz)), expected)
    elif expected is None:
        with pytest.raises((InvalidRecordError, IndexError)):
            builder._record_fields(np.frombuffer(data, np.uint8), zz)
    return found is not None


def _needs_native_fields():
    from kstore import native
    if getattr(native.codec, "record_fields", None) is None:
        pytest.skip("the native codec is not built: `pip install -e .` with a C compiler")


@settings(max_examples=300, deadline=None)
@given(records=_fields_records,
       flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=3),
       length_change=st.none() | st.tuples(st.integers(0, 29), st.integers(-3, 3)))
def test_native_record_fields_equal_the_numpy_reference_or_leave_it_to_raise(
        records, flips, length_change):
    """`record_fields` in kstore/_codec.c against ColumnBuilder._fields, the numpy reference: on
    a whole records section the same eight columns; on one with flipped bytes or a wrong record
    length, either the same columns or None where the reference raises (it then raises)."""
    _needs_native_fields()
    builder, section, zz = _section_and_lengths(records)
    assert _native_fields_agree(builder, bytes(section), zz)
    for where, byte in flips:
        section[where % len(section)] = byte
    if length_change is not None:
        i, change = length_change
        zz[i % len(zz)] += 2 * change
    _native_fields_agree(builder, bytes(section), zz)


@pytest.mark.parametrize("value", [None, b"", b"v", b"v" * 200])
@pytest.mark.parametrize("key", [None, b"", b"k" * 130])
def test_native_record_fields_at_every_record_boundary(key, value):
    """Each record of a small section made one byte shorter or longer (and the last one's
    header count cut off): C and the numpy reference agree on every such boundary."""
    _needs_native_fields()
    builder, section, zz = _section_and_lengths(
        [Record(key, value, T0 + i, [("h", b"x")] if i == 1 else []) for i in range(3)])
    for i in range(len(zz)):
        for change in (-1, 1):
            bent = zz.copy()
            bent[i] += 2 * change
            answered = _native_fields_agree(builder, bytes(section), bent)
            assert not (answered and i == len(zz) - 1 and change == -1)


# ---- take_batches: many batches of a read buffer queued in one call -----------------------------

_chunk_batches = st.lists(st.tuples(
    st.sampled_from(["plain", "plain", "plain", "gzip", "marker", "log-append-time"]),
    st.lists(st.tuples(st.none() | st.binary(max_size=8),
                       st.none() | st.binary(max_size=12) | st.binary(min_size=130, max_size=200)),
             min_size=1, max_size=6)), min_size=1, max_size=8)


def _chunk(batches) -> tuple[bytes, list[int]]:
    """Batches back to back, as a segment read gives them: (buffer, position of each batch)."""
    from kstore.records import TimestampType
    buf, positions, offset = bytearray(), [], 0
    for kind, rows in batches:
        positions.append(len(buf))
        if kind == "marker":
            data = build_control_batch(ControlRecordType.ABORT, base_offset=offset, timestamp=T0,
                                       producer_id=3, producer_epoch=0)
            offset += 1
        else:
            data = build_batch([Record(k, v, T0 + i) for i, (k, v) in enumerate(rows)],
                               base_offset=offset,
                               compression=Compression.GZIP if kind == "gzip" else Compression.NONE,
                               timestamp_type=(TimestampType.LOG_APPEND_TIME
                                               if kind == "log-append-time" else
                                               TimestampType.CREATE_TIME), max_timestamp=T0 + 99)
            offset += len(rows)
        buf += data
    return bytes(buf), positions


@settings(max_examples=300, deadline=None)
@given(batches=_chunk_batches, bounds=st.tuples(st.integers(0, 30), st.integers(0, 40)),
       first=st.integers(0, 3), max_records=st.integers(1, 20), check_crcs=st.booleans(),
       flips=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=2))
def test_native_take_batches_equals_the_python_reference(batches, bounds, first, max_records,
                                                         check_crcs, flips):
    """`take_batches` in kstore/_codec.c against the Python reference in kstore/spark/decode.py:
    the same batches taken (the same index to go on from, the same meta and record lengths) on
    plain, compressed, marker and log-append-time batches, bounds cutting through them, a limit
    of records, and bytes flipped anywhere (a bad CRC, length, magic or record)."""
    from kstore import native
    from kstore.records import crc32c
    from kstore.spark.decode import take_batches
    if getattr(native.codec, "take_batches", None) is None:
        pytest.skip("the native codec is not built: `pip install -e .` with a C compiler")
    buf, positions = _chunk(batches)
    buf = bytearray(buf)
    for where, byte in flips:
        buf[where % len(buf)] = byte
    at = np.array(positions, dtype=np.int64)
    first = min(first, len(positions))
    args = (bytes(buf), at, first, min(bounds), max(bounds), check_crcs, crc32c, max_records)
    assert native.codec.take_batches(*args) == take_batches(*args)


@settings(max_examples=150, deadline=None)
@given(batches=_chunk_batches, bounds=st.tuples(st.integers(0, 30), st.integers(0, 40)),
       rows_per_batch=st.integers(1, 12), flip=st.none() | st.integers(0, 1 << 16))
def test_add_batches_decodes_what_add_batch_decodes_one_batch_at_a_time(batches, bounds,
                                                                        rows_per_batch, flip):
    """ColumnBuilder.add_batches (runs of batches through take_batches, in C or Python) yields the
    same Arrow rows as add_batch called batch by batch, and the same error for a damaged batch,
    with the native codec and with the pure-Python one."""
    from kstore import native
    from kstore.errors import KStoreError
    from kstore.spark.decode import ColumnBuilder
    buf, positions = _chunk(batches)
    if flip is not None:
        buf = bytearray(buf)
        buf[flip % len(buf)] ^= 0x5A
        buf = bytes(buf)
    start, end = min(bounds), max(bounds)

    def decode(many: bool):
        builder = ColumnBuilder("t", 0, include_headers=True, rows_per_batch=rows_per_batch)
        out = []
        try:
            if many:
                out += builder.add_batches(buf, positions, start, end)
            else:
                for pos in positions:
                    builder.add_batch(buf, pos, start, end)
                    if builder.full() and (batch := builder.flush()) is not None:
                        out.append(batch)
            last = builder.flush()
        except (KStoreError, IndexError, ValueError) as e:
            return type(e), str(e)
        rows = pa.Table.from_batches(out + ([last] if last is not None else []),
                                     schema=builder.schema).to_pylist()
        return rows, [b.num_rows for b in out]

    expected = decode(False)
    assert decode(True) == expected
    with native.pure_python():
        assert decode(True) == expected


def test_a_pruned_read_range_follows_offsets_without_the_offset_column_selected(mixed):
    backend = LogDirBackend(str(mixed))
    start, end = backend.offset_ranges([("mixed", 0)])[("mixed", 0)]
    r = KStoreRange(backend.location, "mixed", 0, start, end)
    keys = [k for b in project(read_range(r, columns=["key"]), ["key"])
            for k in b.column("key").to_pylist()]
    assert keys == [row[2] for row in engine(mixed, "mixed") if row[0] == 0]


@pytest.mark.parametrize("start,end", [(0, 1), (5, 17), (37, 38), (59, 61), (60, 62), (100, 201)])
def test_ranges_start_mid_batch_and_use_the_sparse_index(mixed, start, end):
    expected = [r for r in engine(mixed, "mixed") if r[0] == 1 and start <= r[1] < end]
    backend = LogDirBackend(str(mixed))
    got = arrow_rows(backend.read_arrow("mixed", 1, start, end, include_headers=True))
    assert got == expected
    seg = LogDirReader(str(mixed)).partition("mixed", 1).segments()
    assert len(seg) > 1 and any(s.index_entries() for s in seg)


def test_offsets_match_the_engine_and_latest_is_the_checkpointed_high_watermark(mixed):
    reader = LogDirReader(str(mixed))
    assert reader.topic_partitions() == {"mixed": 2}
    assert reader.partition("mixed", 0).offsets() == (0, 201, 201)
    # A live broker appends: files grow, but the HW checkpoint is written only later.
    b = Broker(str(mixed))
    try:
        b.produce("mixed", 0, build_batch([Record(b"k", b"late", T0)]))
        start, hw, leo = reader.partition("mixed", 0).offsets()
        assert (start, hw, leo) == (0, 201, 202)          # not committed as far as readers know
        b.replica_manager.checkpoint_high_watermarks()
        assert reader.partition("mixed", 0).offsets() == (0, 202, 202)
    finally:
        b.shutdown()


def test_reading_never_writes_and_needs_no_lock(mixed):
    before = snapshot(mixed)
    assert len(read_all(mixed, "mixed")) == 400
    assert snapshot(mixed) == before                      # not a byte changed, no file created
    b = Broker(str(mixed))                                # a broker holds the .lock meanwhile
    try:
        assert read_all(mixed, "mixed") == [r for r in read_all(mixed, "mixed")]
        assert len(read_all(mixed, "mixed")) == 400
    finally:
        b.shutdown()


def test_a_real_kafka_log_dir_is_read_as_is():
    """A directory written by Apache Kafka (read-only files, no kstore metadata)."""
    for commit in ("510714e", "e856b9a"):
        backend = LogDirBackend(str(KAFKA_LOGS / commit))
        assert "foo" in backend.topic_partitions()
        start, end = backend.offset_ranges([("foo", 0)])[("foo", 0)]
        rows = arrow_rows(read_range(KStoreRange(backend.location, "foo", 0, start, end)))
        assert len(rows) == end - start >= 1


def test_offset_for_timestamp_matches_the_engine(tmp_path):
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("t", 1, configs={"segment.bytes": 2048, "index.interval.bytes": 128})
        ts = [T0 + 10 * i for i in range(300)]
        ts[150] = T0 + 5                     # out of order timestamps exist in Kafka logs too
        for i in range(0, 300, 7):
            b.produce("t", 0, build_batch([Record(b"k", b"v" * 20, ts[j])
                                           for j in range(i, min(i + 7, 300))]))
        log = b.get_log("t", 0)
        targets = [T0 - 1, T0, T0 + 5, T0 + 6, T0 + 1234, T0 + 2990, T0 + 2991]
        expected = {t: (lambda f: None if f is None else f.offset)(log.fetch_offset_by_timestamp(t))
                    for t in targets}
    part = LogDirReader(str(d)).partition("t", 0)
    assert {t: part.offset_for_timestamp(t, 300) for t in targets} == expected


def test_retention_and_compaction_move_the_offsets_the_reader_sees(tmp_path):
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("r", 1, configs={"segment.bytes": 1024, "retention.ms": -1})
        b.create_topic("c", 1, configs={"segment.bytes": 1024, "cleanup.policy": "compact",
                                        "min.cleanable.dirty.ratio": 0.01})
        for i in range(100):
            b.produce("r", 0, build_batch([Record(b"k%d" % i, b"v" * 30, T0 + i)]))
            b.produce("c", 0, build_batch([Record(b"u%d" % i if i % 10 == 0 else b"k%d" % (i % 5),
                                                  b"v%d" % i, T0 + i)]))
        b.get_log("r", 0).maybe_increment_log_start_offset(57)
        b.logs.run_retention()
        b.logs.run_cleaner()
    reader = LogDirReader(str(d))
    assert reader.partition("r", 0).offsets() == (57, 100, 100)
    assert read_all(d, "r") == engine(d, "r")
    compacted = read_all(d, "c")
    assert compacted == engine(d, "c")
    assert len(compacted) < 100
    offsets = [r[1] for r in compacted]
    assert offsets != list(range(offsets[0], offsets[0] + len(offsets)))   # gaps


def test_read_time_data_loss_rules(tmp_path):
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("r", 1, configs={"segment.bytes": 1024, "retention.ms": -1})
        for i in range(100):
            b.produce("r", 0, build_batch([Record(b"k", b"v" * 30, T0 + i)]))
        b.get_log("r", 0).maybe_increment_log_start_offset(57)
        b.logs.run_retention()
    loc = Location(log_dir=str(d))
    with pytest.raises(KStoreDataLossError) as e:
        list(read_range(KStoreRange(loc, "r", 0, 20, 80)))
    assert "r-0" in str(e.value) and "[20, 57)" in str(e.value) and "failOnDataLoss" in str(e.value)
    skipped = list(read_range(KStoreRange(loc, "r", 0, 20, 80, fail_on_data_loss=False)))
    assert [o for b in skipped for o in b.column("offset").to_pylist()] == list(range(57, 80))
    assert list(read_range(KStoreRange(loc, "r", 0, 10, 40, fail_on_data_loss=False))) == []
    # "earliest" is bound late: offsets that aged out after planning are not data loss.
    late = list(read_range(KStoreRange(loc, "r", 0, 0, 100, start_is_earliest=True)))
    assert sum(b.num_rows for b in late) == 43
    with pytest.raises(KStoreDataLossError, match=r"now ends at offset 100"):
        list(read_range(KStoreRange(loc, "r", 0, 90, 120)))


def test_min_partitions_and_max_records_split_ranges_like_kafka():
    loc = Location(log_dir="/x")
    ranges = [KStoreRange(loc, "t", 0, 0, 100, True), KStoreRange(loc, "t", 1, 0, 10)]
    split = split_ranges(ranges, 6, None)
    assert [(r.partition, r.start, r.end) for r in split] == [
        (0, 0, 20), (0, 20, 40), (0, 40, 60), (0, 60, 80), (0, 80, 100), (1, 0, 10)]
    assert [r.start_is_earliest for r in split[:2]] == [True, False]
    assert len(split_ranges(ranges, None, 30)) == 4 + 1
    assert split_ranges(ranges, 2, None) == ranges            # already enough tasks


# ---- options -------------------------------------------------------------------------------

BASE = {"path": "/tmp/x", "subscribe": "t"}


@pytest.mark.parametrize("options,streaming,message", [
    ({**BASE, "startingOfsets": "earliest"}, False, "unknown option 'startingofsets'"),
    ({"path": "/x"}, False, "One of the following options must be specified"),
    ({**BASE, "assign": '{"t":[0]}'}, False, "Only one of the following options"),
    ({**BASE, "startingOffsets": '{"t":{"0":1'}, False, "not valid JSON"),
    ({**BASE, "startingOffsets": '{"t":[0,1]}'}, False, "must map partitions to numbers"),
    ({**BASE, "startingOffsets": "newest"}, False, "must be 'earliest', 'latest' or Kafka's"),
    ({**BASE, "startingOffsets": "latest"}, False, "can't be latest for batch queries"),
    ({**BASE, "endingOffsets": '{"t":{"0":-2}}'}, False, "can't be earliest (-2)"),
    ({**BASE, "endingOffsets": "latest"}, True, "not valid in streaming queries"),
    ({**BASE, "minPartitions": "0"}, False, "must be a positive integer"),
    ({**BASE, "maxOffsetsPerTrigger": "many"}, True, "must be a positive integer"),
    ({**BASE, "failOnDataLoss": "maybe"}, False, "'failOnDataLoss' must be 'true' or 'false'"),
    ({**BASE, "startingTimestamp": "yesterday"}, False, "milliseconds since the epoch"),
    ({"path": "/x", "assign": '{"t":["0"]}'}, False, "expected e.g."),
    ({"path": "/x", "subscribePattern": "("}, False, "not a valid regular expression"),
    ({"subscribe": "t"}, False, "needs a log directory"),
    ({**BASE, "kafka.bootstrap.servers": "h:1"}, False, "not both"),
    ({**BASE, "kafka.auto.offset.reset": "earliest"}, True, "set the source option 'startingOffsets'"),
    ({**BASE, "kafka.isolation.level": "serializable"}, True, "read_uncommitted or read_committed"),
    ({**BASE, "maxTriggerDelay": "soon"}, True, "duration such as 15m"),
    ({**BASE, "minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "10"}, True, "must not exceed"),
    ({**BASE, "fetchOffset.numRetries": "-1"}, True, "non-negative integer"),
])
def test_bad_options_are_refused_with_a_clear_message(options, streaming, message):
    with pytest.raises(KStoreOptionError) as e:
        parse_source_options(options, streaming)
    assert message in str(e.value)


def test_options_are_case_insensitive_and_parse_kafkas_json():
    o = parse_source_options({"PATH": "/x", "Subscribe": "a, b", "STARTINGOFFSETS":
                              '{"a":{"0":5,"1":-2},"b":{"0":-1}}', "maxOffsetsPerTrigger": "10",
                              "includeheaders": "TRUE"}, True)
    assert o.topics == ["a", "b"] and o.include_headers and o.max_offsets_per_trigger == 10
    assert o.starting.offsets == {("a", 0): 5, ("a", 1): -2, ("b", 0): -1}
    with pytest.raises(KStoreOptionError, match="unknown option 'colour'"):
        parse_sink_options({"path": "/x", "topic": "t", "colour": "red"})


@pytest.mark.parametrize("option", ["kafka.compression.type", "kstore.compression"])
def test_an_unknown_codec_is_refused_naming_the_option_given(option):
    with pytest.raises(KStoreOptionError, match=f"^option '{option}': unknown compression type "
                                                f"'brotli'; expected one of"):
        parse_sink_options({"path": "/x", "topic": "t", option: "brotli"})
    assert parse_sink_options({"path": "/x", "topic": "t", option: "LZ4"}).compression == "lz4"


# ---- the sink's commit ---------------------------------------------------------------------

def _stage(tmp_path, name, topic, partition, values, task=0) -> StagedWrite:
    path = tmp_path / f"{name}.batches"
    run = StagedRun(topic, partition, [])
    with open(path, "wb") as f:
        for i in range(0, len(values), 2):
            data = build_batch([Record(None, v, T0) for v in values[i:i + 2]])
            run.batches.append((f.tell(), len(data), len(values[i:i + 2])))
            f.write(data)
    return StagedWrite(str(path), [run], len(values), task, "q1")


class _Crash(Exception):
    pass


class _CrashingAppender(LogDirAppender):
    commit_threads = 1                    # partitions one after the other: a known crash point

    def __init__(self, *a, crash_after: int):
        super().__init__(*a)
        self.left = crash_after

    def append(self, tp, data):
        if self.left == 0:
            raise _Crash()
        self.left -= 1
        super().append(tp, data)

    def max_append_bytes(self, tp) -> int:
        return 1                          # one staged batch per append: crash between any two


def test_sink_commit_is_exactly_once_per_batch_id_and_resumes_a_half_done_commit(tmp_path):
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("out", 2)
    staged = [_stage(tmp_path, "a", "out", 0, [b"a1", b"a2", b"a3"], 0),
              _stage(tmp_path, "b", "out", 1, [b"b1", b"b2", b"b3", b"b4"], 1)]
    with LogDirAppender(str(d), 1000) as app:
        commit_staged(app, staged, "q1", 0)
    with LogDirAppender(str(d), 1000) as app:                        # Spark re-commits batch 0
        assert commit_staged(app, staged, "q1", 0) == {}
    # batch 1 dies after one of its three produce calls ...
    staged1 = [_stage(tmp_path, "c", "out", 0, [b"c1", b"c2", b"c3", b"c4"], 0),
               _stage(tmp_path, "e", "out", 1, [b"e1"], 1)]
    with pytest.raises(_Crash):
        with _CrashingAppender(str(d), 1000, crash_after=1) as app:
            commit_staged(app, staged1, "q1", 1)
    state = json.loads((d / COMMITS_FILE).read_text())["q1"]
    assert state["batch_id"] == 1 and state["state"] == "pending"
    # ... and the retry appends exactly what is missing.
    with LogDirAppender(str(d), 1000) as app:
        commit_staged(app, staged1, "q1", 1)
    with Broker(str(d)) as b:
        assert [r.value for r in b.get_log("out", 0).records()] == [b"a1", b"a2", b"a3", b"c1",
                                                                    b"c2", b"c3", b"c4"]
        assert [r.value for r in b.get_log("out", 1).records()] == [b"b1", b"b2", b"b3", b"b4",
                                                                    b"e1"]
    assert json.loads((d / COMMITS_FILE).read_text())["q1"]["state"] == "committed"


def test_sink_commit_deletes_each_staged_file_once_it_is_in_the_log(tmp_path):
    """A staged file goes as soon as all of it is appended (its pages are not kept beside the
    log's); a commit resumed after a crash does not need the files already appended."""
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("out", 2)
    staged = [_stage(tmp_path, "a", "out", 0, [b"a1", b"a2", b"a3"], 0),
              _stage(tmp_path, "b", "out", 1, [b"b1", b"b2", b"b3"], 1)]
    with pytest.raises(_Crash):          # a's two batches are appended, then the commit dies
        with _CrashingAppender(str(d), 1000, crash_after=2) as app:
            commit_staged(app, staged, "q1", 0)
    assert not os.path.exists(staged[0].path) and os.path.exists(staged[1].path)
    with LogDirAppender(str(d), 1000) as app:
        commit_staged(app, staged, "q1", 0)
    assert not os.path.exists(staged[1].path)
    with Broker(str(d)) as b:
        assert [r.value for r in b.get_log("out", 0).records()] == [b"a1", b"a2", b"a3"]
        assert [r.value for r in b.get_log("out", 1).records()] == [b"b1", b"b2", b"b3"]


class _ParallelCrashingAppender(_CrashingAppender):
    commit_threads = 4                    # partitions side by side, as a real commit runs

    def append(self, tp, data):
        with self.lock:
            super().append(tp, data)

    def __enter__(self):
        import threading
        self.lock = threading.Lock()
        return super().__enter__()


@pytest.mark.parametrize("crash_after", [0, 2, 5, 9])
def test_a_parallel_commit_that_dies_in_one_partition_resumes_exactly(tmp_path, crash_after):
    """The commit appends partitions side by side, on threads; a failure in one of them fails the
    commit once the others have ended, and the retry appends exactly what is missing in every
    partition, each in task order."""
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("out", 4)
    values = {(task, p): [b"t%d-p%d-%d" % (task, p, i) for i in range(6)]
              for task in range(2) for p in range(4)}
    staged = []
    for task in range(2):
        parts = [_stage(tmp_path, f"t{task}p{p}", "out", p, values[(task, p)], task)
                 for p in range(4)]
        path = tmp_path / f"task{task}.batches"          # one staged file per task, as _stage writes
        runs, blob = [], bytearray()
        for m in parts:
            data = Path(m.path).read_bytes()
            run = m.runs[0]
            runs.append(StagedRun(run.topic, run.partition,
                                  [(len(blob) + pos, size, n) for pos, size, n in run.batches]))
            blob += data
        path.write_bytes(bytes(blob))
        staged.append(StagedWrite(str(path), runs, 24, task, "q1"))
    with pytest.raises(_Crash):
        with _ParallelCrashingAppender(str(d), 1000, crash_after=crash_after) as app:
            commit_staged(app, staged, "q1", 0)
    with LogDirAppender(str(d), 1000) as app:
        commit_staged(app, staged, "q1", 0)
    with Broker(str(d)) as b:
        for p in range(4):
            assert [r.value for r in b.get_log("out", p).records()] == \
                values[(0, p)] + values[(1, p)]
    assert not any(os.path.exists(m.path) for m in staged)


def test_a_re_run_batch_routes_keyless_rows_as_the_first_run_did_so_a_resumed_commit_is_exact(
        tmp_path):
    """Keyless rows go to partitions in sticky runs of ~batch.size bytes, each run's partition
    drawn at random (Kafka's BuiltInPartitioner). The staged commit resumes a batch by counting
    records per partition, so a re-run of the batch (the same task of the same batch id, after
    the driver died half-way through the commit) must stage the same rows in the same
    partitions: the draws are seeded by sink, batch id and task."""
    from pyspark.sql.types import BinaryType, StructField, StructType
    from kstore.spark.sink import KStoreStreamWriter
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("out", 4)
    values = [b"row-%05d-" % i + b"x" * 90 for i in range(3000)]       # ~20 sticky runs
    rb = pa.record_batch([pa.array(values, pa.binary())], names=["value"])
    writer = KStoreStreamWriter({"path": str(d), "topic": "out"},
                                StructType([StructField("value", BinaryType())]), False)

    def attempt(n: int) -> list[StagedWrite]:
        return [writer._stage(iter([rb.slice(task * 1500, 1500)]), "7", "q", task, f"{n}-{task}")
                for task in range(2)]

    first = attempt(0)
    with pytest.raises(_Crash):                  # the driver dies after 3 of its appends
        with _CrashingAppender(str(d), 1000, crash_after=3) as app:
            commit_staged(app, first, "q", 7)
    again = attempt(1)                           # Spark runs batch 7 again: new staged files
    assert [[(r.topic, r.partition, r.records) for r in m.runs] for m in again] == \
        [[(r.topic, r.partition, r.records) for r in m.runs] for m in first]
    with LogDirAppender(str(d), 1000) as app:
        commit_staged(app, again, "q", 7)
    with Broker(str(d)) as b:
        stored = [r.value for p in range(4) for r in b.get_log("out", p).records()]
    assert sorted(stored) == sorted(values)
    other_batch = writer._stage(iter([rb.slice(0, 1500)]), "8", "q", 0, "0-9")
    assert [r.records for r in other_batch.runs] != [r.records for r in first[0].runs]


class _CountingAppender(LogDirAppender):
    def __init__(self, *a, limit: int | None = None):
        super().__init__(*a)
        self.appends, self.limit = [], limit

    def append(self, tp, data):
        self.appends.append((tp, len(data)))
        super().append(tp, data)

    def max_append_bytes(self, tp) -> int:
        return self.limit or super().max_append_bytes(tp)


def test_sink_commit_appends_consecutive_staged_batches_together_up_to_the_limit(tmp_path):
    """The commit hands the log several staged batches per append (up to 1 MiB, or a small
    segment.bytes), not one append per batch: same records and offsets either way."""
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("out", 2)
        b.create_topic("tiny", 1, configs={"segment.bytes": 200})
    values = [b"v%02d" % i for i in range(20)]
    with _CountingAppender(str(d), 1000) as app:
        commit_staged(app, [_stage(tmp_path, "a", "out", 0, values, 0)], "q", 0)
        assert [tp for tp, _ in app.appends] == [("out", 0)]       # 10 batches, one append
        assert app.max_append_bytes(("tiny", 0)) == 200
    one_batch = build_batch([Record(None, b"v00", T0), Record(None, b"v01", T0)])
    with _CountingAppender(str(d), 1000, limit=3 * len(one_batch)) as app:
        commit_staged(app, [_stage(tmp_path, "b", "out", 1, values, 1)], "q", 1)
        assert [n for _tp, n in app.appends] == [3 * len(one_batch)] * 3 + [len(one_batch)]
    with Broker(str(d)) as b:
        for p in range(2):
            assert [(r.offset, r.value) for r in b.get_log("out", p).records()] == \
                list(enumerate(values))


def test_sink_waits_for_the_lock_then_says_what_to_do(tmp_path):
    d = tmp_path / "logs"
    b = Broker(str(d))
    try:
        with pytest.raises(KStoreSinkError) as e:
            with LogDirAppender(str(d), 200):
                pass
        assert "in use" in str(e.value) and "kafka.bootstrap.servers" in str(e.value)
    finally:
        b.shutdown()
    shutil.rmtree(d)


# ---- the streaming reader's planning, driven directly (Spark calls these on the driver) -------

def test_stream_planning_admission_control_available_now_and_partition_changes(tmp_path, capfd):
    from kstore.spark.source import KStoreStreamReader
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("s", 2)
        b.produce("s", 0, build_batch([Record(b"k", b"v", T0 + i) for i in range(30)]))
        b.produce("s", 1, build_batch([Record(b"k", b"v", T0 + i) for i in range(10)]))
    reader = KStoreStreamReader(parse_source_options({"path": str(d), "subscribe": "s",
                                                      "maxOffsetsPerTrigger": "8"}, True))
    start = reader.initialOffset()
    assert start == {"s": {"0": 30, "1": 10}}                       # default: latest
    assert isinstance(reader.getDefaultReadLimit(), ReadMaxRows)
    begin = {"s": {"0": 0, "1": 0}}
    # 8 offsets shared 30:10 -> 6 and 2 (Kafka's rateLimit)
    assert reader.latestOffset(begin, ReadMaxRows(8)) == {"s": {"0": 6, "1": 2}}
    assert reader.latestOffset(begin, ReadAllAvailable()) == {"s": {"0": 30, "1": 10}}
    reader.prepareForTriggerAvailableNow()                          # freeze the target ...
    with Broker(str(d)) as b:                                       # ... then more data arrives
        b.produce("s", 0, build_batch([Record(b"k", b"v", T0)] * 5))
        b.create_partitions("s", 3)
        b.produce("s", 2, build_batch([Record(b"k", b"v", T0)] * 4))
    assert reader.latestOffset(begin, ReadAllAvailable()) == {"s": {"0": 30, "1": 10}}
    fresh = KStoreStreamReader(parse_source_options({"path": str(d), "subscribe": "s"}, True))
    end = fresh.latestOffset({"s": {"0": 30, "1": 10}}, ReadAllAvailable())
    assert end == {"s": {"0": 35, "1": 10, "2": 4}}                 # a new partition is found
    ranges = fresh.partitions({"s": {"0": 30, "1": 10}}, end)
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 30, 35), (2, 0, 4)]
    assert pickle_roundtrip(ranges[0]).end == 35                    # what executors receive
    # a partition that disappeared, and offsets that went backwards, are data loss
    with pytest.raises(KStoreDataLossError, match=r"Partitions \[s-7\] are gone"):
        fresh.partitions({"s": {"0": 30, "7": 3}}, {"s": {"0": 35}})
    with pytest.raises(KStoreDataLossError, match="s-0's offset was changed from 40 to 35"):
        fresh.partitions({"s": {"0": 40}}, {"s": {"0": 35}})
    lenient = KStoreStreamReader(parse_source_options({"path": str(d), "subscribe": "s",
                                                       "failOnDataLoss": "false"}, True))
    capfd.readouterr()
    assert lenient.partitions({"s": {"0": 40}}, {"s": {"0": 35}}) == []
    assert "WARN kstore.spark: Partition s-0's offset was changed" in capfd.readouterr().err


def pickle_roundtrip(obj):
    import pickle
    return pickle.loads(pickle.dumps(obj))


def test_timestamps_resolve_like_offsets_for_times(tmp_path):
    from kstore.spark.source import resolve_offsets
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("s", 1)
        b.produce("s", 0, build_batch([Record(b"k", b"v", T0 + 10 * i) for i in range(10)]))
    backend = LogDirBackend(str(d))
    o = parse_source_options({"path": str(d), "subscribe": "s", "startingTimestamp": str(T0 + 15),
                              "endingTimestamp": str(T0 + 61)}, False)
    assert resolve_offsets(backend, o.starting, "earliest", [("s", 0)], "startingOffsets")[0] == {("s", 0): 2}
    assert resolve_offsets(backend, o.ending, "latest", [("s", 0)], "endingOffsets")[0] == {("s", 0): 7}
    late = parse_source_options({"path": str(d), "subscribe": "s", "endingTimestamp": str(T0 + 999)}, False)
    assert resolve_offsets(backend, late.ending, "latest", [("s", 0)], "endingOffsets")[0] == {("s", 0): 10}


def test_a_deleted_partition_is_data_loss_not_a_crash(tmp_path, capfd):
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("gone", 1)
        b.produce("gone", 0, build_batch([Record(b"k", b"v", T0)] * 10))
    loc = Location(log_dir=str(d))
    shutil.rmtree(d / "gone-0")
    with pytest.raises(KStoreDataLossError, match=r"Cannot fetch offsets \[0, 10\) of gone-0"):
        list(read_range(KStoreRange(loc, "gone", 0, 0, 10)))
    capfd.readouterr()
    assert list(read_range(KStoreRange(loc, "gone", 0, 0, 10, fail_on_data_loss=False))) == []
    assert "WARN kstore.spark: Cannot fetch offsets [0, 10) of gone-0" in capfd.readouterr().err


# ---- the sink's task side: Arrow → batches, routing, stale staging, a serving broker ---------

@pytest.fixture(params=["native", "pure"])
def either_codec(request):
    """The test runs with the native codec (where built) and inside native.pure_python()."""
    from kstore import native
    if request.param == "native":
        yield
        return
    with native.pure_python():
        yield


def test_arrow_encoding_gives_the_bytes_build_batch_gives(either_codec):
    from kstore.spark.encode import BinaryColumn, encode_batches
    keys = pa.array([None if i % 5 == 0 else f"k{i}" for i in range(40)])
    values = pa.array([None if i % 7 == 3 else b"v" * (i * 9) for i in range(40)], pa.binary())
    for codec in (Compression.NONE, Compression.GZIP, Compression.ZSTD):
        got = list(encode_batches(BinaryColumn(keys, 40), BinaryColumn(values, 40), T0, codec))
        expected = build_batch([Record(None if k is None else k.encode(), v, T0)
                                for k, v in zip(keys.to_pylist(), values.to_pylist())],
                               compression=codec)
        assert got == [(expected, 40)]
    # big runs are cut below max.message.bytes, in order
    big = pa.array([b"x" * 1000] * 2000, pa.binary())
    runs = list(encode_batches(BinaryColumn(None, 2000), BinaryColumn(big, 2000), T0,
                               Compression.NONE))
    assert len(runs) > 1 and sum(n for _b, n in runs) == 2000
    assert all(len(b) < 1024 * 1024 for b, _n in runs)
    # a sliced Arrow array (non-zero offset) encodes its own rows only
    sliced = keys.slice(10, 5)
    ((data, n),) = encode_batches(BinaryColumn(sliced, 5), BinaryColumn(values.slice(10, 5), 5),
                                  T0, Compression.NONE)
    assert data == build_batch([Record(None if k is None else k.encode(), v, T0) for k, v in
                                zip(sliced.to_pylist(), values.slice(10, 5).to_pylist())])


_cells = st.none() | st.binary(max_size=300)


def _needs_native(name: str):
    from kstore import native
    if getattr(native.codec, name, None) is None:
        pytest.skip("the native codec is not built: `pip install -e .` with a C compiler")


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(_cells, _cells), max_size=60), keyless=st.booleans(),
       cut=st.integers(0, 5), pick=st.randoms(use_true_random=False))
def test_native_records_section_gives_the_numpy_references_bytes(rows, keyless, cut, pick):
    """`records_section` in kstore/_codec.c against the numpy reference, on Arrow columns that
    are sliced (a non-zero offset), with nulls, empty and long cells, no key column, and rows
    taken out of order (as routing takes a partition's rows)."""
    _needs_native("records_section")
    from kstore.spark.encode import (BinaryColumn, native_or_reference_records_section,
                                     records_section)
    keys = pa.array([b"pad"] * cut + [k for k, _v in rows], pa.binary()).slice(cut)
    values = pa.array([b"pad"] * cut + [v for _k, v in rows], pa.binary()).slice(cut)
    n = len(rows)
    order = list(range(n))
    pick.shuffle(order)
    idx = np.array(order[:max(n - 2, 0)], dtype=np.int64)
    for key_column, value_column in (
            (BinaryColumn(None if keyless else keys, n), BinaryColumn(values, n)),
            (BinaryColumn(None if keyless else keys, n).take(idx), BinaryColumn(values, n).take(idx))):
        assert native_or_reference_records_section(key_column, value_column) == \
            records_section(key_column, value_column)
        # with room for the batch header in front: a bytearray, the same bytes after it
        native_roomy = native_or_reference_records_section(key_column, value_column, 61)
        assert native_roomy == records_section(key_column, value_column, 61)
        assert type(native_roomy) is bytearray and native_roomy[:61] == bytes(61)
        if n:
            from kstore.spark.encode import wrap_batch
            from kstore.records import Compression
            copied = wrap_batch(records_section(key_column, value_column),
                                len(value_column.lengths), T0, Compression.NONE, 5, 1, 9, True)
            assert wrap_batch(native_roomy, len(value_column.lengths), T0, Compression.NONE,
                              5, 1, 9, True, in_place=True) is native_roomy
            assert bytes(native_roomy) == copied


def test_native_records_section_declines_cells_outside_their_buffers():
    """Starts or lengths that do not fit the data buffer get None (the reference then runs), never
    a read past the buffer."""
    _needs_native("records_section")
    from kstore import native
    starts, lengths = np.array([0, 2], dtype=np.int64), np.array([2, 2], dtype=np.int64)
    ok = native.codec.records_section(b"abcd", starts, lengths, b"wxyz", starts, lengths)
    assert ok is not None and ok.count(b"ab") == 1 and ok.count(b"yz") == 1
    for bad_starts, bad_lengths in (([0, 3], [2, 2]), ([0, -1], [2, 2]), ([0, 2], [2, -2]),
                                    ([0, 2], [2, 1 << 40])):
        s_, l_ = np.array(bad_starts, dtype=np.int64), np.array(bad_lengths, dtype=np.int64)
        assert native.codec.records_section(b"abcd", s_, l_, b"wxyz", starts, lengths) is None
        assert native.codec.records_section(b"abcd", starts, lengths, b"wxyz", s_, l_) is None
    assert native.codec.records_section(b"", starts[:1], lengths, b"", starts, lengths) is None


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.none() | st.binary(max_size=40), max_size=80),
       count=st.integers(1, 1000), cut=st.integers(0, 3))
def test_native_key_partitions_are_partition_for_keys(keys, count, cut):
    """`partitions_for_keys` in C gives partition_for_key (murmur2, toPositive, modulo) for every
    non-null key of a sliced Arrow column, -1 for a null key; the sink routes with it."""
    _needs_native("partitions_for_keys")
    from kstore import native
    from kstore.partitioner import partition_for_key
    from kstore.spark.encode import BinaryColumn
    column = BinaryColumn(pa.array([b"x"] * cut + keys, pa.binary()).slice(cut), len(keys))
    data, starts = column.parts()
    found = np.frombuffer(native.codec.partitions_for_keys(data, starts, column.lengths, count),
                          dtype=np.int64)
    assert found.tolist() == [-1 if k is None else partition_for_key(k, count) for k in keys]


def test_native_key_partitions_decline_what_the_reference_refuses():
    _needs_native("partitions_for_keys")
    from kstore import native
    starts, lengths = np.array([0], dtype=np.int64), np.array([4], dtype=np.int64)
    assert native.codec.partitions_for_keys(b"abcd", starts, lengths, 0) is None   # no partitions
    assert native.codec.partitions_for_keys(b"abc", starts, lengths, 3) is None    # past the end


def test_sink_routing_is_kafkas_partitioner(either_codec):
    from kstore.partitioner import partition_for_key
    from kstore.spark.encode import BinaryColumn
    from kstore.spark.writer import KStoreSinkError, Router
    n = 3000
    rb = pa.RecordBatch.from_pydict({
        "key": [None if i % 3 == 0 else f"user-{i % 50}" for i in range(n)],
        "value": [b"v%d" % i for i in range(n)],
        "partition": [4 if i % 10 == 0 else None for i in range(n)]},
        schema=pa.schema([("key", pa.string()), ("value", pa.binary()), ("partition", pa.int32())]))
    router = Router("t", {"t": 5}, "test")
    n_keys = BinaryColumn(rb.column(0).cast(pa.binary()), n)
    routed = router.route(rb, n_keys, BinaryColumn(rb.column(1), n))
    where = {}
    for topic, p, idx in routed:
        assert topic == "t" and list(idx) == sorted(idx)            # rows keep their order
        where.update({int(i): p for i in idx})
    assert sorted(where) == list(range(n))
    keys = rb.column(0).to_pylist()
    for i in range(n):
        if i % 10 == 0:
            assert where[i] == 4                                    # an explicit partition wins
        elif keys[i] is not None:
            assert where[i] == partition_for_key(keys[i].encode(), 5)
    keyless = [where[i] for i in range(n) if keys[i] is None and i % 10]
    switches = sum(a != b for a, b in zip(keyless, keyless[1:]))
    assert 0 < switches < len(keyless) // 20                        # sticky runs, not round-robin
    with pytest.raises(KStoreSinkError, match="partition 9 of topic 't' does not exist"):
        bad = pa.RecordBatch.from_pydict({"value": [b"x"], "partition": [9]},
                                         schema=pa.schema([("value", pa.binary()),
                                                           ("partition", pa.int32())]))
        router.route(bad, BinaryColumn(None, 1), BinaryColumn(bad.column(0), 1))


def test_stale_staging_left_by_a_killed_driver_is_removed_at_the_next_commit(tmp_path):
    from kstore.spark.sink import STAGING_DIR_NAME, remove_stale_staging
    root = tmp_path / STAGING_DIR_NAME
    for name in ("dead", "live", "mine"):
        (root / name / "batch-0").mkdir(parents=True)
        (root / name / "batch-0" / "task-00000-0-1.batches").write_bytes(b"x")
    old = os.path.getmtime(root / "live") - 3600
    for path in [root / "dead", root / "dead" / "batch-0",
                 root / "dead" / "batch-0" / "task-00000-0-1.batches", root / "mine"]:
        os.utime(path, (old, old))
    assert remove_stale_staging(str(root), keep={"mine"}, stale_after_s=600) == ["dead"]
    assert sorted(os.listdir(root)) == ["live", "mine"]


def test_the_sink_finds_a_broker_serving_the_log_dir(tmp_path):
    import socket
    from kstore.spark.sink import serving_broker
    d = tmp_path / "logs"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert serving_broker(str(d)) is None                            # no directory yet
    holder = Broker(str(d), host="127.0.0.1", port=port)
    try:
        assert serving_broker(str(d)) is None                       # locked, but nobody listens
        from kstore.server import KafkaServer
        other = Broker(str(tmp_path / "other"), host="127.0.0.1", port=port)
        stranger = KafkaServer(other, "127.0.0.1", port).start_in_thread()
        try:                                       # another cluster's broker on that port
            assert serving_broker(str(d)) is None
        finally:
            stranger.stop()
            other.shutdown()
        from kstore.server import KafkaServer
        server = KafkaServer(holder, "127.0.0.1", port)
        server.start_in_thread()
        try:
            assert serving_broker(str(d)) == f"127.0.0.1:{port}"
        finally:
            server.stop()
    finally:
        holder.shutdown()
    assert serving_broker(str(d)) is None                           # lock free: staged mode


def test_kafka_client_options_are_accepted_and_reported_once(capsys):
    from kstore.spark import options as options_module
    options_module._REPORTED.clear()
    opts = {**BASE, "kafka.bootstrap.servers": None, "kafka.group.id": "g", "groupIdPrefix": "p",
            "kafka.session.timeout.ms": "1000", "kafka.isolation.level": "read_committed",
            "fetchOffset.numRetries": "3", "minOffsetsPerTrigger": "5", "maxTriggerDelay": "2m"}
    del opts["kafka.bootstrap.servers"]
    parsed = parse_source_options(opts, True)
    assert parsed.isolation_level == "read_committed"
    assert parsed.min_offsets_per_trigger == 5 and parsed.max_trigger_delay_ms == 120_000
    first = capsys.readouterr().err
    assert first.count("WARN kstore.spark: options accepted but ignored") == 1
    assert "isolation" not in first and parsed.location.read_committed   # honoured, not ignored
    for name in ("kafka.group.id", "groupIdPrefix", "kafka.session.timeout.ms",
                 "fetchOffset.numRetries"):
        assert name.lower() in first.lower()
    parse_source_options(opts, True)
    assert capsys.readouterr().err == ""                         # once per process
    sink = parse_sink_options({"path": "/x", "topic": "t", "kafka.compression.type": "zstd",
                               "kafka.acks": "all", "kafka.linger.ms": "5"})
    assert sink.compression == "zstd"
    assert "kafka.linger.ms" in capsys.readouterr().err
    with pytest.raises(KStoreOptionError, match="'value.serializer' is not supported"):
        parse_sink_options({"path": "/x", "topic": "t", "kafka.value.serializer": "x"})
    # the transaction timeout of the sink's transactional producers (Kafka's default: 60 s)
    assert parse_sink_options({"path": "/x", "topic": "t"}).transaction_timeout_ms == 60000
    assert parse_sink_options({"path": "/x", "topic": "t", "kafka.transaction.timeout.ms":
                               "120000"}).transaction_timeout_ms == 120000
    with pytest.raises(KStoreOptionError, match="kafka.transaction.timeout.ms"):
        parse_sink_options({"path": "/x", "topic": "t", "kafka.transaction.timeout.ms": "soon"})


def test_min_offsets_per_trigger_holds_a_batch_back_until_the_delay_passed(monkeypatch):
    from kstore.spark.source import KStoreStreamReader
    opts = parse_source_options({**BASE, "minOffsetsPerTrigger": "100",
                                 "maxTriggerDelay": "10s"}, True)
    reader = KStoreStreamReader(opts)
    clock = [1000.0]
    monkeypatch.setattr("kstore.spark.source.time.time", lambda: clock[0])
    tp = ("t", 0)
    assert not reader._delay({tp: 0}, {tp: 10}, {})          # the first batch never waits
    clock[0] += 1
    assert reader._delay({tp: 10}, {tp: 60}, {})             # 50 < 100 offsets: wait
    assert not reader._delay({tp: 10}, {tp: 110}, {})        # 100 waiting: go
    clock[0] += 5
    assert reader._delay({tp: 110}, {tp: 120}, {})
    clock[0] += 10                                           # maxTriggerDelay passed: go anyway
    assert not reader._delay({tp: 110}, {tp: 120}, {})
    reader._target = {tp: 120}                               # Trigger.AvailableNow never waits
    clock[0] += 1
    assert not reader._delay({tp: 120}, {tp: 121}, {})


def _committed_values(broker, topic: str, partitions: int) -> list[bytes]:
    """What a read_committed reader of `topic` gets (test_transactions.committed_view), once the
    coordinator has written the markers of every ended transaction (EndTxn answers before them,
    as Kafka's does)."""
    from test_transactions import committed_view
    coordinator = broker.transaction_coordinator
    for tid in coordinator.transactional_ids():
        state = coordinator.wait_completed(tid, timeout_s=30)
        assert state not in ("PrepareCommit", "PrepareAbort"), f"{tid}'s markers not written in 30 s"
    return [v for p in range(partitions) for v in committed_view(broker.get_log(topic, p))]


@pytest.fixture
def txn_server(tmp_path):
    from kstore.server import KafkaServer
    broker = Broker(str(tmp_path / "logs"), port=0)
    server = KafkaServer(broker, "127.0.0.1", 0).start_in_thread()
    broker.create_topic("t", 2)
    yield broker, f"127.0.0.1:{server.port}"
    server.stop()
    broker.shutdown()


def _task_attempt(servers: str, values: list[bytes], tid: str, resend: bool = False,
                  timeout_ms: int = 60000):
    """One write task's attempt as the sink runs it: a transactional producer, not committed."""
    from kstore.spark.writer import Router, TaskProducer, encoded_runs
    producer = TaskProducer(servers, 5000, "task-0", transactional_id=tid,
                            transaction_timeout_ms=timeout_ms)
    rows = pa.RecordBatch.from_pydict({"value": values})
    for topic, p, data, n in encoded_runs(rows, Router("t", {"t": 2}, "test"), Compression.NONE,
                                          T0, producer):
        producer.send(topic, p, data, n)
        if resend:
            producer.send(topic, p, data, n)   # as after a lost response: same sequence
    producer.close()
    return producer


def test_a_retried_task_fences_its_earlier_attempt_and_the_driver_commits_once(txn_server):
    """What the network sink's exactly-once rests on (kstore.spark.writer): a task attempt is a
    transactional producer; a re-sent batch is recognised by its sequence; a retried attempt with
    the same transactional id fences the first and aborts what it wrote; read_committed readers
    see the rows only after the driver's EndTxn, and exactly once."""
    from kstore.remote_broker import RemoteBroker
    from kstore.transaction_manager import end_transaction
    broker, servers = txn_server
    first = _task_attempt(servers, [b"a", b"b", b"c"], "kstore-spark-q-0", resend=True)
    assert first.txn.partitions and _committed_values(broker, "t", 2) == []    # not committed
    second = _task_attempt(servers, [b"a", b"b", b"c"], "kstore-spark-q-0")    # Spark's retry
    assert (second.producer_id, second.producer_epoch) == (first.producer_id,
                                                           first.producer_epoch + 2)
    assert _committed_values(broker, "t", 2) == []        # the first attempt's rows were aborted
    with RemoteBroker(servers) as client:
        with pytest.raises(Exception, match="PRODUCER_FENCED"):   # the late first attempt
            end_transaction(client, "kstore-spark-q-0", first.producer_id, first.producer_epoch, True)
        end_transaction(client, "kstore-spark-q-0", second.producer_id, second.producer_epoch, True)
        end_transaction(client, "kstore-spark-q-0", second.producer_id, second.producer_epoch, True)
    assert sorted(_committed_values(broker, "t", 2)) == [b"a", b"b", b"c"]
    everything = [r.value for p in range(2) for r in broker.get_log("t", p).records()]
    assert sorted(everything) == [b"a", b"a", b"b", b"b", b"c", b"c"]   # aborted rows stay stored


def _record_batches(writer, sink_id: str, batches: int) -> list[str]:
    """A query's driver recording `batches` committed batches in the sink's record, checking
    before each that its previous one is still there. Returns what it found missing."""
    lost = []
    for batch_id in range(batches):
        seen = writer._load_marks().get(sink_id, {}).get("batch_id", -1)
        if seen != batch_id - 1:
            lost.append(f"{sink_id}: batch {batch_id - 1} recorded, found {seen}")
        writer._save_mark(sink_id, {"batch_id": batch_id, "state": "committed"})
    return lost


def test_queries_sharing_the_record_of_committed_batches_never_lose_each_other_s(txn_server,
                                                                                 tmp_path):
    """Two drivers whose queries record their batches in one file (one kstore.stagingDir, no
    checkpointLocation) update it at the same time: neither's record overwrites the other's."""
    import multiprocessing
    from kstore.spark.sink import KStoreStreamWriter
    from pyspark.sql.types import BinaryType, StructField, StructType
    _broker, servers = txn_server
    options = {"kafka.bootstrap.servers": servers, "topic": "t",
               "kstore.stagingDir": str(tmp_path / "staging")}
    writer = KStoreStreamWriter(options, StructType([StructField("value", BinaryType())]), False)
    with multiprocessing.get_context("fork").Pool(3) as pool:
        lost = pool.starmap(_record_batches, [(writer, f"query-{q}", 150) for q in range(3)])
    assert lost == [[], [], []]
    marks = writer._load_marks()
    assert {q: m["batch_id"] for q, m in marks.items()} == {f"query-{q}": 149 for q in range(3)}


def test_a_killed_driver_s_half_done_commit_is_finished_by_the_restarted_query(txn_server, tmp_path):
    """The driver records the transactions it is committing before the first EndTxn. Killed
    after committing task 0 only, the restarted query's writer commits task 1 on start, and the
    re-run of the batch skips both tasks; a transaction the coordinator aborted meanwhile is
    re-written by its task only."""
    from kstore.spark.sink import KStoreStreamWriter, ProducedWrite, Recovered
    from kstore.transaction_manager import end_transaction
    from kstore.remote_broker import RemoteBroker
    broker, servers = txn_server
    ck = tmp_path / "ck"
    options = {"kafka.bootstrap.servers": servers, "topic": "t", "checkpointLocation": str(ck)}
    from pyspark.sql.types import BinaryType, StructField, StructType
    schema = StructType([StructField("value", BinaryType())])
    writer = KStoreStreamWriter(options, schema, False)
    tasks = [_task_attempt(servers, [b"x%d" % i for i in range(3)], f"kstore-spark-q-{i}",
                           timeout_ms=1000 if i == 2 else 60000) for i in range(3)]
    messages = [ProducedWrite(3, i, "q", transactional_id=t.txn.transactional_id,
                              producer_id=t.producer_id, producer_epoch=t.producer_epoch)
                for i, t in enumerate(tasks)]
    # the driver, killed mid-commit: the record written, task 0 committed, the others not
    txns = [[m.task, m.transactional_id, m.producer_id, m.producer_epoch] for m in messages]
    writer._save_mark("q", {"batch_id": 5, "state": "committing", "transactions": txns,
                            "committed_tasks": []})
    with RemoteBroker(servers) as client:
        end_transaction(client, *txns[0][1:], True)
    assert len(_committed_values(broker, "t", 2)) == 3
    # meanwhile the coordinator aborts task 2's transaction (its timeout passed)
    aborted = broker.transaction_coordinator.abort_timed_out(broker.clock.milliseconds() + 5000)
    assert aborted == ["kstore-spark-q-2"]
    restarted = KStoreStreamWriter(options, schema, False)
    assert restarted.recovered["q"] == Recovered(4, 5, [0, 1])
    assert len(_committed_values(broker, "t", 2)) == 6          # task 1 committed on restart
    assert [restarted._skips("q", 5, i) for i in range(3)] == [True, True, False]
    assert not restarted._skips("another-query", 5, 0)
    state = json.loads((ck / "kstore-sink-commits.json").read_text())["q"]
    assert (state["state"], state["lost_tasks"]) == ("partial", [2])
    # the re-run of batch 5: only task 2 writes, and the commit completes the batch
    again = _task_attempt(servers, [b"x%d" % i for i in range(3)], "kstore-spark-q-2")
    restarted.commit([ProducedWrite(0, 0, "q", skipped=True), ProducedWrite(0, 1, "q", skipped=True),
                      ProducedWrite(3, 2, "q", transactional_id=again.txn.transactional_id,
                                    producer_id=again.producer_id,
                                    producer_epoch=again.producer_epoch)], 5)
    assert sorted(_committed_values(broker, "t", 2)) == sorted([b"x0", b"x1", b"x2"] * 3)
    third = KStoreStreamWriter(options, schema, False)
    assert third.recovered["q"] == Recovered(5, None, [])

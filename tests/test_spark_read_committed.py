"""The Spark source with `kafka.isolation.level=read_committed`, as Spark's Kafka source: latest is
the last stable offset (LSO), the records of aborted transactions are dropped, markers never
show — reading the log directory's files and through `kstore serve`, in batch and streaming
queries (a real SparkSession), and the backends underneath it without Spark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import T0, serve_log_dir
from kstore.broker import Broker
from kstore.records import ControlRecordType, Record, build_batch, build_control_batch
from kstore.spark.backends import Location

ROOT = Path(__file__).resolve().parents[1]
TOPIC = "tx"


def _txn(pid: int, values: list[str], seq: int) -> bytes:
    return build_batch([Record(b"k", v.encode(), T0) for v in values], producer_id=pid,
                       producer_epoch=0, base_sequence=seq, transactional=True)


def _marker(pid: int, commit: bool) -> bytes:
    kind = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
    return build_control_batch(kind, timestamp=T0, producer_id=pid, producer_epoch=0)


def _plain(values: list[str]) -> bytes:
    return build_batch([Record(None, v.encode(), T0) for v in values])


# Partition 0: plain records, committed, aborted and interleaved transactions across small
# segments (so the .txnindex entries sit in several files), a producer whose aborted transaction
# is followed by a committed one, then a transaction left open and records after it.
SCRIPT_0 = [
    ("plain", ["p0", "p1"]),
    ("txn", 10, ["c10a", "c10b"]), ("txn", 11, ["a11a"]), ("txn", 10, ["c10c"]),
    ("end", 11, False), ("end", 10, True),
    ("plain", ["p2"]),
    ("txn", 11, ["c11a", "c11b"]), ("txn", 12, ["a12a", "a12b", "a12c"]), ("plain", ["p3"]),
    ("end", 12, False), ("txn", 11, ["c11c"]), ("end", 11, True),
    ("txn", 13, ["a13a"]), ("end", 13, False),
    ("plain", ["p4"]),
    ("txn", 14, ["o14a"]),                         # open: the LSO stops here
    ("plain", ["late0", "late1"]), ("txn", 15, ["c15a"]), ("end", 15, True),
]
# Partition 1: only decided transactions: the LSO is the high watermark.
SCRIPT_1 = [("txn", 20, ["c20a"]), ("plain", ["q0"]), ("txn", 21, ["a21a"]), ("end", 21, False),
            ("end", 20, True), ("plain", ["q1"])]


def _apply(log, script, seqs) -> tuple[list[str], list[str], int | None]:
    """Append the script; returns (committed values, all data values, first offset of the open
    transaction)."""
    committed, everything, pending, first_open = [], [], {}, {}
    for step in script:
        if step[0] == "plain":
            log.append_as_leader(_plain(step[1]))
            committed += step[1]
            everything += step[1]
        elif step[0] == "txn":
            _k, pid, values = step
            info = log.append_as_leader(_txn(pid, values, seqs.get(pid, 0)))
            seqs[pid] = seqs.get(pid, 0) + len(values)
            first_open.setdefault(pid, info.first_offset)
            pending.setdefault(pid, []).extend(values)
            everything += values
        else:
            _k, pid, commit = step
            log.append_as_leader(_marker(pid, commit))
            first_open.pop(pid)
            done = pending.pop(pid)
            if commit:
                committed += done
    still_open = min(first_open.values(), default=None)
    return committed, everything, still_open


def build(d: Path) -> dict:
    """The topic, written by a broker (clean shutdown: HW checkpointed, producer snapshots)."""
    out = {}
    with Broker(str(d)) as b:
        b.create_topic(TOPIC, 2, configs={"segment.bytes": 400, "retention.ms": -1})
        seqs: dict[int, int] = {}
        for p, script in enumerate([SCRIPT_0, SCRIPT_1]):
            log = b.get_log(TOPIC, p)
            committed, everything, first_open = _apply(log, script, seqs)
            log.update_high_watermark(log.log_end_offset)
            lso = log.last_stable_offset
            out[p] = {"hw": log.high_watermark, "lso": lso, "everything": everything,
                      "committed_below_lso": _committed_below(log, lso, committed, first_open)}
    return out


def _committed_below(log, lso, committed, first_open) -> list[str]:
    """The committed values whose offsets are below the LSO (with an open transaction, records
    after it — even decided ones — wait for it), in offset order."""
    by_value = {r.value.decode(): r.offset for r in log.records()}
    return sorted((v for v in committed if by_value[v] < lso), key=by_value.get)


@pytest.fixture(scope="module")
def txlog(tmp_path_factory):
    d = tmp_path_factory.mktemp("txn") / "logs"
    return d, build(d)


def test_the_script_builds_what_the_tests_assume(txlog):
    _d, info = txlog
    p0, p1 = info[0], info[1]
    assert p0["lso"] < p0["hw"] and p1["lso"] == p1["hw"]
    assert "late0" not in p0["committed_below_lso"] and "c11c" in p0["committed_below_lso"]
    assert len(list((_d / f"{TOPIC}-0").glob("*.txnindex"))) >= 2


def _values(backend, tp):
    start, end = backend.offset_ranges([tp])[tp]
    rows = []
    for batch in backend.read_arrow(tp[0], tp[1], start, end, False):
        rows += [v.decode() for v in batch.column("value").to_pylist()]
    return end, rows


def _check_both_partitions(backend, info, committed: bool) -> None:
    """latest is the LSO (read_committed) or the HW, and the rows are what that level shows."""
    for p in (0, 1):
        end, rows = _values(backend, (TOPIC, p))
        if committed:
            assert (end, rows) == (info[p]["lso"], info[p]["committed_below_lso"])
        else:
            assert (end, rows) == (info[p]["hw"], info[p]["everything"])


@pytest.mark.parametrize("committed", [False, True], ids=["read_uncommitted", "read_committed"])
def test_log_dir_backend_honours_the_isolation_level(txlog, committed):
    d, info = txlog
    with Location(log_dir=str(d), read_committed=committed).open() as backend:
        _check_both_partitions(backend, info, committed)
        # a range starting inside an aborted transaction, and one per batch: same filtering
        _s, lso = backend.offset_ranges([(TOPIC, 0)])[(TOPIC, 0)]
        pieces = []
        for a in range(0, lso, 3):
            for batch in backend.read_arrow(TOPIC, 0, a, min(a + 3, lso), False):
                pieces += [v.decode() for v in batch.column("value").to_pylist()]
        assert pieces == (info[0]["committed_below_lso"] if committed else
                          info[0]["everything"][:len(pieces)])


def test_log_dir_lso_without_producer_snapshots_scans_from_the_log_start(txlog, tmp_path):
    """A log dir without `.snapshot` files (e.g. written by `Log` alone, or snapshots deleted):
    the open transactions come from the batch headers alone; the snapshots give the same LSO."""
    import shutil
    d, info = txlog
    copy = tmp_path / "copy"
    shutil.copytree(d, copy)
    snapshots = list(copy.glob("*/*.snapshot"))
    assert snapshots
    for f in snapshots:
        f.unlink()
    with Location(log_dir=str(copy), read_committed=True).open() as backend:
        _check_both_partitions(backend, info, True)


@pytest.fixture(scope="module")
def served_txlog(txlog):
    d, info = txlog
    proc, servers = serve_log_dir(d, ROOT)
    yield servers, info
    proc.terminate()
    proc.wait(30)


@pytest.mark.parametrize("committed", [False, True], ids=["read_uncommitted", "read_committed"])
def test_network_backend_honours_the_isolation_level(served_txlog, committed):
    servers, info = served_txlog
    with Location(bootstrap_servers=servers, read_committed=committed).open() as backend:
        _check_both_partitions(backend, info, committed)


def test_a_damaged_aborted_batch_is_reported_not_silently_dropped(txlog, tmp_path):
    """read_committed drops an aborted transaction's batches, but Kafka's consumer checks every
    fetched batch's CRC before it drops one: a flipped byte in aborted records raises
    CorruptRecordError in both modes, as it does read_uncommitted; kafka.check.crcs=false
    reads on, the aborted records still dropped."""
    import shutil
    from kstore.errors import CorruptRecordError
    d, info = txlog
    copy = tmp_path / "damaged"
    shutil.copytree(d, copy)
    damaged = [f for f in copy.glob(f"{TOPIC}-0/*.log") if b"a12b" in f.read_bytes()]
    assert len(damaged) == 1
    data = bytearray(damaged[0].read_bytes())
    data[data.index(b"a12b") + 3] ^= 0x01                # an aborted value: a12b -> a12c
    damaged[0].write_bytes(bytes(data))

    def values(location, check_crcs=True):
        with location.open() as backend:
            _s, latest = backend.offset_ranges([(TOPIC, 0)])[(TOPIC, 0)]
            return [v.decode() for b in backend.read_arrow(TOPIC, 0, 0, latest, False,
                                                          check_crcs=check_crcs)
                    for v in b.column("value").to_pylist()]

    proc, servers = serve_log_dir(copy, ROOT)
    try:
        for where in ({"log_dir": str(copy)}, {"bootstrap_servers": servers}):
            for committed in (True, False):
                with pytest.raises(CorruptRecordError, match=f"{TOPIC}-0 at offset .* is invalid"):
                    values(Location(read_committed=committed, **where))
            assert values(Location(read_committed=True, **where), check_crcs=False) == \
                info[0]["committed_below_lso"]
    finally:
        proc.terminate()
        proc.wait(30)


# ---------------------------------------------------------------------------------------------
# in Spark
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spark():
    from kstore.spark import spark_session
    return spark_session("kstore-tests")


def _read(spark, isolation, **where):
    reader = spark.read.format("kstore").option("subscribe", TOPIC) \
        .option("kafka.isolation.level", isolation)
    for k, v in where.items():
        reader = reader.option(k, v)
    return reader.load()


def _by_partition(df) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {0: [], 1: []}
    for r in df.orderBy("partition", "offset").collect():
        out[r.partition].append(r.value.decode())
    return out


def test_spark_batch_read_committed_in_both_modes(spark, txlog, served_txlog, capfd):
    d, info = txlog
    servers, _ = served_txlog
    for where in ({"path": str(d)}, {"kafka.bootstrap.servers": servers}):
        committed = _by_partition(_read(spark, "read_committed", **where))
        assert committed == {p: info[p]["committed_below_lso"] for p in (0, 1)}, where
        everything = _by_partition(_read(spark, "read_uncommitted", **where))
        assert everything == {p: info[p]["everything"] for p in (0, 1)}, where
    assert "not honoured" not in capfd.readouterr().err


def test_spark_stream_stops_at_the_lso_then_moves_on_when_the_transaction_commits(spark, tmp_path):
    d = tmp_path / "logs"
    info = build(d)
    ck, out = tmp_path / "ck", tmp_path / "out"

    def run():
        stream = spark.readStream.format("kstore").option("subscribe", TOPIC) \
            .option("startingOffsets", "earliest") \
            .option("kafka.isolation.level", "read_committed").load(str(d))
        query = stream.selectExpr("partition", "offset", "CAST(value AS STRING) AS value") \
            .writeStream.format("parquet").option("path", str(out)) \
            .option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
        query.awaitTermination()
        batches = sorted(int(p.name) for p in (ck / "offsets").iterdir() if p.name.isdigit())
        lines = (ck / "offsets" / str(batches[-1])).read_text().splitlines()
        return json.loads(lines[2])[TOPIC]

    assert run() == {"0": info[0]["lso"], "1": info[1]["lso"]}
    got = spark.read.parquet(str(out))
    assert sorted(r.value for r in got.collect()) == sorted(
        info[0]["committed_below_lso"] + info[1]["committed_below_lso"])
    with Broker(str(d)) as b:                         # the open transaction commits
        log = b.get_log(TOPIC, 0)
        log.append_as_leader(_marker(14, True))
        log.update_high_watermark(log.log_end_offset)
        hw = log.high_watermark
        assert log.last_stable_offset == hw
    assert run() == {"0": hw, "1": info[1]["lso"]}
    values = sorted(r.value for r in spark.read.parquet(str(out)).collect())
    expected_0 = [v for v in info[0]["everything"] if not v.startswith("a")]
    assert values == sorted(expected_0 + info[1]["committed_below_lso"])

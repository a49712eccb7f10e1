"""kstore as a Spark data source, in real Spark (local mode): batch and streaming reads mirroring
Spark's Kafka source, exactly-once recovery, data-loss checks, the writer, bad options, and the
same through the network broker (`kstore serve`).

One SparkSession is shared by every test (starting one costs ~10 s). Its JVM's stderr, where
Spark's Python workers print, goes to a file, so the tests can read the source's warnings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pyspark  # noqa: E402,F401  (a main dependency)

from helpers import T0, serve_log_dir  # noqa: E402
from kstore.broker import Broker  # noqa: E402
from kstore.compression import Compression  # noqa: E402
from kstore.partitioner import partition_for_key  # noqa: E402
from kstore.records import ControlRecordType, Record, build_batch, build_control_batch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DDL = ("key binary, value binary, topic string, partition int, offset long, "
              "timestamp timestamp, timestampType int")


# ---------------------------------------------------------------------------------------------
# fixtures and helpers
# ---------------------------------------------------------------------------------------------

class StderrLog:
    def __init__(self, path: Path):
        self.path, self.pos = path, 0

    def new_text(self) -> str:
        """What Spark (and its Python workers) printed since the last call."""
        data = self.path.read_bytes()
        text, self.pos = data[self.pos:].decode("utf-8", "replace"), len(data)
        return text

    def new_text_with(self, *needles: str, timeout_s: float = 20.0) -> str:
        """new_text, waiting until it holds every needle: a Python worker's stderr reaches this
        file through a pipe that a JVM thread copies (PythonWorkerFactory's redirect thread), so
        a line the worker flushed before its task ended can land here after the job returns."""
        deadline = time.monotonic() + timeout_s
        text = self.new_text()
        while not all(n in text for n in needles) and time.monotonic() < deadline:
            time.sleep(0.05)
            text += self.new_text()
        return text


@pytest.fixture(scope="session")
def spark_and_log(tmp_path_factory):
    from kstore.spark import spark_session   # a machine without Java uses the one from PyPI
    log_path = tmp_path_factory.mktemp("spark") / "spark-stderr.log"
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = os.dup(2)
    os.dup2(fd, 2)           # the JVM (and every Python worker it starts) inherits this stderr
    try:
        spark = spark_session("kstore-tests")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
    yield spark, StderrLog(log_path)
    spark.stop()


@pytest.fixture
def spark(spark_and_log):
    return spark_and_log[0]


@pytest.fixture
def stderr_log(spark_and_log):
    log = spark_and_log[1]
    log.new_text()
    return log


def rows_of(df) -> list[tuple]:
    """(partition, offset, key, value, timestamp ms, headers) sorted, from a kstore DataFrame."""
    headers = "headers" in df.columns
    cols = ["partition", "offset", "key", "value", "unix_millis(timestamp) AS ts"]
    if headers:
        cols.append("headers")
    out = []
    for r in df.selectExpr(*cols).collect():
        hs = tuple((h.key, h.value) for h in r.headers) if headers and r.headers else ()
        out.append((r.partition, r.offset, r.key, r.value, r.ts, hs))
    return sorted(out)


def engine_rows(log_dir, topic) -> list[tuple]:
    """The same tuples, read by the engine itself (Broker → Log.records())."""
    with Broker(str(log_dir)) as b:
        return sorted((p, r.offset, r.key, r.value, r.timestamp, tuple(r.headers))
                      for p in range(b.partition_count(topic)) for r in b.get_log(topic, p).records())


def produce(log_dir, topic, per_partition: int, start: int = 0, value_size: int = 8) -> None:
    with Broker(str(log_dir)) as b:
        for p in range(b.partition_count(topic)):
            for i in range(start, start + per_partition, 5):
                b.produce(topic, p, build_batch([
                    Record(f"k{j % 4}".encode(), f"{p}:{j}:".encode().ljust(value_size, b"x"), T0 + j)
                    for j in range(i, min(i + 5, start + per_partition))]))


def kstore_read(spark, log_dir, **options):
    reader = spark.read.format("kstore")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(str(log_dir))


def kstore_stream(spark, log_dir, **options):
    reader = spark.readStream.format("kstore")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(str(log_dir))


def run_available_now(writer):
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    return query


def checkpoint_offsets(checkpoint: Path, batch: int) -> dict:
    """The source offsets Spark logged for a micro-batch (<checkpoint>/offsets/<batch>)."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    assert lines[0] == "v1"
    return json.loads(lines[2])


@pytest.fixture
def mixed(tmp_path) -> Path:
    """Two partitions: every codec, headers, null keys and values, a transaction marker, rolled
    segments with index entries."""
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("mixed", 2, configs={"segment.bytes": 2048, "index.interval.bytes": 256})
        for p in range(2):
            for i, codec in enumerate([Compression.NONE, Compression.GZIP, Compression.SNAPPY,
                                       Compression.LZ4, Compression.ZSTD] * 2):
                b.produce("mixed", p, build_batch([
                    Record(None if j % 7 == 0 else f"k{j}".encode(),
                           None if j % 11 == 0 else f"v{p}-{j}".encode(), T0 + j,
                           (("h", b"x"), ("n", None)) if j % 3 == 0 else ())
                    for j in range(i * 10, i * 10 + 10)], compression=codec))
                if i == 4:
                    b.produce("mixed", p, build_control_batch(
                        ControlRecordType.COMMIT, timestamp=T0, producer_id=7, producer_epoch=0))
    return d


# ---------------------------------------------------------------------------------------------
# batch reads
# ---------------------------------------------------------------------------------------------

def test_batch_read_returns_exactly_the_engines_records(spark, mixed):
    df = kstore_read(spark, mixed, subscribe="mixed", includeHeaders="true")
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>")
    assert df.rdd.getNumPartitions() == 2                        # one per topic-partition
    expected = engine_rows(mixed, "mixed")
    assert len(expected) == 200
    assert rows_of(df) == expected                  # every codec, headers, nulls; marker skipped
    assert {r.topic for r in df.select("topic").distinct().collect()} == {"mixed"}
    assert [r.timestampType for r in df.select("timestampType").distinct().collect()] == [0]
    plain = kstore_read(spark, mixed, subscribe="mixed")
    assert plain.schema.simpleString() == spark.createDataFrame([], SOURCE_DDL).schema.simpleString()


def test_compacted_topics_with_gaps_and_log_append_time(spark, tmp_path):
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("compacted", 1, configs={"segment.bytes": 1024, "cleanup.policy": "compact",
                                                "min.cleanable.dirty.ratio": 0.01})
        b.create_topic("appended", 1, configs={"message.timestamp.type": "LogAppendTime"})
        for i in range(200):
            key = b"u%d" % i if i % 10 == 0 else b"k%d" % (i % 5)
            b.produce("compacted", 0, build_batch([Record(key, b"v%d" % i, T0 + i)],
                                                  compression=Compression.GZIP))
        b.produce("appended", 0, build_batch([Record(b"a", b"1", T0), Record(b"b", b"2", T0 + 1)]))
        b.logs.run_cleaner()
    expected = engine_rows(d, "compacted")
    offsets = [r[1] for r in expected]
    assert len(expected) < 200 and offsets != list(range(offsets[0], offsets[0] + len(offsets)))
    assert rows_of(kstore_read(spark, d, subscribe="compacted")) == expected
    appended = kstore_read(spark, d, subscribe="appended").collect()
    assert [r.timestampType for r in appended] == [1, 1]
    assert rows_of(kstore_read(spark, d, subscribe="appended")) == engine_rows(d, "appended")
    assert engine_rows(d, "appended")[0][4] > T0 + 1000      # the broker's clock, not the producer's


def test_offsets_timestamps_and_subscriptions_in_batch(spark, tmp_path):
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("a", 3)
        b.create_topic("b", 1)
        b.create_topic("other", 1)
    produce(d, "a", 20)
    produce(d, "b", 20)
    produce(d, "other", 20)

    def counts(df):
        return sorted((r.topic, r.partition, r["count"]) for r in df.groupBy("topic", "partition").count().collect())

    df = kstore_read(spark, d, subscribe="a", startingOffsets='{"a":{"0":5,"1":-2,"2":18}}',
                     endingOffsets='{"a":{"0":10,"1":-1,"2":-1}}')
    assert counts(df) == [("a", 0, 5), ("a", 1, 20), ("a", 2, 2)]
    assert rows_of(df)[0][1] == 5
    assert counts(kstore_read(spark, d, assign='{"a":[2],"b":[0]}')) == [("a", 2, 20), ("b", 0, 20)]
    assert counts(kstore_read(spark, d, subscribePattern="[ab]")) == [
        ("a", 0, 20), ("a", 1, 20), ("a", 2, 20), ("b", 0, 20)]
    # timestamps: record j has timestamp T0 + j
    assert counts(kstore_read(spark, d, subscribe="b", startingTimestamp=str(T0 + 13))) == [("b", 0, 7)]
    by_ts = kstore_read(spark, d, subscribe="a", startingOffsetsByTimestamp=json.dumps(
        {"a": {"0": T0, "1": T0 + 19, "2": T0 + 100}}), startingOffsetsByTimestampStrategy="latest")
    assert counts(by_ts) == [("a", 0, 20), ("a", 1, 1)]
    with pytest.raises(Exception, match="No offset matched from request of topic-partition b-0"):
        kstore_read(spark, d, subscribe="b", startingTimestamp=str(T0 + 100)).collect()
    # minPartitions splits big topic-partitions into more Spark partitions, same rows
    split = kstore_read(spark, d, subscribe="a", minPartitions="6")
    assert split.rdd.getNumPartitions() == 6
    assert rows_of(split) == rows_of(kstore_read(spark, d, subscribe="a"))


def test_a_schema_selecting_columns_prunes_the_others(spark, mixed, tmp_path):
    """Column pruning: a user-specified schema naming some columns of the fixed one (any order)
    gives exactly those columns, with the values the full schema gives; in streaming too. A
    column that is not one of the fixed schema's, or has another type, is refused."""
    full = kstore_read(spark, mixed, subscribe="mixed")
    pruned = spark.read.format("kstore").schema("offset long, key binary") \
        .option("subscribe", "mixed").load(str(mixed))
    assert pruned.columns == ["offset", "key"]
    assert sorted(map(tuple, pruned.collect()), key=repr) == \
        sorted(map(tuple, full.select("offset", "key").collect()), key=repr)
    ck = tmp_path / "ck"
    stream = spark.readStream.format("kstore").schema("value binary").option("subscribe", "mixed") \
        .option("startingOffsets", "earliest").load(str(mixed))
    run_available_now(stream.writeStream.format("parquet").option("path", str(tmp_path / "pq"))
                      .option("checkpointLocation", str(ck)))
    copied = spark.read.parquet(str(tmp_path / "pq"))
    assert copied.columns == ["value"]
    assert sorted((r.value for r in copied.collect()), key=repr) == \
        sorted((r.value for r in full.collect()), key=repr)
    for schema in ("value string", "key binary, extra int", "headers array<struct<key:string,"
                   "value:binary>>"):
        with pytest.raises(Exception, match="fixed schema"):
            spark.read.format("kstore").schema(schema).option("subscribe", "mixed") \
                .load(str(mixed)).collect()


def test_quick_start_for_a_local_session_the_jvms_defaults_for_a_cluster():
    """The C1-only JIT and serial GC start a local session sooner but slow long scans: a local
    master gets them unless quick_start=False; a cluster's driver and executors get the JVMs'
    defaults unless quick_start=True. extra_conf wins over every setting."""
    from kstore.spark.session import QUICK_START_JVM_OPTIONS, session_config
    local = session_config("local[2]")
    assert local["spark.driver.extraJavaOptions"].startswith(QUICK_START_JVM_OPTIONS + " ")
    assert "spark.executor.extraJavaOptions" not in local        # local: the driver's JVM runs all
    for conf in (session_config("local[2]", quick_start=False),
                 session_config("spark://127.0.0.1:7077")):
        assert "-XX:" not in conf["spark.driver.extraJavaOptions"]
        assert "-XX:" not in conf.get("spark.executor.extraJavaOptions", "")
    small_cluster = session_config("spark://127.0.0.1:7077", quick_start=True)
    assert small_cluster["spark.executor.extraJavaOptions"] == QUICK_START_JVM_OPTIONS
    assert session_config("local[2]", extra_conf={
        "spark.python.unix.domain.socket.enabled": "false"})[
        "spark.python.unix.domain.socket.enabled"] == "false"


def test_the_local_sessions_jvm_runs_with_the_quick_start_flags(spark):
    """The flags reach the JVM that runs (not only the configuration)."""
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    assert "-XX:TieredStopAtLevel=1" in arguments and "-XX:+UseSerialGC" in arguments, arguments


@pytest.mark.skipif(not hasattr(__import__("socket"), "AF_UNIX") or not os.path.isdir("/proc/self/fd"),
                    reason="no Unix domain sockets (spark_session then leaves Spark's TCP default) "
                           "or no /proc to list a worker's sockets on this platform")
def test_python_workers_reach_their_executor_over_a_unix_domain_socket(spark):
    """spark_session turns on spark.python.unix.domain.socket.enabled: over loopback TCP every
    task of a Python data source waited ~40 ms for the JVM's first message (the reason is in
    kstore.spark.session). A reader running in a Python worker lists the families of its
    connected sockets: all of them Unix, none TCP."""
    from pyspark.sql.datasource import DataSource, DataSourceReader

    class FamiliesReader(DataSourceReader):     # defined here: pickled by value for the worker
        def read(self, partition):
            import socket
            families = []
            for fd in os.listdir("/proc/self/fd"):
                try:
                    copy = os.dup(int(fd))
                except OSError:
                    continue                    # the listing's own descriptor, closed since
                try:
                    sock = socket.socket(fileno=copy)
                except OSError:
                    os.close(copy)
                    continue                    # not a socket
                try:
                    sock.getpeername()
                    families.append(sock.family.name)
                except OSError:
                    pass                        # a listening or unconnected socket
                finally:
                    sock.close()
            yield (",".join(sorted(families)),)

    class Families(DataSource):
        @classmethod
        def name(cls):
            return "worker_socket_families"

        def schema(self):
            return "families string"

        def reader(self, schema):
            return FamiliesReader()

    spark.dataSource.register(Families)
    [row] = spark.read.format("worker_socket_families").load().collect()
    families = row.families.split(",")
    assert "AF_UNIX" in families and not {"AF_INET", "AF_INET6"} & set(families), families


def test_bad_options_give_clear_errors(spark, mixed, tmp_path):
    def error_of(make) -> str:
        with pytest.raises(Exception) as e:
            make().collect()
        return str(e.value)

    assert "unknown option 'startingoffset'" in error_of(
        lambda: kstore_read(spark, mixed, subscribe="mixed", startingOffset="earliest"))
    text = error_of(lambda: kstore_read(spark, mixed, subscribe="mixed",
                                        startingOffsets='{"mixed":{"0":1,}}'))
    assert "'startingOffsets' is not valid JSON" in text and '{"topicA":{"0":23' in text
    text = error_of(lambda: kstore_read(spark, mixed, subscribe="clicks"))
    assert "topic 'clicks' does not exist" in text and "its topics: mixed" in text
    assert "partition mixed-5 does not exist" in error_of(
        lambda: kstore_read(spark, mixed, assign='{"mixed":[0,5]}'))
    assert "you must specify all TopicPartitions" in error_of(
        lambda: kstore_read(spark, mixed, subscribe="mixed", startingOffsets='{"mixed":{"0":1}}'))
    assert "can't be latest for batch queries" in error_of(
        lambda: kstore_read(spark, mixed, subscribe="mixed", startingOffsets="latest"))
    assert "does not exist" in error_of(lambda: kstore_read(spark, tmp_path / "nowhere", subscribe="t"))
    assert "fixed schema" in error_of(
        lambda: spark.read.format("kstore").schema("value string").option("subscribe", "mixed")
        .load(str(mixed)))
    with pytest.raises(Exception, match="not valid in streaming queries"):
        kstore_stream(spark, mixed, subscribe="mixed", endingOffsets="latest") \
            .writeStream.format("noop").start().awaitTermination(60)


# ---------------------------------------------------------------------------------------------
# streaming
# ---------------------------------------------------------------------------------------------

def test_streaming_available_now_admission_control_and_restart_exactly_once(spark, tmp_path):
    d, out, ck = tmp_path / "logs", tmp_path / "out", tmp_path / "ck"
    with Broker(str(d)) as b:
        b.create_topic("ev", 3)
    produce(d, "ev", 30)

    def run(**options):
        df = kstore_stream(spark, d, subscribe="ev", **options).select("partition", "offset", "value")
        return run_available_now(df.writeStream.format("parquet").option("path", str(out))
                                 .option("checkpointLocation", str(ck)))

    q = run(startingOffsets="earliest", maxOffsetsPerTrigger="40")
    # 40 offsets per trigger, split over the partitions in proportion to their backlog (13 each)
    assert [p["numInputRows"] for p in q.recentProgress] == [39, 39, 12]
    assert checkpoint_offsets(ck, 0) == {"ev": {"0": 13, "1": 13, "2": 13}}   # Kafka's JSON
    assert checkpoint_offsets(ck, 2) == {"ev": {"0": 30, "1": 30, "2": 30}}
    produce(d, "ev", 15, start=30)
    q = run(startingOffsets="earliest")          # ignored: the checkpoint has the offsets
    assert [p["numInputRows"] for p in q.recentProgress] == [45]
    assert json.loads(q.recentProgress[0]["sources"][0]["startOffset"]) == {"ev": {"0": 30, "1": 30, "2": 30}}
    got = sorted((r.partition, r.offset, r.value) for r in spark.read.parquet(str(out)).collect())
    assert got == [(p, o, v) for p, o, _k, v, _t, _h in engine_rows(d, "ev")]   # each exactly once
    assert len(got) == 135


def test_a_failed_batch_is_replayed_with_the_same_offsets(spark, tmp_path):
    d, ck = tmp_path / "logs", tmp_path / "ck"
    with Broker(str(d)) as b:
        b.create_topic("ev", 2)
    produce(d, "ev", 20)
    attempts: list[tuple[int, list]] = []
    fail_once = {1}

    def sink(batch_df, batch_id):
        rows = sorted((r.partition, r.offset) for r in batch_df.select("partition", "offset").collect())
        attempts.append((batch_id, rows))
        if batch_id in fail_once:
            fail_once.discard(batch_id)
            raise RuntimeError("injected failure in batch 1")
        batch_df.write.mode("overwrite").parquet(str(tmp_path / "out" / f"batch={batch_id}"))

    def run():
        df = kstore_stream(spark, d, subscribe="ev", startingOffsets="earliest",
                           maxOffsetsPerTrigger="16")
        return run_available_now(df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)))

    with pytest.raises(Exception, match="injected failure"):
        run()
    assert (ck / "offsets" / "1").exists() and not (ck / "commits" / "1").exists()
    planned = checkpoint_offsets(ck, 1)
    run()                                                       # restart from the checkpoint
    assert checkpoint_offsets(ck, 1) == planned
    by_batch = [a for a in attempts if a[0] == 1]
    assert len(by_batch) == 2 and by_batch[0][1] == by_batch[1][1]    # same offsets, same rows
    done = spark.read.parquet(str(tmp_path / "out")).select("partition", "offset").collect()
    assert sorted((r.partition, r.offset) for r in done) == [(p, o) for p in range(2) for o in range(20)]


def test_offsets_removed_by_retention_are_data_loss(spark, stderr_log, tmp_path):
    d, out, ck = tmp_path / "logs", tmp_path / "out", tmp_path / "ck"
    with Broker(str(d)) as b:
        b.create_topic("ret", 1, configs={"segment.bytes": 700, "retention.ms": -1})
    produce(d, "ret", 50, value_size=40)

    def run(**options):
        df = kstore_stream(spark, d, subscribe="ret", startingOffsets="earliest", **options)
        return run_available_now(df.select("offset").writeStream.format("parquet")
                                 .option("path", str(out)).option("checkpointLocation", str(ck)))

    run()
    produce(d, "ret", 50, start=50, value_size=40)
    with Broker(str(d)) as b:                       # retention removes offsets the query never read
        b.get_log("ret", 0).maybe_increment_log_start_offset(80)
        b.logs.run_retention()
    with pytest.raises(Exception) as e:
        run()                                          # failOnDataLoss defaults to true
    text = str(e.value)
    assert "Cannot fetch offset 50 (TopicPartition: ret-0)" in text
    assert "offsets [50, 80) of ret-0 are no longer in the log" in text and "failOnDataLoss" in text
    run(failOnDataLoss="false")
    offsets = sorted(r.offset for r in spark.read.parquet(str(out)).collect())
    assert offsets == list(range(50)) + list(range(80, 100))       # skipped ahead
    warning = "WARN kstore.spark: Cannot fetch offset 50 (TopicPartition: ret-0)"
    instruction = 'set the source option "failOnDataLoss" to "true"'
    warnings = stderr_log.new_text_with(warning, instruction)
    assert warning in warnings and instruction in warnings
    # Batch reads follow the same rules; "earliest" is never data loss.
    with pytest.raises(Exception, match=r"offsets \[10, 80\) of ret-0 are no longer in the log"):
        kstore_read(spark, d, subscribe="ret", startingOffsets='{"ret":{"0":10}}').collect()
    skipped = kstore_read(spark, d, subscribe="ret", startingOffsets='{"ret":{"0":10}}',
                          failOnDataLoss="false")
    assert [r.offset for r in skipped.select("offset").collect()] == list(range(80, 100))
    assert kstore_read(spark, d, subscribe="ret").count() == 20
    assert "Cannot fetch offset 10" in stderr_log.new_text_with("Cannot fetch offset 10")


# ---------------------------------------------------------------------------------------------
# the writer
# ---------------------------------------------------------------------------------------------

def test_reused_python_workers_leave_kstores_imports_out_of_their_garbage_collections(spark, tmp_path):
    """After a kstore write and read, every Python worker that ran one of their tasks has the
    objects of its imports frozen (kstore.spark.worker_gc): PySpark's daemon collects garbage
    after each task, and those collections no longer walk them. A SQL UDF runs in the same
    reused workers and reports what each one holds."""
    from pyspark.sql.functions import udf
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("g", 2)
    df = spark.range(4000).selectExpr("cast(id as string) AS key", "cast(id as string) AS value")
    df.repartition(2).write.format("kstore").option("topic", "g").mode("append").save(str(d))
    assert kstore_read(spark, d, subscribe="g").count() == 4000

    def worker_state(_):
        import gc
        import sys
        return [str(os.getpid()), str(gc.get_freeze_count()),
                str("kstore.spark.sink" in sys.modules or "kstore.spark.source" in sys.modules)]

    states = {tuple(r[0]) for r in spark.range(16).repartition(8)
              .select(udf(worker_state, "array<string>")("id")).collect()}
    ran_kstore = [(pid, int(frozen)) for pid, frozen, imported in states if imported == "True"]
    assert ran_kstore, states                 # the UDF's tasks ran in kstore's reused workers
    assert all(frozen > 30_000 for _pid, frozen in ran_kstore), states


def test_writer_output_reads_back_through_the_engine_and_the_source(spark, tmp_path):
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("w", 3)
        b.create_topic("x", 1)
    rows = [("user-%d" % i, "value-%d" % i, None) for i in range(30)]
    rows.append(("tomb", None, None))
    rows.append((None, "keyless", 2))
    df = spark.createDataFrame(rows, "key string, value string, partition int")
    df.write.format("kstore").option("topic", "w").mode("append").save(str(d))
    written = engine_rows(d, "w")
    assert sorted(((k, v) for _p, _o, k, v, _t, _h in written), key=repr) == sorted(
        (((k.encode() if k else None), (v.encode() if v else None)) for k, v, _ in rows), key=repr)
    for p, _o, k, v, _t, _h in written:                          # Kafka's partitioner
        if k is not None:
            assert p == partition_for_key(k, 3)
    assert [p for p, _o, k, v, _t, _h in written if v == b"keyless"] == [2]
    assert rows_of(kstore_read(spark, d, subscribe="w")) == written
    # a topic column, binary values and headers
    df2 = spark.createDataFrame(
        [("w", b"\x00\x01", [("trace", b"t1")]), ("x", b"\xff", None)],
        "topic string, value binary, headers array<struct<key:string,value:binary>>")
    df2.write.format("kstore").mode("append").save(str(d))
    assert [(v, h) for _p, _o, _k, v, _t, h in engine_rows(d, "x")] == [(b"\xff", ())]
    assert [h for *_, h in engine_rows(d, "w") if h] == [(("trace", b"t1"),)]
    assert kstore_read(spark, d, subscribe="w").count() == 33
    assert not (d / ".kstore-spark-staging").exists()            # staged files are cleaned up


def test_a_big_write_to_a_log_dir_adopts_each_staged_run_as_a_segment(spark, tmp_path):
    """A task's staged run of ADOPT_MIN_BYTES (8 MiB) or more becomes a segment at commit, not
    copied a second time: its batches and records are those of an append (offsets from the log
    end, leader epoch stamped, indexes), and appends and reads go on as usual."""
    from kstore.spark.sink import ADOPT_MIN_BYTES
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("big", 1)
        b.produce("big", 0, build_batch([Record(b"k", b"before", T0)]))
    n = 100_000                    # 117 bytes a row: ~11.7 MB in one task's run
    df = spark.range(n).selectExpr("cast(id % 1000 as string) as key",
                                   "concat(lpad(cast(id as string), 8, '0'), repeat('x', 92)) "
                                   "as value").coalesce(1)
    df.write.format("kstore").option("topic", "big").mode("append").save(str(d))
    with Broker(str(d)) as b:
        log = b.get_log("big", 0)
        assert [s.base_offset for s in log.segments] == [0, 1]
        adopted = log.segments[1]
        in_it = [bt for bt in log.batches() if bt.base_offset >= 1]
        assert adopted.size >= ADOPT_MIN_BYTES and len(in_it) > 10
        # every batch is bigger than index.interval.bytes: each but the first gets an entry
        assert [e.offset for e in adopted.offset_index.entries_list()] == \
            [bt.last_offset for bt in in_it[1:]]
        stored = log.records()
        assert [r.offset for r in stored] == list(range(n + 1))
        assert sorted(r.value for r in stored[1:]) == \
            [b"%08d" % i + b"x" * 92 for i in range(n)]
        assert {bt.partition_leader_epoch for bt in log.batches()} == {0}
        b.produce("big", 0, build_batch([Record(b"k", b"after", T0)]))
        assert log.read(n + 1, 1000).batches()[0].records()[0].value == b"after"
    assert kstore_read(spark, d, subscribe="big").count() == n + 2
    assert not (d / ".kstore-spark-staging").exists()


def test_writer_errors_are_clear(spark, tmp_path):
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("w", 1)
    df = spark.createDataFrame([("k", "v")], "key string, value string")

    def error_of(writer) -> str:
        with pytest.raises(Exception) as e:
            writer.save(str(d))
        return str(e.value)

    assert "topic 'nope' does not exist" in error_of(
        df.write.format("kstore").option("topic", "nope").mode("append"))
    assert "Required attribute 'value' not found" in error_of(
        df.selectExpr("key").write.format("kstore").option("topic", "w").mode("append"))
    assert "topic option required" in error_of(df.write.format("kstore").mode("append"))
    assert "append-only" in error_of(df.write.format("kstore").option("topic", "w").mode("overwrite"))
    holder = Broker(str(d))                   # someone holds the log dir's .lock
    try:
        text = error_of(df.write.format("kstore").option("topic", "w")
                        .option("kstore.lockTimeoutMs", "300").mode("append"))
        assert "is in use" in text and "kafka.bootstrap.servers" in text
        assert kstore_read(spark, d, subscribe="w").count() == 0   # reading needs no lock
    finally:
        holder.shutdown()
    assert engine_rows(d, "w") == []                                # nothing half-written


def test_streaming_writer_is_idempotent_per_batch_id(spark, tmp_path):
    d, ck = tmp_path / "logs", tmp_path / "ck"
    with Broker(str(d)) as b:
        b.create_topic("src", 2)
        b.create_topic("copy", 2)
    produce(d, "src", 20)

    def run():
        df = kstore_stream(spark, d, subscribe="src", startingOffsets="earliest").select("key", "value")
        return run_available_now(df.writeStream.format("kstore").option("topic", "copy")
                                 .option("checkpointLocation", str(ck)).option("path", str(d)))

    q = run()
    assert kstore_read(spark, d, subscribe="copy").count() == 40
    # Spark re-runs the last batch when its commit was not recorded (a crash right after the sink
    # committed): the sink sees the same batch id again and must not append twice.
    os.remove(ck / "commits" / "0")
    os.remove(ck / "commits" / ".0.crc")
    run()
    assert kstore_read(spark, d, subscribe="copy").count() == 40
    state = json.loads((d / "kstore-spark-sink-commits.json").read_text())
    assert state[str(q.id)]["batch_id"] == 0 and state[str(q.id)]["state"] == "committed"
    produce(d, "src", 5, start=20)
    run()
    assert sorted(v for *_, v, _t, _h in engine_rows(d, "copy")) == sorted(
        v for *_, v, _t, _h in engine_rows(d, "src"))
    assert not (d / ".kstore-spark-staging").exists()            # staged files are cleaned up


# ---------------------------------------------------------------------------------------------
# through the network broker
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def served(tmp_path):
    """`kstore serve` on a log dir holding topic `ev` (3 × 20 records, with headers)."""
    d = tmp_path / "served"
    with Broker(str(d)) as b:
        # records of 2023 (T0): no retention, or the running broker would delete them
        b.create_topic("ev", 3, configs={"retention.ms": -1})
        b.create_topic("out", 2, configs={"retention.ms": -1})
        for p in range(3):
            b.produce("ev", p, build_batch([Record(b"k%d" % i, b"v%d" % i, T0 + i, (("p", b"%d" % p),))
                                            for i in range(20)], compression=Compression.LZ4))
    expected = engine_rows(d, "ev")
    proc, bootstrap = serve_log_dir(d, cwd=ROOT)
    yield d, bootstrap, expected
    proc.terminate()
    proc.wait(30)


def test_network_source_and_sink_through_kstore_serve(spark, served, tmp_path):
    d, servers, expected = served
    net = spark.read.format("kstore").option("kafka.bootstrap.servers", servers) \
        .option("subscribe", "ev").option("includeHeaders", "true").load()
    assert rows_of(net) == expected
    assert rows_of(kstore_read(spark, d, subscribe="ev", includeHeaders="true")) == expected
    assert net.filter("offset >= 15").count() == 15
    # streaming over the network into a topic of the same (running) broker
    ck = tmp_path / "ck"
    stream = spark.readStream.format("kstore").option("kafka.bootstrap.servers", servers) \
        .option("subscribe", "ev").option("startingOffsets", "earliest").load()
    run_available_now(stream.select("key", "value").writeStream.format("kstore")
                      .option("kafka.bootstrap.servers", servers).option("topic", "out")
                      .option("checkpointLocation", str(ck)))
    assert json.loads((ck / "kstore-sink-commits.json").read_text())   # batch ids remembered
    copied = spark.read.format("kstore").option("kafka.bootstrap.servers", servers) \
        .option("subscribe", "out").load()
    assert sorted(r.value for r in copied.collect()) == sorted(r[3] for r in expected)
    # the running broker holds the log dir's lock: a log-dir write goes through that broker
    spark.createDataFrame([("v",)], "value string").write.format("kstore") \
        .option("topic", "out").option("kstore.lockTimeoutMs", "200").mode("append").save(str(d))
    again = spark.read.format("kstore").option("kafka.bootstrap.servers", servers) \
        .option("subscribe", "out").load()          # a new DataFrame: new end offsets
    assert again.count() == len(expected) + 1
    # kstore.sinkId + kstore.batchId (foreachBatch's idempotent write) through the broker: the
    # second write of batch 7 is skipped
    for _ in range(2):
        spark.createDataFrame([("once",)], "value string").write.format("kstore") \
            .option("topic", "out").option("kstore.sinkId", "s1").option("kstore.batchId", 7) \
            .mode("append").save(str(d))
    once = spark.read.format("kstore").option("kafka.bootstrap.servers", servers) \
        .option("subscribe", "out").load().filter("value = 'once'")
    assert once.count() == 1
    # no staged files: only the record of committed batch ids, and the lock its writers share
    assert sorted(p.name for p in (d / ".kstore-spark-staging").iterdir()) == [
        "kstore-sink-commits.json", "kstore-sink-commits.json.lock"]
    with pytest.raises(Exception, match="topic 'nope' does not exist in the kstore broker"):
        spark.read.format("kstore").option("kafka.bootstrap.servers", servers) \
            .option("subscribe", "nope").load().collect()


def test_network_sink_through_lost_produce_responses_stores_every_row_once(spark, served):
    """Each write task is a transactional producer: a Produce response lost after the broker
    appended makes the task's client send the same batch again, and the broker recognises it (same
    producer id and sequence) instead of storing the rows twice; the driver's EndTxn commits."""
    from kafka_proxy import DroppingProxy
    d, servers, _ = served
    proxy = DroppingProxy(drop_every=3, max_drops=12)
    try:
        via = f"127.0.0.1:{proxy.add(int(servers.rsplit(':', 1)[1]))}"
        # 12 tasks, each a producer sending a batch to each of the 2 partitions: ~24 requests
        rows = spark.range(0, 6000, numPartitions=12).selectExpr(
            "CAST(id AS STRING) AS value", "IF(id % 10 = 0, CAST(id AS STRING), NULL) AS key")
        rows.write.format("kstore").option("kafka.bootstrap.servers", via) \
            .option("topic", "out").mode("append").save()
    finally:
        proxy.close()
    assert proxy.dropped >= 4                        # responses were lost, so batches were re-sent
    stored = [r.value for r in spark.read.format("kstore").option("kafka.bootstrap.servers", servers)
              .option("subscribe", "out").load().select("value").collect()]
    assert len(stored) == 6000
    assert sorted(stored) == sorted(str(i).encode() for i in range(6000))
    from kstore.remote_broker import RemoteBroker
    batches = []
    with RemoteBroker(servers) as client:      # every batch sequenced, one producer id per task
        for p in range(2):
            offset = 0
            while got := client.fetch("out", p, offset).data.batches():
                batches += got
                offset = got[-1].next_offset
    data = [b for b in batches if not b.is_control]
    assert all(b.producer_id >= 0 and b.is_transactional and b.base_sequence >= 0 for b in data)
    assert len({b.producer_id for b in data}) == 12          # one transactional producer per task
    # the driver committed every task's transaction: a COMMIT marker per producer and partition
    markers = {(b.producer_id, b.producer_epoch) for b in batches if b.is_control}
    assert {(b.producer_id, b.producer_epoch) for b in data} <= markers


def consume_all(servers: str, topic: str, partitions: int, isolation: str, expected: int,
                timeout: float = 30) -> list[bytes]:
    """Every value of `topic` as an unmodified librdkafka consumer with `isolation.level` reads
    them: polls until `expected` values came, then a quiet second in which no more may come."""
    import uuid

    import confluent_kafka as ck
    consumer = ck.Consumer({"bootstrap.servers": servers, "group.id": uuid.uuid4().hex,
                            "auto.offset.reset": "earliest", "isolation.level": isolation,
                            "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
    got, deadline, quiet_until = [], time.monotonic() + timeout, None
    try:
        while time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is not None and not m.error():
                got.append(m.value())
            if len(got) >= expected:
                quiet_until = quiet_until or time.monotonic() + 1.0
                if time.monotonic() > quiet_until:
                    break
    finally:
        consumer.close()
    return got


def create_big_topic(servers: str, n: int) -> None:
    """Topic `big`: n records "P:J" in 2 partitions, in batches of 500, on the running broker
    (with no retention: their 2023 timestamps would have them deleted under the test's feet)."""
    from kstore.remote_broker import RemoteBroker
    with RemoteBroker(servers) as client:
        client.create_topic("big", 2, configs={"retention.ms": "-1"})
        for p in range(2):
            for i in range(0, n // 2, 500):
                client.produce("big", p, build_batch([Record(None, b"%d:%d" % (p, j), T0 + j)
                                                      for j in range(i, i + 500)]))


def test_a_task_failing_mid_batch_then_a_restart_store_every_row_once_for_read_committed(
        spark, served, tmp_path):
    """A micro-batch of two write tasks: one produces all its rows, the other fails (local Spark
    does not retry tasks), so the batch and the query fail. Nothing of the batch is visible to
    read_committed readers. Restarted from its checkpoint, the query runs the batch again; each
    task's transactional id fences its failed attempt, whose transaction is aborted, and the
    driver commits the new ones: a read_committed consumer (librdkafka) gets every row exactly
    once, while a read_uncommitted one also gets the aborted rows of the failed attempt."""
    d, servers, _ = served
    n = 3000
    create_big_topic(servers, n)
    flag, ck = tmp_path / "failed-once", tmp_path / "ck"
    flag_path = str(flag)

    def fail_once(value):
        # the first attempt of partition 1's task fails once the other task's rows are stored
        if value == b"1:1400" and not os.path.exists(flag_path):
            from kstore.remote_broker import RemoteBroker
            deadline = time.monotonic() + 60
            with RemoteBroker(servers) as client:
                while client.list_offsets("out", 0, -1).offset + \
                        client.list_offsets("out", 1, -1).offset == 0:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
            open(flag_path, "w").close()
            raise RuntimeError("injected task failure")
        return value

    from pyspark.sql.functions import col, udf
    passthrough = udf(fail_once, "binary")

    def run():
        stream = spark.readStream.format("kstore").option("kafka.bootstrap.servers", servers) \
            .option("subscribe", "big").option("startingOffsets", "earliest").load()
        return run_available_now(stream.select(passthrough(col("value")).alias("value"))
                                 .writeStream.format("kstore")
                                 .option("kafka.bootstrap.servers", servers).option("topic", "out")
                                 .option("checkpointLocation", str(ck)))

    with pytest.raises(Exception, match="injected task failure"):
        run()
    assert flag.exists()
    written = consume_all(servers, "out", 2, "read_uncommitted", n // 2, timeout=10)
    assert len(written) == n // 2                  # the task that succeeded produced its rows...
    assert consume_all(servers, "out", 2, "read_committed", 1, timeout=3) == []   # ...unseen
    run()                                          # the restart from the checkpoint
    committed = consume_all(servers, "out", 2, "read_committed", n)
    assert sorted(committed) == sorted(b"%d:%d" % (p, j) for p in range(2) for j in range(n // 2)), (
        len(consume_all(servers, "out", 2, "read_uncommitted", 2 * n, timeout=5)),
        (ck / "kstore-sink-commits.json").read_text(), second.stderr[-6000:])
    everything = consume_all(servers, "out", 2, "read_uncommitted", n + len(written))
    assert len(everything) == n + len(written)     # the aborted rows stay in the log


def test_a_driver_killed_during_a_staged_commit_then_restarted_stores_every_row_once(tmp_path):
    """The staged sink (a log directory, no broker): the driver, its JVM and its Python workers
    are killed with SIGKILL while its commit of a micro-batch is appending (the plan recorded,
    `pending`). The
    restarted query runs the batch again; its tasks stage the keyless rows in the partitions the
    first run drew, and the commit resumes where the log ends. Every row is stored once."""
    import contextlib
    import signal

    import psutil

    from kstore.spark.sink import LogDirAppender
    d, ck = tmp_path / "logs", tmp_path / "ck"
    n = 240_000
    with Broker(str(d)) as b:
        b.create_topic("src", 2)
        # flush.messages=1: every append is fsynced, so a commit lasts long enough to be killed
        b.create_topic("out", 4, configs={"flush.messages": 1})
        for p in range(2):
            for first in range(0, n // 2, 500):
                b.produce("src", p, build_batch([Record(None, b"%d:%06d:" % (p, j) + b"x" * 80, T0)
                                                 for j in range(first, first + 500)]))
    job = [sys.executable, str(Path(__file__).parent / "spark_staged_commit_job.py"), str(d),
           str(ck), str(n // 3)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get(
        "PYTHONPATH")])))
    state_file = d / "kstore-spark-sink-commits.json"
    log = tmp_path / "first-driver.log"
    with open(log, "wb") as out:
        first = subprocess.Popen(job, cwd=ROOT, env=env, start_new_session=True, stdout=out,
                                 stderr=subprocess.STDOUT)
    seen = None
    try:
        deadline = time.monotonic() + 240
        while seen is None:                      # a commit of a batch after the first is under way
            assert first.poll() is None and time.monotonic() < deadline, \
                log.read_text("utf-8", "replace")[-3000:]
            try:
                entry = next(iter(json.loads(state_file.read_text()).values()))
                if entry["state"] == "pending" and entry["batch_id"] >= 1:
                    seen = entry
            except (FileNotFoundError, ValueError, StopIteration):
                pass
            time.sleep(0.002)
    finally:
        # the driver, its JVM and every Python worker (PySpark's daemon puts its workers in a
        # process group of their own: killing the driver's group alone lets the commit finish)
        tree = [first] + psutil.Process(first.pid).children(recursive=True)
        for process in tree:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGKILL)
        first.wait(30)
    with LogDirAppender(str(d), 30_000) as app:  # waits until the killed worker's .lock is gone
        ends = list(app.log_end_offsets([("out", p) for p in range(4)]).values())
    after = next(iter(json.loads(state_file.read_text()).values()))
    assert (after["batch_id"], after["state"]) == (seen["batch_id"], "pending")   # killed mid-commit
    assert sum(ends) <= sum(start + count for start, count in seen["plan"].values())
    second = subprocess.run(job, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "done" in second.stdout, second.stdout[-3000:] + second.stderr[-3000:]
    with Broker(str(d)) as b:
        stored = [r.value for p in range(4) for r in b.get_log("out", p).records()]
    assert len(stored) == n and sorted(stored) == sorted(
        b"%d:%06d:" % (p, j) + b"x" * 80 for p in range(2) for j in range(n // 2))


def test_a_driver_killed_mid_batch_then_restarted_stores_every_row_once_for_read_committed(
        served, tmp_path):
    """A driver process killed with SIGKILL while its micro-batch is being written (one task
    produced all its rows in a transaction, the other is still running): nothing of the batch is
    visible to read_committed readers, and nobody aborts the open transaction. A new driver
    restarted from the checkpoint runs the batch again; its tasks' transactional ids fence the
    dead driver's, whose transaction the coordinator aborts. A read_committed consumer
    (librdkafka) gets every row exactly once."""
    import signal

    from kstore.remote_broker import RemoteBroker
    d, servers, _ = served
    n = 3000
    create_big_topic(servers, n)
    ck, flags = tmp_path / "ck", tmp_path / "flags"
    flags.mkdir()
    job = [sys.executable, str(Path(__file__).parent / "spark_killed_driver_job.py"), servers,
           str(ck), str(flags)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get(
        "PYTHONPATH")])))
    log = tmp_path / "first-driver.log"           # a file: a full pipe would stall the driver
    with open(log, "wb") as out:
        first = subprocess.Popen(job + ["block"], cwd=ROOT, env=env, start_new_session=True,
                                 stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        with RemoteBroker(servers) as client:      # until partition 0's task produced its rows
            while not (flags / "reached").exists() or sum(
                    client.list_offsets("out", p, -1).offset for p in range(2)) < n // 2:
                assert first.poll() is None and time.monotonic() < deadline, "\n".join(
                    line for line in log.read_text("utf-8", "replace").splitlines()
                    if "Error" in line or "Exception" in line)[-4000:]
                time.sleep(0.2)
        os.killpg(first.pid, signal.SIGKILL)     # the driver, its JVM: no abort, no cleanup
        first.wait(30)
    finally:
        (flags / "go").touch()                   # lets the blocked Python worker end
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert consume_all(servers, "out", 2, "read_committed", 1, timeout=5) == []
    second = subprocess.run(job + ["run"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert "done" in second.stdout, second.stdout[-3000:] + second.stderr[-3000:]
    committed = consume_all(servers, "out", 2, "read_committed", n)
    assert sorted(committed) == sorted(b"%d:%d" % (p, j) for p in range(2) for j in range(n // 2)), (
        len(consume_all(servers, "out", 2, "read_uncommitted", 2 * n, timeout=5)),
        (ck / "kstore-sink-commits.json").read_text(), second.stderr[-6000:])

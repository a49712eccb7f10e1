"""kstore as a Spark data source: Spark's Kafka source and sink, reading and writing kstore.

    from kstore.spark import spark_session
    spark = spark_session()                                   # local, quiet, `kstore` registered
    df = (spark.read.format("kstore").option("subscribe", "clicks")
          .option("startingOffsets", "earliest").load("/path/to/log-dir"))
    (df.selectExpr("key", "upper(cast(value as string)) as value").write.format("kstore")
       .option("topic", "clicks-upper").mode("append").save("/path/to/log-dir"))

Modules:
    source    the DataSource (`kstore`), batch and streaming readers, offsets and data-loss rules
    sink      batch and streaming writers (staged per task, appended at commit, idempotent per
              streaming batch id)
    options   the options, validated like Spark's Kafka source validates them
    logdir    a read-only reader of log directories (no lock, no writes: safe next to a broker)
    decode    RecordBatch v2 → Arrow record batches
    client    a minimal Kafka-protocol client for `kafka.bootstrap.servers` (kstore serve)
    backends  the interface both of those sit behind
    session   a quick, quiet local SparkSession
"""

from .session import register, spark_session  # noqa: F401

__all__ = ["register", "spark_session", "KStoreDataSource", "SCHEMA"]


def __getattr__(name):   # pyspark is imported only when the source itself is needed
    if name in ("KStoreDataSource", "SCHEMA", "SCHEMA_WITH_HEADERS"):
        from . import source
        return getattr(source, name)
    raise AttributeError(name)

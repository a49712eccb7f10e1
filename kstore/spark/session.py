"""A quick, quiet local SparkSession with the kstore source registered (tests, notebooks, bench).

Spark on a laptop spends most of its first 10-20 s starting the JVM and compiling; these settings
are the ones measured to help on a small machine: local mode, no UI, no progress bars, 2 shuffle
partitions instead of 200, UTC session time zone, the C1 JIT only and the serial GC, and errors
only in the logs. PYSPARK_PYTHON is set to this interpreter, so Spark's Python workers import the
same kstore (otherwise they run `python3` from PATH, which may not have kstore or pyarrow).
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def spark_session(app_name: str = "kstore", cores: int = 2, driver_memory: str = "1g",
                  shuffle_partitions: int = 2, extra_conf: dict | None = None):
    """Get (or create) a local SparkSession and register the `kstore` data source on it."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    warnings.filterwarnings("ignore", message=".*pandas >= 3.0.0.*")
    from pyspark.sql import SparkSession

    log4j = os.path.join(tempfile.gettempdir(), "kstore-spark-log4j2.properties")
    if not os.path.exists(log4j):
        with open(log4j, "w", encoding="utf-8") as f:
            f.write(LOG4J2)
    builder = (SparkSession.builder.master(f"local[{cores}]").appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.default.parallelism", str(cores))
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", driver_memory)
               .config("spark.driver.extraJavaOptions",
                       f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
                       f"-Dlog4j.configurationFile=file:{log4j}")
               .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true"))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def register(spark) -> None:
    """Make `format("kstore")` known to this SparkSession (registration is per session)."""
    from .source import KStoreDataSource
    spark.dataSource.register(KStoreDataSource)

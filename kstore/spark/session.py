"""SparkSessions with the kstore source: a quick, quiet local one, or one on a Spark cluster.

    spark = spark_session()                                  # local[2], for notebooks and tests
    spark = spark_session(master="spark://host:7077")        # a standalone cluster: kstore shipped

Spark on a laptop spends most of its first 10-20 s starting the JVM and compiling; these settings
are the ones measured to help on a small machine: no UI, no progress bars, 2 shuffle partitions
instead of 200, UTC session time zone, the C1 JIT only and the serial GC, and errors only in the
logs. PYSPARK_PYTHON is set to this interpreter unless already set, so Spark's Python workers
import the same kstore (otherwise they run `python3` from PATH, which may not have kstore or
pyarrow); on a cluster it must name a Python that exists on every worker.

On a cluster, executors need kstore's code. `spark_session(master=...)` ships it: it builds
`kstore.zip` (`kstore.spark.package`) and adds it with `SparkContext.addPyFile` before the
source is used. The same zip, from `kstore spark-package`, works with `spark-submit --py-files`
or the `spark.submit.pyFiles` setting of a plain `SparkSession.builder`.

Registration: `format("kstore")` is known to every session without a call: Spark looks up
installed modules named `pyspark_*` with a `DefaultSource` when a session first uses a data source
(the module `pyspark_kstore` is installed with kstore), and importing `kstore.spark` registers the
source on the active session too (for a session whose driver cannot see the installed module).
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

from .java import ensure_java

LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""

JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def log4j_config() -> str:
    """A log4j2 file that keeps Spark to errors (written once to the temp directory)."""
    path = os.path.join(tempfile.gettempdir(), "kstore-spark-log4j2.properties")
    if not os.path.exists(path):
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8") as f:
            f.write(LOG4J2)
        os.replace(partial, path)
    return path


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def spark_session(app_name: str = "kstore", cores: int = 2, driver_memory: str = "1g",
                  shuffle_partitions: int = 2, extra_conf: dict | None = None,
                  master: str | None = None, ship_kstore: bool | None = None):
    """Get (or create) a SparkSession with the `kstore` data source registered.

    master: None → $SPARK_MASTER or local[cores]; "spark://host:port" for a standalone cluster
    (also "yarn", "k8s://..."). ship_kstore: add kstore's code for the executors (default: when
    the master is not local)."""
    ensure_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    warnings.filterwarnings("ignore", message=".*pandas >= 3.0.0.*")
    from pyspark.sql import SparkSession

    master = master or os.environ.get("SPARK_MASTER") or f"local[{cores}]"
    shipping = ship_kstore if ship_kstore is not None else not is_local(master)
    if shipping:
        # The driver's own Python workers (query planning, the streaming source and sink runners)
        # get PYTHONPATH from the driver JVM's environment, not from addPyFile: put the zip there
        # before the JVM starts, so they run the same kstore as this process.
        from .package import build_package
        zip_path = build_package()
        paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if zip_path not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([zip_path] + [p for p in paths if p])
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", driver_memory)
               .config("spark.driver.extraJavaOptions",
                       f"{JVM_OPTIONS} -Dlog4j.configurationFile=file:{log4j_config()}")
               .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true"))
    if is_local(master):
        builder = builder.config("spark.default.parallelism", str(cores))
    else:
        builder = builder.config("spark.executor.extraJavaOptions", JVM_OPTIONS)
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if shipping:
        ship(spark)
    register(spark)
    return spark


def ship(spark) -> str:
    """Send kstore's code to the executors (`SparkContext.addPyFile` of kstore.zip); returns the
    zip's path. Needed where the workers' Python has no kstore installed."""
    from .package import build_package
    path = build_package()
    sc = spark.sparkContext
    shipped = getattr(sc, "_kstore_shipped", None)
    if shipped != path:
        sc.addPyFile(path)
        sc._kstore_shipped = path
    return path


def register(spark) -> None:
    """Make `format("kstore")` known to this SparkSession (registration is per session)."""
    from .source import KStoreDataSource
    spark.dataSource.register(KStoreDataSource)


def register_active_session() -> None:
    """Register on the session already running when `kstore.spark` is imported, if any."""
    if "pyspark" not in sys.modules:
        return                       # no pyspark imported yet: no session can be running
    from pyspark.sql import SparkSession
    spark = SparkSession.getActiveSession()
    if spark is not None:
        register(spark)

"""SparkSessions with the kstore source: a quick, quiet local one, or one on a Spark cluster.

    spark = spark_session()                                  # local[2], for notebooks and tests
    spark = spark_session(master="spark://host:7077")        # a standalone cluster: kstore shipped

Spark on a laptop spends most of its first 10-20 s starting the JVM and compiling; these settings
are the ones measured to help on a small machine: no UI, no progress bars, 2 shuffle partitions
instead of 200, UTC session time zone, and errors only in the logs. With `quick_start` (the
default for a local master) the JVMs run the C1 JIT only and the serial GC: on 2 cores the
session starts in 5.1 s instead of 5.8 s and a small query answers ~0.2 s sooner, but long scans
run slower: a 1M-row `groupBy(key)` over the kstore source took 0.57 s against 0.48 s with
HotSpot's default tiered JIT (Parquet's 0.27-0.29 s either way). The benchmarks, and jobs over
real data, pass `quick_start=False`; a cluster master gets the JVMs' defaults unless asked.

Executors talk to their Python workers over a Unix domain socket
(`spark.python.unix.domain.socket.enabled`, Spark ≥ 4.1; off by default). Over loopback TCP the
Python worker of each task of a Python data source (or UDF) waited 40-46 ms for the JVM's first
Arrow message, the length of Linux's minimum delayed-ACK timeout, and a 4-partition read of no
rows on 2 cores took 0.21 s instead of 0.12 s.

PYSPARK_PYTHON is set to this interpreter unless already set, so Spark's Python workers
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
import socket
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

QUICK_START_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"   # C1 only, serial GC


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


def session_config(master: str, cores: int = 2, driver_memory: str = "1g",
                   shuffle_partitions: int = 2, quick_start: bool | None = None,
                   extra_conf: dict | None = None) -> dict[str, str]:
    """The settings `spark_session` gives its builder (the reasons are in this module's
    docstring); `extra_conf` comes last and wins."""
    quick = quick_start if quick_start is not None else is_local(master)
    jvm_options = QUICK_START_JVM_OPTIONS if quick else ""
    conf = {"spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": str(shuffle_partitions),
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.memory": driver_memory,
            "spark.driver.extraJavaOptions":
                f"{jvm_options} -Dlog4j.configurationFile=file:{log4j_config()}".strip(),
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true"}
    if hasattr(socket, "AF_UNIX"):   # executor <-> Python worker without TCP's delayed-ACK stalls
        conf["spark.python.unix.domain.socket.enabled"] = "true"
    if is_local(master):
        conf["spark.default.parallelism"] = str(cores)
    elif quick:                      # a cluster's executors are JVMs of their own
        conf["spark.executor.extraJavaOptions"] = jvm_options
    conf.update(extra_conf or {})
    return conf


def spark_session(app_name: str = "kstore", cores: int = 2, driver_memory: str = "1g",
                  shuffle_partitions: int = 2, extra_conf: dict | None = None,
                  master: str | None = None, ship_kstore: bool | None = None,
                  quick_start: bool | None = None):
    """Get (or create) a SparkSession with the `kstore` data source registered.

    master: None → $SPARK_MASTER or local[cores]; "spark://host:port" for a standalone cluster
    (also "yarn", "k8s://..."). ship_kstore: add kstore's code for the executors (default: when
    the master is not local). quick_start: the C1-only JIT and serial GC, for a quick start on a
    small machine at the cost of slower long scans (default: when the master is local)."""
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
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in session_config(master, cores, driver_memory, shuffle_partitions,
                                     quick_start, extra_conf).items():
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

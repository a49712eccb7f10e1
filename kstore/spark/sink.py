"""`df.write.format("kstore")` and `df.writeStream.format("kstore")`: append DataFrame rows to
kstore topics, like Spark's Kafka sink, but exactly once per streaming batch.

The DataFrame has Kafka's write schema: `value` (string or binary, null = tombstone), and
optionally `key` (string or binary), `topic` (string; the `topic` option overrides it),
`partition` (int; otherwise Kafka's partitioner: murmur2 of the key, sticky for keyless records)
and `headers` (array<struct<key string, value binary>>). Other columns are ignored, as Kafka's
sink ignores them. Only `mode("append")`: a topic is an append-only log.

Who writes, and the `.lock`. A log directory belongs to one writer at a time (a Broker takes its
`.lock`, as Kafka's broker does), while Spark runs many write tasks at once, in other processes.
So the tasks never touch the log; the work is split in two:

1. `write()` (each executor task, in parallel): encode the task's rows into RecordBatch v2 bytes,
   one run of batches per target partition, and stage them in a file
   (`<log dir>/.kstore-spark-staging/<write id>/batch-<id>/task-...`); return where they are;
2. `commit()` (once, after every task succeeded, in one driver-side process): open a `Broker` on
   the log directory — waiting up to `kstore.lockTimeoutMs` (default 30 s) if another broker or
   tool holds the lock, then failing with a message saying what to do — append every staged run
   through the engine (`Broker.produce`: offsets assigned, indexes, high watermark), flush,
   shut the broker down (checkpoints), delete the staged files. `abort()` deletes them instead.
   Nothing is visible before the commit, and a failed job writes nothing.

With `kafka.bootstrap.servers` the commit sends the staged batches to a running `kstore serve`
with Produce requests (acks=all) instead: that is how to write while a broker owns the directory.
Staging is then in `kstore.stagingDir` (default: the temp directory, fine in local mode; on a
cluster give a directory that every node and the driver can read).

Exactly once per batch id. Spark may call `commit(messages, batchId)` again for a batch that was
already committed: after a restart it re-runs the last batch if its `commits/` entry was not
written. The sink keeps, per query (the query id is stable across restarts; or `kstore.sinkId`),
the last batch id it committed, in `<log dir>/kstore-spark-sink-commits.json`, written under the
same lock as the data. Before appending it records its plan (each partition's log end offset and
record count), so a commit that died half-way is resumed from the log end offsets: records are
neither lost nor doubled. A batch write (e.g. inside `foreachBatch`) gets the same guarantee with
the options `kstore.sinkId` + `kstore.batchId`, like Delta Lake's `txnAppId` / `txnVersion`.
Over the network the marker lives in the query's checkpoint directory (or the staging directory),
and resuming a half-done commit is only exact if nobody else produced to those partitions.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)

from ..compression import Compression
from ..errors import KStoreError, LogError
from ..partitioner import BuiltInPartitioner, partition_for_key
from ..records import Record, build_batch
from .options import KStoreOptionError, SinkOptions, parse_sink_options

STAGING_DIR_NAME = ".kstore-spark-staging"
COMMITS_FILE = "kstore-spark-sink-commits.json"
MAX_BATCH_BYTES = 512 * 1024          # below max.message.bytes (1 MiB)
MAX_BATCH_RECORDS = 16384
MAX_PRODUCE_BYTES = 4 * 1024 * 1024


class KStoreSinkError(KStoreError):
    """The kstore sink could not write (lock held, missing topic, bad partition...)."""


@dataclass
class StagedRun:
    topic: str
    partition: int
    batches: list[tuple[int, int, int]]     # (position in the staged file, size, records)

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


def _bytes(v) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    return bytes(v)


# ---------------------------------------------------------------------------------------------
# The task side: encode and stage
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
        self.write_id = uuid.uuid4().hex[:12]
        self.staging_root = self._staging_root()

    def _staging_root(self) -> str:
        if self.opts.staging_dir:
            return os.path.abspath(self.opts.staging_dir)
        if self.opts.location.log_dir is not None:
            return os.path.join(self.opts.location.log_dir, STAGING_DIR_NAME)
        return os.path.join(tempfile.gettempdir(), "kstore-spark-staging")

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

    def write(self, iterator):
        from pyspark import TaskContext
        ctx = TaskContext.get()
        batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
        task = ctx.partitionId() if ctx else 0
        attempt = f"{ctx.attemptNumber()}-{ctx.taskAttemptId()}" if ctx else "0-0"

        counts = None
        partitioner = BuiltInPartitioner()
        compression = Compression.from_name(self.opts.compression)
        runs: dict[tuple[str, int], list[Record]] = {}
        now = int(time.time() * 1000)
        rows = 0
        for rb in iterator:
            names = rb.schema.names
            n = rb.num_rows
            cols = {name: rb.column(i).to_pylist() for i, name in enumerate(names)
                    if name in ("key", "value", "topic", "partition", "headers")}
            keys = cols.get("key", [None] * n)
            values = cols["value"]
            topics = [self.opts.topic] * n if self.opts.topic else cols["topic"]
            parts = cols.get("partition", [None] * n)
            headers = cols.get("headers", [None] * n)
            if counts is None:
                with self.opts.location.open() as backend:
                    counts = backend.topic_partitions()
            for i in range(n):
                topic = topics[i]
                if topic is None:
                    raise KStoreSinkError("null topic encountered while writing a row: set the "
                                          "topic option or give every row a topic")
                if topic not in counts:
                    raise KStoreSinkError(f"topic '{topic}' does not exist in the "
                                          f"{self.opts.location.describe()}; create it first")
                key = _bytes(keys[i])
                p = parts[i]
                if p is None:
                    p = (partition_for_key(key, counts[topic]) if key is not None
                         else partitioner.partition(topic, None, counts[topic]))
                elif not 0 <= p < counts[topic]:
                    raise KStoreSinkError(f"partition {p} of topic '{topic}' does not exist (it "
                                          f"has {counts[topic]} partitions)")
                hs = tuple((h["key"], _bytes(h["value"])) for h in headers[i]) if headers[i] else ()
                record = Record(key, _bytes(values[i]), now, hs)
                runs.setdefault((topic, p), []).append(record)
                if key is None and parts[i] is None:
                    partitioner.record_appended(topic, p, 70 + len(record.value or b""),
                                                counts[topic])
            rows += n
        if not runs:
            return StagedWrite(None, [], 0, task, query_id)
        directory = self._batch_dir(batch_id if batch_id is not None else "job")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"task-{task:05d}-{attempt}.batches")
        staged: list[StagedRun] = []
        try:
            with open(path, "wb") as f:
                for (topic, p), records in sorted(runs.items()):
                    run = StagedRun(topic, p, [])
                    for chunk in _chunks(records):
                        data = build_batch(chunk, compression=compression)
                        run.batches.append((f.tell(), len(data), len(chunk)))
                        f.write(data)
                    staged.append(run)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(path)
            raise
        return StagedWrite(path, staged, rows, task, query_id)

    # ---- driver side
    def _appender(self, idempotent: bool):
        if self.opts.location.log_dir is not None:
            return LogDirAppender(self.opts.location.log_dir, self.opts.lock_timeout_ms)
        return NetworkAppender(self.opts, self.staging_root, idempotent)

    def _cleanup(self, messages, batch_id) -> None:
        """Delete staged files and the directories that held them. (Spark may build the writer
        that commits in another process than the one that planned the tasks, so the directories
        are found from the files, not from this instance's write id.)"""
        dirs = {self._batch_dir(batch_id if batch_id is not None else "job")}
        for m in messages:
            if m is not None and m.path:
                with contextlib.suppress(OSError):
                    os.remove(m.path)
                dirs.add(os.path.dirname(m.path))
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(d))           # the write id's directory, once empty
        with contextlib.suppress(OSError):
            os.rmdir(self.staging_root)                # and the staging root, once empty


def _chunks(records: list[Record]):
    chunk, size = [], 0
    for r in records:
        est = 24 + len(r.key or b"") + len(r.value or b"") + sum(
            len(k) + len(v or b"") + 4 for k, v in r.headers)
        if chunk and (size + est > MAX_BATCH_BYTES or len(chunk) >= MAX_BATCH_RECORDS):
            yield chunk
            chunk, size = [], 0
        chunk.append(r)
        size += est
    if chunk:
        yield chunk


class KStoreBatchWriter(_Writer, DataSourceArrowWriter):
    def __init__(self, options, schema, overwrite):
        _Writer.__init__(self, options, schema, overwrite)

    def commit(self, messages):
        staged = [m for m in messages if m is not None and m.path]
        try:
            if staged:
                with self._appender(self.opts.batch_id is not None) as appender:
                    # kstore.sinkId + kstore.batchId (e.g. in foreachBatch) make the write
                    # idempotent, like Delta Lake's txnAppId + txnVersion
                    commit_staged(appender, staged, sink_id=self.opts.sink_id if
                                  self.opts.batch_id is not None else None,
                                  batch_id=self.opts.batch_id)
        finally:
            self._cleanup(messages, None)

    def abort(self, messages):
        self._cleanup(messages, None)


class KStoreStreamWriter(_Writer, DataSourceStreamArrowWriter):
    def __init__(self, options, schema, overwrite):
        _Writer.__init__(self, options, schema, overwrite)

    def commit(self, messages, batchId):
        staged = [m for m in messages if m is not None and m.path]
        try:
            if staged:
                sink_id = (self.opts.sink_id or next((m.query_id for m in staged if m.query_id), None)
                           or self.opts.checkpoint_location)
                with self._appender(sink_id is not None) as appender:
                    commit_staged(appender, staged, sink_id=sink_id, batch_id=int(batchId))
        finally:
            self._cleanup(messages, batchId)

    def abort(self, messages, batchId):
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
    for tp in plan:
        pending: list[bytes] = []
        skip = already[tp]
        for m in staged:
            runs = [r for r in m.runs if (r.topic, r.partition) == tp]
            if not runs:
                continue
            with open(m.path, "rb") as f:
                for run in runs:
                    for pos, size, n in run.batches:
                        if skip >= n:
                            skip -= n
                            continue
                        if skip:
                            raise KStoreSinkError(f"cannot resume {tp[0]}-{tp[1]}: the log ends "
                                                  f"inside a staged batch")
                        f.seek(pos)
                        pending.append(f.read(size))
        chunk: list[bytes] = []
        for data in pending:
            if chunk and sum(map(len, chunk)) + len(data) > MAX_PRODUCE_BYTES:
                appender.append(tp, b"".join(chunk))
                chunk = []
            chunk.append(data)
        if chunk:
            appender.append(tp, b"".join(chunk))
    appender.flush()
    if sink_id is not None:
        state = appender.load_state()
        state[sink_id] = {"batch_id": batch_id, "state": "committed",
                          "plan": {f"{t}-{p}": list(v) for (t, p), v in plan.items()},
                          "time": int(time.time() * 1000)}
        appender.save_state(state)
    return plan


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

    def flush(self) -> None:
        for log in self.broker.logs.logs().values():
            log.flush()
        self.broker.replica_manager.checkpoint_high_watermarks()

    @property
    def _state_path(self) -> str:
        return os.path.join(self.log_dir, COMMITS_FILE)


class NetworkAppender(_CommitState):
    """Appends with Produce requests (acks=all) to a running `kstore serve`."""

    def __init__(self, opts: SinkOptions, staging_root: str, idempotent: bool = True):
        self.opts = opts
        self.idempotent = idempotent
        state_dir = opts.checkpoint_location or staging_root
        if state_dir.startswith("file:"):
            state_dir = state_dir[5:]
        self._state_path = os.path.join(state_dir, "kstore-sink-commits.json")
        self.client = None
        self._lock_fd = None

    def __enter__(self):
        from ..remote_broker import RemoteBroker
        if self.idempotent:   # the marker file is only needed to remember batch ids
            os.makedirs(os.path.dirname(self._state_path), exist_ok=True)
            self._lock_fd = os.open(self._state_path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        self.client = RemoteBroker(self.opts.location.bootstrap_servers, client_id="kstore-spark",
                                   timeout_s=self.opts.location.timeout_ms / 1000)
        return self

    def __exit__(self, *exc):
        if self.client is not None:
            self.client.close()
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def log_end_offsets(self, tps):
        if not tps:
            return {}
        return {tp: f.offset for tp, f in self.client.list_offsets_many({tp: -1 for tp in tps}).items()}

    def append(self, tp, data: bytes) -> None:
        self.client.produce(tp[0], tp[1], data, acks=-1, timeout_ms=self.opts.location.timeout_ms)

    def flush(self) -> None:
        pass   # acks=all: the broker has it before it answers

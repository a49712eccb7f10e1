"""`spark.read.format("kstore")` and `spark.readStream.format("kstore")`: Spark's Kafka source,
on kstore.

    df = (spark.read.format("kstore").option("subscribe", "clicks")
          .option("startingOffsets", "earliest").load("/path/to/log-dir"))

gives the schema of Spark's Kafka source (`key binary, value binary, topic string, partition int,
offset long, timestamp timestamp, timestampType int`, plus `headers` with includeHeaders=true) and
takes its options (see `kstore.spark.options`). How it maps onto Spark's Python Data Source API:

* batch: `partitions()` (run once per DataFrame, on the driver side) resolves the topic-partitions
  and their [start, end) offsets and returns one `KStoreRange` per topic-partition, split into
  more when `minPartitions` / `maxRecordsPerPartition` ask for it; `read(range)` runs in an executor
  and yields Arrow record batches decoded straight from the segment files (or Fetch responses);
* streaming: the offsets of a micro-batch are Kafka's JSON, `{"topic": {"0": 42}}` (next offset to
  read), which Spark writes to `<checkpoint>/offsets/<batch>` before the batch runs and marks done
  in `<checkpoint>/commits/<batch>` after the sink committed. A restarted query replays an
  uncommitted batch with exactly the same offsets (`read` is deterministic), so with an
  idempotent sink every record is processed exactly once. `maxOffsetsPerTrigger` is admission
  control (`ReadMaxRows`, split over partitions in proportion to their backlog, as Kafka does) and
  `Trigger.AvailableNow` freezes the target at the offsets present when the query starts;
* data loss: a range whose offsets were removed by retention fails the query with
  `failOnDataLoss=true` (the default), naming topic, partition and offsets; with `false` the reader
  skips to the earliest available offset and logs a warning (stderr of the Spark process).
  Gaps inside the log (compaction, transaction markers) are never data loss.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from dataclasses import dataclass

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    InputPartition)

from ..errors import KStoreError
from .backends import DataUnavailable, Location
from ..malloc import keep_freed_buffers
from .worker_gc import freeze_imported_objects
from .options import (EARLIEST, LATEST, KStoreOptionError, OffsetSpec, SourceOptions,
                      parse_source_options)

try:   # Spark ≥ 4.2: admission control and AvailableNow for Python sources (SPARK-55304)
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                                  SupportsTriggerAvailableNow)
except ImportError:   # pragma: no cover - pyproject pins a Spark that has them
    ReadAllAvailable = ReadLimit = ReadMaxRows = None

    class SupportsTriggerAvailableNow:   # type: ignore[no-redef]
        pass

SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
          "timestamp timestamp, timestampType int")
SCHEMA_WITH_HEADERS = SCHEMA + ", headers array<struct<key: string, value: binary>>"

# Kafka's texts (KafkaSourceProvider.INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_*), with kstore's names.
INSTRUCTION_FAIL_TRUE = (
    "Some data may have been lost because they are not available in kstore any more; either the "
    "data was aged out by retention (or removed by compaction or truncation) or the topic may "
    "have been deleted before all the data in the topic was processed. If you don't want your "
    "query to fail on such cases, set the source option \"failOnDataLoss\" to \"false\".")
INSTRUCTION_FAIL_FALSE = (
    "Some data may have been lost because they are not available in kstore any more; either the "
    "data was aged out by retention (or removed by compaction or truncation) or the topic may "
    "have been deleted before all the data in the topic was processed. If you want your query "
    "to fail on such cases, set the source option \"failOnDataLoss\" to \"true\".")


class KStoreDataLossError(KStoreError):
    """Offsets the query must read are gone and failOnDataLoss=true."""


def report_data_loss(fail: bool, message: str) -> None:
    """Kafka's reportDataLoss: raise with failOnDataLoss=true, otherwise warn and go on."""
    if fail:
        raise KStoreDataLossError(f"{message} {INSTRUCTION_FAIL_TRUE}")
    # Spark's Python workers have no logging set up; their stderr goes to the Spark process's.
    print(f"WARN kstore.spark: {message} {INSTRUCTION_FAIL_FALSE}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Input partitions and reading one
# ---------------------------------------------------------------------------------------------

@dataclass
class KStoreRange(InputPartition):
    """Offsets [start, end) of one topic-partition: everything an executor needs to read it
    (read() shares no state with the driver)."""
    location: Location
    topic: str
    partition: int
    start: int
    end: int
    start_is_earliest: bool = False    # "earliest": late-bound, aging out is not data loss
    fail_on_data_loss: bool = True
    include_headers: bool = False
    check_crcs: bool = True            # kafka.check.crcs, as Kafka's consumer's check.crcs

    def __init__(self, location, topic, partition, start, end, start_is_earliest=False,
                 fail_on_data_loss=True, include_headers=False, check_crcs=True):
        super().__init__(None)
        self.location, self.topic, self.partition = location, topic, partition
        self.start, self.end, self.start_is_earliest = start, end, start_is_earliest
        self.fail_on_data_loss, self.include_headers = fail_on_data_loss, include_headers
        self.check_crcs = check_crcs

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"


def _missing(r: KStoreRange, start: int, earliest: int) -> str:
    return (f"Cannot fetch offset {start} (TopicPartition: {r.name}): offsets "
            f"[{start}, {min(r.end, earliest)}) of {r.name} are no longer in the log (its "
            f"earliest available offset is now {earliest}; the query asked for [{r.start}, "
            f"{r.end})).")


def read_range(r: KStoreRange, backend=None, columns: list[str] | None = None):
    """Arrow record batches of one range, with Kafka's read-time data-loss rules
    (KafkaDataConsumer.get): offsets below the log start were aged out; offsets that vanish while
    being read are rechecked; a log that now ends before the range's end lost its tail. Only
    `columns` and `offset` are decoded when `columns` is given (column pruning)."""
    own = backend is None
    backend = backend or r.location.open()
    try:
        tp = (r.topic, r.partition)
        start, end = r.start, r.end
        earliest, latest = backend.offset_ranges([tp])[tp]
        retries = 0
        while start < end:
            if start < earliest:
                if not r.start_is_earliest or start != r.start:
                    report_data_loss(r.fail_on_data_loss, _missing(r, start, earliest))
                if end <= earliest:
                    return                      # the whole range is gone: skip it
                start = earliest
            try:
                for batch in backend.read_arrow(r.topic, r.partition, start, end, r.include_headers,
                                                  check_crcs=r.check_crcs, columns=columns):
                    if batch.num_rows:
                        start = batch.column("offset")[batch.num_rows - 1].as_py() + 1
                        yield batch
                break
            except DataUnavailable:
                retries += 1
                earliest, latest = backend.offset_ranges([tp])[tp]
                if start >= latest:
                    break                       # the rest is gone: reported below
                if start >= earliest and retries > 3:
                    raise
        if start < end:
            # Offsets up to `end` were below the high watermark when the range was planned. A
            # shorter log now means its tail was removed (topic recreated, log truncated);
            # otherwise the missing offsets are compaction gaps or transaction markers.
            _e, latest = backend.offset_ranges([tp])[tp]
            if latest < end:
                report_data_loss(r.fail_on_data_loss,
                                 f"Cannot fetch offsets [{max(start, latest)}, {end}) of {r.name}: "
                                 f"the log now ends at offset {latest} (the query asked for "
                                 f"[{r.start}, {r.end})).")
    finally:
        if own:
            backend.close()


# ---------------------------------------------------------------------------------------------
# Planning: topic-partitions and offsets
# ---------------------------------------------------------------------------------------------

def _tp_list(tps) -> str:
    return "[" + ", ".join(f"{t}-{p}" for t, p in sorted(tps)) + "]"


def subscribed_partitions(backend, opts: SourceOptions, strict: bool = True) -> list[tuple[str, int]]:
    """The topic-partitions the options name. strict: a topic or partition that does not exist
    is an error (at the start of a query); otherwise it is simply absent (a stream that lost a
    topic reports that as data loss when it plans the next batch)."""
    counts = backend.topic_partitions()
    where = backend.location.describe()
    existing = ", ".join(sorted(t for t in counts if not t.startswith("__"))) or "none"

    def unknown(topic: str) -> KStoreOptionError:
        return KStoreOptionError(
            f"topic '{topic}' does not exist in the {where} (its topics: {existing}). Create it "
            f"first, e.g. `kstore topics --log-dir DIR --create --topic {topic}` or "
            f"Broker.create_topic().")

    tps: list[tuple[str, int]] = []
    if opts.strategy == "subscribe":
        for topic in opts.topics:
            if topic not in counts:
                if strict:
                    raise unknown(topic)
                continue
            tps += [(topic, p) for p in range(counts[topic])]
    elif opts.strategy == "subscribePattern":
        pattern = re.compile(opts.pattern)
        for topic in sorted(counts):
            if not topic.startswith("__") and pattern.fullmatch(topic):
                tps += [(topic, p) for p in range(counts[topic])]
    else:
        for topic, parts in opts.assign.items():
            if topic not in counts:
                if strict:
                    raise unknown(topic)
                continue
            for p in parts:
                if p >= counts[topic]:
                    if strict:
                        raise KStoreOptionError(
                            f"partition {topic}-{p} does not exist: topic '{topic}' has "
                            f"{counts[topic]} partition(s) in the {where}")
                    continue
                tps.append((topic, p))
    return sorted(set(tps))


def resolve_offsets(backend, spec: OffsetSpec | None, default: str, tps, name: str,
                    by_timestamp_strategy: str = "error") -> tuple[dict, set]:
    """{tp: offset} for a starting/ending spec, and the tps whose offset means "earliest"."""
    tps = list(tps)
    kind = spec.kind if spec is not None else default
    ranges = backend.offset_ranges(tps)
    earliest_tps: set = set()
    out = {}
    if kind == "earliest":
        return {tp: ranges[tp][0] for tp in tps}, set(tps)
    if kind == "latest":
        return {tp: ranges[tp][1] for tp in tps}, set()
    if kind == "offsets":
        given = set(spec.offsets)
        if given != set(tps):
            raise KStoreOptionError(
                f"If {name} contains specific offsets, you must specify all TopicPartitions. Use "
                f"-1 for latest, -2 for earliest. Specified: {_tp_list(given)}, assigned: "
                f"{_tp_list(tps)}.")
        for tp in tps:
            off = spec.offsets[tp]
            if off == EARLIEST:
                out[tp] = ranges[tp][0]
                earliest_tps.add(tp)
            elif off == LATEST:
                out[tp] = ranges[tp][1]
            elif off < 0:
                raise KStoreOptionError(f"{name} for {tp[0]}-{tp[1]}: {off} is not an offset "
                                        f"(use -2 for earliest, -1 for latest)")
            else:
                out[tp] = off
        return out, earliest_tps
    # by timestamp (Kafka's offsetsForTimes: the first offset whose timestamp ≥ the given one)
    if kind == "timestamp":
        requests = {tp: spec.timestamp for tp in tps}
    else:
        given = set(spec.timestamps)
        if given != set(tps):
            raise KStoreOptionError(
                f"If {name}ByTimestamp is given, you must specify all TopicPartitions. Specified: "
                f"{_tp_list(given)}, assigned: {_tp_list(tps)}.")
        requests = dict(spec.timestamps)
    found = backend.offsets_for_times(requests)
    for tp in tps:
        off = found.get(tp)
        if off is None:
            if name.startswith("starting") and by_timestamp_strategy == "error":
                raise KStoreOptionError(
                    f"No offset matched from request of topic-partition {tp[0]}-{tp[1]} and "
                    f"timestamp {requests[tp]}: no record at or after that time below the high "
                    f"watermark. Set startingOffsetsByTimestampStrategy=latest to start at the "
                    f"latest offset instead.")
            off = ranges[tp][1]
        out[tp] = off
    return out, earliest_tps


def split_ranges(ranges: list[KStoreRange], min_partitions: int | None,
                 max_records: int | None) -> list[KStoreRange]:
    """Kafka's KafkaOffsetRangeCalculator: split big ranges so there are about minPartitions
    tasks (in proportion to each range's size), and none bigger than maxRecordsPerPartition."""
    def split(r: KStoreRange, parts: int) -> list[KStoreRange]:
        size = r.end - r.start
        parts = max(1, min(parts, size))
        bounds = [r.start + (size * i) // parts for i in range(parts + 1)]
        return [KStoreRange(r.location, r.topic, r.partition, a, b,
                            r.start_is_earliest and i == 0, r.fail_on_data_loss, r.include_headers,
                            r.check_crcs)
                for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]

    out = ranges
    if max_records:
        out = [piece for r in out for piece in split(r, math.ceil((r.end - r.start) / max_records))]
    if min_partitions and len(out) < min_partitions:
        total = sum(r.end - r.start for r in out)
        if total > 0:
            out = [piece for r in out
                   for piece in split(r, max(round((r.end - r.start) / total * min_partitions), 1))]
    return out


def _nested(flat: dict) -> dict:
    out: dict = {}
    for (t, p), off in sorted(flat.items()):
        out.setdefault(t, {})[str(p)] = int(off)
    return out


def _flat(nested: dict | None) -> dict:
    return {(t, int(p)): int(off) for t, parts in (nested or {}).items() for p, off in parts.items()}


# ---------------------------------------------------------------------------------------------
# Batch
# ---------------------------------------------------------------------------------------------

class KStoreBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, columns: list[str] | None = None):
        self.opts = opts
        self.columns = columns        # column pruning (a user-specified schema); None: all

    def partitions(self):
        opts = self.opts
        with opts.location.open() as backend:
            tps = subscribed_partitions(backend, opts)
            starts, earliest = resolve_offsets(backend, opts.starting, "earliest", tps,
                                               "startingOffsets", opts.by_timestamp_strategy)
            ends, _ = resolve_offsets(backend, opts.ending, "latest", tps, "endingOffsets")
        ranges = []
        for tp in tps:
            start, end = starts[tp], ends[tp]
            if end < start:
                raise KStoreOptionError(
                    f"Beginning offset {start} is after the ending offset {end} for topic {tp[0]} "
                    f"partition {tp[1]}. You either provided an invalid fromOffset, or the topic "
                    f"has been damaged.")
            if end > start:
                ranges.append(KStoreRange(opts.location, tp[0], tp[1], start, end, tp in earliest,
                                          opts.fail_on_data_loss, opts.include_headers, opts.check_crcs))
        return split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)

    def read(self, partition):
        if not isinstance(partition, KStoreRange):
            return iter(())        # Spark's stand-in when partitions() found nothing to read
        keep_freed_buffers()       # this runs in the executor's Python worker (kstore.malloc)
        freeze_imported_objects()  # ... a reused one (kstore/spark/worker_gc.py)
        return project(read_range(partition, columns=self.columns), self.columns)


# ---------------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------------

class KStoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are {"topic": {"partition": next offset}}. One instance lives in the driver-side
    streaming runner for the life of the query (latestOffset, partitions, commit); executors get a
    pickled copy only to call read()."""

    def __init__(self, opts: SourceOptions, columns: list[str] | None = None):
        self.opts = opts
        self.columns = columns        # column pruning (a user-specified schema); None: all
        self._backend = None
        self._target: dict | None = None      # AvailableNow: the offsets to stop at
        self._last_trigger_ms = 0             # minOffsetsPerTrigger: when the last batch ran

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_backend"] = None
        return state

    @property
    def backend(self):
        if self._backend is None:
            self._backend = self.opts.location.open()
        return self._backend

    def _latest(self, strict: bool = False) -> dict:
        tps = subscribed_partitions(self.backend, self.opts, strict=strict)
        return {tp: latest for tp, (_e, latest) in self.backend.offset_ranges(tps).items()}

    def initialOffset(self):
        tps = subscribed_partitions(self.backend, self.opts, strict=True)
        starts, _ = resolve_offsets(self.backend, self.opts.starting, "latest", tps,
                                    "startingOffsets", self.opts.by_timestamp_strategy)
        return _nested(starts)

    def getDefaultReadLimit(self):
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self):
        self._target = self._latest()

    def reportLatestOffset(self):
        return _nested(self._latest())

    def latestOffset(self, start, limit):
        """The end of the next micro-batch: every current partition's high watermark (capped at
        the AvailableNow target), cut down by the read limit. Partitions that disappeared are
        left out, so that partitions() reports them."""
        begin = _flat(start)
        latest = dict(self._target) if self._target is not None else self._latest()
        new = [tp for tp in latest if tp not in begin]
        new_from = ({tp: e for tp, (e, _l) in self.backend.offset_ranges(new).items()}
                    if new else {})
        if self._delay(begin, latest, new_from):
            return start                      # no batch yet: wait for minOffsetsPerTrigger
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            latest = self._rate_limit(limit.max_rows, begin, latest, new_from)
        return _nested(latest)

    def _delay(self, begin: dict, latest: dict, new_from: dict) -> bool:
        """Kafka's minOffsetsPerTrigger: hold the next batch back while fewer offsets are
        waiting, until maxTriggerDelay has passed since the last batch (the first batch and
        Trigger.AvailableNow are never held). Python sources have no composite read limit, so
        the source applies it itself, on the driver, where this reader lives for the query."""
        minimum = self.opts.min_offsets_per_trigger
        if not minimum or self._target is not None:
            return False
        waiting = sum(max(end - begin.get(tp, new_from.get(tp, end)), 0)
                      for tp, end in latest.items())
        now = int(time.time() * 1000)
        if waiting < minimum and now - self._last_trigger_ms < self.opts.max_trigger_delay_ms:
            return True
        self._last_trigger_ms = now
        return False

    @staticmethod
    def _rate_limit(limit: int, begin: dict, latest: dict, new_from: dict) -> dict:
        """KafkaMicroBatchStream.rateLimit: `limit` offsets split over partitions in proportion
        to their backlog; a partition with a backlog gets at least one."""
        sizes = {}
        for tp, end in latest.items():
            b = begin.get(tp, new_from.get(tp))
            if b is not None:
                sizes[tp] = end - b
        total = sum(s for s in sizes.values() if s > 0)
        if total < 1:
            return latest
        out = {}
        for tp, end in latest.items():
            if tp not in sizes:
                out[tp] = end
                continue
            b = begin.get(tp, new_from.get(tp))
            prorate = limit * (max(sizes[tp], 0) / total)
            n = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
            out[tp] = min(end, b + n)
        return out

    def partitions(self, start, end):
        begin, until = _flat(start), _flat(end)
        fail = self.opts.fail_on_data_loss
        deleted = set(begin) - set(until)
        if deleted:
            report_data_loss(fail, f"Partitions {_tp_list(deleted)} are gone: their topic was "
                                   f"deleted or the subscription changed.")
        new = [tp for tp in until if tp not in begin]
        new_from = {}
        if new:
            new_from = {tp: e for tp, (e, _l) in self.backend.offset_ranges(new).items()}
            for tp, off in new_from.items():
                if off != 0:
                    report_data_loss(fail, f"Added partition {tp[0]}-{tp[1]} starts from {off} "
                                           f"instead of 0: offsets [0, {off}) were missed.")
        ranges = []
        for tp, u in sorted(until.items()):
            f = begin.get(tp, new_from.get(tp, 0))
            if u < f:
                report_data_loss(fail, f"Partition {tp[0]}-{tp[1]}'s offset was changed from {f} "
                                       f"to {u}: the topic was recreated or its log truncated.")
                continue
            if u > f:
                ranges.append(KStoreRange(self.opts.location, tp[0], tp[1], f, u, False, fail,
                                          self.opts.include_headers, self.opts.check_crcs))
        return split_ranges(ranges, self.opts.min_partitions, self.opts.max_records_per_partition)

    def read(self, partition):
        keep_freed_buffers()
        freeze_imported_objects()
        return project(read_range(partition, columns=self.columns), self.columns)

    def commit(self, end):
        """Spark calls this lazily (when planning the next batch) and repeatedly; like Spark's
        Kafka source, kstore keeps nothing on the source side: the checkpoint has the offsets."""

    def stop(self):
        if self._backend is not None:
            self._backend.close()
            self._backend = None


# ---------------------------------------------------------------------------------------------
# The data source
# ---------------------------------------------------------------------------------------------

# The fixed schema's columns and their types (DataType.simpleString()).
COLUMN_TYPES = {"key": "binary", "value": "binary", "topic": "string", "partition": "int",
                "offset": "bigint", "timestamp": "timestamp", "timestampType": "int",
                "headers": "array<struct<key:string,value:binary>>"}


def _pruned_columns(schema, include_headers: bool) -> list[str] | None:
    """The columns a user-specified schema selects, or None for the whole fixed schema.

    Column pruning: Spark does not tell a Python data source which columns a query uses (only
    filters can be pushed down), so a query that needs few columns says so with a schema that
    is a subset of the fixed one, e.g. `.schema("key binary, offset long")`, and only those
    columns cross from the Python worker to the JVM. (Spark's Kafka source refuses any
    user-specified schema; kstore accepts subsets, and refuses everything else as Spark does.)"""
    fields = list(getattr(schema, "fields", None) or [])
    if not fields:
        return None
    allowed = [c for c in COLUMN_TYPES if c != "headers" or include_headers]
    names = [f.name for f in fields]
    wrong = [f"{f.name} {f.dataType.simpleString()}" for f in fields
             if f.name not in allowed or f.dataType.simpleString() != COLUMN_TYPES[f.name]]
    if wrong or len(set(names)) != len(names):
        fixed = ", ".join(f"{c} {COLUMN_TYPES[c]}" for c in allowed)
        raise KStoreOptionError(
            f"the kstore source has a fixed schema ({fixed}); a user-specified schema may only "
            f"select some of its columns, with their types (column pruning), but "
            f"{', '.join(wrong) or 'a repeated column'} is not one of them")
    return None if names == allowed else names


def project(batches, columns: list[str] | None):
    """Only the selected columns of each Arrow batch (column pruning), or the batches as they are."""
    if columns is None:
        return batches
    return (b.select(columns) for b in batches)


class KStoreDataSource(DataSource):
    """Register with `spark.dataSource.register(KStoreDataSource)` (or kstore.spark.register)."""

    @classmethod
    def name(cls) -> str:
        return "kstore"

    def schema(self):
        opts = parse_source_options(self.options, None)
        with opts.location.open() as backend:
            subscribed_partitions(backend, opts, strict=True)   # a missing topic fails at load()
        return SCHEMA_WITH_HEADERS if opts.include_headers else SCHEMA

    def reader(self, schema):
        opts = parse_source_options(self.options, streaming=False)
        return KStoreBatchReader(opts, _pruned_columns(schema, opts.include_headers))

    def streamReader(self, schema):
        opts = parse_source_options(self.options, streaming=True)
        return KStoreStreamReader(opts, _pruned_columns(schema, opts.include_headers))

    def writer(self, schema, overwrite: bool):
        from .sink import KStoreBatchWriter
        return KStoreBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        from .sink import KStoreStreamWriter
        return KStoreStreamWriter(self.options, schema, overwrite)


def offsets_json(offsets: dict) -> str:
    """Kafka's offsets JSON of {(topic, partition): offset} or {topic: {partition: offset}}."""
    nested = offsets if all(isinstance(k, str) for k in offsets) else _nested(offsets)
    return json.dumps(nested, separators=(",", ":"))


freeze_imported_objects()   # a Spark worker that unpickled the source to plan a read

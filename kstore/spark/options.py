"""The options of the `kstore` data source, checked the way Spark's Kafka source checks them.

Spark hands a data source its options as a case-insensitive dict of strings. Everything is
validated when the DataFrame is created (`load()`), so a typo fails at once with a message that
says which option, which value and what would be accepted, instead of deep inside a task.

Offsets are Kafka's JSON, exactly as Spark's Kafka source writes them in its checkpoints:
`{"topic": {"0": 23, "1": -2}}`, an offset being the *next* offset to read; −2 means earliest and
−1 latest. Partitions are strings in JSON (JSON object keys always are).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from dataclasses import dataclass, field

from ..errors import KStoreError
from .backends import Location

EARLIEST, LATEST = -2, -1


class KStoreOptionError(KStoreError, ValueError):
    """A bad option of the kstore data source (Spark shows it wrapped in an AnalysisException or
    a StreamingQueryException, with this message)."""


# Canonical spelling of every option (Spark lower-cases the keys it hands over).
SOURCE_OPTIONS = [
    "path", "kafka.bootstrap.servers",
    "subscribe", "subscribePattern", "assign",
    "startingOffsets", "endingOffsets",
    "startingTimestamp", "endingTimestamp",
    "startingOffsetsByTimestamp", "endingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy",
    "failOnDataLoss", "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
    "minPartitions", "maxRecordsPerPartition", "includeHeaders", "kafkaConsumer.pollTimeoutMs",
    "fetchOffset.numRetries", "fetchOffset.retryIntervalMs", "groupIdPrefix",
    "kafka.isolation.level", "kafka.request.timeout.ms", "kafka.check.crcs",
]
SINK_OPTIONS = ["path", "kafka.bootstrap.servers", "topic", "includeHeaders",
                "kafkaConsumer.pollTimeoutMs", "kafka.compression.type", "kafka.request.timeout.ms",
                "kafka.acks", "kstore.lockTimeoutMs", "kstore.stagingDir", "kstore.compression",
                "kstore.sinkId", "kstore.batchId", "kafka.transaction.timeout.ms"]
# Added by Spark itself to a streaming sink's options.
SPARK_ADDED = ["checkpointLocation", "queryName"]

_CANONICAL = {name.lower(): name for name in SOURCE_OPTIONS + SINK_OPTIONS + SPARK_ADDED}

# Accepted, as Spark's Kafka source accepts them, but without effect in kstore: reported once.
IGNORED = {
    "groupidprefix": "the kstore source uses no consumer group (offsets live in the Spark "
                     "checkpoint, as with Spark's Kafka source, which uses the group only to "
                     "name its consumers)",
    "kafka.group.id": "the kstore source uses no consumer group (offsets live in the Spark "
                      "checkpoint)",
    "fetchoffset.numretries": "kstore's client retries offset lookups for the request timeout, "
                              "as Kafka's admin client does",
    "fetchoffset.retryintervalms": "kstore's client retries offset lookups every 100 ms "
                                   "(retry.backoff.ms)",
}
# kafka.* settings Spark's Kafka source refuses, with what to do instead (KafkaSourceProvider).
REFUSED = {
    "kafka.auto.offset.reset": "set the source option 'startingOffsets' to 'earliest' or "
                               "'latest' instead",
    "kafka.enable.auto.commit": "offsets are kept in the query's checkpoint, never committed to "
                                "a group",
    "kafka.key.deserializer": "keys are always read as bytes (binary column 'key'); cast or "
                              "decode them with DataFrame operations",
    "kafka.value.deserializer": "values are always read as bytes (binary column 'value'); cast or "
                                "decode them with DataFrame operations",
    "kafka.key.serializer": "write a string or binary 'key' column instead",
    "kafka.value.serializer": "write a string or binary 'value' column instead",
    "kafka.interceptor.classes": "kstore runs no Kafka client interceptors",
}
_REPORTED: set[str] = set()


def report_ignored(names: list[str], what: str) -> None:
    """Print once per process which accepted options kstore does not use (Spark's workers
    have no logging set up; their stderr goes to the Spark process's log)."""
    new = [n for n in names if n.lower() not in _REPORTED]
    if not new:
        return
    _REPORTED.update(n.lower() for n in new)
    reasons = "; ".join(f"{n}: {IGNORED.get(n.lower(), 'a Kafka client setting kstore does not use')}"
                        for n in new)
    print(f"WARN kstore.spark: options accepted but ignored by the kstore {what}: {reasons}",
          file=sys.stderr, flush=True)

ASSIGN_EXAMPLE = '{"topicA":[0,1],"topicB":[0,1]}'
OFFSETS_EXAMPLE = '{"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}'
TIMESTAMPS_EXAMPLE = '{"topicA":{"0":1700000000000,"1":1700000000000}}'


_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
            "d": 86_400_000}


def duration_ms(value, name: str) -> int:
    """Spark's time strings ("15m", "30s", "500ms"; a bare number is milliseconds)."""
    m = _DURATION.match(str(value))
    if not m:
        raise KStoreOptionError(f"option '{name}' must be a duration such as 15m, 30s or 500ms, "
                                f"got {value!r}")
    return int(m.group(1)) * _UNIT_MS[m.group(2).lower() if m.group(2) else None]


class _Options(dict):
    """Case-insensitive lookups, as Spark's CaseInsensitiveDict (whose keys come lower-cased)."""

    def __init__(self, options):
        super().__init__({str(k).lower(): v for k, v in dict(options).items()})

    def get(self, key, default=None):
        return super().get(key.lower(), default)

    def __getitem__(self, key):
        return super().__getitem__(key.lower())

    def __contains__(self, key):
        return super().__contains__(key.lower())


def _name(key: str) -> str:
    return _CANONICAL.get(key.lower(), key)


def check_known(options: dict, allowed: list[str], what: str) -> list[str]:
    """Refuse unknown options (naming the close ones); return the accepted ones kstore ignores:
    `kafka.*` client settings without a meaning here, and consumer-group settings."""
    allowed_lower = {a.lower() for a in allowed} | {a.lower() for a in SPARK_ADDED}
    ignored = []
    for key in options:
        k = key.lower()
        if k in REFUSED:
            raise KStoreOptionError(f"Kafka option '{key[len('kafka.'):]}' is not supported by the "
                                    f"kstore {what}: {REFUSED[k]}")
        if k in IGNORED or (k.startswith("kafka.") and k not in allowed_lower):
            ignored.append(key)
            continue
        if k in allowed_lower:
            continue
        close = [a for a in allowed if a.lower().replace(".", "") == k.replace(".", "")
                 or a.lower().startswith(k[:6])]
        hint = f" Did you mean {' or '.join(repr(c) for c in close[:2])}?" if close else ""
        raise KStoreOptionError(
            f"unknown option '{key}' for the kstore {what}.{hint} Known options: "
            f"{', '.join(allowed)}, and Kafka client settings as kafka.*.")
    return ignored


def _bool(options: dict, name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    v = str(value).strip().lower()
    if v not in ("true", "false"):
        raise KStoreOptionError(f"option '{name}' must be 'true' or 'false', got {value!r}")
    return v == "true"


def _positive_int(options: dict, name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        n = int(str(value).strip())
    except ValueError:
        n = 0
    if n <= 0:
        raise KStoreOptionError(f"Invalid value '{value}' for option '{name}', must be a "
                                f"positive integer")
    return n


def _json(text: str, name: str, example: str):
    try:
        return json.loads(text)
    except (TypeError, ValueError) as e:
        raise KStoreOptionError(f"option '{name}' is not valid JSON ({e}): expected e.g. "
                                f"{example}, got {text!r}") from None


def parse_partition_offsets(text: str, name: str, example: str = OFFSETS_EXAMPLE
                            ) -> dict[tuple[str, int], int]:
    """Kafka's {"topic": {"partition": number}} JSON → {(topic, partition): number}."""
    value = _json(text, name, example)
    if not isinstance(value, dict) or not value:
        raise KStoreOptionError(f"option '{name}': expected e.g. {example}, got {text!r}")
    out = {}
    for topic, parts in value.items():
        if not isinstance(parts, dict):
            raise KStoreOptionError(f"option '{name}': topic {topic!r} must map partitions to "
                                    f"numbers, e.g. {example}; got {json.dumps(parts)}")
        for p, off in parts.items():
            try:
                partition = int(p)
            except ValueError:
                partition = -1
            if partition < 0 or isinstance(off, bool) or not isinstance(off, int):
                raise KStoreOptionError(
                    f"option '{name}': partition {p!r} of topic {topic!r} must be a "
                    f"non-negative integer mapped to an integer, e.g. {example}; got "
                    f"{json.dumps({p: off})}")
            out[(topic, partition)] = off
    return out


def parse_assign(text: str) -> dict[str, list[int]]:
    value = _json(text, "assign", ASSIGN_EXAMPLE)
    ok = isinstance(value, dict) and value and all(
        isinstance(ps, list) and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                                     for p in ps) for ps in value.values())
    if not ok:
        raise KStoreOptionError(f"option 'assign': expected e.g. {ASSIGN_EXAMPLE}, got {text!r}")
    return {t: sorted(set(ps)) for t, ps in value.items()}


@dataclass
class OffsetSpec:
    """Where a range starts or ends, before it is resolved against the log."""
    kind: str                       # "earliest" | "latest" | "offsets" | "timestamp" | "timestamps"
    offsets: dict = field(default_factory=dict)   # (t, p) -> offset (kind "offsets")
    timestamp: int | None = None                   # kind "timestamp"
    timestamps: dict = field(default_factory=dict) # (t, p) -> ms (kind "timestamps")


@dataclass
class SourceOptions:
    location: Location
    strategy: str                    # "subscribe" | "subscribePattern" | "assign"
    topics: list[str] = field(default_factory=list)
    pattern: str | None = None
    assign: dict[str, list[int]] = field(default_factory=dict)
    starting: OffsetSpec | None = None       # None: the mode's default
    ending: OffsetSpec | None = None
    by_timestamp_strategy: str = "error"
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    isolation_level: str = "read_uncommitted"
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    include_headers: bool = False
    check_crcs: bool = True      # kafka.check.crcs: each batch's CRC checked before decoding

    def describe_subscription(self) -> str:
        if self.strategy == "subscribe":
            return f"subscribe={','.join(self.topics)}"
        if self.strategy == "subscribePattern":
            return f"subscribePattern={self.pattern}"
        return f"assign={json.dumps(self.assign)}"


def location_from(options: dict) -> Location:
    path = options.get("path")
    servers = options.get("kafka.bootstrap.servers")
    timeout = (_positive_int(options, "kafkaConsumer.pollTimeoutMs")
               or _positive_int(options, "kafka.request.timeout.ms") or 30000)
    if path and servers:
        raise KStoreOptionError("give either a log directory (load(path) / option 'path') or "
                                "'kafka.bootstrap.servers', not both")
    if not path and not servers:
        raise KStoreOptionError(
            "the kstore source needs a log directory (spark.read.format('kstore').load(\"/path/to/"
            "log-dir\") or option 'path') or a running broker (option 'kafka.bootstrap.servers', "
            "e.g. '127.0.0.1:9092' for `kstore serve --port 9092`)")
    if path:
        import os
        path = str(path)
        if path.startswith("file:"):
            path = path[len("file:"):]
            if path.startswith("//"):
                path = path[2:]
        return Location(log_dir=os.path.abspath(path), timeout_ms=timeout)
    return Location(bootstrap_servers=str(servers), timeout_ms=timeout)


def _offset_spec(options: dict, name: str, by_ts_name: str, ts_name: str) -> OffsetSpec | None:
    if options.get(by_ts_name) is not None:
        text = options[by_ts_name]
        return OffsetSpec("timestamps", timestamps=parse_partition_offsets(text, by_ts_name,
                                                                          TIMESTAMPS_EXAMPLE))
    if options.get(ts_name) is not None:
        text = str(options[ts_name]).strip()
        try:
            ts = int(text)
        except ValueError:
            ts = -1
        if ts < 0:
            raise KStoreOptionError(f"option '{ts_name}' must be a timestamp in milliseconds since "
                                    f"the epoch (a non-negative integer), got {options[ts_name]!r}")
        return OffsetSpec("timestamp", timestamp=ts)
    text = options.get(name)
    if text is None:
        return None
    t = str(text).strip()
    if t.lower() == "earliest":
        return OffsetSpec("earliest")
    if t.lower() == "latest":
        return OffsetSpec("latest")
    if not t.startswith("{"):
        raise KStoreOptionError(f"option '{name}' must be 'earliest', 'latest' or Kafka's offsets "
                                f"JSON, e.g. {OFFSETS_EXAMPLE}; got {text!r}")
    return OffsetSpec("offsets", offsets=parse_partition_offsets(t, name))


def parse_source_options(options: dict, streaming: bool | None) -> SourceOptions:
    """Validate everything that can be checked without looking at the log. `streaming` is None
    when the mode is not known yet (schema())."""
    options = _Options(options)
    ignored = check_known(options, SOURCE_OPTIONS, "source")
    location = location_from(options)
    given = [s for s in ("subscribe", "subscribePattern", "assign") if options.get(s) is not None]
    if not given:
        raise KStoreOptionError("One of the following options must be specified for the kstore "
                                "source: subscribe, subscribePattern, assign.")
    if len(given) > 1:
        raise KStoreOptionError(f"Only one of the following options can be specified for the "
                                f"kstore source: subscribe, subscribePattern, assign (got "
                                f"{', '.join(given)}).")
    strategy = given[0]
    opts = SourceOptions(location, strategy)
    value = str(options[strategy])
    if strategy == "subscribe":
        opts.topics = [t.strip() for t in value.split(",") if t.strip()]
        if not opts.topics:
            raise KStoreOptionError(f"No topics to subscribe to as specified value for option "
                                    f"subscribe is '{value}'")
    elif strategy == "subscribePattern":
        if not value.strip():
            raise KStoreOptionError(f"Pattern to subscribe is empty as specified value for option "
                                    f"subscribePattern is '{value}'")
        try:
            re.compile(value)
        except re.error as e:
            raise KStoreOptionError(f"option 'subscribePattern': {value!r} is not a valid regular "
                                    f"expression ({e})") from None
        opts.pattern = value
    else:
        opts.assign = parse_assign(value)

    opts.starting = _offset_spec(options, "startingOffsets", "startingOffsetsByTimestamp",
                                 "startingTimestamp")
    opts.ending = _offset_spec(options, "endingOffsets", "endingOffsetsByTimestamp",
                               "endingTimestamp")
    strat = str(options.get("startingOffsetsByTimestampStrategy", "error")).strip().lower()
    if strat not in ("error", "latest"):
        raise KStoreOptionError(f"option 'startingOffsetsByTimestampStrategy' must be 'error' or "
                                f"'latest', got {options['startingOffsetsByTimestampStrategy']!r}")
    opts.by_timestamp_strategy = strat
    opts.fail_on_data_loss = _bool(options, "failOnDataLoss", True)
    opts.include_headers = _bool(options, "includeHeaders", False)
    opts.max_offsets_per_trigger = _positive_int(options, "maxOffsetsPerTrigger")
    opts.min_offsets_per_trigger = _positive_int(options, "minOffsetsPerTrigger")
    if options.get("maxTriggerDelay") is not None:
        opts.max_trigger_delay_ms = duration_ms(options["maxTriggerDelay"], "maxTriggerDelay")
    if opts.max_offsets_per_trigger and opts.min_offsets_per_trigger and \
            opts.min_offsets_per_trigger > opts.max_offsets_per_trigger:
        raise KStoreOptionError(f"minOffsetsPerTrigger ({opts.min_offsets_per_trigger}) must not "
                                f"exceed maxOffsetsPerTrigger ({opts.max_offsets_per_trigger})")
    for name in ("fetchOffset.numRetries", "fetchOffset.retryIntervalMs"):
        value = options.get(name)
        if value is not None and not str(value).strip().isdigit():
            raise KStoreOptionError(f"Invalid value '{value}' for option '{name}', must be a "
                                    f"non-negative integer")
    isolation = str(options.get("kafka.isolation.level", "read_uncommitted")).strip().lower()
    if isolation not in ("read_uncommitted", "read_committed"):
        raise KStoreOptionError(f"Kafka option 'isolation.level' must be read_uncommitted or "
                                f"read_committed, got {options['kafka.isolation.level']!r}")
    opts.isolation_level = isolation
    if isolation == "read_committed":   # latest = the LSO, aborted records dropped (spark.isolation)
        opts.location = dataclasses.replace(opts.location, read_committed=True)
    report_ignored(ignored, "source")
    opts.check_crcs = _bool(options, "kafka.check.crcs", True)   # Kafka's consumer default
    opts.min_partitions = _positive_int(options, "minPartitions")
    opts.max_records_per_partition = _positive_int(options, "maxRecordsPerPartition")

    if streaming is True:
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if options.get(name) is not None:
                raise KStoreOptionError(f"option '{name}' is not valid in streaming queries (a "
                                        f"stream has no end; use Trigger.AvailableNow to stop at "
                                        f"the data present when the query starts)")
    if streaming is False:
        s, e = opts.starting, opts.ending
        if s is not None and s.kind == "latest":
            raise KStoreOptionError("starting offset can't be latest for batch queries on kstore")
        if s is not None and s.kind == "offsets":
            for (t, p), off in s.offsets.items():
                if off == LATEST:
                    raise KStoreOptionError(f"startingOffsets for {t}-{p} can't be latest (-1) for "
                                            f"batch queries on kstore")
        if e is not None and e.kind == "earliest":
            raise KStoreOptionError("ending offset can't be earliest for batch queries on kstore")
        if e is not None and e.kind == "offsets":
            for (t, p), off in e.offsets.items():
                if off == EARLIEST:
                    raise KStoreOptionError(f"endingOffsets for {t}-{p} can't be earliest (-2) for "
                                            f"batch queries on kstore")
    return opts


@dataclass
class SinkOptions:
    location: Location
    topic: str | None
    lock_timeout_ms: int = 30000
    staging_dir: str | None = None
    compression: str = "none"
    sink_id: str | None = None
    batch_id: int | None = None
    checkpoint_location: str | None = None
    transaction_timeout_ms: int = 60000     # the producer's transaction.timeout.ms


def parse_sink_options(options: dict) -> SinkOptions:
    options = _Options(options)
    ignored = check_known(options, SINK_OPTIONS, "sink")
    acks = options.get("kafka.acks")
    if acks is not None and str(acks).strip().lower() not in ("all", "-1"):
        ignored.append("kafka.acks")      # the sink always waits for acks=all
    report_ignored(ignored, "sink")
    location = location_from(options)
    topic = options.get("topic")
    if topic is not None:
        from ..topic import validate_topic_name
        try:
            validate_topic_name(str(topic))
        except KStoreError as e:
            raise KStoreOptionError(f"option 'topic': {e}") from None
    compression_option = ("kstore.compression" if "kstore.compression" in options
                          else "kafka.compression.type")
    compression = str(options.get(compression_option, "none")).lower()
    from ..compression import Compression
    try:
        Compression.from_name(compression)
    except ValueError as e:
        raise KStoreOptionError(f"option '{compression_option}': {e}") from None
    batch_id = options.get("kstore.batchId")
    if batch_id is not None:
        try:
            batch_id = int(str(batch_id).strip())
        except ValueError:
            batch_id = -1
        if batch_id < 0:
            raise KStoreOptionError(f"option 'kstore.batchId' must be a non-negative integer (e.g. "
                                    f"foreachBatch's batch id), got {options['kstore.batchId']!r}")
        if not options.get("kstore.sinkId"):
            raise KStoreOptionError("option 'kstore.batchId' needs 'kstore.sinkId' too: together "
                                    "they make a write idempotent")
    return SinkOptions(location, topic, _positive_int(options, "kstore.lockTimeoutMs") or 30000,
                       options.get("kstore.stagingDir"), compression, options.get("kstore.sinkId"),
                       batch_id, options.get("checkpointLocation"),
                       _positive_int(options, "kafka.transaction.timeout.ms") or 60000)

"""Topic/log configuration under Kafka's own names and defaults, validated like Kafka's ConfigDef.

Mirrors Kafka's `LogConfig` (and `ServerLogConfigs` for the defaults, `ServerTopicConfigSynonyms` for
the broker-wide defaults of the topic configs). Values may be given as Python values or as the
strings a `.properties` file holds. Access by Kafka name (`config["segment.bytes"]`)
or by attribute with dots as underscores (`config.segment_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Mapping

from .errors import ConfigError

LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1


@dataclass(frozen=True)
class ConfigKey:
    name: str
    type: str                         # "int", "long", "double", "boolean", "string", "list"
    default: Any
    validator: Callable[[Any], str | None] | None = None
    doc: str = ""


def at_least(minimum):
    return lambda v: None if v >= minimum else f"Value must be at least {minimum}"


def between(lo, hi):
    return lambda v: None if lo <= v <= hi else f"Value must be between {lo} and {hi}"


def one_of(*options):
    return lambda v: None if v in options else f"String must be one of: {', '.join(options)}"


def list_of(*options):
    def check(values):
        bad = [v for v in values if v not in options]
        if bad:
            return f"Invalid value(s) {', '.join(bad)}: must be one of {', '.join(options)}"
        if not values:
            return "must not be empty"
        return None
    return check


_KEYS = [
    ConfigKey("segment.bytes", "int", 1073741824, at_least(14),
              "Roll a new segment when the active one would grow past this many bytes."),
    ConfigKey("segment.ms", "long", 604800000, at_least(1),
              "Roll a new segment when the active one spans this long (by record timestamps)."),
    ConfigKey("segment.jitter.ms", "long", 0, at_least(0),
              "Random amount subtracted from segment.ms per segment, to spread rolls."),
    ConfigKey("segment.index.bytes", "int", 10485760, at_least(4),
              "Size each index file is preallocated to; a full index rolls the segment."),
    ConfigKey("index.interval.bytes", "int", 4096, at_least(0),
              "Add an offset-index entry after more than this many bytes since the last one."),
    ConfigKey("flush.messages", "long", LONG_MAX, at_least(1),
              "fsync after this many appended messages (default: leave it to the OS)."),
    ConfigKey("flush.ms", "long", LONG_MAX, at_least(0),
              "fsync when this long has passed since the last flush."),
    ConfigKey("retention.ms", "long", 604800000, at_least(-1),
              "Delete segments whose newest record is older than this (−1: keep forever)."),
    ConfigKey("retention.bytes", "long", -1, None,
              "Delete old segments while the log is bigger than this (−1: no limit)."),
    ConfigKey("file.delete.delay.ms", "long", 60000, at_least(0),
              "How long a `.deleted` file stays before it is removed."),
    ConfigKey("max.message.bytes", "int", 1048588, at_least(0),
              "Largest record batch the log accepts."),
    ConfigKey("message.timestamp.type", "string", "CreateTime", one_of("CreateTime", "LogAppendTime"),
              "Keep the producer's timestamps, or stamp the broker's time on append."),
    ConfigKey("message.timestamp.before.max.ms", "long", LONG_MAX, at_least(0),
              "Refuse records whose CreateTime is more than this far behind the broker's clock."),
    ConfigKey("message.timestamp.after.max.ms", "long", LONG_MAX, at_least(0),
              "Refuse records whose CreateTime is more than this far ahead of the broker's clock."),
    ConfigKey("preallocate", "boolean", False, None,
              "Preallocate the `.log` file to segment.bytes when a segment is created."),
    ConfigKey("cleanup.policy", "list", ("delete",), list_of("compact", "delete"),
              "delete (retention), compact (keep the latest value per key), or both."),
    ConfigKey("compression.type", "string", "producer",
              one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
              "Codec for stored batches; `producer` keeps what the producer sent."),
    ConfigKey("delete.retention.ms", "long", 86400000, at_least(0),
              "How long tombstones are kept after compaction first sees them."),
    ConfigKey("min.cleanable.dirty.ratio", "double", 0.5, between(0.0, 1.0),
              "Compact a log when its dirty fraction exceeds this."),
    ConfigKey("min.compaction.lag.ms", "long", 0, at_least(0),
              "Records younger than this are never compacted."),
    ConfigKey("max.compaction.lag.ms", "long", LONG_MAX, at_least(1),
              "Records older than this are compacted even below the dirty ratio."),
    ConfigKey("min.insync.replicas", "int", 1, at_least(1),
              "acks=all fails unless at least this many replicas are in sync."),
    ConfigKey("unclean.leader.election.enable", "boolean", False, None,
              "Allow an out-of-sync replica to become leader (may lose committed data)."),
    ConfigKey("message.downconversion.enable", "boolean", True, None, "Accepted, unused by kstore."),
]
KEYS: dict[str, ConfigKey] = {k.name: k for k in _KEYS}


def _convert(key: ConfigKey, value: Any) -> Any:
    name = key.name
    try:
        if key.type in ("int", "long"):
            if isinstance(value, bool) or isinstance(value, float):
                raise TypeError
            v = int(str(value).strip()) if isinstance(value, str) else int(value)
            if key.type == "int" and not -(1 << 31) <= v <= INT_MAX:
                raise ConfigError(f"Invalid value {value} for configuration {name}: "
                                  f"not a 32-bit integer")
            return v
        if key.type == "double":
            return float(value)
        if key.type == "boolean":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "false"):
                return value.strip().lower() == "true"
            raise TypeError
        if key.type == "string":
            if not isinstance(value, str):
                raise TypeError
            return value.strip()
        if key.type == "list":
            if isinstance(value, str):
                items = [s.strip() for s in value.split(",") if s.strip()]
            else:
                items = [str(s).strip() for s in value]
            return tuple(items)
    except ConfigError:
        raise
    except (TypeError, ValueError):
        raise ConfigError(f"Invalid value {value!r} for configuration {name}: "
                          f"expected type {key.type}") from None
    raise AssertionError(key.type)


class _Config:
    """Validated configuration: Kafka names, Kafka defaults, ConfigDef-style checks."""

    _keys: dict[str, ConfigKey] = {}
    _unknown = "Unknown config name"

    def __init__(self, overrides: Mapping[str, Any] | None = None, **kwargs: Any):
        values = {k.name: k.default for k in self._keys.values()}
        given = dict(overrides or {})
        given.update({k.replace("_", "."): v for k, v in kwargs.items()})
        for name, raw in given.items():
            key = self._keys.get(name)
            if key is None:
                raise ConfigError(f"{self._unknown}: {name}")
            value = _convert(key, raw)
            if key.validator is not None:
                problem = key.validator(value)
                if problem:
                    raise ConfigError(f"Invalid value {raw} for configuration {name}: {problem}")
            values[name] = value
        self._values = values
        self._overrides = {n: values[n] for n in given}
        for name, value in values.items():   # plain attributes: config.segment_bytes is hot
            self.__dict__[name.replace(".", "_")] = value
        self._check_consistency()

    def _check_consistency(self) -> None:
        pass

    def __getitem__(self, name: str) -> Any:
        if name not in self._values:
            raise KeyError(f"unknown config {name!r}")
        return self._values[name]

    def __getattr__(self, attr: str) -> Any:
        name = attr.replace("_", ".")
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        raise AttributeError(attr)

    def with_overrides(self, overrides: Mapping[str, Any]):
        merged = dict(self._overrides)
        merged.update(overrides)
        return type(self)(merged)

    @property
    def overrides(self) -> dict[str, Any]:
        return dict(self._overrides)

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._overrides})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._values == self._values


def check_log_values(value: Callable[[str], Any], label: Callable[[str], str] = str) -> None:
    """The checks no single validator can make; `label` names a topic config in the message (the
    broker checks its topic defaults under its own names)."""
    if value("retention.bytes") < -1:
        raise ConfigError(f"Invalid value {value('retention.bytes')} for configuration "
                          f"{label('retention.bytes')}: must be -1 (no limit) or at least 0")
    if value("max.compaction.lag.ms") < value("min.compaction.lag.ms"):
        raise ConfigError(
            f"conflict: {label('max.compaction.lag.ms')} ({value('max.compaction.lag.ms')}) must "
            f"be at least {label('min.compaction.lag.ms')} ({value('min.compaction.lag.ms')})")


class LogConfig(_Config):
    """Validated per-log (topic) configuration. Unknown names and impossible values raise ConfigError."""

    _keys = KEYS
    _unknown = "Unknown topic config name"

    def _check_consistency(self) -> None:
        check_log_values(self.__getitem__)

    # Derived once: a config never changes (new values make a new LogConfig), and every append
    # asks for these. A cached_property is then a plain attribute of the instance.
    @cached_property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @cached_property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @cached_property
    def max_segment_ms(self) -> int:
        """segment.ms, capped by max.compaction.lag.ms for compacted logs (LogConfig.maxSegmentMs)."""
        if self.compact and self.max_compaction_lag_ms > 0:
            return min(self.segment_ms, self.max_compaction_lag_ms)
        return self.segment_ms

    @property
    def initial_file_size(self) -> int:
        return self.segment_bytes if self.preallocate else 0


_BROKER_KEYS = [
    ConfigKey("log.retention.check.interval.ms", "long", 300000, at_least(1),
              "How often the retention task looks for deletable segments."),
    ConfigKey("log.initial.task.delay.ms", "long", 30000, at_least(0),
              "Delay before the first retention and cleaner runs after startup."),
    ConfigKey("log.cleaner.enable", "boolean", True, None, "Run the log cleaner (compaction)."),
    ConfigKey("log.cleaner.threads", "int", 1, at_least(0), "Cleaner threads (the offset map is split)."),
    ConfigKey("log.cleaner.dedupe.buffer.size", "long", 134217728, at_least(24),
              "Memory for the cleaners' offset maps (24 bytes per key)."),
    ConfigKey("log.cleaner.io.buffer.load.factor", "double", 0.9, between(0.01, 1.0),
              "Fill the offset map to at most this fraction of its slots."),
    ConfigKey("log.cleaner.backoff.ms", "long", 15000, at_least(0),
              "Sleep between cleaner runs when there was nothing to clean."),
    ConfigKey("log.flush.offset.checkpoint.interval.ms", "int", 60000, at_least(0),
              "How often recovery points are checkpointed."),
    ConfigKey("log.flush.start.offset.checkpoint.interval.ms", "int", 60000, at_least(0),
              "How often log start offsets are checkpointed."),
    ConfigKey("num.partitions", "int", 1, at_least(1), "Partitions of an auto-created topic."),
    ConfigKey("replica.lag.time.max.ms", "long", 30000, at_least(1),
              "A follower that has not caught up for this long leaves the ISR."),
    ConfigKey("replica.fetch.wait.max.ms", "int", 500, at_least(0),
              "How long a follower's fetch may wait at the leader for new data."),
    ConfigKey("replica.fetch.max.bytes", "int", 1048576, at_least(0),
              "Bytes a follower asks for per partition."),
    ConfigKey("replica.high.watermark.checkpoint.interval.ms", "long", 5000, at_least(1),
              "How often high watermarks are written to replication-offset-checkpoint."),
    ConfigKey("request.timeout.ms", "int", 30000, at_least(0),
              "How long an acks=all produce waits for the ISR."),
    ConfigKey("auto.create.topics.enable", "boolean", True, None,
              "Create a topic on its first produce."),
    ConfigKey("default.replication.factor", "int", 1, at_least(1),
              "Replication factor of an auto-created topic."),
    ConfigKey("producer.id.expiration.ms", "int", 86400000, at_least(1),
              "A partition forgets an idempotent producer idle this long."),
    ConfigKey("producer.id.expiration.check.interval.ms", "int", 600000, at_least(1),
              "How often partitions look for expired producer ids."),
    # ---- limits of `kstore serve` (Kafka's SocketServer / ConnectionQuotas names and defaults)
    ConfigKey("max.connections", "int", INT_MAX, at_least(0),
              "Connections the broker holds at once; at the limit it stops accepting until one "
              "closes (new ones wait in the listen backlog)."),
    ConfigKey("max.connections.per.ip", "int", INT_MAX, at_least(0),
              "Connections one client address may hold; one more is closed at once."),
    ConfigKey("max.connections.per.ip.overrides", "string", "", None,
              "Per-address exceptions to max.connections.per.ip: 'host:count,host:count'."),
    # Kafka's SocketServer sets these on every accepted connection; -1 leaves the OS default
    # (on Linux: the kernel sizes the buffers itself as a connection's traffic grows).
    ConfigKey("socket.send.buffer.bytes", "int", 102400, at_least(-1),
              "SO_SNDBUF of each accepted connection (-1: the OS default)."),
    ConfigKey("socket.receive.buffer.bytes", "int", 102400, at_least(-1),
              "SO_RCVBUF of each accepted connection (-1: the OS default)."),
    ConfigKey("socket.request.max.bytes", "int", 104857600, at_least(1),
              "Largest request frame; a bigger size prefix closes the connection."),
    ConfigKey("connections.max.idle.ms", "long", 600000, at_least(1),
              "Close a connection idle (or stalled mid-frame) this long."),
    # kstore's own (the name KIP-578 proposed): each hosted partition costs open files.
    ConfigKey("max.broker.partitions", "int", 5000, at_least(1),
              "Partitions this broker will host; CreateTopics/CreatePartitions beyond it fail "
              "with POLICY_VIOLATION (kstore's own limit, not in Kafka)."),
    # the classic group coordinator (kstore.group_membership)
    ConfigKey("group.min.session.timeout.ms", "int", 6000, at_least(0),
              "The shortest session timeout a consumer may ask for in JoinGroup."),
    ConfigKey("group.max.session.timeout.ms", "int", 1800000, at_least(0),
              "The longest session timeout a consumer may ask for in JoinGroup."),
    ConfigKey("group.initial.rebalance.delay.ms", "int", 3000, at_least(0),
              "How long the first rebalance of an empty group waits for more members to join."),
    ConfigKey("group.max.size", "int", INT_MAX, at_least(1),
              "The most members one consumer group may have."),
    # the transaction coordinator (kstore.transaction_coordinator)
    ConfigKey("transaction.state.log.num.partitions", "int", 50, at_least(1),
              "Partitions of __transaction_state (fixed once the topic exists)."),
    ConfigKey("transaction.state.log.replication.factor", "int", 3, at_least(1),
              "Replication factor of __transaction_state (capped by the brokers available)."),
    ConfigKey("transaction.max.timeout.ms", "int", 900000, at_least(1),
              "The longest transaction.timeout.ms a producer may ask for."),
    ConfigKey("transaction.abort.timed.out.transaction.cleanup.interval.ms", "int", 10000,
              at_least(1), "How often the coordinator aborts transactions past their timeout."),
    ConfigKey("transactional.id.expiration.ms", "int", 604800000, at_least(1),
              "How long a transactional id with no transaction open is kept without any request."),
    ConfigKey("transaction.remove.expired.transaction.cleanup.interval.ms", "int", 3600000,
              at_least(1), "How often the coordinator removes expired transactional ids."),
]

# ---- broker-wide defaults of the topic configs (Kafka's ServerTopicConfigSynonyms) ----
# For historical reasons a topic config's broker-wide default has another name (segment.bytes is
# log.segment.bytes in server.properties). Some have several, highest priority first: the first
# one set wins (log.retention.ms over log.retention.minutes over log.retention.hours). A name with
# a unit is in that unit and converted to the topic config's milliseconds.
HOUR_MS, MINUTE_MS = 3_600_000, 60_000
_UNITS = {HOUR_MS: "hours", MINUTE_MS: "minutes"}
TOPIC_CONFIG_SYNONYMS: dict[str, tuple[tuple[str, int], ...]] = {
    topic: tuple(s if isinstance(s, tuple) else (s, 1) for s in synonyms)
    for topic, synonyms in {
        "segment.bytes": ("log.segment.bytes",),
        "segment.ms": ("log.roll.ms", ("log.roll.hours", HOUR_MS)),
        "segment.jitter.ms": ("log.roll.jitter.ms", ("log.roll.jitter.hours", HOUR_MS)),
        "segment.index.bytes": ("log.index.size.max.bytes",),
        "index.interval.bytes": ("log.index.interval.bytes",),
        "flush.messages": ("log.flush.interval.messages",),
        "flush.ms": ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
        "retention.ms": ("log.retention.ms", ("log.retention.minutes", MINUTE_MS),
                         ("log.retention.hours", HOUR_MS)),
        "retention.bytes": ("log.retention.bytes",),
        "file.delete.delay.ms": ("log.segment.delete.delay.ms",),
        "max.message.bytes": ("message.max.bytes",),
        "message.timestamp.type": ("log.message.timestamp.type",),
        "message.timestamp.before.max.ms": ("log.message.timestamp.before.max.ms",),
        "message.timestamp.after.max.ms": ("log.message.timestamp.after.max.ms",),
        "preallocate": ("log.preallocate",),
        "cleanup.policy": ("log.cleanup.policy",),
        "compression.type": ("compression.type",),
        "delete.retention.ms": ("log.cleaner.delete.retention.ms",),
        "min.cleanable.dirty.ratio": ("log.cleaner.min.cleanable.ratio",),
        "min.compaction.lag.ms": ("log.cleaner.min.compaction.lag.ms",),
        "max.compaction.lag.ms": ("log.cleaner.max.compaction.lag.ms",),
        "min.insync.replicas": ("min.insync.replicas",),
        "unclean.leader.election.enable": ("unclean.leader.election.enable",),
        "message.downconversion.enable": ("log.message.downconversion.enable",),   # Kafka 3.x
    }.items()}
SYNONYM_GROUP = {name: TOPIC_CONFIG_SYNONYMS[topic]
                 for topic, synonyms in TOPIC_CONFIG_SYNONYMS.items() for name, _ in synonyms}


def server_default_name(topic_config: str) -> str:
    """The broker config that sets `topic_config` for every topic (Kafka's serverSynonym)."""
    return TOPIC_CONFIG_SYNONYMS[topic_config][0][0]


def _in_topic_units(topic: str, unit_ms: int, value: Any) -> Any:
    if topic == "retention.ms" and value < 0:
        return -1   # any negative broker retention keeps forever (KafkaConfig.logRetentionTimeMillis)
    return value * unit_ms if unit_ms != 1 else value


def _synonym_key(topic: str, name: str, unit_ms: int, last: bool) -> ConfigKey:
    """`name` checked by the topic config's own validator, on the value converted to its units.
    Only the last synonym has a default (the others default to unset, as Kafka's null), so an unset
    log.retention.ms leaves the word to log.retention.hours."""
    key = KEYS[topic]
    check = key.validator
    validator = None if check is None else (
        lambda v: check(_in_topic_units(topic, unit_ms, v)))
    default = (key.default if unit_ms == 1 else key.default // unit_ms) if last else None
    unit = f", in {_UNITS[unit_ms]}" if unit_ms != 1 else ""
    return ConfigKey(name, key.type if unit_ms == 1 else "int", default, validator,
                     f"The default {topic} of every topic without its own{unit}.")


_BROKER_KEYS += [_synonym_key(topic, name, unit, i == len(synonyms) - 1)
                 for topic, synonyms in TOPIC_CONFIG_SYNONYMS.items()
                 for i, (name, unit) in enumerate(synonyms)]
BROKER_KEYS: dict[str, ConfigKey] = {k.name: k for k in _BROKER_KEYS}


class BrokerConfig(_Config):
    """Broker-wide settings (Kafka's KafkaConfig / ServerLogConfigs), among them the broker-wide
    defaults of the topic configs under their broker names (`log.segment.bytes`, ...)."""

    _keys = BROKER_KEYS
    _unknown = "Unknown broker config name"

    def topic_defaults(self) -> dict[str, Any]:
        """The topic configs this broker's settings give every topic, in the topic configs' names
        and units: per topic config the first of its broker synonyms that was set
        (KafkaConfig.extractLogConfigMap)."""
        out = {}
        for topic in TOPIC_CONFIG_SYNONYMS:
            given = self._first_synonym_set(topic)
            if given:
                name, unit = given
                out[topic] = _in_topic_units(topic, unit, self._overrides[name])
        return out

    def _first_synonym_set(self, topic: str) -> tuple[str, int] | None:
        return next(((n, u) for n, u in TOPIC_CONFIG_SYNONYMS[topic] if n in self._overrides), None)

    def with_topic_defaults(self, topic_defaults: LogConfig | Mapping[str, Any] | None) -> BrokerConfig:
        """This config with topic defaults given under the topic configs' names (kstore's Python
        API, `Broker(topic_defaults=...)`) set as their highest-priority broker synonyms."""
        given = (topic_defaults.overrides if isinstance(topic_defaults, LogConfig)
                 else dict(topic_defaults or {}))
        if not given:
            return self
        LogConfig(given)   # their errors name the topic configs the caller used
        return self.with_overrides({server_default_name(t): v for t, v in given.items()})

    def log_config(self) -> LogConfig:
        """The topic defaults as a LogConfig: what a topic without overrides of its own gets."""
        return LogConfig(self.topic_defaults())

    def _check_consistency(self) -> None:
        values = {**{k.name: k.default for k in KEYS.values()}, **self.topic_defaults()}
        check_log_values(values.__getitem__, self._given_synonym)

    def _given_synonym(self, topic: str) -> str:
        given = self._first_synonym_set(topic)
        return given[0] if given else server_default_name(topic)


def describe() -> list[dict]:
    """Every config with its type, default, meaning and broker-wide default's name (the "Server
    Default Property" of Kafka's topic config table), for the course's tables."""
    return [{"name": k.name, "type": k.type, "default": k.default, "doc": k.doc,
             "server_default": server_default_name(k.name)} for k in _KEYS]


# ---- DescribeConfigs: every value with where it came from (Kafka's ConfigEntry) ----

@dataclass(frozen=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: str


@dataclass(frozen=True)
class ConfigEntry:
    name: str
    value: str | None          # as Kafka prints it: "true", "delete,compact", "604800000"; None: unset
    source: str                # DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG or DEFAULT_CONFIG
    type: str                  # the ConfigKey type
    doc: str
    synonyms: tuple[ConfigSynonym, ...] = ()   # where the value could come from, the one used first


def format_value(value: Any) -> str | None:
    """A config value the way Kafka's ConfigDef writes it back (ConfigDef.convertToString)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _broker_synonyms(name: str, broker: BrokerConfig) -> list[ConfigSynonym]:
    """Kafka's ConfigHelper.configSynonyms for broker config `name`: each name of its synonym group
    that server.properties (here: the overrides) sets, then each one's default where it has one;
    the list then starts at `name` itself. So the topic config retention.ms set broker-wide only by
    log.retention.hours reports no synonyms and source DEFAULT_CONFIG, exactly as Kafka does."""
    group = [n for n, _ in SYNONYM_GROUP.get(name, ((name, 1),))]
    chain = [ConfigSynonym(n, format_value(broker[n]), "STATIC_BROKER_CONFIG")
             for n in group if n in broker.overrides]
    chain += [ConfigSynonym(n, format_value(BROKER_KEYS[n].default), "DEFAULT_CONFIG")
              for n in group if BROKER_KEYS[n].default is not None]
    while chain and chain[0].name != name:
        chain.pop(0)
    return chain


def _entry(key: ConfigKey, value: Any, synonyms: list[ConfigSynonym]) -> ConfigEntry:
    source = synonyms[0].source if synonyms else "DEFAULT_CONFIG"
    return ConfigEntry(key.name, format_value(value), source, key.type, key.doc, tuple(synonyms))


def topic_config_entries(config: LogConfig, topic_overrides: Mapping[str, Any],
                         broker: BrokerConfig) -> list[ConfigEntry]:
    """Every topic config with its effective value (`config`): DYNAMIC_TOPIC_CONFIG when the topic
    sets it, then the broker-wide default under its broker name (ConfigHelper.createTopicConfigEntry)."""
    out = []
    for key in KEYS.values():
        own = ([ConfigSynonym(key.name, format_value(config[key.name]), "DYNAMIC_TOPIC_CONFIG")]
               if key.name in topic_overrides else [])
        out.append(_entry(key, config[key.name],
                          own + _broker_synonyms(server_default_name(key.name), broker)))
    return out


def broker_config_entries(broker: BrokerConfig) -> list[ConfigEntry]:
    """Every broker config with its value (None where unset without a default, like log.retention.ms)."""
    return [_entry(key, broker[key.name], _broker_synonyms(key.name, broker))
            for key in BROKER_KEYS.values()]

"""A broker: topics and partitions on one log directory, with the data path clients use.

Mirrors the single-broker part of Kafka's `KafkaApis` + `ReplicaManager` + controller:
* topics are created with a partition count and a replication factor (replicas are assigned to
  brokers; with one broker the replication factor can only be 1), with per-topic configs that
  override the broker defaults, and auto-created on first produce with `num.partitions`;
* the partition count can grow but never shrink;
* each partition directory gets `partition.metadata` (the topic id) before any data;
* produce / fetch / list-offsets work per partition, returning what Kafka's responses carry
  (base offset, high watermark, log start offset, ...); consumers read below the high watermark;
* committed offsets go through the group coordinator to `__consumer_offsets`.
Cluster metadata is kept in the ZooKeeper-era layout (`metadata.MetadataStore`).
"""

from __future__ import annotations

import fcntl
import os
import threading
from dataclasses import dataclass, field

from .clock import SYSTEM, Clock
from .config import BrokerConfig, LogConfig
from .errors import (LogError, InvalidPartitionsError, InvalidReplicationFactorError, InvalidRequestError,
                     InvalidRequiredAcksError, PolicyViolationError, TopicExistsError,
                     UnknownTopicOrPartitionError)
from .events import EventBus
from .log import Isolation, Log, LogAppendInfo
from .log_manager import LogManager
from .metadata import METADATA_FILE, MetadataStore, new_uuid_string
from .metadata_image import (CLUSTER_METADATA_DIR, PARTITION_METADATA, import_kraft_metadata,
                             is_kraft_log_dir, read_properties)
from .segment import FetchDataInfo, TimestampAndOffset
from .topic import validate_topic_name

INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")


@dataclass(frozen=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int
    replicas: list[int]
    isr: list[int]
    leader_epoch: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int


@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: str
    partitions: list[PartitionInfo]
    configs: dict
    internal: bool = False

    @property
    def partition_count(self) -> int:
        return len(self.partitions)

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0].replicas) if self.partitions else 0


@dataclass(frozen=True)
class FetchResult:
    """One partition's share of a fetch (FetchResponse.PartitionData)."""
    topic: str
    partition: int
    data: FetchDataInfo
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    # read_committed: (producer id, first offset) of the aborted transactions the data overlaps
    aborted_transactions: tuple = ()


# kstore differs: Kafka sets no per-topic limit. Each partition is a directory with open files,
# and a request for 2^31 of them (a typo, a fuzzer) must get an error, not stall the broker.
MAX_PARTITIONS_PER_TOPIC = 10_000


def _check_partition_limit(count: int) -> None:
    if count > MAX_PARTITIONS_PER_TOPIC:
        raise InvalidPartitionsError(f"kstore allows at most {MAX_PARTITIONS_PER_TOPIC} partitions "
                                     f"per topic, not {count}")


def _broker_id_from(log_dir: str) -> int:
    """The node id a log dir was written by (`meta.properties`), 0 for a new kstore dir.

    Guessing 0 for a damaged file, or for a KRaft dir whose file is gone, would serve its
    partitions as another node's (hosted by nobody) under a new cluster id; Kafka refuses to
    start on such a directory, and so does kstore."""
    path = os.path.join(log_dir, "meta.properties")
    if not os.path.exists(path):
        if is_kraft_log_dir(log_dir):
            raise LogError(f"{path} is missing, but {log_dir} holds a KRaft metadata log "
                           f"({CLUSTER_METADATA_DIR}): without it the node id is unknown")
        return 0
    try:
        props = read_properties(path)
    except (OSError, UnicodeDecodeError) as e:
        raise LogError(f"{path} cannot be read: {e}") from None
    value = props.get("node.id", props.get("broker.id"))
    if value is None or not value.strip().isdigit():
        raise LogError(f"{path} has no valid node.id or broker.id (found {value!r}); it is not a "
                       f"meta.properties file Kafka or kstore wrote")
    return int(value)


def _check_cluster_id(log_dir: str, known: str | None) -> None:
    """Kafka refuses a log dir whose meta.properties names another cluster than the one it
    joins (InconsistentClusterIdException); kstore, whose cluster is its metadata file, refuses
    the same mismatch, and a meta.properties whose cluster has no metadata file: starting a new
    cluster there would hide every topic of the directory."""
    path = os.path.join(log_dir, "meta.properties")
    stored = read_properties(path).get("cluster.id") if os.path.exists(path) else None
    if not stored or stored == known:
        return
    if known is None:
        raise LogError(f"{path} says the directory belongs to cluster {stored}, but "
                       f"{os.path.join(log_dir, METADATA_FILE)}, which holds its topics, is "
                       f"missing (lost, or written by a Kafka broker in ZooKeeper mode)")
    raise LogError(f"the cluster id {known} in {METADATA_FILE} does not match the cluster id "
                   f"{stored} stored in {path}")


def normalize_acks(acks) -> int:
    """0, 1 and −1 ('all') are the only legal values (INVALID_REQUIRED_ACKS otherwise); like
    Kafka's producer config, the strings "0", "1", "-1" and "all" are accepted too."""
    value = acks
    if isinstance(acks, str):
        value = {"all": -1, "-1": -1, "0": 0, "1": 1}.get(acks, acks)   # case-sensitive, as Kafka
    if isinstance(value, bool) or not isinstance(value, int) or value not in (0, 1, -1):
        raise InvalidRequiredAcksError(f"invalid required acks {acks!r}: must be 0, 1 or -1 (all)")
    return value


class Broker:
    def __init__(self, log_dir: str, *, broker_id: int | None = None,
                 config: BrokerConfig | dict | None = None,
                 topic_defaults: LogConfig | dict | None = None, clock: Clock | None = None,
                 host: str = "127.0.0.1", port: int = 9092, events: EventBus | None = None,
                 metadata: MetadataStore | None = None, transport=None,
                 truncation_mode: str = "leader_epoch", read_only: bool = False):
        """A broker on `log_dir`. Alone (the default) it is its own controller and keeps the
        metadata in its log dir; in a cluster, the cluster passes the shared `metadata`, a
        `transport` to reach the other brokers, and sets `controller` itself.

        `broker_id` defaults to the id in the directory's `meta.properties` (`node.id` of a KRaft
        broker, `broker.id` of kstore), else 0. A directory written by a real KRaft broker is
        served with its topics, topic ids and cluster id (read from `__cluster_metadata-0`).
        `read_only` (the offline read-only tools) changes nothing in the directory: metadata is
        kept in memory, no file is created, written, trimmed or removed."""
        self.read_only = read_only
        if os.path.exists(log_dir) and not os.path.isdir(log_dir):
            raise LogError(f"log directory {log_dir} is not a directory")
        if read_only and not os.path.isdir(log_dir):
            raise LogError(f"log directory {log_dir} does not exist")
        self.broker_id = _broker_id_from(log_dir) if broker_id is None else broker_id
        broker_id = self.broker_id
        self.clock = clock or SYSTEM
        self.config = (config if isinstance(config, BrokerConfig)
                       else BrokerConfig(config or {})).with_topic_defaults(topic_defaults)
        self.events = events or EventBus()
        if not read_only:
            os.makedirs(log_dir, exist_ok=True)
        self.log_dir = os.path.abspath(log_dir)
        self._lock_fd = self._lock_dir()
        try:
            self._start(broker_id, host, port, metadata, transport, truncation_mode)
        except BaseException:
            # A refused start must not leave the directory locked: in a notebook the process,
            # and with it the lock, lives on, and every retry would find the directory "in use".
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise

    def _start(self, broker_id: int, host: str, port: int, metadata, transport,
               truncation_mode: str) -> None:
        """Everything after taking the directory's lock: metadata, logs, replication, controller."""
        read_only = self.read_only
        standalone = metadata is None
        self.metadata = metadata or MetadataStore(os.path.join(self.log_dir, METADATA_FILE),
                                                  persist=not read_only)
        if standalone:
            import_kraft_metadata(self.metadata, self.log_dir)
            _check_cluster_id(self.log_dir, self.metadata.cluster_id)
        self.cluster_id = self.metadata.ensure_cluster(broker_id, host, port, self.clock.milliseconds())
        if not read_only:
            self._write_meta_properties()
        self.logs = LogManager(self.log_dir, None, self.clock, events=self.events,
                               broker_config=self.config, single_replica=False,
                               topic_configs={t: self.metadata.topic_config(t)
                                              for t in self.metadata.topics()},
                               read_only=read_only)
        self.logs.load_logs()
        self._lock = threading.RLock()
        self._coordinator = None
        self._txn_coordinator = None
        self.alive = True
        from .replica_manager import ReplicaManager
        self.replica_manager = ReplicaManager(self, transport or _LocalTransport({broker_id: self}),
                                              truncation_mode)
        self.controller = None
        if standalone:   # a cluster of one: its own controller, leader of everything it hosts
            from .controller import Controller
            self.controller = Controller(self.metadata, {broker_id: self}, self.clock)
            self.controller.on_broker_startup(broker_id)

    # ------------------------------------------------------------------ set-up
    LOCK_FILE = ".lock"

    def _lock_dir(self) -> int:
        """Kafka locks each log dir (`.lock`) so two brokers never share one; so does kstore, and
        its offline CLI tools take the same lock. A killed process releases it. Read-only tools
        take it shared, on the existing file (or the directory itself), creating nothing."""
        path = os.path.join(self.log_dir, self.LOCK_FILE)
        if self.read_only:
            fd = os.open(path if os.path.exists(path) else self.log_dir, os.O_RDONLY)
            mode = fcntl.LOCK_SH
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            mode = fcntl.LOCK_EX
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogError(f"log directory {self.log_dir} is in use by another broker or tool "
                           f"(it holds {self.LOCK_FILE}); stop it first") from None
        return fd

    def _write_meta_properties(self) -> None:
        path = os.path.join(self.log_dir, "meta.properties")
        if not os.path.exists(path):
            from .checkpoint import atomic_write
            atomic_write(path, f"#\n#written by kstore\nbroker.id={self.broker_id}\n"
                               f"cluster.id={self.cluster_id}\nversion=0\n")

    @property
    def group_coordinator(self):
        if self._coordinator is None:
            from .group_coordinator import GroupCoordinator
            self._coordinator = GroupCoordinator(self)
        return self._coordinator

    @property
    def transaction_coordinator(self):
        if self._txn_coordinator is None:
            from .transaction_coordinator import TransactionCoordinator
            self._txn_coordinator = TransactionCoordinator(self)
        return self._txn_coordinator

    # ------------------------------------------------------------------ topics
    def create_topic(self, name: str, num_partitions: int | None = None,
                     replication_factor: int = 1, configs: dict | None = None, *,
                     validate_only: bool = False) -> TopicInfo | None:
        """Create a topic (CreateTopics). Everything is validated before anything is written;
        `validate_only` stops there (CreateTopics' validateOnly) and returns None."""
        validate_topic_name(name)
        num_partitions = self.config["num.partitions"] if num_partitions is None else num_partitions
        if not isinstance(num_partitions, int) or num_partitions < 1:
            raise InvalidPartitionsError(f"number of partitions must be at least 1, got {num_partitions!r}")
        _check_partition_limit(num_partitions)
        brokers = [int(b) for b in self.metadata.children("/brokers/ids")]
        if not isinstance(replication_factor, int) or replication_factor < 1:
            raise InvalidReplicationFactorError(
                f"replication factor must be at least 1, got {replication_factor!r}")
        if replication_factor > len(brokers):
            raise InvalidReplicationFactorError(
                f"replication factor: {replication_factor} larger than available brokers: "
                f"{len(brokers)}")
        overrides = dict(configs or {})
        LogConfig(overrides)   # validated before anything is written
        with self._lock:
            if self.metadata.topic(name) is not None:
                raise TopicExistsError(f"topic '{name}' already exists")
            if name not in INTERNAL_TOPICS:   # the broker's own topics are always allowed
                self._check_hosted_partitions(num_partitions)
            collisions = [t for t in self.metadata.topics()
                          if t.replace(".", "_") == name.replace(".", "_")]
            if collisions:
                raise TopicExistsError(f"topic '{name}' collides with existing topic "
                                       f"'{collisions[0]}' ('.' and '_' collide in metric names)")
            if validate_only:
                return None
            topic_id = new_uuid_string()
            assignment = {str(p): self._assign_replicas(p, replication_factor, brokers)
                          for p in range(num_partitions)}
            nodes = {f"/brokers/topics/{name}": {"version": 3, "topic_id": topic_id,
                                                 "partitions": assignment,
                                                 "adding_replicas": {}, "removing_replicas": {}},
                     f"/config/topics/{name}": {"version": 1, "config": overrides}}
            for p, replicas in assignment.items():
                nodes[f"/brokers/topics/{name}/partitions/{p}/state"] = self._initial_state(replicas)
            self.metadata.set_many(nodes)
            self.logs.topic_configs[name] = overrides
            for p in range(num_partitions):
                self._announce_partition(name, p)
            self.events.emit("topic_created", self.log_dir, topic=name, partitions=num_partitions)
            return self.describe_topic(name)

    def hosted_partition_count(self) -> int:
        """Partitions with a replica on this broker (each costs open files and an entry in
        every checkpoint)."""
        return sum(1 for t in self.metadata.topics()
                   for replicas in (self.metadata.topic(t) or {}).get("partitions", {}).values()
                   if self.broker_id in replicas)

    def _check_hosted_partitions(self, adding: int) -> None:
        """kstore's own bound (max.broker.partitions): refuse before anything is written, so a
        request for thousands of partitions cannot exhaust the broker's file descriptors."""
        limit = self.config["max.broker.partitions"]
        hosted = self.hosted_partition_count()
        if hosted + adding > limit:
            raise PolicyViolationError(
                f"this broker would host {hosted + adding} partitions ({hosted} now + {adding} "
                f"requested), above max.broker.partitions={limit} (kstore's own limit: each "
                f"partition holds open files)")

    def _assign_replicas(self, partition: int, replication_factor: int, brokers: list[int]) -> list[int]:
        brokers = sorted(brokers)
        start = partition % len(brokers)
        return [brokers[(start + i) % len(brokers)] for i in range(replication_factor)]

    def _initial_state(self, replicas: list[int]) -> dict:
        return {"controller_epoch": self.metadata.controller_epoch, "leader": replicas[0],
                "version": 1, "leader_epoch": 0, "isr": list(replicas)}

    def _announce_partition(self, topic: str, partition: int) -> None:
        """The controller tells the replicas of a new partition who leads it (LeaderAndIsr)."""
        self.controller._push(topic, partition)

    def open_partition_log(self, topic: str, partition: int) -> Log:
        """The log of a partition this broker hosts, created with its `partition.metadata`."""
        node = self._topic_node(topic)
        self.logs.topic_configs.setdefault(topic, self.metadata.topic_config(topic))
        return self._create_partition(topic, partition, node["topic_id"])

    def _create_partition(self, topic: str, partition: int, topic_id: str) -> Log:
        log = self.logs.get_or_create_log(topic, partition)
        path = os.path.join(log.dir, PARTITION_METADATA)
        if not os.path.exists(path) and not self.read_only:   # before any data (PartitionMetadataFile)
            from .checkpoint import atomic_write
            atomic_write(path, f"version: 0\ntopic_id: {topic_id}")
        return log

    def create_partitions(self, name: str, new_total: int, *,
                          validate_only: bool = False) -> TopicInfo | None:
        """Grow a topic to `new_total` partitions (CreatePartitions); shrinking is refused.
        `validate_only` checks and returns None without growing anything."""
        with self._lock:
            node = self._topic_node(name)
            current = len(node["partitions"])
            if not isinstance(new_total, int) or new_total <= current:
                raise InvalidPartitionsError(
                    f"topic currently has {current} partitions, {new_total} would not be an "
                    f"increase (the partition count can grow but never shrink)")
            _check_partition_limit(new_total)
            self._check_hosted_partitions(new_total - current)
            if validate_only:
                return None
            brokers = [int(b) for b in self.metadata.children("/brokers/ids")]
            rf = len(next(iter(node["partitions"].values())))
            updates = {}
            for p in range(current, new_total):
                replicas = self._assign_replicas(p, rf, brokers)
                node["partitions"][str(p)] = replicas
                updates[f"/brokers/topics/{name}/partitions/{p}/state"] = self._initial_state(replicas)
            updates[f"/brokers/topics/{name}"] = node
            self.metadata.set_many(updates)
            for p in range(current, new_total):
                self._announce_partition(name, p)
            return self.describe_topic(name)

    def alter_topic_config(self, name: str, configs: dict) -> TopicInfo:
        """Set per-topic overrides (IncrementalAlterConfigs SET); applies to the open logs."""
        with self._lock:
            self._topic_node(name)
            return self.replace_topic_config(name, {**self.metadata.topic_config(name), **configs})

    def replace_topic_config(self, name: str, overrides: dict, *,
                             validate_only: bool = False) -> TopicInfo | None:
        """Make `overrides` the topic's whole set of overrides (AlterConfigs; a config left out
        goes back to the broker default); validated first, applied to the open logs."""
        with self._lock:
            self._topic_node(name)
            merged = dict(overrides)
            self.logs.default_config.with_overrides(merged)   # validates
            if validate_only:
                return None
            self.metadata.set(f"/config/topics/{name}", {"version": 1, "config": merged})
            self.apply_topic_config(name, merged)
            return self.describe_topic(name)

    def apply_topic_config(self, name: str, overrides: dict) -> None:
        """Give this broker's open logs of a topic its (already validated) overrides: after an
        alteration here, or one another broker of the cluster wrote to the shared metadata."""
        with self._lock:
            new_config = self.logs.default_config.with_overrides(overrides)
            self.logs.topic_configs[name] = dict(overrides)
            for (t, p), log in self.logs.logs().items():
                if t == name:
                    log.config = new_config
                    part = self.replica_manager.partitions.get((t, p))
                    if part is not None:
                        part.min_insync_replicas = new_config.min_insync_replicas

    def delete_topic(self, name: str) -> None:
        """Delete a topic (DeleteTopics): its metadata and configs, every partition's log
        directory, and the groups' committed offsets for it. Kafka's internal topics are refused;
        so is a broker of a multi-broker cluster (kstore deletes topics on a single broker: the
        other brokers would keep their replicas)."""
        with self._lock:
            node = self._topic_node(name)
            if name in INTERNAL_TOPICS:
                raise InvalidRequestError(f"the internal topic {name} can not be deleted")
            if self.controller is None or len(self.metadata.children("/brokers/ids")) > 1:
                raise InvalidRequestError("kstore deletes topics on a single broker only, not in a "
                                          "cluster of several brokers")
            self.metadata.delete(f"/brokers/topics/{name}")
            self.metadata.delete(f"/config/topics/{name}")
            self.logs.topic_configs.pop(name, None)
            for p in sorted(int(k) for k in node["partitions"]):
                self.replica_manager.partitions.pop((name, p), None)
                self.logs.async_delete(name, p)
            self.replica_manager.checkpoint_high_watermarks()
            self.replica_manager.check_purgatory()   # waiting produces end (not leader any more)
            if self._coordinator is not None:
                self._coordinator.remove_offsets_of(name)
            self.events.emit("topic_deleted", self.log_dir, topic=name)

    def _topic_node(self, name: str) -> dict:
        node = self.metadata.topic(name)
        if node is None:
            raise UnknownTopicOrPartitionError(f"topic '{name}' does not exist")
        return node

    def topics(self, include_internal: bool = False) -> list[str]:
        return [t for t in self.metadata.topics() if include_internal or t not in INTERNAL_TOPICS]

    def partition_count(self, topic: str) -> int:
        return len(self._topic_node(topic)["partitions"])

    def describe_topic(self, name: str) -> TopicInfo:
        node = self._topic_node(name)
        parts = []
        for p in sorted(int(k) for k in node["partitions"]):
            state = self.metadata.partition_state(name, p) or {}
            log = self.logs.get_log(name, p)
            parts.append(PartitionInfo(
                name, p, state.get("leader", -1), node["partitions"][str(p)], state.get("isr", []),
                state.get("leader_epoch", 0), log.log_start_offset if log else 0,
                log.log_end_offset if log else 0, log.high_watermark if log else 0))
        return TopicInfo(name, node["topic_id"], parts, self.metadata.topic_config(name),
                         name in INTERNAL_TOPICS)

    def ensure_topic(self, topic: str) -> None:
        """Auto-create on first use when auto.create.topics.enable (with num.partitions)."""
        if self.metadata.topic(topic) is None:
            if not self.config["auto.create.topics.enable"] or topic in INTERNAL_TOPICS:
                raise UnknownTopicOrPartitionError(
                    f"topic '{topic}' does not exist and auto.create.topics.enable is false"
                    if not self.config["auto.create.topics.enable"] else
                    f"topic '{topic}' does not exist")
            try:
                live = len(self.metadata.children("/brokers/ids"))
                self.create_topic(topic, replication_factor=min(
                    self.config["default.replication.factor"], max(live, 1)))
            except TopicExistsError:
                pass   # created meanwhile by another producer

    def get_log(self, topic: str, partition: int) -> Log:
        node = self.metadata.topic(topic)
        if node is None or str(partition) not in node["partitions"]:
            raise UnknownTopicOrPartitionError(
                f"this server does not host this topic-partition: {topic}-{partition}")
        log = self.logs.get_log(topic, partition)
        if log is None:
            raise UnknownTopicOrPartitionError(
                f"broker {self.broker_id} holds no replica of {topic}-{partition}")
        return log

    def leader_log(self, topic: str, partition: int) -> Log:
        """The log of a partition this broker leads (NOT_LEADER_OR_FOLLOWER otherwise)."""
        self.get_log(topic, partition)
        p = self.replica_manager.partition(topic, partition)
        if not p.is_leader:
            from .errors import NotLeaderOrFollowerError
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} is not the leader of {topic}-{partition} (leader: {p.leader_id})")
        return p.log

    # ------------------------------------------------------------------ replication
    def become_leader_or_follower(self, topic: str, partition: int, leader: int, leader_epoch: int,
                                  isr: list[int], replicas: list[int]):
        return self.replica_manager.become_leader_or_follower(topic, partition, leader, leader_epoch,
                                                              isr, replicas)

    def alter_partition_isr(self, topic: str, partition: int, leader_epoch: int, isr: list[int]) -> bool:
        return self.controller.alter_partition(topic, partition, leader_epoch, isr) \
            if self.controller is not None else False

    # ------------------------------------------------------------------ data path
    def produce_request(self, topic: str, partition: int, records: bytes, acks=-1,
                        timeout_ms: int = 30000):
        """Produce with Kafka's acks semantics; returns a ProduceResult that is `done` at once for
        acks 0/1 and for acks=all once the ISR has the records (or on error/timeout)."""
        acks = normalize_acks(acks)
        self.get_log(topic, partition)
        return self.replica_manager.append_records(topic, partition, records, acks, timeout_ms)

    def produce(self, topic: str, partition: int, records: bytes, acks=-1) -> LogAppendInfo:
        """Append a producer's batches to a partition leader (ProduceRequest for one partition).
        Raises the request's error. In a cluster with acks=all the records may still be waiting
        for the ISR when this returns; `produce_request` tells when they are committed."""
        result = self.produce_request(topic, partition, records, acks)
        if result.error is not None:
            raise result.error
        return result.info

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1048576,
              isolation: str = Isolation.HIGH_WATERMARK) -> FetchResult:
        """Read from the leader for a consumer: up to the high watermark."""
        log = self.leader_log(topic, partition)
        data = log.read(offset, max_bytes, isolation)
        if isolation != Isolation.TXN_COMMITTED:
            return FetchResult(topic, partition, data, log.high_watermark, log.high_watermark,
                               log.log_start_offset)
        lso = log.last_stable_offset
        aborted = tuple((t.producer_id, t.first_offset)
                        for t in log.collect_aborted_transactions(offset, lso))
        return FetchResult(topic, partition, data, log.high_watermark, lso, log.log_start_offset,
                           aborted)

    def list_offsets(self, topic: str, partition: int, timestamp: int,
                     read_committed: bool = False) -> TimestampAndOffset:
        """ListOffsets for a client: −2 earliest, −1 latest (= the HW, or the LSO for a
        read_committed client), −3 max timestamp, or a timestamp (offset −1 when no record at or
        after it is below that bound)."""
        log = self.leader_log(topic, partition)
        hw = log.last_stable_offset if read_committed else log.high_watermark
        if timestamp == -1:
            return TimestampAndOffset(-1, hw, log.leader_epoch_cache.latest_epoch())
        found = log.fetch_offset_by_timestamp(timestamp)
        if found is None or (timestamp != -2 and found.offset >= hw):
            return TimestampAndOffset(-1, -1, None)
        return found

    # ------------------------------------------------------------------ producers
    PRODUCER_ID_BLOCK_SIZE = 1000   # ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE

    def allocate_producer_id(self) -> int:
        """A new producer id for an idempotent producer (InitProducerId). As Kafka's
        ZkProducerIdManager does, each broker claims a block of 1000 ids at a time in the shared
        metadata (`/latest_producer_id_block`, under the store's lock) and hands them out one by
        one: ids are unique across the cluster and never reused after a restart (the rest of a
        claimed block is skipped)."""
        with self._lock:
            block = getattr(self, "_producer_ids", None)
            if block is None or block[0] > block[1]:
                with self.metadata.transaction():
                    latest = self.metadata.get("/latest_producer_id_block") or {}
                    start = int(latest.get("block_end", -1)) + 1
                    end = start + self.PRODUCER_ID_BLOCK_SIZE - 1
                    self.metadata.set("/latest_producer_id_block", {
                        "version": 1, "broker": self.broker_id, "block_start": str(start),
                        "block_end": str(end)})
                block = [start, end]
                self._producer_ids = block
            block[0] += 1
            return block[0] - 1

    # ------------------------------------------------------------------ lifecycle
    def shutdown(self) -> None:
        if self._lock_fd < 0:
            return
        if self._coordinator is not None and not self.read_only:
            self._coordinator.shutdown()
        if not self.read_only:
            self.replica_manager.checkpoint_high_watermarks()
        self.replica_manager.shutdown()
        self.logs.shutdown()
        self._release()

    def crash(self, lose_unflushed: bool = False) -> None:
        """Die without a clean shutdown (kill -9), or with a power loss (`lose_unflushed`)."""
        if self._lock_fd < 0:
            return
        self.alive = False
        self.replica_manager.shutdown()
        self.logs.crash(lose_unflushed)
        self._release()

    def _release(self) -> None:
        self.alive = False
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)
        self._lock_fd = -1

    close = shutdown

    def __enter__(self) -> "Broker":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"Broker(id={self.broker_id}, log_dir={self.log_dir!r}, topics={self.topics(True)})"


class _LocalTransport:
    """How a broker reaches other brokers' replica managers in-process (the network broker has
    its own transport over sockets)."""

    def __init__(self, brokers: dict):
        self.brokers = brokers

    def leader_replica_manager(self, broker_id: int):
        broker = self.brokers.get(broker_id)
        if broker is None or not broker.alive:
            from .errors import BrokerNotAvailableError
            raise BrokerNotAvailableError(f"broker {broker_id} is not available")
        return broker.replica_manager

"""Committed offsets: the group coordinator and the `__consumer_offsets` topic.

Mirrors the offset part of Kafka's group coordinator (`GroupCoordinatorService`,
`OffsetMetadataManager`, `CoordinatorRecordHelpers`):
* `__consumer_offsets` is an ordinary compacted topic with `offsets.topic.num.partitions` (50)
  partitions; a group's commits go to partition `abs(hashCode(group)) % 50`;
* a commit appends one batch with an OffsetCommitKey/OffsetCommitValue record per partition, then
  updates an in-memory cache that answers OffsetFetch;
* on startup the cache is rebuilt by replaying every partition of the topic (the latest value per
  key wins; a null value is a tombstone), so a restart loses no committed offset;
* offsets expire after `offsets.retention.minutes`: expiry writes tombstones, and compaction then
  keeps the topic small (one record per group/topic/partition, plus what is not yet compacted).
Group membership (JoinGroup/SyncGroup/Heartbeat/LeaveGroup) is `kstore.group_membership`; this
class owns what is written: a group's GroupMetadata record goes to the same partition as its
offsets, and replaying the partition restores the groups, their generation and assignments.
Offsets of a group with members never expire; those of a group whose members all left count from
the time it became Empty, and a simple (assign-only) group's from their commit time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from .coordinator_records import (GroupMemberValue, GroupMetadataKey, GroupMetadataValue,
                                  OffsetCommitKey, OffsetCommitValue, decode_group_metadata_value,
                                  decode_key, decode_offset_commit_value, partition_for)
from .group_membership import GroupMembership
from .group_metadata import EMPTY, STABLE, GroupMetadata, MemberMetadata
from .errors import (CommitFailedError, InvalidCommitOffsetError, InvalidGroupIdError,
                     KStoreError, NotCoordinatorError, OffsetMetadataTooLargeError,
                     UnknownTopicOrPartitionError)
from .records import ControlRecordType, Record, build_batch

OFFSETS_TOPIC = "__consumer_offsets"


@dataclass(frozen=True)
class OffsetAndMetadata:
    offset: int
    metadata: str = ""
    leader_epoch: int = -1
    commit_timestamp: int = -1
    expire_timestamp: int | None = None


def java_length(s: str) -> int:
    """Java's String.length(): UTF-16 code units (what Kafka compares with
    offset.metadata.max.bytes, despite the name)."""
    return len(s.encode("utf-16-le")) // 2


@dataclass(frozen=True)
class PreparedCommit:
    group_id: str
    partition: int
    batch: bytes
    stored: dict
    producer_id: int = -1       # ≥ 0: a TxnOffsetCommit, pending until its marker


@dataclass(frozen=True)
class CoordinatorConfig:
    """Kafka's GroupCoordinatorConfig defaults."""
    offsets_topic_num_partitions: int = 50
    offsets_topic_replication_factor: int = 3     # capped by the brokers available
    offsets_topic_segment_bytes: int = 104857600
    offsets_retention_minutes: int = 10080
    offsets_retention_check_interval_ms: int = 600000
    offset_metadata_max_bytes: int = 4096


class GroupCoordinator:
    def __init__(self, broker, config: CoordinatorConfig | None = None):
        self.broker = broker
        self.config = config or CoordinatorConfig()
        self.clock = broker.clock
        self._lock = threading.RLock()
        self._cache: dict[str, dict[tuple[str, int], OffsetAndMetadata]] = {}
        self._loaded_epochs: dict[int, int] = {}
        # TxnOffsetCommit: producer id -> group -> offsets, visible once the COMMIT marker lands
        self._pending_txn: dict[int, dict[str, dict[tuple[str, int], OffsetAndMetadata]]] = {}
        self.membership = GroupMembership(self.clock, broker.config, store=self._store_group,
                                          events=broker.events)
        self._ensure_offsets_topic()
        self.loaded_records = sum(self._load_partition(p) for p in range(self.num_partitions)
                                  if self._leads(p))
        self._expiry_task = None

    # ---- the internal topic
    def _ensure_offsets_topic(self) -> None:
        if self.broker.metadata.topic(OFFSETS_TOPIC) is None:
            brokers = len(self.broker.metadata.children("/brokers/ids"))
            self.broker.create_topic(
                OFFSETS_TOPIC, self.config.offsets_topic_num_partitions,
                max(1, min(self.config.offsets_topic_replication_factor, brokers)),
                {"cleanup.policy": "compact", "compression.type": "producer",
                 "segment.bytes": self.config.offsets_topic_segment_bytes})
        self.num_partitions = self.broker.partition_count(OFFSETS_TOPIC)

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.num_partitions)

    def _leads(self, p: int) -> bool:
        part = self.broker.replica_manager.partitions.get((OFFSETS_TOPIC, p))
        return part is not None and part.is_leader

    def coordinator_for(self, group_id: str) -> int:
        """The broker that leads the group's partition (FindCoordinator's answer); −1 if none."""
        state = self.broker.metadata.partition_state(OFFSETS_TOPIC, self.partition_for(group_id))
        return state["leader"] if state else -1

    def _load_partition(self, p: int) -> int:
        """Replay one partition of `__consumer_offsets` into the cache (on startup, and when this
        broker becomes its leader); return the records read."""
        part = self.broker.replica_manager.partition(OFFSETS_TOPIC, p)
        for group in [g for g in self._cache if self.partition_for(g) == p]:
            del self._cache[group]
        for group in [g for g in self.membership.groups if self.partition_for(g) == p]:
            del self.membership.groups[group]
        for pid in list(self._pending_txn):
            for group in [g for g in self._pending_txn[pid] if self.partition_for(g) == p]:
                del self._pending_txn[pid][group]
        count = 0
        for batch in part.log.batches():
            if batch.is_control:
                self.complete_txn(batch.producer_id, p,
                                  batch.control_record_type() == ControlRecordType.COMMIT)
                continue
            for record in batch.records():
                count += 1
                if batch.is_transactional:
                    self._apply_pending(batch.producer_id, record.key, record.value)
                else:
                    self._apply(record.key, record.value)
        self._loaded_epochs[p] = part.leader_epoch
        return count

    # ---- transactional offset commits (GroupMetadataManager's pendingTransactionalOffsetCommits)
    def _apply_pending(self, producer_id: int, key_bytes: bytes, value_bytes: bytes | None) -> None:
        key = decode_key(key_bytes)
        if isinstance(key, OffsetCommitKey) and value_bytes is not None:
            v = decode_offset_commit_value(value_bytes)
            self._pending_txn.setdefault(producer_id, {}).setdefault(key.group, {})[
                (key.topic, key.partition)] = OffsetAndMetadata(
                    v.offset, v.metadata, v.leader_epoch, v.commit_timestamp, v.expire_timestamp)

    def complete_txn(self, producer_id: int, partition: int, commit: bool) -> None:
        """A COMMIT/ABORT marker landed in `__consumer_offsets`-`partition`: the producer's
        pending offsets for the groups of that partition become committed, or are dropped."""
        with self._lock:
            pending = self._pending_txn.get(producer_id, {})
            for group in [g for g in pending if self.partition_for(g) == partition]:
                offsets = pending.pop(group)
                if commit:
                    self._cache.setdefault(group, {}).update(offsets)
            if not pending:
                self._pending_txn.pop(producer_id, None)

    def has_pending_offsets(self, group_id: str) -> bool:
        with self._lock:
            return any(group_id in groups for groups in self._pending_txn.values())

    def _ensure_fresh(self, group_id: str) -> None:
        p = self.partition_for(group_id)
        part = self.broker.replica_manager.partitions.get((OFFSETS_TOPIC, p))
        if part is None or not part.is_leader:
            raise NotCoordinatorError(
                f"broker {self.broker.broker_id} is not the coordinator of group '{group_id}' "
                f"(partition {p} of {OFFSETS_TOPIC} is led by broker {self.coordinator_for(group_id)})")
        if self._loaded_epochs.get(p) != part.leader_epoch:
            self._load_partition(p)

    def _apply(self, key_bytes: bytes, value_bytes: bytes | None) -> None:
        key = decode_key(key_bytes)
        if isinstance(key, OffsetCommitKey):
            group = self._cache.setdefault(key.group, {})
            tp = (key.topic, key.partition)
            if value_bytes is None:
                group.pop(tp, None)
                if not group:
                    self._cache.pop(key.group, None)
            else:
                v = decode_offset_commit_value(value_bytes)
                group[tp] = OffsetAndMetadata(v.offset, v.metadata, v.leader_epoch,
                                              v.commit_timestamp, v.expire_timestamp)
        elif isinstance(key, GroupMetadataKey) and value_bytes is None:
            self._cache.pop(key.group, None)
            self.membership.groups.pop(key.group, None)
        elif isinstance(key, GroupMetadataKey):
            self.membership.load(group_from_value(key.group, decode_group_metadata_value(value_bytes)))

    # ---- group metadata records
    def _store_group(self, group: GroupMetadata) -> None:
        """Write the group's GroupMetadata record (Kafka's storeGroup), beside its offsets."""
        record = Record(GroupMetadataKey(group.group_id).encode(), group_to_value(group).encode(),
                        self.clock.milliseconds())
        self.broker.produce_request(OFFSETS_TOPIC, self.partition_for(group.group_id),
                                    build_batch([record]), 1)

    def group_state(self, group_id: str) -> str:
        """Empty, PreparingRebalance, CompletingRebalance, Stable — or Dead for an unknown group
        (what DescribeGroups answers for a group the coordinator does not know)."""
        self._ensure_fresh(group_id)
        group = self.membership.group(group_id)
        if group is not None:
            return group.state
        return EMPTY if group_id in self._cache else "Dead"

    def describe_group(self, group_id: str):
        """The group's state and members (GroupDescription), as DescribeGroups answers."""
        from .group_metadata import describe_group
        state = self.group_state(group_id)
        return describe_group(self.membership.group(group_id), group_id, state,
                              self.broker.broker_id)

    def delete_group(self, group_id: str) -> None:
        """DeleteGroups: tombstones for the group and all its offsets; refused while it has
        members (NON_EMPTY_GROUP) and for a group this coordinator does not know."""
        from .errors import GroupIdNotFoundError, NonEmptyGroupError
        self._ensure_fresh(group_id)
        with self._lock, self.membership.lock:
            if group_id not in self._cache and self.membership.group(group_id) is None:
                raise GroupIdNotFoundError(f"group '{group_id}' does not exist")
            if self.membership.delete(group_id) is not None:
                raise NonEmptyGroupError(f"group '{group_id}' has active members")
            now = self.clock.milliseconds()
            records = [Record(OffsetCommitKey(group_id, t, p).encode(), None, now)
                       for t, p in self._cache.pop(group_id, {})]
            records.append(Record(GroupMetadataKey(group_id).encode(), None, now))
            self.broker.produce_request(OFFSETS_TOPIC, self.partition_for(group_id),
                                        build_batch(records), 1)

    def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> dict:
        """OffsetDelete: tombstones for these partitions' offsets; a partition of a topic the
        group's members subscribe to answers GROUP_SUBSCRIBED_TO_TOPIC (error names per tp)."""
        from .errors import GroupIdNotFoundError
        self._ensure_fresh(group_id)
        with self._lock, self.membership.lock:
            group = self.membership.group(group_id)
            if group_id not in self._cache and group is None:
                raise GroupIdNotFoundError(f"group '{group_id}' does not exist")
            subscribed = group.subscribed_topics() if group is not None and group.members else set()
            results, records, now = {}, [], self.clock.milliseconds()
            for tp in partitions:
                if subscribed is None or tp[0] in subscribed:
                    results[tp] = "GROUP_SUBSCRIBED_TO_TOPIC"
                    continue
                results[tp] = None
                if self._cache.get(group_id, {}).pop(tp, None) is not None:
                    records.append(Record(OffsetCommitKey(group_id, *tp).encode(), None, now))
            if records:
                self.broker.produce_request(OFFSETS_TOPIC, self.partition_for(group_id),
                                            build_batch(records), 1)
            return results

    def remove_offsets_of(self, topic: str) -> int:
        """Forget every group's committed offsets for a deleted topic, with tombstones (Kafka's
        GroupMetadataManager.cleanupGroupMetadata after partitions are deleted). Groups this broker
        does not coordinate are left to their coordinator. Returns the offsets removed."""
        removed, now = 0, self.clock.milliseconds()
        with self._lock:
            for group_id, offsets in list(self._cache.items()):
                gone = [tp for tp in offsets if tp[0] == topic]
                part = self.broker.replica_manager.partitions.get((OFFSETS_TOPIC, self.partition_for(group_id)))
                if not gone or part is None or not part.is_leader:
                    continue
                for tp in gone:
                    del offsets[tp]
                self.broker.produce_request(OFFSETS_TOPIC, self.partition_for(group_id), build_batch(
                    [Record(OffsetCommitKey(group_id, *tp).encode(), None, now) for tp in gone]), 1)
                removed += len(gone)
        return removed

    # ---- commit / fetch
    def commit_offsets(self, group_id: str, offsets: dict[tuple[str, int], OffsetAndMetadata | int],
                       expire_timestamp: int | None = None, timeout_s: float = 30.0, *,
                       generation_id: int = -1, member_id: str = "",
                       instance_id: str | None = None) -> dict[tuple[str, int], int]:
        """Commit offsets for a group. Every entry is validated first; if any is invalid nothing
        is written and CommitFailedError lists the problems. The commit is appended with
        acks=all and counts only once the ISR has it (then the cache answers with it).
        Returns the stored offsets."""
        prepared = self.prepare_commit(group_id, offsets, expire_timestamp, generation_id=generation_id,
                                       member_id=member_id, instance_id=instance_id)
        if prepared is None:
            return {}
        result = self.broker.produce_request(OFFSETS_TOPIC, prepared.partition, prepared.batch, -1)
        if not result.done:
            result.wait(timeout_s)   # a cluster: replication happens on other threads
        self.complete_commit(prepared, result)
        return {tp: om.offset for tp, om in prepared.stored.items()}

    def prepare_commit(self, group_id: str, offsets, expire_timestamp: int | None = None, *,
                       generation_id: int = -1, member_id: str = "",
                       instance_id: str | None = None, producer_id: int = -1,
                       producer_epoch: int = -1) -> "PreparedCommit | None":
        """Validate and build the commit's batch (nothing is written). A group with members
        accepts commits only from a member of its current generation (generation −1 and no
        member id: an assign()-only consumer or an admin, allowed while the group is Empty).
        A transactional commit (TxnOffsetCommit) carries the producer id and epoch."""
        if not isinstance(group_id, str) or not group_id:
            raise InvalidGroupIdError("the group id must be a non-empty string")
        refused = self.membership.validate_commit(group_id, generation_id, member_id, instance_id)
        if refused is not None:
            from .errors import error_for_code
            from .protocol import ERRORS
            raise error_for_code(ERRORS[refused], f"commit for group '{group_id}' refused "
                                                  f"(generation {generation_id}, member '{member_id}')")
        self._ensure_fresh(group_id)
        now = self.clock.milliseconds()
        problems, records = [], []
        stored: dict[tuple[str, int], OffsetAndMetadata] = {}
        for (topic, partition), om in offsets.items():
            if isinstance(om, int):
                om = OffsetAndMetadata(om)
            try:
                self.broker.get_log(topic, partition)
                if om.offset < 0:
                    raise InvalidCommitOffsetError(
                        f"offset {om.offset} for {topic}-{partition} is negative")
                if java_length(om.metadata) > self.config.offset_metadata_max_bytes:
                    raise OffsetMetadataTooLargeError(
                        f"metadata for {topic}-{partition} is longer than "
                        f"offset.metadata.max.bytes ({self.config.offset_metadata_max_bytes})")
            except KStoreError as e:
                problems.append(f"{topic}-{partition}: {type(e).__name__}: {e}")
                continue
            value = OffsetCommitValue(om.offset, om.metadata, now, om.leader_epoch, expire_timestamp)
            records.append(Record(OffsetCommitKey(group_id, topic, partition).encode(),
                                  value.encode(), now))
            stored[(topic, partition)] = OffsetAndMetadata(om.offset, om.metadata, om.leader_epoch,
                                                           now, expire_timestamp)
        if problems:
            raise CommitFailedError(f"commit for group '{group_id}' refused, nothing written: "
                                    + "; ".join(problems))
        if not records:
            return None
        batch = build_batch(records, producer_id=producer_id, producer_epoch=producer_epoch,
                            transactional=producer_id >= 0)   # TxnOffsetCommit: a txn batch
        return PreparedCommit(group_id, self.partition_for(group_id), batch, stored, producer_id)

    def complete_commit(self, prepared: "PreparedCommit", result) -> None:
        """Apply a commit to the cache once its append succeeded; raise its error otherwise."""
        if not result.done:
            from .errors import RequestTimedOutError
            raise RequestTimedOutError(f"the commit of group '{prepared.group_id}' was not "
                                       f"replicated in time")
        if result.error is not None:
            raise result.error
        with self._lock:
            if prepared.producer_id >= 0:   # pending until the transaction's marker
                self._pending_txn.setdefault(prepared.producer_id, {}).setdefault(
                    prepared.group_id, {}).update(prepared.stored)
            else:
                self._cache.setdefault(prepared.group_id, {}).update(prepared.stored)

    def fetch_offsets(self, group_id: str, partitions=None) -> dict[tuple[str, int], OffsetAndMetadata | None]:
        """The committed offsets of a group (all of them, or for the given partitions)."""
        self._ensure_fresh(group_id)
        with self._lock:
            group = dict(self._cache.get(group_id, {}))
        if partitions is None:
            return group
        return {tp: group.get(tp) for tp in partitions}

    def groups(self) -> list[str]:
        with self._lock:
            return sorted(set(self._cache) | set(self.membership.groups))

    # ---- expiry
    def expire_offsets(self, now: int | None = None) -> int:
        """Write tombstones for offsets past offsets.retention.minutes (or their explicit expire
        timestamp); a group left without offsets gets a GroupMetadataKey tombstone too."""
        now = self.clock.milliseconds() if now is None else now
        retention_ms = self.config.offsets_retention_minutes * 60_000
        written = 0
        with self._lock:
            for group_id, offsets in list(self._cache.items()):
                if self.membership.state_of(group_id) != EMPTY:
                    continue    # a group with members keeps its offsets
                # an emptied classic group's offsets count from when it became empty
                group = self.membership.group(group_id)
                emptied = group.state_timestamp if group is not None else -1
                expired = [tp for tp, om in offsets.items()
                           if (om.expire_timestamp is not None and now >= om.expire_timestamp)
                           or (om.expire_timestamp is None
                               and now - (emptied if emptied >= 0 else om.commit_timestamp)
                               >= retention_ms)]
                if not expired:
                    continue
                tombstones = [Record(OffsetCommitKey(group_id, t, p).encode(), None, now)
                              for t, p in expired]
                if len(expired) == len(offsets):
                    tombstones.append(Record(GroupMetadataKey(group_id).encode(), None, now))
                self.broker.produce(OFFSETS_TOPIC, self.partition_for(group_id),
                                    build_batch(tombstones))
                for tp in expired:
                    offsets.pop(tp)
                if not offsets:
                    self._cache.pop(group_id)
                written += len(tombstones)
        return written

    def start_expiry(self) -> None:
        """Check for expired offsets every offsets.retention.check.interval.ms on the scheduler."""
        if self._expiry_task is None:
            interval = self.config.offsets_retention_check_interval_ms
            self._expiry_task = self.broker.logs.scheduler.schedule(
                "offsets-expiration", self.expire_offsets, delay_ms=interval, period_ms=interval)

    def shutdown(self) -> None:
        if self._expiry_task is not None:
            self.broker.logs.scheduler.cancel(self._expiry_task)
            self._expiry_task = None




def group_to_value(group: GroupMetadata) -> GroupMetadataValue:
    members = tuple(GroupMemberValue(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                     m.rebalance_timeout_ms, m.session_timeout_ms,
                                     m.metadata(group.protocol_name) if group.protocol_name else b"",
                                     m.assignment)
                    for m in group.members.values())
    return GroupMetadataValue(group.protocol_type or "", group.generation_id, group.protocol_name,
                              group.leader_id, group.state_timestamp, members)


def group_from_value(group_id: str, value: GroupMetadataValue) -> GroupMetadata:
    """A group as stored: Stable with its members and their assignments, or Empty."""
    group = GroupMetadata(group_id, STABLE if value.members else EMPTY, value.generation,
                          value.protocol_type or None, value.protocol, value.leader,
                          value.current_state_timestamp)
    for m in value.members:
        group.add(MemberMetadata(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                 m.rebalance_timeout, m.session_timeout, value.protocol_type,
                                 [(value.protocol or "", m.subscription)], m.assignment))
    group.leader_id = value.leader
    return group

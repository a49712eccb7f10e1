"""The admin requests that delete topics or records or change configs: DeleteTopics, DeleteRecords,
AlterConfigs and IncrementalAlterConfigs — what `AdminClient.delete_topics()`, `delete_records()`,
`alter_configs()` and `incremental_alter_configs()` send (Kafka's kafka-topics.sh --delete,
kafka-delete-records.sh and kafka-configs.sh --alter send the same requests). In Kafka, `KafkaApis`
hands them to the controller, `ReplicaManager.deleteRecords` (`Partition.deleteRecordsOnLeader`)
and `ConfigAdminManager`.

A mixin of `kstore.server.KafkaServer`, like `kstore.admin_apis`: each topic, partition or resource
is answered on its own, so one bad entry never fails the others.

Where kstore differs: topics are deleted by a single broker only (`Broker.delete_topic`); broker
configs are static (set with `kstore serve --override`), so altering a broker resource is refused with
INVALID_REQUEST; DeleteRecords answers as soon as the leader moved its log start offset (Kafka
waits, up to the request's timeout, until every live follower moved its own; kstore's followers
move theirs on their next fetch).
"""

from __future__ import annotations

from collections import Counter

from .admin_apis import BROKER_RESOURCE, TOPIC_RESOURCE, _answer
from .broker import INTERNAL_TOPICS
from .config import KEYS as TOPIC_CONFIG_KEYS
from .errors import (ConfigError, InvalidRequestError, InvalidTopicError, KStoreError, OffsetOutOfRangeError,
                     PolicyViolationError, error_code)
from .log import Log

HIGH_WATERMARK = -1                       # DeleteRecordsRequest.HIGH_WATERMARK
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3   # AlterConfigOp.OpType


def delete_records_on_leader(log: Log, offset: int) -> int:
    """Move the log start offset of a partition this broker leads up to `offset` (-1: the high
    watermark), as Kafka's Partition.deleteRecordsOnLeader; returns the new low watermark. The
    segments wholly below it are deleted by the next retention check, as in Kafka."""
    if not log.config.delete:
        raise PolicyViolationError(f"Records of partition {log.name} can not be deleted due to "
                                   f"the configured policy (cleanup.policy="
                                   f"{','.join(log.config.cleanup_policy)})")
    target = log.high_watermark if offset == HIGH_WATERMARK else offset
    if target < 0:
        raise OffsetOutOfRangeError(f"The offset {target} for partition {log.name} is not valid")
    log.maybe_increment_log_start_offset(target, "client record deletion")   # > HW: out of range
    return log.log_start_offset


def check_config_changes(changes: list[dict], incremental: bool) -> None:
    """What Kafka's ConfigAdminManager.preprocess refuses in a resource's configs before looking at
    them: a name given twice, and a null value (except for an incremental DELETE)."""
    names = Counter(c["name"] for c in changes)
    if any(k > 1 for k in names.values()):
        raise InvalidRequestError("Error due to duplicate config keys")
    nulls = [c["name"] for c in changes
             if c["value"] is None and not (incremental and c["config_operation"] == DELETE)]
    if nulls:
        raise InvalidRequestError(f"Null value not supported for : {', '.join(nulls)}")


def _items(value) -> list[str]:
    text = value if isinstance(value, str) else ",".join(value)
    return [s.strip() for s in text.split(",") if s.strip()]


def incremental_overrides(current: dict, changes: list[dict], defaults) -> dict:
    """A topic's overrides after IncrementalAlterConfigs' operations (as Kafka's controller applies
    them): SET and DELETE one value; APPEND and SUBTRACT change a list config (cleanup.policy),
    starting from its override, else its default (`defaults[name]`, the broker-wide value)."""
    check_config_changes(changes, incremental=True)
    out = dict(current)
    for change in changes:
        name, op, value = change["name"], change["config_operation"], change["value"]
        key = TOPIC_CONFIG_KEYS.get(name)
        if key is None:
            raise ConfigError(f"Unknown topic config name: {name}")
        if op == SET:
            out[name] = value
        elif op == DELETE:
            out.pop(name, None)
        elif op in (APPEND, SUBTRACT):
            verb = "APPEND" if op == APPEND else "SUBTRACT"
            if key.type != "list":
                raise ConfigError(f"Can't {verb} to key {name} because its type is not LIST.")
            items = _items(out.get(name, defaults[name]))
            given = _items(value)
            items = (items + [v for v in given if v not in items] if op == APPEND
                     else [v for v in items if v not in given])
            out[name] = ",".join(items)
        else:
            raise InvalidRequestError(f"Unknown operations type {op}")
    return out


class AdminChangeApis:
    """Needs `self.broker` (a `kstore.broker.Broker`)."""

    # ------------------------------------------------------------------ DeleteTopics
    async def _delete_topics(self, version, body, header) -> dict:
        counts = Counter(body["topic_names"])
        responses = []
        for name in body["topic_names"]:   # (v1-3 answers carry no error message)
            entry = {"name": name, "error_code": 0}
            try:
                if counts[name] > 1:
                    raise InvalidRequestError("Duplicate topic name.")
                self.broker.delete_topic(name)
            except KStoreError as e:
                entry["error_code"] = error_code(e)
            responses.append(entry)
        return {"throttle_time_ms": 0, "responses": responses}

    # ------------------------------------------------------------------ DeleteRecords
    async def _delete_records(self, version, body, header) -> dict:
        topics = []
        for topic in body["topics"]:
            parts = []
            for p in topic["partitions"]:
                entry = {"partition_index": p["partition_index"], "low_watermark": -1, "error_code": 0}
                try:
                    entry["low_watermark"] = self._delete_records_of(topic["name"], p["partition_index"],
                                                                     p["offset"])
                except KStoreError as e:
                    entry["error_code"] = error_code(e)
                parts.append(entry)
            topics.append({"name": topic["name"], "partitions": parts})
        return {"throttle_time_ms": 0, "topics": topics}

    def _delete_records_of(self, topic: str, partition: int, offset: int) -> int:
        if topic in INTERNAL_TOPICS:
            raise InvalidTopicError(f"Cannot delete records of internal topic {topic}")
        log = self.broker.leader_log(topic, partition)   # UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER...
        low_watermark = delete_records_on_leader(log, offset)
        self.broker.logs.checkpoint_log_start_offsets()    # survives a crash, as Kafka's checkpoint
        return low_watermark

    # ------------------------------------------------------------------ AlterConfigs
    async def _alter_configs(self, version, body, header) -> dict:
        def alter(resource: dict) -> None:
            check_config_changes(resource["configs"], incremental=False)
            overrides = {c["name"]: c["value"] for c in resource["configs"]}
            self._replace_config(resource, overrides, body["validate_only"])
        return self._alter_answers(body, alter)

    # ------------------------------------------------------------------ IncrementalAlterConfigs
    async def _incremental_alter_configs(self, version, body, header) -> dict:
        def alter(resource: dict) -> None:
            current = self.broker.describe_topic(resource["resource_name"]).configs
            overrides = incremental_overrides(current, resource["configs"],
                                              self.broker.logs.default_config)
            self._replace_config(resource, overrides, body["validate_only"])
        return self._alter_answers(body, alter)

    def _alter_answers(self, body: dict, alter) -> dict:
        counts = Counter((r["resource_type"], r["resource_name"]) for r in body["resources"])

        def answer(resource: dict, result: dict) -> None:
            if counts[(resource["resource_type"], resource["resource_name"])] > 1:
                raise InvalidRequestError("Each resource must appear at most once.")
            self._check_resource_type(resource["resource_type"])
            alter(resource)
        return {"throttle_time_ms": 0, "responses": [
            _answer({"error_code": 0, "error_message": None, "resource_type": r["resource_type"],
                     "resource_name": r["resource_name"]},
                    lambda result, r=r: answer(r, result)) for r in body["resources"]]}

    def _replace_config(self, resource: dict, overrides: dict, validate_only: bool) -> None:
        self.broker.replace_topic_config(resource["resource_name"], overrides,
                                         validate_only=validate_only)

    @staticmethod
    def _check_resource_type(kind: int) -> None:
        if kind == BROKER_RESOURCE:
            raise InvalidRequestError(
                "kstore's broker configs are static: restart kstore serve with --override "
                "name=value (a topic config's broker-wide default goes under its broker name, "
                "e.g. log.retention.ms)")
        if kind != TOPIC_RESOURCE:
            raise InvalidRequestError(f"kstore alters topic ({TOPIC_RESOURCE}) configs, not "
                                      f"resource type {kind}")

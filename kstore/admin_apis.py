"""The admin requests of the network broker: CreateTopics, CreatePartitions, DescribeConfigs,
ListGroups and DescribeLogDirs — what Kafka's `AdminClient` sends for kafka-topics, kafka-configs,
kafka-consumer-groups and kafka-log-dirs (in Kafka, `KafkaApis` hands them to the controller /
`ConfigHelper` / `GroupCoordinator` / `ReplicaManager`).

A mixin of `kstore.server.KafkaServer`: each handler turns one request body into one response
body, answering per topic or per resource, so one bad entry never fails the others. The work is
done by the broker's own methods (`create_topic`, `create_partitions`, `describe_topic`), the
same ones the offline tools call, so the two paths cannot disagree.

Where kstore differs: manual replica assignments are refused with INVALID_REPLICA_ASSIGNMENT
(kstore places replicas itself), broker configs are read-only (no dynamic broker configs), and a
broker has one log directory (so no future logs: AlterReplicaLogDirs is not implemented).
"""

from __future__ import annotations

from collections import Counter

from .config import ConfigEntry, broker_config_entries, topic_config_entries
from .errors import InvalidReplicaAssignmentError, InvalidRequestError, KStoreError, error_code

# DescribeConfigsRequest resource types and ConfigSource / ConfigType codes (DescribeConfigsResponse)
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
CONFIG_SOURCE = {"DYNAMIC_TOPIC_CONFIG": 1, "STATIC_BROKER_CONFIG": 4, "DEFAULT_CONFIG": 5}
CONFIG_TYPE = {"boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6, "list": 7}


def _answer(result: dict, action) -> dict:
    """`result` after running `action(result)`: a refusal becomes its error code and message, so
    one bad topic or resource never fails the others in the request."""
    try:
        action(result)
    except KStoreError as e:
        result["error_code"], result["error_message"] = error_code(e), str(e)
    return result


class AdminApis:
    """Needs `self.broker` (a `kstore.broker.Broker`)."""

    # ------------------------------------------------------------------ CreateTopics
    async def _create_topics(self, version, body, header) -> dict:
        counts = Counter(t["name"] for t in body["topics"])
        validate_only = body.get("validate_only", False)

        def create(topic: dict, result: dict) -> None:
            if counts[topic["name"]] > 1:   # Kafka refuses every copy of a repeated name
                raise InvalidRequestError(f"topic '{topic['name']}' is named more than once "
                                          f"in the request")
            self._create_topic(topic, validate_only)
        return {"throttle_time_ms": 0, "topics": [
            _answer({"name": t["name"], "error_code": 0, "error_message": None},
                    lambda result, t=t: create(t, result)) for t in body["topics"]]}

    def _create_topic(self, topic: dict, validate_only: bool) -> None:
        if topic["assignments"]:
            raise InvalidReplicaAssignmentError(
                "kstore places replicas itself: give num_partitions and replication_factor "
                "instead of a manual assignment")
        partitions = None if topic["num_partitions"] == -1 else topic["num_partitions"]
        replication_factor = (self.broker.config["default.replication.factor"]
                              if topic["replication_factor"] == -1 else topic["replication_factor"])
        configs = {c["name"]: c["value"] for c in topic["configs"] if c["value"] is not None}
        self.broker.create_topic(topic["name"], partitions, replication_factor, configs,
                                 validate_only=validate_only)

    # ------------------------------------------------------------------ CreatePartitions
    async def _create_partitions(self, version, body, header) -> dict:
        def grow(topic: dict, result: dict) -> None:
            if topic["assignments"] is not None:
                raise InvalidReplicaAssignmentError(
                    "kstore places the new partitions' replicas itself: send no assignments")
            self.broker.create_partitions(topic["name"], topic["count"],
                                          validate_only=body["validate_only"])
        return {"throttle_time_ms": 0, "results": [
            _answer({"name": t["name"], "error_code": 0, "error_message": None},
                    lambda result, t=t: grow(t, result)) for t in body["topics"]]}

    # ------------------------------------------------------------------ DescribeConfigs
    async def _describe_configs(self, version, body, header) -> dict:
        def describe(resource: dict, result: dict) -> None:
            # No keys (null, or an empty list: Kafka's ConfigHelper treats both alike) = all of them.
            wanted = resource["configuration_keys"]
            read_only = resource["resource_type"] == BROKER_RESOURCE
            result["configs"] = [
                self._config_result(entry, body, read_only)
                for entry in self._config_entries(resource["resource_type"], resource["resource_name"])
                if not wanted or entry.name in wanted]
        return {"throttle_time_ms": 0, "results": [
            _answer({"error_code": 0, "error_message": None, "configs": [],
                     "resource_type": r["resource_type"], "resource_name": r["resource_name"]},
                    lambda result, r=r: describe(r, result)) for r in body["resources"]]}

    def _config_entries(self, resource_type: int, name: str) -> list[ConfigEntry]:
        if resource_type == TOPIC_RESOURCE:
            overrides = self.broker.describe_topic(name).configs   # UNKNOWN_TOPIC_OR_PARTITION
            return topic_config_entries(self.broker.logs.default_config.with_overrides(overrides),
                                        overrides, self.broker.config)
        if resource_type == BROKER_RESOURCE:
            if name not in ("", str(self.broker.broker_id)):
                raise InvalidRequestError(f"unexpected broker id, expected {self.broker.broker_id} "
                                          f"or the empty string, but received {name!r}")
            return broker_config_entries(self.broker.config)
        raise InvalidRequestError(f"kstore describes topic ({TOPIC_RESOURCE}) and broker "
                                  f"({BROKER_RESOURCE}) configs, not resource type {resource_type}")

    @staticmethod
    def _config_result(entry: ConfigEntry, body: dict, read_only: bool) -> dict:
        synonyms = ([{"name": s.name, "value": s.value, "source": CONFIG_SOURCE[s.source]}
                     for s in entry.synonyms] if body.get("include_synonyms") else [])
        return {"name": entry.name, "value": entry.value, "read_only": read_only,
                "config_source": CONFIG_SOURCE[entry.source], "is_sensitive": False,
                "synonyms": synonyms, "config_type": CONFIG_TYPE.get(entry.type, 0),
                "documentation": entry.doc if body.get("include_documentation") else None}

    # ------------------------------------------------------------------ ListGroups
    async def _list_groups(self, version, body, header) -> dict:
        # A group that only commits offsets (its consumers assign() partitions) has an empty
        # protocol type, as in Kafka; a group whose members joined has theirs ("consumer").
        membership = self.broker.group_coordinator.membership
        return {"throttle_time_ms": 0, "error_code": 0,
                "groups": [{"group_id": g, "protocol_type": (membership.group(g).protocol_type or "")
                            if membership.group(g) else ""}
                           for g in self.broker.group_coordinator.groups()]}

    # ------------------------------------------------------------------ DescribeLogDirs
    async def _describe_log_dirs(self, version, body, header) -> dict:
        """Every partition in this broker's log directory (or those asked for) with its size on
        disk, as Kafka's ReplicaManager.describeLogDirs; partitions it does not hold are left out."""
        wanted = None if body["topics"] is None else {
            (t["topic"], p) for t in body["topics"] for p in t["partitions"]}
        topics: dict[str, list[dict]] = {}
        for (topic, partition), log in sorted(self.broker.logs.logs().items()):
            if wanted is None or (topic, partition) in wanted:
                topics.setdefault(topic, []).append({
                    "partition_index": partition, "partition_size": log.size_in_bytes(),
                    # Kafka's getLogEndOffsetLag for a current (not future) log: HW - LEO, at
                    # least 0 (so 0, as the HW never passes the LEO); only future logs lag.
                    "offset_lag": max(log.high_watermark - log.log_end_offset, 0),
                    "is_future_key": False})
        return {"throttle_time_ms": 0,
                "results": [{"error_code": 0, "log_dir": self.broker.logs.log_dir,
                             "topics": [{"name": name, "partitions": partitions}
                                        for name, partitions in topics.items()]}]}

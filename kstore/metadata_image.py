"""What a KRaft broker knows about its cluster, read back from its log directory.

Mirrors Kafka's `MetadataLoader` building a `MetadataImage` (topics, partitions, configs) from the
`__cluster_metadata-0` log, plus `MetaProperties` (`meta.properties`: cluster id, node id) and
`PartitionMetadataFile` (each partition's `partition.metadata`: its topic id).

Each record in the metadata log has no key; its value is a metadata record framed as Kafka's
`MetadataRecordSerde` writes it:

    unsigned varint  frame version (1)
    unsigned varint  record type (the "apiKey" of the record's JSON schema)
    unsigned varint  record version
    the record's fields, in the "flexible" encoding: compact strings and arrays (length + 1 as an
    unsigned varint), 16-byte UUIDs, big-endian integers, then tagged fields

Only the records that shape topics are applied (TopicRecord, PartitionRecord,
PartitionChangeRecord, ConfigRecord, RemoveTopicRecord), and ProducerIdsRecord, so that the
producer ids kstore hands out start above those Kafka's controller handed out; the others
(brokers, features, ...) are skipped by type. kstore only reads this log: it never writes KRaft
records.
"""

from __future__ import annotations

import base64
import os
import struct
from dataclasses import dataclass, field

from .errors import KStoreError
from .varint import read_unsigned_varint

CLUSTER_METADATA_DIR = "__cluster_metadata-0"
META_PROPERTIES = "meta.properties"
PARTITION_METADATA = "partition.metadata"

# Record types (apiKey in metadata/src/main/resources/common/metadata/*.json).
TOPIC_RECORD = 2
PARTITION_RECORD = 3
CONFIG_RECORD = 4
PARTITION_CHANGE_RECORD = 5
REMOVE_TOPIC_RECORD = 9
PRODUCER_IDS_RECORD = 15
TOPIC_RESOURCE = 2          # ConfigResource.Type.TOPIC
NO_LEADER_CHANGE = -2       # PartitionChangeRecord.Leader default


class MetadataRecordError(KStoreError):
    """A metadata record that does not decode."""


def uuid_string(raw: bytes) -> str:
    """Kafka's `Uuid.toString`: URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def read_properties(path: str) -> dict[str, str]:
    """A Java .properties file of `key=value` lines (`#` comments), as Kafka writes them."""
    props = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            key, _, value = line.partition("=")
            props[key.strip()] = value.strip()
    return props


def read_partition_metadata(path: str) -> str | None:
    """The topic id in a `partition.metadata` file (`version: 0` / `topic_id: <id>`)."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == "topic_id":
                    return value.strip()
    except FileNotFoundError:
        return None
    return None


class _Reader:
    """The flexible-version field decoder the metadata records need."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise MetadataRecordError("metadata record ends early")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def uvarint(self) -> int:
        value, self.pos = read_unsigned_varint(self.data, self.pos)
        return value

    def int8(self) -> int:
        return struct.unpack(">b", self._take(1))[0]

    def int64(self) -> int:
        return struct.unpack(">q", self._take(8))[0]

    def int32(self) -> int:
        return struct.unpack(">i", self._take(4))[0]

    def uuid(self) -> str:
        return uuid_string(self._take(16))

    def string(self) -> str | None:
        n = self.uvarint() - 1
        return None if n < 0 else self._take(n).decode("utf-8")

    def int32_array(self) -> list[int] | None:
        n = self.uvarint() - 1
        return None if n < 0 else [self.int32() for _ in range(n)]

    def uuid_array(self) -> list[str] | None:
        n = self.uvarint() - 1
        return None if n < 0 else [self.uuid() for _ in range(n)]

    def tagged_fields(self) -> dict[int, bytes]:
        tags = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            tags[tag] = self._take(self.uvarint())
        return tags


def decode_metadata_record(value: bytes) -> tuple[int, int, dict]:
    """(record type, version, fields) of one metadata record; fields only for the types applied."""
    r = _Reader(value)
    frame_version = r.uvarint()
    if frame_version != 1:
        raise MetadataRecordError(f"unknown metadata record frame version {frame_version}")
    record_type, version = r.uvarint(), r.uvarint()
    fields: dict = {}
    if record_type == TOPIC_RECORD:
        fields = {"name": r.string(), "topic_id": r.uuid()}
    elif record_type == REMOVE_TOPIC_RECORD:
        fields = {"topic_id": r.uuid()}
    elif record_type == CONFIG_RECORD:
        fields = {"resource_type": r.int8(), "resource_name": r.string(), "name": r.string(),
                  "value": r.string()}
    elif record_type == PARTITION_RECORD:
        fields = {"partition": r.int32(), "topic_id": r.uuid(), "replicas": r.int32_array(),
                  "isr": r.int32_array(), "removing": r.int32_array(), "adding": r.int32_array(),
                  "leader": r.int32(), "leader_epoch": r.int32(), "partition_epoch": r.int32()}
        if version >= 1:
            fields["directories"] = r.uuid_array()
    elif record_type == PRODUCER_IDS_RECORD:
        fields = {"broker_id": r.int32(), "broker_epoch": r.int64(), "next_producer_id": r.int64()}
    elif record_type == PARTITION_CHANGE_RECORD:
        fields = {"partition": r.int32(), "topic_id": r.uuid()}
        tags = r.tagged_fields()
        if 0 in tags:
            isr = _Reader(tags[0]).int32_array()
            fields["isr"] = isr
        if 1 in tags:
            fields["leader"] = _Reader(tags[1]).int32()
        if 2 in tags:
            fields["replicas"] = _Reader(tags[2]).int32_array()
    else:
        return record_type, version, fields
    if record_type != PARTITION_CHANGE_RECORD:
        r.tagged_fields()
    if r.pos != len(value):
        raise MetadataRecordError(f"{len(value) - r.pos} byte(s) left over after record type "
                                  f"{record_type} v{version}")
    return record_type, version, fields


@dataclass
class PartitionImage:
    replicas: list[int]
    isr: list[int]
    leader: int
    leader_epoch: int
    partition_epoch: int


@dataclass
class TopicImage:
    name: str
    topic_id: str
    partitions: dict[int, PartitionImage] = field(default_factory=dict)
    configs: dict[str, str] = field(default_factory=dict)


@dataclass
class MetadataImage:
    """The topics of a KRaft cluster as of the last record of its metadata log."""
    cluster_id: str | None = None
    node_id: int | None = None
    topics: dict[str, TopicImage] = field(default_factory=dict)
    records_read: int = 0
    next_producer_id: int = 0   # the controller's ProducerIdsRecord: ids below it were handed out

    def apply(self, record_type: int, fields: dict) -> None:
        by_id = {t.topic_id: t for t in self.topics.values()}
        if record_type == PRODUCER_IDS_RECORD:
            self.next_producer_id = max(self.next_producer_id, fields["next_producer_id"])
        elif record_type == TOPIC_RECORD:
            self.topics[fields["name"]] = TopicImage(fields["name"], fields["topic_id"])
        elif record_type == REMOVE_TOPIC_RECORD:
            topic = by_id.get(fields["topic_id"])
            if topic is not None:
                del self.topics[topic.name]
        elif record_type == CONFIG_RECORD and fields["resource_type"] == TOPIC_RESOURCE:
            topic = self.topics.get(fields["resource_name"])
            if topic is not None:
                if fields["value"] is None:   # a null value deletes the override
                    topic.configs.pop(fields["name"], None)
                else:
                    topic.configs[fields["name"]] = fields["value"]
        elif record_type == PARTITION_RECORD:
            topic = by_id.get(fields["topic_id"])
            if topic is not None:
                topic.partitions[fields["partition"]] = PartitionImage(
                    fields["replicas"] or [], fields["isr"] or [], fields["leader"],
                    fields["leader_epoch"], fields["partition_epoch"])
        elif record_type == PARTITION_CHANGE_RECORD:
            topic = by_id.get(fields["topic_id"])
            part = topic.partitions.get(fields["partition"]) if topic else None
            if part is None:
                return
            if fields.get("isr") is not None:
                part.isr = fields["isr"]
            if fields.get("replicas") is not None:
                part.replicas = fields["replicas"]
            if fields.get("leader", NO_LEADER_CHANGE) != NO_LEADER_CHANGE:
                part.leader = fields["leader"]
                part.leader_epoch += 1     # a new leader always starts a new leader epoch
            part.partition_epoch += 1


def is_kraft_log_dir(log_dir: str) -> bool:
    return os.path.isdir(os.path.join(log_dir, CLUSTER_METADATA_DIR))


def load_metadata_image(log_dir: str) -> MetadataImage:
    """Replay `__cluster_metadata-0` (read-only) into a MetadataImage; ids from meta.properties."""
    from .file_records import FileRecords
    from .segment import offset_from_file_name
    image = MetadataImage()
    props_path = os.path.join(log_dir, META_PROPERTIES)
    if os.path.exists(props_path):
        props = read_properties(props_path)
        image.cluster_id = props.get("cluster.id")
        node = props.get("node.id", props.get("broker.id"))
        image.node_id = int(node) if node is not None and node.lstrip("-").isdigit() else None
    directory = os.path.join(log_dir, CLUSTER_METADATA_DIR)
    logs = sorted((n for n in os.listdir(directory) if n.endswith(".log")), key=offset_from_file_name)
    for name in logs:
        path = os.path.join(directory, name)
        records = FileRecords(path, file_already_exists=True, read_only=True)
        batch = None
        try:
            for batch in records.batches():
                if batch.is_control:
                    continue
                for record in batch.records():
                    if record.value is None:
                        continue
                    try:
                        record_type, _, fields = decode_metadata_record(record.value)
                    except (MetadataRecordError, UnicodeDecodeError, ValueError) as e:
                        raise MetadataRecordError(f"{path}: metadata record at offset "
                                                  f"{record.offset} does not decode: {e}") from None
                    image.apply(record_type, fields)
                    image.records_read += 1
        except MetadataRecordError:
            raise
        except KStoreError as e:   # a damaged batch: say which file and where
            where = "its first batch" if batch is None else f"the batch at offset {batch.base_offset}"
            raise MetadataRecordError(f"{path}: {where} does not decode: {e}") from None
        finally:
            records.close_handlers()
    return image


def import_kraft_metadata(store, log_dir: str) -> bool:
    """Give a kstore metadata store that has no cluster yet the topics of a real KRaft log dir:
    the cluster id of `meta.properties`, and each topic with its id, partitions, replicas, ISR,
    leader epoch and configs. A topic id that disagrees with a partition's `partition.metadata`
    is an error (Kafka refuses such a partition too). Returns whether anything was imported."""
    if store.exists("/cluster/id") or not is_kraft_log_dir(log_dir):
        return False
    image = load_metadata_image(log_dir)
    nodes: dict = {}
    if image.cluster_id:
        nodes["/cluster/id"] = {"version": "1", "id": image.cluster_id}
    if image.next_producer_id > 0:   # Kafka's producers keep their ids: new ones start above
        nodes["/latest_producer_id_block"] = {"version": 1, "broker": image.node_id,
                                              "block_start": "0",
                                              "block_end": str(image.next_producer_id - 1)}
    for topic in image.topics.values():
        for p in topic.partitions:
            on_disk = read_partition_metadata(
                os.path.join(log_dir, f"{topic.name}-{p}", PARTITION_METADATA))
            if on_disk is not None and on_disk != topic.topic_id:
                raise KStoreError(f"{topic.name}-{p}/{PARTITION_METADATA} has topic id {on_disk} "
                                  f"but the cluster metadata log has {topic.topic_id}")
        nodes[f"/brokers/topics/{topic.name}"] = {
            "version": 3, "topic_id": topic.topic_id,
            "partitions": {str(p): part.replicas for p, part in sorted(topic.partitions.items())},
            "adding_replicas": {}, "removing_replicas": {}}
        nodes[f"/config/topics/{topic.name}"] = {"version": 1, "config": dict(topic.configs)}
        for p, part in topic.partitions.items():
            nodes[f"/brokers/topics/{topic.name}/partitions/{p}/state"] = {
                "controller_epoch": 0, "leader": part.leader, "version": 1,
                "leader_epoch": part.leader_epoch, "isr": part.isr}
    if nodes:
        store.set_many(nodes)
    return bool(nodes)

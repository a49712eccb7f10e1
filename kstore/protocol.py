"""Kafka's binary wire protocol, classic (non-flexible) versions: one schema-driven codec.

What this module owns: the bytes of every request and response kstore's broker speaks, for

    ApiVersions v0-2, Metadata v0-8, Produce v3-8, Fetch v4-11, ListOffsets v1-5,
    FindCoordinator v0-2, OffsetCommit v2-7, OffsetFetch v1-5, InitProducerId v0-1,
    OffsetForLeaderEpoch v0-3, JoinGroup v0-5, SyncGroup v0-3, Heartbeat v0-3, LeaveGroup v0-3,
    DescribeGroups v0-4, DeleteGroups v0-1, OffsetDelete v0, AddPartitionsToTxn v0-2,
    AddOffsetsToTxn v0-2, EndTxn v0-2, WriteTxnMarkers v0, TxnOffsetCommit v0-2,

plus the request header (v1, and v2 far enough to answer a too-new ApiVersions request) and the
response header v0. It mirrors three parts of Kafka's client library:

* the generated message classes (`org.apache.kafka.common.message.ProduceRequestData`,
  `FetchResponseData`, ...), which Kafka's `MessageGenerator` builds from the JSON definitions in
  `clients/src/main/resources/common/message/*.json`. Here each of those definitions is written out
  as Python data (`Field` / `Message` below): the same field order, types, version ranges
  (`"versions": "3+"`), nullable ranges and defaults, with snake_case names ("TopicData" ->
  "topic_data"). Only the fields that exist in the versions above are listed; tagged fields and
  compact encodings (flexible versions) are out of scope;
* `RequestHeaderData` / `ResponseHeaderData` (RequestHeader.json, ResponseHeader.json);
* `ApiKeys` / `Errors` (API_KEYS, SUPPORTED, FLEXIBLE_FROM, ERRORS).

There is ONE encoder and ONE decoder; both walk a `Message`'s fields for the requested version.
(In front of them runs a fast path compiled from the same schemas, which leaves anything unusual,
and so every error, to them: see "the compiled codec" below.)
A body is a plain dict (arrays are lists of dicts). As in Kafka's generated classes, every field has
a value: `decode_*` fills the fields a version does not carry with their defaults, and the encoder
takes a missing key to mean "the default". A key that no version of the message has is refused (it
is almost certainly a typo). Decoding is strict: truncation, a null in a non-nullable field,
invalid UTF-8 or bytes left over after the body raise `ProtocolError`, naming the field
(e.g. ``topic_data[0].partition_data[1].records``) and the byte position.

Records (`records` type) decode to bytes. For encoding a response they may also be a zero-copy file
slice: any object with an int `.size` (kstore's `FileSlice`); `encode_response` then returns the
slice as its own chunk, for the server to send with `os.sendfile`.
"""

from __future__ import annotations

import linecache
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import groupby
from operator import itemgetter
from typing import Any

__all__ = [
    "API_KEYS", "API_NAMES", "SUPPORTED", "FLEXIBLE_FROM", "ERRORS", "SCHEMAS",
    "ProtocolError", "UnsupportedVersionError", "RequestHeader", "Field", "Message",
    "decode_request_header", "decode_request", "encode_request", "encode_response",
    "decode_response", "encode_api_versions_unsupported", "default_body",
]


class ProtocolError(Exception):
    """Malformed or truncated bytes, or a body that cannot be encoded; the message says where."""


class UnsupportedVersionError(ProtocolError):
    """An API key or version this module does not implement (Kafka: UnsupportedVersionException)."""


# ---- ApiKeys: names, the versions implemented here, where flexible versions start ----

# Key 23 is spelled as in kstore's broker ("OffsetsForLeaderEpoch"); Kafka's ApiKeys calls it
# OFFSET_FOR_LEADER_EPOCH and its messages OffsetForLeaderEpochRequest/Response (see SCHEMAS).
API_KEYS: dict[str, int] = {
    "Produce": 0, "Fetch": 1, "ListOffsets": 2, "Metadata": 3, "OffsetCommit": 8,
    "OffsetFetch": 9, "FindCoordinator": 10, "ApiVersions": 18, "InitProducerId": 22,
    "OffsetsForLeaderEpoch": 23, "ListGroups": 16, "CreateTopics": 19, "DescribeConfigs": 32,
    "CreatePartitions": 37,
    "JoinGroup": 11, "Heartbeat": 12, "LeaveGroup": 13, "SyncGroup": 14, "DescribeGroups": 15,
    "DeleteGroups": 42, "OffsetDelete": 47,
    "AddPartitionsToTxn": 24, "AddOffsetsToTxn": 25, "EndTxn": 26, "WriteTxnMarkers": 27,
    "TxnOffsetCommit": 28,
    "DeleteRecords": 21, "AlterConfigs": 33, "IncrementalAlterConfigs": 44, "DeleteTopics": 20,
    "DescribeLogDirs": 35,
}
API_NAMES: dict[int, str] = {key: name for name, key in API_KEYS.items()}

SUPPORTED: dict[int, tuple[int, int]] = {
    0: (3, 8), 1: (4, 11), 2: (1, 5), 3: (0, 8), 8: (2, 7), 9: (1, 5), 10: (0, 2), 18: (0, 2),
    22: (0, 1), 23: (0, 3),
    # the admin APIs the `kstore topics` / `consumer-groups` tools use over the network
    16: (0, 2), 19: (2, 4), 32: (1, 3), 37: (0, 1),
    # the classic consumer group protocol (kstore.group_membership)
    11: (0, 5), 12: (0, 3), 13: (0, 3), 14: (0, 3), 15: (0, 4), 42: (0, 1), 47: (0, 0),
    # transactions (kstore.transaction_apis)
    24: (0, 2), 25: (0, 2), 26: (0, 2), 27: (0, 0), 28: (0, 2),
    # records and configs the admin clients change (kstore.admin_change_apis)
    21: (0, 1), 33: (0, 1), 44: (0, 0), 20: (1, 3),   # DeleteTopics v0: removed in Kafka 4.0
    # what is on disk, per partition (kstore.admin_apis; kafka-log-dirs.sh --describe)
    35: (0, 1),
}

# First flexible version of each API ("flexibleVersions" in the JSON): from there on the request
# header is v2 (tagged fields) and the body uses compact strings/arrays, which are not implemented.
FLEXIBLE_FROM: dict[int, int] = {
    0: 9, 1: 12, 2: 6, 3: 9, 8: 8, 9: 6, 10: 3, 18: 3, 22: 2, 23: 4, 16: 3, 19: 5, 32: 4, 37: 2,
    11: 6, 12: 4, 13: 4, 14: 4, 15: 5, 42: 2, 47: 32767,
    24: 3, 25: 3, 26: 3, 27: 1, 28: 3,
    21: 2, 33: 2, 44: 1, 20: 4, 35: 2,
}

# Kafka's protocol error codes (org.apache.kafka.common.protocol.Errors), -1 to 90.
ERRORS: dict[str, int] = {
    "UNKNOWN_SERVER_ERROR": -1, "NONE": 0, "OFFSET_OUT_OF_RANGE": 1, "CORRUPT_MESSAGE": 2,
    "UNKNOWN_TOPIC_OR_PARTITION": 3, "INVALID_FETCH_SIZE": 4, "LEADER_NOT_AVAILABLE": 5,
    "NOT_LEADER_OR_FOLLOWER": 6, "REQUEST_TIMED_OUT": 7, "BROKER_NOT_AVAILABLE": 8,
    "REPLICA_NOT_AVAILABLE": 9, "MESSAGE_TOO_LARGE": 10, "STALE_CONTROLLER_EPOCH": 11,
    "OFFSET_METADATA_TOO_LARGE": 12, "NETWORK_EXCEPTION": 13, "COORDINATOR_LOAD_IN_PROGRESS": 14,
    "COORDINATOR_NOT_AVAILABLE": 15, "NOT_COORDINATOR": 16, "INVALID_TOPIC_EXCEPTION": 17,
    "RECORD_LIST_TOO_LARGE": 18, "NOT_ENOUGH_REPLICAS": 19, "NOT_ENOUGH_REPLICAS_AFTER_APPEND": 20,
    "INVALID_REQUIRED_ACKS": 21, "ILLEGAL_GENERATION": 22, "INCONSISTENT_GROUP_PROTOCOL": 23,
    "INVALID_GROUP_ID": 24, "UNKNOWN_MEMBER_ID": 25, "INVALID_SESSION_TIMEOUT": 26,
    "REBALANCE_IN_PROGRESS": 27, "INVALID_COMMIT_OFFSET_SIZE": 28,
    "TOPIC_AUTHORIZATION_FAILED": 29, "GROUP_AUTHORIZATION_FAILED": 30,
    "CLUSTER_AUTHORIZATION_FAILED": 31, "INVALID_TIMESTAMP": 32, "UNSUPPORTED_SASL_MECHANISM": 33,
    "ILLEGAL_SASL_STATE": 34, "UNSUPPORTED_VERSION": 35, "TOPIC_ALREADY_EXISTS": 36,
    "INVALID_PARTITIONS": 37, "INVALID_REPLICATION_FACTOR": 38, "INVALID_REPLICA_ASSIGNMENT": 39,
    "INVALID_CONFIG": 40, "NOT_CONTROLLER": 41, "INVALID_REQUEST": 42,
    "UNSUPPORTED_FOR_MESSAGE_FORMAT": 43, "POLICY_VIOLATION": 44,
    "OUT_OF_ORDER_SEQUENCE_NUMBER": 45, "DUPLICATE_SEQUENCE_NUMBER": 46,
    "INVALID_PRODUCER_EPOCH": 47, "INVALID_TXN_STATE": 48, "INVALID_PRODUCER_ID_MAPPING": 49,
    "INVALID_TRANSACTION_TIMEOUT": 50, "CONCURRENT_TRANSACTIONS": 51,
    "TRANSACTION_COORDINATOR_FENCED": 52, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": 53,
    "SECURITY_DISABLED": 54, "OPERATION_NOT_ATTEMPTED": 55, "KAFKA_STORAGE_ERROR": 56,
    "LOG_DIR_NOT_FOUND": 57, "SASL_AUTHENTICATION_FAILED": 58, "UNKNOWN_PRODUCER_ID": 59,
    "REASSIGNMENT_IN_PROGRESS": 60, "DELEGATION_TOKEN_AUTH_DISABLED": 61,
    "DELEGATION_TOKEN_NOT_FOUND": 62, "DELEGATION_TOKEN_OWNER_MISMATCH": 63,
    "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED": 64, "DELEGATION_TOKEN_AUTHORIZATION_FAILED": 65,
    "DELEGATION_TOKEN_EXPIRED": 66, "INVALID_PRINCIPAL_TYPE": 67, "NON_EMPTY_GROUP": 68,
    "GROUP_ID_NOT_FOUND": 69, "FETCH_SESSION_ID_NOT_FOUND": 70, "INVALID_FETCH_SESSION_EPOCH": 71,
    "LISTENER_NOT_FOUND": 72, "TOPIC_DELETION_DISABLED": 73, "FENCED_LEADER_EPOCH": 74,
    "UNKNOWN_LEADER_EPOCH": 75, "UNSUPPORTED_COMPRESSION_TYPE": 76, "STALE_BROKER_EPOCH": 77,
    "OFFSET_NOT_AVAILABLE": 78, "MEMBER_ID_REQUIRED": 79, "PREFERRED_LEADER_NOT_AVAILABLE": 80,
    "GROUP_MAX_SIZE_REACHED": 81, "FENCED_INSTANCE_ID": 82, "ELIGIBLE_LEADERS_NOT_AVAILABLE": 83,
    "ELECTION_NOT_NEEDED": 84, "NO_REASSIGNMENT_IN_PROGRESS": 85, "GROUP_SUBSCRIBED_TO_TOPIC": 86,
    "INVALID_RECORD": 87, "UNSTABLE_OFFSET_COMMIT": 88, "THROTTLING_QUOTA_EXCEEDED": 89,
    "PRODUCER_FENCED": 90,
}
ERROR_NAMES: dict[int, str] = {code: name for name, code in ERRORS.items()}


# ---- the schema model: Kafka's message JSON, as Python data ----

MAX_VERSION = 0x7FFF          # "3+" means 3 up to Short.MAX_VALUE, as in Kafka's `Versions`
_NO_DEFAULT = object()

PRIMITIVES = ("int8", "int16", "int32", "int64", "uint16", "bool", "string", "bytes", "records")


def _versions(spec: str | None) -> tuple[int, int] | None:
    """Kafka's version-range syntax: "3+" -> (3, 32767), "2-4" -> (2, 4), "0" -> (0, 0)."""
    if spec is None:
        return None
    if spec.endswith("+"):
        return int(spec[:-1]), MAX_VERSION
    lo, _, hi = spec.partition("-")
    return int(lo), int(hi or lo)


@dataclass(frozen=True, eq=False)
class Field:
    """One field of a message or of an array element, as in the JSON's "fields" list.

    `type` is Kafka's type string: a primitive ("int32", "string", "records", ...), an array of
    primitives ("[]int32") or an array of structs ("[]TopicProduceData", whose element fields are
    `fields`). `versions` / `nullable` are inclusive (low, high) ranges; `default` is Kafka's
    default for the field, used when a version lacks it or a body omits it.
    """
    name: str
    type: str
    versions: tuple[int, int]
    nullable: tuple[int, int] | None
    default: Any
    fields: tuple["Field", ...] = ()

    def in_version(self, version: int) -> bool:
        return self.versions[0] <= version <= self.versions[1]

    def nullable_in(self, version: int) -> bool:
        return self.nullable is not None and self.nullable[0] <= version <= self.nullable[1]

    @cached_property   # these two are read per field of every message coded: computed once
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @cached_property
    def element_type(self) -> str | None:
        """For an array of primitives, the element type; None for structs and non-arrays."""
        return self.type[2:] if self.is_array and not self.fields else None

    def default_value(self) -> Any:
        """A fresh default (a new list for arrays, so callers may append to it)."""
        return list(self.default) if isinstance(self.default, list) else self.default


def F(name: str, type: str, versions: str, *fields: Field, nullable: str | None = None,
      default: Any = _NO_DEFAULT) -> Field:
    """Declare a field like a line of Kafka's JSON: F("acks", "int16", "0+").

    Defaults follow Kafka's MessageGenerator: 0 / false / "" / empty array / null records unless
    the JSON gives one ("default": "null" is written default=None here).
    """
    if type.startswith("[]") and bool(fields) == (type[2:] in PRIMITIVES):
        raise TypeError(f"{name}: an array of structs needs fields, an array of {type[2:]} none")
    if not type.startswith("[]") and (type not in PRIMITIVES or fields):
        raise TypeError(f"{name}: unknown type {type}, or fields on a primitive")
    if default is _NO_DEFAULT:
        default = ([] if type.startswith("[]") else
                   {"bool": False, "string": "", "bytes": b"", "records": None}.get(type, 0))
    return Field(name, type, _versions(versions), _versions(nullable), default, tuple(fields))


@dataclass(frozen=True, eq=False)
class Message:
    """One request or response definition (e.g. ProduceRequest.json), for `versions`."""
    name: str
    api_key: int
    kind: str                  # "request" or "response"
    versions: tuple[int, int]  # the versions implemented here (a subset of Kafka's validVersions)
    fields: tuple[Field, ...]


# ---- the definitions (transcribed from apache/kafka clients/src/main/resources/common/message) ----

_API_VERSIONS_REQUEST = ()  # v0-2 have no fields; v3 (flexible) adds client_software_name/version
_API_VERSIONS_RESPONSE = (
    F("error_code", "int16", "0+"),
    F("api_keys", "[]ApiVersion", "0+",
      F("api_key", "int16", "0+"),
      F("min_version", "int16", "0+"),
      F("max_version", "int16", "0+")),
    F("throttle_time_ms", "int32", "1+"),
)

_METADATA_REQUEST = (
    # v0: an empty array means all topics; v1+: null means all topics, empty means none.
    F("topics", "[]MetadataRequestTopic", "0+",
      F("name", "string", "0+"),
      nullable="1+"),
    F("allow_auto_topic_creation", "bool", "4+", default=True),
    F("include_cluster_authorized_operations", "bool", "8-10"),
    F("include_topic_authorized_operations", "bool", "8+"),
)
_METADATA_RESPONSE = (
    F("throttle_time_ms", "int32", "3+"),
    F("brokers", "[]MetadataResponseBroker", "0+",
      F("node_id", "int32", "0+"),
      F("host", "string", "0+"),
      F("port", "int32", "0+"),
      F("rack", "string", "1+", nullable="1+", default=None)),
    F("cluster_id", "string", "2+", nullable="2+", default=None),
    F("controller_id", "int32", "1+", default=-1),
    F("topics", "[]MetadataResponseTopic", "0+",
      F("error_code", "int16", "0+"),
      F("name", "string", "0+"),
      F("is_internal", "bool", "1+", default=False),
      F("partitions", "[]MetadataResponsePartition", "0+",
        F("error_code", "int16", "0+"),
        F("partition_index", "int32", "0+"),
        F("leader_id", "int32", "0+"),
        F("leader_epoch", "int32", "7+", default=-1),
        F("replica_nodes", "[]int32", "0+"),
        F("isr_nodes", "[]int32", "0+"),
        F("offline_replicas", "[]int32", "5+")),
      F("topic_authorized_operations", "int32", "8+", default=-2147483648)),
    F("cluster_authorized_operations", "int32", "8-10", default=-2147483648),
)

_PRODUCE_REQUEST = (
    F("transactional_id", "string", "3+", nullable="3+", default=None),
    F("acks", "int16", "0+"),
    F("timeout_ms", "int32", "0+"),
    F("topic_data", "[]TopicProduceData", "0+",
      F("name", "string", "0+"),
      F("partition_data", "[]PartitionProduceData", "0+",
        F("index", "int32", "0+"),
        F("records", "records", "0+", nullable="0+"))),
)
_PRODUCE_RESPONSE = (
    F("responses", "[]TopicProduceResponse", "0+",
      F("name", "string", "0+"),
      F("partition_responses", "[]PartitionProduceResponse", "0+",
        F("index", "int32", "0+"),
        F("error_code", "int16", "0+"),
        F("base_offset", "int64", "0+"),
        F("log_append_time_ms", "int64", "2+", default=-1),
        F("log_start_offset", "int64", "5+", default=-1),
        F("record_errors", "[]BatchIndexAndErrorMessage", "8+",
          F("batch_index", "int32", "8+"),
          F("batch_index_error_message", "string", "8+", nullable="8+", default=None)),
        F("error_message", "string", "8+", nullable="8+", default=None))),
    F("throttle_time_ms", "int32", "1+", default=0),
)

_FETCH_REQUEST = (
    F("replica_id", "int32", "0-14", default=-1),
    F("max_wait_ms", "int32", "0+"),
    F("min_bytes", "int32", "0+"),
    F("max_bytes", "int32", "3+", default=0x7FFFFFFF),
    F("isolation_level", "int8", "4+", default=0),
    F("session_id", "int32", "7+", default=0),
    F("session_epoch", "int32", "7+", default=-1),
    F("topics", "[]FetchTopic", "0+",
      F("topic", "string", "0-12"),
      F("partitions", "[]FetchPartition", "0+",
        F("partition", "int32", "0+"),
        F("current_leader_epoch", "int32", "9+", default=-1),
        F("fetch_offset", "int64", "0+"),
        F("log_start_offset", "int64", "5+", default=-1),
        F("partition_max_bytes", "int32", "0+"))),
    F("forgotten_topics_data", "[]ForgottenTopic", "7+",
      F("topic", "string", "7-12"),
      F("partitions", "[]int32", "7+")),
    F("rack_id", "string", "11+", default=""),
)
_FETCH_RESPONSE = (
    F("throttle_time_ms", "int32", "1+"),
    F("error_code", "int16", "7+"),
    F("session_id", "int32", "7+", default=0),
    F("responses", "[]FetchableTopicResponse", "0+",
      F("topic", "string", "0-12"),
      F("partitions", "[]PartitionData", "0+",
        F("partition_index", "int32", "0+"),
        F("error_code", "int16", "0+"),
        F("high_watermark", "int64", "0+"),
        F("last_stable_offset", "int64", "4+", default=-1),
        F("log_start_offset", "int64", "5+", default=-1),
        F("aborted_transactions", "[]AbortedTransaction", "4+",
          F("producer_id", "int64", "4+"),
          F("first_offset", "int64", "4+"),
          nullable="4+"),
        F("preferred_read_replica", "int32", "11+", default=-1),
        F("records", "records", "0+", nullable="0+"))),
)

_LIST_OFFSETS_REQUEST = (
    F("replica_id", "int32", "0+"),
    F("isolation_level", "int8", "2+"),
    F("topics", "[]ListOffsetsTopic", "0+",
      F("name", "string", "0+"),
      F("partitions", "[]ListOffsetsPartition", "0+",
        F("partition_index", "int32", "0+"),
        F("current_leader_epoch", "int32", "4+", default=-1),
        F("timestamp", "int64", "0+"))),
)
_LIST_OFFSETS_RESPONSE = (
    F("throttle_time_ms", "int32", "2+"),
    F("topics", "[]ListOffsetsTopicResponse", "0+",
      F("name", "string", "0+"),
      F("partitions", "[]ListOffsetsPartitionResponse", "0+",
        F("partition_index", "int32", "0+"),
        F("error_code", "int16", "0+"),
        F("timestamp", "int64", "1+", default=-1),
        F("offset", "int64", "1+", default=-1),
        F("leader_epoch", "int32", "4+", default=-1))),
)

_FIND_COORDINATOR_REQUEST = (
    F("key", "string", "0-3"),
    F("key_type", "int8", "1+", default=0),
)
_FIND_COORDINATOR_RESPONSE = (
    F("throttle_time_ms", "int32", "1+"),
    F("error_code", "int16", "0-3"),
    F("error_message", "string", "1-3", nullable="1-3"),
    F("node_id", "int32", "0-3"),
    F("host", "string", "0-3"),
    F("port", "int32", "0-3"),
)

_OFFSET_COMMIT_REQUEST = (
    F("group_id", "string", "0+"),
    F("generation_id_or_member_epoch", "int32", "1+", default=-1),
    F("member_id", "string", "1+"),
    F("group_instance_id", "string", "7+", nullable="7+", default=None),
    F("retention_time_ms", "int64", "2-4", default=-1),
    F("topics", "[]OffsetCommitRequestTopic", "0+",
      F("name", "string", "0+"),
      F("partitions", "[]OffsetCommitRequestPartition", "0+",
        F("partition_index", "int32", "0+"),
        F("committed_offset", "int64", "0+"),
        F("committed_leader_epoch", "int32", "6+", default=-1),
        F("committed_metadata", "string", "0+", nullable="0+"))),
)
_OFFSET_COMMIT_RESPONSE = (
    F("throttle_time_ms", "int32", "3+"),
    F("topics", "[]OffsetCommitResponseTopic", "0+",
      F("name", "string", "0+"),
      F("partitions", "[]OffsetCommitResponsePartition", "0+",
        F("partition_index", "int32", "0+"),
        F("error_code", "int16", "0+"))),
)

_OFFSET_FETCH_REQUEST = (
    F("group_id", "string", "0-7"),
    # v2+: null means all topics the group has offsets for.
    F("topics", "[]OffsetFetchRequestTopic", "0-7",
      F("name", "string", "0-7"),
      F("partition_indexes", "[]int32", "0-7"),
      nullable="2-7"),
)
_OFFSET_FETCH_RESPONSE = (
    F("throttle_time_ms", "int32", "3+"),
    F("topics", "[]OffsetFetchResponseTopic", "0-7",
      F("name", "string", "0-7"),
      F("partitions", "[]OffsetFetchResponsePartition", "0-7",
        F("partition_index", "int32", "0-7"),
        F("committed_offset", "int64", "0-7"),
        F("committed_leader_epoch", "int32", "5-7", default=-1),
        F("metadata", "string", "0-7", nullable="0-7"),
        F("error_code", "int16", "0-7"))),
    F("error_code", "int16", "2-7", default=0),
)

_INIT_PRODUCER_ID_REQUEST = (
    F("transactional_id", "string", "0+", nullable="0+"),
    F("transaction_timeout_ms", "int32", "0+"),
)
_INIT_PRODUCER_ID_RESPONSE = (
    F("throttle_time_ms", "int32", "0+"),
    F("error_code", "int16", "0+"),
    F("producer_id", "int64", "0+", default=-1),
    F("producer_epoch", "int16", "0+"),
)

_OFFSET_FOR_LEADER_EPOCH_REQUEST = (
    F("replica_id", "int32", "3+", default=-2),
    F("topics", "[]OffsetForLeaderTopic", "0+",
      F("topic", "string", "0+"),
      F("partitions", "[]OffsetForLeaderPartition", "0+",
        F("partition", "int32", "0+"),
        F("current_leader_epoch", "int32", "2+", default=-1),
        F("leader_epoch", "int32", "0+"))),
)
_OFFSET_FOR_LEADER_EPOCH_RESPONSE = (
    F("throttle_time_ms", "int32", "2+"),
    F("topics", "[]OffsetForLeaderTopicResult", "0+",
      F("topic", "string", "0+"),
      F("partitions", "[]EpochEndOffset", "0+",
        F("error_code", "int16", "0+"),
        F("partition", "int32", "0+"),
        F("leader_epoch", "int32", "1+", default=-1),
        F("end_offset", "int64", "0+", default=-1))),
)

# ---- the admin APIs (what Kafka's AdminClient sends for kafka-topics and kafka-consumer-groups)

_CREATE_TOPICS_REQUEST = (
    F("topics", "[]CreatableTopic", "0+",
      F("name", "string", "0+"),
      F("num_partitions", "int32", "0+"),         # -1 (v4+): the broker's num.partitions
      F("replication_factor", "int16", "0+"),     # -1 (v4+): default.replication.factor
      F("assignments", "[]CreatableReplicaAssignment", "0+",
        F("partition_index", "int32", "0+"),
        F("broker_ids", "[]int32", "0+")),
      F("configs", "[]CreatableTopicConfig", "0+",
        F("name", "string", "0+"),
        F("value", "string", "0+", nullable="0+"))),
    F("timeout_ms", "int32", "0+", default=60000),
    F("validate_only", "bool", "1+"),
)
_CREATE_TOPICS_RESPONSE = (
    F("throttle_time_ms", "int32", "2+"),
    F("topics", "[]CreatableTopicResult", "0+",
      F("name", "string", "0+"),
      F("error_code", "int16", "0+"),
      F("error_message", "string", "1+", nullable="1+")),
)

_CREATE_PARTITIONS_REQUEST = (
    F("topics", "[]CreatePartitionsTopic", "0+",
      F("name", "string", "0+"),
      F("count", "int32", "0+"),
      F("assignments", "[]CreatePartitionsAssignment", "0+",
        F("broker_ids", "[]int32", "0+"), nullable="0+", default=None)),
    F("timeout_ms", "int32", "0+"),
    F("validate_only", "bool", "0+"),
)
_CREATE_PARTITIONS_RESPONSE = (
    F("throttle_time_ms", "int32", "0+"),
    F("results", "[]CreatePartitionsTopicResult", "0+",
      F("name", "string", "0+"),
      F("error_code", "int16", "0+"),
      F("error_message", "string", "0+", nullable="0+", default=None)),
)

_DESCRIBE_CONFIGS_REQUEST = (
    F("resources", "[]DescribeConfigsResource", "0+",
      F("resource_type", "int8", "0+"),           # 2 topic, 4 broker
      F("resource_name", "string", "0+"),
      F("configuration_keys", "[]string", "0+", nullable="0+")),
    F("include_synonyms", "bool", "1+"),
    F("include_documentation", "bool", "3+"),
)
_DESCRIBE_CONFIGS_RESPONSE = (
    F("throttle_time_ms", "int32", "0+"),
    F("results", "[]DescribeConfigsResult", "0+",
      F("error_code", "int16", "0+"),
      F("error_message", "string", "0+", nullable="0+"),
      F("resource_type", "int8", "0+"),
      F("resource_name", "string", "0+"),
      F("configs", "[]DescribeConfigsResourceResult", "0+",
        F("name", "string", "0+"),
        F("value", "string", "0+", nullable="0+"),
        F("read_only", "bool", "0+"),
        F("config_source", "int8", "1+", default=-1),
        # (v0's is_default bool sat here; v1+ says DEFAULT_CONFIG in config_source instead)
        F("is_sensitive", "bool", "0+"),
        F("synonyms", "[]DescribeConfigsSynonym", "1+",
          F("name", "string", "1+"),
          F("value", "string", "1+", nullable="1+"),
          F("source", "int8", "1+")),
        F("config_type", "int8", "3+"),
        F("documentation", "string", "3+", nullable="3+"))),
)

_LIST_GROUPS_REQUEST = ()
_LIST_GROUPS_RESPONSE = (
    F("throttle_time_ms", "int32", "1+"),
    F("error_code", "int16", "0+"),
    F("groups", "[]ListedGroup", "0+",
      F("group_id", "string", "0+"),
      F("protocol_type", "string", "0+")),
)

# ---- the classic consumer group protocol (JoinGroup.json, SyncGroup.json, ... as above)

_JOIN_GROUP_REQUEST = (
    F("group_id", "string", "0+"),
    F("session_timeout_ms", "int32", "0+"),
    F("rebalance_timeout_ms", "int32", "1+", default=-1),   # v0: the session timeout is used
    F("member_id", "string", "0+"),
    F("group_instance_id", "string", "5+", nullable="5+", default=None),
    F("protocol_type", "string", "0+"),
    F("protocols", "[]JoinGroupRequestProtocol", "0+",
      F("name", "string", "0+"),
      F("metadata", "bytes", "0+")),
)
_JOIN_GROUP_RESPONSE = (
    F("throttle_time_ms", "int32", "2+"),
    F("error_code", "int16", "0+"),
    F("generation_id", "int32", "0+", default=-1),
    F("protocol_name", "string", "0+"),
    F("leader", "string", "0+"),
    F("member_id", "string", "0+"),
    F("members", "[]JoinGroupResponseMember", "0+",
      F("member_id", "string", "0+"),
      F("group_instance_id", "string", "5+", nullable="5+", default=None),
      F("metadata", "bytes", "0+")),
)
_SYNC_GROUP_REQUEST = (
    F("group_id", "string", "0+"),
    F("generation_id", "int32", "0+"),
    F("member_id", "string", "0+"),
    F("group_instance_id", "string", "3+", nullable="3+", default=None),
    F("assignments", "[]SyncGroupRequestAssignment", "0+",
      F("member_id", "string", "0+"),
      F("assignment", "bytes", "0+")),
)
_SYNC_GROUP_RESPONSE = (
    F("throttle_time_ms", "int32", "1+"),
    F("error_code", "int16", "0+"),
    F("assignment", "bytes", "0+"),
)
_HEARTBEAT_REQUEST = (
    F("group_id", "string", "0+"),
    F("generation_id", "int32", "0+"),
    F("member_id", "string", "0+"),
    F("group_instance_id", "string", "3+", nullable="3+", default=None),
)
_HEARTBEAT_RESPONSE = (
    F("throttle_time_ms", "int32", "1+"),
    F("error_code", "int16", "0+"),
)
_LEAVE_GROUP_REQUEST = (
    F("group_id", "string", "0+"),
    F("member_id", "string", "0-2"),
    F("members", "[]MemberIdentity", "3+",
      F("member_id", "string", "3+"),
      F("group_instance_id", "string", "3+", nullable="3+", default=None)),
)
_LEAVE_GROUP_RESPONSE = (
    F("throttle_time_ms", "int32", "1+"),
    F("error_code", "int16", "0+"),
    F("members", "[]MemberResponse", "3+",
      F("member_id", "string", "3+"),
      F("group_instance_id", "string", "3+", nullable="3+"),
      F("error_code", "int16", "3+")),
)
_DESCRIBE_GROUPS_REQUEST = (
    F("groups", "[]string", "0+"),
    F("include_authorized_operations", "bool", "3+"),
)
_DESCRIBE_GROUPS_RESPONSE = (
    F("throttle_time_ms", "int32", "1+"),
    F("groups", "[]DescribedGroup", "0+",
      F("error_code", "int16", "0+"),
      F("group_id", "string", "0+"),
      F("group_state", "string", "0+"),
      F("protocol_type", "string", "0+"),
      F("protocol_data", "string", "0+"),
      F("members", "[]DescribedGroupMember", "0+",
        F("member_id", "string", "0+"),
        F("group_instance_id", "string", "4+", nullable="4+", default=None),
        F("client_id", "string", "0+"),
        F("client_host", "string", "0+"),
        F("member_metadata", "bytes", "0+"),
        F("member_assignment", "bytes", "0+")),
      F("authorized_operations", "int32", "3+", default=-2147483648)),
)
_DELETE_GROUPS_REQUEST = (
    F("groups_names", "[]string", "0+"),
)
_DELETE_GROUPS_RESPONSE = (
    F("throttle_time_ms", "int32", "0+"),
    F("results", "[]DeletableGroupResult", "0+",
      F("group_id", "string", "0+"),
      F("error_code", "int16", "0+")),
)
_OFFSET_DELETE_REQUEST = (
    F("group_id", "string", "0+"),
    F("topics", "[]OffsetDeleteRequestTopic", "0+",
      F("name", "string", "0+"),
      F("partitions", "[]OffsetDeleteRequestPartition", "0+",
        F("partition_index", "int32", "0+"))),
)
_OFFSET_DELETE_RESPONSE = (
    F("error_code", "int16", "0+"),
    F("throttle_time_ms", "int32", "0+"),
    F("topics", "[]OffsetDeleteResponseTopic", "0+",
      F("name", "string", "0+"),
      F("partitions", "[]OffsetDeleteResponsePartition", "0+",
        F("partition_index", "int32", "0+"),
        F("error_code", "int16", "0+"))),
)

# ---- transactions (AddPartitionsToTxn.json, AddOffsetsToTxn.json, EndTxn.json, ...)

_ADD_PARTITIONS_TO_TXN_REQUEST = (
    F("v3_and_below_transactional_id", "string", "0-3"),
    F("v3_and_below_producer_id", "int64", "0-3"),
    F("v3_and_below_producer_epoch", "int16", "0-3"),
    F("v3_and_below_topics", "[]AddPartitionsToTxnTopic", "0-3",
      F("name", "string", "0+"),
      F("partitions", "[]int32", "0+")),
)
_ADD_PARTITIONS_TO_TXN_RESPONSE = (
    F("throttle_time_ms", "int32", "0+"),
    F("results_by_topic_v3_and_below", "[]AddPartitionsToTxnTopicResult", "0-3",
      F("name", "string", "0+"),
      F("results_by_partition", "[]AddPartitionsToTxnPartitionResult", "0+",
        F("partition_index", "int32", "0+"),
        F("partition_error_code", "int16", "0+"))),
)
_ADD_OFFSETS_TO_TXN_REQUEST = (
    F("transactional_id", "string", "0+"),
    F("producer_id", "int64", "0+"),
    F("producer_epoch", "int16", "0+"),
    F("group_id", "string", "0+"),
)
_ADD_OFFSETS_TO_TXN_RESPONSE = (
    F("throttle_time_ms", "int32", "0+"),
    F("error_code", "int16", "0+"),
)
_END_TXN_REQUEST = (
    F("transactional_id", "string", "0+"),
    F("producer_id", "int64", "0+"),
    F("producer_epoch", "int16", "0+"),
    F("committed", "bool", "0+"),
)
_END_TXN_RESPONSE = (
    F("throttle_time_ms", "int32", "0+"),
    F("error_code", "int16", "0+"),
)
_WRITE_TXN_MARKERS_REQUEST = (
    F("markers", "[]WritableTxnMarker", "0+",
      F("producer_id", "int64", "0+"),
      F("producer_epoch", "int16", "0+"),
      F("transaction_result", "bool", "0+"),
      F("topics", "[]WritableTxnMarkerTopic", "0+",
        F("name", "string", "0+"),
        F("partition_indexes", "[]int32", "0+")),
      F("coordinator_epoch", "int32", "0+")),
)
_WRITE_TXN_MARKERS_RESPONSE = (
    F("markers", "[]WritableTxnMarkerResult", "0+",
      F("producer_id", "int64", "0+"),
      F("topics", "[]WritableTxnMarkerTopicResult", "0+",
        F("name", "string", "0+"),
        F("partitions", "[]WritableTxnMarkerPartitionResult", "0+",
          F("partition_index", "int32", "0+"),
          F("error_code", "int16", "0+")))),
)
_TXN_OFFSET_COMMIT_REQUEST = (
    F("transactional_id", "string", "0+"),
    F("group_id", "string", "0+"),
    F("producer_id", "int64", "0+"),
    F("producer_epoch", "int16", "0+"),
    F("topics", "[]TxnOffsetCommitRequestTopic", "0+",
      F("name", "string", "0+"),
      F("partitions", "[]TxnOffsetCommitRequestPartition", "0+",
        F("partition_index", "int32", "0+"),
        F("committed_offset", "int64", "0+"),
        F("committed_leader_epoch", "int32", "2+", default=-1),
        F("committed_metadata", "string", "0+", nullable="0+"))),
)
_TXN_OFFSET_COMMIT_RESPONSE = (
    F("throttle_time_ms", "int32", "0+"),
    F("topics", "[]TxnOffsetCommitResponseTopic", "0+",
      F("name", "string", "0+"),
      F("partitions", "[]TxnOffsetCommitResponsePartition", "0+",
        F("partition_index", "int32", "0+"),
        F("error_code", "int16", "0+"))),
)

# ---- what AdminClient.delete_records / alter_configs / incremental_alter_configs / delete_topics send

_DELETE_RECORDS_REQUEST = (
    F("topics", "[]DeleteRecordsTopic", "0+",
      F("name", "string", "0+"),
      F("partitions", "[]DeleteRecordsPartition", "0+",
        F("partition_index", "int32", "0+"),
        F("offset", "int64", "0+"))),             # -1: the high watermark
    F("timeout_ms", "int32", "0+"),
)
_DELETE_RECORDS_RESPONSE = (
    F("throttle_time_ms", "int32", "0+"),
    F("topics", "[]DeleteRecordsTopicResult", "0+",
      F("name", "string", "0+"),
      F("partitions", "[]DeleteRecordsPartitionResult", "0+",
        F("partition_index", "int32", "0+"),
        F("low_watermark", "int64", "0+"),
        F("error_code", "int16", "0+"))),
)

# ---- what AdminClient.describe_log_dirs sends (kafka-log-dirs.sh --describe)

_DESCRIBE_LOG_DIRS_REQUEST = (
    F("topics", "[]DescribableLogDirTopic", "0+",
      F("topic", "string", "0+"),
      F("partitions", "[]int32", "0+"),
      nullable="0+"),                                  # null: every partition
)
_DESCRIBE_LOG_DIRS_RESPONSE = (
    F("throttle_time_ms", "int32", "0+"),
    F("results", "[]DescribeLogDirsResult", "0+",
      F("error_code", "int16", "0+"),
      F("log_dir", "string", "0+"),
      F("topics", "[]DescribeLogDirsTopic", "0+",
        F("name", "string", "0+"),
        F("partitions", "[]DescribeLogDirsPartition", "0+",
          F("partition_index", "int32", "0+"),
          F("partition_size", "int64", "0+"),
          F("offset_lag", "int64", "0+"),
          F("is_future_key", "bool", "0+")))),
)


def _alter_configs_request(*operation: Field) -> tuple:
    """AlterConfigsRequest, and IncrementalAlterConfigsRequest with its config_operation field."""
    return (
        F("resources", "[]AlterConfigsResource", "0+",
          F("resource_type", "int8", "0+"),
          F("resource_name", "string", "0+"),
          F("configs", "[]AlterableConfig", "0+",
            F("name", "string", "0+"),
            *operation,
            F("value", "string", "0+", nullable="0+"))),
        F("validate_only", "bool", "0+"),
    )


_ALTER_CONFIGS_REQUEST = _alter_configs_request()
_ALTER_CONFIGS_RESPONSE = (
    F("throttle_time_ms", "int32", "0+"),
    F("responses", "[]AlterConfigsResourceResponse", "0+",
      F("error_code", "int16", "0+"),
      F("error_message", "string", "0+", nullable="0+"),
      F("resource_type", "int8", "0+"),
      F("resource_name", "string", "0+")),
)
# config_operation: 0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT
_INCREMENTAL_ALTER_CONFIGS_REQUEST = _alter_configs_request(F("config_operation", "int8", "0+"))
_INCREMENTAL_ALTER_CONFIGS_RESPONSE = _ALTER_CONFIGS_RESPONSE

_DELETE_TOPICS_REQUEST = (
    F("topic_names", "[]string", "0-5"),          # (v6+ names topics by id too)
    F("timeout_ms", "int32", "0+"),
)
_DELETE_TOPICS_RESPONSE = (
    F("throttle_time_ms", "int32", "1+"),
    F("responses", "[]DeletableTopicResult", "0+",
      F("name", "string", "0+"),
      F("error_code", "int16", "0+")),
)

_DEFINITIONS = {
    "Produce": (_PRODUCE_REQUEST, _PRODUCE_RESPONSE),
    "Fetch": (_FETCH_REQUEST, _FETCH_RESPONSE),
    "ListOffsets": (_LIST_OFFSETS_REQUEST, _LIST_OFFSETS_RESPONSE),
    "Metadata": (_METADATA_REQUEST, _METADATA_RESPONSE),
    "OffsetCommit": (_OFFSET_COMMIT_REQUEST, _OFFSET_COMMIT_RESPONSE),
    "OffsetFetch": (_OFFSET_FETCH_REQUEST, _OFFSET_FETCH_RESPONSE),
    "FindCoordinator": (_FIND_COORDINATOR_REQUEST, _FIND_COORDINATOR_RESPONSE),
    "ApiVersions": (_API_VERSIONS_REQUEST, _API_VERSIONS_RESPONSE),
    "InitProducerId": (_INIT_PRODUCER_ID_REQUEST, _INIT_PRODUCER_ID_RESPONSE),
    "OffsetForLeaderEpoch": (_OFFSET_FOR_LEADER_EPOCH_REQUEST, _OFFSET_FOR_LEADER_EPOCH_RESPONSE),
    "ListGroups": (_LIST_GROUPS_REQUEST, _LIST_GROUPS_RESPONSE),
    "CreateTopics": (_CREATE_TOPICS_REQUEST, _CREATE_TOPICS_RESPONSE),
    "DescribeConfigs": (_DESCRIBE_CONFIGS_REQUEST, _DESCRIBE_CONFIGS_RESPONSE),
    "CreatePartitions": (_CREATE_PARTITIONS_REQUEST, _CREATE_PARTITIONS_RESPONSE),
    "JoinGroup": (_JOIN_GROUP_REQUEST, _JOIN_GROUP_RESPONSE),
    "SyncGroup": (_SYNC_GROUP_REQUEST, _SYNC_GROUP_RESPONSE),
    "Heartbeat": (_HEARTBEAT_REQUEST, _HEARTBEAT_RESPONSE),
    "LeaveGroup": (_LEAVE_GROUP_REQUEST, _LEAVE_GROUP_RESPONSE),
    "DescribeGroups": (_DESCRIBE_GROUPS_REQUEST, _DESCRIBE_GROUPS_RESPONSE),
    "DeleteGroups": (_DELETE_GROUPS_REQUEST, _DELETE_GROUPS_RESPONSE),
    "OffsetDelete": (_OFFSET_DELETE_REQUEST, _OFFSET_DELETE_RESPONSE),
    "AddPartitionsToTxn": (_ADD_PARTITIONS_TO_TXN_REQUEST, _ADD_PARTITIONS_TO_TXN_RESPONSE),
    "AddOffsetsToTxn": (_ADD_OFFSETS_TO_TXN_REQUEST, _ADD_OFFSETS_TO_TXN_RESPONSE),
    "EndTxn": (_END_TXN_REQUEST, _END_TXN_RESPONSE),
    "WriteTxnMarkers": (_WRITE_TXN_MARKERS_REQUEST, _WRITE_TXN_MARKERS_RESPONSE),
    "TxnOffsetCommit": (_TXN_OFFSET_COMMIT_REQUEST, _TXN_OFFSET_COMMIT_RESPONSE),
    "DeleteRecords": (_DELETE_RECORDS_REQUEST, _DELETE_RECORDS_RESPONSE),
    "AlterConfigs": (_ALTER_CONFIGS_REQUEST, _ALTER_CONFIGS_RESPONSE),
    "IncrementalAlterConfigs": (_INCREMENTAL_ALTER_CONFIGS_REQUEST, _INCREMENTAL_ALTER_CONFIGS_RESPONSE),
    "DeleteTopics": (_DELETE_TOPICS_REQUEST, _DELETE_TOPICS_RESPONSE),
    "DescribeLogDirs": (_DESCRIBE_LOG_DIRS_REQUEST, _DESCRIBE_LOG_DIRS_RESPONSE),
}
_KEY_OF = dict(API_KEYS, OffsetForLeaderEpoch=23)

# (api_key, "request" | "response") -> Message, named as Kafka names it (e.g. "ProduceRequest")
SCHEMAS: dict[tuple[int, str], Message] = {
    (_KEY_OF[name], kind): Message(name + kind.capitalize(), _KEY_OF[name], kind,
                                   SUPPORTED[_KEY_OF[name]], fields)
    for name, (request, response) in _DEFINITIONS.items()
    for kind, fields in (("request", request), ("response", response))
}

# The headers (RequestHeader.json v1, ResponseHeader.json v0).
REQUEST_HEADER = Message("RequestHeader", -1, "header", (1, 2), (
    F("request_api_key", "int16", "0+"),
    F("request_api_version", "int16", "0+"),
    F("correlation_id", "int32", "0+"),
    # Always the classic int16-length string, even in flexible header v2 (so that any broker can
    # read the header of an ApiVersions request newer than it knows).
    F("client_id", "string", "1+", nullable="1+"),
))
RESPONSE_HEADER = Message("ResponseHeader", -1, "header", (0, 0), (
    F("correlation_id", "int32", "0+"),
))


# ---- primitive codecs ----

_INTS = {
    "int8": struct.Struct(">b"), "int16": struct.Struct(">h"), "int32": struct.Struct(">i"),
    "int64": struct.Struct(">q"), "uint16": struct.Struct(">H"),
}
_I16 = _INTS["int16"]
_I32 = _INTS["int32"]


class _Fault(Exception):
    """Internal: what went wrong, plus the field path collected while the walk unwinds."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what
        self.path: list[str | int] = []


def _path_text(path: list[str | int]) -> str:
    out = ""
    for part in reversed(path):
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


@lru_cache(maxsize=None)
def _plan(fields: tuple[Field, ...], version: int) -> tuple[tuple[Field, bool], ...]:
    """The fields a version carries, in wire order, each with its nullability in that version."""
    return tuple((f, f.nullable_in(version)) for f in fields if f.in_version(version))


@lru_cache(maxsize=None)
def _names(fields: tuple[Field, ...]) -> frozenset[str]:
    return frozenset(f.name for f in fields)


# ---- the encoder ----

class _Out:
    """Byte chunks under construction; file slices (objects with `.size`) become chunks of their own."""

    __slots__ = ("chunks", "buf", "allow_slices")

    def __init__(self, allow_slices: bool):
        self.chunks: list[bytes | object] = []
        self.buf = bytearray()
        self.allow_slices = allow_slices

    def slice(self, obj: Any) -> None:
        size = obj.size
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= 0x7FFFFFFF:
            raise _Fault(f"records slice has an invalid size {size!r}")
        self.buf += _I32.pack(size)
        if size:  # an empty slice is just its length: no zero-byte sendfile
            self.chunks.append(bytes(self.buf))
            self.chunks.append(obj)
            self.buf = bytearray()

    def mark(self) -> tuple:
        """Where encoding stands, for `rewind` (a miss drops what the compiled encoder wrote)."""
        return len(self.chunks), self.buf, len(self.buf)

    def rewind(self, mark: tuple) -> None:
        chunks, buf, size = mark
        del self.chunks[chunks:]
        del buf[size:]
        self.buf = buf

    def finish(self) -> list[bytes | object]:
        if self.buf or not self.chunks:
            self.chunks.append(bytes(self.buf))
        return self.chunks


def _encode_value(out: _Out, type_: str, value: Any, nullable: bool) -> None:
    buf = out.buf
    codec = _INTS.get(type_)
    if codec is not None:
        if not isinstance(value, int):
            raise _Fault(f"{type_} value must be an int, got {type(value).__name__} {value!r}")
        try:
            buf += codec.pack(value)
        except struct.error:
            raise _Fault(f"{value} does not fit in {type_}") from None
    elif type_ == "bool":
        if not isinstance(value, int):  # bool is an int subclass
            raise _Fault(f"bool value must be a bool, got {type(value).__name__} {value!r}")
        buf.append(1 if value else 0)
    elif value is None:
        if not nullable:
            raise _Fault(f"null is not allowed ({type_} is not nullable in this version)")
        buf += _I16.pack(-1) if type_ == "string" else _I32.pack(-1)
    elif type_ == "string":
        if not isinstance(value, str):
            raise _Fault(f"string value must be a str, got {type(value).__name__} {value!r}")
        data = value.encode("utf-8")
        if len(data) > 0x7FFF:
            raise _Fault(f"string of {len(data)} bytes is longer than 32767")
        buf += _I16.pack(len(data))
        buf += data
    elif isinstance(value, (bytes, bytearray, memoryview)):  # bytes, or records held in memory
        data = memoryview(value).cast("B")
        buf += _I32.pack(len(data))
        buf += data
    elif type_ == "records" and hasattr(value, "size"):
        if not out.allow_slices:
            raise _Fault("a records slice can only be encoded by encode_response")
        out.slice(value)
    else:
        raise _Fault(f"{type_} value must be bytes, got {type(value).__name__}")


def _encode_struct(out: _Out, fields: tuple[Field, ...], body: Any, version: int) -> None:
    if not isinstance(body, dict):
        raise _Fault(f"expected a dict, got {type(body).__name__}")
    unknown = body.keys() - _names(fields)
    if unknown:
        raise _Fault(f"unknown field(s) {sorted(unknown)}; known: {[f.name for f in fields]}")
    for field, nullable in _plan(fields, version):
        value = body.get(field.name, field.default)
        try:
            if not field.is_array:
                _encode_value(out, field.type, value, nullable)
            elif value is None:
                if not nullable:
                    raise _Fault("null is not allowed (array is not nullable in this version)")
                out.buf += _I32.pack(-1)
            else:
                if not isinstance(value, (list, tuple)):
                    raise _Fault(f"array value must be a list, got {type(value).__name__}")
                out.buf += _I32.pack(len(value))
                element_type = field.element_type
                for i, element in enumerate(value):
                    try:
                        if element_type is None:
                            _encode_struct(out, field.fields, element, version)
                        else:
                            _encode_value(out, element_type, element, False)
                    except _Fault as e:
                        e.path.append(i)
                        raise
        except _Fault as e:
            e.path.append(field.name)
            raise


def _encode(message: Message, version: int, body: dict, out: _Out) -> None:
    """Encode `body` into `out`: by the compiled encoder, or, when it misses, by the reference."""
    mark = out.mark()
    try:
        _compiled_encoder(message.fields, version)(out, body)
        return
    except _MISSES:
        out.rewind(mark)  # the reference starts again from the same place, with its own errors
    try:
        _encode_struct(out, message.fields, body, version)
    except _Fault as e:
        where = f" in {_path_text(e.path)}" if e.path else ""
        raise ProtocolError(f"cannot encode {message.name} v{version}{where}: {e.what}") from None


# ---- the decoder ----

def _truncated(buf, pos: int, n: int, what: str) -> _Fault:
    return _Fault(f"truncated: {what} needs {n} bytes at byte {pos}, only {max(len(buf) - pos, 0)} left")


def _decode_value(buf, pos: int, type_: str, nullable: bool) -> tuple[Any, int]:
    codec = _INTS.get(type_)
    if codec is not None:
        if pos + codec.size > len(buf):
            raise _truncated(buf, pos, codec.size, type_)
        return codec.unpack_from(buf, pos)[0], pos + codec.size
    if type_ == "bool":
        if pos >= len(buf):
            raise _truncated(buf, pos, 1, type_)
        return buf[pos] != 0, pos + 1
    start = pos
    length = _I16 if type_ == "string" else _I32       # bytes and records: int32 length
    if pos + length.size > len(buf):
        raise _truncated(buf, pos, length.size, f"{type_} length")
    n = length.unpack_from(buf, pos)[0]
    pos += length.size
    if n < 0:
        if n == -1 and nullable:
            return None, pos
        raise _Fault(f"{type_} length {n} at byte {start} " + (
            "means null, but the field is not nullable in this version" if n == -1
            else "cannot be negative"))
    if pos + n > len(buf):
        raise _truncated(buf, pos, n, f"{type_} of length {n}")
    if type_ == "string":
        try:
            return str(buf[pos:pos + n], "utf-8"), pos + n
        except UnicodeDecodeError as e:
            raise _Fault(f"string at byte {pos} is not valid UTF-8 ({e.reason})") from None
    if type_ == "records" and isinstance(buf, bytearray):
        # A request received into a bytearray (the broker's): its batches stay a view of it, so
        # the log can stamp offsets in place and write them without another copy.
        return memoryview(buf)[pos:pos + n], pos + n
    return bytes(buf[pos:pos + n]), pos + n


def _decode_struct(buf, pos: int, fields: tuple[Field, ...], version: int) -> tuple[dict, int]:
    body: dict[str, Any] = {}
    present = _plan(fields, version)
    for field, nullable in present:
        try:
            if not field.is_array:
                body[field.name], pos = _decode_value(buf, pos, field.type, nullable)
                continue
            if pos + 4 > len(buf):
                raise _truncated(buf, pos, 4, "array length")
            n = _I32.unpack_from(buf, pos)[0]
            pos += 4
            if n < 0:
                if n == -1 and nullable:
                    body[field.name] = None
                    continue
                raise _Fault(f"array length {n} at byte {pos - 4} " + (
                    "means null, but the array is not nullable in this version" if n == -1
                    else "cannot be negative"))
            if n > len(buf) - pos:  # every element takes at least one byte
                raise _Fault(f"truncated: array of {n} elements at byte {pos - 4}, "
                             f"only {len(buf) - pos} bytes left")
            items = []
            element_type = field.element_type
            for i in range(n):
                try:
                    if element_type is None:
                        item, pos = _decode_struct(buf, pos, field.fields, version)
                    else:
                        item, pos = _decode_value(buf, pos, element_type, False)
                except _Fault as e:
                    e.path.append(i)
                    raise
                items.append(item)
            body[field.name] = items
        except _Fault as e:
            e.path.append(field.name)
            raise
    if len(present) != len(fields):  # fields this version lacks: Kafka's defaults, in schema order
        body = {f.name: body[f.name] if f.name in body else f.default_value() for f in fields}
    return body, pos


def _decode(message: Message, version: int, frame, offset: int, whole: bool = True) -> tuple[dict, int]:
    """Decode a body: by the compiled decoder, or, when it misses, by the reference."""
    try:
        body, pos = _compiled_decoder(message.fields, version)(frame, offset)
        if pos == len(frame) or not whole:
            return body, pos
    except _MISSES:
        pass  # the reference decodes it again: the same result, or the error saying where
    try:
        body, pos = _decode_struct(frame, offset, message.fields, version)
    except _Fault as e:
        where = f" field {_path_text(e.path)}" if e.path else ""
        raise ProtocolError(f"{message.name} v{version}{where}: {e.what}") from None
    if whole and pos != len(frame):
        last = [f.name for f, _ in _plan(message.fields, version)]
        after = f"after the last field ({last[-1]})" if last else "after the (empty) body"
        raise ProtocolError(f"{message.name} v{version}: {len(frame) - pos} unexpected bytes "
                            f"{after} at byte {pos} of {len(frame)}")
    return body, pos


def _message(api_key: int, version: int, kind: str) -> Message:
    message = SCHEMAS.get((api_key, kind))
    if message is None:
        raise UnsupportedVersionError(f"unknown api key {api_key} ({kind}); "
                                      f"implemented: {sorted(SUPPORTED)}")
    lo, hi = message.versions
    if not (isinstance(version, int) and lo <= version <= hi):
        raise UnsupportedVersionError(f"{message.name} v{version} is not implemented "
                                      f"(versions {lo}-{hi})")
    return message


# ---- the compiled codec: a fast path in front of the encoder and decoder above ----
#
# `_encode_struct` / `_decode_struct` interpret a schema: for every value they look its type up,
# test it and call a helper, which costs the broker microseconds on every request. Here each
# (fields, version) plan is compiled once, from the same schemas, into a Python function made for
# it, much as Kafka's MessageGenerator turns the JSON into Java: a run of consecutive fixed-width
# fields is one struct.Struct call, dict keys are constants, an array of structs calls its
# element's own compiled function. `_compiled_decoder(fields, version).source` shows the code.
#
# The compiled functions know only the expected case. Wherever the reference would raise
# (truncation, a bad length, invalid UTF-8, a wrong type, an unknown key, an int out of range,
# ...) they give up, raising _Miss or letting a struct, Unicode or type error out; `_encode` /
# `_decode` then drop what they made and run the reference from the start, which returns the same
# result or raises its exact error. It is the pattern of the native record codec (kstore/_codec.c
# behind records._run_codec): a fast function that steps aside, one reference that owns the errors.

class _Miss(Exception):
    """Internal: the compiled codec met input it leaves to the reference (which will raise)."""


# What a compiled function may stop at; any of these sends the input to the reference. (_Fault
# comes from _Out.slice, which the compiled encoder shares with the reference.)
_MISSES = (_Miss, _Fault, struct.error, ValueError, TypeError)

# struct codes of the fixed-width types ("?" reads any nonzero byte as True, as Kafka does)
_FIXED = {"int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint16": "H", "bool": "?"}

_NULL_LENGTH = {"string": b"\xff\xff", "bytes": b"\xff\xff\xff\xff", "records": b"\xff\xff\xff\xff",
                "array": b"\xff\xff\xff\xff"}

# A string, bytes or records value of `n` bytes at `pos`, made as _decode_value makes it.
_SIZED_VALUE = {
    "string": 'str(buf[pos:pos + n], "utf-8")',
    "bytes": "bytes(buf[pos:pos + n])",
    # a request received into a bytearray keeps its batches as a view of it (see _decode_value)
    "records": ("memoryview(buf)[pos:pos + n] if isinstance(buf, bytearray) "
                "else bytes(buf[pos:pos + n])"),
}


def _all_ints(values) -> bool:
    """isinstance(v, int) for every v, as the reference tests each value. (struct.pack alone would
    also take objects with __index__, such as numpy integers, and anything at all for "?".)"""
    return all(map(int.__instancecheck__, values))


class _Source:
    """Python source under construction, as the template engine of "500 Lines or Less" builds it:
    lines at an indentation, and the objects (struct codecs, element functions, defaults) that the
    lines name."""

    def __init__(self):
        self.lines: list[str] = []
        self.depth = 1
        self.objects: dict[str, Any] = {"_Miss": _Miss, "_all_ints": _all_ints}
        self.names: dict[int, str] = {}

    def add(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    @contextmanager
    def block(self, header: str):
        self.add(header)
        self.depth += 1
        yield
        self.depth -= 1

    def name(self, obj: Any, hint: str) -> str:
        """The name under which the generated code reaches `obj`."""
        if id(obj) not in self.names:
            self.names[id(obj)] = name = f"_{hint}{len(self.names)}"
            self.objects[name] = obj
        return self.names[id(obj)]

    def function(self, signature: str, doc: str):
        source = f"def {signature}:\n    {doc!r}\n" + "\n".join(self.lines) + "\n"
        filename = f"<kstore.protocol: {doc}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace = dict(self.objects)
        exec(compile(source, filename, "exec"), namespace)
        function = namespace[signature.partition("(")[0]]
        function.source = source
        return function


def _wire_runs(plan: tuple[tuple[Field, bool], ...]) -> list[tuple[bool, list[tuple[Field, bool]]]]:
    """The plan cut into runs: (True, consecutive fixed-width fields) or (False, other fields)."""
    return [(fixed, list(run)) for fixed, run in groupby(plan, key=lambda fn: fn[0].type in _FIXED)]


def _describe(fields: tuple[Field, ...], version: int) -> str:
    names = [f.name for f in fields] or ["no fields"]
    return f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''} v{version}"


# -- decoding --

@lru_cache(maxsize=None)
def _compiled_decoder(fields: tuple[Field, ...], version: int):
    """`decode(buf, pos) -> (dict, pos)`: _decode_struct compiled for one plan (the fast path)."""
    src = _Source()
    variable = {f.name: f"v{i}" for i, f in enumerate(fields)}
    for fixed, run in _wire_runs(_plan(fields, version)):
        if fixed:
            _read_fixed(src, [variable[f.name] for f, _ in run], [f.type for f, _ in run])
        else:
            for field, nullable in run:
                _read_field(src, variable[field.name], field, nullable, version)
    # every field in schema order; those the version lacks at their defaults, as _decode_struct
    entries = []
    for f in fields:
        if f.in_version(version):
            value = variable[f.name]
        elif isinstance(f.default, list):
            value = f"list({src.name(f.default, 'default')})"  # a fresh list, as default_value()
        else:
            value = src.name(f.default, "default")
        entries.append(f"{f.name!r}: {value}")
    src.add(f"return {{{', '.join(entries)}}}, pos")
    return src.function("decode(buf, pos)", f"decode {_describe(fields, version)}")


def _read_fixed(src: _Source, targets: list[str], types: list[str]) -> None:
    codec = struct.Struct(">" + "".join(_FIXED[t] for t in types))
    src.add(f"{', '.join(targets)}{',' if len(targets) == 1 else ''} = "
            f"{src.name(codec.unpack_from, 'unpack')}(buf, pos)")
    src.add(f"pos += {codec.size}")


def _null_if_allowed(src: _Source, bad_length: str, length: str, target: str,
                     nullable: bool) -> None:
    """`if <bad length>:` a null where the version allows one (-1), else a miss."""
    with src.block(f"if {bad_length}:"):
        if nullable:
            src.add(f"if {length} != -1: raise _Miss")
            src.add(f"{target} = None")
        else:
            src.add("raise _Miss")


def _read_sized(src: _Source, target: str, type_: str, nullable: bool) -> None:
    """A string (int16 length) or bytes / records (int32 length)."""
    length = _I16 if type_ == "string" else _I32
    src.add(f"n, = {src.name(length.unpack_from, 'unpack')}(buf, pos)")
    src.add(f"pos += {length.size}")
    _null_if_allowed(src, "n < 0 or pos + n > len(buf)", "n", target, nullable)
    with src.block("else:"):
        src.add(f"{target} = {_SIZED_VALUE[type_]}")
        src.add("pos += n")


def _read_field(src: _Source, target: str, field: Field, nullable: bool, version: int) -> None:
    if not field.is_array:
        _read_sized(src, target, field.type, nullable)
        return
    src.add(f"count, = {src.name(_I32.unpack_from, 'unpack')}(buf, pos)")
    src.add("pos += 4")
    # as _decode_struct: every element takes at least one byte, so a count above the bytes left
    # is refused before any element is read
    _null_if_allowed(src, "count < 0 or count > len(buf) - pos", "count", target, nullable)
    with src.block("else:"):
        element = field.element_type
        if element is None:
            decode = src.name(_compiled_decoder(field.fields, version), "decode")
            src.add(f"{target} = []")
            with src.block("for _ in range(count):"):
                src.add(f"item, pos = {decode}(buf, pos)")
                src.add(f"{target}.append(item)")
        elif element in _FIXED:   # all the elements in one call
            unpack = src.name(struct.unpack_from, "unpack_from")
            src.add(f"{target} = list({unpack}('>%d{_FIXED[element]}' % count, buf, pos))")
            src.add(f"pos += count * {struct.calcsize('>' + _FIXED[element])}")
        else:
            src.add(f"{target} = []")
            with src.block("for _ in range(count):"):
                _read_sized(src, "item", element, False)
                src.add(f"{target}.append(item)")


# -- encoding --

@lru_cache(maxsize=None)
def _compiled_encoder(fields: tuple[Field, ...], version: int):
    """`encode(out, body)`: _encode_struct compiled for one plan (the fast path)."""
    plan = _plan(fields, version)
    src = _Source()
    # A dict with as many keys as this version has fields is most likely just those fields: it is
    # read as it is. Any other body, or one where that fails, goes through complete(), which
    # misses where the reference refuses the keys, and fills in the defaults of those missing.
    complete = src.name(_completer(fields, plan), "complete")
    with src.block(f"if body.__class__ is not dict or len(body) != {len(plan)}:"):
        src.add(f"body = {complete}(body)")
    variable = {field.name: f"v{i}" for i, (field, _) in enumerate(plan)}
    if plan:
        values = ", ".join(variable.values())
        take = src.name(itemgetter(*variable), "take")   # a tuple of values (or one value)
        with src.block("try:"):
            src.add(f"{values} = {take}(body)")
        with src.block("except KeyError:  # a key of another version in place of one of this"):
            src.add(f"{values} = {take}({complete}(body))")
    src.add("buf = out.buf")
    for fixed, run in _wire_runs(plan):
        if fixed:
            _write_fixed(src, [variable[f.name] for f, _ in run], [f.type for f, _ in run])
        else:
            for field, nullable in run:
                _write_field(src, variable[field.name], field, nullable, version)
    return src.function("encode(out, body)", f"encode {_describe(fields, version)}")


def _completer(fields: tuple[Field, ...], plan: tuple[tuple[Field, bool], ...]):
    known = _names(fields)
    defaults = {f.name: f.default for f, _ in plan}

    def complete(body: Any) -> dict:
        """`body` with the fields it omits at their defaults (body.get(name, default) in
        _encode_struct); a miss for anything but a plain dict of known keys."""
        if body.__class__ is not dict or not known.issuperset(body):
            raise _Miss
        return {**defaults, **body}
    return complete


def _write_fixed(src: _Source, values: list[str], types: list[str]) -> None:
    codec = struct.Struct(">" + "".join(_FIXED[t] for t in types))
    # the common case costs a class test; bools in int fields, IntEnums, ... are checked properly
    unusual = " or ".join(f"{v}.__class__ is not {'bool' if t == 'bool' else 'int'}"
                          for v, t in zip(values, types))
    as_tuple = f"({', '.join(values)}{',' if len(values) == 1 else ''})"
    src.add(f"if ({unusual}) and not _all_ints({as_tuple}): raise _Miss")
    # an int out of range: struct.error, a miss
    src.add(f"buf += {src.name(codec.pack, 'pack')}({', '.join(values)})")


def _null_or_miss(src: _Source, value: str, nullable: bool, kind: str) -> None:
    """The branches after the expected types: a null (-1) where the version allows one, else
    a miss."""
    if nullable:
        with src.block(f"elif {value} is None:"):
            src.add(f"buf += {_NULL_LENGTH[kind]!r}")
    with src.block("else:"):
        src.add("raise _Miss")


def _write_sized(src: _Source, value: str, type_: str, nullable: bool) -> None:
    """A string (int16 length) or bytes / records (int32 length, or a file slice for records)."""
    if type_ == "string":
        with src.block(f"if isinstance({value}, str):"):
            src.add(f'data = {value}.encode("utf-8")')
            src.add("if len(data) > 0x7FFF: raise _Miss")
            src.add(f"buf += {src.name(_I16.pack, 'pack')}(len(data))")
            src.add("buf += data")
        _null_or_miss(src, value, nullable, type_)
        return
    pack_length = src.name(_I32.pack, "pack")
    with src.block(f"if {value}.__class__ is bytes:"):
        src.add(f"buf += {pack_length}(len({value}))")
        src.add(f"buf += {value}")
    with src.block(f"elif isinstance({value}, (bytes, bytearray, memoryview)):"):
        src.add(f'data = memoryview({value}).cast("B")')
        src.add(f"buf += {pack_length}(len(data))")
        src.add("buf += data")
    if type_ == "records":   # a file slice: a chunk of its own (out.slice checks its size)
        with src.block(f"elif out.allow_slices and hasattr({value}, 'size'):"):
            src.add(f"out.slice({value})")
            src.add("buf = out.buf")
    _null_or_miss(src, value, nullable, type_)


def _write_field(src: _Source, value: str, field: Field, nullable: bool, version: int) -> None:
    if not field.is_array:
        _write_sized(src, value, field.type, nullable)
        return
    with src.block(f"if isinstance({value}, (list, tuple)):"):
        src.add(f"buf += {src.name(_I32.pack, 'pack')}(len({value}))")
        element = field.element_type
        if element is None:
            encode = src.name(_compiled_encoder(field.fields, version), "encode")
            with src.block(f"for item in {value}:"):
                src.add(f"{encode}(out, item)")
            src.add("buf = out.buf   # a records slice in an element starts a new chunk")
        elif element in _FIXED:   # all the elements in one call
            src.add(f"if not _all_ints({value}): raise _Miss")
            pack = src.name(struct.pack, "pack")
            src.add(f"buf += {pack}('>%d{_FIXED[element]}' % len({value}), *{value})")
        else:
            with src.block(f"for item in {value}:"):
                _write_sized(src, "item", element, False)
    _null_or_miss(src, value, nullable, "array")


# ---- varints (only to skip the tagged-field section of a flexible request header) ----

def _read_uvarint(buf, pos: int, what: str) -> tuple[int, int]:
    value = shift = 0
    for _ in range(5):
        if pos >= len(buf):
            raise _truncated(buf, pos, 1, what)
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
    raise _Fault(f"{what}: unsigned varint longer than 5 bytes at byte {pos - 5}")


# ---- the public interface ----

@dataclass
class RequestHeader:
    """Kafka's RequestHeaderData (v1, or v2 with its tagged fields skipped)."""
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int  # bytes the header took: the body starts at frame[size]


def decode_request_header(frame: bytes) -> RequestHeader:
    """Read the header of a request frame (without its int32 size prefix).

    Header v1 is api_key, api_version, correlation_id, client_id. For an API's flexible versions
    (FLEXIBLE_FROM) the header is v2 and ends in a tagged-field section, skipped here, so that a
    too-new ApiVersions request can still be answered. An unknown api key is read as header v1.
    """
    try:  # the compiled decoder reads header v1; a v2 header, or a miss, goes to the reference
        fields, pos = _compiled_decoder(REQUEST_HEADER.fields, 1)(frame, 0)
        api_key, api_version = fields["request_api_key"], fields["request_api_version"]
        if not (api_key in FLEXIBLE_FROM and api_version >= FLEXIBLE_FROM[api_key]):
            return RequestHeader(api_key, api_version, fields["correlation_id"],
                                 fields["client_id"], pos)
    except _MISSES:
        pass
    try:
        fields, pos = _decode_struct(frame, 0, REQUEST_HEADER.fields, 1)
        api_key, api_version = fields["request_api_key"], fields["request_api_version"]
        if api_key in FLEXIBLE_FROM and api_version >= FLEXIBLE_FROM[api_key]:
            count, pos = _read_uvarint(frame, pos, "tagged field count")
            for i in range(count):
                tag, pos = _read_uvarint(frame, pos, f"tag of tagged field {i}")
                size, pos = _read_uvarint(frame, pos, f"size of tagged field {tag}")
                if pos + size > len(frame):
                    raise _truncated(frame, pos, size, f"tagged field {tag}")
                pos += size
    except _Fault as e:
        where = f" field {_path_text(e.path)}" if e.path else ""
        raise ProtocolError(f"RequestHeader{where}: {e.what}") from None
    return RequestHeader(api_key, api_version, fields["correlation_id"], fields["client_id"], pos)


def decode_request(api_key: int, version: int, frame: bytes, offset: int) -> dict:
    """Decode the request body that starts at `offset` and must end exactly at the frame's end."""
    return _decode(_message(api_key, version, "request"), version, frame, offset)[0]


def encode_request(api_key: int, version: int, correlation_id: int, client_id: str | None,
                   body: dict) -> bytes:
    """Header v1 + body, without the int32 size prefix. Records must be bytes or None here."""
    return bytes(_encode_request(api_key, version, correlation_id, client_id, body,
                                 _Out(allow_slices=False)).buf)


def _encode_request(api_key: int, version: int, correlation_id: int, client_id: str | None,
                    body: dict, out: _Out) -> _Out:
    message = _message(api_key, version, "request")
    _encode(REQUEST_HEADER, 1, {"request_api_key": api_key, "request_api_version": version,
                                "correlation_id": correlation_id, "client_id": client_id}, out)
    _encode(message, version, body, out)
    return out


class RecordsBuffer:
    """Records a request carries as they are (`encode_request_chunks`): sent from their own
    buffer, not copied into the frame, as Kafka's producer hands its batches' ByteBuffers to the
    socket as they are (a gathering write)."""

    __slots__ = ("data", "size")

    def __init__(self, data) -> None:
        self.data = data
        self.size = len(data)


def encode_request_chunks(api_key: int, version: int, correlation_id: int, client_id: str | None,
                          body: dict) -> list:
    """`encode_request` as buffers to send one after the other (their bytes joined are the same
    frame): records given as `RecordsBuffer` stay buffers of their own."""
    out = _encode_request(api_key, version, correlation_id, client_id, body,
                          _Out(allow_slices=True))
    return [c.data if isinstance(c, RecordsBuffer) else c for c in out.finish()]


def encode_response(api_key: int, version: int, correlation_id: int, body: dict) -> list[bytes | object]:
    """Response header v0 + body, without the size prefix, as chunks for the network layer.

    Byte chunks are `bytes`; a `records` value with a `.size` (a file slice) is emitted as its own
    chunk right after the byte chunk that ends with its int32 length, and encoding continues in a
    new byte chunk. Without slices the result is a single bytes chunk. A slice of size 0 is written
    as its length only (no chunk). The total length is sum(len(bytes chunk)) + sum(slice.size).
    """
    message = _message(api_key, version, "response")
    out = _Out(allow_slices=True)
    _encode(RESPONSE_HEADER, 0, {"correlation_id": correlation_id}, out)
    _encode(message, version, body, out)
    return out.finish()


def decode_response(api_key: int, version: int, frame: bytes) -> tuple[int, dict]:
    """(correlation_id, body) of a response frame (without its size prefix).

    As Kafka's client does (ApiVersionsResponse.parse), an ApiVersions response that does not
    parse at the requested version is read again as v0: a broker answers a too-new ApiVersions
    request with a v0 body carrying UNSUPPORTED_VERSION.
    """
    message = _message(api_key, version, "response")
    header, pos = _decode(RESPONSE_HEADER, 0, frame, 0, whole=False)
    try:
        body = _decode(message, version, frame, pos)[0]
    except ProtocolError as error:
        if api_key != API_KEYS["ApiVersions"] or version == 0:
            raise
        try:
            body = _decode(message, 0, frame, pos)[0]
        except ProtocolError:
            raise error from None
        if body["error_code"] == 0:
            raise error from None
    return header["correlation_id"], body


def encode_api_versions_unsupported(correlation_id: int) -> bytes:
    """The answer to an ApiVersions request newer than v2: a v0 body, UNSUPPORTED_VERSION (35),
    listing every API implemented here (Kafka lists only ApiVersions' own range; clients read
    that entry and retry with its max version)."""
    body = {"error_code": ERRORS["UNSUPPORTED_VERSION"],
            "api_keys": [{"api_key": key, "min_version": lo, "max_version": hi}
                         for key, (lo, hi) in sorted(SUPPORTED.items())]}
    return encode_response(API_KEYS["ApiVersions"], 0, correlation_id, body)[0]


def default_body(api_key: int, version: int, kind: str) -> dict:
    """Every field of the message at its default (arrays empty), as `decode_*` would return it."""
    message = _message(api_key, version, kind)
    return {field.name: field.default_value() for field in message.fields}

"""kstore.protocol checked against independent implementations of Kafka's wire protocol.

Oracles:
* kafka-python 3.x's message classes (`kafka.protocol.producer`, `.consumer`, `.metadata`), which
  kafka-python generates at import time from Kafka's message JSON with its own codec;
* kafka-python's older hand-written `kafka.protocol.old` Struct classes (one per version, written
  from the protocol guide, not from the JSON), compared byte for byte and field by position;
* the bytes real clients send: librdkafka (confluent-kafka) and kafka-python connect to a loopback
  socket served only by kstore.protocol, negotiate ApiVersions and read Metadata from it.

For every supported API and version, in both directions, requests and responses: kafka-python
encodes -> kstore decodes, kstore encodes -> kafka-python decodes, and the two encoders produce
the same bytes. kstore->kstore round trips, nulls, empty arrays, records as bytes and as file
slices (chunk layout), malformed input and the too-new ApiVersions path are tested on their own.
"""

from __future__ import annotations

import socket
import struct
import threading
from io import BytesIO

import kafka.errors
import pytest
from kafka.protocol.consumer import (FetchRequest, FetchResponse, ListOffsetsRequest,
                                     ListOffsetsResponse, OffsetCommitRequest,
                                     OffsetCommitResponse, OffsetFetchRequest,
                                     OffsetFetchResponse, OffsetForLeaderEpochRequest,
                                     OffsetForLeaderEpochResponse)
from kafka.protocol.consumer import (HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
                                     JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
                                     OffsetDeleteRequest, OffsetDeleteResponse, SyncGroupRequest,
                                     SyncGroupResponse)
from kafka.protocol.admin import (DeleteGroupsRequest, DeleteGroupsResponse,
                                  DescribeGroupsRequest, DescribeGroupsResponse)
from kafka.protocol.admin import (AlterConfigsRequest, AlterConfigsResponse, DeleteRecordsRequest,
                                  DeleteRecordsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
                                  DescribeLogDirsRequest, DescribeLogDirsResponse,
                                  IncrementalAlterConfigsRequest,
                                  IncrementalAlterConfigsResponse)
from kafka.protocol.admin import (CreatePartitionsRequest, CreatePartitionsResponse,
                                  CreateTopicsRequest, CreateTopicsResponse,
                                  DescribeConfigsRequest, DescribeConfigsResponse,
                                  ListGroupsRequest, ListGroupsResponse)
from kafka.protocol.metadata import (ApiVersionsRequest, ApiVersionsResponse,
                                     FindCoordinatorRequest, FindCoordinatorResponse,
                                     MetadataRequest, MetadataResponse)
from kafka.protocol.old import (admin as old_admin, api_versions as old_api_versions, commit as old_commit,
                                fetch as old_fetch, find_coordinator as old_find_coordinator,
                                group as old_group,
                                init_producer_id as old_init_producer_id,
                                list_offsets as old_list_offsets, metadata as old_metadata,
                                offset_for_leader_epoch as old_offset_for_leader_epoch,
                                produce as old_produce)
from kafka.protocol.producer import (AddOffsetsToTxnRequest, AddOffsetsToTxnResponse,
                                     AddPartitionsToTxnRequest, AddPartitionsToTxnResponse,
                                     EndTxnRequest, EndTxnResponse, InitProducerIdRequest,
                                     InitProducerIdResponse, ProduceRequest, ProduceResponse,
                                     TxnOffsetCommitRequest, TxnOffsetCommitResponse,
                                     WriteTxnMarkersRequest, WriteTxnMarkersResponse)

from helpers import T0, records
from kstore import protocol as p
from kstore.file_records import FileRecords
from kstore.records import build_batch

# ---- the oracles, by api key ----

KP = {  # kafka-python's JSON-generated classes: (request, response)
    0: (ProduceRequest, ProduceResponse),
    1: (FetchRequest, FetchResponse),
    2: (ListOffsetsRequest, ListOffsetsResponse),
    3: (MetadataRequest, MetadataResponse),
    8: (OffsetCommitRequest, OffsetCommitResponse),
    9: (OffsetFetchRequest, OffsetFetchResponse),
    10: (FindCoordinatorRequest, FindCoordinatorResponse),
    18: (ApiVersionsRequest, ApiVersionsResponse),
    22: (InitProducerIdRequest, InitProducerIdResponse),
    23: (OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse),
    16: (ListGroupsRequest, ListGroupsResponse),
    19: (CreateTopicsRequest, CreateTopicsResponse),
    32: (DescribeConfigsRequest, DescribeConfigsResponse),
    37: (CreatePartitionsRequest, CreatePartitionsResponse),
    11: (JoinGroupRequest, JoinGroupResponse),
    12: (HeartbeatRequest, HeartbeatResponse),
    13: (LeaveGroupRequest, LeaveGroupResponse),
    14: (SyncGroupRequest, SyncGroupResponse),
    15: (DescribeGroupsRequest, DescribeGroupsResponse),
    42: (DeleteGroupsRequest, DeleteGroupsResponse),
    47: (OffsetDeleteRequest, OffsetDeleteResponse),
    24: (AddPartitionsToTxnRequest, AddPartitionsToTxnResponse),
    25: (AddOffsetsToTxnRequest, AddOffsetsToTxnResponse),
    26: (EndTxnRequest, EndTxnResponse),
    27: (WriteTxnMarkersRequest, WriteTxnMarkersResponse),
    28: (TxnOffsetCommitRequest, TxnOffsetCommitResponse),
    21: (DeleteRecordsRequest, DeleteRecordsResponse),
    33: (AlterConfigsRequest, AlterConfigsResponse),
    44: (IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse),
    20: (DeleteTopicsRequest, DeleteTopicsResponse),
    35: (DescribeLogDirsRequest, DescribeLogDirsResponse),
}
OLD = {  # kafka-python's hand-written Struct classes, lists indexed by version
    0: (old_produce.ProduceRequest, old_produce.ProduceResponse),
    1: (old_fetch.FetchRequest, old_fetch.FetchResponse),
    2: (old_list_offsets.ListOffsetsRequest, old_list_offsets.ListOffsetsResponse),
    3: (old_metadata.MetadataRequest, old_metadata.MetadataResponse),
    8: (old_commit.OffsetCommitRequest, old_commit.OffsetCommitResponse),
    9: (old_commit.OffsetFetchRequest, old_commit.OffsetFetchResponse),
    10: (old_find_coordinator.FindCoordinatorRequest, old_find_coordinator.FindCoordinatorResponse),
    18: (old_api_versions.ApiVersionsRequest, old_api_versions.ApiVersionsResponse),
    22: (old_init_producer_id.InitProducerIdRequest, old_init_producer_id.InitProducerIdResponse),
    23: (old_offset_for_leader_epoch.OffsetForLeaderEpochRequest,
         old_offset_for_leader_epoch.OffsetForLeaderEpochResponse),
    16: (old_admin.ListGroupsRequest, old_admin.ListGroupsResponse),
    19: (old_admin.CreateTopicsRequest, old_admin.CreateTopicsResponse),            # v0-v3 only
    32: (old_admin.DescribeConfigsRequest, old_admin.DescribeConfigsResponse),      # v0-v2 only
    37: (old_admin.CreatePartitionsRequest, old_admin.CreatePartitionsResponse),
    11: (old_group.JoinGroupRequest, old_group.JoinGroupResponse),
    12: (old_group.HeartbeatRequest, old_group.HeartbeatResponse),
    13: (old_group.LeaveGroupRequest, old_group.LeaveGroupResponse),
    14: (old_group.SyncGroupRequest, old_group.SyncGroupResponse),
    15: (old_admin.DescribeGroupsRequest, old_admin.DescribeGroupsResponse),      # v0-v3 only
    42: (old_admin.DeleteGroupsRequest, old_admin.DeleteGroupsResponse),
    # (no hand-written OffsetDelete)
}
KIND = {"request": 0, "response": 1}

# The table the brief fixes (and the server advertises).
EXPECTED_SUPPORTED = {18: (0, 2), 3: (0, 8), 0: (3, 8), 1: (4, 11), 2: (1, 5), 10: (0, 2),
                      8: (2, 7), 9: (1, 5), 22: (0, 1), 23: (0, 3),
                      16: (0, 2), 19: (2, 4), 32: (1, 3), 37: (0, 1),
                      11: (0, 5), 12: (0, 3), 13: (0, 3), 14: (0, 3), 15: (0, 4), 42: (0, 1),
                      47: (0, 0), 24: (0, 2), 25: (0, 2), 26: (0, 2), 27: (0, 0), 28: (0, 2),
                      21: (0, 1), 33: (0, 1), 44: (0, 0), 20: (1, 3), 35: (0, 1)}

CASES = [(key, v) for key, (lo, hi) in sorted(EXPECTED_SUPPORTED.items()) for v in range(lo, hi + 1)]
CASE_IDS = [f"{p.API_NAMES[k]}-v{v}" for k, v in CASES]
# The hand-written classes stop at CreateTopics v3 and DescribeConfigs v2.
OLD_CASES = [(k, v) for k, v in CASES if k in OLD and v < len(OLD[k][0])]
OLD_CASE_IDS = [f"{p.API_NAMES[k]}-v{v}" for k, v in OLD_CASES]
KINDS = ["request", "response"]

# ---- sample bodies: every field of every supported version, with values that stand out ----

BATCH = build_batch(records(3, size=20), base_offset=0)
BATCH2 = build_batch(records(2, start=3, ts=T0 + 10), base_offset=3)
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

SAMPLES = {
    0: ({"transactional_id": "tx-ü", "acks": -1, "timeout_ms": 30000,
         "topic_data": [
             {"name": "orders-ü€😀", "partition_data": [
                 {"index": 0, "records": BATCH}, {"index": 7, "records": b""},
                 {"index": 2, "records": None}]},
             {"name": "empty", "partition_data": []}]},
        {"responses": [
            {"name": "orders-ü€😀", "partition_responses": [
                {"index": 0, "error_code": 0, "base_offset": 1 << 40, "log_append_time_ms": T0,
                 "log_start_offset": 5,
                 "record_errors": [{"batch_index": 3, "batch_index_error_message": "bad ✗"},
                                   {"batch_index": -4, "batch_index_error_message": None}],
                 "error_message": "boom"},
                {"index": 1, "error_code": 6, "base_offset": -1, "log_append_time_ms": -1,
                 "log_start_offset": -1, "record_errors": [], "error_message": None}]},
            {"name": "empty", "partition_responses": []}],
         "throttle_time_ms": 12}),
    1: ({"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 52428800,
         "isolation_level": 1, "session_id": 77, "session_epoch": 3,
         "topics": [{"topic": "orders-ü", "partitions": [
             {"partition": 0, "current_leader_epoch": 3, "fetch_offset": 1 << 33,
              "log_start_offset": -1, "partition_max_bytes": 1048576},
             {"partition": 5, "current_leader_epoch": -1, "fetch_offset": 0,
              "log_start_offset": 17, "partition_max_bytes": 0}]},
             {"topic": "b", "partitions": []}],
         "forgotten_topics_data": [{"topic": "old", "partitions": [1, 2, -3]},
                                   {"topic": "none", "partitions": []}],
         "rack_id": "rack-1"},
        {"throttle_time_ms": 0, "error_code": 0, "session_id": 123,
         "responses": [{"topic": "orders-ü", "partitions": [
             {"partition_index": 0, "error_code": 0, "high_watermark": 100,
              "last_stable_offset": 99, "log_start_offset": 0,
              "aborted_transactions": [{"producer_id": 9, "first_offset": 50},
                                       {"producer_id": INT64_MAX, "first_offset": INT64_MIN}],
              "preferred_read_replica": -1, "records": BATCH + BATCH2},
             {"partition_index": 1, "error_code": 1, "high_watermark": -1,
              "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
              "preferred_read_replica": 2, "records": None},
             {"partition_index": 2, "error_code": 0, "high_watermark": 0,
              "last_stable_offset": 0, "log_start_offset": 0, "aborted_transactions": [],
              "preferred_read_replica": -1, "records": b""}]}]}),
    2: ({"replica_id": -1, "isolation_level": 1,
         "topics": [{"name": "t", "partitions": [
             {"partition_index": 0, "current_leader_epoch": 5, "timestamp": -2},
             {"partition_index": 1, "current_leader_epoch": -1, "timestamp": T0}]}]},
        {"throttle_time_ms": 1,
         "topics": [{"name": "t", "partitions": [
             {"partition_index": 0, "error_code": 0, "timestamp": -1, "offset": 42,
              "leader_epoch": 5},
             {"partition_index": 1, "error_code": 78, "timestamp": T0, "offset": -1,
              "leader_epoch": -1}]}]}),
    3: ({"topics": [{"name": "a"}, {"name": "b-ü"}], "allow_auto_topic_creation": False,
         "include_cluster_authorized_operations": True,
         "include_topic_authorized_operations": True},
        {"throttle_time_ms": 0,
         "brokers": [{"node_id": 1, "host": "127.0.0.1", "port": 9092, "rack": None},
                     {"node_id": 2, "host": "höst", "port": 65535, "rack": "r2"}],
         "cluster_id": "kstore-cluster", "controller_id": 1,
         "topics": [
             {"error_code": 0, "name": "orders", "is_internal": False, "partitions": [
                 {"error_code": 0, "partition_index": 0, "leader_id": 1, "leader_epoch": 4,
                  "replica_nodes": [1, 2], "isr_nodes": [1], "offline_replicas": [2]},
                 {"error_code": 5, "partition_index": 1, "leader_id": -1, "leader_epoch": -1,
                  "replica_nodes": [], "isr_nodes": [], "offline_replicas": []}],
              "topic_authorized_operations": -2147483648},
             {"error_code": 3, "name": "missing", "is_internal": True, "partitions": [],
              "topic_authorized_operations": 248}],
         "cluster_authorized_operations": 8}),
    8: ({"group_id": "group-ü", "generation_id_or_member_epoch": 4, "member_id": "m-1",
         "group_instance_id": "inst-1", "retention_time_ms": 86400000,
         "topics": [{"name": "t", "partitions": [
             {"partition_index": 0, "committed_offset": 42, "committed_leader_epoch": 3,
              "committed_metadata": "meta ✓"},
             {"partition_index": 1, "committed_offset": -1, "committed_leader_epoch": -1,
              "committed_metadata": None}]}]},
        {"throttle_time_ms": 3, "topics": [{"name": "t", "partitions": [
            {"partition_index": 0, "error_code": 0}, {"partition_index": 1, "error_code": 12}]}]}),
    9: ({"group_id": "group-ü", "topics": [{"name": "t", "partition_indexes": [0, 1, 2]},
                                           {"name": "u", "partition_indexes": []}]},
        {"throttle_time_ms": 0,
         "topics": [{"name": "t", "partitions": [
             {"partition_index": 0, "committed_offset": 42, "committed_leader_epoch": 3,
              "metadata": "m", "error_code": 0},
             {"partition_index": 1, "committed_offset": -1, "committed_leader_epoch": -1,
              "metadata": None, "error_code": 0}]}],
         "error_code": 16}),
    10: ({"key": "group-ü", "key_type": 1},
         {"throttle_time_ms": 9, "error_code": 15, "error_message": "not yet ⏳", "node_id": 1,
          "host": "localhost", "port": 9092}),
    18: ({},
         {"error_code": 0,
          "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi}
                       for k, (lo, hi) in sorted(EXPECTED_SUPPORTED.items())],
          "throttle_time_ms": 250}),
    22: ({"transactional_id": None, "transaction_timeout_ms": 2147483647},
         {"throttle_time_ms": 0, "error_code": 0, "producer_id": 1 << 62, "producer_epoch": -7}),
    23: ({"replica_id": 2, "topics": [{"topic": "t", "partitions": [
              {"partition": 0, "current_leader_epoch": 7, "leader_epoch": 6},
              {"partition": 3, "current_leader_epoch": -1, "leader_epoch": 0}]}]},
         {"throttle_time_ms": 4, "topics": [{"topic": "t", "partitions": [
             {"error_code": 0, "partition": 0, "leader_epoch": 6, "end_offset": 1234},
             {"error_code": 75, "partition": 3, "leader_epoch": -1, "end_offset": -1}]}]}),
    16: ({},
         {"throttle_time_ms": 6, "error_code": 0,
          "groups": [{"group_id": "group-ü", "protocol_type": ""},
                     {"group_id": "g2", "protocol_type": "consumer"}]}),
    19: ({"topics": [
              {"name": "orders-ü", "num_partitions": 3, "replication_factor": 2, "assignments": [],
               "configs": [{"name": "cleanup.policy", "value": "compact"},
                           {"name": "retention.ms", "value": None}]},
              {"name": "manual", "num_partitions": -1, "replication_factor": -1,
               "assignments": [{"partition_index": 0, "broker_ids": [1, 2]},
                               {"partition_index": 1, "broker_ids": []}],
               "configs": []}],
          "timeout_ms": 30000, "validate_only": True},
         {"throttle_time_ms": 7, "topics": [
             {"name": "orders-ü", "error_code": 0, "error_message": None},
             {"name": "manual", "error_code": 36, "error_message": "Topic 'manual' already exists."}]}),
    32: ({"resources": [{"resource_type": 2, "resource_name": "orders-ü",
                         "configuration_keys": ["retention.ms", "cleanup.policy"]},
                        {"resource_type": 4, "resource_name": "0", "configuration_keys": None}],
          "include_synonyms": True, "include_documentation": True},
         {"throttle_time_ms": 8, "results": [
             {"error_code": 0, "error_message": None, "resource_type": 2, "resource_name": "orders-ü",
              "configs": [
                  {"name": "retention.ms", "value": "-1", "read_only": False, "config_source": 1,
                   "is_sensitive": False,
                   "synonyms": [{"name": "retention.ms", "value": "-1", "source": 1},
                                {"name": "log.retention.ms", "value": None, "source": 5}],
                   "config_type": 5, "documentation": "Delete segments ✂"},
                  {"name": "secret", "value": None, "read_only": True, "config_source": 5,
                   "is_sensitive": True, "synonyms": [],
                   "config_type": 9, "documentation": None}]},
             {"error_code": 3, "error_message": "no such topic", "resource_type": 2,
              "resource_name": "gone", "configs": []}]}),
    37: ({"topics": [{"name": "orders-ü", "count": 6, "assignments": None},
                     {"name": "placed", "count": 3,
                      "assignments": [{"broker_ids": [1, 2]}, {"broker_ids": [2, 0]}]}],
          "timeout_ms": 15000, "validate_only": False},
         {"throttle_time_ms": 9, "results": [
             {"name": "orders-ü", "error_code": 0, "error_message": None},
             {"name": "placed", "error_code": 37, "error_message": "3 is not an increase"}]}),
}

# the classic consumer group protocol (issue 14)
SUBSCRIPTION = b"\x00\x00\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff"
SAMPLES.update({
    11: ({"group_id": "grp-ü", "session_timeout_ms": 45000, "rebalance_timeout_ms": 300000,
          "member_id": "m-1", "group_instance_id": "inst-€", "protocol_type": "consumer",
          "protocols": [{"name": "range", "metadata": SUBSCRIPTION},
                        {"name": "cooperative-sticky", "metadata": b""}]},
         {"throttle_time_ms": 3, "error_code": 79, "generation_id": 7, "protocol_name": "range",
          "leader": "m-1", "member_id": "m-2",
          "members": [{"member_id": "m-1", "group_instance_id": None, "metadata": SUBSCRIPTION},
                      {"member_id": "m-2", "group_instance_id": "inst-€", "metadata": b""}]}),
    12: ({"group_id": "grp-ü", "generation_id": 7, "member_id": "m-1", "group_instance_id": "i"},
         {"throttle_time_ms": 4, "error_code": 27}),
    13: ({"group_id": "grp-ü", "member_id": "m-1",
          "members": [{"member_id": "m-1", "group_instance_id": None},
                      {"member_id": "", "group_instance_id": "inst-€"}]},
         {"throttle_time_ms": 5, "error_code": 0,
          "members": [{"member_id": "m-1", "group_instance_id": None, "error_code": 25},
                      {"member_id": "m-9", "group_instance_id": "inst-€", "error_code": 82}]}),
    14: ({"group_id": "grp-ü", "generation_id": 7, "member_id": "m-1", "group_instance_id": None,
          "assignments": [{"member_id": "m-1", "assignment": b"\x00\x00abc"},
                          {"member_id": "m-2", "assignment": b""}]},
         {"throttle_time_ms": 6, "error_code": 22, "assignment": b"\x00\x01\xff"}),
    15: ({"groups": ["grp-ü", ""], "include_authorized_operations": True},
         {"throttle_time_ms": 7, "groups": [
             {"error_code": 0, "group_id": "grp-ü", "group_state": "Stable",
              "protocol_type": "consumer", "protocol_data": "range",
              "members": [{"member_id": "m-1", "group_instance_id": "inst-€", "client_id": "c-1",
                           "client_host": "/127.0.0.1", "member_metadata": SUBSCRIPTION,
                           "member_assignment": b"\x00"}],
              "authorized_operations": -2147483648},
             {"error_code": 16, "group_id": "", "group_state": "Dead", "protocol_type": "",
              "protocol_data": "", "members": [], "authorized_operations": 0}]}),
    42: ({"groups_names": ["grp-ü", "other"]},
         {"throttle_time_ms": 8, "results": [{"group_id": "grp-ü", "error_code": 68},
                                             {"group_id": "other", "error_code": 0}]}),
    47: ({"group_id": "grp-ü", "topics": [{"name": "t", "partitions": [{"partition_index": 0},
                                                                     {"partition_index": 3}]}]},
         {"error_code": 0, "throttle_time_ms": 9, "topics": [
             {"name": "t", "partitions": [{"partition_index": 0, "error_code": 86},
                                          {"partition_index": 3, "error_code": 0}]}]}),
})

# the transaction APIs
SAMPLES.update({
    24: ({"v3_and_below_transactional_id": "tx-ü", "v3_and_below_producer_id": 4000,
          "v3_and_below_producer_epoch": 3,
          "v3_and_below_topics": [{"name": "t", "partitions": [0, 2]}, {"name": "u", "partitions": []}]},
         {"throttle_time_ms": 5, "results_by_topic_v3_and_below": [
             {"name": "t", "results_by_partition": [{"partition_index": 0, "partition_error_code": 0},
                                                    {"partition_index": 2, "partition_error_code": 51}]}]}),
    25: ({"transactional_id": "tx-ü", "producer_id": 4000, "producer_epoch": 3, "group_id": "grp-€"},
         {"throttle_time_ms": 5, "error_code": 90}),
    26: ({"transactional_id": "tx-ü", "producer_id": 4000, "producer_epoch": 3, "committed": True},
         {"throttle_time_ms": 5, "error_code": 48}),
    27: ({"markers": [{"producer_id": 4000, "producer_epoch": 3, "transaction_result": False,
                       "topics": [{"name": "t", "partition_indexes": [1, 0]}], "coordinator_epoch": 7}]},
         {"markers": [{"producer_id": 4000, "topics": [{"name": "t", "partitions": [
             {"partition_index": 1, "error_code": 0}, {"partition_index": 0, "error_code": 6}]}]}]}),
    28: ({"transactional_id": "tx-ü", "group_id": "grp-€", "producer_id": 4000, "producer_epoch": 3,
          "topics": [{"name": "t", "partitions": [
              {"partition_index": 0, "committed_offset": 77, "committed_leader_epoch": 2,
               "committed_metadata": "m-😀"},
              {"partition_index": 1, "committed_offset": 5, "committed_leader_epoch": -1,
               "committed_metadata": None}]}]},
         {"throttle_time_ms": 5, "topics": [{"name": "t", "partitions": [
             {"partition_index": 0, "error_code": 0}, {"partition_index": 1, "error_code": 47}]}]}),
})


# ---- helpers over kafka-python's schema objects ----

# the admin requests that delete topics and records and change configs
ALTERED = {"throttle_time_ms": 5, "responses": [
    {"error_code": 0, "error_message": None, "resource_type": 2, "resource_name": "orders-ü"},
    {"error_code": 42, "error_message": "static ✗", "resource_type": 4, "resource_name": "0"}]}
SAMPLES.update({
    21: ({"topics": [{"name": "orders-ü", "partitions": [{"partition_index": 0, "offset": 1 << 40},
                                                         {"partition_index": 3, "offset": -1}]},
                     {"name": "none", "partitions": []}], "timeout_ms": 30000},
         {"throttle_time_ms": 2, "topics": [{"name": "orders-ü", "partitions": [
             {"partition_index": 0, "low_watermark": 1 << 40, "error_code": 0},
             {"partition_index": 3, "low_watermark": -1, "error_code": 44}]}]}),
    33: ({"resources": [{"resource_type": 2, "resource_name": "orders-ü", "configs": [
              {"name": "retention.ms", "value": "3600000"}, {"name": "segment.ms", "value": None}]},
                        {"resource_type": 4, "resource_name": "", "configs": []}],
          "validate_only": True}, ALTERED),
    44: ({"resources": [{"resource_type": 2, "resource_name": "orders-ü", "configs": [
              {"name": "cleanup.policy", "config_operation": 2, "value": "compact"},
              {"name": "retention.ms", "config_operation": 1, "value": None}]}],
          "validate_only": False}, ALTERED),
    20: ({"topic_names": ["orders-ü", "gone"], "timeout_ms": 30000},
         {"throttle_time_ms": 3, "responses": [{"name": "orders-ü", "error_code": 0},
                                               {"name": "gone", "error_code": 3}]}),
    35: ({"topics": [{"topic": "orders-ü", "partitions": [0, 7, -1]},
                     {"topic": "none", "partitions": []}]},
         {"throttle_time_ms": 4, "results": [
             {"error_code": 0, "log_dir": "/var/lib/kstore/lögs", "topics": [
                 {"name": "orders-ü", "partitions": [
                     {"partition_index": 0, "partition_size": 1 << 40, "offset_lag": 0,
                      "is_future_key": False},
                     {"partition_index": 7, "partition_size": 0, "offset_lag": 12,
                      "is_future_key": True}]},
                 {"name": "empty", "partitions": []}]},
             {"error_code": 57, "log_dir": "/bad", "topics": []}]}),
})

# kafka-python departs from Kafka's JSON in one place (MetadataResponse.json_patch): it renames
# TopicAuthorizedOperations and ClusterAuthorizedOperations to `authorized_operations`, of its own
# type "bitfield" (the int32 as a set of bit numbers; the "not requested" value, bit 31 alone, as
# None). The helpers translate between that and Kafka's int32 fields.
KP_BITFIELD_NAMES = ("topic_authorized_operations", "cluster_authorized_operations",
                     "authorized_operations")


def to_bits(value):
    bits = {i for i in range(32) if (value >> i) & 1}
    return None if bits == {31} else bits


def from_bits(bits):
    value = sum(1 << i for i in (bits if bits is not None else {31}))
    return value - (1 << 32) if value >= 1 << 31 else value


def kstore_name(kp_field, names):
    """The kstore field a kafka-python field stands for, among `names`."""
    if kp_field._json["type"] == "bitfield":
        (name,) = [n for n in KP_BITFIELD_NAMES if n in names]
        return name
    return kp_field.name


def kp_fields(struct, version):
    """kafka-python's fields of a struct that are on the wire in `version` (untagged)."""
    return [f for f in struct.fields.values()
            if f.for_version_q(version) and not f.tagged_field_q(version)]


def kp_build(data_class, struct, body, version):
    """A kafka-python object from a kstore-style dict (only the fields kafka-python says exist)."""
    kwargs = {}
    for f in kp_fields(struct, version):
        name = kstore_name(f, body)
        if name in body:
            value = body[name]
            if f.is_struct_array() and value is not None:
                value = [kp_build(f.data_class, f, e, version) for e in value]
            elif f._json["type"] == "bitfield":
                value = to_bits(value)
            kwargs[f.name] = value
    return data_class(version=version, **kwargs)


def kp_dict(obj, struct, version):
    """A kafka-python object as a dict of its on-the-wire fields."""
    out = {}
    for f in kp_fields(struct, version):
        value = getattr(obj, f.name)
        if f.is_struct_array() and value is not None:
            value = [kp_dict(e, f, version) for e in value]
        elif isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        out[f.name] = value
    return out


def project(body, struct, version):
    """A kstore dict reduced to the fields kafka-python puts on the wire in `version`."""
    out = {}
    for f in kp_fields(struct, version):
        value = body[kstore_name(f, body)]
        if f.is_struct_array() and value is not None:
            value = [project(e, f, version) for e in value]
        elif f._json["type"] == "bitfield":
            value = to_bits(value)
        out[f.name] = value
    return out


def as_tuples(body, fields, version):
    """A kstore dict as positional tuples, in kstore's field order."""
    out = []
    for f in fields:
        if f.in_version(version):
            value = body.get(f.name, f.default_value())
            if f.fields and value is not None:
                value = [as_tuples(e, f.fields, version) for e in value]
            out.append(value)
    return tuple(out)


def as_old_tuples(body, fields, version):
    """The same, shaped as kafka-python's hand-written Struct classes decode: they write an array of
    one-field structs as an array of that field (MetadataRequest topics) and the authorized
    operations as a BitField (a set of bit numbers)."""
    out = []
    for f in fields:
        if f.in_version(version):
            value = body.get(f.name, f.default_value())
            if f.fields and value is not None:
                value = [as_old_tuples(e, f.fields, version) for e in value]
                if sum(sub.in_version(version) for sub in f.fields) == 1:
                    value = [element for (element,) in value]
            elif f.name in KP_BITFIELD_NAMES:
                value = to_bits(value)
            out.append(value)
    return tuple(out)


def kp_request_bytes(api_key, version, body, correlation_id=11, client_id="kp-client"):
    request = kp_build(KP[api_key][0], KP[api_key][0]._struct, body, version)
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(header=True))


def kp_response_bytes(api_key, version, body, correlation_id=12):
    response = kp_build(KP[api_key][1], KP[api_key][1]._struct, body, version)
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True))


def joined(chunks):
    assert all(isinstance(c, bytes) for c in chunks), chunks
    return b"".join(chunks)


def check_defaults(decoded, fields, version):
    """Fields the version does not carry come back at Kafka's default, recursively."""
    for f in fields:
        if not f.in_version(version):
            assert decoded[f.name] == f.default_value(), f.name
        elif f.fields and decoded[f.name] is not None:
            for element in decoded[f.name]:
                check_defaults(element, f.fields, version)


# ---- the tables ----

def test_supported_versions_are_the_ones_the_broker_advertises():
    assert p.SUPPORTED == EXPECTED_SUPPORTED
    assert set(p.API_KEYS.values()) == set(p.SUPPORTED) == set(p.FLEXIBLE_FROM)
    assert p.API_KEYS == {"Produce": 0, "Fetch": 1, "ListOffsets": 2, "Metadata": 3,
                          "OffsetCommit": 8, "OffsetFetch": 9, "FindCoordinator": 10,
                          "ApiVersions": 18, "InitProducerId": 22, "OffsetsForLeaderEpoch": 23,
                          "ListGroups": 16, "CreateTopics": 19, "DescribeConfigs": 32,
                          "CreatePartitions": 37, "JoinGroup": 11, "Heartbeat": 12,
                          "LeaveGroup": 13, "SyncGroup": 14, "DescribeGroups": 15,
                          "DeleteGroups": 42, "OffsetDelete": 47, "AddPartitionsToTxn": 24,
                          "AddOffsetsToTxn": 25, "EndTxn": 26, "WriteTxnMarkers": 27,
                          "TxnOffsetCommit": 28, "DeleteRecords": 21, "AlterConfigs": 33,
                          "IncrementalAlterConfigs": 44, "DeleteTopics": 20,
                          "DescribeLogDirs": 35}
    assert p.API_NAMES == {key: name for name, key in p.API_KEYS.items()}


@pytest.mark.parametrize("api_key", sorted(EXPECTED_SUPPORTED), ids=lambda k: p.API_NAMES[k])
def test_flexible_versions_match_kafka_python_and_lie_above_the_supported_range(api_key):
    for cls in KP[api_key]:
        assert cls.API_KEY == api_key
        if cls._flexible_versions[0] < 0:    # OffsetDelete: no flexible version at all
            assert p.FLEXIBLE_FROM[api_key] > p.SUPPORTED[api_key][1]
            return
        assert cls._flexible_versions[0] == p.FLEXIBLE_FROM[api_key]
    assert p.SUPPORTED[api_key][1] == p.FLEXIBLE_FROM[api_key] - 1


# kafka-python keeps some pre-KIP names for the same codes.
KAFKA_PYTHON_ERROR_NAMES = {
    "UNKNOWN_SERVER_ERROR": "UNKNOWN", "NONE": "NO_ERROR",
    "NOT_LEADER_OR_FOLLOWER": "NOT_LEADER_FOR_PARTITION",
    "MESSAGE_TOO_LARGE": "MESSAGE_SIZE_TOO_LARGE", "INVALID_TOPIC_EXCEPTION": "INVALID_TOPIC",
    "INVALID_REPLICA_ASSIGNMENT": "INVALID_REPLICATION_ASSIGNMENT",
}


def test_error_codes_match_kafka_python_and_the_brief():
    for name, code in p.ERRORS.items():
        cls = kafka.errors.for_code(code)
        assert cls.errno == code, name
        assert cls.message == KAFKA_PYTHON_ERROR_NAMES.get(name, name), (name, code, cls.message)
    assert len(set(p.ERRORS.values())) == len(p.ERRORS)
    brief = {"NONE": 0, "OFFSET_OUT_OF_RANGE": 1, "CORRUPT_MESSAGE": 2,
             "UNKNOWN_TOPIC_OR_PARTITION": 3, "LEADER_NOT_AVAILABLE": 5,
             "NOT_LEADER_OR_FOLLOWER": 6, "REQUEST_TIMED_OUT": 7, "MESSAGE_TOO_LARGE": 10,
             "COORDINATOR_NOT_AVAILABLE": 15, "NOT_COORDINATOR": 16, "INVALID_TOPIC_EXCEPTION": 17,
             "RECORD_LIST_TOO_LARGE": 18, "NOT_ENOUGH_REPLICAS": 19,
             "NOT_ENOUGH_REPLICAS_AFTER_APPEND": 20, "INVALID_REQUIRED_ACKS": 21,
             "INVALID_GROUP_ID": 24, "UNSUPPORTED_VERSION": 35, "INVALID_REQUEST": 42,
             "UNSUPPORTED_FOR_MESSAGE_FORMAT": 43, "OFFSET_METADATA_TOO_LARGE": 12,
             "FENCED_LEADER_EPOCH": 74, "UNKNOWN_LEADER_EPOCH": 75, "OFFSET_NOT_AVAILABLE": 78,
             "INVALID_RECORD": 87, "UNKNOWN_SERVER_ERROR": -1, "INVALID_PARTITIONS": 37,
             "TOPIC_ALREADY_EXISTS": 36, "INVALID_CONFIG": 40}
    assert {name: p.ERRORS[name] for name in brief} == brief


# ---- the schemas, field by field, against kafka-python's reading of Kafka's JSON ----

def _compare_structure(ours, theirs, version, path):
    mine = [(f.name, f.type, f.nullable_in(version)) for f in ours if f.in_version(version)]
    names = {f.name for f in ours}
    kp = [(kstore_name(f, names), "int32" if f._json["type"] == "bitfield" else f._json["type"],
           f.nullable_for_version_q(version)) for f in kp_fields(theirs, version)]
    assert mine == kp, f"{path} v{version}"
    for f in ours:
        if f.in_version(version) and f.fields:
            _compare_structure(f.fields, theirs.fields[f.name], version, f"{path}.{f.name}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("api_key,version", CASES, ids=CASE_IDS)
def test_schema_matches_kafka_python_field_by_field(api_key, version, kind):
    message = p.SCHEMAS[(api_key, kind)]
    kp_class = KP[api_key][KIND[kind]]
    assert message.name == kp_class.name
    _compare_structure(message.fields, kp_class._struct, version, message.name)


# Where kafka-python's defaults differ from Kafka's own: Kafka's MessageGenerator gives `records`
# fields a null default (FieldSpec.fieldDefault), kafka-python b""; kafka-python patches
# ListOffsetsRequest.ReplicaId's default to -1 (Kafka's JSON gives none: 0).
KP_DEFAULT_DIFFERENCES = {("ProduceRequest", "records"): b"", ("FetchResponse", "records"): b"",
                          ("ListOffsetsRequest", "replica_id"): -1}


def _compare_defaults(message_name, ours, theirs):
    names = {f.name for f in ours}
    by_name = {}
    for kp_field in theirs.fields.values():
        if kp_field._json["type"] != "bitfield" or names & set(KP_BITFIELD_NAMES):
            by_name[kstore_name(kp_field, names)] = kp_field
    for f in ours:
        kp_field = by_name[f.name]
        kp_default = kp_field.default
        if kp_field._json["type"] == "bitfield":
            kp_default = from_bits(kp_default)
        expected = KP_DEFAULT_DIFFERENCES.get((message_name, f.name), f.default_value())
        assert (kp_default, type(kp_default)) == (expected, type(expected)), (message_name, f.name)
        if f.fields:
            _compare_defaults(message_name, f.fields, kp_field)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("api_key", sorted(EXPECTED_SUPPORTED), ids=lambda k: p.API_NAMES[k])
def test_defaults_match_kafka_python(api_key, kind):
    message = p.SCHEMAS[(api_key, kind)]
    _compare_defaults(message.name, message.fields, KP[api_key][KIND[kind]]._struct)
    if (api_key, kind) == (0, "request"):
        records = message.fields[3].fields[1].fields[1]
        assert (records.name, records.default) == ("records", None)


def _all_fields(fields):
    for f in fields:
        yield f
        yield from _all_fields(f.fields)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("api_key", sorted(EXPECTED_SUPPORTED), ids=lambda k: p.API_NAMES[k])
def test_every_field_is_used_by_a_supported_version(api_key, kind):
    message = p.SCHEMAS[(api_key, kind)]
    lo, hi = message.versions
    for f in _all_fields(message.fields):
        assert f.versions[0] <= hi and f.versions[1] >= lo, f.name
        if f.nullable is not None:
            assert f.versions[0] <= f.nullable[0] and f.nullable[1] <= f.versions[1], f.name


# ---- (1) kafka-python encodes, kstore decodes ----

@pytest.mark.parametrize("api_key,version", CASES, ids=CASE_IDS)
def test_request_from_kafka_python_decodes_in_kstore(api_key, version):
    body = SAMPLES[api_key][0]
    frame = kp_request_bytes(api_key, version, body, correlation_id=-5, client_id="kp-ü")
    header = p.decode_request_header(frame)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == \
        (api_key, version, -5, "kp-ü")
    assert header.size == 10 + len("kp-ü".encode())
    decoded = p.decode_request(api_key, version, frame, header.size)
    struct_ = KP[api_key][0]._struct
    assert project(decoded, struct_, version) == project(body, struct_, version)
    check_defaults(decoded, p.SCHEMAS[(api_key, "request")].fields, version)
    # and kstore writes exactly the bytes kafka-python wrote
    assert p.encode_request(api_key, version, -5, "kp-ü", body) == frame


@pytest.mark.parametrize("api_key,version", CASES, ids=CASE_IDS)
def test_response_from_kafka_python_decodes_in_kstore(api_key, version):
    body = SAMPLES[api_key][1]
    frame = kp_response_bytes(api_key, version, body, correlation_id=2**31 - 1)
    correlation_id, decoded = p.decode_response(api_key, version, frame)
    assert correlation_id == 2**31 - 1
    struct_ = KP[api_key][1]._struct
    assert project(decoded, struct_, version) == project(body, struct_, version)
    check_defaults(decoded, p.SCHEMAS[(api_key, "response")].fields, version)


# ---- (2) kstore encodes, kafka-python decodes ----

@pytest.mark.parametrize("api_key,version", CASES, ids=CASE_IDS)
def test_response_from_kstore_decodes_in_kafka_python(api_key, version):
    body = SAMPLES[api_key][1]
    chunks = p.encode_response(api_key, version, 424242, body)
    assert len(chunks) == 1 and isinstance(chunks[0], bytes)
    kp_class = KP[api_key][1]
    decoded = kp_class.decode(chunks[0], version=version, header=True)
    assert decoded.header.correlation_id == 424242
    assert kp_dict(decoded, kp_class._struct, version) == project(body, kp_class._struct, version)
    assert chunks[0] == kp_response_bytes(api_key, version, body, correlation_id=424242)


@pytest.mark.parametrize("api_key,version", CASES, ids=CASE_IDS)
def test_request_from_kstore_decodes_in_kafka_python(api_key, version):
    body = SAMPLES[api_key][0]
    frame = p.encode_request(api_key, version, 99, None, body)
    kp_class = KP[api_key][0]
    decoded = kp_class.decode(frame, version=version, header=True)
    assert (decoded.header.request_api_key, decoded.header.request_api_version,
            decoded.header.correlation_id, decoded.header.client_id) == (api_key, version, 99, None)
    assert kp_dict(decoded, kp_class._struct, version) == project(body, kp_class._struct, version)


# ---- the same bodies against the hand-written Struct classes, by position ----

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("api_key,version", OLD_CASES, ids=OLD_CASE_IDS)
def test_bodies_match_the_hand_written_struct_classes(api_key, version, kind):
    old_class = OLD[api_key][KIND[kind]][version]
    assert old_class.API_KEY == api_key
    # kafka-python's ListGroupsRequest_v2 says API_VERSION = 1 (a slip; its schema is v2's)
    assert old_class.API_VERSION == (1 if (api_key, version, kind) == (16, 2, "request") else version)
    body = SAMPLES[api_key][KIND[kind]]
    if kind == "request":
        frame = p.encode_request(api_key, version, 1, "c", body)
        start = p.decode_request_header(frame).size
    else:
        frame = joined(p.encode_response(api_key, version, 1, body))
        start = 4
    expected = as_old_tuples(body, p.SCHEMAS[(api_key, kind)].fields, version)
    if (api_key, kind) == (37, "request"):
        # the hand-written class groups count and assignments in a struct ("new_partitions") of
        # its own: the same bytes, one tuple deeper
        topics, *rest = expected
        expected = ([(name, (count, assignments)) for name, count, assignments in topics], *rest)
    data = BytesIO(frame[start:])
    assert old_class.SCHEMA.decode(data) == expected
    assert data.read() == b""
    assert old_class.SCHEMA.encode(expected) == frame[start:]


# ---- kstore -> kstore ----

@pytest.mark.parametrize("api_key,version", CASES, ids=CASE_IDS)
def test_round_trip_request(api_key, version):
    body = SAMPLES[api_key][0]
    frame = p.encode_request(api_key, version, 1234, "cli", body)
    header = p.decode_request_header(frame)
    decoded = p.decode_request(api_key, version, frame, header.size)
    message = p.SCHEMAS[(api_key, "request")]
    assert as_tuples(decoded, message.fields, version) == as_tuples(body, message.fields, version)
    check_defaults(decoded, message.fields, version)
    assert p.encode_request(api_key, version, 1234, "cli", decoded) == frame
    # a body given as a memoryview / bytearray decodes the same
    assert p.decode_request(api_key, version, memoryview(frame), header.size) == decoded
    assert p.decode_request(api_key, version, bytearray(frame), header.size) == decoded


@pytest.mark.parametrize("api_key,version", CASES, ids=CASE_IDS)
def test_round_trip_response(api_key, version):
    body = SAMPLES[api_key][1]
    frame = joined(p.encode_response(api_key, version, -1, body))
    correlation_id, decoded = p.decode_response(api_key, version, frame)
    assert correlation_id == -1
    message = p.SCHEMAS[(api_key, "response")]
    assert as_tuples(decoded, message.fields, version) == as_tuples(body, message.fields, version)
    check_defaults(decoded, message.fields, version)
    assert joined(p.encode_response(api_key, version, -1, decoded)) == frame


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("api_key,version", CASES, ids=CASE_IDS)
def test_default_body_encodes_like_an_empty_body_and_decodes_to_itself(api_key, version, kind):
    body = p.default_body(api_key, version, kind)
    message = p.SCHEMAS[(api_key, kind)]
    assert set(body) == {f.name for f in message.fields}
    if kind == "request":
        frame = p.encode_request(api_key, version, 0, "", body)
        assert frame == p.encode_request(api_key, version, 0, "", {})
        assert p.decode_request(api_key, version, frame, p.decode_request_header(frame).size) == body
    else:
        frame = joined(p.encode_response(api_key, version, 0, body))
        assert frame == joined(p.encode_response(api_key, version, 0, {}))
        assert p.decode_response(api_key, version, frame) == (0, body)
    assert p.default_body(api_key, version, kind) is not body  # a fresh dict (and lists) each time
    bad = dict(body, extra=1)
    with pytest.raises(p.ProtocolError, match=r"unknown field\(s\) \['extra'\]"):
        if kind == "request":
            p.encode_request(api_key, version, 0, "", bad)
        else:
            p.encode_response(api_key, version, 0, bad)


def test_fields_a_version_lacks_come_back_at_kafkas_defaults():
    frame = p.encode_request(1, 4, 1, "c", {"max_wait_ms": 1, "min_bytes": 1, "topics": [
        {"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 5,
                                        "partition_max_bytes": 100}]}]})
    body = p.decode_request(1, 4, frame, p.decode_request_header(frame).size)
    assert body["max_bytes"] == 0x7FFFFFFF and body["isolation_level"] == 0
    assert (body["session_id"], body["session_epoch"], body["rack_id"]) == (0, -1, "")
    assert body["forgotten_topics_data"] == [] and body["replica_id"] == -1
    partition = body["topics"][0]["partitions"][0]
    assert partition == {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 5,
                         "log_start_offset": -1, "partition_max_bytes": 100}
    frame = p.encode_request(3, 3, 1, "c", {"topics": None})
    body = p.decode_request(3, 3, frame, p.decode_request_header(frame).size)
    assert body["allow_auto_topic_creation"] is True  # v0-3: the broker's setting decides
    frame = joined(p.encode_response(0, 3, 1, {}))
    assert p.decode_response(0, 3, frame)[1] == {"responses": [], "throttle_time_ms": 0}


# ---- nulls and empty arrays ----

@pytest.mark.parametrize("version", range(0, 9))
def test_metadata_null_topics_means_all_topics_from_v1(version):
    frame_empty = p.encode_request(3, version, 1, "c", {"topics": []})
    if version == 0:
        with pytest.raises(p.ProtocolError, match=r"MetadataRequest v0 in topics: null is not allowed"):
            p.encode_request(3, 0, 1, "c", {"topics": None})
        # kafka-python's v0 null goes out as -1 too: kstore refuses it on the way in
        bad = frame_empty[:-4] + b"\xff\xff\xff\xff"
        with pytest.raises(p.ProtocolError, match="topics: array length -1 .* not nullable"):
            p.decode_request(3, 0, bad, p.decode_request_header(bad).size)
        return
    frame = p.encode_request(3, version, 1, "c", {"topics": None})
    assert frame == kp_request_bytes(3, version, {"topics": None}, correlation_id=1, client_id="c")
    assert p.decode_request(3, version, frame, p.decode_request_header(frame).size)["topics"] is None
    decoded = MetadataRequest.decode(frame, version=version, header=True)
    assert decoded.topics is None
    empty = p.decode_request(3, version, frame_empty, p.decode_request_header(frame_empty).size)
    assert empty["topics"] == []


@pytest.mark.parametrize("version", range(1, 6))
def test_offset_fetch_null_topics_means_all_from_v2(version):
    body = {"group_id": "g", "topics": None}
    if version < 2:
        with pytest.raises(p.ProtocolError, match="not nullable"):
            p.encode_request(9, version, 1, "c", body)
        return
    frame = p.encode_request(9, version, 1, "c", body)
    assert frame == kp_request_bytes(9, version, body, correlation_id=1, client_id="c")
    assert frame.endswith(b"\x00\x01g\xff\xff\xff\xff")
    decoded = p.decode_request(9, version, frame, p.decode_request_header(frame).size)
    assert decoded == {"group_id": "g", "topics": None}


def test_null_strings_records_and_arrays_where_kafka_allows_them():
    frame = joined(p.encode_response(1, 11, 3, {"responses": [{"topic": "t", "partitions": [
        {"partition_index": 0, "aborted_transactions": None, "records": None}]}]}))
    partition = FetchResponse.decode(frame, version=11, header=True).responses[0].partitions[0]
    assert partition.aborted_transactions is None and partition.records is None
    # null aborted_transactions, preferred_read_replica -1, null records
    assert frame.endswith(b"\xff\xff\xff\xff" * 3)
    frame = joined(p.encode_response(3, 8, 3, {"cluster_id": None, "brokers": [
        {"node_id": 1, "host": "h", "port": 1, "rack": None}]}))
    decoded = MetadataResponse.decode(frame, version=8, header=True)
    assert decoded.cluster_id is None and decoded.brokers[0].rack is None
    frame = p.encode_request(22, 1, 3, None, {"transactional_id": None})
    assert InitProducerIdRequest.decode(frame, version=1, header=True).transactional_id is None
    assert p.decode_request_header(frame).client_id is None
    with pytest.raises(p.ProtocolError, match=r"FindCoordinatorRequest v2 in key: null is not allowed"):
        p.encode_request(10, 2, 1, "c", {"key": None})
    with pytest.raises(p.ProtocolError, match=r"in responses\[0\]\.topic: null is not allowed"):
        p.encode_response(1, 4, 1, {"responses": [{"topic": None}]})


def test_empty_arrays_everywhere():
    for api_key, version in CASES:
        for kind, message in (("request", p.SCHEMAS[(api_key, "request")]),
                              ("response", p.SCHEMAS[(api_key, "response")])):
            body = {f.name: [] for f in message.fields if f.is_array}
            if kind == "request":
                frame = p.encode_request(api_key, version, 1, "c", body)
                decoded = KP[api_key][0].decode(frame, version=version, header=True)
            else:
                frame = joined(p.encode_response(api_key, version, 1, body))
                decoded = KP[api_key][1].decode(frame, version=version, header=True)
            for field in message.fields:
                if field.is_array and field.in_version(version):
                    assert getattr(decoded, field.name) == [], (api_key, version, kind, field.name)


# ---- records: bytes and zero-copy slices ----

class Slice:
    """The least a zero-copy slice needs: a size (the server sends the bytes with sendfile)."""

    def __init__(self, data: bytes):
        self.data = data
        self.size = len(data)


def _fetch_body(records_values):
    return {"responses": [{"topic": "t", "partitions": [
        {"partition_index": i, "high_watermark": 10, "last_stable_offset": 10,
         "records": value} for i, value in enumerate(records_values)]}]}


def _materialise(chunks):
    return b"".join(c if isinstance(c, bytes) else c.data for c in chunks)


@pytest.mark.parametrize("version", range(4, 12))
def test_records_slices_become_their_own_chunks(version):
    a, b = Slice(BATCH), Slice(BATCH2)
    values = [a, b"inline", None, b, Slice(b""), bytearray(b"ba"), memoryview(b"mv")]
    chunks = p.encode_response(1, version, 5, _fetch_body(values))
    assert [type(c) for c in chunks] == [bytes, Slice, bytes, Slice, bytes]
    assert chunks[1] is a and chunks[3] is b
    assert struct.unpack(">i", chunks[0][-4:])[0] == a.size
    assert struct.unpack(">i", chunks[2][-4:])[0] == b.size
    assert all(len(c) > 0 for c in chunks if isinstance(c, bytes))
    inline = [v.data if isinstance(v, Slice) else v for v in values]
    assert _materialise(chunks) == joined(p.encode_response(1, version, 5, _fetch_body(inline)))
    decoded = FetchResponse.decode(_materialise(chunks), version=version, header=True)
    got = [part.records for part in decoded.responses[0].partitions]
    assert got == [BATCH, b"inline", None, BATCH2, b"", b"ba", b"mv"]


def test_a_slice_at_the_very_end_leaves_no_empty_chunk_and_sizes_add_up(tmp_path):
    log = FileRecords(str(tmp_path / "00000000000000000000.log"))
    try:
        log.append(BATCH)
        log.append(BATCH2)
        whole = log.slice(0, 1 << 20)      # kstore's real FileSlice
        second = log.slice(len(BATCH), 1 << 20)
        chunks = p.encode_response(1, 11, 8, _fetch_body([whole]))
        assert len(chunks) == 2 and chunks[1] is whole
        body = {"responses": [{"topic": "t", "partitions": [{"records": second}]},
                              {"topic": "u", "partitions": [{"records": whole}]}]}
        chunks = p.encode_response(1, 11, 8, body)
        assert [c is second or c is whole for c in chunks] == [False, True, False, True]
        total = sum(len(c) if isinstance(c, bytes) else c.size for c in chunks)
        data = b"".join(c if isinstance(c, bytes) else c.read_bytes() for c in chunks)
        assert total == len(data)
        decoded = FetchResponse.decode(data, version=11, header=True)
        assert decoded.responses[0].partitions[0].records == BATCH2
        assert decoded.responses[1].partitions[0].records == BATCH + BATCH2
    finally:
        log.close()


def test_a_slice_is_refused_where_only_bytes_can_go():
    with pytest.raises(p.ProtocolError, match=r"topic_data\[0\]\.partition_data\[0\]\.records"):
        p.encode_request(0, 3, 1, "c", {"topic_data": [{"name": "t", "partition_data": [
            {"index": 0, "records": Slice(b"abc")}]}]})

    class BadSize:
        size = -1
    with pytest.raises(p.ProtocolError, match="invalid size -1"):
        p.encode_response(1, 4, 1, _fetch_body([BadSize()]))
    with pytest.raises(p.ProtocolError, match="records value must be bytes"):
        p.encode_response(1, 4, 1, _fetch_body(["text"]))


def test_produce_records_arrive_as_the_exact_batch_bytes():
    frame = kp_request_bytes(0, 8, SAMPLES[0][0])
    decoded = p.decode_request(0, 8, frame, p.decode_request_header(frame).size)
    partitions = decoded["topic_data"][0]["partition_data"]
    assert [x["records"] for x in partitions] == [BATCH, b"", None]
    assert isinstance(partitions[0]["records"], bytes)


# ---- values at the edges ----

def test_integer_extremes_and_unicode_survive_and_overflow_is_refused():
    body = {"responses": [{"name": "é✓😀" * 100, "partition_responses": [
        {"index": -(1 << 31), "error_code": -32768, "base_offset": INT64_MIN,
         "log_append_time_ms": INT64_MAX, "log_start_offset": -1}]}], "throttle_time_ms": 2**31 - 1}
    frame = joined(p.encode_response(0, 7, 1, body))
    decoded = ProduceResponse.decode(frame, version=7, header=True)
    assert decoded.responses[0].name == "é✓😀" * 100
    partition = decoded.responses[0].partition_responses[0]
    assert (partition.index, partition.error_code, partition.base_offset,
            partition.log_append_time_ms) == (-(1 << 31), -32768, INT64_MIN, INT64_MAX)
    for path, value, type_ in [("index", 1 << 31, "int32"), ("error_code", 32768, "int16"),
                               ("base_offset", 1 << 63, "int64")]:
        bad = {"responses": [{"name": "t", "partition_responses": [{path: value}]}]}
        with pytest.raises(p.ProtocolError, match=rf"responses\[0\]\.partition_responses\[0\]\.{path}: "
                                                  rf"{value} does not fit in {type_}"):
            p.encode_response(0, 7, 1, bad)
    with pytest.raises(p.ProtocolError, match="must be an int"):
        p.encode_response(0, 7, 1, {"throttle_time_ms": "12"})
    with pytest.raises(p.ProtocolError, match="longer than 32767"):
        p.encode_request(10, 0, 1, "c", {"key": "x" * 32768})
    frame = p.encode_request(10, 0, 1, "c", {"key": "x" * 32767})
    assert p.decode_request(10, 0, frame, p.decode_request_header(frame).size)["key"] == "x" * 32767


def test_any_nonzero_byte_is_true_as_in_kafka():
    frame = bytearray(p.encode_request(3, 8, 1, "c", {"topics": None,
                                                      "allow_auto_topic_creation": False}))
    frame[-3] = 0x7F
    decoded = p.decode_request(3, 8, bytes(frame), p.decode_request_header(frame).size)
    assert decoded["allow_auto_topic_creation"] is True


# ---- malformed input ----

@pytest.mark.parametrize("api_key,version", CASES, ids=CASE_IDS)
def test_every_truncation_of_a_request_is_refused(api_key, version):
    frame = p.encode_request(api_key, version, 1, "c", SAMPLES[api_key][0])
    start = p.decode_request_header(frame).size
    if start == len(frame):
        return  # ApiVersions v0-2: no body to cut (the header cuts are tested below)
    for cut in range(start, len(frame)):
        with pytest.raises(p.ProtocolError, match=rf"Request v{version} field [a-z_]\S*: truncated: "):
            p.decode_request(api_key, version, frame[:cut], start)


@pytest.mark.parametrize("api_key,version", CASES, ids=CASE_IDS)
def test_every_truncation_of_a_response_is_refused(api_key, version):
    frame = joined(p.encode_response(api_key, version, 1, SAMPLES[api_key][1]))
    for cut in range(len(frame)):
        with pytest.raises(p.ProtocolError, match="truncated"):
            p.decode_response(api_key, version, frame[:cut])


def test_truncation_messages_name_the_field_and_position():
    frame = p.encode_request(0, 3, 1, "c", {"topic_data": [{"name": "t", "partition_data": [
        {"index": 0, "records": b"0123456789"}]}]})
    start = p.decode_request_header(frame).size
    with pytest.raises(p.ProtocolError) as e:
        p.decode_request(0, 3, frame[:-4], start)
    assert str(e.value) == (f"ProduceRequest v3 field topic_data[0].partition_data[0].records: "
                            f"truncated: records of length 10 needs 10 bytes at byte {len(frame) - 10}, "
                            f"only 6 left")
    with pytest.raises(p.ProtocolError, match=r"field topic_data\[0\]\.name: truncated"):
        p.decode_request(0, 3, frame[:start + 2 + 2 + 4 + 4 + 1], start)
    with pytest.raises(p.ProtocolError, match=r"field acks: truncated: int16 needs 2 bytes"):
        p.decode_request(0, 3, frame[:start + 3], start)


def test_trailing_garbage_is_refused_naming_the_last_field():
    frame = p.encode_request(2, 5, 1, "c", SAMPLES[2][0])
    start = p.decode_request_header(frame).size
    with pytest.raises(p.ProtocolError, match=r"ListOffsetsRequest v5: 3 unexpected bytes after "
                                              r"the last field \(topics\)"):
        p.decode_request(2, 5, frame + b"xyz", start)
    frame = p.encode_request(18, 2, 1, "c", {})
    with pytest.raises(p.ProtocolError, match=r"ApiVersionsRequest v2: 1 unexpected bytes after the \(empty\) body"):
        p.decode_request(18, 2, frame + b"\x00", len(frame))
    response = joined(p.encode_response(23, 3, 1, SAMPLES[23][1]))
    with pytest.raises(p.ProtocolError, match="unexpected bytes"):
        p.decode_response(23, 3, response + b"\x00")


def test_bad_lengths_and_bad_utf8_are_refused():
    base = p.encode_request(10, 1, 1, "c", {"key": "ab", "key_type": 0})
    start = p.decode_request_header(base).size
    body = base[start:]
    cases = {
        b"\xff\xff" + body[2:]: r"field key: string length -1 at byte \d+ means null, but the field is not nullable",
        b"\xff\xfe" + body[2:]: r"field key: string length -2 at byte \d+ cannot be negative",
        b"\x00\x02\xc3\x28" + body[4:]: r"field key: string at byte \d+ is not valid UTF-8",
        b"\x7f\xff" + body[2:]: r"field key: truncated: string of length 32767",
    }
    for bad, message in cases.items():
        with pytest.raises(p.ProtocolError, match=message):
            p.decode_request(10, 1, base[:start] + bad, start)
    frame = p.encode_request(9, 1, 1, "c", {"group_id": "g", "topics": [
        {"name": "t", "partition_indexes": [1]}]})
    start = p.decode_request_header(frame).size
    huge = frame[:start + 3] + struct.pack(">i", 1 << 30) + frame[start + 7:]
    with pytest.raises(p.ProtocolError, match=r"field topics: truncated: array of 1073741824 elements"):
        p.decode_request(9, 1, huge, start)
    negative = frame[:start + 3] + struct.pack(">i", -2) + frame[start + 7:]
    with pytest.raises(p.ProtocolError, match=r"field topics: array length -2 .* cannot be negative"):
        p.decode_request(9, 1, negative, start)
    records = p.encode_request(0, 3, 1, "c", {"topic_data": [{"name": "t", "partition_data": [
        {"index": 0, "records": b""}]}]})
    bad = records[:-4] + struct.pack(">i", -7)
    with pytest.raises(p.ProtocolError, match=r"records: records length -7 .* cannot be negative"):
        p.decode_request(0, 3, bad, p.decode_request_header(bad).size)


def test_unknown_api_keys_and_versions_are_refused():
    frame = p.encode_request(18, 0, 1, "c", {})
    for api_key, version, message in [(4, 0, "unknown api key 4"), (-1, 0, "unknown api key -1"),
                                      (0, 2, r"ProduceRequest v2 is not implemented \(versions 3-8\)"),
                                      (0, 9, "ProduceRequest v9 is not implemented"),
                                      (1, 3, "FetchRequest v3"), (1, 12, "FetchRequest v12"),
                                      (18, 3, r"ApiVersionsRequest v3 .* \(versions 0-2\)"),
                                      (23, 4, "OffsetForLeaderEpochRequest v4")]:
        with pytest.raises(p.UnsupportedVersionError, match=message):
            p.decode_request(api_key, version, frame, 10)
        with pytest.raises(p.ProtocolError, match=message):
            p.encode_request(api_key, version, 1, "c", {})
        with pytest.raises(p.ProtocolError, match=message.replace("Request", "Response")):
            p.encode_response(api_key, version, 1, {})
        with pytest.raises(p.ProtocolError, match=message.replace("Request", "Response")):
            p.decode_response(api_key, version, b"\x00" * 8)
        with pytest.raises(p.ProtocolError):
            p.default_body(api_key, version, "request")
    assert issubclass(p.UnsupportedVersionError, p.ProtocolError)


def test_encoding_refuses_unknown_fields_and_wrong_shapes():
    with pytest.raises(p.ProtocolError, match=r"in topic_data\[0\]: unknown field\(s\) \['partitions'\]"):
        p.encode_request(0, 3, 1, "c", {"topic_data": [{"name": "t", "partitions": []}]})
    with pytest.raises(p.ProtocolError, match="array value must be a list"):
        p.encode_request(0, 3, 1, "c", {"topic_data": {"name": "t"}})
    with pytest.raises(p.ProtocolError, match=r"in topic_data\[1\]: expected a dict"):
        p.encode_request(0, 3, 1, "c", {"topic_data": [{"name": "t"}, "t"]})
    with pytest.raises(p.ProtocolError, match=r"string value must be a str"):
        p.encode_request(0, 3, 1, "c", {"transactional_id": b"x"})
    # a field only a later version has is accepted and left out, as Kafka's generated classes do
    assert p.encode_request(1, 10, 1, "c", {"rack_id": "r1"}) == p.encode_request(1, 10, 1, "c", {})
    assert p.encode_request(1, 11, 1, "c", {"rack_id": "r1"}) != p.encode_request(1, 11, 1, "c", {})


# ---- request headers and the too-new ApiVersions request ----

def test_request_header_v1():
    frame = p.encode_request(0, 3, 0x01020304, "prod-1", {})
    assert frame[:16] == b"\x00\x00\x00\x03\x01\x02\x03\x04\x00\x06prod-1"
    assert p.decode_request_header(frame) == p.RequestHeader(0, 3, 0x01020304, "prod-1", 16)
    frame = p.encode_request(1, 11, -1, None, {})
    assert p.decode_request_header(frame) == p.RequestHeader(1, 11, -1, None, 10)
    # an unknown api key still has a readable header; decode_request then refuses it
    header = p.decode_request_header(b"\x00\x7b\x00\x05\x00\x00\x00\x07\x00\x01x" + b"body")
    assert (header.api_key, header.api_version, header.client_id, header.size) == (123, 5, "x", 11)


def test_truncated_request_headers_are_refused():
    frame = p.encode_request(0, 3, 1, "client", {})
    names = ["request_api_key"] * 2 + ["request_api_version"] * 2 + ["correlation_id"] * 4 + \
        ["client_id"] * 8
    for cut, name in enumerate(names):
        with pytest.raises(p.ProtocolError, match=rf"RequestHeader field {name}: truncated"):
            p.decode_request_header(frame[:cut])


LIBRDKAFKA_API_VERSIONS_V3 = (  # as librdkafka 2.x sends it: header v2, compact strings, tags
    b"\x00\x12\x00\x03\x00\x00\x00\x01\x00\x07rdkafka" + b"\x00"
    + b"\x17confluent-kafka-python" + b"\x162.16.1-rdkafka-2.16.1" + b"\x00")


def test_a_flexible_api_versions_request_header_is_read():
    header = p.decode_request_header(LIBRDKAFKA_API_VERSIONS_V3)
    assert header == p.RequestHeader(18, 3, 1, "rdkafka", 18)
    assert LIBRDKAFKA_API_VERSIONS_V3[header.size] == 0x17  # the body: compact string, length+1
    for version in (3, 4):  # kafka-python opens with v4
        request = ApiVersionsRequest[version](client_software_name="kafka-python",
                                              client_software_version="3.0.12")
        request.with_header(correlation_id=7, client_id="kafka-python-3.0.12")
        frame = bytes(request.encode(header=True))
        header = p.decode_request_header(frame)
        assert header == p.RequestHeader(18, version, 7, "kafka-python-3.0.12", 10 + 19 + 1)
        with pytest.raises(p.UnsupportedVersionError):
            p.decode_request(18, version, frame, header.size)
    # a header with tagged fields in it: every one is skipped
    tagged = (b"\x00\x12\x00\x05\x00\x00\x00\x09\xff\xff" + b"\x02" + b"\x00\x03abc" +
              b"\x81\x01\x00" + b"BODY")
    assert p.decode_request_header(tagged) == p.RequestHeader(18, 5, 9, None, len(tagged) - 4)
    for cut in range(10, len(tagged) - 4):
        with pytest.raises(p.ProtocolError, match="RequestHeader: truncated: (tag|size|tagged)"):
            p.decode_request_header(tagged[:cut])
    # flexible versions of the other APIs use header v2 as well; classic ones do not
    produce_v9 = b"\x00\x00\x00\x09\x00\x00\x00\x01\x00\x01c\x00"
    assert p.decode_request_header(produce_v9).size == 12
    produce_v8 = b"\x00\x00\x00\x08\x00\x00\x00\x01\x00\x01c\x00"
    assert p.decode_request_header(produce_v8).size == 11


def test_api_versions_unsupported_answer_decodes_in_kafka_python():
    frame = p.encode_api_versions_unsupported(correlation_id=31)
    assert isinstance(frame, bytes)
    assert frame[:6] == b"\x00\x00\x00\x1f\x00\x23"  # correlation id, then error 35
    expected = {k: r for k, r in EXPECTED_SUPPORTED.items()}
    for version in (0, 3, 4):  # kafka-python reads an error response as v0 whatever it asked
        decoded = ApiVersionsResponse.decode(frame, version=version, header=True)
        assert decoded.header.correlation_id == 31
        assert decoded.error_code == 35 == p.ERRORS["UNSUPPORTED_VERSION"]
        assert {a.api_key: (a.min_version, a.max_version) for a in decoded.api_keys} == expected
    old = old_api_versions.ApiVersionsResponse[0].SCHEMA.decode(BytesIO(frame[4:]))
    assert old[0] == 35 and {k: (lo, hi) for k, lo, hi in old[1]} == expected
    # kstore's own client reads it whatever version it asked for, as Kafka's client does
    for version in (0, 1, 2):
        correlation_id, body = p.decode_response(18, version, frame)
        assert correlation_id == 31 and body["error_code"] == 35
        assert body["throttle_time_ms"] == 0
    # ...but a v1 body that is merely short stays an error
    ok_v0 = joined(p.encode_response(18, 0, 1, {"error_code": 0, "api_keys": []}))
    with pytest.raises(p.ProtocolError, match="ApiVersionsResponse v1 field throttle_time_ms: truncated"):
        p.decode_response(18, 1, ok_v0)


# ---- real clients on a loopback socket served by kstore.protocol ----

class MiniBroker:
    """Answers ApiVersions and Metadata with kstore.protocol only; records every request header."""

    TOPIC = "orders-ü"

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests: list[tuple[p.RequestHeader, dict | None]] = []
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _read(self, conn, n):
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def _serve(self, conn):
        conn.settimeout(30)
        try:
            while True:
                frame = self._read(conn, struct.unpack(">i", self._read(conn, 4))[0])
                header = p.decode_request_header(frame)
                key, version = header.api_key, header.api_version
                if key == 18 and version > p.SUPPORTED[18][1]:
                    self._log(header, None)
                    out = [p.encode_api_versions_unsupported(header.correlation_id)]
                elif key in (3, 18):
                    self._log(header, p.decode_request(key, version, frame, header.size))
                    out = p.encode_response(key, version, header.correlation_id, self._answer(key))
                else:
                    self._log(header, None)
                    return
                data = joined(out)
                conn.sendall(struct.pack(">i", len(data)) + data)
        except (EOFError, OSError):
            pass
        except BaseException as e:  # surfaced by the test
            self.errors.append(e)
        finally:
            conn.close()

    def _log(self, header, body):
        with self.lock:
            self.requests.append((header, body))

    def _answer(self, api_key):
        if api_key == 18:
            return {"api_keys": [{"api_key": k, "min_version": lo, "max_version": hi}
                                 for k, (lo, hi) in sorted(p.SUPPORTED.items())]}
        return {"brokers": [{"node_id": 1, "host": "127.0.0.1", "port": self.port, "rack": None}],
                "cluster_id": "kstore-test", "controller_id": 1,
                "topics": [{"name": self.TOPIC, "partitions": [
                    {"partition_index": i, "leader_id": 1, "leader_epoch": 0,
                     "replica_nodes": [1], "isr_nodes": [1]} for i in range(3)]}]}

    def close(self):
        self.sock.close()


@pytest.fixture
def mini_broker():
    broker = MiniBroker()
    yield broker
    broker.close()


@pytest.mark.timeout(60)
def test_librdkafka_negotiates_and_reads_metadata_from_kstore_bytes(mini_broker):
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{mini_broker.port}"})
    metadata = admin.list_topics(timeout=20)
    assert not mini_broker.errors, mini_broker.errors
    assert metadata.cluster_id == "kstore-test" and metadata.controller_id == 1
    assert {t: sorted(m.partitions) for t, m in metadata.topics.items()} == {MiniBroker.TOPIC: [0, 1, 2]}
    assert metadata.topics[MiniBroker.TOPIC].partitions[2].leader == 1
    assert metadata.brokers[1].port == mini_broker.port
    seen = [(h.api_key, h.api_version) for h, _ in mini_broker.requests]
    assert seen[:2] == [(18, 3), (18, 0)], seen  # too new -> error 35 -> retry with v0
    assert (3, 8) in seen
    first = mini_broker.requests[0][0]
    assert first.client_id == "rdkafka" and first.size == 18
    assert any(body == {"topics": None, "allow_auto_topic_creation": True,
                        "include_cluster_authorized_operations": False,
                        "include_topic_authorized_operations": False}
               for h, body in mini_broker.requests if h.api_key == 3)


@pytest.mark.timeout(60)
def test_kafka_python_negotiates_and_reads_metadata_from_kstore_bytes(mini_broker):
    from kafka import KafkaConsumer
    consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{mini_broker.port}",
                             request_timeout_ms=20000)
    try:
        assert consumer.topics() == {MiniBroker.TOPIC}
        assert consumer.partitions_for_topic(MiniBroker.TOPIC) == {0, 1, 2}
    finally:
        consumer.close()
    assert not mini_broker.errors, mini_broker.errors
    seen = [(h.api_key, h.api_version) for h, _ in mini_broker.requests]
    assert seen[:2] == [(18, 4), (18, 2)], seen  # too new -> error 35 -> retry with v2
    assert (3, 8) in seen

"""`dump-log --offsets-decoder`: `__consumer_offsets` records as JSON, like Kafka's tool.

Mirrors `DumpLogSegments.OffsetsMessageParser`: each record's key prints as
`{"type":"<key version>","data":{...}}` and its value as `{"version":"<value version>","data":{...}}`,
compact JSON with the schema's camelCase field names; a tombstone's payload is `<DELETE>`. In a
GroupMetadataValue of a consumer group, each member's subscription and assignment are decoded
(ConsumerProtocolSubscription / ConsumerProtocolAssignment) rather than shown as bytes.
"""

from __future__ import annotations

import base64
import json
import struct

from .consumer_protocol import decode_assignment, decode_subscription
from .coordinator_records import (GroupMetadataKey, OffsetCommitKey, decode_group_metadata_value,
                                  decode_key, decode_offset_commit_value)
from .errors import InvalidRecordError


def _json(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _partitions(pairs: list[tuple[str, int]]) -> list[dict]:
    by_topic: dict[str, list[int]] = {}
    for topic, p in pairs:
        by_topic.setdefault(topic, []).append(p)
    return [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]


def _b64(data: bytes | None):
    return None if data is None else base64.b64encode(data).decode()


def _member_json(m, consumer: bool) -> dict:
    out = {"memberId": m.member_id, "groupInstanceId": m.group_instance_id, "clientId": m.client_id,
           "clientHost": m.client_host, "rebalanceTimeout": m.rebalance_timeout,
           "sessionTimeout": m.session_timeout,
           "subscription": _b64(m.subscription), "assignment": _b64(m.assignment)}
    if consumer:
        try:
            s = decode_subscription(m.subscription)
            out["subscription"] = {"topics": s.topics, "userData": _b64(s.user_data),
                                   "ownedPartitions": _partitions(s.owned_partitions or [])}
            a = decode_assignment(m.assignment)
            out["assignment"] = {"assignedPartitions": _partitions(a.partitions),
                                 "userData": _b64(a.user_data)}
        except ValueError:
            pass   # not what a consumer writes: leave the bytes as they are
    return out


def decode_offsets_record(key: bytes | None, value: bytes | None) -> tuple[str, str]:
    """(key text, payload text) for one `__consumer_offsets` record."""
    if key is None:
        return "NO_KEY", "NO_PAYLOAD" if value is None else "unknown"
    try:
        decoded = decode_key(key)
        key_version = struct.unpack_from(">h", key)[0]
    except (InvalidRecordError, struct.error):
        return "unknown", "unknown"
    if isinstance(decoded, OffsetCommitKey):
        key_text = _json({"type": str(key_version), "data": {
            "group": decoded.group, "topic": decoded.topic, "partition": decoded.partition}})
    elif isinstance(decoded, GroupMetadataKey):
        key_text = _json({"type": str(key_version), "data": {"group": decoded.group}})
    else:
        return "unknown", "unknown"
    if value is None:
        return key_text, "<DELETE>"
    version = struct.unpack_from(">h", value)[0] if len(value) >= 2 else -1
    try:
        if isinstance(decoded, OffsetCommitKey):
            v = decode_offset_commit_value(value)
            data = {"offset": v.offset}
            if version >= 3:
                data["leaderEpoch"] = v.leader_epoch
            data.update({"metadata": v.metadata, "commitTimestamp": v.commit_timestamp})
            if version == 1:
                data["expireTimestamp"] = v.expire_timestamp
        else:
            g = decode_group_metadata_value(value)
            data = {"protocolType": g.protocol_type, "generation": g.generation,
                    "protocol": g.protocol, "leader": g.leader}
            if version >= 2:
                data["currentStateTimestamp"] = g.current_state_timestamp
            data["members"] = [_member_json(m, g.protocol_type == "consumer") for m in g.members]
    except InvalidRecordError:
        return key_text, "unknown"
    return key_text, _json({"version": str(version), "data": data})

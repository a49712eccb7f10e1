"""What the group coordinator writes to `__consumer_offsets`, byte for byte.

Mirrors Kafka's `GroupCoordinatorService.partitionFor`, `GroupCoordinatorRecordSerde` and the
message schemas `OffsetCommitKey.json` / `OffsetCommitValue.json` / `GroupMetadataKey.json`:

* a group's offsets live in partition `Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions`,
  with Java's `String.hashCode` over UTF-16 code units and `Utils.abs(MIN_VALUE) = 0`;
* every key and value starts with an int16 version; key version 0/1 = OffsetCommitKey
  (group, topic, partition), 2 = GroupMetadataKey (group); a null value is a tombstone;
* OffsetCommitValue v3 = offset int64, leaderEpoch int32 (−1 = none), metadata string,
  commitTimestamp int64 (v1 adds expireTimestamp and drops the epoch).
Strings are int16 length + UTF-8 (classic, non-flexible encoding).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import InvalidRecordError

OFFSET_COMMIT_KEY_VERSION = 1
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_KEY_VERSION = 2
NO_LEADER_EPOCH = -1


def java_string_hashcode(s: str) -> int:
    """Java's String.hashCode: h = 31·h + c over UTF-16 code units, 32-bit two's complement."""
    data = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def utils_abs(n: int) -> int:
    """Kafka's Utils.abs: like abs(), but MIN_VALUE maps to 0 instead of staying negative."""
    return 0 if n == -(1 << 31) else abs(n)


def partition_for(group_id: str, num_partitions: int = 50) -> int:
    """The `__consumer_offsets` partition that holds `group_id`'s offsets."""
    return utils_abs(java_string_hashcode(group_id)) % num_partitions


# ---- primitive (non-flexible) encodings
def _string(s: str) -> bytes:
    data = s.encode("utf-8")
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes is too long for an int16 length")
    return struct.pack(">h", len(data)) + data


def _read_string(buf: bytes, pos: int) -> tuple[str | None, int]:
    if pos + 2 > len(buf):
        raise InvalidRecordError(f"truncated string length at byte {pos}")
    (n,) = struct.unpack_from(">h", buf, pos)
    pos += 2
    if n < 0:
        return None, pos
    if pos + n > len(buf):
        raise InvalidRecordError(f"string of {n} bytes at byte {pos} runs past the end ({len(buf)})")
    return buf[pos:pos + n].decode("utf-8"), pos + n


def _read(fmt: str, buf: bytes, pos: int, what: str):
    size = struct.calcsize(fmt)
    if pos + size > len(buf):
        raise InvalidRecordError(f"truncated {what} at byte {pos}")
    return struct.unpack_from(fmt, buf, pos)[0], pos + size


@dataclass(frozen=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int

    def encode(self, version: int = OFFSET_COMMIT_KEY_VERSION) -> bytes:
        return struct.pack(">h", version) + _string(self.group) + _string(self.topic) + \
            struct.pack(">i", self.partition)


@dataclass(frozen=True)
class OffsetCommitValue:
    offset: int
    metadata: str = ""
    commit_timestamp: int = -1
    leader_epoch: int = NO_LEADER_EPOCH
    expire_timestamp: int | None = None

    def encode(self) -> bytes:
        """v1 when an expire timestamp is given, else v3 (MetadataVersion.offsetCommitValueVersion)."""
        if self.expire_timestamp is not None:
            return (struct.pack(">hq", 1, self.offset) + _string(self.metadata) +
                    struct.pack(">qq", self.commit_timestamp, self.expire_timestamp))
        return (struct.pack(">hqi", OFFSET_COMMIT_VALUE_VERSION, self.offset, self.leader_epoch) +
                _string(self.metadata) + struct.pack(">q", self.commit_timestamp))


@dataclass(frozen=True)
class GroupMetadataKey:
    group: str

    def encode(self) -> bytes:
        return struct.pack(">h", GROUP_METADATA_KEY_VERSION) + _string(self.group)


def decode_key(key: bytes) -> OffsetCommitKey | GroupMetadataKey | tuple[int, bytes]:
    """Decode a `__consumer_offsets` key; unknown record types come back as (version, bytes)."""
    version, pos = _read(">h", key, 0, "key version")
    if version in (0, 1):
        group, pos = _read_string(key, pos)
        topic, pos = _read_string(key, pos)
        partition, pos = _read(">i", key, pos, "partition")
        _expect_end(key, pos, "OffsetCommitKey")
        return OffsetCommitKey(group, topic, partition)
    if version == 2:
        group, pos = _read_string(key, pos)
        _expect_end(key, pos, "GroupMetadataKey")
        return GroupMetadataKey(group)
    return version, key[2:]


def decode_offset_commit_value(value: bytes) -> OffsetCommitValue:
    version, pos = _read(">h", value, 0, "value version")
    offset, pos = _read(">q", value, pos, "offset")
    epoch, expire = NO_LEADER_EPOCH, None
    if version >= 3:
        epoch, pos = _read(">i", value, pos, "leader epoch")
    if version > 3:
        raise InvalidRecordError(f"OffsetCommitValue version {version} (flexible) is not supported")
    metadata, pos = _read_string(value, pos)
    commit_ts, pos = _read(">q", value, pos, "commit timestamp")
    if version == 1:
        expire, pos = _read(">q", value, pos, "expire timestamp")
    # Later versions may append fields we do not know; versions 0–3 must end here.
    _expect_end(value, pos, f"OffsetCommitValue v{version}")
    return OffsetCommitValue(offset, metadata or "", commit_ts, epoch, expire)


def _expect_end(buf: bytes, pos: int, what: str) -> None:
    if pos != len(buf):
        raise InvalidRecordError(f"{what} has {len(buf) - pos} unexpected trailing byte(s)")


# ---- GroupMetadataValue (GroupMetadataValue.json): a classic group's membership
GROUP_METADATA_VALUE_VERSION = 3


@dataclass(frozen=True)
class GroupMemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[GroupMemberValue, ...] = ()

    def encode(self) -> bytes:
        """Version 3, what Kafka writes (v0–2 lack the instance id / rebalance timeout / time)."""
        out = struct.pack(">h", GROUP_METADATA_VALUE_VERSION) + _string(self.protocol_type)
        out += struct.pack(">i", self.generation) + _nullable_string(self.protocol)
        out += _nullable_string(self.leader) + struct.pack(">qi", self.current_state_timestamp,
                                                           len(self.members))
        for m in self.members:
            out += (_string(m.member_id) + _nullable_string(m.group_instance_id) +
                    _string(m.client_id) + _string(m.client_host) +
                    struct.pack(">ii", m.rebalance_timeout, m.session_timeout) +
                    _bytes(m.subscription) + _bytes(m.assignment))
        return out


def _nullable_string(s: str | None) -> bytes:
    return struct.pack(">h", -1) if s is None else _string(s)


def _bytes(b: bytes) -> bytes:
    return struct.pack(">i", len(b)) + bytes(b)


def _read_bytes(buf: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = _read(">i", buf, pos, "bytes length")
    if n < 0 or pos + n > len(buf):
        raise InvalidRecordError(f"bytes of length {n} at byte {pos} run past the end ({len(buf)})")
    return bytes(buf[pos:pos + n]), pos + n


def decode_group_metadata_value(value: bytes) -> GroupMetadataValue:
    version, pos = _read(">h", value, 0, "value version")
    if not 0 <= version <= 3:
        raise InvalidRecordError(f"GroupMetadataValue version {version} is not supported (0-3)")
    protocol_type, pos = _read_string(value, pos)
    generation, pos = _read(">i", value, pos, "generation")
    protocol, pos = _read_string(value, pos)
    leader, pos = _read_string(value, pos)
    timestamp = -1
    if version >= 2:
        timestamp, pos = _read(">q", value, pos, "current state timestamp")
    count, pos = _read(">i", value, pos, "member count")
    if count < 0 or count > len(value):
        raise InvalidRecordError(f"GroupMetadataValue member count {count} is impossible")
    members = []
    for _ in range(count):
        member_id, pos = _read_string(value, pos)
        instance_id = None
        if version >= 3:
            instance_id, pos = _read_string(value, pos)
        client_id, pos = _read_string(value, pos)
        client_host, pos = _read_string(value, pos)
        rebalance_timeout = -1
        if version >= 1:
            rebalance_timeout, pos = _read(">i", value, pos, "rebalance timeout")
        session_timeout, pos = _read(">i", value, pos, "session timeout")
        subscription, pos = _read_bytes(value, pos)
        assignment, pos = _read_bytes(value, pos)
        members.append(GroupMemberValue(member_id, instance_id, client_id, client_host,
                                        rebalance_timeout if version >= 1 else session_timeout,
                                        session_timeout, subscription, assignment))
    _expect_end(value, pos, f"GroupMetadataValue v{version}")
    return GroupMetadataValue(protocol_type or "", generation, protocol, leader, timestamp,
                              tuple(members))

"""The bytes consumers put in JoinGroup / SyncGroup: Kafka's `ConsumerProtocol`.

Mirrors `org.apache.kafka.clients.consumer.internals.ConsumerProtocol` (ConsumerProtocolSubscription
and ConsumerProtocolAssignment .json). The broker never needs them — it relays them — but the
tools do: `consumer-groups --describe` shows each member's assignment by decoding them.
* Subscription: version int16, topics [string], user_data nullable bytes, (v1+) owned partitions
  [topic, [int32]], (v2+) generation int32, (v3+) rack nullable string;
* Assignment: version int16, assigned partitions [topic, [int32]], user_data nullable bytes.
Later versions only append fields, so a reader that stops early still reads the fields it knows.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass


@dataclass(frozen=True)
class Subscription:
    topics: list[str]
    user_data: bytes | None = None
    owned_partitions: list[tuple[str, int]] | None = None


@dataclass(frozen=True)
class Assignment:
    partitions: list[tuple[str, int]]
    user_data: bytes | None = None


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = bytes(data), 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise ValueError(f"consumer protocol bytes truncated at byte {self.pos}")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take(">h")
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError(f"bad string length {n} at byte {self.pos - 2}")
        self.pos += n
        return self.data[self.pos - n:self.pos].decode("utf-8")

    def nullable_bytes(self) -> bytes | None:
        n = self.take(">i")
        if n < 0:
            return None
        if self.pos + n > len(self.data):
            raise ValueError(f"bytes of length {n} run past the end")
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def count(self) -> int:
        n = self.take(">i")
        if n < 0 or n > len(self.data):
            raise ValueError(f"bad array length {n}")
        return n

    def topic_partitions(self) -> list[tuple[str, int]]:
        out = []
        for _ in range(self.count()):
            topic = self.string()
            out.extend((topic, self.take(">i")) for _ in range(self.count()))
        return out

    def done(self) -> bool:
        return self.pos >= len(self.data)


def decode_subscription(data: bytes) -> Subscription:
    r = _Reader(data)
    version = r.take(">h")
    topics = [r.string() for _ in range(r.count())]
    user_data = r.nullable_bytes()
    owned = r.topic_partitions() if version >= 1 and not r.done() else None
    return Subscription(topics, user_data, owned)


def decode_assignment(data: bytes) -> Assignment:
    if not data:
        return Assignment([])    # a member the leader gave nothing (or not yet synced)
    r = _Reader(data)
    r.take(">h")
    partitions = r.topic_partitions()
    user_data = r.nullable_bytes() if not r.done() else None
    return Assignment(partitions, user_data)


def _string(s: str) -> bytes:
    data = s.encode("utf-8")
    return struct.pack(">h", len(data)) + data


def _topic_partitions(partitions: list[tuple[str, int]]) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for topic, p in partitions:
        by_topic.setdefault(topic, []).append(p)
    out = struct.pack(">i", len(by_topic))
    for topic, parts in by_topic.items():
        out += _string(topic) + struct.pack(f">i{len(parts)}i", len(parts), *parts)
    return out


def encode_subscription(topics: list[str], version: int = 0) -> bytes:
    out = struct.pack(">hi", version, len(topics)) + b"".join(_string(t) for t in topics)
    out += struct.pack(">i", -1)                      # no user data
    if version >= 1:
        out += struct.pack(">i", 0)                   # owns nothing yet
    return out


def encode_assignment(partitions: list[tuple[str, int]], version: int = 0) -> bytes:
    return struct.pack(">h", version) + _topic_partitions(partitions) + struct.pack(">i", -1)

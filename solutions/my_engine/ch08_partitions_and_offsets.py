"""Chapter 08 — Topics, partitions and committed offsets: my passing functions (java_string_hashcode, partition_for, encode_offset_commit, decode_offset_commit, range_assign, partition_for_key, after_crash).

Written by kstore.my_engine.save("ex08"); a new save replaces this file.
"""

import struct

SAVED = ('java_string_hashcode', 'partition_for', 'encode_offset_commit', 'decode_offset_commit', 'range_assign', 'partition_for_key', 'after_crash')    # the functions whose tests passed: the engine plugs in these


def java_string_hashcode(s: str) -> int:
    data = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, num_partitions: int = 50) -> int:
    h = java_string_hashcode(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


def encode_offset_commit(group, topic, partition, offset, leader_epoch, metadata, commit_timestamp):
    def string(s):
        data = s.encode("utf-8")
        return struct.pack(">h", len(data)) + data

    key = struct.pack(">h", 1) + string(group) + string(topic) + struct.pack(">i", partition)
    value = (struct.pack(">hqi", 3, offset, leader_epoch) + string(metadata)
             + struct.pack(">q", commit_timestamp))
    return key, value


def decode_offset_commit(key, value):
    def string(buf, pos):
        (n,) = struct.unpack_from(">h", buf, pos)
        return buf[pos + 2:pos + 2 + n].decode("utf-8"), pos + 2 + n

    group, pos = string(key, 2)
    topic, pos = string(key, pos)
    (partition,) = struct.unpack_from(">i", key, pos)
    (version, offset) = struct.unpack_from(">hq", value, 0)
    pos, epoch = 10, -1
    if version >= 3:
        (epoch,) = struct.unpack_from(">i", value, pos)
        pos += 4
    metadata, pos = string(value, pos)
    (commit_timestamp,) = struct.unpack_from(">q", value, pos)
    return group, topic, partition, offset, epoch, metadata, commit_timestamp


def range_assign(subscriptions, partitions_per_topic):
    assignment = {member: [] for member in subscriptions}
    for topic in sorted({t for topics in subscriptions.values() for t in topics}):
        members = sorted(m for m, topics in subscriptions.items() if topic in topics)
        per_member, extra = divmod(partitions_per_topic.get(topic, 0), len(members))
        for i, member in enumerate(members):
            start = per_member * i + min(i, extra)
            length = per_member + (1 if i < extra else 0)
            assignment[member].extend((topic, p) for p in range(start, start + length))
    return assignment


def partition_for_key(key, num_partitions):
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(key)) & mask
    for i in range(0, len(key) - len(key) % 4, 4):
        k = int.from_bytes(key[i:i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail, rest = len(key) - len(key) % 4, len(key) % 4
    if rest == 3:
        h ^= key[tail + 2] << 16
    if rest >= 2:
        h ^= key[tail + 1] << 8
    if rest >= 1:
        h ^= key[tail]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % num_partitions


def after_crash(processed_up_to, committed_offset, reset_offset):
    resume = reset_offset if committed_offset is None else committed_offset
    return list(range(resume, processed_up_to)), list(range(processed_up_to, resume))

"""Deliberately wrong submissions: each replaces ONE task's solution cell with a classic mistake.

name → (task id, the cell's new source, text the feedback must contain). Used by
tests/test_grading.py: each must lose points in that task only, and its feedback must name the
mistake.
"""

WRONG = {
    "varint-without-zigzag": ("ex01.1", '''
def write_varint(n: int) -> bytes:
    z = n & 0xFFFFFFFF                      # forgot the zig-zag
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)
''', "no zig-zag"),
    "varlong-with-32-bit-zigzag": ("ex01.3", '''
def write_varlong(n: int) -> bytes:
    z = ((n << 1) ^ (n >> 31)) & 0xFFFFFFFFFFFFFFFF     # the int32 rule
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)
''', "32-bit zig-zag for a varlong"),
    "crc-over-the-wrong-range": ("ex01.5", '''
def encode_batch(records, base_offset=0, partition_leader_epoch=-1):
    base_ts = records[0][2]
    body = b"".join(encode_record(i, ts - base_ts, key, value) for i, (key, value, ts) in enumerate(records))
    batch = bytearray(struct.pack(">qiibIhiqqqhii", base_offset, 61 - 12 + len(body), partition_leader_epoch,
                                  2, 0, 0, len(records) - 1, base_ts, max(t for _, _, t in records),
                                  -1, -1, -1, len(records))) + body
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[16:])))   # from the magic byte
    return bytes(batch)
''', "the CRC-32C covers bytes 16"),
    "index-rule-greater-or-equal": ("ex02.1", '''
def index_entries(appends, index_interval_bytes):
    entries, since, position = [], 0, 0
    for last_offset, size in appends:
        if since >= index_interval_bytes:
            entries.append((last_offset, position))
            since = 0
        since += size
        position += size
    return entries
''', ">= instead of >"),
    "index-rule-off-by-one-append": ("ex02.1", '''
def index_entries(appends, index_interval_bytes):
    entries, since, position = [], 0, 0
    for last_offset, size in appends:
        since += size                       # counted before the check
        if since > index_interval_bytes:
            entries.append((last_offset, position))
            since = 0
        position += size
    return entries
''', "off by one append"),
    "lookup-smallest-slot-at-least-target": ("ex02.2", '''
def largest_lower_bound_slot(keys, target):
    import bisect
    i = bisect.bisect_left(keys, target)
    return i if i < len(keys) else -1
''', "smallest slot with key ≥ target"),
    "roll-greater-or-equal": ("ex03.3", '''
def should_roll(size, messages_size, segment_bytes, time_waited_ms, segment_ms, index_full,
                base_offset, max_offset_in_messages):
    return (size >= segment_bytes - messages_size
            or (size > 0 and time_waited_ms > segment_ms)
            or index_full
            or not 0 <= max_offset_in_messages - base_offset <= 2**31 - 1)
''', ">= instead of >"),
    "translate-by-base-offset": ("ex04.2", '''
def translate_offset(segment, target_offset):
    position = segment.offset_index.lookup(target_offset)[1]
    while position + 61 <= segment.size:
        header = segment.log.read(position, 61)
        base_offset, length = struct.unpack_from(">qi", header, 0)
        if base_offset >= target_offset:
            return position, 12 + length
        position += 12 + length
    return None
''', "first batch whose *base* offset"),
    "recovery-without-crc-check": ("ex05.1", '''
def valid_prefix_length(data):
    p = 0
    while len(data) - p > 17:
        (length,) = struct.unpack_from(">i", data, p + 8)
        size = 12 + length
        if length < 14 or p + size > len(data) or size < 61 or data[p + 16] != 2:
            break
        p += size
    return p
''', "the CRC is not checked"),
    "retention-spares-the-active-segment": ("ex06.1", '''
def deletable_segments(segments, predicate, high_watermark, log_end_offset):
    out = []
    for i, segment in enumerate(segments[:-1]):        # never the active segment
        following = segments[i + 1]
        if high_watermark >= following.base_offset and predicate(segment, following):
            out.append(segment)
        else:
            break
    return out
''', "non-empty active segment can be deleted"),
    "compaction-drops-tombstones": ("ex07.1", '''
def should_retain_record(record, batch_delete_horizon, latest_offset_for_key, map_latest_offset, now):
    if record.offset > map_latest_offset:
        return True
    if record.key is None or record.offset < latest_offset_for_key:
        return False
    return record.value is not None                   # tombstones go at once
''', "a tombstone is kept until"),
    "hashcode-over-utf8": ("ex08.1", '''
def java_string_hashcode(s):
    h = 0
    for b in s.encode("utf-8"):
        h = (31 * h + b) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h
''', "UTF-16 code units"),
    "partition-with-python-abs": ("ex08.2", '''
def partition_for(group_id, num_partitions=50):
    return abs(java_string_hashcode(group_id)) % num_partitions
''', "Utils.abs maps Integer.MIN_VALUE to 0"),
    "range-members-unsorted": ("ex08.5", '''
def range_assign(subscriptions, partitions_per_topic):
    assignment = {member: [] for member in subscriptions}
    for topic in sorted({t for topics in subscriptions.values() for t in topics}):
        members = [m for m, topics in subscriptions.items() if topic in topics]   # join order
        per_member, extra = divmod(partitions_per_topic.get(topic, 0), len(members))
        for i, member in enumerate(members):
            start = per_member * i + min(i, extra)
            assignment[member].extend((topic, p) for p in range(start, start + per_member + (i < extra)))
    return assignment
''', "members not sorted"),
    "range-extras-to-the-last": ("ex08.5", '''
def range_assign(subscriptions, partitions_per_topic):
    assignment = {member: [] for member in subscriptions}
    for topic in sorted({t for topics in subscriptions.values() for t in topics}):
        members = sorted(m for m, topics in subscriptions.items() if topic in topics)
        n, m = partitions_per_topic.get(topic, 0), len(members)
        per_member, extra = divmod(n, m)
        for i, member in enumerate(members):
            gets_extra = i >= m - extra                  # the last ones
            start = per_member * i + max(0, i - (m - extra))
            assignment[member].extend((topic, p) for p in range(start, start + per_member + gets_extra))
    return assignment
''', "extra partitions went to the last members"),
    "range-one-list-for-all-topics": ("ex08.5", '''
def range_assign(subscriptions, partitions_per_topic):
    members = sorted(subscriptions)
    everything = [(t, p) for t in sorted({t for ts in subscriptions.values() for t in ts})
                  for p in range(partitions_per_topic.get(t, 0))]
    per_member, extra = divmod(len(everything), len(members))
    assignment = {}
    for i, member in enumerate(members):
        start = per_member * i + min(i, extra)
        assignment[member] = everything[start:start + per_member + (i < extra)]
    return assignment
''', "divided as one list"),
    "hw-from-all-replicas": ("ex09.1", '''
def leader_high_watermark(leos, isr, min_insync_replicas):
    if len(isr) < min(min_insync_replicas, len(leos)):
        return None
    return min(leos.values())                          # every replica, not the ISR
''', "smallest LEO in the ISR only"),
    "dedup-against-the-last-batch-only": ("ex09.5", '''
def classify_batch(cached, current_epoch, producer_epoch, first_seq, last_seq):
    if cached is None:
        return "APPEND"
    first, last, _, _ = cached[-1]                     # only the last batch is compared
    if producer_epoch == current_epoch and (first, last) == (first_seq, last_seq):
        return "DUPLICATE"
    if producer_epoch < current_epoch:
        return "INVALID_PRODUCER_EPOCH"
    if producer_epoch > current_epoch:
        return "APPEND" if first_seq == 0 else "OUT_OF_ORDER_SEQUENCE_NUMBER"
    expected = 0 if last == 2**31 - 1 else last + 1
    return "APPEND" if first_seq == expected else "OUT_OF_ORDER_SEQUENCE_NUMBER"
''', "not only the last one"),
    "unknown-producer-must-start-at-zero": ("ex09.5", '''
def classify_batch(cached, current_epoch, producer_epoch, first_seq, last_seq):
    if cached is None:                                 # the pre-KIP-360 rule
        return "APPEND" if first_seq == 0 else "OUT_OF_ORDER_SEQUENCE_NUMBER"
    if producer_epoch == current_epoch and any(
            f == first_seq and l == last_seq for f, l, _, _ in cached):
        return "DUPLICATE"
    if producer_epoch < current_epoch:
        return "INVALID_PRODUCER_EPOCH"
    if producer_epoch > current_epoch:
        return "APPEND" if first_seq == 0 else "OUT_OF_ORDER_SEQUENCE_NUMBER"
    last = cached[-1][1]
    expected = 0 if last == 2**31 - 1 else last + 1
    return "APPEND" if first_seq == expected else "OUT_OF_ORDER_SEQUENCE_NUMBER"
''', "KIP-360"),
    "sequence-without-wraparound": ("ex09.5", '''
def classify_batch(cached, current_epoch, producer_epoch, first_seq, last_seq):
    if cached is None:
        return "APPEND"
    if producer_epoch == current_epoch and any(
            f == first_seq and l == last_seq for f, l, _, _ in cached):
        return "DUPLICATE"
    if producer_epoch < current_epoch:
        return "INVALID_PRODUCER_EPOCH"
    if producer_epoch > current_epoch:
        return "APPEND" if first_seq == 0 else "OUT_OF_ORDER_SEQUENCE_NUMBER"
    return "APPEND" if first_seq == cached[-1][1] + 1 else "OUT_OF_ORDER_SEQUENCE_NUMBER"
''', "after Int.MaxValue"),
    "sequence-checked-before-duplicates": ("ex09.5", '''
def classify_batch(cached, current_epoch, producer_epoch, first_seq, last_seq):
    if cached is None:
        return "APPEND"
    if producer_epoch < current_epoch:
        return "INVALID_PRODUCER_EPOCH"
    if producer_epoch > current_epoch:
        return "APPEND" if first_seq == 0 else "OUT_OF_ORDER_SEQUENCE_NUMBER"
    last = cached[-1][1]
    expected = 0 if last == 2**31 - 1 else last + 1
    if first_seq != expected:                          # a retry is refused before it is recognised
        return "OUT_OF_ORDER_SEQUENCE_NUMBER"
    return "APPEND"
''', "check for a duplicate before checking the sequence"),
    "truncate-to-high-watermark": ("ex10.2", '''
def truncation_offset(leader_epoch, leader_end_offset, own_end_offset_for_epoch, log_end_offset,
                      high_watermark):
    return high_watermark, True                        # the pre-KIP-101 rule
''', "truncates to the high watermark"),
    "one-sendfile-call": ("ex11.2", '''
def send_range(sock, file_fd, position, count):
    return os.sendfile(sock.fileno(), file_fd, position, count)
''', "loop until all"),
    "election-first-of-isr-list": ("ex10.3", '''
def elect_leader(assignment, isr, live, unclean_enabled):
    for broker in isr:                                  # ISR order instead of assignment order
        if broker in live:
            return (broker, "clean")
    if unclean_enabled:
        for broker in assignment:
            if broker in live:
                return (broker, "unclean")
    return (None, "offline")
''', "assignment** order"),
    "election-unclean-ignores-the-flag": ("ex10.3", '''
def elect_leader(assignment, isr, live, unclean_enabled):
    for broker in assignment:
        if broker in live and broker in isr:
            return (broker, "clean")
    for broker in assignment:                           # availability first, whatever the config says
        if broker in live:
            return (broker, "unclean")
    return (None, "offline")
''', "unclean.leader.election.enable is false"),
    "election-dead-isr-member": ("ex10.3", '''
def elect_leader(assignment, isr, live, unclean_enabled):
    for broker in assignment:
        if broker in isr:                               # forgot to check that it is alive
            return (broker, "clean")
    if unclean_enabled:
        for broker in assignment:
            if broker in live:
                return (broker, "unclean")
    return (None, "offline")
''', "cannot lead"),
    "filthiest-ratio-at-least-the-minimum": ("ex07.4", '''
def choose_filthiest(logs):
    best, best_ratio = None, -1.0
    for log in logs:
        total = log.clean_bytes + log.cleanable_bytes
        if total == 0:
            continue
        ratio = log.cleanable_bytes / total
        eligible = ratio >= log.min_cleanable_ratio or (log.needs_compaction_now and log.cleanable_bytes > 0)
        if eligible and ratio > best_ratio:
            best, best_ratio = log.name, ratio
    return best
''', "strictly greater"),
    "filthiest-by-dirty-bytes": ("ex07.4", '''
def choose_filthiest(logs):
    best, most = None, -1
    for log in logs:
        total = log.clean_bytes + log.cleanable_bytes
        if total == 0:
            continue
        ratio = log.cleanable_bytes / total
        eligible = ratio > log.min_cleanable_ratio or (log.needs_compaction_now and log.cleanable_bytes > 0)
        if eligible and log.cleanable_bytes > most:          # the most dirty bytes
            best, most = log.name, log.cleanable_bytes
    return best
''', "not the log with the most dirty bytes"),
    "filthiest-ignores-max-compaction-lag": ("ex07.4", '''
def choose_filthiest(logs):
    best, best_ratio = None, -1.0
    for log in logs:
        total = log.clean_bytes + log.cleanable_bytes
        if total == 0:
            continue
        ratio = log.cleanable_bytes / total
        if ratio > log.min_cleanable_ratio and ratio > best_ratio:
            best, best_ratio = log.name, ratio
    return best
''', "max.compaction.lag.ms says must be compacted now"),
    "key-partition-with-abs": ("ex08.6", '''
from kstore.partitioner import murmur2           # Kafka's hash, right; the step after it is wrong


def partition_for_key(key, num_partitions):
    return abs(murmur2(key)) % num_partitions    # abs instead of toPositive
''', "abs() gives another partition"),
    "key-partition-seed-zero": ("ex08.6", '''
from kstore.partitioner import murmur2


def partition_for_key(key, num_partitions):
    return (murmur2(key, seed=0) & 0x7FFFFFFF) % num_partitions
''', "seed is 0x9747b28c"),
    "key-partition-signed-modulo": ("ex08.6", '''
from kstore.partitioner import murmur2


def partition_for_key(key, num_partitions):
    return murmur2(key) % num_partitions         # Python's % hides the sign; no toPositive
''', "apply toPositive"),
    "crash-resumes-after-the-committed-offset": ("ex08.7", '''
def after_crash(processed_up_to, committed_offset, reset_offset):
    resume = reset_offset if committed_offset is None else committed_offset + 1   # "last processed"
    return list(range(resume, processed_up_to)), list(range(processed_up_to, resume))
''', "the **next** offset to read"),
    "crash-twice-and-never-swapped": ("ex08.7", '''
def after_crash(processed_up_to, committed_offset, reset_offset):
    resume = reset_offset if committed_offset is None else committed_offset
    return list(range(processed_up_to, resume)), list(range(resume, processed_up_to))
''', "swapped"),
    "crash-without-commit-starts-at-zero": ("ex08.7", '''
def after_crash(processed_up_to, committed_offset, reset_offset):
    resume = 0 if committed_offset is None else committed_offset        # ignores auto.offset.reset
    return list(range(resume, processed_up_to)), list(range(processed_up_to, resume))
''', "where auto.offset.reset says"),
    "acks-one-waits-for-the-isr": ("ex09.6", '''
ACKS_INVALID = "INVALID_REQUIRED_ACKS"
ACKS_REFUSED = "NOT_ENOUGH_REPLICAS"
ACKS_NO_RESPONSE = "append, no response"
ACKS_AT_ONCE = "append, answer at once"
ACKS_WHEN_REPLICATED = "append, answer when the ISR has it"


def acks_decision(acks, isr_size, min_insync_replicas, replication_factor):
    if acks not in (0, 1, -1):
        return ACKS_INVALID
    if acks == 0:
        return ACKS_NO_RESPONSE
    if acks == 1:
        return ACKS_WHEN_REPLICATED                     # waits like acks=all
    if isr_size < min(min_insync_replicas, replication_factor):
        return ACKS_REFUSED
    return ACKS_WHEN_REPLICATED
''', "acks=1 is answered after the leader's own append"),
    "acks-all-ignores-min-isr": ("ex09.6", '''
ACKS_INVALID = "INVALID_REQUIRED_ACKS"
ACKS_REFUSED = "NOT_ENOUGH_REPLICAS"
ACKS_NO_RESPONSE = "append, no response"
ACKS_AT_ONCE = "append, answer at once"
ACKS_WHEN_REPLICATED = "append, answer when the ISR has it"


def acks_decision(acks, isr_size, min_insync_replicas, replication_factor):
    if acks not in (0, 1, -1):
        return ACKS_INVALID
    if acks == 0:
        return ACKS_NO_RESPONSE
    if acks == 1:
        return ACKS_AT_ONCE
    return ACKS_WHEN_REPLICATED                         # never refused
''', "refused (NOT_ENOUGH_REPLICAS) before"),
    "acks-min-isr-without-replication-factor": ("ex09.6", '''
ACKS_INVALID = "INVALID_REQUIRED_ACKS"
ACKS_REFUSED = "NOT_ENOUGH_REPLICAS"
ACKS_NO_RESPONSE = "append, no response"
ACKS_AT_ONCE = "append, answer at once"
ACKS_WHEN_REPLICATED = "append, answer when the ISR has it"


def acks_decision(acks, isr_size, min_insync_replicas, replication_factor):
    if acks not in (0, 1, -1):
        return ACKS_INVALID
    if acks == 0:
        return ACKS_NO_RESPONSE
    if acks == 1:
        return ACKS_AT_ONCE
    if isr_size < min_insync_replicas:                  # not capped by the replication factor
        return ACKS_REFUSED
    return ACKS_WHEN_REPLICATED
''', "min(min.insync.replicas, replication factor)"),
    "aborting-from-the-fetch-start": ("ex09.7", '''
def read_committed(batches, aborted):
    aborting = {producer_id for producer_id, _ in aborted}   # first offsets ignored
    delivered = []
    for base, last, producer_id, kind in batches:
        if kind == "abort":
            aborting.discard(producer_id)
        elif kind == "txn" and producer_id in aborting:
            continue
        if kind in ("data", "txn"):
            delivered.append(base)
    return delivered
''', "only from its aborted transaction's first offset"),
    "abort-marker-does-not-end-it": ("ex09.7", '''
def read_committed(batches, aborted):
    pending = sorted(aborted, key=lambda entry: entry[1])
    aborting = set()
    delivered = []
    for base, last, producer_id, kind in batches:
        if producer_id != -1:
            while pending and pending[0][1] <= last:
                aborting.add(pending.pop(0)[0])
            if kind == "txn" and producer_id in aborting:   # never leaves the set
                continue
        if kind in ("data", "txn"):
            delivered.append(base)
    return delivered
''', "ABORT marker ends its aborted transaction"),
    "markers-delivered": ("ex09.7", '''
def read_committed(batches, aborted):
    pending = sorted(aborted, key=lambda entry: entry[1])
    aborting = set()
    delivered = []
    for base, last, producer_id, kind in batches:
        if producer_id != -1:
            while pending and pending[0][1] <= last:
                aborting.add(pending.pop(0)[0])
            if kind == "abort":
                aborting.discard(producer_id)
            elif kind == "txn" and producer_id in aborting:
                continue
        delivered.append(base)                            # control batches too
    return delivered
''', "are never delivered"),
    "aborting-drops-every-producer": ("ex09.7", '''
def read_committed(batches, aborted):
    pending = sorted(aborted, key=lambda entry: entry[1])
    aborting = set()
    delivered = []
    for base, last, producer_id, kind in batches:
        if producer_id != -1:
            while pending and pending[0][1] <= last:
                aborting.add(pending.pop(0)[0])
            if kind == "abort":
                aborting.discard(producer_id)
            elif kind == "txn" and aborting:              # whichever producer is aborting
                continue
        if kind in ("data", "txn"):
            delivered.append(base)
    return delivered
''', "compare each batch's producer id"),
    "aborted-list-taken-in-the-given-order": ("ex09.7", '''
def read_committed(batches, aborted):
    pending = list(aborted)                               # not sorted by first offset
    aborting = set()
    delivered = []
    for base, last, producer_id, kind in batches:
        if producer_id != -1:
            while pending and pending[0][1] <= last:
                aborting.add(pending.pop(0)[0])
            if kind == "abort":
                aborting.discard(producer_id)
            elif kind == "txn" and producer_id in aborting:
                continue
        if kind in ("data", "txn"):
            delivered.append(base)
    return delivered
''', "take them by first offset"),
    "serve-one-byte-too-many": ("ex12.1", '''
def serve_fetch(sock, file_fd, start, end):
    sent, count = 0, end - start + 1                   # counts both ends of the range
    while sent < count:
        n = os.sendfile(sock.fileno(), file_fd, start + sent, count - sent)
        if n == 0:
            break
        sent += n
    return sent
''', "not one more"),
    "serve-resumes-at-sent": ("ex12.1", '''
def serve_fetch(sock, file_fd, start, end):
    sent, count = 0, max(0, end - start)
    n = os.sendfile(sock.fileno(), file_fd, start, count)
    sent += n
    while 0 < n and sent < count:
        n = os.sendfile(sock.fileno(), file_fd, sent, count - sent)   # forgot the start
        sent += n
    return sent
''', "must start at start + sent"),
    "serve-one-sendfile-call": ("ex12.1", '''
def serve_fetch(sock, file_fd, start, end):
    return os.sendfile(sock.fileno(), file_fd, start, max(0, end - start))
''', "loop until all end − start bytes"),
}

"""Chapter 07 — Compaction: my passing functions (should_retain_record, group_segments_by_size, compact, choose_filthiest).

Written by kstore.my_engine.save("ex07"); a new save replaces this file.
"""

SAVED = ('should_retain_record', 'group_segments_by_size', 'compact', 'choose_filthiest')    # the functions whose tests passed: the engine plugs in these


def should_retain_record(record, batch_delete_horizon, latest_offset_for_key, map_latest_offset, now):
    if record.offset > map_latest_offset:
        return True
    if record.key is None:
        return False
    if record.offset < latest_offset_for_key:
        return False
    if record.value is not None:
        return True
    return batch_delete_horizon is None or now < batch_delete_horizon


def group_segments_by_size(segments, max_size, max_index_size, first_uncleanable_offset):
    groups, rest = [], list(segments)
    while rest:
        group = [rest.pop(0)]
        size = group[0].size
        index = group[0].offset_index.size_in_bytes
        time_index = group[0].time_index.size_in_bytes
        while rest:
            nxt = rest[0]
            if (size + nxt.size > max_size or index + nxt.offset_index.size_in_bytes > max_index_size
                    or time_index + nxt.time_index.size_in_bytes > max_index_size):
                break
            group.append(rest.pop(0))
            size += nxt.size
            index += nxt.offset_index.size_in_bytes
            time_index += nxt.time_index.size_in_bytes
        groups.append(group)
    return groups


def compact(records):
    latest = {}
    for r in records:
        if r.key is not None:
            latest[r.key] = r.offset
    map_latest = max((r.offset for r in records), default=-1)
    return [r for r in records
            if should_retain_record(r, None, latest.get(r.key, -1) if r.key is not None else -1,
                                    map_latest, 0)]


def choose_filthiest(logs):
    best, best_ratio = None, -1.0
    for log in logs:
        total = log.clean_bytes + log.cleanable_bytes
        if total == 0:
            continue
        ratio = log.cleanable_bytes / total
        eligible = ratio > log.min_cleanable_ratio or (log.needs_compaction_now and log.cleanable_bytes > 0)
        if eligible and ratio > best_ratio:
            best, best_ratio = log.name, ratio
    return best

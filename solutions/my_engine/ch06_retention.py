"""Chapter 06 — Retention: my passing functions (deletable_segments, retention_time_breached, size_breach_count).

Written by kstore.my_engine.save("ex06"); a new save replaces this file.
"""

SAVED = ('deletable_segments', 'retention_time_breached', 'size_breach_count')    # the functions whose tests passed: the engine plugs in these


def deletable_segments(segments, predicate, high_watermark, log_end_offset):
    out = []
    for i, segment in enumerate(segments):
        following = segments[i + 1] if i + 1 < len(segments) else None
        upper_bound = following.base_offset if following is not None else log_end_offset
        last_and_empty = following is None and segment.size == 0
        if high_watermark >= upper_bound and predicate(segment, following) and not last_and_empty:
            out.append(segment)
        else:
            break
    return out


def retention_time_breached(segment, now_ms, retention_ms):
    return retention_ms >= 0 and now_ms - segment.largest_timestamp > retention_ms


def size_breach_count(segment_sizes, retention_bytes):
    log_size = sum(segment_sizes)
    if retention_bytes < 0 or log_size < retention_bytes:
        return 0
    diff, count = log_size - retention_bytes, 0
    for size in segment_sizes:
        if diff - size < 0:
            break
        diff -= size
        count += 1
    return count

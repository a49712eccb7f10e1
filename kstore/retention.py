"""Which segments retention may delete: pure rules, shared by the log, the course and the tests.

Mirrors Kafka's `UnifiedLog.deletableSegments` and the three retention checks, applied in Kafka's
order by `Log.delete_old_segments`:

1. log start offset: a segment whose *successor* starts at or below the log start offset;
2. size (`retention.bytes`): while `diff − segment.size ≥ 0`, with diff = log size − retention.bytes;
3. time (`retention.ms`): `now − segment.largest_timestamp > retention.ms`.

Only a prefix of the log is ever deleted: the walk stops at the first segment that must stay. A
segment is never deleted unless the high watermark has passed its end, and an empty active segment is
never deleted (a non-empty one can be, after the log rolls a fresh one).

A segment here is anything with `base_offset`, `size` and `largest_timestamp` attributes.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence


class SegmentLike(Protocol):
    base_offset: int
    size: int
    largest_timestamp: int


Predicate = Callable[[SegmentLike, "SegmentLike | None"], bool]


def deletable_segments(segments: Sequence[SegmentLike], predicate: Predicate, *,
                       high_watermark: int, log_end_offset: int) -> list[SegmentLike]:
    """The longest prefix of `segments` that may go (UnifiedLog.deletableSegments)."""
    out = []
    for i, segment in enumerate(segments):
        following = segments[i + 1] if i + 1 < len(segments) else None
        upper_bound = following.base_offset if following is not None else log_end_offset
        is_last_and_empty = following is None and segment.size == 0
        if high_watermark >= upper_bound and predicate(segment, following) and not is_last_and_empty:
            out.append(segment)
        else:
            break
    return out


def retention_ms_breached(now_ms: int, retention_ms: int) -> Predicate | None:
    """Time rule; None when retention.ms < 0 (keep forever)."""
    if retention_ms < 0:
        return None
    return lambda segment, _next: now_ms - segment.largest_timestamp > retention_ms


def retention_size_breached(log_size: int, retention_bytes: int) -> Predicate | None:
    """Size rule (stateful: each deleted segment lowers the excess); None when nothing is over."""
    if retention_bytes < 0 or log_size < retention_bytes:
        return None
    diff = [log_size - retention_bytes]

    def predicate(segment, _next) -> bool:
        if diff[0] - segment.size >= 0:
            diff[0] -= segment.size
            return True
        return False
    return predicate


def log_start_offset_breached(log_start_offset: int) -> Predicate:
    """Start-offset rule: every record of the segment is below the log start offset."""
    return lambda _segment, following: following is not None and following.base_offset <= log_start_offset

"""The timestamp window a topic may impose on what producers send: Kafka's
`LogValidator.validateTimestamp` with `message.timestamp.before.max.ms` and
`message.timestamp.after.max.ms` (KIP-937). With CreateTime, a record whose timestamp lies more than
`before` behind or `after` ahead of the broker's clock makes the whole batch fail with
INVALID_TIMESTAMP; nothing of it is stored. Both default to Long.MAX_VALUE (no window), and
LogAppendTime topics stamp the broker's time instead, so neither is checked then."""

from __future__ import annotations

from .config import LONG_MAX, LogConfig
from .errors import InvalidTimestampError
from .records import NO_TIMESTAMP, RecordBatch


def check_timestamps(batch: RecordBatch, config: LogConfig, clock) -> None:
    """Raise InvalidTimestampError for the first record of `batch` outside the window."""
    before, after = config.message_timestamp_before_max_ms, config.message_timestamp_after_max_ms
    if config.message_timestamp_type != "CreateTime" or (before == LONG_MAX and after == LONG_MAX):
        return   # the default: neither the clock nor any record is looked at
    now = clock.milliseconds()
    low, high = now - before, now + after
    for record in batch.records():
        if record.timestamp != NO_TIMESTAMP and not low <= record.timestamp <= high:
            raise InvalidTimestampError(
                f"Timestamp {record.timestamp} of message with offset {record.offset} is out of "
                f"range. The timestamp should be within [{low}, {high}]")

"""Chapter 03 — Segments and rolling: my passing functions (segment_file_name, base_offset_from_file_name, time_waited_for_roll, should_roll).

Written by kstore.my_engine.save("ex03"); a new save replaces this file.
"""

SAVED = ('segment_file_name', 'base_offset_from_file_name', 'time_waited_for_roll', 'should_roll')    # the functions whose tests passed: the engine plugs in these


def segment_file_name(base_offset: int, suffix: str = ".log") -> str:
    return f"{base_offset:020d}{suffix}"


def base_offset_from_file_name(name: str) -> int:
    prefix = name.split(".", 1)[0]
    if not prefix.isdigit():
        raise ValueError(f"{name!r} is not a segment file name")
    return int(prefix)


def time_waited_for_roll(rolling_based_timestamp, max_timestamp_in_messages, created_ms, now):
    if rolling_based_timestamp is not None and rolling_based_timestamp >= 0:
        return max_timestamp_in_messages - rolling_based_timestamp
    return now - created_ms


def should_roll(size, messages_size, segment_bytes, time_waited_ms, segment_ms, index_full,
                base_offset, max_offset_in_messages):
    return (size > segment_bytes - messages_size
            or (size > 0 and time_waited_ms > segment_ms)
            or index_full
            or not 0 <= max_offset_in_messages - base_offset <= 2**31 - 1)

"""Real segments as the exercise functions see them (used by the tests and the live demos)."""

from __future__ import annotations


def build_segment(directory: str, base_offset: int, batches: list[bytes], index_interval_bytes: int = 4096):
    """A real LogSegment holding `batches` (each appended as one append, as a leader does)."""
    from ..clock import ManualClock
    from ..config import LogConfig
    from ..records import RecordBatch
    from ..segment import LogSegment
    config = LogConfig({"index.interval.bytes": index_interval_bytes, "segment.index.bytes": 256 * 1024})
    seg = LogSegment.open(directory, base_offset, config, ManualClock())
    for data in batches:
        b = RecordBatch(data)
        seg.append(b.last_offset, b.max_timestamp, b.last_offset, data)
    return seg


class CountingFile:
    """A segment's `.log` as the learner's code sees it: `read(position, size)` counts the bytes."""

    def __init__(self, file_records):
        self._f = file_records
        self.bytes_read = 0

    def read(self, position: int, size: int) -> bytes:
        data = self._f.read(position, size)
        self.bytes_read += len(data)
        return data

    def size_in_bytes(self) -> int:
        return self._f.size_in_bytes()


class SegmentView:
    """What a learner's function gets for a segment: `base_offset`, `size`, `offset_index`,
    `time_index` and `log.read(position, size)` (plus `translate_offset` when `with_translate`)."""

    def __init__(self, segment, with_translate: bool = False):
        self.base_offset = segment.base_offset
        self.size = segment.size
        self.offset_index = segment.offset_index
        self.time_index = segment.time_index
        self.log = CountingFile(segment.log)
        if with_translate:
            self.translate_offset = segment.translate_offset

    def __repr__(self) -> str:
        return f"<segment base_offset={self.base_offset} size={self.size}>"

"""The native codec's side of the cleaner's two passes: whole read buffers of batches per call.

Kafka's `Cleaner` walks every batch in the JVM; kstore's readable loops (`Cleaner._map_segment`,
`Cleaner._clean_into`) walk them in Python, one `RecordBatch` at a time. Where the native codec is
built and nothing of the reference is replaced (the offset map's class and MD5, the
`should_retain_record` rule), these walks hand `cleaner.read_batches` a `skim`: one C call takes
every *plain* batch of a read buffer (magic 2, uncompressed, neither transactional nor control),
doing what the Python loop would, and stops at the first other batch, which the Python loop then
takes. The filter pass also gets a `skip`: batches of the dirty section the map pass saw whole and
that this pass drops entirely are passed over without being read again (Kafka reads them twice).
Most of those are decided without a lookup either: when the map pass puts a key that is already
in the map, it flags the record it replaces as superseded, and a batch whose records are all
flagged is one the filter pass would drop whole (each record older than its key's latest).
tests/test_native_cleaner.py checks each call against the Python loop.
"""

from __future__ import annotations

from typing import Callable

MAP_FULL = 2   # what codec.map_batches answers when the offset map filled up (1: stop offset)


class MapWalk:
    """`skim` for one segment of the map pass (Cleaner._map_segment)."""

    def __init__(self, codec, offset_map, segment_base: int, start: int, stop_offset: int, stats):
        self.codec, self.map, self.stats = codec, offset_map, stats
        self.segment_base, self.start, self.stop_offset = segment_base, start, stop_offset
        self.status = 0

    @property
    def map_full(self) -> bool:
        return self.status == MAP_FULL

    def skim(self, buffer, pos: int, buffer_position: int) -> int:
        m = self.map
        pos, self.status, read, m.latest_offset = self.codec.map_batches(
            buffer, pos, self.start, self.stop_offset, m.entries, m.max_desired_size,
            m.latest_offset, self.segment_base, buffer_position)
        self.stats.map_records_read += read
        return -1 if self.status else pos


class FilterWalk:
    """`skim` and `skip` for one segment of the filter pass (Cleaner._clean_into); `keep(bytes,
    last offset, max timestamp)` appends a batch kept whole to the cleaned segment."""

    def __init__(self, codec, offset_map, segment_base: int, now: int, upper_bound: int,
                 producers: dict, stats, keep: Callable):
        self.codec, self.map, self.stats, self.keep = codec, offset_map, stats, keep
        self.segment_base, self.now, self.upper_bound, self.producers = \
            segment_base, now, upper_bound, producers

    def skim(self, buffer, pos: int, buffer_position: int) -> int:
        pos, spans, read, written, invalid, dropped, nbytes = self.codec.filter_batches(
            buffer, pos, self.map.entries, self.map.latest_offset, self.now, self.upper_bound,
            self.producers)
        for begin, end, last_offset, max_timestamp in spans:
            self.keep(buffer[begin:end], last_offset, max_timestamp)   # copied verbatim
        self.stats.records_written += written
        self._count(read, invalid, dropped, nbytes)
        return pos

    def skip(self, position: int) -> int:
        position, read, invalid, dropped, nbytes = self.codec.skip_batches(
            self.map.entries, self.segment_base, position, self.map.latest_offset, self.now,
            self.upper_bound, self.producers)
        self._count(read, invalid, dropped, nbytes)
        return position

    def _count(self, records_read: int, invalid: int, tombstones_dropped: int, nbytes: int) -> None:
        self.stats.records_read += records_read
        self.stats.invalid_records += invalid
        self.stats.tombstones_dropped += tombstones_dropped
        self.stats.bytes_read += nbytes

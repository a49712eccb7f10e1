"""A read-only view of a kstore (or Kafka) log directory, for Spark executors.

Why not `Broker` or `Log.open`? A Broker locks the log directory (`.lock`: one broker per
directory, as in Kafka), and `Log.open` writes: it may run recovery, rebuild or resize indexes and
delete leftover files. Spark runs many readers at once, in other processes, maybe while a broker
is running on the same directory; none of them may change a byte. So this module only ever opens
files with O_RDONLY and reads them with `pread`, using the engine's formats and lower layers:

* topics and partition counts come from `kstore-cluster-metadata.json` (`/brokers/topics/<t>`);
  a directory without it (e.g. a real Kafka log dir) is described by its `<topic>-<p>` folders;
* a partition's segments are its `<20-digit base offset>.log` files (`.deleted`, `.cleaned` and
  `.swap` files are not part of the log); an offset is found the engine's way: the segment by
  bisect over base offsets, a start position from the sparse `.index` (largest entry ≤ target),
  then a forward scan of batch headers (`kstore.segment.offset_from_file_name`, `.index` layout of
  `kstore.index.OffsetIndex`, batches of `kstore.records`);
* the index files of an active segment are preallocated (their tail is zero slots) and a running
  broker may trim or grow them at any time, so they are read with `pread` (never mmapped: a file
  truncated under a mapping kills the reader with SIGBUS) and only their real entries are used;
* the log start offset is the first segment's base offset, raised by `log-start-offset-checkpoint`;
* the log end offset (LEO) is found by scanning the last segment's batch headers (a partial batch
  that a writer is still appending is ignored);
* **latest = the high watermark** in `replication-offset-checkpoint` (capped at the LEO): records
  below it are committed, which is what Kafka's consumers (and `ListOffsets` latest) see. A broker
  writes that file every `replica.high.watermark.checkpoint.interval.ms` when its scheduler runs,
  and always on a clean shutdown. A partition the checkpoint does not list yet has no committed
  records (latest = log start). A log directory with no checkpoint file at all (written with
  `Log`/`LogManager` alone, never by a broker) is read up to its LEO.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import struct
from dataclasses import dataclass

import pyarrow as pa

from ..checkpoint import (LOG_START_OFFSET_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT,
                          OffsetCheckpointFile)
from ..errors import CorruptRecordError, KStoreError
from ..metadata import METADATA_FILE
from ..records import RECORD_BATCH_OVERHEAD
from ..segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, offset_from_file_name
from .decode import CURRENT_MAGIC, ColumnBuilder, batch_spans

_SEGMENT_LOG = re.compile(r"^(\d{20})\.log$")
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")
_INDEX_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_BASE_AND_LENGTH = struct.Struct(">qi")
READ_CHUNK = 8 * 1024 * 1024       # bytes read from a segment per pread


class SegmentsChanged(KStoreError):
    """A segment disappeared while it was being read (retention deleted it, the cleaner replaced
    it): the caller looks again at the partition."""


def _pread_all(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0) if size else b""
    finally:
        os.close(fd)


@dataclass(frozen=True, order=True)
class Segment:
    base_offset: int
    path: str          # the .log file

    def index_entries(self) -> list[tuple[int, int]]:
        """(offset, position) entries of the `.index`; preallocated zero slots are not entries
        (a real entry always has position > 0: it is added after index.interval.bytes)."""
        try:
            raw = _pread_all(self.path[:-len(LOG_SUFFIX)] + INDEX_SUFFIX)
        except FileNotFoundError:
            return []
        out = []
        for rel, pos in _INDEX_ENTRY.iter_unpack(raw[:len(raw) - len(raw) % 8]):
            if pos == 0 and rel == 0:
                break
            out.append((self.base_offset + rel, pos))
        return out

    def time_index_entries(self) -> list[tuple[int, int]]:
        """(timestamp, offset) entries of the `.timeindex`, zero slots excluded."""
        try:
            raw = _pread_all(self.path[:-len(LOG_SUFFIX)] + TIME_INDEX_SUFFIX)
        except FileNotFoundError:
            return []
        out = []
        for ts, rel in _TIME_ENTRY.iter_unpack(raw[:len(raw) - len(raw) % 12]):
            if ts == 0 and rel == 0:
                break
            out.append((ts, self.base_offset + rel))
        return out

    def position_for(self, offset: int) -> int:
        """Start position of the scan for `offset`: the largest index entry ≤ offset."""
        entries = self.index_entries()
        i = bisect.bisect_right(entries, (offset, 1 << 62))
        return entries[i - 1][1] if i else 0


class PartitionReader:
    """One `<topic>-<partition>` directory, read-only."""

    def __init__(self, log_dir: str, topic: str, partition: int):
        self.log_dir, self.topic, self.partition = log_dir, topic, partition
        self.dir = os.path.join(log_dir, f"{topic}-{partition}")

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def exists(self) -> bool:
        return os.path.isdir(self.dir)

    def segments(self) -> list[Segment]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(Segment(offset_from_file_name(n), os.path.join(self.dir, n))
                      for n in names if _SEGMENT_LOG.match(n))

    # ---- offsets
    def log_start_offset(self, segments: list[Segment] | None = None) -> int:
        segments = self.segments() if segments is None else segments
        first = segments[0].base_offset if segments else 0
        checkpointed = read_checkpoint(self.log_dir, LOG_START_OFFSET_CHECKPOINT).get(
            (self.topic, self.partition), 0)
        return max(first, checkpointed)

    def log_end_offset(self, segments: list[Segment] | None = None) -> int:
        segments = self.segments() if segments is None else segments
        for segment in reversed(segments):
            try:
                end = self._segment_end(segment)
            except FileNotFoundError:
                continue
            if end is not None:
                return end
            return segment.base_offset   # an empty (just rolled) active segment
        return 0

    def _segment_end(self, segment: Segment) -> int | None:
        """Next offset after the last complete batch of a segment (None when it has none)."""
        start = segment.position_for(1 << 62)
        last = None
        for _pos, _base, last_offset, _size in self._spans(segment, start):
            last = last_offset
        return None if last is None else last + 1

    def high_watermark(self, log_end: int | None = None, log_start: int | None = None) -> int:
        """The committed end: replication-offset-checkpoint, capped at the LEO (see module doc)."""
        log_end = self.log_end_offset() if log_end is None else log_end
        path = os.path.join(self.log_dir, REPLICATION_OFFSET_CHECKPOINT)
        if not os.path.exists(path):
            return log_end
        hws = read_checkpoint(self.log_dir, REPLICATION_OFFSET_CHECKPOINT)
        log_start = self.log_start_offset() if log_start is None else log_start
        hw = hws.get((self.topic, self.partition))
        if hw is None:
            return log_start
        return max(min(hw, log_end), log_start)

    def offsets(self) -> tuple[int, int, int]:
        """(log start offset, high watermark, log end offset) from one listing of the segments."""
        segments = self.segments()
        start = self.log_start_offset(segments)
        leo = max(self.log_end_offset(segments), start)
        return start, self.high_watermark(leo, start), leo

    def offset_for_timestamp(self, timestamp: int, bound: int) -> int | None:
        """The first offset below `bound` whose record has timestamp ≥ `timestamp` (Kafka's
        `offsetsForTimes`), or None. Per segment: the `.timeindex` gives an offset at which no
        earlier record can qualify, the `.index` a position, then batch headers (maxTimestamp)
        and the records of the first candidate batch are scanned."""
        segments = self.segments()
        log_start = self.log_start_offset(segments)
        for segment in segments:
            entries = segment.time_index_entries()
            # The largest entry with ts ≤ target is in the first batch that reached its timestamp:
            # every earlier batch has a smaller maxTimestamp (LogSegment.findOffsetByTimestamp).
            i = bisect.bisect_right([ts for ts, _ in entries], timestamp)
            from_offset = max(entries[i - 1][1] if i else segment.base_offset, log_start)
            try:
                for pos, base, last, size in self._spans(segment, segment.position_for(from_offset)):
                    if last < log_start:
                        continue
                    if base >= bound:
                        return None
                    buf = self._read(segment, pos, size)
                    (max_ts,) = struct.unpack_from(">q", buf, 35)
                    if max_ts < timestamp:
                        continue
                    found = _first_record_at_or_after(buf, timestamp, log_start, bound,
                                                      self.topic, self.partition)
                    if found is not None:
                        return found
            except FileNotFoundError:
                continue
        return None

    # ---- reading
    def _read(self, segment: Segment, position: int, size: int) -> bytes:
        fd = os.open(segment.path, os.O_RDONLY)
        try:
            return os.pread(fd, size, position)
        finally:
            os.close(fd)

    def _spans(self, segment: Segment, start_position: int = 0):
        """(position, base offset, last offset, size) of each complete batch from start_position,
        read in chunks of batch headers only."""
        fd = os.open(segment.path, os.O_RDONLY)
        try:
            file_size = os.fstat(fd).st_size
            pos = start_position
            while pos + RECORD_BATCH_OVERHEAD <= file_size:
                header = os.pread(fd, RECORD_BATCH_OVERHEAD, pos)
                if len(header) < RECORD_BATCH_OVERHEAD:
                    return
                base, length = _BASE_AND_LENGTH.unpack_from(header, 0)
                if length <= 0 and base == 0:
                    return   # preallocated zero tail (log.preallocate=true)
                size = 12 + length
                if length < 14:
                    raise CorruptRecordError(f"record size {length} is less than the minimum "
                                             f"record overhead in {segment.path} at position {pos}")
                if pos + size > file_size:
                    return   # a batch still being written
                last = base + struct.unpack_from(">i", header, 23)[0] \
                    if header[16] == CURRENT_MAGIC else base
                yield pos, base, last, size
                pos += size
        finally:
            os.close(fd)

    def chunks(self, start: int, end: int):
        """Yield (buffer, [positions of the batches overlapping [start, end)], segment path,
        file position of the buffer) in offset order,
        reading up to READ_CHUNK bytes per pread (a bigger batch is read whole). Raises
        SegmentsChanged when a segment vanishes under the reader."""
        segments = self.segments()
        bases = [s.base_offset for s in segments]
        i = max(bisect.bisect_right(bases, start) - 1, 0)
        for segment in segments[i:]:
            if segment.base_offset >= end:
                return
            try:
                fd = os.open(segment.path, os.O_RDONLY)
            except FileNotFoundError:
                raise SegmentsChanged(segment.path) from None
            try:
                file_size = os.fstat(fd).st_size
                pos = segment.position_for(start) if segment.base_offset <= start else 0
                while pos < file_size:
                    buf = os.pread(fd, min(READ_CHUNK, file_size - pos), pos)
                    spans = list(batch_spans(buf))
                    if not spans and len(buf) >= 12:      # one batch bigger than the chunk?
                        _base, length = _BASE_AND_LENGTH.unpack_from(buf, 0)
                        if length > 0 and pos + 12 + length <= file_size:
                            buf = os.pread(fd, 12 + length, pos)
                            spans = list(batch_spans(buf))
                    if not spans:
                        break                             # nothing complete left here
                    keep = []
                    for p, base, last, _size in spans:
                        if base >= end:
                            if keep:
                                yield buf, keep, segment.path, pos
                            return
                        if last >= start:
                            keep.append(p)
                    if keep:
                        yield buf, keep, segment.path, pos
                    p, _b, _l, size = spans[-1]
                    pos += p + size
            finally:
                os.close(fd)

    def read_arrow(self, start: int, end: int, include_headers: bool = False,
                   rows_per_batch: int | None = None, check_crcs: bool = True, select=None,
                   columns=None):
        """Arrow record batches of the records with start ≤ offset < end. The caller has dealt
        with data loss (see `kstore.spark.source`); offset gaps are normal (compaction).
        `select(buf, positions)` keeps only some batches of each chunk (read_committed)."""
        builder = ColumnBuilder(self.topic, self.partition, include_headers, check_crcs=check_crcs,
                                columns=columns,
                                **({"rows_per_batch": rows_per_batch} if rows_per_batch else {}))
        for buf, positions, path, chunk_position in self.chunks(start, end):
            if select is None:               # every batch: many at a time (take_batches)
                yield from builder.add_batches(buf, positions, start, end, file=path,
                                               chunk_position=chunk_position)
                continue
            kept = set(select(buf, positions))
            for pos in positions:
                if pos not in kept:
                    builder.drop_batch(buf, pos, file=path, file_position=chunk_position + pos)
                    continue
                builder.add_batch(buf, pos, start, end, file=path,
                                  file_position=chunk_position + pos)
                if builder.full() and (batch := builder.flush()) is not None:
                    yield batch
        batch = builder.flush()
        if batch is not None:
            yield batch


def _first_record_at_or_after(buf: bytes, timestamp: int, min_offset: int, bound: int,
                              topic: str, partition: int) -> int | None:
    builder = ColumnBuilder(topic, partition)
    builder.add_batch(buf, 0, min_offset, bound)
    batch = builder.flush()
    if batch is None:
        return None
    for offset, ts in zip(batch.column("offset").to_pylist(),
                          batch.column("timestamp").cast(pa.int64()).to_pylist()):
        if ts >= timestamp * 1000:
            return offset
    return None


def read_checkpoint(log_dir: str, name: str) -> dict[tuple[str, int], int]:
    try:
        return OffsetCheckpointFile(os.path.join(log_dir, name)).read()
    except FileNotFoundError:
        return {}


class LogDirReader:
    """Topics and partitions of a log directory, read-only."""

    def __init__(self, log_dir: str):
        self.log_dir = os.path.abspath(log_dir)
        if not os.path.isdir(self.log_dir):
            raise FileNotFoundError(f"kstore log directory {self.log_dir} does not exist")

    def _metadata(self) -> dict | None:
        path = os.path.join(self.log_dir, METADATA_FILE)
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def topic_partitions(self) -> dict[str, int]:
        """topic → partition count (internal topics such as __consumer_offsets included)."""
        nodes = self._metadata()
        if nodes is not None:
            out = {}
            for path, node in nodes.items():
                parts = path.split("/")
                if len(parts) == 4 and parts[1] == "brokers" and parts[2] == "topics":
                    out[parts[3]] = len(node["partitions"])
            return out
        counts: dict[str, int] = {}          # a log dir without kstore metadata (e.g. Kafka's)
        for name in os.listdir(self.log_dir):
            m = _PARTITION_DIR.match(name)
            if m and os.path.isdir(os.path.join(self.log_dir, name)) \
                    and not name.endswith(("-delete", "-future", "-stray")):
                counts[m.group(1)] = max(counts.get(m.group(1), 0), int(m.group(2)) + 1)
        return counts

    def partition(self, topic: str, partition: int) -> PartitionReader:
        return PartitionReader(self.log_dir, topic, partition)



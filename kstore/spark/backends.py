"""Where the Spark source reads from: a log directory, or a running kstore broker.

Both sit behind one small interface, so the data source (options, offsets, data-loss rules,
streaming) is written once:

    topic_partitions()                 topic → partition count
    offset_ranges(tps)                 (earliest, latest) per topic-partition; latest = high watermark
                                       (the last stable offset with read_committed)
    offsets_for_times({tp: ts})        first offset with timestamp ≥ ts (None: no such record)
    read_arrow(t, p, start, end, h)    Arrow record batches of [start, end); raises DataUnavailable
                                       when the offsets are gone (retention, a replaced segment)

`Location` is the picklable description that travels inside every Spark input partition; each
executor opens its own backend from it (`Location.open()`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from ..errors import KStoreError
from ..completed_fetch import delivered_positions
from . import isolation
from .decode import ColumnBuilder, batch_spans
from .logdir import LogDirReader, SegmentsChanged


class DataUnavailable(KStoreError):
    """Offsets being read are no longer in the log (retention, cleaner, truncation)."""


@dataclass(frozen=True)
class Location:
    log_dir: str | None = None
    bootstrap_servers: str | None = None
    timeout_ms: int = 30000
    read_committed: bool = False       # kafka.isolation.level (kstore.spark.isolation)

    def open(self) -> "Backend":
        if self.log_dir is not None:
            return LogDirBackend(self.log_dir, self.read_committed)
        return NetworkBackend(self.bootstrap_servers, self.timeout_ms / 1000, self.read_committed)

    def describe(self) -> str:
        if self.log_dir is not None:
            return f"log directory {self.log_dir}"
        return f"kstore broker at {self.bootstrap_servers}"


class Backend:
    location: Location

    def topic_partitions(self) -> dict[str, int]:
        raise NotImplementedError

    def offset_ranges(self, tps) -> dict[tuple[str, int], tuple[int, int]]:
        raise NotImplementedError

    def offsets_for_times(self, requests: dict[tuple[str, int], int]) -> dict[tuple[str, int], int | None]:
        raise NotImplementedError

    def read_arrow(self, topic: str, partition: int, start: int, end: int, include_headers: bool,
                   check_crcs: bool = True, columns: Sequence[str] | None = None):
        """Arrow batches of [start, end); `check_crcs` is the source's kafka.check.crcs; only
        `columns` (and `offset`) are decoded when given (column pruning)."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LogDirBackend(Backend):
    """Reads the files directly, read-only (`kstore.spark.logdir`): no broker, no lock."""

    def __init__(self, log_dir: str, read_committed: bool = False):
        self.reader = LogDirReader(log_dir)
        self.read_committed = read_committed
        self.location = Location(log_dir=self.reader.log_dir, read_committed=read_committed)

    def topic_partitions(self) -> dict[str, int]:
        return self.reader.topic_partitions()

    def _bounds(self, part) -> tuple[int, int]:
        """(log start, latest): the HW, or the LSO with read_committed."""
        start, hw, _leo = part.offsets()
        return start, (isolation.last_stable_offset(part, start, hw) if self.read_committed else hw)

    def offset_ranges(self, tps):
        return {(t, p): self._bounds(self.reader.partition(t, p)) for t, p in tps}

    def offsets_for_times(self, requests):
        out = {}
        for (t, p), ts in requests.items():
            part = self.reader.partition(t, p)
            out[(t, p)] = part.offset_for_timestamp(ts, self._bounds(part)[1])
        return out

    def read_arrow(self, topic, partition, start, end, include_headers, check_crcs=True,
                   columns=None):
        part = self.reader.partition(topic, partition)
        if not part.exists():
            raise DataUnavailable(f"partition directory {part.dir} does not exist")
        select = (isolation.committed_selector(isolation.aborted_transactions(part, start, end))
                  if self.read_committed else None)
        try:
            yield from part.read_arrow(start, end, include_headers, check_crcs=check_crcs,
                                       select=select, columns=columns)
        except SegmentsChanged as e:
            raise DataUnavailable(f"segment {os.path.basename(str(e))} of {topic}-{partition} was "
                                  f"removed while it was read") from None


class NetworkBackend(Backend):
    """Reads through `kstore serve` with Kafka's protocol (Fetch returns the same batch bytes).
    `RemoteBroker` sends each partition's requests to its leader, so a cluster works too."""

    FETCH_BYTES = 8 * 1024 * 1024

    def __init__(self, bootstrap_servers: str, timeout_s: float = 30.0, read_committed: bool = False):
        from ..remote_broker import RemoteBroker
        self.read_committed = read_committed
        self.location = Location(bootstrap_servers=bootstrap_servers, timeout_ms=int(timeout_s * 1000),
                                 read_committed=read_committed)
        self.client = RemoteBroker(bootstrap_servers, client_id="kstore-spark", timeout_s=timeout_s)

    def close(self) -> None:
        self.client.close()

    def topic_partitions(self):
        return self.client.topic_partition_counts()

    def offset_ranges(self, tps):
        tps = list(tps)
        if not tps:
            return {}
        earliest = self.client.list_offsets_many({tp: -2 for tp in tps})
        latest = self.client.list_offsets_many({tp: -1 for tp in tps}, self.read_committed)
        return {tp: (earliest[tp].offset, latest[tp].offset) for tp in tps}

    def offsets_for_times(self, requests):
        if not requests:
            return {}
        found = self.client.list_offsets_many(dict(requests), self.read_committed)
        return {tp: (None if f.offset < 0 else f.offset) for tp, f in found.items()}

    def read_arrow(self, topic, partition, start, end, include_headers, check_crcs=True,
                   columns=None):
        from ..errors import OffsetOutOfRangeError
        from ..log import Isolation
        isolation_level = Isolation.TXN_COMMITTED if self.read_committed else Isolation.HIGH_WATERMARK
        builder = ColumnBuilder(topic, partition, include_headers, check_crcs=check_crcs,
                                columns=columns)
        offset = start
        while offset < end:
            try:
                fetched = self.client.fetch(topic, partition, offset, self.FETCH_BYTES, isolation_level)
            except OffsetOutOfRangeError:
                earliest = self.client.list_offsets(topic, partition, -2).offset
                raise DataUnavailable(f"offset {offset} of {topic}-{partition} is out of range "
                                      f"(log start offset {earliest})") from None
            records = fetched.data.buffer
            spans = list(batch_spans(records))
            if not spans:
                break                      # nothing more below the high watermark (or the LSO)
            kept = (set(delivered_positions(records, [s[0] for s in spans], fetched.aborted_transactions))
                    if self.read_committed else None)
            for pos, base, last, _size in spans:
                if base >= end:
                    offset = end
                    break
                if last < offset:
                    continue
                if kept is not None and pos not in kept:
                    builder.drop_batch(records, pos)
                    continue
                builder.add_batch(records, pos, offset, end)
                if builder.full():
                    yield builder.flush()
            else:
                offset = spans[-1][2] + 1
        batch = builder.flush()
        if batch is not None:
            yield batch

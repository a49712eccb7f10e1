"""`kafka.isolation.level=read_committed` for the Spark source, reading a log directory.

Spark's Kafka source hands `isolation.level` to its Kafka consumer: with read_committed, "latest"
is the partition's last stable offset (LSO) instead of the high watermark, and the consumer drops
the records of aborted transactions (and, as always, never shows the COMMIT/ABORT markers). Through
`kstore serve` the broker does the broker's half (ListOffsets and Fetch with isolation_level=1);
reading files directly, this module does it, read-only, from what the broker left on disk:

* the LSO: the high watermark, or the first offset of the oldest transaction still open below it.
  Open transactions are found as the broker finds them after a restart (ProducerStateManager): the
  newest producer snapshot (`<offset>.snapshot`, whose entries carry each producer's
  currentTxnFirstOffset) at or below the HW, then the batch headers from there to the HW — a
  transactional batch opens its producer's transaction, a control batch (marker) closes it;
* the aborted transactions: the `.txnindex` entries (`kstore.transaction_index`) of the segments
  from the one holding the first offset read; per chunk of batches read, those whose marker is at
  or after the chunk's first offset are the chunk's "aborted transactions list", exactly what a
  Fetch from that offset would return, and `kstore.completed_fetch` drops the batches as Kafka's
  consumer does.
"""

from __future__ import annotations

import bisect
import os
import re

from ..errors import KStoreError
from ..producer_snapshot import SUFFIX as SNAPSHOT_SUFFIX, read_snapshot
from ..records import CONTROL_FLAG_MASK, HEADER, RECORD_BATCH_OVERHEAD, TRANSACTIONAL_FLAG_MASK
from ..segment import LOG_SUFFIX, TXN_INDEX_SUFFIX
from ..transaction_index import AbortedTxn, read_entries
from ..completed_fetch import delivered_positions

_SNAPSHOT = re.compile(r"^(\d{20})" + re.escape(SNAPSHOT_SUFFIX) + "$")


def _newest_snapshot(directory: str, at_most: int) -> tuple[int, dict[int, int]]:
    """(offset, {producer id: first offset of its open transaction}) of the newest readable
    snapshot at or below `at_most`; (-1, {}) when there is none."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return -1, {}
    offsets = sorted((int(m.group(1)) for m in map(_SNAPSHOT.match, names) if m), reverse=True)
    for offset in offsets:
        if offset > at_most:
            continue
        try:
            with open(os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}"), "rb") as f:
                entries = read_snapshot(f.read())
        except (OSError, KStoreError):      # corrupt or removed: try an older one
            continue
        return offset, {e.producer_id: e.current_txn_first_offset for e in entries
                        if e.current_txn_first_offset >= 0}
    return -1, {}


def _headers(part, segment, start_position: int):
    """(base offset, attributes, producer id) of each complete batch from start_position (the
    reader's batch walk, then the header fields it does not keep)."""
    for pos, base, _last, _size in part._spans(segment, start_position):
        fields = HEADER.unpack_from(part._read(segment, pos, RECORD_BATCH_OVERHEAD))
        yield base, fields[5], fields[9]               # attributes, producer id


def last_stable_offset(part, log_start: int, high_watermark: int) -> int:
    """The LSO of a partition directory (see the module doc)."""
    snapshot_offset, open_txns = _newest_snapshot(part.dir, high_watermark)
    scan_from = max(snapshot_offset, log_start) if snapshot_offset >= 0 else log_start
    open_txns = {pid: first for pid, first in open_txns.items() if first < high_watermark}
    segments = part.segments()
    bases = [s.base_offset for s in segments]
    i = max(bisect.bisect_right(bases, scan_from) - 1, 0)
    try:
        for segment in segments[i:]:
            if segment.base_offset >= high_watermark:
                break
            position = segment.position_for(scan_from) if segment.base_offset <= scan_from else 0
            for base, attributes, producer_id in _headers(part, segment, position):
                if base >= high_watermark:
                    break
                if base < scan_from:
                    continue
                if attributes & CONTROL_FLAG_MASK:
                    open_txns.pop(producer_id, None)
                elif attributes & TRANSACTIONAL_FLAG_MASK:
                    open_txns.setdefault(producer_id, base)
    except FileNotFoundError:
        pass                               # a segment went away (retention): what was read holds
    return min([high_watermark, *open_txns.values()])


def aborted_transactions(part, start: int, end: int) -> list[AbortedTxn]:
    """The `.txnindex` entries that overlap [start, end), in file order, from the segment holding
    `start` onwards (UnifiedLog.collectAbortedTransactions)."""
    segments = part.segments()
    bases = [s.base_offset for s in segments]
    i = max(bisect.bisect_right(bases, start) - 1, 0)
    found: list[AbortedTxn] = []
    for segment in segments[i:]:
        if segment.base_offset >= end and found:
            break
        path = segment.path[:-len(LOG_SUFFIX)] + TXN_INDEX_SUFFIX
        for entry in read_entries(path):
            if entry.last_offset >= start and entry.first_offset < end:
                found.append(entry)
    return found


def committed_selector(entries: list[AbortedTxn]):
    """A `select(buf, positions)` for `PartitionReader.read_arrow`: the positions of the batches a
    read_committed consumer keeps, given that the chunk starts at its first batch's offset."""
    def select(buf, positions):
        if not positions:
            return positions
        first = int.from_bytes(bytes(buf[positions[0]:positions[0] + 8]), "big", signed=True)
        aborted = [(e.producer_id, e.first_offset) for e in entries if e.last_offset >= first]
        return delivered_positions(buf, positions, aborted)
    return select

"""`kstore dump-log`: print segment, index, snapshot and checkpoint files like Kafka's
`kafka-dump-log.sh` (DumpLogSegments), so the output can be compared line by line.

Lines printed for a `.log` (transaction markers as `endTxnMarker: COMMIT coordinatorEpoch: 0`) and a
`.txnindex` follow Kafka's format exactly, e.g.
    baseOffset: 0 lastOffset: 0 count: 1 baseSequence: -1 lastSequence: -1 producerId: -1 ...
    | offset: 0 CreateTime: 1700000000000 keySize: 1 valueSize: 1 sequence: -1 headerKeys: []
KRaft snapshots (`<offset>-<epoch>.checkpoint`, `bootstrap.checkpoint`) are batches, dumped as Kafka
does. kstore additions: checkpoint files (`*-checkpoint`, `partition.metadata`,
`.kafka_cleanshutdown`) are printed too, which Kafka's tool refuses.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import TextIO

from .checkpoint import parse_checkpoint
from .errors import KStoreError
from .file_records import FileRecords
from .index import OffsetIndex, TimeIndex
from .producer_snapshot import read_snapshot
from .records import ControlRecordType, RecordBatch
from .segment import offset_from_file_name
from .transaction_index import read_entries

RECORD_INDENT = "|"


def _optional_long(value: int | None) -> str:
    return "OptionalLong.empty" if value is None else f"OptionalLong[{value}]"


def format_batch(batch: RecordBatch, position: int) -> str:
    """The batch line of DumpLogSegments.printBatchLevel."""
    if batch.magic >= 2:
        head = (f"baseOffset: {batch.base_offset} lastOffset: {batch.last_offset} "
                f"count: {batch.records_count} baseSequence: {batch.base_sequence} "
                f"lastSequence: {batch.last_sequence} producerId: {batch.producer_id} "
                f"producerEpoch: {batch.producer_epoch} partitionLeaderEpoch: "
                f"{batch.partition_leader_epoch} isTransactional: {str(batch.is_transactional).lower()} "
                f"isControl: {str(batch.is_control).lower()} deleteHorizonMs: "
                f"{_optional_long(batch.delete_horizon_ms)}")
    else:
        head = f"offset: {batch.last_offset}"
    return (f"{head} position: {position} {batch.timestamp_type.kafka_name}: {batch.max_timestamp} "
            f"size: {batch.size_in_bytes} magic: {batch.magic} compresscodec: "
            f"{batch.compression.kafka_name} crc: {batch.crc} isvalid: {str(batch.is_valid()).lower()}")


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", errors="replace")


def format_record(batch: RecordBatch, record, print_data: bool, offsets_decoder: bool = False,
                  transaction_log_decoder: bool = False, skip_metadata: bool = False) -> str:
    """One record line of DumpLogSegments.dumpLog. Kafka's quirks kept: with
    --skip-record-metadata the line starts with the key, or with " payload:" when there is no key."""
    line, prefix = "", f"{RECORD_INDENT} "
    if not skip_metadata:
        line = (f"{prefix}offset: {record.offset} {batch.timestamp_type.kafka_name}: "
                f"{record.timestamp} keySize: {-1 if record.key is None else len(record.key)} "
                f"valueSize: {-1 if record.value is None else len(record.value)} sequence: "
                f"{record.sequence} headerKeys: [{','.join(k for k, _ in record.headers)}]")
        prefix = " "
        if batch.is_control:
            line += _control_text(record)
    if not batch.is_control:
        key, payload = _decoded(record, print_data, offsets_decoder, transaction_log_decoder)
        if key is not None:
            line += f"{prefix}key: {key}"
        if payload is not None:
            line += f" payload: {payload}"
    return line


def _control_text(record) -> str:
    kind = _control_type(record.key)
    kraft = _kraft_control_json(kind, record.value)
    if kind in (ControlRecordType.ABORT, ControlRecordType.COMMIT) and record.value \
            and len(record.value) >= 6:
        (coordinator_epoch,) = struct.unpack_from(">i", record.value, 2)
        return f" endTxnMarker: {kind.name} coordinatorEpoch: {coordinator_epoch}"
    if kraft is not None:
        return kraft
    type_id = struct.unpack_from(">h", record.key, 2)[0] if record.key and len(record.key) >= 4 else -1
    return f" controlType: {kind.name}({type_id})"


def _decoded(record, print_data: bool, offsets_decoder: bool,
             transaction_log_decoder: bool) -> tuple[str | None, str | None]:
    """The key and payload text to print (None: not printed)."""
    if transaction_log_decoder:   # --transaction-log-decoder: __transaction_state records
        from .transaction_log import decode_transaction_log_record
        return decode_transaction_log_record(record.key, record.value)
    if offsets_decoder:   # --offsets-decoder: __consumer_offsets records as JSON
        from .offsets_decoder import decode_offsets_record
        return decode_offsets_record(record.key, record.value)
    if print_data:
        return (None if record.key is None else _text(record.key),
                None if record.value is None else _text(record.value))
    return None, None


# KRaft's control records in snapshots, printed as Kafka's tool prints them: the record's name
# and its fields as JSON (SnapshotHeaderRecord, SnapshotFooterRecord, KRaftVersionRecord).
_KRAFT_CONTROL = {
    ControlRecordType.SNAPSHOT_HEADER: ("SnapshotHeader", ">hq", ("version", "lastContainedLogTimestamp")),
    ControlRecordType.SNAPSHOT_FOOTER: ("SnapshotFooter", ">h", ("version",)),
    ControlRecordType.KRAFT_VERSION: ("KRaftVersion", ">hh", ("version", "kRaftVersion")),
}


def _kraft_control_json(kind: ControlRecordType, value: bytes | None) -> str | None:
    spec = _KRAFT_CONTROL.get(kind)
    if spec is None or value is None or len(value) < struct.calcsize(spec[1]):
        return None
    name, fmt, fields = spec
    data = dict(zip(fields, struct.unpack_from(fmt, value, 0)))
    return f" {name} {json.dumps(data, separators=(',', ':'))}"


def _control_type(key: bytes | None) -> ControlRecordType:
    if key is None or len(key) < 4:
        return ControlRecordType.UNKNOWN
    try:
        return ControlRecordType(struct.unpack_from(">h", key, 2)[0])
    except ValueError:
        return ControlRecordType.UNKNOWN


def dump_log(path: str, out: TextIO, err: TextIO, print_data: bool, deep: bool,
             offsets_decoder: bool = False, transaction_log_decoder: bool = False,
             skip_metadata: bool = False, max_bytes: int | None = None) -> bool:
    """A `.log` segment, or a KRaft snapshot (`.checkpoint`), which holds batches too. Returns
    False when a damaged batch stopped the dump (Kafka's tool dies with an exception there).

    `max_bytes` (--max-bytes) reads only the batches wholly inside the first bytes. With deep
    iteration, offsets that do not follow one another (a compacted log) are listed on stderr
    in the words of Kafka's tool (which lists them after the dump)."""
    name = os.path.basename(path)
    if name.endswith(".log"):
        out.write(f"Log starting offset: {offset_from_file_name(path)}\n")
    elif name == "bootstrap.checkpoint":
        out.write("KRaft bootstrap snapshot\n")
    else:   # <end offset, 20 digits>-<epoch, 10 digits>.checkpoint
        end_offset, _, epoch = name[:-len(".checkpoint")].partition("-")
        if not (end_offset.isdigit() and epoch.isdigit()):
            raise KStoreError(f"{name} is not a KRaft snapshot name "
                              f"(<end offset>-<epoch>.checkpoint)")
        out.write(f"Snapshot end offset: {int(end_offset)}, epoch: {int(epoch)}\n")
    records = FileRecords(path, file_already_exists=True, read_only=True)
    complete, gaps = True, 0
    try:
        valid, last_offset = 0, -1
        try:
            for batch in records.batches(0, max_bytes):
                out.write(format_batch(batch, valid) + "\n")
                if deep or print_data or offsets_decoder or transaction_log_decoder:
                    for record in batch.records():
                        if last_offset != -1 and record.offset != last_offset + 1:
                            gaps += 1   # said at once: a compacted log may have millions
                            if gaps == 1:
                                err.write(f"Non-consecutive offsets in {os.path.abspath(path)}\n")
                            err.write(f"  {last_offset} is followed by {record.offset}\n")
                        last_offset = record.offset
                        out.write(format_record(batch, record, print_data, offsets_decoder,
                                                transaction_log_decoder, skip_metadata) + "\n")
                valid += batch.size_in_bytes
        except KStoreError as e:  # Kafka's tool stops with an exception; we say where and why
            err.write(f"{os.path.basename(path)}: stopped at position {valid}: {e}\n")
            complete = False
        trailing = records.size_in_bytes() - valid
        if trailing > 0 and max_bytes is None:
            out.write(f"Found {trailing} invalid bytes at the end of {os.path.basename(path)}\n")
    finally:
        records.close_handlers()
    return complete


def _companion(path: str, suffix: str) -> str:
    return os.path.join(os.path.dirname(path), os.path.basename(path).split(".")[0] + suffix)


def dump_index(path: str, out: TextIO, err: TextIO, sanity_only: bool,
               verify_only: bool = False) -> None:
    base = offset_from_file_name(path)
    index = OffsetIndex(path, base, writable=False)
    try:
        if index.entries == 0:
            out.write(f"{path} is empty.\n")
            return
        if sanity_only:
            index.sanity_check()
            out.write(f"{path} passed sanity check.\n")
            return
        log_path = _companion(path, ".log")
        records = FileRecords(log_path, file_already_exists=True) if os.path.exists(log_path) else None
        mismatches = []
        for i in range(index.entries):
            entry = index.entry(i)
            if entry.offset == base and i > 0:
                break  # a sparse file after a crash: zero entries from here on
            if records is not None:
                first = next(records.batch_locations(entry.position), None)
                if first is not None and first.last_offset != entry.offset:
                    mismatches.append((entry.offset, first.last_offset))
            if not verify_only:   # --verify-index-only: the mismatches alone
                out.write(f"offset: {entry.offset} position: {entry.position}\n")
        if records is not None:
            records.close_handlers()
        if mismatches:
            err.write(f"Mismatches in :{os.path.abspath(path)}\n")
            for idx, log_off in mismatches:
                err.write(f"  Index offset: {idx}, log offset: {log_off}\n")
    finally:
        index.close_handler()


def dump_time_index(path: str, out: TextIO, err: TextIO, sanity_only: bool,
                    verify_only: bool = False) -> None:
    """The entries, each checked against the segment as DumpLogSegments.dumpTimeIndex checks
    them: the indexed offset must end a batch whose largest record timestamp is the indexed one,
    and timestamps must grow. What does not hold is listed on stderr, in Kafka's words."""
    base = offset_from_file_name(path)
    index = TimeIndex(path, base, writable=False)
    try:
        if sanity_only:
            index.sanity_check()
            out.write(f"{path} passed sanity check.\n")
            return
        check = _TimeIndexCheck(path, base)
        try:
            for i in range(index.entries):
                entry = index.entry(i)
                if entry.offset == base and i > 0:
                    break
                check.entry(entry.timestamp, entry.offset)
                if not verify_only:
                    out.write(f"timestamp: {entry.timestamp} offset: {entry.offset}\n")
        finally:
            check.close()
        check.report(err)
    finally:
        index.close_handler()


class _TimeIndexCheck:
    """The segment a time index belongs to, for checking its entries (nothing when absent)."""

    def __init__(self, path: str, base: int):
        log_path, index_path = _companion(path, ".log"), _companion(path, ".index")
        self.records = (FileRecords(log_path, file_already_exists=True, read_only=True)
                        if os.path.exists(log_path) else None)
        self.offsets = (OffsetIndex(index_path, base, writable=False)
                        if self.records is not None and os.path.exists(index_path) else None)
        self.path, self.previous = os.path.abspath(path), -1
        self.mismatches: list[tuple[int, int]] = []
        self.out_of_order: list[tuple[int, int]] = []
        self.not_found: list[tuple[int, int]] = []

    def entry(self, timestamp: int, offset: int) -> None:
        if self.records is None:
            return
        start = self.offsets.lookup(offset).position if self.offsets is not None else 0
        batch = next((b for b in self.records.batches(start) if b.last_offset >= offset), None)
        if batch is None or batch.last_offset != offset:
            self.not_found.append((offset, -1 if batch is None else batch.last_offset))
        else:
            largest = max((r.timestamp for r in batch.records()), default=-1)
            if largest != timestamp:
                self.mismatches.append((timestamp, largest))
            if self.previous >= timestamp:
                self.out_of_order.append((timestamp, self.previous))
        self.previous = timestamp

    def report(self, err: TextIO) -> None:
        if self.mismatches:
            err.write(f"Found timestamp mismatch in :{self.path}\n")
            err.writelines(f"  Index timestamp: {i}, log timestamp: {g}\n" for i, g in self.mismatches)
        if self.out_of_order:
            err.write(f"Found out of order timestamp in :{self.path}\n")
            err.writelines(f"  Index timestamp: {i}, Previously indexed timestamp: {p}\n"
                           for i, p in self.out_of_order)
        if self.not_found:
            err.write("The following indexed offsets are not found in the log.\n")
            err.writelines(f"Indexed offset: {i}, found log offset: {g}\n" for i, g in self.not_found)

    def close(self) -> None:
        if self.offsets is not None:
            self.offsets.close_handler()
        if self.records is not None:
            self.records.close_handlers()


def dump_snapshot(path: str, out: TextIO) -> None:
    with open(path, "rb") as f:
        for e in read_snapshot(f.read(), path):
            out.write(f"producerId: {e.producer_id} producerEpoch: {e.producer_epoch} "
                      f"coordinatorEpoch: {e.coordinator_epoch} currentTxnFirstOffset: "
                      f"{_optional_long(None if e.current_txn_first_offset < 0 else e.current_txn_first_offset)} "
                      f"lastTimestamp: {e.timestamp} firstSequence: {e.first_sequence} "
                      f"lastSequence: {e.last_sequence} lastOffset: {e.last_offset} "
                      f"offsetDelta: {e.offset_delta} timestamp: {e.timestamp}\n")


def dump_txn_index(path: str, out: TextIO) -> None:
    """One line per aborted transaction, as DumpLogSegments.dumpTxnIndex prints them."""
    for t in read_entries(path):
        out.write(f"version: {t.version} producerId: {t.producer_id} firstOffset: {t.first_offset} "
                  f"lastOffset: {t.last_offset} lastStableOffset: {t.last_stable_offset}\n")


def dump_checkpoint(path: str, out: TextIO) -> None:
    name = os.path.basename(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if name == "leader-epoch-checkpoint":
        for epoch, start in parse_checkpoint(text, 2, path):
            out.write(f"epoch: {epoch} startOffset: {start}\n")
    else:
        entries = parse_checkpoint(text, 3, path)
        if not entries:
            out.write(f"{path} is empty.\n")
        for topic, partition, offset in entries:
            out.write(f"topic: {topic} partition: {partition} offset: {offset}\n")


def dump_file(path: str, out: TextIO = sys.stdout, err: TextIO = sys.stderr, *,
              print_data: bool = False, index_sanity_check: bool = False,
              deep_iteration: bool = False, offsets_decoder: bool = False,
              transaction_log_decoder: bool = False, skip_record_metadata: bool = False,
              max_bytes: int | None = None, verify_index_only: bool = False) -> bool:
    """Dump one file; return False if it could not be read (the error goes to `err`)."""
    out.write(f"Dumping {path}\n")
    name = os.path.basename(path)
    if not os.path.exists(path):
        err.write(f"{path}: no such file\n")
        return False
    try:
        if name.endswith((".log", ".checkpoint")):   # .checkpoint: a KRaft snapshot
            return dump_log(path, out, err, print_data, deep_iteration, offsets_decoder,
                            transaction_log_decoder, skip_record_metadata, max_bytes)
        elif name.endswith(".index"):
            dump_index(path, out, err, index_sanity_check, verify_index_only)
        elif name.endswith(".timeindex"):
            dump_time_index(path, out, err, index_sanity_check, verify_index_only)
        elif name.endswith(".snapshot"):
            dump_snapshot(path, out)
        elif name.endswith(".txnindex"):
            dump_txn_index(path, out)
        elif name.endswith("checkpoint"):
            dump_checkpoint(path, out)
        elif name in ("partition.metadata", "meta.properties", "quorum-state"):
            with open(path, encoding="utf-8") as f:
                out.write(f.read().rstrip("\n") + "\n")
        elif name == ".kafka_cleanshutdown":
            with open(path, encoding="utf-8") as f:
                out.write(json.dumps(json.loads(f.read() or "{}")) + "\n")
        else:
            err.write(f"Ignoring unknown file {path}\n")
            return False
    except BrokenPipeError:
        raise
    except (KStoreError, ValueError, OSError) as e:
        err.write(f"{path}: {e}\n")
        return False
    return True

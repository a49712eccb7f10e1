"""Which Kafka field every byte of a file belongs to (the hex view's colouring and hover text).

Pure functions over bytes read from the real files:
* `.log`       — batch header fields (at the byte positions of `records.HEADER_FIELDS`), then each
                 record's fields: its length, attributes, timestamp and offset deltas (zig-zag
                 varints), key and value with their varint lengths, headers;
* `.index`     — 8-byte entries: relativeOffset (int32), position (int32);
* `.timeindex` — 12-byte entries: timestamp (int64), relativeOffset (int32);
* checkpoint and metadata text files — the version line, the count line, each entry line;
* producer `.snapshot` files — header and 46-byte entries.
Each field is a `Field(start, end, kind, name, value, group)` with absolute file positions; `kind`
picks the colour (see `KINDS`), `name` is Kafka's field name and `value` the decoded value.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Callable

from ..compression import Compression
from ..records import (ATTRIBUTES_OFFSET, COMPRESSION_CODEC_MASK, CONTROL_FLAG_MASK,
                       DELETE_HORIZON_FLAG_MASK, HEADER_FIELDS, LOG_OVERHEAD,
                       MIN_BATCH_LENGTH_FIELD, RECORDS_OFFSET,
                       TIMESTAMP_TYPE_MASK, TRANSACTIONAL_FLAG_MASK, crc32c)
from ..varint import read_unsigned_varint
from ._base import fmt_ts, short_text

Reader = Callable[[int, int], bytes]


@dataclass(frozen=True)
class Field:
    start: int          # first byte (absolute position in the file)
    end: int            # one past the last byte
    kind: str           # colour key, see KINDS
    name: str           # Kafka's name for the field
    value: str          # the decoded value, as text
    group: tuple = ()   # ("batch", pos) / ("record", batch_pos, i) / ("entry", slot) / ("line", n)
    varint: bool = False

    def covers(self, position: int) -> bool:
        return self.start <= position < self.end

    @property
    def title(self) -> str:
        where = f"bytes {self.start}–{self.end - 1}" if self.end - self.start > 1 else f"byte {self.start}"
        if self.group and self.group[0] in ("batch", "record"):
            rel = self.start - self.group[1]
            where += f" (batch byte {rel})"
        return f"{self.name} [{where}]: {self.value}"


# kind -> (colour, legend text)
KINDS: dict[str, tuple[str, str]] = {
    # batch header (one colour per field)
    "baseOffset": ("#ffd6a5", "baseOffset int64 — first offset in the batch"),
    "batchLength": ("#fdffb6", "batchLength int32 — bytes after this field"),
    "partitionLeaderEpoch": ("#caffbf", "partitionLeaderEpoch int32"),
    "magic": ("#9bf6ff", "magic int8 — format version (2)"),
    "crc": ("#ff8fa3", "crc uint32 — CRC-32C of attributes..end"),
    "attributes": ("#bdb2ff", "attributes int16 — compression, timestamp type, flags"),
    "lastOffsetDelta": ("#ffc6ff", "lastOffsetDelta int32"),
    "baseTimestamp": ("#a0c4ff", "baseTimestamp int64"),
    "maxTimestamp": ("#8ecae6", "maxTimestamp int64"),
    "producerId": ("#e9c46a", "producerId int64"),
    "producerEpoch": ("#f4a261", "producerEpoch int16"),
    "baseSequence": ("#e5989b", "baseSequence int32"),
    "recordsCount": ("#b5e48c", "recordsCount int32"),
    # records (varint-encoded fields are drawn with a dotted underline too)
    "recordLength": ("#d9ed92", "record length (varint)"),
    "recordAttributes": ("#e0e0e0", "record attributes int8 (unused)"),
    "timestampDelta": ("#cfe1ff", "timestampDelta (varlong)"),
    "offsetDelta": ("#ffe5ec", "offsetDelta (varint)"),
    "keyLength": ("#fff3b0", "keyLength (varint, -1 = null)"),
    "key": ("#ffe066", "key bytes"),
    "valueLength": ("#d8f3dc", "valueLength (varint, -1 = null)"),
    "value": ("#95d5b2", "value bytes"),
    "headersCount": ("#e2ece9", "headers count (varint)"),
    "headerKeyLength": ("#f1e4f3", "header key length (varint)"),
    "headerKey": ("#dec9e9", "header key"),
    "headerValueLength": ("#f1e4f3", "header value length (varint)"),
    "headerValue": ("#cdb4db", "header value"),
    "compressedRecords": ("#c9ada7", "records, compressed as one block"),
    "partialBatch": ("#adb5bd", "partial trailing batch (incomplete)"),
    "unparsed": ("#ced4da", "bytes that do not parse"),
    "preallocated": ("#f8f9fa", "preallocated, not yet used (zeros)"),
    # indexes
    "relativeOffset": ("#ffd6a5", "index: relativeOffset int32 (offset − base offset)"),
    "position": ("#a0c4ff", "index: position int32 — byte position of a batch in the .log"),
    "timestamp": ("#caffbf", "time index: timestamp int64"),
    "unusedSlot": ("#f1f3f5", "index: unused preallocated slot"),
    # text files
    "cpVersion": ("#bdb2ff", "checkpoint: version line"),
    "cpCount": ("#fdffb6", "checkpoint: number of entries"),
    "cpEntry": ("#caffbf", "checkpoint: one entry"),
    "metaLine": ("#9bf6ff", "metadata line (key: value)"),
    "newline": ("#eeeeee", "newline"),
    # producer snapshots
    "snapshotHeader": ("#bdb2ff", "snapshot header: version, crc, count"),
    "snapshotEntry": ("#caffbf", "snapshot entry: one producer (46 bytes)"),
    "raw": ("#ffffff", "bytes of an unknown format"),
}

CHECKPOINT_FILES = {
    "recovery-point-offset-checkpoint": "recovery point (offsets below are fsynced)",
    "log-start-offset-checkpoint": "log start offset",
    "replication-offset-checkpoint": "high watermark",
    "cleaner-offset-checkpoint": "first dirty offset (compaction resumes here)",
    "leader-epoch-checkpoint": None,
}
STATUS_SUFFIXES = (".deleted", ".cleaned", ".swap")


def file_kind(path: str) -> str:
    """log / index / timeindex / snapshot / checkpoint / properties / raw, from the file name."""
    name = os.path.basename(path)
    for suffix in STATUS_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    if name in CHECKPOINT_FILES:
        return "checkpoint"
    if name in ("partition.metadata", "meta.properties", ".kafka_cleanshutdown"):
        return "properties"
    ext = os.path.splitext(name)[1]
    return {".log": "log", ".index": "index", ".timeindex": "timeindex",
            ".snapshot": "snapshot"}.get(ext, "raw")


# ------------------------------------------------------------------------------------------------
# .log files
# ------------------------------------------------------------------------------------------------

def describe_attributes(attributes: int) -> str:
    codec = Compression(attributes & COMPRESSION_CODEC_MASK).name.lower() \
        if attributes & COMPRESSION_CODEC_MASK <= 4 else "?"
    parts = [f"compression {codec}",
             "LogAppendTime" if attributes & TIMESTAMP_TYPE_MASK else "CreateTime"]
    if attributes & TRANSACTIONAL_FLAG_MASK:
        parts.append("transactional")
    if attributes & CONTROL_FLAG_MASK:
        parts.append("control batch")
    if attributes & DELETE_HORIZON_FLAG_MASK:
        parts.append("has delete horizon")
    return f"0x{attributes & 0xFFFF:04x}: " + ", ".join(parts)


def _header_value(name: str, value: int, head: dict, data: bytes) -> str:
    if name == "baseOffset":
        return f"{value} (first offset of the batch)"
    if name == "batchLength":
        return f"{value} bytes follow; batch = {value + LOG_OVERHEAD} bytes"
    if name == "magic":
        return f"{value} (RecordBatch v{value})"
    if name == "crc":
        end = LOG_OVERHEAD + head["batchLength"]
        if len(data) >= end:
            computed = crc32c(bytes(data[ATTRIBUTES_OFFSET:end]))
            ok = "valid" if computed == value else f"INVALID (computed 0x{computed:08x})"
            return f"0x{value:08x} — CRC-32C of bytes 21..{end - 1}: {ok}"
        return f"0x{value:08x} (batch incomplete: not checked)"
    if name == "attributes":
        return describe_attributes(value)
    if name == "lastOffsetDelta":
        return f"{value} (last offset = {head['baseOffset'] + value})"
    if name in ("baseTimestamp", "maxTimestamp"):
        horizon = name == "baseTimestamp" and head.get("attributes", 0) & DELETE_HORIZON_FLAG_MASK
        label = " = delete horizon" if horizon else ""
        return f"{value} ({fmt_ts(value)} UTC){label}"
    if name in ("producerId", "producerEpoch", "baseSequence") and value == -1:
        return "-1 (none)"
    return str(value)


def batch_fields(data: bytes, position: int, stop: int | None = None) -> list[Field]:
    """Every field of the batch whose bytes (maybe cut short) are `data`, at file `position`.
    With `stop` (a file position), records starting at or after it are not decoded."""
    out: list[Field] = []
    head: dict[str, int] = {}
    group = ("batch", position)
    for name, off, size, fmt in HEADER_FIELDS:
        if off + size > len(data):
            out.append(Field(position + off, position + len(data), "partialBatch", "partial batch",
                             f"{len(data)} bytes of an incomplete batch", group))
            return out
        (value,) = struct.unpack_from(fmt, data, off)
        head[name] = value
    for name, off, size, _ in HEADER_FIELDS:
        out.append(Field(position + off, position + off + size, name, name,
                         _header_value(name, head[name], head, data), group))
    total = LOG_OVERHEAD + head["batchLength"]
    if len(data) < total:
        out.append(Field(position + RECORDS_OFFSET, position + len(data), "partialBatch",
                         "partial batch", f"{len(data)} of {total} bytes present", group))
        return out
    codec = head["attributes"] & COMPRESSION_CODEC_MASK
    if codec:
        name = Compression(codec).name.lower() if codec <= 4 else str(codec)
        out.append(Field(position + RECORDS_OFFSET, position + total, "compressedRecords",
                         "records (compressed)", f"{head['recordsCount']} records, {name}, "
                         f"{total - RECORDS_OFFSET} bytes compressed", group))
        return out
    out.extend(record_fields(data, position, head, total, stop))
    return out


def _varint_field(buf: bytes, pos: int, base: int, kind: str, name: str, group: tuple,
                  long: bool = False, explain: Callable[[int], str] | None = None
                  ) -> tuple[Field, int, int]:
    z, end = read_unsigned_varint(buf, pos, 10 if long else 5)
    value = (z >> 1) ^ -(z & 1)
    text = f"{value} (zig-zag varint {buf[pos:end].hex(' ')} → {z} → {value})"
    if explain:
        text += f"; {explain(value)}"
    return Field(base + pos, base + end, kind, name, text, group, varint=True), value, end


def record_fields(data: bytes, position: int, head: dict, total: int,
                  stop: int | None = None) -> list[Field]:
    """The fields of each record of an uncompressed batch (DefaultRecord layout), up to the
    first record that starts at or after file position `stop`."""
    out: list[Field] = []
    pos = RECORDS_OFFSET
    base_offset, base_ts = head["baseOffset"], head["baseTimestamp"]
    for i in range(max(head["recordsCount"], 0)):
        if pos >= total:
            break
        if stop is not None and position + pos >= stop:
            return out                  # the caller's window ends before this record
        g = ("record", position, i)
        try:
            f, length, body = _varint_field(data, pos, position, "recordLength", "record length", g,
                                            explain=lambda n: f"record {i} body is {n} bytes")
            out.append(f)
            end = body + length
            out.append(Field(position + body, position + body + 1, "recordAttributes",
                             "record attributes", f"{data[body]} (unused)", g))
            f, ts_delta, p = _varint_field(data, body + 1, position, "timestampDelta",
                                           "timestampDelta", g, long=True,
                                           explain=lambda d: f"timestamp {base_ts + d}")
            out.append(f)
            f, off_delta, p = _varint_field(data, p, position, "offsetDelta", "offsetDelta", g,
                                            explain=lambda d: f"offset {base_offset + d}")
            out.append(f)
            for what in ("key", "value"):
                f, n, p = _varint_field(data, p, position, f"{what}Length", f"{what}Length", g,
                                        explain=lambda n, w=what: f"{w} is null" if n < 0 else f"{n} bytes")
                out.append(f)
                if n > 0:
                    out.append(Field(position + p, position + p + n, what, what,
                                     f"{short_text(data[p:p + n], 40)!r} ({n} bytes) of record "
                                     f"offset {base_offset + off_delta}", g))
                    p += n
            f, n_headers, p = _varint_field(data, p, position, "headersCount", "headers count", g)
            out.append(f)
            for h in range(max(n_headers, 0)):
                for what in ("headerKey", "headerValue"):
                    f, n, p = _varint_field(data, p, position, f"{what}Length", f"{what} length", g)
                    out.append(f)
                    if n > 0:
                        out.append(Field(position + p, position + p + n, what, f"{what} {h}",
                                         repr(short_text(data[p:p + n], 40)), g))
                        p += n
            pos = end
        except Exception as e:  # a corrupt record: show the rest as unparsed
            out.append(Field(position + pos, position + total, "unparsed", "unparsed bytes",
                             f"record {i} does not parse: {e}", ("batch", position)))
            return out
    if pos < total:
        out.append(Field(position + pos, position + total, "unparsed", "unparsed bytes",
                         f"{total - pos} bytes after the declared records", ("batch", position)))
    return out


def batch_length_at(read: Reader, position: int) -> int | None:
    """The size of the batch starting at `position` (None if the header is cut or impossible)."""
    head = read(position, LOG_OVERHEAD)
    if len(head) < LOG_OVERHEAD:
        return None
    (length,) = struct.unpack_from(">i", head, 8)
    if length < MIN_BATCH_LENGTH_FIELD:
        return None
    return LOG_OVERHEAD + length


def log_fields(read: Reader, size: int, first_batch: int, start: int, end: int,
               file_length: int | None = None) -> list[Field]:
    """Fields of the `.log` bytes [start, end), walking batch headers from `first_batch` (a batch
    boundary at or before `start`). Bytes past the logical `size` up to `file_length` are
    preallocated zeros."""
    out: list[Field] = []
    pos = first_batch
    limit = min(end, size)
    while pos < limit:
        batch_size = batch_length_at(read, pos)
        if batch_size is None:
            out.append(Field(pos, size, "unparsed" if size - pos >= LOG_OVERHEAD else "partialBatch",
                             "unparsed bytes", "no valid batch header here", ("batch", pos)))
            break
        if pos + batch_size > start:
            data = read(pos, min(batch_size, size - pos))
            out.extend(f for f in batch_fields(data, pos, end) if f.end > start and f.start < end)
        pos += batch_size
    file_length = size if file_length is None else file_length
    if end > size and file_length > size:
        out.append(Field(max(size, start), min(file_length, end), "preallocated", "preallocated",
                         f"beyond the logical end {size}: the file was preallocated", ()))
    return out


# ------------------------------------------------------------------------------------------------
# .index and .timeindex files
# ------------------------------------------------------------------------------------------------

def index_fields(read: Reader, start: int, end: int, *, time_index: bool, base_offset: int,
                 entries: int | None, log_name: str = "") -> list[Field]:
    """Fields of the index entries overlapping [start, end). `entries=None` guesses: a slot after
    the first that is all zeros is unused (preallocated)."""
    size = 12 if time_index else 8
    first, last = start // size, (end + size - 1) // size
    data = read(first * size, (last - first) * size)
    out = []
    for k in range(len(data) // size):
        slot = first + k
        raw = data[k * size:(k + 1) * size]
        p = slot * size
        g = ("entry", slot)
        used = slot < entries if entries is not None else (slot == 0 or any(raw))
        if not used:
            out.append(Field(p, p + size, "unusedSlot", f"slot {slot}",
                             "unused slot (preallocated to segment.index.bytes)", g))
            continue
        if time_index:
            ts, rel = struct.unpack(">qi", raw)
            out.append(Field(p, p + 8, "timestamp", f"entry {slot} timestamp",
                             f"{ts} ({fmt_ts(ts)} UTC): largest timestamp so far", g))
            out.append(Field(p + 8, p + 12, "relativeOffset", f"entry {slot} relativeOffset",
                             f"{rel} → offset {base_offset + rel}", g))
        else:
            rel, pos = struct.unpack(">ii", raw)
            out.append(Field(p, p + 4, "relativeOffset", f"entry {slot} relativeOffset",
                             f"{rel} → offset {base_offset + rel}", g))
            out.append(Field(p + 4, p + 8, "position", f"entry {slot} position",
                             f"{pos} → the batch at byte {pos} of {log_name or 'the .log'}", g))
    return out


# ------------------------------------------------------------------------------------------------
# text files (checkpoints, partition.metadata, meta.properties) and producer snapshots
# ------------------------------------------------------------------------------------------------

def _checkpoint_entry_meaning(file_name: str, parts: list[str]) -> str:
    if file_name == "leader-epoch-checkpoint" and len(parts) == 2:
        return f"leader epoch {parts[0]} started at offset {parts[1]}"
    meaning = CHECKPOINT_FILES.get(file_name)
    if len(parts) == 3 and meaning:
        return f"{parts[0]}-{parts[1]}: {meaning} = {parts[2]}"
    return " ".join(parts)


def text_fields(data: bytes, path: str) -> list[Field]:
    """One field per line (and per newline) of a checkpoint or metadata text file."""
    name = os.path.basename(path)
    for suffix in (".tmp",) + STATUS_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    checkpoint = name in CHECKPOINT_FILES
    out, pos = [], 0
    for n, line in enumerate(data.split(b"\n")):
        text = line.decode("utf-8", "replace")
        g = ("line", n)
        if line:
            if checkpoint and n == 0:
                kind, label, value = "cpVersion", "version", f"{text} (checkpoint format version)"
            elif checkpoint and n == 1:
                kind, label, value = "cpCount", "entry count", f"{text} entries follow"
            elif checkpoint:
                kind, label = "cpEntry", f"entry {n - 2}"
                value = _checkpoint_entry_meaning(name, text.split())
            else:
                kind, label, value = "metaLine", f"line {n}", text
            out.append(Field(pos, pos + len(line), kind, label, value, g))
        pos += len(line)
        if pos < len(data):
            out.append(Field(pos, pos + 1, "newline", "newline", "\\n (0x0a)", g))
            pos += 1
    return out


def snapshot_fields(data: bytes) -> list[Field]:
    out = []
    if len(data) >= 10:
        version, crc, count = struct.unpack_from(">hIi", data, 0)
        out.append(Field(0, 10, "snapshotHeader", "snapshot header",
                         f"version {version}, crc 0x{crc:08x}, {count} producers", ("entry", -1)))
        for i in range((len(data) - 10) // 46):
            p = 10 + i * 46
            pid, epoch, last_seq, last_off = struct.unpack_from(">qhiq", data, p)
            out.append(Field(p, p + 46, "snapshotEntry", f"producer {i}",
                             f"producerId {pid}, epoch {epoch}, lastSequence {last_seq}, "
                             f"lastOffset {last_off}", ("entry", i)))
    return out

"""Partition directory view: the segments and files of one partition, as they are on disk now.

Shows one row per segment (base offset, `.log` size, batch and record counts, first/last offset,
first/largest timestamp, offset- and time-index entry counts, which one is active), every file in
the directory with its size and status (`.deleted` waiting for file.delete.delay.ms, `.cleaned` /
`.swap` mid-compaction), the checkpoint files with their entries, and the log's offsets (log
start offset, high watermark, recovery point, log end offset).

Engine state read: `os.scandir(log.dir)`, each `LogSegment` (size, index entry counts, batch headers
read from the `.log` — only the bytes appended since the last render are scanned), the
leader-epoch checkpoint and the log's offsets. Updates on every event of the partition (append,
roll, delete, clean, truncate, flush, retention, log start offset).
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass

from ..events import Event
from ..log import Log
from . import fields as F
from ._base import (HtmlView, LiveModel, attrs, esc, fmt_bytes, fmt_ts, style, table)

DIR_CSS = """
.ks-dir .ks-st-deleted td{color:#a00;text-decoration:line-through;}
.ks-dir .ks-st-cleaned td,.ks-dir .ks-st-swap td{color:#a60;font-style:italic;}
.ks-dir .ks-offsets span{margin-right:14px;}
"""


@dataclass
class SegmentSummary:
    """What the directory view shows of one segment (scanned from its batch headers)."""
    base_offset: int
    file: str
    size: int
    batches: int
    records: int
    first_offset: int | None
    last_offset: int | None
    first_timestamp: int
    max_timestamp: int
    index_entries: int
    time_index_entries: int
    active: bool


class _ScanCache:
    """Per segment: header counts for the bytes scanned so far, extended incrementally."""

    def __init__(self) -> None:
        # keyed by the FileRecords object: a cleaned segment replacing one at the same base
        # offset (same file name after the swap) is a new object, so it is scanned afresh
        self.by_file: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def summary(self, segment, active: bool) -> SegmentSummary:
        key = segment.log
        size = segment.log.size_in_bytes()
        state = self.by_file.get(key)
        if state is None or state[0] > size:   # new, or truncated: rescan from the start
            state = [0, 0, 0, None, None, -1, -1]
        scanned, batches, records, first, last, first_ts, max_ts = state
        for b in segment.log.batch_headers(scanned):
            batches += 1
            records += b.records_count
            first = b.base_offset if first is None else first
            last = b.last_offset
            first_ts = b.base_timestamp if first_ts < 0 else first_ts
            max_ts = max(max_ts, b.max_timestamp)
            scanned = b.position + b.size_in_bytes
        self.by_file[key] = [scanned, batches, records, first, last, first_ts, max_ts]
        return SegmentSummary(segment.base_offset, os.path.basename(segment.log.path), size,
                              batches, records, first, last, first_ts, max_ts,
                              segment.offset_index.entries, segment.time_index.entries, active)


class DirectoryModel(LiveModel):
    """The partition directory of `log`, re-read on each of its events."""

    KINDS = ("append", "roll", "delete", "clean", "truncate", "flush", "recover", "load",
             "log_start_offset", "high_watermark", "close", "retention")

    def __init__(self, log: Log):
        super().__init__()
        self.log = log
        self._cache = _ScanCache()
        parent = os.path.dirname(log.dir)
        self.watch(log.events, self.KINDS,
                   source=lambda e: e.source in (log.dir, parent))

    # ---- state
    def segments(self) -> list[SegmentSummary]:
        segs = self.log.segments
        active = segs[-1].base_offset if segs else None
        return [self._cache.summary(s, s.base_offset == active) for s in segs]

    def files(self) -> list[dict]:
        """Every file in the partition directory: name, size, kind and status."""
        out = []
        with os.scandir(self.log.dir) as it:
            for entry in sorted(it, key=lambda e: e.name):
                if not entry.is_file():
                    continue
                status = next((s[1:] for s in F.STATUS_SUFFIXES if entry.name.endswith(s)), "live")
                out.append({"name": entry.name, "bytes": entry.stat().st_size,
                            "kind": F.file_kind(entry.name), "status": status})
        return out

    def checkpoints(self) -> dict[str, list[str]]:
        """The entries of the checkpoint files of the partition and of its log directory."""
        out = {}
        parent = os.path.dirname(self.log.dir)
        candidates = [os.path.join(self.log.dir, "leader-epoch-checkpoint"),
                      os.path.join(self.log.dir, "partition.metadata")]
        candidates += [os.path.join(parent, n) for n in F.CHECKPOINT_FILES
                       if n != "leader-epoch-checkpoint"]
        for path in candidates:
            try:
                with open(path, encoding="utf-8") as f:
                    lines = f.read().splitlines()
            except (FileNotFoundError, NotADirectoryError):
                continue
            if os.path.dirname(path) == parent:   # keep this partition's line only
                topic, part = self.log.topic, str(self.log.partition)
                lines = lines[:2] + [ln for ln in lines[2:] if ln.split()[:2] == [topic, part]]
            rel = os.path.relpath(path, parent)
            out[rel] = lines
        return out

    def offsets(self) -> dict[str, int]:
        log = self.log
        return {"log start offset": log.log_start_offset, "high watermark": log.high_watermark,
                "recovery point": log.recovery_point, "log end offset": log.log_end_offset}

    def apply_event(self, event: Event) -> bool | None:
        if event.kind == "retention" and event.details.get("deleted_segments") == 0:
            return False
        if event.kind in ("truncate", "clean", "recover", "load"):
            self._cache = _ScanCache()     # bytes were rewritten: count them again
        return True

    # ---- rendering
    def render_html(self) -> str:
        segs = self.segments()
        rows = [[s.base_offset, s.file, fmt_bytes(s.size), s.batches, s.records,
                 "-" if s.first_offset is None else s.first_offset,
                 "-" if s.last_offset is None else s.last_offset,
                 fmt_ts(s.first_timestamp), fmt_ts(s.max_timestamp), s.index_entries,
                 s.time_index_entries, "active" if s.active else ""] for s in segs]
        seg_table = table(["base offset", ".log file", "size", "batches", "records", "first offset",
                           "last offset", "first timestamp", "largest timestamp", ".index entries",
                           ".timeindex entries", ""], rows,
                          row_classes=["ks-active" if s.active else None for s in segs])
        files = self.files()
        file_table = table(["file", "bytes", "kind", "status"],
                           [[f["name"], f["bytes"], f["kind"], f["status"]] for f in files],
                           row_classes=[f"ks-st-{f['status']}" for f in files])
        cps = "".join(f"<div><b>{esc(name)}</b>: <code>{esc(' ⏎ '.join(lines))}</code></div>"
                      for name, lines in self.checkpoints().items())
        offs = "".join(f"<span>{esc(k)} <b>{v}</b></span>" for k, v in self.offsets().items())
        return (style(DIR_CSS) +
                f'<div class="ks-view ks-dir"{attrs(data_segments=len(segs))}>'
                f"<h4>{esc(self.log.dir)}</h4>"
                f'<div class="ks-offsets">{offs}</div>'
                f"<h4>segments ({len(segs)})</h4>{seg_table}"
                f"<h4>files ({len(files)})</h4>{file_table}"
                f"<h4>checkpoint files</h4>{cps or '<i>none yet</i>'}</div>")


class DirectoryView(HtmlView):
    """The directory view as a widget: one HTML block, redrawn on the partition's events."""

    model_class = DirectoryModel
    css_class = "kstore-directory"

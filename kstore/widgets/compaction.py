"""Retention and compaction view: the segment set and the records before and after a pass.

Shows two panels side by side. *Before*: the segments and records as they were just before the
latest retention or cleaning pass; records that the pass removed are struck out. *After*: the
segments and records now; offset gaps left by compaction are marked, tombstones are shown with
their delete horizon (and whether it has passed, so the next cleaning drops them). A summary
compares segments, records, bytes, log start offset and LEO, and lists which key kept which offset.

Engine state read: the log's segments and records (decoded from the `.log` files, capped at
`max_records`), its offsets and its clock. The *before* snapshot is kept current incrementally
from `append` events (only the appended bytes are decoded); the first `delete`/`clean`/
`truncate`/`log_start_offset`/`retention` event of a pass freezes it, and *after* is re-read from
the files when shown. The buttons run a real retention pass (`Log.delete_old_segments`) or a real
cleaning (`LogCleaner.clean_log`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..events import Event
from ..log import Log
from ._base import (LiveModel, WidgetView, attrs, esc, fmt_bytes, fmt_ts, short_text, style, table)

DESTRUCTIVE = ("delete", "clean", "truncate", "log_start_offset", "retention")

COMP_CSS = """
.ks-comp .ks-panels{display:flex;gap:18px;align-items:flex-start;}
.ks-comp .ks-panel{flex:1;min-width:260px;}
.ks-comp .ks-seg{border:1px solid #999;border-radius:3px;margin:4px 0;padding:3px;}
.ks-comp .ks-seg.ks-seg-gone{border-style:dashed;opacity:.6;}
.ks-comp .ks-seghead{font-size:11px;color:#333;margin-bottom:2px;}
.ks-comp .ks-rec{display:inline-block;font-family:monospace;font-size:10px;padding:1px 3px;margin:1px;border-radius:2px;background:#d8f3dc;border:1px solid #95d5b2;}
.ks-comp .ks-rec.ks-removed{background:#ffe5ec;border-color:#e5989b;text-decoration:line-through;color:#900;}
.ks-comp .ks-rec.ks-new{background:#cfe1ff;border-color:#5a8dee;}
.ks-comp .ks-rec.ks-tomb{background:#343a40;color:#fff;border-color:#000;}
.ks-comp .ks-rec.ks-tomb.ks-expired{background:#6c757d;text-decoration:line-through;}
.ks-comp .ks-gap{display:inline-block;font-size:10px;color:#a00;margin:1px 3px;}
"""


@dataclass(frozen=True)
class RecordCell:
    offset: int
    key: bytes | None
    value: str                 # preview ("⊘" for a tombstone)
    tombstone: bool
    segment: int
    horizon: int | None        # the batch's delete horizon (tombstones), if set


@dataclass
class SegmentInfo:
    base_offset: int
    size: int
    file: str


@dataclass
class Snapshot:
    log_start_offset: int
    log_end_offset: int
    clock_ms: int
    segments: list[SegmentInfo]
    records: list[RecordCell] = field(default_factory=list)
    truncated: bool = False    # more records than max_records: the record lists are cut

    def offsets(self) -> set[int]:
        return {r.offset for r in self.records}

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)


def _cells(batch, segment_base: int) -> list[RecordCell]:
    if batch.is_control:
        return []
    horizon = batch.delete_horizon_ms
    return [RecordCell(r.offset, r.key, "⊘" if r.value is None else short_text(r.value, 12),
                       r.value is None, segment_base, horizon) for r in batch.records()]


def segment_infos(log: Log) -> list[SegmentInfo]:
    return [SegmentInfo(s.base_offset, s.size, os.path.basename(s.log.path)) for s in log.segments]


def take_snapshot(log: Log, max_records: int = 5000) -> Snapshot:
    """The log's segments and (up to `max_records`) records, read from its files now."""
    snap = Snapshot(log.log_start_offset, log.log_end_offset, log.clock.milliseconds(),
                    segment_infos(log))
    for seg in log.segments:
        for batch in seg.log.batches():
            cells = [c for c in _cells(batch, seg.base_offset) if c.offset >= log.log_start_offset]
            if len(snap.records) + len(cells) > max_records:
                snap.truncated = True
                return snap
            snap.records.extend(cells)
    return snap


def offset_gaps(snap: Snapshot) -> list[tuple[int, int]]:
    """Ranges [a, b] of offsets inside [log start, LEO) that no record holds any more."""
    if snap.truncated:
        return []
    gaps, expected = [], snap.log_start_offset
    for r in sorted(snap.records, key=lambda c: c.offset):
        if r.offset > expected:
            gaps.append((expected, r.offset - 1))
        expected = r.offset + 1
    return gaps


class CompactionModel(LiveModel):
    """Before/after of the latest retention or compaction pass on `log`."""

    def __init__(self, log: Log, cleaner=None, max_records: int = 5000):
        super().__init__()
        self.log = log
        self.max_records = max_records
        self._cleaner = cleaner
        self.tracked = take_snapshot(log, max_records)   # "now", kept current from appends
        self.before: Snapshot | None = None
        self._after: Snapshot | None = None
        self._in_pass = False
        self.passes = 0
        self.last_action = ""
        parent = os.path.dirname(log.dir)
        self.watch(log.events, ("append", "roll") + DESTRUCTIVE,
                   source=lambda e: e.source in (log.dir, parent))

    # ---- actions
    @property
    def cleaner(self):
        if self._cleaner is None:
            from ..cleaner import LogCleaner
            self._cleaner = LogCleaner(os.path.dirname(self.log.dir), self.log.clock)
        return self._cleaner

    def run_retention(self) -> int:
        """One real retention pass (retention.ms / retention.bytes / log start offset)."""
        n = self.log.delete_old_segments()
        self.last_action = f"retention pass: {n} segment(s) deleted"
        self.changed()
        return n

    def run_cleaner(self):
        """Compact the log now (LogCleaner.clean_log), whatever its dirty ratio."""
        result = self.cleaner.clean_log(self.log)
        s = result.stats
        self.last_action = (f"cleaning: read {s.records_read} records, wrote "
                            f"{s.records_written}; {s.bytes_read - s.bytes_written} bytes saved")
        self.changed()
        return result

    # ---- events
    def apply_event(self, event: Event) -> bool | None:
        if event.kind in DESTRUCTIVE:
            if event.kind == "retention" and not event.details.get("deleted_segments"):
                return False
            if not self._in_pass:
                self.before = self.tracked
                self._in_pass = True
                self.passes += 1
            self._after = None                  # re-read when shown
            return True
        if event.kind == "append":
            if self._in_pass:                   # the pass is over: freeze "after" without this append
                after = take_snapshot(self.log, self.max_records)
                first = event.details["first_offset"]
                after.records = [r for r in after.records if r.offset < first]
                after.log_end_offset = first
                self._after, self._in_pass = after, False
                self.tracked = take_snapshot(self.log, self.max_records)
            else:
                self._track_append(event)
            return True
        if event.kind == "roll":
            self.tracked.segments = segment_infos(self.log)
            return True
        return False

    def _track_append(self, event: Event) -> None:
        d = event.details
        t = self.tracked
        t.segments = segment_infos(self.log)
        t.log_end_offset = self.log.log_end_offset
        t.clock_ms = self.log.clock.milliseconds()
        if t.truncated:
            return
        seg = next((s for s in self.log.segments if s.base_offset == d["segment"]), None)
        if seg is None:
            return
        for batch in seg.log.batches(d["position"], d["position"] + d["size"]):
            cells = _cells(batch, seg.base_offset)
            if len(t.records) + len(cells) > self.max_records:
                t.truncated = True
                return
            t.records.extend(cells)

    @property
    def after(self) -> Snapshot:
        if self.before is None:
            return self.tracked
        if self._after is None:
            self._after = take_snapshot(self.log, self.max_records)
        return self._after

    # ---- comparison
    def diff(self) -> dict:
        """What the latest pass did: removed/kept/new offsets, gaps, tombstones, segments."""
        before = self.before or self.tracked
        after = self.after
        b, a = before.offsets(), after.offsets()
        now = self.log.clock.milliseconds()
        tombs = [(r.offset, r.key, r.horizon, r.horizon is not None and now >= r.horizon)
                 for r in after.records if r.tombstone]
        b_segs, a_segs = {s.base_offset: s for s in before.segments}, {s.base_offset: s for s in after.segments}
        return {
            "removed": sorted(b - a), "kept": sorted(b & a), "new": sorted(a - b),
            "gaps": offset_gaps(after), "tombstones": tombs,
            "segments_removed": sorted(set(b_segs) - set(a_segs)),
            "segments_added": sorted(set(a_segs) - set(b_segs)),
            "segments_rewritten": sorted(k for k in set(b_segs) & set(a_segs)
                                         if b_segs[k].size != a_segs[k].size
                                         and k != self.log.active_segment.base_offset),
            "log_start_offset": (before.log_start_offset, after.log_start_offset),
            "log_end_offset": (before.log_end_offset, after.log_end_offset),
            "truncated": before.truncated or after.truncated,
        }

    def surviving_keys(self) -> list[tuple[str, list[int], int | None]]:
        """(key, offsets it had before, offset kept after or None) for every key."""
        before = self.before or self.tracked
        after_by_key: dict = {}
        for r in self.after.records:
            after_by_key[r.key] = r.offset
        keys: dict = {}
        for r in before.records:
            keys.setdefault(r.key, []).append(r.offset)
        return [(short_text(k, 16), offs, after_by_key.get(k)) for k, offs in keys.items()]

    # ---- rendering
    def _panel(self, snap: Snapshot, title: str, marks: dict[int, str], gaps, limit: int = 80) -> str:
        by_seg: dict[int, list[RecordCell]] = {}
        for r in snap.records:
            by_seg.setdefault(r.segment, []).append(r)
        now = self.log.clock.milliseconds()
        out = [f"<div class='ks-panel'><h4>{esc(title)}</h4>"]
        live = {s.base_offset for s in self.log.segments}
        for s in snap.segments:
            recs = by_seg.get(s.base_offset, [])
            cells = []
            for r in recs[:limit]:
                cls = ["ks-rec"]
                if r.offset in marks:
                    cls.append(marks[r.offset])
                tip = f"offset {r.offset}, key {short_text(r.key, 30)}, value {r.value}"
                if r.tombstone:
                    cls.append("ks-tomb")
                    if r.horizon is not None:
                        tip += f"; delete horizon {fmt_ts(r.horizon)}"
                        if now >= r.horizon:
                            cls.append("ks-expired")
                            tip += " (passed: the next cleaning drops it)"
                    else:
                        tip += "; no delete horizon yet (set by the first cleaning)"
                cells.append(f"<span{attrs(class_=' '.join(cls), title=tip, data_offset=r.offset)}>"
                             f"{r.offset}:{esc(short_text(r.key, 6))}={esc(r.value)}</span>")
            gap_cells = [f"<span class='ks-gap' title='no record holds these offsets'>gap "
                         f"{a}–{b}</span>" for a, b in gaps
                         if recs and recs[0].offset <= b + 1 and a <= recs[-1].offset + 1]
            more = f" … +{len(recs) - limit}" if len(recs) > limit else ""
            gone = "" if s.base_offset in live else " ks-seg-gone"
            out.append(f"<div class='ks-seg{gone}'><div class='ks-seghead'>{esc(s.file)} · "
                       f"{fmt_bytes(s.size)} · {len(recs)} records</div>{''.join(cells)}{more}"
                       f"{''.join(gap_cells)}</div>")
        if snap.truncated:
            out.append(f"<p class='ks-note'>(records cut at {self.max_records})</p>")
        out.append("</div>")
        return "".join(out)

    def render_html(self) -> str:
        d = self.diff()
        before = self.before or self.tracked
        after = self.after
        removed = {o: "ks-removed" for o in d["removed"]}
        new = {o: "ks-new" for o in d["new"]}
        summary = table(["", "before", "after"], [
            ["segments", len(before.segments), len(after.segments)],
            ["records", len(before.records), len(after.records)],
            ["bytes", before.size, after.size],
            ["log start offset", *d["log_start_offset"]],
            ["log end offset", *d["log_end_offset"]],
        ])
        keys = self.surviving_keys()
        key_rows = [[k, ", ".join(map(str, offs[:8])) + (" …" if len(offs) > 8 else ""),
                     "-" if kept is None else kept] for k, offs, kept in keys[:40]]
        tombs = "; ".join(f"offset {o} key {short_text(k, 10)}: horizon "
                          f"{fmt_ts(h) if h is not None else 'not set'}{' (passed)' if p else ''}"
                          for o, k, h, p in d["tombstones"][:20]) or "none"
        note = (f"<p class='ks-note'>{esc(self.last_action)} · removed {len(d['removed'])} records, "
                f"kept {len(d['kept'])}; segments removed {d['segments_removed']}, rewritten "
                f"{d['segments_rewritten']}, added {d['segments_added']}; gaps {d['gaps'][:10]}; "
                f"tombstones: {esc(tombs)}</p>")
        if self.before is None:
            note = ("<p class='ks-note'>No retention or cleaning pass yet: both panels show the "
                    "log now. Run one (or let the engine run one) to compare.</p>")
        return (style(COMP_CSS) +
                f'<div class="ks-view ks-comp"{attrs(data_passes=self.passes, data_removed=len(d["removed"]))}>'
                f"<h4>{esc(self.log.name)}: retention and compaction</h4>{note}"
                f"<div class='ks-panels'>"
                f"{self._panel(before, 'before the pass', removed, [])}"
                f"{self._panel(after, 'after (now)', new, d['gaps'])}"
                f"<div class='ks-panel'><h4>summary</h4>{summary}<h4>keys</h4>"
                f"{table(['key', 'offsets before', 'kept'], key_rows)}</div></div></div>")


class CompactionView(WidgetView):
    """The before/after view as a widget, with buttons for a retention pass and a cleaning."""

    def __init__(self, log_or_model, cleaner=None, min_interval: float = 0.1):
        import ipywidgets as W

        self.model = log_or_model if isinstance(log_or_model, CompactionModel) \
            else CompactionModel(log_or_model, cleaner)
        m = self.model
        self.retention_button = W.Button(description="Run retention pass",
                                         layout=W.Layout(width="auto"))
        self.retention_button.add_class("ks-comp-retention")
        self.clean_button = W.Button(description="Run cleaner (compact)",
                                     layout=W.Layout(width="auto"))
        self.clean_button.add_class("ks-comp-clean")
        self.html = W.HTML()
        self.retention_button.on_click(lambda _: self._act(m.run_retention))
        self.clean_button.on_click(lambda _: self._act(m.run_cleaner))
        self.widget = W.VBox([W.HBox([self.retention_button, self.clean_button]), self.html])
        self.widget.add_class("kstore-compaction")
        self.start_timeline(min_interval)

    def _act(self, fn) -> None:
        try:
            fn()
        except Exception as e:   # show the engine's refusal instead of a silent failure
            self.model.last_action = f"{type(e).__name__}: {e}"
            self.model.changed()


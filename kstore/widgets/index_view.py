"""Index view: a segment's offset index beside its log, a line from each entry to its batch.

Shows the `.index` entries (slot, relative offset, absolute offset, position) next to the `.log`
drawn to scale as its batches, with a line from every entry to the byte position it points at,
and the numbers that explain why the index is *sparse*: an entry is written only after more than
`index.interval.bytes` have been appended since the previous one, so most batches have none; a
lookup lands on the entry at or below its target and scans forward at most about that many bytes.
The `.timeindex` entries are listed too (timestamp → offset).

Engine state read: the segment's `OffsetIndex.entries_list()`, `TimeIndex.entries_list()`, the
batch positions from `FileRecords.batch_locations()` and the log's `index.interval.bytes`;
redrawn on the log's append, roll, truncate, delete and clean events.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..events import Event
from ..log import Log
from ..segment import LogSegment
from ._base import (LiveModel, WidgetView, attrs, esc, figure_png, fmt_bytes, style, table)

INDEX_CSS = """
.ks-idx .ks-side{display:flex;gap:16px;align-items:flex-start;}
.ks-idx .ks-scroll{max-height:340px;overflow:auto;}
.ks-idx tr.ks-indexed td{background:#e8f4ff;}
"""


@dataclass(frozen=True)
class BatchPos:
    number: int
    position: int
    base_offset: int
    last_offset: int
    size: int


class IndexModel(LiveModel):
    """The offset index of one segment of `log` (`segment=None`: the active one, following rolls)."""

    def __init__(self, log: Log, segment: int | None = None, max_batches: int = 2000):
        super().__init__()
        self.log = log
        self.segment_base = segment
        self.max_batches = max_batches
        self.watch(log.events, ("append", "index_entry", "roll", "truncate", "delete", "clean", "load", "recover"),
                   source=log.dir)

    @property
    def segment(self) -> LogSegment:
        segs = self.log.segments
        if self.segment_base is None:
            return segs[-1]
        return next((s for s in segs if s.base_offset == self.segment_base), segs[-1])

    def set_segment(self, base: int | None) -> None:
        self.segment_base = base
        self.changed()

    # ---- state
    def entries(self):
        return self.segment.offset_index.entries_list()

    def time_entries(self):
        return self.segment.time_index.entries_list()

    def batches(self) -> list[BatchPos]:
        out = []
        for i, loc in enumerate(self.segment.log.batch_locations()):
            if i >= self.max_batches:
                break
            out.append(BatchPos(i, loc.position, loc.base_offset, loc.last_offset, loc.size))
        return out

    def arrows(self) -> list[tuple[int, int, int | None]]:
        """(slot, position, batch number at that position or None) for every index entry."""
        by_pos = {b.position: b.number for b in self.batches()}
        return [(i, e.position, by_pos.get(e.position)) for i, e in enumerate(self.entries())]

    def sparseness(self) -> dict:
        """The numbers that explain the sparse index."""
        seg, entries, batches = self.segment, self.entries(), self.batches()
        positions = [e.position for e in entries]
        bounds = [0] + positions + [seg.size]
        max_scan = max((b - a for a, b in zip(bounds, bounds[1:])), default=0)
        return {"index.interval.bytes": seg.index_interval_bytes, "segment bytes": seg.size,
                "batches": len(batches), "index entries": len(entries),
                "batches per entry": round(len(batches) / len(entries), 1) if entries else None,
                "dense index bytes": 8 * len(batches), "sparse index bytes": 8 * len(entries),
                "longest forward scan (bytes)": max_scan,
                "batches shown": len(batches) if len(batches) < self.max_batches else
                f"first {self.max_batches}"}

    def apply_event(self, event: Event) -> bool | None:
        if event.kind == "append" and self.segment_base is not None and \
                event.details.get("segment") != self.segment_base:
            return False
        return True

    # ---- rendering
    def figure(self):
        """A matplotlib Figure: entries on the left, the .log to scale on the right, lines between.
        Few artists (one per kind of mark), so a segment with thousands of batches draws fast."""
        from matplotlib.collections import LineCollection
        from matplotlib.figure import Figure

        seg, entries, batches = self.segment, self.entries(), self.batches()
        size = max(seg.size, 1)
        indexed = {e.position for e in entries}
        fig = Figure(figsize=(7, 5))
        fig.subplots_adjust(left=0.12, right=0.98, top=0.93, bottom=0.12)
        ax = fig.add_subplot(1, 1, 1)
        ax.set_xlim(0, 1)
        ax.set_ylim(size, 0)
        ax.set_xticks([0.15, 0.8])
        ax.set_xticklabels([f"{seg.offset_index.file_name()}\n({len(entries)} entries)",
                            f"{seg.log.file_name()}\n({len(batches)} batches, {fmt_bytes(seg.size)})"],
                           fontsize=8)
        ax.set_ylabel("byte position in the .log")
        for wanted, colours in ((False, ("#cfe1ff", "#a0c4ff")), (True, ("#f4a261", "#f4a261"))):
            for parity in (0, 1):   # alternate shades so neighbouring batches stay distinct
                spans = [(b.position, b.size) for b in batches
                         if (b.position in indexed) == wanted and b.number % 2 == parity]
                _boxes(ax, spans, 0.7, 0.2, colours[parity])
        n = max(len(entries), 1)
        ys = [(i + 0.5) * size / n for i in range(len(entries))]
        if entries:
            _boxes(ax, [(y - 0.4 * size / n, 0.8 * size / n) for y in ys], 0.05, 0.2, "#ffd6a5")
            ax.add_collection(LineCollection([[(0.25, y), (0.7, e.position)]
                                              for y, e in zip(ys, entries)],
                                             colors="#c1121f", linewidths=0.8))
            ax.scatter([0.7] * len(entries), [e.position for e in entries], marker=">",
                       s=12, color="#c1121f", zorder=3)
        if len(entries) <= 40:
            for y, e in zip(ys, entries):
                ax.text(0.15, y, f"{e.offset}→{e.position}", ha="center", va="center", fontsize=7)
        ax.set_title(f"segment {seg.base_offset}: index.interval.bytes = "
                     f"{seg.index_interval_bytes}", fontsize=9)
        return fig

    def png(self) -> bytes:
        return figure_png(self.figure())

    def render_html(self, max_rows: int = 200) -> str:
        seg, entries, batches = self.segment, self.entries(), self.batches()
        by_pos = {b.position: b.number for b in batches}
        stats = self.sparseness()
        indexed = {e.position for e in entries}
        e_rows = [[i, e.offset - seg.base_offset, e.offset, e.position,
                   f"→ batch #{by_pos[e.position]}" if e.position in by_pos else "→ ?"]
                  for i, e in enumerate(entries[:max_rows])]
        b_rows = [[b.number, b.position, f"{b.base_offset}–{b.last_offset}", b.size,
                   "← indexed" if b.position in indexed else ""] for b in batches[:max_rows]]
        t_rows = [[i, t.timestamp, t.offset] for i, t in enumerate(self.time_entries()[:max_rows])]
        why = (f"An entry is written only when more than <b>{stats['index.interval.bytes']}</b> "
               f"bytes (index.interval.bytes) were appended since the previous one, so "
               f"<b>{stats['index entries']}</b> entries cover <b>{stats['batches']}</b> batches "
               f"({stats['sparse index bytes']} bytes instead of {stats['dense index bytes']} for "
               f"one entry per batch). A lookup binary-searches the entries for the largest offset "
               f"≤ its target, then scans forward at most "
               f"<b>{stats['longest forward scan (bytes)']}</b> bytes here. The first batch of a "
               f"segment is never indexed: position 0 is where every scan starts anyway.")
        return (style(INDEX_CSS) +
                f'<div class="ks-view ks-idx"{attrs(data_entries=len(entries), data_batches=len(batches))}>'
                f"<h4>segment {seg.base_offset}: {esc(seg.offset_index.file_name())} beside "
                f"{esc(seg.log.file_name())}</h4><p class='ks-note'>{why}</p>"
                f"<div class='ks-side'><div><b>.index entries</b><div class='ks-scroll'>"
                f"{table(['slot', 'relativeOffset', 'offset', 'position', 'points to'], e_rows)}</div></div>"
                f"<div><b>.log batches</b><div class='ks-scroll'>{table(['#', 'position', 'offsets', 'bytes', ''], b_rows, row_classes=['ks-indexed' if r[4] else None for r in b_rows])}</div></div>"
                f"<div><b>.timeindex entries</b><div class='ks-scroll'>{table(['slot', 'timestamp', 'offset'], t_rows)}</div></div>"
                f"</div></div>")


def _boxes(ax, spans, x: float, width: float, colour: str) -> None:
    """One PolyCollection of rectangles [x, x+width] × [start, start+length] (one artist)."""
    from matplotlib.collections import PolyCollection
    if spans:
        ax.add_collection(PolyCollection(
            [[(x, a), (x + width, a), (x + width, a + h), (x, a + h)] for a, h in spans],
            facecolors=colour, edgecolors="#555", linewidths=0.3))


class IndexView(WidgetView):
    """The index view as a widget: segment chooser, the drawing (PNG) and the tables."""

    def __init__(self, log_or_model, segment: int | None = None, min_interval: float = 0.2):
        import ipywidgets as W

        self.model = log_or_model if isinstance(log_or_model, IndexModel) \
            else IndexModel(log_or_model, segment)
        self.choose = W.Dropdown(description="segment", layout=W.Layout(width="330px"))
        self.choose.add_class("ks-index-segment")
        self.image = W.Image(format="png", layout=W.Layout(width="560px"))
        self.html = W.HTML()
        self._updating = False
        self.choose.observe(self._on_choose, names="value")
        self.widget = W.VBox([self.choose, W.HBox([self.image]), self.html])
        self.widget.add_class("kstore-indexview")
        self.start_timeline(min_interval)

    def _on_choose(self, change) -> None:
        if not self._updating:
            self.model.set_segment(change["new"])

    frame_parts = ("image", "html")

    def render_frame(self) -> dict:
        return {"image": self.model.png(), "html": self.model.render_html()}

    def sync_controls(self) -> None:
        m = self.model
        self._updating = True
        try:
            self.choose.options = [("active segment", None)] + [
                (f"{s.base_offset:020d}", s.base_offset) for s in m.log.segments]
            self.choose.value = m.segment_base if m.segment_base in [o[1] for o in self.choose.options] else None
        finally:
            self._updating = False

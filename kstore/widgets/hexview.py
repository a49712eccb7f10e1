"""Hex view: the bytes of a segment, index or checkpoint file, coloured by Kafka field.

Shows one page (a window of `rows × 16` bytes) of a real file: an offset column, the bytes in hex
coloured by the field they belong to (`fields.py`: batch header fields, record fields and their
varints, the CRC, index entries, checkpoint lines), an ASCII column and a legend. Hovering a byte
shows the field's name and decoded value (HTML `title`). A batch or a record can be selected to
outline its bytes; bytes added by the latest append are highlighted. Only the page is read from
disk and rendered, so a 1 GB segment costs the same as a small one.

Engine state read: the file itself (`os.pread` of the page), the segment's logical size and index
entry count, the offset index (to find the first batch of a page without scanning), and the log's
`append`/`roll`/`truncate`/`delete`/`clean` events (new bytes, the active segment moving).
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path

from ..events import Event
from ..log import Log
from ..segment import LogSegment
from . import fields as F
from ._base import (LiveModel, WidgetView, attrs, button, esc, fmt_bytes, style)

BYTES_PER_ROW = 16
WHICH = ("log", "index", "timeindex")

HEX_CSS = """
.ks-hex .ks-rows{font-family:monospace;white-space:pre;line-height:1.45;font-size:12px;}
.ks-hex .ks-off{color:#888;margin-right:8px;}
.ks-hex .ks-asc{color:#555;margin-left:8px;}
.ks-hex .ks-vi{border-bottom:2px dotted #555;}
.ks-hex .ks-sel{outline:2px solid #d00;outline-offset:-1px;}
.ks-hex .ks-new{box-shadow:inset 0 -4px 0 #2a9d8f;font-weight:bold;}
.ks-hex .ks-legend span.ks-sw{display:inline-block;width:10px;height:10px;border:1px solid #999;margin:0 3px 0 8px;}
.ks-hex .ks-legend{margin-top:4px;line-height:1.6;}
"""


class HexModel(LiveModel):
    """A window on one file, kept current by the log's events.

    `target` is a `Log` (by default the active segment's file, following rolls), a `LogSegment`,
    or a path. `which` picks the segment file: "log", "index" or "timeindex".
    """

    def __init__(self, target, which: str = "log", *, segment: int | None = None,
                 rows: int = 32, follow: bool = True):
        super().__init__()
        if which not in WHICH:
            raise ValueError(f"which must be one of {WHICH}, not {which!r}")
        self.log: Log | None = target if isinstance(target, Log) else None
        self._segment: LogSegment | None = target if isinstance(target, LogSegment) else None
        self._path = None if (self.log or self._segment) else str(Path(target))
        self.which = which
        self.pinned_base = segment       # None: follow the active segment of a Log
        self.rows = rows
        self.follow = follow
        self.start = 0                   # first byte of the window (a multiple of 16)
        self.selection: tuple | None = None
        self.new_range: tuple[int, int] | None = None
        self._seen_index_entries = self._index_entries()
        self._batch_starts: list[int] = []   # raw .log paths only: batch positions found so far
        if self.log is not None:
            self.watch(self.log.events, source=self.log.dir)

    # ---- which file
    @property
    def segment(self) -> LogSegment | None:
        if self._segment is not None:
            return self._segment
        if self.log is None:
            return None
        if self.pinned_base is None:
            return self.log.active_segment
        for s in self.log.segments:
            if s.base_offset == self.pinned_base:
                return s
        return None

    @property
    def path(self) -> str:
        seg = self.segment
        if seg is None:
            if self._path is None:
                raise FileNotFoundError(f"segment {self.pinned_base} is no longer in the log")
            return self._path
        return {"log": seg.log.path, "index": seg.offset_index.path,
                "timeindex": seg.time_index.path}[self.which]

    @property
    def kind(self) -> str:
        return F.file_kind(self.path)

    def set_file(self, segment_base: int | None, which: str = "log") -> None:
        """Show another segment's file (None: the active segment, followed across rolls)."""
        self.pinned_base, self.which = segment_base, which
        self.start, self.selection, self.new_range = 0, None, None
        self._seen_index_entries = self._index_entries()
        self.changed()

    def file_choices(self) -> list[tuple[str, tuple[int | None, str]]]:
        """(label, (segment base, which)) for every file the view can show."""
        if self.log is None:
            return []
        out = [(f"active segment .{w}", (None, w)) for w in WHICH]
        for s in self.log.segments:
            for w in WHICH:
                out.append((f"{s.base_offset:020d}.{w}", (s.base_offset, w)))
        return out

    # ---- sizes
    def _index_entries(self) -> int | None:
        seg = self.segment
        if seg is None or self.which == "log":
            return None
        return (seg.offset_index if self.which == "index" else seg.time_index).entries

    @property
    def size(self) -> int:
        """Bytes the view pages through: the logical size of a .log, the file length otherwise."""
        seg = self.segment
        if seg is not None and self.which == "log":
            return seg.log.size_in_bytes()
        try:
            return os.path.getsize(self.path)
        except FileNotFoundError:
            return 0

    @property
    def page_bytes(self) -> int:
        return self.rows * BYTES_PER_ROW

    @property
    def page(self) -> int:
        return self.start // self.page_bytes

    @property
    def pages(self) -> int:
        return max(1, -(-self.size // self.page_bytes))

    @property
    def window(self) -> tuple[int, int]:
        return self.start, min(self.start + self.page_bytes, max(self.size, 0))

    # ---- navigation (user actions)
    def go_to(self, position: int) -> None:
        """Show the page holding byte `position`."""
        position = max(0, min(position, max(self.size - 1, 0)))
        self.start = position - position % self.page_bytes
        self.changed()

    def next_page(self) -> None:
        self.go_to(min(self.start + self.page_bytes, max(self.size - 1, 0)))

    def prev_page(self) -> None:
        self.go_to(max(self.start - self.page_bytes, 0))

    def first_page(self) -> None:
        self.go_to(0)

    def last_page(self) -> None:
        self.go_to(max(self.size - 1, 0))

    def select(self, group: tuple | None) -> None:
        """Outline a batch (("batch", pos)) or a record (("record", pos, i)); None clears."""
        self.selection = tuple(group) if group else None
        if self.selection and not self._window_has(self.selection):
            self.go_to(self.selection[1])
        else:
            self.changed()

    def select_at(self, position: int, level: str = "record") -> Field | None:
        """Select the record (or batch) holding byte `position`; return the field there."""
        self.go_to(position)
        f = self.field_at(position)
        if f is not None and f.group:
            g = f.group
            if level == "batch" and g[0] == "record":
                g = ("batch", g[1])
            self.select(g)
        return f

    def _window_has(self, group: tuple) -> bool:
        return any(self._in_group(f, group) for f in self.fields())

    # ---- reading the file
    def _read(self, position: int, n: int) -> bytes:
        if n <= 0:
            return b""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return b""
        try:
            return os.pread(fd, n, position)
        finally:
            os.close(fd)

    def _first_batch_at_or_before(self, position: int) -> int:
        """A batch boundary ≤ position: from the offset index when there is a segment (binary
        search by position), else from the batch starts found by walking headers once."""
        seg = self.segment
        if seg is not None:
            index = seg.offset_index
            lo, hi, best = 0, index.entries - 1, 0
            while lo <= hi:
                mid = (lo + hi) // 2
                pos = index.entry(mid).position
                if pos <= position:
                    best, lo = pos, mid + 1
                else:
                    hi = mid - 1
            return best
        size = self.size
        starts = self._batch_starts
        if starts and starts[-1] >= size:    # the file shrank (truncated): walk it again
            starts.clear()
        pos = starts[-1] if starts else 0
        if not starts:
            starts.append(0)
        while pos <= position and pos < size:
            n = F.batch_length_at(self._read, pos)
            if n is None or pos + n > size:
                break
            pos += n
            if pos < size:
                starts.append(pos)
        return starts[max(bisect.bisect_right(starts, position) - 1, 0)]

    def fields(self) -> list[F.Field]:
        """The fields overlapping the window (read from the file now)."""
        start, end = self.window
        try:
            kind = self.kind
        except FileNotFoundError:          # a pinned segment that retention deleted
            return []
        if end <= start:
            return []
        if kind == "log":
            try:
                file_length = os.path.getsize(self.path)
            except FileNotFoundError:
                return []
            return F.log_fields(self._read, self.size, self._first_batch_at_or_before(start),
                                start, end, file_length)
        if kind in ("index", "timeindex"):
            seg = self.segment
            base = seg.base_offset if seg is not None else _base_from_name(self.path)
            log_name = os.path.basename(seg.log.path) if seg is not None else ""
            return F.index_fields(self._read, start, end, time_index=kind == "timeindex",
                                  base_offset=base, entries=self._index_entries(),
                                  log_name=log_name)
        data = self._read(0, self.size)
        if kind in ("checkpoint", "properties"):
            return [f for f in F.text_fields(data, self.path) if f.end > start and f.start < end]
        if kind == "snapshot":
            return [f for f in F.snapshot_fields(data) if f.end > start and f.start < end]
        return []

    def field_at(self, position: int) -> F.Field | None:
        """The field holding byte `position` (the page around it is read)."""
        saved = self.start
        self.start = position - position % self.page_bytes
        try:
            return next((f for f in self.fields() if f.covers(position)), None)
        finally:
            self.start = saved

    def batches_in_window(self) -> list[tuple[int, list[int]]]:
        """(batch position, [record indexes]) of every batch with bytes on the page."""
        out: dict[int, set[int]] = {}
        for f in self.fields():
            if f.group and f.group[0] in ("batch", "record"):
                recs = out.setdefault(f.group[1], set())
                if f.group[0] == "record":
                    recs.add(f.group[2])
        return [(pos, sorted(r)) for pos, r in sorted(out.items())]

    # ---- events
    def apply_event(self, event: Event) -> bool | None:
        kind, d = event.kind, event.details
        if kind == "append":
            seg = self.segment
            if seg is None or d.get("segment") != seg.base_offset:
                return False if self.which == "log" else None
            if self.which == "log":
                self.new_range = (d["position"], d["position"] + d["size"])
            else:
                now = self._index_entries() or 0
                before = self._seen_index_entries or 0
                if now == before:
                    return False        # this append added no index entry
                es = 8 if self.which == "index" else 12
                self.new_range = (before * es, now * es)
            self._seen_index_entries = self._index_entries()
            if self.follow:
                lo, hi = self.new_range
                if not (self.start <= hi - 1 < self.start + self.page_bytes):
                    self.start = lo - lo % self.page_bytes
            return True
        if kind == "roll" and self.pinned_base is None:
            self.start, self.new_range, self.selection = 0, None, None
            self._seen_index_entries = self._index_entries()
            return True
        if kind in ("truncate", "delete", "clean", "log_start_offset", "recover", "load"):
            self.new_range = None
            self._seen_index_entries = self._index_entries()
            if self.start >= self.size:
                self.start = max(self.size - 1, 0) // self.page_bytes * self.page_bytes
            return True
        return False    # flush, high_watermark, close: the bytes did not change

    # ---- rendering
    @staticmethod
    def _in_group(f: F.Field, group: tuple | None) -> bool:
        if not group or not f.group:
            return False
        if group[0] == "batch":
            return f.group[0] in ("batch", "record") and f.group[1] == group[1]
        return f.group == group

    def render_html(self) -> str:
        start, end = self.window
        try:
            path = self.path
        except FileNotFoundError as e:
            return style(HEX_CSS) + f'<div class="ks-view ks-hex"><p class="ks-note">{esc(e)}</p></div>'
        data = self._read(start, end - start)
        fields = self.fields()
        by_byte: list[F.Field | None] = [None] * len(data)
        for f in fields:
            for p in range(max(f.start, start), min(f.end, start + len(data))):
                by_byte[p - start] = f
        rows = [self._render_row(start + r, data[r:r + BYTES_PER_ROW],
                                 by_byte[r:r + BYTES_PER_ROW])
                for r in range(0, len(data), BYTES_PER_ROW)]
        kinds = sorted({f.kind for f in fields}, key=list(F.KINDS).index)
        css = HEX_CSS + "".join(f".ks-hex .ks-k-{k}{{background:{F.KINDS[k][0]};}}" for k in kinds)
        head = (f"<b>{esc(os.path.basename(path))}</b> · {fmt_bytes(self.size)} ({self.size} bytes)"
                f" · page {self.page + 1} of {self.pages} · bytes {start}–{max(end - 1, start)}")
        if self.new_range:
            head += f" · <span class='ks-new'>new bytes {self.new_range[0]}–{self.new_range[1] - 1}</span>"
        legend = "".join(f"<span class='ks-sw ks-k-{k}'></span>{esc(F.KINDS[k][1])}" for k in kinds)
        legend += "<span class='ks-sw ks-vi' style='border:none'></span>dotted underline = varint"
        return (style(css) +
                f'<div class="ks-view ks-hex"{attrs(data_start=start, data_page=self.page, data_file=os.path.basename(path))}>'
                f'<div class="ks-head">{head}</div>'
                f'<div class="ks-rows">{"".join(rows) or "(empty file)"}</div>'
                f'<div class="ks-legend">{legend}</div>'
                f'<div class="ks-selinfo">{self._selection_text(fields)}</div></div>')

    def _render_row(self, offset: int, data: bytes, owners: list) -> str:
        runs: list[str] = []
        i = 0
        while i < len(data):
            owner, new = owners[i], self._is_new(offset + i)
            j = i + 1
            while j < len(data) and owners[j] is owner and self._is_new(offset + j) == new:
                j += 1
            text = " ".join(f"{b:02x}" for b in data[i:j])
            cls = []
            if owner is not None:
                cls.append(f"ks-f ks-k-{owner.kind}")
                if owner.varint:
                    cls.append("ks-vi")
                if self._in_group(owner, self.selection):
                    cls.append("ks-sel")
            if new:
                cls.append("ks-new")
            title = owner.title if owner is not None else None
            runs.append(f"<span{attrs(class_=' '.join(cls) or None, title=title)}>{text}</span>")
            i = j
        pad = "   " * (BYTES_PER_ROW - len(data))
        ascii_ = esc("".join(chr(b) if 32 <= b < 127 else "." for b in data))
        return (f'<div class="ks-row"><span class="ks-off">{offset:08x}</span>'
                f'{" ".join(runs)}{pad}<span class="ks-asc">{ascii_}</span></div>')

    def _is_new(self, position: int) -> bool:
        return bool(self.new_range) and self.new_range[0] <= position < self.new_range[1]

    def _selection_text(self, fields: list[F.Field]) -> str:
        if not self.selection:
            return "<span class='ks-note'>Select a batch or a record to outline its bytes.</span>"
        chosen = [f for f in fields if self._in_group(f, self.selection)]
        what = (f"batch at byte {self.selection[1]}" if self.selection[0] == "batch"
                else f"record {self.selection[2]} of the batch at byte {self.selection[1]}")
        items = "; ".join(f"{esc(f.name)} = {esc(f.value)}" for f in chosen[:40])
        if len(chosen) > 40:
            items += f"; … {len(chosen) - 40} more fields"
        return f"<b>selected: {esc(what)}</b> — {items}"


def _base_from_name(path: str) -> int:
    prefix = os.path.basename(path).split(".", 1)[0]
    return int(prefix) if prefix.isdigit() else 0


Field = F.Field


# ------------------------------------------------------------------------------------------------
# The widget
# ------------------------------------------------------------------------------------------------

class HexView(WidgetView):
    """The hex view as ipywidgets: page buttons, go-to-byte, batch/record selector, file chooser."""

    def __init__(self, target, which: str = "log", *, rows: int = 32, min_interval: float = 0.1,
                 **kwargs):
        import ipywidgets as W

        self.model = target if isinstance(target, HexModel) else HexModel(target, which, rows=rows,
                                                                          **kwargs)
        m = self.model
        self.html = W.HTML()
        btn = lambda label, tip, cls: button(W, label, tip, cls)   # noqa: E731
        self.first = btn("« first", "first page", "ks-hex-first")
        self.prev = btn("◀ prev", "previous page", "ks-hex-prev")
        self.next = btn("next ▶", "next page", "ks-hex-next")
        self.last = btn("last »", "last page", "ks-hex-last")
        self.goto = W.IntText(description="go to byte", continuous_update=False,
                              layout=W.Layout(width="190px"))
        self.goto.add_class("ks-hex-goto")
        self.follow = W.Checkbox(value=m.follow, description="follow appends", indent=False,
                                 layout=W.Layout(width="140px"))
        self.select = W.Dropdown(description="select", options=[("(none)", "")],
                                 layout=W.Layout(width="380px"))
        self.select.add_class("ks-hex-select")
        self.file = W.Dropdown(description="file", options=m.file_choices() or [("file", None)],
                               layout=W.Layout(width="330px"))
        self.first.on_click(lambda _: m.first_page())
        self.prev.on_click(lambda _: m.prev_page())
        self.next.on_click(lambda _: m.next_page())
        self.last.on_click(lambda _: m.last_page())
        self.goto.observe(lambda ch: m.go_to(ch["new"]), names="value")
        self.follow.observe(lambda ch: setattr(m, "follow", ch["new"]), names="value")
        self.select.observe(self._on_select, names="value")
        self.file.observe(self._on_file, names="value")
        self._updating = False
        controls = [self.first, self.prev, self.next, self.last, self.goto, self.follow]
        rows_ = [W.HBox(controls), W.HBox([self.select] + ([self.file] if m.log else []))]
        self.widget = W.VBox(rows_ + [self.html])
        self.widget.add_class("kstore-hexview")
        self.start_timeline(min_interval)

    def _on_select(self, change) -> None:
        if not self._updating:
            self.model.select(change["new"] or None)   # "" is the "(none)" choice

    def _on_file(self, change) -> None:
        if not self._updating and change["new"] is not None:
            self.model.set_file(*change["new"])

    def sync_controls(self) -> None:
        m = self.model
        self._updating = True
        try:
            options = [("(none)", "")]
            for pos, recs in m.batches_in_window():
                options.append((f"batch at byte {pos}", ("batch", pos)))
                options += [(f"   record {i} of batch {pos}", ("record", pos, i)) for i in recs]
            if m.selection and m.selection not in [o[1] for o in options]:
                options.append((f"{m.selection}", m.selection))
            self.select.options = options
            self.select.value = m.selection or ""
            if m.log is not None:
                choices = m.file_choices()
                self.file.options = choices
                current = (m.pinned_base, m.which)
                if current in [c[1] for c in choices]:
                    self.file.value = current
        finally:
            self._updating = False


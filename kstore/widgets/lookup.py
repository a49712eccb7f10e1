"""Lookup trace: how the engine finds an offset (or a timestamp), one step at a time.

For an offset: (1) bisect the sorted segment base offsets for the floor segment, (2) binary-search
that segment's sparse offset index for the largest entry ≤ the target — every probe is listed —
and (3) scan batch headers forward from the entry's position until a batch ends at or past the
target (moving to the next segment if the target fell in a gap at the end). For a timestamp: walk
the segments to the first whose largest timestamp reaches the target, binary-search its time
index, look the offset up in the offset index, then scan batches and records.

The trace re-does the engine's searches on the real index files (`OffsetIndex.entry`,
`TimeIndex.entry`, `FileRecords.batch_locations`) with the same comparisons as
`AbstractIndex.largest_lower_bound_slot_for` and `bisect_right`, and records the engine's own
answer (`LogSegment.translate_offset`, `Log.fetch_offset_by_timestamp`) to check they agree.
A button reveals one step at a time; a change of the log (events) recomputes the trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..events import Event
from ..log import Log
from ._base import (LiveModel, WidgetView, attrs, esc, style)

LOOKUP_CSS = """
.ks-lookup ol{margin:4px 0 4px 18px;padding:0;}
.ks-lookup li{margin:2px 0;}
.ks-lookup li.ks-current{background:#fff3b0;}
.ks-lookup .ks-phase{display:inline-block;width:70px;font-weight:bold;color:#555;}
.ks-lookup .ks-strip span{display:inline-block;min-width:22px;padding:1px 2px;margin:1px;border:1px solid #bbb;text-align:center;font-family:monospace;font-size:10px;}
.ks-lookup .ks-strip span.ks-probe{background:#ffd6a5;}
.ks-lookup .ks-strip span.ks-hit{background:#95d5b2;border:2px solid #1b4332;}
"""


@dataclass
class Step:
    phase: str                  # segment / index / timeindex / scan / result
    text: str
    data: dict = field(default_factory=dict)


@dataclass
class Trace:
    by: str                     # "offset" or "timestamp"
    target: int
    steps: list[Step]
    segment_bases: list[int]
    index_slots: int = 0        # entries of the index searched (for the strip)
    index_probes: list[int] = field(default_factory=list)
    index_hit: int = -1
    segment_probes: list[int] = field(default_factory=list)
    found: dict | None = None           # what the trace found
    engine: dict | None = None          # what the engine itself answers

    @property
    def probes(self) -> list[int]:
        return self.index_probes


def _bisect_segments(bases: list[int], target: int, steps: list[Step]) -> tuple[int, list[int]]:
    """bisect_right over the base offsets, each probe a step; returns (floor index, probes)."""
    lo, hi, probes = 0, len(bases), []
    while lo < hi:
        mid = (lo + hi) // 2
        probes.append(mid)
        if target < bases[mid]:
            steps.append(Step("segment", f"probe segment #{mid} (base {bases[mid]}): {target} < "
                              f"{bases[mid]} → look left", {"probe": mid}))
            hi = mid
        else:
            steps.append(Step("segment", f"probe segment #{mid} (base {bases[mid]}): {target} ≥ "
                              f"{bases[mid]} → look right", {"probe": mid}))
            lo = mid + 1
    return lo - 1, probes


def _binary_search(n: int, key, target: int, label: str, phase: str,
                   steps: list[Step]) -> tuple[int, list[int]]:
    """AbstractIndex.largest_lower_bound_slot_for with each probe recorded."""
    probes: list[int] = []
    if n == 0:
        steps.append(Step(phase, f"the index has no entries → start at the segment's beginning"))
        return -1, probes
    first = key(0)
    probes.append(0)
    if first > target:
        steps.append(Step(phase, f"slot 0 holds {label} {first} > {target} → no entry ≤ target, "
                          f"start at the segment's beginning", {"probe": 0}))
        return -1, probes
    steps.append(Step(phase, f"{n} entries; slot 0 holds {label} {first} ≤ {target}: "
                      f"binary search slots 0..{n - 1}", {"probe": 0}))
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        k = key(mid)
        probes.append(mid)
        if k <= target:
            steps.append(Step(phase, f"probe slot {mid}: {label} {k} ≤ {target} → lo = {mid}",
                              {"probe": mid, "key": k}))
            lo = mid
        else:
            steps.append(Step(phase, f"probe slot {mid}: {label} {k} > {target} → hi = {mid - 1}",
                              {"probe": mid, "key": k}))
            hi = mid - 1
    return lo, probes


def trace_offset(log: Log, offset: int) -> Trace:
    """The steps of finding the batch holding `offset` (what `Log.read` does first)."""
    segs = log.segments
    bases = [s.base_offset for s in segs]
    steps: list[Step] = [Step("segment", f"find offset {offset}: {len(bases)} segment(s), bases "
                              f"{bases[:12]}{' …' if len(bases) > 12 else ''}")]
    t = Trace("offset", offset, steps, bases)
    if offset < log.log_start_offset or offset >= log.log_end_offset:
        steps.append(Step("result", f"{offset} is outside [log start {log.log_start_offset}, "
                          f"LEO {log.log_end_offset}): OFFSET_OUT_OF_RANGE (or an empty read at "
                          f"the LEO)"))
        t.found = t.engine = None
        return t
    i, t.segment_probes = _bisect_segments(bases, offset, steps)
    steps.append(Step("segment", f"floor segment: #{i}, base offset {bases[i]} "
                      f"({segs[i].log.file_name()})", {"segment": bases[i]}))
    seg = segs[i]
    index = seg.offset_index
    slot, t.index_probes = _binary_search(index.entries, lambda n: index.entry(n).offset, offset,
                                          "offset", "index", steps)
    t.index_slots, t.index_hit = index.entries, slot
    start = index.entry(slot).position if slot >= 0 else 0
    if slot >= 0:
        e = index.entry(slot)
        steps.append(Step("index", f"entry at slot {slot}: offset {e.offset} → position "
                          f"{e.position}: start scanning there", {"slot": slot, "position": start}))
    while seg is not None:
        for loc in seg.log.batch_locations(start):
            if loc.last_offset >= offset:
                steps.append(Step("scan", f"batch at byte {loc.position} holds offsets "
                                  f"{loc.base_offset}–{loc.last_offset} ∋ {offset} → found",
                                  {"position": loc.position}))
                t.found = {"segment": seg.base_offset, "position": loc.position,
                           "base_offset": loc.base_offset, "size": loc.size}
                break
            steps.append(Step("scan", f"batch at byte {loc.position} holds offsets "
                              f"{loc.base_offset}–{loc.last_offset} < {offset} → skip "
                              f"{loc.size} bytes", {"position": loc.position}))
        if t.found:
            break
        seg = log.higher_segment(seg.base_offset)
        start = 0
        if seg is not None:
            steps.append(Step("scan", f"not in this segment (a gap): continue in segment "
                              f"{seg.base_offset} from byte 0"))
    if t.found:
        f = t.found
        steps.append(Step("result", f"offset {offset} is in the batch at byte {f['position']} "
                          f"of segment {f['segment']} (batch base offset {f['base_offset']}, "
                          f"{f['size']} bytes)"))
    engine_seg = log.floor_segment(offset)
    hit = None
    while engine_seg is not None and hit is None:
        hit = engine_seg.translate_offset(offset)
        if hit is None:
            engine_seg = log.higher_segment(engine_seg.base_offset)
    if hit is not None:
        t.engine = {"segment": engine_seg.base_offset, "position": hit.position,
                    "base_offset": hit.offset, "size": hit.size}
    return t


def trace_timestamp(log: Log, timestamp: int) -> Trace:
    """The steps of ListOffsets by timestamp (`Log.fetch_offset_by_timestamp`)."""
    segs = log.segments
    bases = [s.base_offset for s in segs]
    steps = [Step("segment", f"find the first record with timestamp ≥ {timestamp}: walk the "
                  f"segments by their largest timestamp")]
    t = Trace("timestamp", timestamp, steps, bases)
    seg = None
    for k, s in enumerate(segs):
        t.segment_probes.append(k)
        if s.largest_timestamp >= timestamp:
            steps.append(Step("segment", f"segment {s.base_offset}: largest timestamp "
                              f"{s.largest_timestamp} ≥ {timestamp} → search it", {"probe": k}))
            seg = s
            break
        steps.append(Step("segment", f"segment {s.base_offset}: largest timestamp "
                          f"{s.largest_timestamp} < {timestamp} → next", {"probe": k}))
    if seg is None:
        steps.append(Step("result", "no segment reaches that timestamp: no offset"))
        t.engine = _engine_ts(log, timestamp)
        return t
    tix = seg.time_index
    slot, t.index_probes = _binary_search(tix.entries, lambda n: tix.entry(n).timestamp, timestamp,
                                          "timestamp", "timeindex", steps)
    t.index_slots, t.index_hit = tix.entries, slot
    ts_offset = tix.entry(slot).offset if slot >= 0 else seg.base_offset
    target = max(ts_offset, log.log_start_offset)
    steps.append(Step("timeindex", f"time index gives offset {ts_offset}; look up offset "
                      f"{target} in the offset index"))
    index = seg.offset_index
    oslot, _ = _binary_search(index.entries, lambda n: index.entry(n).offset, target, "offset",
                              "index", steps)
    position = index.entry(oslot).position if oslot >= 0 else 0
    steps.append(Step("index", f"start scanning at byte {position}", {"position": position}))
    for batch in seg.log.batches(position):
        if batch.max_timestamp < timestamp:
            steps.append(Step("scan", f"batch at byte {batch.position}: max timestamp "
                              f"{batch.max_timestamp} < {timestamp} → skip"))
            continue
        for r in batch.records():
            if r.timestamp >= timestamp and r.offset >= log.log_start_offset:
                steps.append(Step("scan", f"batch at byte {batch.position}: record offset "
                                  f"{r.offset} has timestamp {r.timestamp} ≥ {timestamp} → found"))
                t.found = {"offset": r.offset, "timestamp": r.timestamp}
                break
        if t.found:
            break
    if t.found:
        steps.append(Step("result", f"offset {t.found['offset']} (timestamp {t.found['timestamp']})"))
    t.engine = _engine_ts(log, timestamp)
    return t


def _engine_ts(log: Log, timestamp: int) -> dict | None:
    hit = log.fetch_offset_by_timestamp(timestamp)
    return None if hit is None else {"offset": hit.offset, "timestamp": hit.timestamp}


class LookupModel(LiveModel):
    """A lookup of `target` (an offset, or a timestamp with `by="timestamp"`), shown step by step."""

    def __init__(self, log: Log, target: int = 0, by: str = "offset"):
        super().__init__()
        self.log = log
        self.by = by
        self.target = target
        self.shown = 1
        self.trace = self._compute()
        self.watch(log.events, ("append", "roll", "truncate", "delete", "clean",
                                "log_start_offset"), source=log.dir)

    def _compute(self) -> Trace:
        if self.by == "timestamp":
            return trace_timestamp(self.log, self.target)
        return trace_offset(self.log, self.target)

    # ---- user actions
    def set_target(self, target: int, by: str | None = None) -> None:
        self.target, self.by = int(target), by or self.by
        self.trace, self.shown = self._compute(), 1
        self.changed()

    def step(self) -> bool:
        """Reveal the next step; False when every step is shown."""
        if self.shown >= len(self.trace.steps):
            return False
        self.shown += 1
        self.changed()
        return True

    def run_all(self) -> None:
        self.shown = len(self.trace.steps)
        self.changed()

    def reset(self) -> None:
        self.shown = 1
        self.changed()

    @property
    def done(self) -> bool:
        return self.shown >= len(self.trace.steps)

    def apply_event(self, event: Event) -> bool | None:
        self.trace = self._compute()            # the files changed: search them again
        self.shown = min(self.shown, len(self.trace.steps))
        return True

    # ---- rendering
    def _strip(self, n: int, probes: list[int], hit: int, label: str, limit: int = 64) -> str:
        if n == 0:
            return ""
        order = {p: k + 1 for k, p in enumerate(probes)}
        cells = []
        for i in range(min(n, limit)):
            cls = "ks-hit" if i == hit and self.done else ("ks-probe" if i in order else None)
            mark = f"{i}" + (f"<sup>{order[i]}</sup>" if i in order else "")
            cells.append(f"<span{attrs(class_=cls)}>{mark}</span>")
        more = f" … {n - limit} more" if n > limit else ""
        return f"<div class='ks-strip'>{esc(label)}: {''.join(cells)}{more}</div>"

    def render_html(self) -> str:
        t = self.trace
        items = []
        for k, s in enumerate(t.steps[:self.shown]):
            cls = "ks-current" if k == self.shown - 1 else None
            items.append(f"<li{attrs(class_=cls, data_phase=s.phase)}><span class='ks-phase'>"
                         f"{esc(s.phase)}</span>{esc(s.text)}</li>")
        shown_probes = {s.data.get("probe") for s in t.steps[:self.shown]
                        if s.phase in ("index", "timeindex")}
        probes = [p for p in t.index_probes if p in shown_probes]
        strip = self._strip(t.index_slots, probes, t.index_hit,
                            "time index slots" if t.by == "timestamp" else "offset index slots")
        check = ""
        if self.done and t.found is not None:
            agree = t.engine is not None and all(t.engine.get(k) == v for k, v in t.found.items()
                                                 if k in t.engine)
            check = (f"<p class='ks-note'>engine's own answer: {esc(t.engine)} — "
                     f"{'agrees' if agree else 'DIFFERS'}</p>")
        return (style(LOOKUP_CSS) +
                f'<div class="ks-view ks-lookup"{attrs(data_shown=self.shown, data_steps=len(t.steps))}>'
                f"<h4>lookup of {esc(t.by)} {t.target} in {esc(self.log.name)} — step "
                f"{self.shown} of {len(t.steps)}</h4><ol>{''.join(items)}</ol>{strip}{check}</div>")


class LookupView(WidgetView):
    """The lookup trace as a widget: offset/timestamp, target (Enter), Step, Run all, Reset."""

    def __init__(self, log_or_model, target: int = 0, by: str = "offset", min_interval: float = 0.05):
        import ipywidgets as W

        self.model = log_or_model if isinstance(log_or_model, LookupModel) \
            else LookupModel(log_or_model, target, by)
        m = self.model
        self.by = W.ToggleButtons(options=["offset", "timestamp"], value=m.by,
                                  style={"button_width": "110px"})
        self.target = W.IntText(value=m.target, description="target", continuous_update=False,
                                layout=W.Layout(width="240px"))
        self.target.add_class("ks-lookup-target")
        self.step_button = W.Button(description="Step ▶", tooltip="show the next step")
        self.step_button.add_class("ks-lookup-step")
        self.all_button = W.Button(description="Run all")
        self.reset_button = W.Button(description="Reset")
        self.html = W.HTML()
        self.by.observe(lambda ch: m.set_target(self.target.value, ch["new"]), names="value")
        self.target.observe(lambda ch: m.set_target(ch["new"], self.by.value), names="value")
        self.step_button.on_click(lambda _: m.step())
        self.all_button.on_click(lambda _: m.run_all())
        self.reset_button.on_click(lambda _: m.reset())
        self.widget = W.VBox([W.HBox([self.by, self.target]),
                              W.HBox([self.step_button, self.all_button, self.reset_button]),
                              self.html])
        self.widget.add_class("kstore-lookup")
        self.start_timeline(min_interval)

    def sync_controls(self) -> None:
        self.step_button.disabled = self.model.done

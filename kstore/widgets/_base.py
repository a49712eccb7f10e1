"""What every view shares: a live model fed by engine events, a timeline of what it showed, throttled
redraws, small HTML helpers.

A *model* (`LiveModel`) holds a view's state and renders it as HTML; it knows nothing of
ipywidgets, so the tests drive it with real engine operations and read its HTML. It subscribes to
the engine's `EventBus` (no polling): each event it cares about updates its state and tells its
listeners. A *view* (`WidgetView`, an ipywidgets box) is one such listener; it redraws through a
`Redrawer`, which coalesces bursts of events (a bulk produce emits thousands) into at most one
redraw per `min_interval` seconds, plus a final one when the burst ends.

Views are bound to their moment
-------------------------------
A notebook cell shows a view beside prose about the engine *at that point*; after "Run All" the
engine has moved on, and a view that simply followed it would contradict its prose. So every view
keeps a `Timeline` of *frames*: a frame is what the view showed (the values of its HTML/image
widgets) plus the engine's event sequence number (`kstore.events.last_seq()`) it shows the state
as of, and a label naming the engine events folded into it (append, index entry, roll, truncate,
high watermark, election, clean, delete, ...). The first frame is taken when the view is built;
while its cell runs the view follows the engine; when the cell that displayed it finishes
(IPython's `post_run_cell`), the view takes one more frame — the *bound* frame, the state "when its
cell ran" — and stops following. Later engine events are still recorded as frames (bursts coalesced
by the `Redrawer`), so the timeline bar under the view steps back/forward through them ("◀", "▶",
"|◀ its cell", "now ▶|") and a "follow live" switch lets the learner play freely.
A user action on the view itself (a page button, Step, Produce...) acts on the present: its frame
is shown at once (the timeline jumps to now).

How a view opts in (what a subclass does):
 1. build its widgets; the ones whose `.value` make up a picture are named in `frame_parts`
    (default `("html",)`; e.g. `("html", "image")`), and `render_frame()` returns those values
    (default: `{"html": self.model.render_html()}`);
 2. put the live-only control updates (button labels, dropdown options) in `sync_controls()`;
 3. end `__init__` with `self.start_timeline(min_interval)` — no own `Redrawer`, no `_draw()` call:
    it subscribes to the model, appends the timeline bar to `self.widget` and takes frame 0.
`HtmlView` (one HTML block over a `model_class`) does all of this already: a subclass that only
sets `model_class` and `css_class` gets the timeline for free. A `WidgetView` subclass that keeps
its own `Redrawer` and `_draw()` (the interface before timelines) still works, without a timeline.
(The quiz cards and the progress bars show no engine state, so they have none.)
"""

from __future__ import annotations

import html
import threading
import time
import weakref
from typing import Any, Callable, Iterable

from ..events import Event, EventBus, last_seq

Listener = Callable[["LiveModel", "Event | None"], None]


class LiveModel:
    """A view's state, kept current by engine events.

    Subclasses call `watch(bus, kinds, source=...)` in their constructor and override
    `apply_event(event)` (update state; return False when the event changed nothing shown).
    """

    def __init__(self) -> None:
        self._unsubscribers: list[Callable[[], None]] = []
        self._listeners: list[Listener] = []
        self.version = 0                 # bumped on every change a listener was told about
        self.last_event: Event | None = None
        self.events_seen = 0

    # ---- engine side
    def watch(self, bus: EventBus, kinds: Iterable[str] | None = None,
              source: str | Callable[[Event], bool] | None = None) -> None:
        """Subscribe to `bus`; keep only events whose source is `source` (a path) or that the
        predicate `source` accepts."""
        def accept(event: Event) -> bool:
            if source is None:
                return True
            if callable(source):
                return bool(source(event))
            return event.source == source

        def callback(event: Event) -> None:
            if accept(event):
                self._on_event(event)
        self._unsubscribers.append(bus.subscribe(callback, kinds))

    def unwatch_all(self) -> None:
        for unsubscribe in self._unsubscribers:
            unsubscribe()
        self._unsubscribers.clear()

    def _on_event(self, event: Event) -> None:
        self.last_event = event
        self.events_seen += 1
        if self.apply_event(event) is not False:
            self.changed(event)

    def apply_event(self, event: Event) -> bool | None:
        """Update the state for `event`; return False if nothing shown changed."""
        return True

    # ---- view side
    def on_change(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(model, event)` after each change; returns a function that stops it."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)
        return remove

    def changed(self, event: Event | None = None) -> None:
        """Tell the listeners the state changed (also used after a user action)."""
        self.version += 1
        for listener in list(self._listeners):
            listener(self, event)

    def close(self) -> None:
        """Stop following the engine."""
        self.unwatch_all()
        self._listeners.clear()

    def render_html(self) -> str:  # pragma: no cover - every model overrides it
        raise NotImplementedError


class Redrawer:
    """Run `draw()` now, or — if the last draw was less than `min_interval` s ago — once, later.

    Bursts of events produce one deferred redraw (a one-shot `threading.Timer`, not a loop).
    `min_interval=0` draws synchronously every time (what the tests use).
    """

    def __init__(self, draw: Callable[[], None], min_interval: float = 0.1):
        self.draw = draw
        self.min_interval = min_interval
        self._last = 0.0
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()       # guards the fields below; never held while drawing
        self._drawing = threading.Lock()    # one draw at a time
        self._pending = False               # a request came while the deferred draw was running
        self.draws = 0
        self.errors: list[BaseException] = []

    # A draw reads the engine (and may take the log's lock), while events arrive with the log's
    # lock held. So no lock of ours is held while drawing, and the event thread never waits for a
    # draw in progress (a deferred draw on the timer thread may be waiting for the log's lock): it
    # leaves the work to the deferred draw. At most one timer thread exists per Redrawer.
    def request(self) -> None:
        with self._lock:
            if self._timer is not None:        # a deferred draw is due or running: it will follow up
                self._pending = True
                return
            wait = self._last + self.min_interval - time.monotonic()
            if wait > 0:
                self._schedule_locked(wait)
                return
            self._last = time.monotonic()
        if not self._drawing.acquire(blocking=False):
            with self._lock:
                if self._timer is None:
                    self._schedule_locked(self.min_interval)
                else:
                    self._pending = True
            return
        try:
            self._run()
        finally:
            self._drawing.release()

    def _schedule_locked(self, wait: float) -> None:
        self._timer = threading.Timer(wait, self._deferred)
        self._timer.daemon = True
        self._timer.start()

    def _deferred(self) -> None:
        with self._lock:
            self._last = time.monotonic()
            self._pending = False              # this draw shows every change requested so far
        with self._drawing:
            self._run()
        with self._lock:
            self._timer = None
            if self._pending:                  # changes arrived during the draw: one more, later
                self._pending = False
                self._schedule_locked(self.min_interval)

    def _run(self) -> None:
        self.draws += 1
        try:
            self.draw()
        except Exception as e:  # a drawing bug must not break the engine's event delivery
            self.errors.append(e)

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None


# ------------------------------------------------------------------------------------------------
# HTML helpers
# ------------------------------------------------------------------------------------------------

def esc(value: Any) -> str:
    """Text → HTML (quotes too, so it is safe inside attributes such as `title`)."""
    return html.escape(str(value), quote=True)


def attrs(**values: Any) -> str:
    """`attrs(title="a", data_hw=3)` → ` title="a" data-hw="3"` (None values left out)."""
    out = []
    for name, value in values.items():
        if value is None:
            continue
        name = name.rstrip("_").replace("_", "-")
        out.append(f' {name}="{esc(value)}"')
    return "".join(out)


def table(headers: list[str], rows: list[list[Any]], *, cls: str = "ks-table",
          row_classes: list[str | None] | None = None, raw: bool = False) -> str:
    """A small HTML table. Cells are escaped unless `raw` (then they are HTML already)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        rc = row_classes[i] if row_classes else None
        cells = "".join(f"<td>{c if raw else esc(c)}</td>" for c in row)
        body.append(f"<tr{attrs(class_=rc)}>{cells}</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


BASE_CSS = """
.ks-view{font-family:var(--jp-ui-font-family,sans-serif);font-size:12px;color:#222;}
.ks-view h4{margin:4px 0;font-size:13px;}
.ks-table{border-collapse:collapse;margin:4px 0;}
.ks-table th,.ks-table td{border:1px solid #ccc;padding:2px 6px;text-align:right;font-family:monospace;}
.ks-table th{background:#f0f0f0;}
.ks-table tr.ks-active td{background:#e8f4ff;font-weight:bold;}
.ks-table tr.ks-gone td{color:#999;text-decoration:line-through;}
.ks-note{color:#555;margin:4px 0;}
.ks-badge{display:inline-block;border-radius:3px;padding:0 4px;margin:0 2px;font-size:11px;color:#fff;}
"""


def style(css: str) -> str:
    return f"<style>{BASE_CSS}{css}</style>"


def fmt_bytes(n: int) -> str:
    """1536 → '1.5 KiB'."""
    step = 1024.0
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < step or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= step
    return f"{n} B"  # pragma: no cover


def fmt_ts(ms: int) -> str:
    """Epoch milliseconds → 'YYYY-mm-dd HH:MM:SS.mmm' UTC (or '-' for none)."""
    if ms is None or ms < 0:
        return "-"
    import datetime
    dt = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return dt.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"


def short_text(data: bytes | None, limit: int = 24) -> str:
    """Bytes shown as text (non-printables as '.'), cut to `limit` characters; None → 'null'."""
    if data is None:
        return "null"
    text = "".join(chr(b) if 32 <= b < 127 else "." for b in data[:limit])
    return text + ("…" if len(data) > limit else "")


def figure_png(fig) -> bytes:
    """A matplotlib Figure (made with `matplotlib.figure.Figure`, no pyplot state) → PNG bytes."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


class Frame:
    """One moment of a view: the widget values it showed and the engine event it shows the state
    after (`seq`, from `kstore.events.last_seq()`), with a label for the events folded into it."""

    __slots__ = ("seq", "values", "events", "first")

    def __init__(self, seq: int, values: dict[str, Any], events: list[Event], first: bool = False):
        self.seq = seq
        self.values = values
        self.events = events[-50:]       # the engine events folded into this frame (newest 50)
        self.first = first

    @property
    def label(self) -> str:
        if self.first:
            return "when built" + (f", then {describe_events(self.events)}" if self.events else "")
        return describe_events(self.events)

    def fold(self, seq: int, events: list[Event]) -> None:
        """The picture did not change: this frame shows the state through `seq` too."""
        self.seq = max(self.seq, seq)
        self.events = (self.events + events)[-50:]

    def __repr__(self) -> str:
        return f"Frame(seq={self.seq}, label={self.label!r})"


def describe_events(events: list[Event]) -> str:
    """A short label for the engine events folded into one frame: 'append offsets 3–5',
    'append ×40 · roll', 'high_watermark 3 → 5'."""
    if not events:
        return "no engine event"
    if len(events) <= 3:
        return " · ".join(describe_event(e) for e in events)
    counts: dict[str, int] = {}
    for e in events:
        counts[e.kind] = counts.get(e.kind, 0) + 1
    return " · ".join(_kind_words(k) + ("" if n == 1 else f" ×{n}") for k, n in counts.items())


def _kind_words(kind: str) -> str:
    return kind.replace("_", " ")


def describe_event(event: Event) -> str:
    d = event.details
    if event.kind == "append" and "first_offset" in d:
        first, last = d["first_offset"], d.get("last_offset", d["first_offset"])
        return f"append offset {first}" if first == last else f"append offsets {first}–{last}"
    if event.kind == "index_entry":
        return f"index entry [{d.get('offset')}, {d.get('position')}]"
    if event.kind == "roll":
        return f"roll → segment {d.get('new_segment')}"
    if event.kind == "truncate":
        return f"truncate to {d.get('target_offset')}"
    if event.kind == "high_watermark":
        return f"high watermark {d.get('old')} → {d.get('new')}"
    if event.kind == "delete":
        return f"delete segment {d.get('segment')}"
    if event.kind in ("crash", "restart"):
        return f"{event.kind} broker {d.get('broker')}"
    return _kind_words(event.kind)


class Timeline:
    """The frames a view has shown, a position among them, and whether it follows the engine.

    Plain Python (no ipywidgets), so tests step it directly. Thread-safe: frames are recorded on
    the redraw timer thread while the learner steps on the kernel's thread. At most `max_frames`
    are kept: the oldest frames after the first and before the bound one go first.
    """

    def __init__(self, max_frames: int = 200):
        self.frames: list[Frame] = []
        self.position = 0
        self.follow = True             # until bound: the view follows the engine during its cell
        self.bound: int | None = None  # index of the frame taken when the view's cell finished
        self.max_frames = max(3, max_frames)
        self._lock = threading.RLock()

    # ---- recording
    def record(self, values: dict[str, Any], seq: int, events: list[Event] | None = None,
               *, show: bool = False) -> Frame:
        """Add the view's current picture. A picture equal to the newest frame extends that frame
        (it shows the state through `seq` too) instead of adding a step with nothing to see."""
        events = events or []
        with self._lock:
            last = self.frames[-1] if self.frames else None
            if last is not None and last.values == values:
                last.fold(seq, events)
                frame = last
            else:
                frame = Frame(seq, values, events, first=not self.frames)
                self.frames.append(frame)
                self._trim()
            if self.follow or show:
                self.position = len(self.frames) - 1
            return frame

    def _trim(self) -> None:
        while len(self.frames) > self.max_frames:
            drop = 1 if self.bound is None or self.bound > 1 else self.bound + 1
            if drop >= len(self.frames) - 1:
                return
            del self.frames[drop]
            if self.bound is not None and self.bound > drop:
                self.bound -= 1
            if self.position > drop:
                self.position -= 1
            elif self.position == drop:
                self.position = min(drop, len(self.frames) - 1)

    def bind(self) -> None:
        """The newest frame is the view's moment: show it and stop following."""
        with self._lock:
            self.bound = len(self.frames) - 1
            self.position = self.bound
            self.follow = False

    # ---- stepping
    def step(self, delta: int) -> Frame:
        with self._lock:
            self.follow = False
            self.position = max(0, min(len(self.frames) - 1, self.position + delta))
            return self.current

    def go_to(self, index: int) -> Frame:
        with self._lock:
            return self.step(index - self.position)

    def go_bound(self) -> Frame:
        with self._lock:
            return self.go_to(self.bound if self.bound is not None else 0)

    def go_live(self, follow: bool = True) -> Frame:
        with self._lock:
            self.follow = follow
            self.position = len(self.frames) - 1
            return self.current

    @property
    def current(self) -> Frame:
        return self.frames[self.position]

    @property
    def at_end(self) -> bool:
        return self.position == len(self.frames) - 1

    def status(self) -> dict[str, Any]:
        """What the timeline bar shows (and the browser test reads from its data- attributes)."""
        with self._lock:
            f = self.current
            return {"frame": self.position, "frames": len(self.frames), "seq": f.seq,
                    "bound": self.bound, "follow": self.follow, "label": f.label,
                    "bound_seq": self.frames[self.bound].seq if self.bound is not None else None}


TIMELINE_CSS = """
.ks-tl{font-family:var(--jp-ui-font-family,sans-serif);font-size:12px;color:#444;padding:2px 6px;}
.ks-tl b{color:#222;}
.ks-tl.ks-tl-past{color:#a15c00;}
"""


class WidgetView:
    """A view shown in a notebook: displays its `widget`; with `start_timeline`, bound to its moment."""

    widget = None
    model = None
    timeline: Timeline | None = None
    capture_error: str | None = None        # why the latest capture failed (files removed...)
    frame_parts: tuple[str, ...] = ("html",)   # the widgets whose `.value` make one frame

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)
        _DISPLAYED.append(weakref.ref(self))
        self._bind_after_cell()

    # ---- what a subclass provides
    def render_frame(self) -> dict[str, Any]:
        """The values of the `frame_parts` widgets for the engine's state now."""
        return {"html": self.model.render_html()}

    def frame_values(self) -> dict[str, Any]:
        """What a frame holds: the rendered values, and whose code ran the engine at this moment."""
        return {**self.render_frame(), ENGINE_KEY: engine_badge()}

    def sync_controls(self) -> None:
        """Bring buttons and dropdowns up to date with the live model (views override)."""

    # ---- the timeline
    def start_timeline(self, min_interval: float = 0.1, max_frames: int = 200) -> None:
        """Follow the model through a `Redrawer`, record frames, add the timeline bar, take frame 0."""
        import ipywidgets as W

        self.timeline = Timeline(max_frames)
        self._pending_events: list[Event] = []
        self._pending_lock = threading.Lock()
        self._show_now = False
        btn = lambda label, tip, cls: button(W, label, tip, cls)   # noqa: E731
        self.tl_cell = btn("|◀ its cell", "the state when this view's cell ran", "ks-tl-cell")
        self.tl_back = btn("◀", "one engine event back", "ks-tl-back")
        self.tl_fwd = btn("▶", "one engine event forward", "ks-tl-fwd")
        self.tl_now = btn("now ▶|", "the engine's state now", "ks-tl-now")
        # a button, not a checkbox: a click is one message, never undone by the kernel's echo
        self.tl_follow = btn("follow live", "redraw as the engine changes (click again to stop)",
                             "ks-tl-follow")
        self.tl_label = W.HTML()
        self.tl_label.add_class("ks-tl-label")
        self.tl_cell.on_click(lambda _: self._show(self.timeline.go_bound()))
        self.tl_back.on_click(lambda _: self.step(-1))
        self.tl_fwd.on_click(lambda _: self.step(1))
        self.tl_now.on_click(lambda _: self.live(False))
        self.tl_follow.on_click(lambda _: self.toggle_follow())
        bar = W.HBox([self.tl_cell, self.tl_back, self.tl_label, self.tl_fwd, self.tl_now,
                      self.tl_follow])
        bar.add_class("ks-timeline")
        self.widget.children = tuple(self.widget.children) + (bar,)
        self.redrawer = Redrawer(self.capture, min_interval)
        self.model.on_change(self._on_model_change)
        self.capture()

    def _on_model_change(self, _model, event: Event | None) -> None:
        with self._pending_lock:
            if event is None:          # a user action on the view: it acts on the present
                self._show_now = True
            else:
                self._pending_events.append(event)
        self.redrawer.request()

    def capture(self) -> Frame:
        """Record the engine's state now as a frame; show it if following (or after a user action)."""
        seq = _event_seq()
        with self._pending_lock:
            events, self._pending_events = self._pending_events, []
            show, self._show_now = self._show_now, False
        try:
            self.sync_controls()
            values = self.frame_values()
        except Exception as e:     # e.g. the chapter closed the log and removed its files
            if not self.timeline.frames:
                raise              # a view that cannot draw its first picture is a plain error
            self.capture_error = f"cannot read the engine now ({type(e).__name__}: {e})"
            self._update_bar()
            return self.timeline.current
        self.capture_error = None
        frame = self.timeline.record(values, seq, events, show=show)
        if self.timeline.follow or show:
            self._show(self.timeline.current)
        else:
            self._update_bar()
        return frame

    def bind(self) -> Frame:
        """Take the view's moment now (done for you when the cell that displayed it finishes)."""
        self.redrawer.cancel()
        self.capture()
        self.timeline.bind()
        frame = self.timeline.current
        self._show(frame)
        return frame

    def _bind_after_cell(self) -> None:
        if self.timeline is None:
            return
        try:
            from IPython import get_ipython
            shell = get_ipython()
        except ImportError:            # pragma: no cover - IPython is a dependency
            shell = None
        if shell is None or not hasattr(shell, "events"):
            self.bind()                # not in a notebook: the moment is now
            return

        def once(*_args) -> None:
            shell.events.unregister("post_run_cell", once)
            self.bind()
        shell.events.register("post_run_cell", once)

    def step(self, delta: int) -> Frame:
        frame = self.timeline.step(delta)
        self._show(frame)
        return frame

    def live(self, follow: bool = True) -> Frame:
        """Show the engine's state now; with `follow`, keep following it."""
        if follow:
            self.timeline.follow = True
        self.capture()
        frame = self.timeline.go_live(follow)
        self._show(frame)
        return frame

    def toggle_follow(self) -> None:
        """The "follow live" button: start following the engine, or stop (and stay on that frame)."""
        if self.timeline.follow:
            self.timeline.follow = False
            self._update_bar()
        else:
            self.live(True)

    def _show(self, frame: Frame) -> None:
        for name in self.frame_parts:
            if name in frame.values:
                getattr(self, name).value = frame.values[name]
        self._update_bar()

    def _update_bar(self) -> None:
        st = self.timeline.status()
        self.tl_follow.description = "● following live" if st["follow"] else "follow live"
        self.tl_follow.button_style = "success" if st["follow"] else ""
        when = ("its cell" if st["frame"] == st["bound"] else
                "now" if st["frame"] == st["frames"] - 1 else "earlier" if
                st["bound"] is not None and st["frame"] < st["bound"] else "later")
        past = "" if st["frame"] == st["frames"] - 1 else " ks-tl-past"
        self.tl_label.value = (
            style(TIMELINE_CSS) +
            f'<span class="ks-tl{past}"' + attrs(data_frame=st["frame"], data_frames=st["frames"],
                                                 data_seq=st["seq"], data_bound=st["bound"],
                                                 data_bound_seq=st["bound_seq"],
                                                 data_follow=str(st["follow"]).lower()) +
            f'>frame <b>{st["frame"] + 1}/{st["frames"]}</b> · {esc(when)} · engine event '
            f'#{st["seq"]} · {esc(st["label"])}'
            + (f' · <i>{esc(self.capture_error)}: the last frame recorded is the latest</i>'
               if self.capture_error and st["frame"] == st["frames"] - 1 else "") + '</span>'
            + engine_badge_html(self.timeline.current.values.get(ENGINE_KEY)))
        self.tl_back.disabled = st["frame"] == 0
        self.tl_fwd.disabled = st["frame"] == st["frames"] - 1


ENGINE_KEY = "ks_engine"     # a frame's record of whose code ran the engine (not a displayed part)


def engine_badge() -> tuple[str, str] | None:
    """(short text, full status) while `kstore.use_my_engine` is on in this kernel, else None."""
    from .. import my_engine
    engine = my_engine.active()
    if engine is None:
        return None
    short = (f"your engine: {len(engine.yours)} of {len(engine.yours) + len(engine.kstores)} parts yours"
             if engine.yours else "your engine: all parts kstore's")
    return short, engine.status


def engine_badge_html(badge: tuple[str, str] | None) -> str:
    """The badge a view shows beside its timeline when the learner's engine made that frame."""
    if not badge:
        return ""
    short, full = badge
    return (f' <span class="ks-engine-badge"{attrs(title=full)} style="margin-left:8px;padding:1px 6px;'
            f'border-radius:8px;background:#e8f5e9;color:#1b5e20;font-size:85%">{esc(short)}</span>')


_DISPLAYED: list[weakref.ref] = []


def displayed_views() -> list[WidgetView]:
    """The views displayed in this kernel so far, oldest first (tests check each one's moment)."""
    return [v for v in (ref() for ref in _DISPLAYED) if v is not None]


def _event_seq() -> int:
    return last_seq()


class HtmlView(WidgetView):
    """A view that is one HTML block over a `model_class`, with its timeline."""

    model_class: type = LiveModel
    css_class = ""

    def __init__(self, source_or_model, min_interval: float = 0.1):
        import ipywidgets as W

        self.model = source_or_model if isinstance(source_or_model, self.model_class) \
            else self.model_class(source_or_model)
        self.html = W.HTML()
        self.widget = W.VBox([self.html])
        self.widget.add_class(self.css_class)
        self.start_timeline(min_interval)

    def _draw(self) -> None:
        """Kept for subclasses written before timelines: take a frame now."""
        self.capture()


def button(W, label: str, tooltip: str, cls: str):
    """An ipywidgets button sized to its label, with a CSS class the browser test can find."""
    b = W.Button(description=label, tooltip=tooltip, layout=W.Layout(width="auto"))
    b.add_class(cls)
    return b

"""What every view shares: a live model fed by engine events, throttled redraws, small HTML helpers.

A *model* (`LiveModel`) holds a view's state and renders it as HTML; it knows nothing of
ipywidgets, so the tests drive it with real engine operations and read its HTML. It subscribes to
the engine's `EventBus` (no polling): each event it cares about updates its state and tells its
listeners. A *view* (an ipywidgets box) is one such listener; it redraws through a `Redrawer`,
which coalesces bursts of events (a bulk produce emits thousands) into at most one redraw per
`min_interval` seconds, plus a final one when the burst ends.
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any, Callable, Iterable

from ..events import Event, EventBus

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


class WidgetView:
    """A view shown in a notebook: displays its `widget`."""

    widget = None

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)


class HtmlView(WidgetView):
    """A view that is one HTML block, redrawn (throttled) whenever its model changes."""

    model_class: type = LiveModel
    css_class = ""

    def __init__(self, source_or_model, min_interval: float = 0.1):
        import ipywidgets as W

        self.model = source_or_model if isinstance(source_or_model, self.model_class) \
            else self.model_class(source_or_model)
        self.html = W.HTML()
        self.widget = W.VBox([self.html])
        self.widget.add_class(self.css_class)
        self.redrawer = Redrawer(self._draw, min_interval)
        self.model.on_change(lambda *_: self.redrawer.request())
        self._draw()

    def _draw(self) -> None:
        self.html.value = self.model.render_html()


def button(W, label: str, tooltip: str, cls: str):
    """An ipywidgets button sized to its label, with a CSS class the browser test can find."""
    b = W.Button(description=label, tooltip=tooltip, layout=W.Layout(width="auto"))
    b.add_class(cls)
    return b

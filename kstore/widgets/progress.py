"""Progress bars for long notebook operations (bulk produce, benchmarks, grading a folder).

`ProgressModel` counts work done against a total and derives the rate and the time left;
`ProgressBar` shows it as an ipywidgets bar with a label, redrawn at most ten times a second
however often it is updated; `track(iterable)` wraps any loop; `bulk_produce(log, n)` appends `n`
records as prebuilt batches (`Log.append_as_leader`, the fast path) with a bar.
"""

from __future__ import annotations

import time
from typing import Iterable, Iterator

from ._base import Redrawer, attrs, esc


class ProgressModel:
    def __init__(self, total: int | None, description: str = "", unit: str = "items",
                 clock=time.monotonic):
        self.total = total
        self.description = description
        self.unit = unit
        self.clock = clock
        self.done = 0
        self.started = clock()
        self.finished_at: float | None = None
        self.error: str | None = None

    def update(self, n: int = 1) -> None:
        self.done += n

    def finish(self, error: BaseException | None = None) -> None:
        self.finished_at = self.clock()
        if error is not None:
            self.error = f"{type(error).__name__}: {error}"

    @property
    def elapsed(self) -> float:
        return (self.finished_at or self.clock()) - self.started

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(self.done / self.total, 1.0)

    @property
    def rate(self) -> float:
        return self.done / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        if not self.total or self.rate <= 0 or self.finished_at is not None:
            return None
        return (self.total - self.done) / self.rate

    def render_text(self) -> str:
        total = f"/{self.total:,}" if self.total else ""
        pct = f" ({self.fraction:.0%})" if self.fraction is not None else ""
        text = f"{self.description}: {self.done:,}{total} {self.unit}{pct} · {_rate(self.rate)} {self.unit}/s"
        if self.error:
            return text + f" · failed: {self.error}"
        if self.finished_at is not None:
            return text + f" · done in {self.elapsed:.1f} s"
        if self.eta is not None:
            text += f" · about {self.eta:.0f} s left"
        return text

    def render_html(self) -> str:
        return f"<span{attrs(class_='ks-progress-text', data_done=self.done)}>{esc(self.render_text())}</span>"


def _rate(x: float) -> str:
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class ProgressBar:
    """`with ProgressBar(total, "bulk produce", "records") as bar: ... bar.update(n)`."""

    def __init__(self, total: int | None, description: str = "", unit: str = "items",
                 display: bool = True, min_interval: float = 0.1):
        import ipywidgets as W

        self.model = ProgressModel(total, description, unit)
        self.bar = W.IntProgress(value=0, min=0, max=max(total or 1, 1),
                                 layout=W.Layout(width="320px"))
        self.label = W.HTML()
        self.widget = W.HBox([self.bar, self.label])
        self.widget.add_class("kstore-progress")
        self.redrawer = Redrawer(self._draw, min_interval)
        self._draw()
        if display and in_notebook():
            from IPython.display import display as show
            show(self.widget)

    def update(self, n: int = 1) -> None:
        self.model.update(n)
        self.redrawer.request()

    def finish(self, error: BaseException | None = None) -> None:
        self.model.finish(error)
        self.redrawer.cancel()
        self._draw()
        if error is None:
            self.bar.bar_style = "success"
        else:
            self.bar.bar_style = "danger"

    def _draw(self) -> None:
        m = self.model
        if m.total:
            self.bar.value = min(m.done, m.total)
        else:
            self.bar.value = 1 if m.finished_at else 0
        self.label.value = m.render_html()

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish(exc)


def track(iterable: Iterable, total: int | None = None, description: str = "",
          unit: str = "items", display: bool = True) -> Iterator:
    """Iterate with a progress bar: `for path in track(paths, description="grading"): ...`."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    bar = ProgressBar(total, description, unit, display)
    try:
        for item in iterable:
            yield item
            bar.update(1)
    except BaseException as e:
        bar.finish(e)
        raise
    bar.finish()
    track.last = bar          # the finished bar (tests and notebooks read its model)


def bulk_produce(log, n_records: int, *, batch_records: int = 1000, value_size: int = 100,
                 timestamp: int | None = None, progress: bool = True, display: bool = True) -> dict:
    """Append `n_records` records of `value_size` bytes as prebuilt batches of `batch_records`
    (one batch built once, appended again and again: the log assigns the offsets)."""
    from ..records import Record, build_batch

    ts = log.clock.milliseconds() if timestamp is None else timestamp
    value = (b"kstore-" * (value_size // 7 + 1))[:value_size]
    full = build_batch([Record(None, value, ts)] * batch_records)
    bar = ProgressBar(n_records, "bulk produce", "records", display) if progress else None
    start, done, first = time.perf_counter(), 0, log.log_end_offset
    try:
        while done < n_records:
            k = min(batch_records, n_records - done)
            batch = full if k == batch_records else build_batch([Record(None, value, ts)] * k)
            log.append_as_leader(batch)
            done += k
            if bar:
                bar.update(k)
    except BaseException as e:
        if bar:
            bar.finish(e)
        raise
    if bar:
        bar.finish()
    seconds = time.perf_counter() - start
    return {"records": done, "first_offset": first, "last_offset": log.log_end_offset - 1,
            "seconds": seconds, "records_per_s": done / seconds if seconds else None,
            "bar": bar}

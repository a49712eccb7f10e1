"""Progress bars for long notebook operations (bulk produce, benchmarks, grading a folder).

`ProgressModel` counts work done against a total and derives the rate and the time left;
`ProgressBar` shows it as an ipywidgets bar with a label, redrawn at most ten times a second
however often it is updated; `track(iterable)` wraps any loop; `bulk_produce(log, n)` appends `n`
records as prebuilt batches (`Log.append_as_leader`, the fast path) with a bar; `watch_spark(spark)`
gives every later notebook cell that runs Spark jobs a bar of their tasks; `working(description)`
covers a wait whose length nobody knows (starting Spark's JVM, a server coming up) with a bar of
the seconds that pass; `run_kstore(*args)` runs a `kstore` command in a subprocess under one.
"""

from __future__ import annotations

import subprocess
import sys
import threading
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
        if self.unit is None:            # a wait of unknown length: only the time it has taken
            return self._render_elapsed()
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

    def _render_elapsed(self) -> str:
        if self.error:
            return f"{self.description} · failed after {self.elapsed:.1f} s: {self.error}"
        if self.finished_at is not None:
            return f"{self.description} · done in {self.elapsed:.1f} s"
        return f"{self.description} · {self.elapsed:.1f} s"

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

    def set(self, done: int, total: int | None) -> None:
        """Progress counted elsewhere (e.g. Spark's tasks): `done` of a `total` that may grow."""
        self.model.done, self.model.total = done, total
        self.bar.max = max(total or 1, 1)
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
        elif m.unit is None and m.finished_at is None:     # unknown length: a sweep that keeps moving
            self.bar.value = int(m.elapsed * 4) % (self.bar.max + 1)
        elif m.unit is None:
            self.bar.value = self.bar.max
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


class SparkTasksBar:
    """While one notebook cell runs: a bar of the Spark tasks it started, read from Spark's status
    tracker every `interval` s on a helper thread; the bar stays hidden if the cell starts none."""

    def __init__(self, spark, interval: float = 0.25, display: bool = True):
        self.tracker = spark.sparkContext.statusTracker()
        self.interval = interval
        self.stages: dict[int, list[int]] = {}        # stage id -> [tasks, completed tasks]
        self.bar = ProgressBar(1, "Spark", "tasks", display=False)
        self.bar.widget.layout.display = "none"
        if display and in_notebook():
            from IPython.display import display as show
            show(self.bar.widget)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-tasks-bar", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        try:
            for sid in self.tracker.getActiveStageIds():
                info = self.tracker.getStageInfo(sid)
                if info is not None:
                    self.stages[sid] = [info.numTasks, info.numCompletedTasks]
        except Exception:          # Spark stopped (the last cell of a chapter): nothing to show
            self._stop.set()
            return
        self._show()

    def _show(self) -> None:
        if self.stages:
            total = sum(t for t, _ in self.stages.values())
            self.bar.model.description = f"Spark: {len(self.stages)} stage(s)"
            self.bar.set(sum(c for _, c in self.stages.values()), total)
            self.bar.widget.layout.display = None

    def stop(self) -> None:
        """The cell ended: its stages are over (a stage no longer active has finished)."""
        self._stop.set()
        self._thread.join(5)
        for counts in self.stages.values():
            counts[1] = counts[0]
        self._show()
        if self.stages:
            self.bar.finish()


def watch_spark(spark):
    """From now on, every notebook cell that runs Spark jobs shows a bar of their tasks (Spark's
    own console bar goes to the kernel's terminal, which a notebook never shows). Returns a
    function that stops watching."""
    from IPython import get_ipython
    shell = get_ipython()
    current: list[SparkTasksBar] = []

    def before(*_args) -> None:
        try:
            spark.sparkContext.statusTracker()
        except Exception:          # Spark was stopped: no more bars (and no error in the cell)
            return
        current.append(SparkTasksBar(spark))

    def after(*_args) -> None:
        while current:
            current.pop().stop()

    if shell is None:
        return lambda: None
    shell.events.register("pre_run_cell", before)
    shell.events.register("post_run_cell", after)

    def unwatch() -> None:
        after()
        shell.events.unregister("pre_run_cell", before)
        shell.events.unregister("post_run_cell", after)
    return unwatch


class Working:
    """A bar for a wait of unknown length: `with working("starting Spark"): ...`.

    The label counts the seconds (redrawn every `interval` s by a helper thread) and the bar sweeps
    while the work runs; when it ends the label says "done in N s" (or "failed after N s: ...").
    The bar stays hidden for the first `show_after` seconds, so a wait that ends quickly leaves no
    clutter; any longer and the learner sees that something is happening."""

    def __init__(self, description: str, show_after: float = 0.5, interval: float = 0.25,
                 display: bool = True):
        self.show_after = show_after
        self.bar = ProgressBar(None, description, None, display=False, min_interval=0)
        self.bar.bar.max = 20
        self.model = self.bar.model
        if show_after > 0:
            self.bar.widget.layout.display = "none"
        if display and in_notebook():
            from IPython.display import display as show
            show(self.bar.widget)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, args=(interval,),
                                        name="kstore-working", daemon=True)
        self._thread.start()

    @property
    def shown(self) -> bool:
        return self.bar.widget.layout.display != "none"

    def _tick(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._draw()

    def _draw(self) -> None:
        if not self.shown and self.model.elapsed >= self.show_after:
            self.bar.widget.layout.display = None
        self.bar._draw()

    def finish(self, error: BaseException | None = None) -> None:
        self._stop.set()
        self._thread.join(5)
        self.bar.finish(error)
        self._draw()

    def __enter__(self) -> "Working":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish(exc)


working = Working


def run_kstore(*args: str, check: bool = True, description: str | None = None,
               show_after: float = 0.5, timeout: float | None = 600) -> subprocess.CompletedProcess:
    """Run `kstore ARGS` as a separate process (this interpreter's `python -m kstore`, so the
    same kstore), as a learner would in a terminal, under a `working` bar; returns the finished
    process with its stdout and stderr as text. With `check`, a failing command raises
    `subprocess.CalledProcessError` whose message includes the command's own error line."""
    label = description or f"kstore {args[0] if args else ''}".strip()
    with Working(label, show_after=show_after) as w:
        run_kstore.last = w          # the bar (tests read its model)
        done = subprocess.run([sys.executable, "-m", "kstore", *args], capture_output=True,
                              text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise KstoreCommandFailed(done.returncode, done.args, done.stdout, done.stderr)
    return done


class KstoreCommandFailed(subprocess.CalledProcessError):
    """A `kstore` command that exited non-zero, told in one line: the command and its last
    stderr line (the tool's own message), not only the exit status."""

    def __str__(self) -> str:
        why = (self.stderr or "").strip().splitlines()
        return (f"kstore {' '.join(map(str, self.cmd[3:]))} exited with status {self.returncode}"
                + (f": {why[-1]}" if why else ""))

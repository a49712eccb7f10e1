"""Helpers the chapter notebooks share: show engine source, work in a temporary directory.

* `show_source(obj)` displays the real code of a kstore function or class (from `kstore/`, never a
  pasted copy), optionally only the lines between two markers;
* `workdir(name)` gives a fresh temporary directory that is removed when the notebook's kernel
  exits (or with `.cleanup()`), so chapters leave nothing behind;
* `hexdump(data)` prints bytes the way the reference tables show them;
* `micro_batch_table(query.recentProgress)` and `plot_micro_batches(table)` show a Spark
  streaming query's micro-batches as a table and as bars (rows read, rows per second);
* `stderr_to(path)` sends what processes started meanwhile (Spark's JVM) write to stderr to a file;
* `log_lines(logger)` collects what an engine module logs from now on, as `kstore serve` prints it.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path


def source_of(obj, start: str | None = None, end: str | None = None) -> str:
    """The source of `obj`; with `start`/`end`, only the lines from the one containing `start`
    to the one containing `end` (inclusive)."""
    text = inspect.getsource(obj)
    if start is None:
        return text
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if start in line)
    last = next((i for i, line in enumerate(lines) if i >= first and end and end in line),
                len(lines) - 1)
    return "\n".join(lines[first:last + 1])


def show_source(obj, start: str | None = None, end: str | None = None):
    """Display engine code in the notebook, syntax-highlighted, with where it comes from."""
    from IPython.display import Code, Markdown, display
    module = inspect.getmodule(obj)
    lineno = inspect.getsourcelines(obj)[1]
    where = f"`{module.__name__}` — `{getattr(obj, '__qualname__', obj)}` (line {lineno})"
    display(Markdown(f"From {where}:"))
    return Code(source_of(obj, start, end), language="python")


class WorkDir(type(Path())):
    """A temporary directory that removes itself (at kernel exit, or on `cleanup()`)."""

    def cleanup(self) -> None:
        shutil.rmtree(self, ignore_errors=True)


def workdir(name: str = "kstore") -> WorkDir:
    path = WorkDir(tempfile.mkdtemp(prefix=f"{name}-"))
    atexit.register(path.cleanup)
    return path


@contextlib.contextmanager
def stderr_to(path):
    """Point this process's file descriptor 2 at the file `path` (appended to) while the block
    runs. A process started meanwhile keeps it as its stderr: Spark's JVM, started by the first
    `spark_session()`, writes its start-up notices and later log lines there instead of into
    the notebook (JupyterLab's kernel forwards whatever reaches descriptor 2 to the cell that is
    running). Python's own `sys.stderr` (warnings, tracebacks) still reaches the notebook."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield Path(path)
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]):
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()} ({record.name})")


def log_lines(logger: str = "kstore") -> list[str]:
    """A list that fills with each INFO (and higher) line `logger` writes from now on: the lines
    a `kstore serve` broker would write to its log, for an in-process engine."""
    lines: list[str] = []
    log = logging.getLogger(logger)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    for old in [h for h in log.handlers if isinstance(h, _Lines)]:
        log.removeHandler(old)    # a cell run again collects afresh, not into every earlier list
    log.addHandler(_Lines(lines))
    return lines


def hexdump(data: bytes, width: int = 16, start: int = 0) -> str:
    """`0000: 00 01 02 ...` lines, as the reference's worked examples print bytes."""
    lines = []
    for i in range(0, len(data), width):
        chunk = data[i:i + width]
        lines.append(f"{start + i:04x}: " + " ".join(f"{b:02x}" for b in chunk))
    return "\n".join(lines)


def micro_batch_table(progress: list[dict]):
    """A Spark streaming query's `recentProgress` → one row per micro-batch: rows read, the
    source's offset range, how long the batch took and how many rows per second it processed."""
    import pandas as pd
    return pd.DataFrame([{
        "batch": p["batchId"], "rows read": p["numInputRows"],
        "start offsets": p["sources"][0]["startOffset"],
        "end offsets": p["sources"][0]["endOffset"],
        "ms": p.get("durationMs", {}).get("triggerExecution"),
        "rows/s processed": round(p.get("processedRowsPerSecond") or 0.0)} for p in progress])


def plot_micro_batches(table, title: str = "micro-batches"):
    """Rows read and rows processed per second for each micro-batch, side by side, as a PNG image
    the notebook shows as the cell's result (a matplotlib Figure, no pyplot state)."""
    from IPython.display import Image
    from matplotlib.figure import Figure

    from .widgets._base import figure_png
    fig = Figure(figsize=(8, 2.8))
    labels = [str(b) for b in table["batch"]]
    for k, (column, colour) in enumerate([("rows read", "#4c78a8"),
                                          ("rows/s processed", "#59a14f")]):
        ax = fig.add_subplot(1, 2, k + 1)
        ax.bar(labels, table[column], color=colour)
        ax.set_title(column, fontsize=10)
        ax.set_xlabel("micro-batch", fontsize=9)
        ax.tick_params(labelsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return Image(data=figure_png(fig), format="png")
# --- "The blog says / Kafka does" boxes -----------------------------------------------------------------
# Much Kafka material repeats a few well-known mistakes. Each chapter names the mistake, says what Kafka
# really does, and shows it on the live engine in the same cell. `tests/test_blog_boxes.py` finds every
# box by BLOG_MARKER and checks that each mistake in its list has one.

BLOG_SERIES = "a popular Chinese blog series on Kafka storage (Kafka 存储机制)"
BLOG_MARKER = "ks-blog-says"


def _inline(text: str) -> str:
    """The two pieces of markdown the boxes use: `code` and **bold**, the rest escaped."""
    import html
    import re
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)


def blog_box_html(mistake: str, claim: str, kafka_does: str, source: str = BLOG_SERIES,
                  term: str | None = None) -> str:
    """The box as HTML: the claim as the source words it, then what Kafka does."""
    import html
    term_line = f'<div style="color:#555">term: {html.escape(term)}</div>' if term else ""
    return (f'<div class="{BLOG_MARKER}" data-mistake="{html.escape(mistake)}" style="border-left:4px solid '
            f'#c0392b;background:#fdf3f2;padding:6px 10px;margin:6px 0">'
            f'<div><b>The blog says</b> <span style="color:#555">— {html.escape(source)}</span>: '
            f'“{_inline(claim)}”</div>{term_line}'
            f'<div style="border-top:1px solid #e6b0aa;margin-top:4px;padding-top:4px">'
            f'<b>Kafka does:</b> {_inline(kafka_does)}</div></div>')


def blog_says(mistake: str, claim: str, kafka_does: str, source: str = BLOG_SERIES,
              term: str | None = None) -> None:
    """Display a "The blog says / Kafka does" box. `mistake` is the short id the course's test lists;
    the code after the call in the same cell shows Kafka's behaviour on the engine."""
    from IPython.display import HTML, display
    display(HTML(blog_box_html(mistake, claim, kafka_does, source, term)))

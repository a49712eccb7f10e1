"""A progress line for long command-line operations, on stderr and only when stderr is a terminal.

`kstore produce` reading 200,000 lines from a pipe runs for seconds; a person at a terminal wants to
see it moving, while a script reading stdout/stderr wants neither carriage returns nor noise. So the
line is written only when the stream `isatty()`, redrawn in place (`\\r`) at most every
`min_interval` seconds, and finished with a newline. A command whose own output is records
(`kstore consume`) passes that stream as `beside`: when it is the same terminal the records
scrolling by are the progress, and a line redrawn among them would only break them up, so the
line is drawn only when they go to a file or a pipe (`kstore consume ... > out.txt`). (Kafka's
console tools print no progress; this is kstore's addition, invisible to scripts.)
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Iterable, Iterator, TextIO


class ProgressLine:
    """`with ProgressLine("produce", "records") as p: ... p.update(1)`."""

    def __init__(self, what: str, unit: str, stream: TextIO | None = None,
                 min_interval: float = 0.25, clock: Callable[[], float] = time.monotonic,
                 beside: TextIO | None = None):
        self.what, self.unit = what, unit
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _is_tty(self.stream) and not (beside is not None and _is_tty(beside))
        self.min_interval = min_interval
        self.clock = clock
        self.done = 0
        self.started = clock()
        self._last_draw = None
        self.lines_drawn = 0

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        now = self.clock()
        if self._last_draw is None or now - self._last_draw >= self.min_interval:
            self._last_draw = now
            self._draw(now, final=False)

    def finish(self) -> None:
        if self.enabled and self.lines_drawn:     # a quick run that drew nothing stays silent
            self._draw(self.clock(), final=True)

    def text(self, now: float) -> str:
        seconds = max(now - self.started, 1e-9)
        return (f"{self.what}: {self.done:,} {self.unit} in {seconds:.1f} s "
                f"({self.done / seconds:,.0f} {self.unit}/s)")

    def _draw(self, now: float, final: bool) -> None:
        self.lines_drawn += 1
        self.stream.write("\r" + self.text(now) + ("\n" if final else ""))
        self.stream.flush()

    def __enter__(self) -> "ProgressLine":
        return self

    def __exit__(self, *exc) -> None:
        self.finish()


def counted(items: Iterable, progress: ProgressLine) -> Iterator:
    """Yield `items`, counting each one on `progress`."""
    for item in items:
        yield item
        progress.update(1)


def _is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):     # closed or not a real stream
        return False

"""Delayed and periodic engine tasks (deleting `.deleted` files, retention checks).

Mirrors Kafka's `KafkaScheduler` / `MockScheduler`. Tasks are kept in a queue ordered by due time
on the injected clock. `run_due()` runs what is due; the log calls it on every append, so with a
`ManualClock` everything is deterministic and no thread is needed. `start()` adds a background
thread for real-time use (it only polls the queue; stop it with `shutdown()`).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass, field
from typing import Callable

from .clock import Clock


@dataclass(order=True)
class _Task:
    due_ms: int
    seq: int
    name: str = field(compare=False)
    fn: Callable[[], None] = field(compare=False)
    period_ms: int | None = field(compare=False, default=None)
    cancelled: bool = field(compare=False, default=False)


class Scheduler:
    def __init__(self, clock: Clock):
        self.clock = clock
        self._queue: list[_Task] = []
        self._seq = itertools.count()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.errors: list[tuple[str, BaseException]] = []

    def schedule(self, name: str, fn: Callable[[], None], delay_ms: int = 0,
                 period_ms: int | None = None) -> _Task:
        task = _Task(self.clock.milliseconds() + delay_ms, next(self._seq), name, fn, period_ms)
        with self._lock:
            heapq.heappush(self._queue, task)
        return task

    def cancel(self, task: _Task) -> None:
        task.cancelled = True

    def pending(self) -> list[tuple[str, int]]:
        with self._lock:
            return sorted((t.name, t.due_ms) for t in self._queue if not t.cancelled)

    def run_due(self) -> int:
        """Run every task whose time has come; return how many ran."""
        # Every append asks, and usually nothing is due: peek at the earliest task without the
        # lock (another thread may empty the heap between the two looks: the IndexError).
        queue = self._queue
        try:
            if not queue or queue[0].due_ms > self.clock.milliseconds():
                return 0
        except IndexError:
            return 0
        ran = 0
        while True:
            with self._lock:
                if not self._queue or self._queue[0].due_ms > self.clock.milliseconds():
                    return ran
                task = heapq.heappop(self._queue)
                if task.cancelled:
                    continue
                if task.period_ms is not None:   # the same object goes back, so cancel() reaches it
                    # A clock jump does not replay every missed period: run once, keep the phase.
                    now = self.clock.milliseconds()
                    task.due_ms += task.period_ms * max(1, (now - task.due_ms) // task.period_ms + 1)
                    task.seq = next(self._seq)
                    heapq.heappush(self._queue, task)
            try:
                task.fn()
            except Exception as e:  # one failing task must not stop the others
                self.errors.append((task.name, e))
            ran += 1

    def run_all_now(self) -> int:
        """Run every pending one-shot task regardless of its due time (used on shutdown)."""
        with self._lock:
            tasks = [t for t in self._queue if not t.cancelled and t.period_ms is None]
            self._queue = [t for t in self._queue if t.period_ms is not None and not t.cancelled]
            heapq.heapify(self._queue)
        for t in sorted(tasks):
            try:
                t.fn()
            except Exception as e:
                self.errors.append((t.name, e))
        return len(tasks)

    # ---- optional background thread (real time)
    def start(self, poll_ms: int = 50) -> None:
        if self._thread is not None:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(poll_ms / 1000):
                self.run_due()
        self._thread = threading.Thread(target=loop, name="kstore-scheduler", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None

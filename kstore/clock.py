"""Time, injected: the engine never calls time.time() itself.

Mirrors Kafka's `Time` / `MockTime`. `SystemClock` is the real clock; `ManualClock` only moves
when told, so notebooks and tests are deterministic ("clock advances 30 s").
"""

from __future__ import annotations

import threading
import time


class Clock:
    def milliseconds(self) -> int:
        raise NotImplementedError

    def nanoseconds(self) -> int:
        raise NotImplementedError

    def sleep(self, ms: int) -> None:
        raise NotImplementedError


class SystemClock(Clock):
    def milliseconds(self) -> int:
        return time.time_ns() // 1_000_000

    def nanoseconds(self) -> int:
        return time.monotonic_ns()

    def sleep(self, ms: int) -> None:
        time.sleep(ms / 1000)

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock(Clock):
    """A clock that starts at `start_ms` and moves only by `advance`/`sleep`/`set`."""

    def __init__(self, start_ms: int = 1_700_000_000_000):
        self._ms = start_ms
        self._nanos = 0
        self._lock = threading.Lock()

    def milliseconds(self) -> int:
        return self._ms

    def nanoseconds(self) -> int:
        return self._nanos

    def advance(self, ms: int) -> int:
        if ms < 0:
            raise ValueError(f"a clock cannot go backwards (advance by {ms} ms)")
        with self._lock:
            self._ms += ms
            self._nanos += ms * 1_000_000
        return self._ms

    sleep = advance

    def set(self, ms: int) -> None:
        self.advance(ms - self._ms)

    def __repr__(self) -> str:
        return f"ManualClock({self._ms})"


SYSTEM = SystemClock()

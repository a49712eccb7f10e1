"""Engine events, so widgets can redraw when the files change (no polling).

The engine calls `bus.emit(kind, source, **details)` after each change; subscribers receive an
`Event`. Kinds used by the log: append, index_entry, roll, truncate, recover, flush, delete,
load, close, high_watermark, log_start_offset, clean; by the cluster: crash, restart, election.
A failing subscriber never breaks the engine: its exception is kept in `bus.errors`.

Every emitted event gets a sequence number from one process-wide counter (`Event.seq`, and
`last_seq()` for the newest), so "the engine's state as of event N" means the same thing on every
bus — the widgets' timelines use it to say which moment a picture shows.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Event:
    kind: str
    source: str                      # the partition directory (or log dir) the event is about
    details: dict[str, Any] = field(default_factory=dict)
    seq: int = 0                     # position in the process-wide event log (see last_seq)


_counter = itertools.count(1)
_last_seq = 0


def last_seq() -> int:
    """The sequence number of the newest engine event emitted so far (0: none yet)."""
    return _last_seq


class EventBus:
    def __init__(self) -> None:
        self._subscribers: list[tuple[Callable[[Event], None], frozenset[str] | None]] = []
        self._lock = threading.Lock()
        self.errors: list[BaseException] = []

    def subscribe(self, callback: Callable[[Event], None], kinds=None) -> Callable[[], None]:
        """Call `callback(event)` for every event (or only `kinds`); returns an unsubscribe function."""
        entry = (callback, frozenset(kinds) if kinds else None)
        with self._lock:
            self._subscribers.append(entry)

        def unsubscribe() -> None:
            with self._lock:
                if entry in self._subscribers:
                    self._subscribers.remove(entry)
        return unsubscribe

    def emit(self, kind: str, source: str, **details: Any) -> None:
        # Numbered even unobserved, so a view shown later still agrees (itertools.count is
        # atomic under the GIL).
        global _last_seq
        _last_seq = seq = next(_counter)
        if not self._subscribers:
            return
        event = Event(kind, source, details, seq)
        for callback, kinds in list(self._subscribers):
            if kinds is None or kind in kinds:
                try:
                    callback(event)
                except Exception as e:  # a widget bug must not corrupt the engine
                    self.errors.append(e)


class EventRecorder:
    """A subscriber that keeps every event (handy in notebooks and tests)."""

    def __init__(self, bus: EventBus, kinds=None):
        self.events: list[Event] = []
        self.unsubscribe = bus.subscribe(self.events.append, kinds)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

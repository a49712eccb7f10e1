"""Feedback a learner can act on: what was called, what was expected, what came back, and — when
the wrong answer matches a known mistake — which mistake.

For bytes the diff is a hex dump of the row holding the first wrong byte, with a caret under it
(the CodeCrafters style), and the name of the Kafka field that byte belongs to when a field map is
given. For numbers and other values: the input, the expected and the actual value.
"""

from __future__ import annotations

import reprlib
from typing import Any, Callable, Iterable, Sequence

Mistake = tuple[str, Any]          # (what the learner probably did, the value it would produce
                                   #  — or a predicate on the actual value)

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = 8
_repr.maxtuple = 8
_repr.maxdict = 6
_repr.maxlevel = 3


class Mismatch(AssertionError):
    """A test's verdict on a learner's answer; the message is the whole feedback."""


def short(value: Any) -> str:
    """A repr short enough for a one-line report (bytes longer than 24 are summarised)."""
    if isinstance(value, (bytes, bytearray)) and len(value) > 24:
        return f"<{len(value)} bytes: {bytes(value[:12]).hex(' ')} …>"
    return _repr.repr(value)


def call_repr(name: str, *args: Any, **kwargs: Any) -> str:
    parts = [short(a) for a in args] + [f"{k}={short(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _matches(mistake_value: Any, actual: Any) -> bool:
    if callable(mistake_value):
        try:
            return bool(mistake_value(actual))
        except Exception:
            return False
    try:
        return mistake_value == actual
    except Exception:
        return False


def diagnose(actual: Any, expected: Any, mistakes: Iterable[Mistake] = ()) -> list[str]:
    """The labels of the known mistakes that explain `actual` (and not `expected`): a mistake whose
    value *is* the answer first, then those whose predicate merely accepts it."""
    exact, accepted = [], []
    for label, value in mistakes:
        if not callable(value) and _matches(value, expected):
            continue   # a "mistake" that gives the right answer here says nothing
        if _matches(value, actual):
            (accepted if callable(value) else exact).append(label)
    return exact + accepted


def _hex(data: bytes) -> str:
    return " ".join(f"{b:02x}" for b in data)


def field_at(fields: Sequence[tuple[str, int, int]] | None, pos: int) -> str | None:
    if not fields:
        return None
    for name, start, size in fields:
        if start <= pos < start + size:
            return f"{name}, bytes {start}–{start + size - 1}" if size > 1 else f"{name}, byte {start}"
    return None


def hex_diff(expected: bytes, actual: bytes, fields: Sequence[tuple[str, int, int]] | None = None,
             width: int = 16) -> str:
    """The hex rows around the first differing byte, expected above actual, caret below."""
    expected, actual = bytes(expected), bytes(actual)
    first = next((i for i, (a, b) in enumerate(zip(expected, actual)) if a != b),
                 min(len(expected), len(actual)))
    lines = [f"expected {len(expected)} bytes, got {len(actual)} bytes"]
    if first == len(expected) == len(actual):
        return lines[0] + " (identical)"
    where = field_at(fields, first)
    if first >= len(actual):
        lines[0] += f"; yours ends at byte {first}, {len(expected) - first} byte(s) early"
    elif first >= len(expected):
        lines[0] += f"; yours has {len(actual) - first} extra byte(s) from byte {first}"
    else:
        lines[0] += f"; first difference at byte {first}"
    if where:
        lines[0] += f" ({where})"
    row = first - first % width
    rows = [row]
    if first % width >= width - 3 and row + width < max(len(expected), len(actual)):
        rows.append(row + width)       # the wrong bytes may run on into the next row
    for r in rows:
        e, a = expected[r:r + width], actual[r:r + width]
        lines.append(f"  {r:04x}  expected: {_hex(e)}")
        lines.append(f"        actual:   {_hex(a)}")
        if r <= first < r + width:
            lines.append(" " * (18 + (first - r) * 3) + "^^")
    return "\n".join(lines)


def _report(call: str, body: list[str], found: list[str], hint: str | None) -> str:
    lines = [call] + ["  " + b if not b.startswith("  ") else b for b in body]
    if found:                        # one diagnosis: the one that best explains the answer
        lines.append(f"  looks like: {found[0]}")
    if hint and not found:
        lines.append(f"  hint: {hint}")
    return "\n".join(lines)


def expect_bytes(actual: Any, expected: bytes, *, call: str, mistakes: Iterable[Mistake] = (),
                 fields: Sequence[tuple[str, int, int]] | None = None, hint: str | None = None) -> None:
    """Fail with a hex diff (caret under the first wrong byte) unless actual == expected."""
    if not isinstance(actual, (bytes, bytearray)):
        raise Mismatch(_report(call, [f"expected bytes, got {type(actual).__name__}: {short(actual)}"],
                               [], hint))
    if bytes(actual) == bytes(expected):
        return
    found = diagnose(bytes(actual), bytes(expected), mistakes)
    raise Mismatch(_report(call, hex_diff(expected, actual, fields).split("\n"), found, hint))


def expect_equal(actual: Any, expected: Any, *, call: str, mistakes: Iterable[Mistake] = (),
                 hint: str | None = None, inputs: dict[str, Any] | None = None,
                 normalize: Callable[[Any], Any] | None = None) -> None:
    """Fail with input / expected / actual unless actual == expected (after `normalize`)."""
    got = actual
    if normalize is not None:
        try:
            got = normalize(actual)
        except Exception:
            got = actual
    if _same(got, expected):
        return
    body = []
    for k, v in (inputs or {}).items():
        body.append(f"input {k}: {short(v)}")
    body.append(f"expected: {short(expected)}")
    body.append(f"actual:   {short(actual)}")
    found = diagnose(got, expected, mistakes)
    raise Mismatch(_report(call, body, found, hint))


def _same(a: Any, b: Any) -> bool:
    if isinstance(b, bool):   # a yes/no answer: True/False (or 1/0), never None
        return isinstance(a, int) and bool(a) == b
    try:
        return a == b
    except Exception:
        return False


def fail(call: str, *lines: str) -> None:
    raise Mismatch(_report(call, list(lines), [], None))

"""Plug a learner's functions into the live engine, so an exercise that passes runs real appends,
lookups, retention passes, cleanings and replication — and one that is wrong fails where you see it.

Everything here is a context manager that swaps an engine function for the learner's (and puts the
engine's back on exit, even after an error):

    with live.demo("your varints write a real log"), live.plug(ch01_varints(write_varint, ...)):
        log.append(...)

`demo()` prints ✔ lines as the demo goes and, if the engine fails with the learner's code, a ✘ line
with the error instead of a traceback: the notebook keeps running.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class Patch:
    target: Any        # a module or a class
    name: str
    value: Any


@contextlib.contextmanager
def plug(*patches: Patch | list[Patch]) -> Iterator[None]:
    """Apply patches (the engine uses the learner's functions) and undo them on exit."""
    flat: list[Patch] = []
    for p in patches:
        flat.extend(p if isinstance(p, list) else [p])
    saved = []
    try:
        for p in flat:
            saved.append((p.target, p.name, p.target.__dict__.get(p.name, _MISSING)))
            setattr(p.target, p.name, p.value)
        yield
    finally:
        for target, name, old in reversed(saved):
            if old is _MISSING:
                delattr(target, name)
            else:
                setattr(target, name, old)


_MISSING = object()


class DemoFailed(Exception):
    """Raised by `Demo.expect` when the engine, running the learner's code, does not do what it should."""


class Demo:
    def __init__(self, title: str):
        self.title = title
        self.ok = True

    def step(self, text: str) -> None:
        print(f"  ✔ {text}")

    def note(self, text: str) -> None:
        print(f"    {text}")

    def expect(self, condition: bool, text: str, why: str = "") -> None:
        """Print ✔ text, or stop the demo with ✘ text (and why)."""
        if condition:
            self.step(text)
        else:
            raise DemoFailed(f"{text}: NO" + (f" — {why}" if why else ""))


@contextlib.contextmanager
def demo(title: str) -> Iterator[Demo]:
    """A live demo: its failure is printed (✘ ...) instead of raised, so the notebook goes on."""
    d = Demo(title)
    print(f"▶ {title}")
    try:
        yield d
    except DemoFailed as e:
        d.ok = False
        print(f"  ✘ {e}")
        print("  the engine ran your code and it went wrong here: run check(...) for the details")
    except NotImplementedError as e:
        d.ok = False
        print(f"  ✘ not yet: your code raised NotImplementedError ({e}) — finish the task first")
    except Exception as e:
        d.ok = False
        tb = traceback.extract_tb(e.__traceback__)
        where = f" (in {tb[-1].name}, {tb[-1].filename.split('/')[-1]}:{tb[-1].lineno})" if tb else ""
        print(f"  ✘ the engine failed with your code: {type(e).__name__}: {e}{where}")
        print("  run check(...) above for the feedback on your functions")
    else:
        print("  done ✔")


@contextlib.contextmanager
def scratch(prefix: str = "kstore-demo-") -> Iterator[str]:
    """A temporary directory for a demo's partition directories, removed afterwards."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def hexdump(data: bytes, width: int = 16, limit: int = 256) -> str:
    lines = []
    for i in range(0, min(len(data), limit), width):
        chunk = data[i:i + width]
        lines.append(f"{i:04x}  {chunk.hex(' '):<{width * 3}} "
                     f"{''.join(chr(b) if 32 <= b < 127 else '.' for b in chunk)}")
    if len(data) > limit:
        lines.append(f"… ({len(data) - limit} more bytes)")
    return "\n".join(lines)


def func(f: Callable) -> Callable:
    """Identity; marks in notebooks that a learner's function is handed to the engine."""
    return f


# ------------------------------------------------------------------ chapter plugs
def record_encoding(write_varint: Callable, read_varint: Callable, write_varlong: Callable,
                    encode_record: Callable) -> list[Patch]:
    """Ch. 01: the engine encodes (and reads) records with the learner's varints and encoder."""
    from .. import records, varint
    return [Patch(varint, "write_varint", write_varint), Patch(varint, "read_varint", read_varint),
            Patch(varint, "write_varlong", write_varlong),
            Patch(records, "encode_record", encode_record)]

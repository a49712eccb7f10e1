"""The grading harness and the learner's process talk over one Unix socket, in frames of plain data.

A frame is a 4-byte big-endian length and a pickle whose reader accepts *no* classes at all: only
what pickle builds from its own opcodes (None, bool, int, float, complex, str, bytes, bytearray,
list, tuple, dict, set, frozenset). Everything else crosses as a *persistent id*, itself plain data,
that the reader checks and turns into something harmless:

* `("ref", n)` — an object the harness keeps (a segment view, a predicate, a record): the learner
  gets a `Proxy`; every attribute read or call on it is a request back to the harness;
* `("nt", name, fields, values)` — a named tuple, rebuilt as a named tuple of plain values;
* `("obj", type name, {public attributes})` — an object the learner made: the harness sees a
  read-only `LearnerObject` with those attributes (its own `__eq__`, not the learner's);
* `("int", n)`, `("str", s)`, ... — a subclass of a plain type, reduced to the plain type.

The harness never unpickles a class or calls a function the learner named, so whatever the learner
writes to the socket can only be a wrong answer, never code run by the grader. Frames are capped at
`MAX_FRAME` bytes.
"""

from __future__ import annotations

import collections
import io
import pickle
import socket
import struct
from typing import Any, Callable

MAX_FRAME = 64 * 1024 * 1024
PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray)
CONTAINERS = (list, tuple, dict, set, frozenset)
_REDUCED = {int: "int", float: "float", str: "str", bytes: "bytes"}


class WireError(Exception):
    """A frame that is too big, cut short or not plain data."""


class Closed(WireError):
    """The other end closed the socket (the process died)."""


class LearnerObject:
    """An object the learner's code returned, as the harness sees it: its public attributes, read
    only; equal only to another LearnerObject with the same type name and attributes."""

    __slots__ = ("_kind", "_attrs")

    def __init__(self, kind: str, attrs: dict[str, Any]):
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_attrs", attrs)

    def __getattr__(self, name: str) -> Any:
        try:
            return object.__getattribute__(self, "_attrs")[name]
        except KeyError:
            raise AttributeError(f"{self._kind} object has no attribute {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("read-only")

    def __eq__(self, other: Any) -> bool:
        return type(other) is LearnerObject and other._kind == self._kind and other._attrs == self._attrs

    __hash__ = None

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in list(self._attrs.items())[:8])
        return f"{self._kind}({inner})"


_NT_CACHE: dict[tuple, type] = {}


def _namedtuple(name: str, fields: tuple) -> type:
    key = (name, fields)
    if key not in _NT_CACHE:
        _NT_CACHE[key] = collections.namedtuple(name, fields)
    return _NT_CACHE[key]


def _plain_name(x: Any) -> bool:
    return isinstance(x, str) and x.isidentifier() and not x.startswith("_")


class Encoder(pickle.Pickler):
    """Pickles plain data; `other(obj)` gives the persistent id of anything else."""

    def __init__(self, file, other: Callable[[Any], tuple]):
        super().__init__(file, protocol=5)
        self._other = other

    def persistent_id(self, obj: Any):
        t = type(obj)
        if t in PLAIN or t in CONTAINERS:
            return None
        if isinstance(obj, tuple) and hasattr(t, "_fields"):
            fields = tuple(f for f in t._fields if isinstance(f, str))
            return ("nt", t.__name__, fields, tuple.__getitem__(obj, slice(None)))
        for base, tag in _REDUCED.items():
            if isinstance(obj, base):
                return (tag, base(obj) if base is not str else str.__str__(obj))
        return self._other(obj)


class Decoder(pickle.Unpickler):
    """Unpickles plain data only; `resolve(pid)` turns a checked persistent id into a value."""

    def __init__(self, file, resolve: Callable[[tuple], Any]):
        super().__init__(file)
        self._resolve = resolve

    def find_class(self, module: str, name: str):
        raise WireError(f"not plain data: the frame names {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid or not isinstance(pid[0], str):
            raise WireError("malformed reference in a frame")
        tag = pid[0]
        if tag in ("int", "float", "str", "bytes") and len(pid) == 2:
            value = pid[1]
            want = {"int": int, "float": float, "str": str, "bytes": bytes}[tag]
            if type(value) is not want:
                raise WireError("malformed value in a frame")
            return value
        if tag == "nt" and len(pid) == 4:
            _, name, fields, values = pid
            if not (_plain_name(name) and type(fields) is tuple and all(_plain_name(f) for f in fields)
                    and type(values) is tuple and len(values) == len(fields) and len(set(fields)) == len(fields)):
                raise WireError("malformed named tuple in a frame")
            return _namedtuple(name, fields)(*values)
        return self._resolve(pid)


def dumps(value: Any, other: Callable[[Any], tuple]) -> bytes:
    buf = io.BytesIO()
    Encoder(buf, other).dump(value)
    return buf.getvalue()


def loads(data: bytes, resolve: Callable[[tuple], Any]) -> Any:
    try:
        return Decoder(io.BytesIO(data), resolve).load()
    except WireError:
        raise
    except RecursionError:
        raise WireError("a frame nested too deeply") from None
    except Exception as e:           # truncated or garbled pickle
        raise WireError(f"a garbled frame ({type(e).__name__})") from None


def send_frame(sock: socket.socket, data: bytes) -> None:
    if len(data) > MAX_FRAME:
        raise WireError(f"a message of {len(data):,} bytes (the limit is {MAX_FRAME:,})")
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise Closed("the other process closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> bytes:
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    if n > MAX_FRAME:
        raise WireError(f"a message of {n:,} bytes (the limit is {MAX_FRAME:,})")
    return _recv_exact(sock, n)

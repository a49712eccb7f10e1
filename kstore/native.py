"""Which record codec runs: the native one (kstore/_codec.c) or the pure-Python reference.

kstore/records.py is the codec the course teaches; `kstore._codec` does the same per-record work
in C and is built by `pip install` when a C compiler is present (setup.py; optional). Set
`KSTORE_PURE_PYTHON=1` to run the pure-Python code even when the extension is built, e.g. to
compare the two, as chapter 01 does.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Iterator


def _load():
    if os.environ.get("KSTORE_PURE_PYTHON", "").strip() not in ("", "0"):
        return None, "pure Python (KSTORE_PURE_PYTHON is set)"
    try:
        from . import _codec
    except ImportError:
        return None, ("pure Python (the native codec is not built: reinstall with a C compiler, "
                      "e.g. `pip install -e .`)")
    return _codec, "native (kstore/_codec.c)"


class NativeCodecMissing(RuntimeWarning):
    """The native codec is not built: kstore runs the pure-Python one (same results, slower)."""


codec, description = _load()
"""`codec`: the extension module, or None when the pure-Python reference runs."""
if codec is None and "not built" in description:
    # pip hides the build's own notice, so the one notice a user sees is this one, once.
    warnings.warn(f"kstore: {description}", NativeCodecMissing, stacklevel=2)


@contextlib.contextmanager
def pure_python() -> Iterator[None]:
    """Run the pure-Python reference inside the block even where the native codec is built: the
    course and the benchmarks measure the same work both ways in one process."""
    global codec
    saved, codec = codec, None
    try:
        yield
    finally:
        codec = saved

"""A reused Spark Python worker leaves the objects of its imports out of every garbage collection.

PySpark's daemon forks the Python workers and, when `spark.python.worker.reuse` is on (Spark's
default), runs a full `gc.collect()` in a worker after every task it finishes (pyspark/daemon.py),
and every Python step of a job ends that way: planning a write, each task, the commit. A full
collection walks every object the collector tracks, and a worker that has imported kstore's
source or sink holds 60,000-90,000 of them (numpy, pyarrow, pyspark, kstore: the modules' functions,
classes, dicts), none of which ever becomes garbage. In the benchmark's workers each such
collection took 27-40 ms of CPU (on 2 busy cores), and a 1M-row write through `kstore serve` ran
about four of them (two tasks, the planning, the commit).

`freeze_imported_objects()` moves the objects alive now to the collector's permanent generation
(`gc.freeze()`, the collector's own tool for long-lived objects; CPython skips that generation in
every later collection). It first collects once, so no cyclic garbage is frozen with them, and it
does that again only when modules were imported since (the first task of a sink imports its
network client): a few times in a worker's life. Objects still die when their reference count
drops to zero; only a cycle among frozen objects would outlive its last use. The frozen objects are
the modules' own, alive until the worker exits, and the few a task holds when it freezes (its
writer or reader): a bounded leftover, since freezing happens a few times per worker.

With it, the Python workers' CPU for that write went from 0.33-0.42 s to 0.24-0.29 s, and the
write's best time from 0.60-0.63 s to 0.54-0.57 s (two Spark sessions each, alternated, best of
6 writes per session); a collection now walks only what the worker made since it last froze.

It does nothing outside a reused Spark worker (the environment has no `SPARK_REUSE_WORKER`, as in a
notebook's kernel or a Spark driver) or with `KSTORE_FREEZE_GC=0`.
"""

from __future__ import annotations

import gc
import os
import sys

_modules_when_frozen = 0


def freeze_imported_objects() -> bool:
    """In a reused Spark Python worker: collect, then freeze every object alive, when modules were
    imported since the last time. True when this process freezes (see the module doc)."""
    global _modules_when_frozen
    if not os.environ.get("SPARK_REUSE_WORKER") or os.environ.get("KSTORE_FREEZE_GC") == "0":
        return False
    if len(sys.modules) != _modules_when_frozen:
        gc.collect()
        gc.freeze()
        _modules_when_frozen = len(sys.modules)
    return True

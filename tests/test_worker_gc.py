"""kstore.spark.worker_gc: a reused Spark Python worker freezes the objects of its imports, so the
full gc.collect() PySpark's daemon runs after every task does not walk them again.

Each case runs in a fresh Python process: a freeze is process-wide and cannot be undone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent("""
    import gc, json, sys
    collections = []
    gc.callbacks.append(lambda phase, info: phase == "stop" and collections.append(info["generation"]))
    import kstore.spark.sink                       # pyarrow, numpy, pyspark, kstore
    from kstore.spark.worker_gc import freeze_imported_objects
    out = {"frozen_at_import": gc.get_freeze_count(), "tracked": len(gc.get_objects())}
    del collections[:]
    out["first"] = freeze_imported_objects()
    out["collections_first"] = list(collections)
    out["frozen"] = gc.get_freeze_count()
    del collections[:]
    freeze_imported_objects()                      # nothing imported since: no collection
    out["collections_again"] = list(collections)
    import kstore.remote_broker, kstore.transaction_manager   # what a sink task imports later
    freeze_imported_objects()
    out["collections_after_import"] = list(collections)
    out["frozen_after_import"] = gc.get_freeze_count()
    print(json.dumps(out))
""")


def probe(**env) -> dict:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("SPARK_REUSE_WORKER", "KSTORE_FREEZE_GC")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**environment, **env},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_reused_worker_freezes_what_it_imported_once_then_only_new_modules():
    out = probe(SPARK_REUSE_WORKER="1")
    # importing the sink in a reused worker froze its objects already (the module's last line)
    assert out["frozen_at_import"] > 30_000, out
    assert out["tracked"] < out["frozen_at_import"], out
    assert out["first"] is True and out["collections_first"] == [], out
    assert out["collections_again"] == [], out
    # new modules: one full collection (no cyclic garbage frozen; the imports' own young
    # collections come before it), then everything alive is frozen
    assert out["collections_after_import"][-1] == 2, out
    assert out["collections_after_import"].count(2) == 1, out
    assert out["frozen_after_import"] > out["frozen"], out


def test_outside_a_reused_worker_or_turned_off_nothing_is_frozen():
    for env in ({}, {"SPARK_REUSE_WORKER": "1", "KSTORE_FREEZE_GC": "0"}):
        out = probe(**env)
        assert out["first"] is False and out["frozen_at_import"] == 0 and out["frozen"] == 0, (env, out)
        assert out["collections_first"] == out["collections_again"] == [], (env, out)

"""Every course notebook runs top to bottom on a fresh kernel (nbclient), and leaves nothing behind.
Each notebook's run time is printed in the test output.

The same run checks that every view a chapter displays is bound to its moment: when the cell that
displayed a view finishes, a probe (a `post_run_cell` hook put in the kernel before the chapter's
first cell) renders that view's picture from the engine as it is then and notes the engine's event
sequence number; after the last cell — the state a learner sees after Run All — the picture each
view shows must still be that one, and its timeline's bound frame must carry that number.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MARK = "KSTORE-VIEW-MOMENTS:"

# Runs before the chapter's first cell. Its hook is registered before any view's own one, so it
# sees the engine exactly as the cell left it, before the view takes its bound frame.
PROBE = """
from IPython import get_ipython as _ks_ip
from kstore.events import last_seq as _ks_last_seq
from kstore.widgets._base import displayed_views as _ks_displayed
_ks_moments = {}
def _ks_probe(result):
    for view in _ks_displayed():
        if id(view) not in _ks_moments and view.timeline is not None:
            _ks_moments[id(view)] = (view, result.execution_count, _ks_last_seq(), view.frame_values())
_ks_ip().events.register("post_run_cell", _ks_probe)
"""

# Runs after the chapter's last cell: compares what each view shows now with its moment.
REPORT = f"""
import json as _ks_json
_ks_ip().events.unregister("post_run_cell", _ks_probe)
_ks_rows = []
for _v, _cell, _seq, _values in _ks_moments.values():
    _shown = {{name: getattr(_v, name).value for name in _v.frame_parts}}
    _st = _v.timeline.status()
    _ks_rows.append({{"view": type(_v).__name__, "cell": _cell, "seq_at_cell_end": _seq,
                      "bound_seq": _st["bound_seq"], "frames": _st["frames"],
                      "shows_its_moment": _shown == {{name: _values[name] for name in _v.frame_parts}},
                      "moment_is_bound_frame": _v.timeline.frames[_st["bound"]].values == _values
                      if _st["bound"] is not None else False}})
print({MARK!r} + _ks_json.dumps(_ks_rows))
"""


# Long cells show a progress bar (tqdm-like, ipywidgets): text each finished bar must show. A wait
# of unknown length (a `kstore` subprocess, Spark's start) has a `working` bar that shows itself
# after half a second; hidden or not, it is in the saved widget state with its final label.
# (bench/notebook_cells.py times every cell and lists the slow ones with or without a bar.)
PROGRESS_BARS = {
    "00-welcome.ipynb": ["kstore dump-log · done in"],
    "02-sparse-index.ipynb": ["2,000 batches + 2,000 lookups per interval: 5/5 intervals"],
    "04-finding-a-message.ipynb": ["grow the log, time 1,000 lookups at each size: 6/6 log sizes"],
    "08-partitions-and-offsets.ipynb": ["kstore consumer-groups · done in", "kstore dump-log · done in"],
    "09-replication-hw.ipynb": ["kstore dump-log · done in"],
    "10-leader-epochs.ipynb": ["kstore dump-log · done in"],
    "11-zero-copy.ipynb": ["128 MiB into one segment: 132/132 batches", "both ways, 3 runs each: 6/6"],
    "12-real-clients.ipynb": ["starting kstore serve on port", "kstore topics · done in",
                              "kstore consumer-groups · done in", "kstore dump-log · done in"],
    "13-spark-pipeline.ipynb": ["starting Spark (a JVM, then a SparkContext", "Spark: "],
}


# The blogs' worked examples, reproduced live: text the executed chapter must print (the engine
# computes these numbers when the cell runs; tests/test_blog_boxes.py checks the prose names them).
LIVE_NUMBERS = {
    "04-finding-a-message.ipynb": [
        "['00000000000000000000.log', '00000000000000000010.log', '00000000000000000020.log']",
        "lookup(15) = (14, 340)",                                       # seed 001: entry 14 at 340
        "00000000000000170410.log relative entries: [[2, 238], [4, 476]",   # seed 000: [4, 476]
    ],
    "10-leader-epochs.ipynb": ["0\n3\n0 50\n1 89\n2 100\n"],          # seed 003's checkpoint
}


# Chapters whose numbers a learner would rather see as a picture: how many plots (PNG outputs)
# the executed chapter must show at least (13: rows and rows/s per micro-batch, both runs).
PLOTS = {"13-spark-pipeline.ipynb": 2}


def printed(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []) if o.get("output_type") == "stream")


def finished_bars(nb) -> list[str]:
    """The label of every progress bar that finished, from the widget state nbclient saved."""
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    return [m["state"]["value"] for m in state.get("state", {}).values()
            if m.get("model_name") == "HTMLModel" and "ks-progress-text" in m["state"].get("value", "")
            and "done in" in m["state"]["value"]]


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no course notebook"


def view_moments(nb) -> list[dict]:
    """The probe's report, from the last (injected) cell's output."""
    text = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
    line = next(line for line in text.splitlines() if line.startswith(MARK))
    return json.loads(line[len(MARK):])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        f"{path.name} is committed with outputs"
    assert "widgets" not in nb.metadata, \
        f"{path.name} is committed with saved widget state (pictures of some old run)"
    nb.cells.insert(0, nbformat.v4.new_code_cell(PROBE))
    nb.cells.append(nbformat.v4.new_code_cell(REPORT))
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    start = time.perf_counter()
    # As under JupyterLab, the kernel forwards whatever reaches its descriptors 1 and 2 (a JVM's
    # or a subprocess's output) into the cell; ipykernel turns that off when it sees pytest's
    # variable, so the kernel is started without it.
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    client.execute(env=env)
    elapsed = time.perf_counter() - start
    sys.__stderr__.write(f"\n[notebook] {path.name}: {elapsed:.1f} s\n")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    # clean output: nothing on stderr (warnings, a JVM's or a subprocess's chatter) in any cell
    stderr = [(i, o.get("text", "")[:200]) for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    assert not stderr, f"{path.name} writes to stderr (cell, text): {stderr}"
    # The run time is recorded above, not asserted: timing belongs in bench/, not in tests.

    for text in LIVE_NUMBERS.get(path.name, []):
        assert text in printed(nb), f"{path.name} no longer prints the worked example {text!r}"

    pngs = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for o in c.get("outputs", []))
    assert pngs >= PLOTS.get(path.name, 0), f"{path.name} shows {pngs} plot(s)"

    bars = finished_bars(nb)
    for text in PROGRESS_BARS.get(path.name, []):
        assert any(text in bar for bar in bars), f"no finished progress bar showing {text!r}: {bars}"

    # every displayed view still shows the engine's state as of the end of its own cell
    moments = view_moments(nb)
    wrong = [m for m in moments if not (m["shows_its_moment"] and m["moment_is_bound_frame"]
                                        and m["bound_seq"] == m["seq_at_cell_end"])]
    assert not wrong, f"views not showing their cell's moment after Run All: {wrong}"
    if "from kstore.widgets import" in "".join(c.source for c in nb.cells[1:-1]) and \
            path.name[:2] not in ("14",) and "glossary" not in path.name:
        assert moments, f"{path.name} displays views, but the probe saw none"

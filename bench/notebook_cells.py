"""How long each chapter cell runs, and whether the slow ones show progress.

    .venv/bin/python bench/notebook_cells.py                 # every chapter
    .venv/bin/python bench/notebook_cells.py 08 12 13        # some chapters
    .venv/bin/python bench/notebook_cells.py --over 1.5      # another threshold (default 2 s)

Executes each chapter on a fresh kernel (nbclient, as tests/test_notebooks.py does), reads every
cell's run time from the timing nbclient records in the cell's metadata, and lists the cells that
took longer than the threshold with whether the cell displayed a progress bar (an ipywidgets bar
of kstore.widgets.progress, recognised by its `kstore-progress` class in the saved widget state).
A learner waiting more than about two seconds should see something move. Writes
bench/results/notebook_cells.json. A benchmark, not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

import common  # noqa: F401  (puts the repository on sys.path)
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "notebook_cells.json"


def seconds_of(cell) -> float | None:
    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (start and end):
        return None
    parse = lambda s: datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))   # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def progress_models(nb) -> set[str]:
    """Ids of the widget models that are kstore progress bars (their HBox has the class)."""
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    return {mid for mid, m in state.get("state", {}).items()
            if "kstore-progress" in m.get("state", {}).get("_dom_classes", [])}


def shows_progress(cell, bars: set[str]) -> bool:
    for out in cell.get("outputs", []):
        view = out.get("data", {}).get("application/vnd.jupyter.widget-view+json")
        if view and view.get("model_id") in bars:
            return True
    return False


def stderr_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stderr")


def time_chapter(path: Path, over: float) -> dict:
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as tmp:
        NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=True,
                       resources={"metadata": {"path": tmp}}).execute()
    bars = progress_models(nb)
    cells, total = [], 0.0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        s = seconds_of(cell) or 0.0
        total += s
        cells.append({"cell": i, "seconds": round(s, 2), "first_line": cell.source.splitlines()[0]
                      if cell.source else "", "progress_bar": shows_progress(cell, bars),
                      "stderr": stderr_of(cell)[:300]})
    slow = [c for c in cells if c["seconds"] > over]
    return {"notebook": path.name, "seconds": round(total, 1), "cells": cells, "slow": slow}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("chapters", nargs="*", help="chapter numbers (default: all)")
    p.add_argument("--over", type=float, default=2.0, help="seconds that count as slow")
    args = p.parse_args(argv)
    paths = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))
    if args.chapters:
        paths = [q for q in paths if q.name[:2] in {c.zfill(2) for c in args.chapters}]
    results = []
    for path in paths:
        r = time_chapter(path, args.over)
        results.append(r)
        print(f"{r['notebook']}: {r['seconds']:.1f} s in cells", flush=True)
        for c in r["slow"]:
            mark = "bar" if c["progress_bar"] else "NO BAR"
            print(f"  cell {c['cell']:3d}  {c['seconds']:6.1f} s  {mark:6s}  {c['first_line'][:70]}")
        for c in r["cells"]:
            if c["stderr"]:
                print(f"  cell {c['cell']:3d}  stderr: {c['stderr'][:120]!r}")
    report = {"machine": common.machine_info(), "over_seconds": args.over, "notebooks": results}
    OUT.write_text(json.dumps(report, indent=1))
    print(f"wrote {OUT.relative_to(ROOT)}")
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)

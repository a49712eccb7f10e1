"""Grading a class: 20 submissions of exercise 09 (solutions, the exercise as shipped, wrong ones)
graded by `kstore grade` with 2 jobs, each in its harness + confined learner process. Reports the
wall time (the course's target: under 2 minutes on a 2-core machine), seconds per submission, and
the same 20 with namespaces switched off (`no_confine`), so the cost of confinement is a ratio from
the same run.
"""

from __future__ import annotations

import copy
import json
import os

import common

from kstore.grading import notebooks
from kstore.grading.exercises import EXERCISES
from kstore.grading.grade import Grader, Settings
from kstore.grading.remote import can_confine

TARGET_SECONDS = 120
N = 20


def make_class(folder) -> list:
    ex = EXERCISES["ex09"]
    sol = notebooks.load(ex.solution_path)
    wrong = copy.deepcopy(sol)
    cell = next(c for c in wrong["cells"] if "ex09.3" in c.get("metadata", {}).get("tags", []))
    cell["source"] = "def is_caught_up(*a):\n    return True\n"
    paths = []
    for i in range(N):
        path = folder / f"student-{i:02d}" / "09-replication-hw.ipynb"
        path.parent.mkdir(parents=True)
        kind = i % 3
        if kind == 1:
            path.write_bytes(ex.exercise_path.read_bytes())
        else:
            path.write_text(json.dumps(sol if kind == 0 else wrong))
        paths.append(path)
    return paths


def grade(paths, no_confine: bool) -> dict:
    with common.Timer() as t:
        grader = Grader(Settings(jobs=2, no_confine=no_confine))
        try:
            subs = grader.grade(paths)
        finally:
            grader.close()
    return {"confined": can_confine() and not no_confine, "seconds": t.seconds,
            "per_submission": [s.seconds for s in subs], "statuses": sorted({s.status for s in subs}),
            "scores": [s.score for s in subs]}


def main() -> dict:
    print(f"== grading benchmark: {N} submissions of ex09, 2 jobs, {os.cpu_count()} CPUs ==")
    with common.scratch_dir("grading") as tmp:
        paths = make_class(tmp)
        runs = [grade(paths, no_confine=False)]
        if can_confine():
            runs.append(grade(paths, no_confine=True))
    for r in runs:
        print(f"    confined={r['confined']!s:5}  {r['seconds']:6.1f} s  "
              f"({r['seconds'] / N:.2f} s per submission; median row {common.percentile(r['per_submission'], 50):.1f} s)"
              f"  statuses {r['statuses']}")
    ratio = runs[0]["seconds"] / runs[-1]["seconds"]
    print(f"    target: {TARGET_SECONDS} s for {N} -> {runs[0]['seconds'] / TARGET_SECONDS:.2f} of it; "
          f"confined / unconfined = {ratio:.2f}")
    data = {"description": f"kstore grade on {N} ex09 submissions, 2 jobs", "target_seconds": TARGET_SECONDS,
            "runs": runs, "confined_over_unconfined": ratio,
            "load_average_after": os.getloadavg()}   # the machine may be shared: read the times with it
    path = common.write_json("grading", data)

    def draw(ax):
        labels = ["confined" if r["confined"] else "no namespaces" for r in runs]
        ax.bar(labels, [r["seconds"] for r in runs], color=["tab:blue", "tab:gray"][:len(runs)])
        ax.axhline(TARGET_SECONDS, color="tab:red", ls="--", label=f"target {TARGET_SECONDS} s")
        ax.set_ylabel(f"seconds for {N} submissions")
        ax.set_title("kstore grade, 2 jobs")
        ax.legend(fontsize=8)
    png = common.plot("grading", draw)
    print(f"-> {path.relative_to(common.ROOT)}, {png.relative_to(common.ROOT)}")
    return data


if __name__ == "__main__":
    main()

"""Shared helpers for the kstore benchmarks (not tests: they write JSON + PNG and print ratios).

    RESULTS   bench/results/            JSON and PNG outputs
    TMP       bench/results/tmp/        scratch logs; removed by `scratch_dir()` after each run
    SCALE     env KSTORE_BENCH_SCALE    multiplies data volumes (default 1.0)
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
TMP = RESULTS / "tmp"
RESULTS.mkdir(parents=True, exist_ok=True)

if str(ROOT) not in sys.path:  # so `python bench/x.py` finds kstore without an install
    sys.path.insert(0, str(ROOT))

SCALE = float(os.environ.get("KSTORE_BENCH_SCALE", "1"))
MB = 1_000_000  # throughput is reported in decimal MB/s, as Kafka's published figures are

now = time.perf_counter  # the one clock every benchmark uses


class Timer:
    """`with Timer() as t: ...` then `t.seconds`."""

    def __enter__(self) -> "Timer":
        self.start = now()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = now() - self.start


def percentile(values, p: float) -> float:
    """Linear-interpolated percentile (p in 0..100) of a non-empty sequence."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of an empty sequence")
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def filesystem_of(path) -> dict:
    """Mount point, device and type of the filesystem holding `path` (from /proc/mounts)."""
    path = os.path.realpath(path)
    best, best_len = {"mount_point": "?", "device": "?", "type": "?"}, -1
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= best_len:  # the last, longest match wins
                    best, best_len = {"mount_point": mnt, "device": dev, "type": fstype}, len(mnt)
    except OSError:
        pass
    return best


@contextlib.contextmanager
def scratch_dir(prefix: str):
    """A fresh directory under bench/results/tmp/, always removed afterwards (large files)."""
    TMP.mkdir(parents=True, exist_ok=True)
    path = TMP / f"{prefix}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):
            TMP.rmdir()  # only succeeds when empty: never removes someone else's run


def clean_tmp() -> None:
    """Remove leftovers of an interrupted run (everything under bench/results/tmp/)."""
    shutil.rmtree(TMP, ignore_errors=True)


def machine_info() -> dict:
    try:
        import kstore
        version = kstore.__version__
    except Exception:  # pragma: no cover - the benchmarks need kstore anyway
        version = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "kstore"], cwd=ROOT,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "kstore_version": version,
        "git_commit": commit,
        "kstore_dir_dirty": dirty,
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "scale": SCALE,
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],  # >0 = other work competed
    }


def write_json(name: str, data: dict) -> Path:
    """Write bench/results/<name>.json with a `machine` section added."""
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "machine": machine_info(), **data}
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def plot(name: str, draw, ncols: int = 1, width: float = 6.0, height: float = 4.0) -> Path:
    """Call `draw(axes)` on a 1×ncols figure and save bench/results/<name>.png (Agg, small)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    draw(list(axes[0]) if ncols > 1 else axes[0][0])
    fig.tight_layout()
    path = RESULTS / f"{name}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def fmt_rate(x: float) -> str:
    """1234567 → '1.23M', 12345 → '12.3k'."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"

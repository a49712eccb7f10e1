"""Read path: how long it takes to find the batch holding a random offset, as the log grows.

A log of 100-byte records in batches of 10 (one prebuilt batch template, appended again and again
with `append_as_leader`; the log assigns the offsets) is grown to 10^4, 10^5 and 10^6 records
(10^7 with KSTORE_BENCH_BIG=1), under two configs: default segment.bytes (1 GiB, so one segment)
and segment.bytes = 16 MiB (many segments); index.interval.bytes is the default 4096 in both.

At each size:
* indexed — `log.read(offset, 1)`: bisect to the segment, binary-search its sparse offset index,
  scan forward at most ~4 KB of batch headers. Returns a FileSlice starting at the batch holding
  the offset (checked on a sample, untimed).
* scan    — the baseline without an index: pick the segment the same way, then walk batch headers
  from position 0 with `FileRecords.batch_locations()` until one ends at or past the offset.
  Slow on big segments, so only a handful of scans are timed there.

The page cache is warm (the log was just written): these are CPU + syscall costs, not disk seeks.

Run:  .venv/bin/python bench/bench_lookup.py   (KSTORE_BENCH_BIG=1 adds 10^7 records, ~1.2 GB and
      a few minutes per config; KSTORE_BENCH_SCALE multiplies the number of timed lookups)
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import SCALE, Timer, now, percentile  # noqa: E402

from kstore import Log, LogConfig  # noqa: E402
from kstore.records import Record, build_batch  # noqa: E402

BIG = os.environ.get("KSTORE_BENCH_BIG", "") not in ("", "0")
SIZES = (10**4, 10**5, 10**6) + ((10**7,) if BIG else ())
RECORDS_PER_BATCH = 10
VALUE_SIZE = 100
TIMESTAMP = 1_700_000_000_000
CONFIGS = (
    ("segment.bytes=1GiB (default)", {}),
    ("segment.bytes=16MiB", {"segment.bytes": 16 * 1024 * 1024}),
)
N_LOOKUPS = max(200, int(5000 * SCALE))
N_CHECK = 200                                           # untimed correctness sample
SCAN_MAX = {10**4: 300, 10**5: 60, 10**6: 30, 10**7: 5}  # scans per size, at most...
SCAN_BUDGET_S = 3.0 * max(SCALE, 0.2)                   # ...and stop after this long (min 5)
SEED = 20240501


def scan_lookup(log: Log, offset: int):
    """Baseline: the batch holding `offset`, found by walking headers from the segment's start."""
    segment = log.floor_segment(offset)
    for loc in segment.log.batch_locations(0):
        if loc.last_offset >= offset:
            return segment, loc
    return segment, None


def grow(log: Log, template: bytes, target: int) -> float:
    """Append the template batch until the log holds `target` records; return seconds."""
    append = log.append_as_leader
    with Timer() as t:
        while log.log_end_offset < target:
            append(template)
    return t.seconds


def measure(log: Log, size: int, rng: random.Random) -> dict:
    offsets = [rng.randrange(size) for _ in range(N_LOOKUPS)]
    read = log.read
    for o in offsets[:200]:            # warm-up (imports, caches, branch predictors)
        read(o, 1)
    lat = []
    for o in offsets:
        t0 = now()
        read(o, 1)
        lat.append(now() - t0)

    for o in rng.sample(offsets, min(N_CHECK, len(offsets))):   # correctness, untimed
        batch = read(o, 1).records.batches()[0]
        assert batch.base_offset <= o <= batch.last_offset, (o, batch)

    scan_lat, deadline = [], now() + SCAN_BUDGET_S
    for o in offsets[:SCAN_MAX.get(size, 5)]:
        t0 = now()
        segment, loc = scan_lookup(log, o)
        scan_lat.append(now() - t0)
        fetch = read(o, 1)             # both must find the same batch (untimed)
        assert loc is not None and loc.base_offset <= o <= loc.last_offset, (o, loc)
        assert (fetch.fetch_offset_metadata.segment_base_offset, fetch.records.position) == \
            (segment.base_offset, loc.position), (o, fetch, loc)
        if len(scan_lat) >= 5 and now() > deadline:
            break

    us = 1e6
    segments = log.segments
    return {
        "records": size,
        "log_bytes": log.size_in_bytes(),
        "segments": len(segments),
        "offset_index_entries": sum(s.offset_index.entries for s in segments),
        "indexed": {"n": len(lat), "p50_us": percentile(lat, 50) * us,
                    "p99_us": percentile(lat, 99) * us, "mean_us": sum(lat) / len(lat) * us},
        "scan": {"n": len(scan_lat), "p50_us": percentile(scan_lat, 50) * us,
                 "p99_us": percentile(scan_lat, 99) * us,
                 "mean_us": sum(scan_lat) / len(scan_lat) * us},
    }


def main() -> dict:
    value = random.Random(SEED).randbytes(VALUE_SIZE)
    template = build_batch([Record(None, value, TIMESTAMP) for _ in range(RECORDS_PER_BATCH)])
    fs = common.filesystem_of(common.RESULTS)
    print(f"== lookup benchmark: sizes {', '.join(f'{s:.0e}' for s in SIZES)} records, "
          f"{RECORDS_PER_BATCH} records/batch ({len(template)} B), {N_LOOKUPS} random lookups per "
          f"size; scratch {common.TMP} ({fs['type']} on {fs['device']}) ==")
    runs = []
    for label, overrides in CONFIGS:
        config = LogConfig(overrides)
        print(f"-- {label}, index.interval.bytes={config.index_interval_bytes}")
        print(f"    {'records':>9} {'segs':>5} {'idx p50':>9} {'idx p99':>9} {'scan p50':>10} "
              f"{'scan p99':>10} {'n scan':>6} {'scan/idx p50':>12} {'build s':>8}")
        rows = []
        rng = random.Random(SEED)
        with common.scratch_dir("lookup") as tmp:
            log = Log.open(str(tmp / "lookup-0"), config)
            try:
                for size in SIZES:
                    build_s = grow(log, template, size)
                    row = measure(log, size, rng)
                    row["build_seconds_increment"] = build_s
                    row["ratio_scan_over_indexed_p50"] = row["scan"]["p50_us"] / row["indexed"]["p50_us"]
                    rows.append(row)
                    i, s = row["indexed"], row["scan"]
                    print(f"    {size:>9.0e} {row['segments']:>5} {i['p50_us']:>7.1f}us "
                          f"{i['p99_us']:>7.1f}us {s['p50_us']:>8.0f}us {s['p99_us']:>8.0f}us "
                          f"{s['n']:>6} {row['ratio_scan_over_indexed_p50']:>12.1f} "
                          f"{build_s:>8.1f}", flush=True)
            finally:
                log.close(flush=False)
        flat = rows[-1]["indexed"]["p50_us"] / rows[0]["indexed"]["p50_us"]
        scan_growth = rows[-1]["scan"]["p50_us"] / rows[0]["scan"]["p50_us"]
        print(f"    indexed p50({rows[-1]['records']:.0e}) / p50({rows[0]['records']:.0e}) = "
              f"{flat:.2f}  (flat ~ 1; the scan grew x{scan_growth:.0f} over the same range)")
        runs.append({"config": label, "overrides": overrides,
                     "index_interval_bytes": config.index_interval_bytes,
                     "segment_bytes": config.segment_bytes, "sizes": rows,
                     "ratio_indexed_p50_largest_over_smallest": flat,
                     "ratio_scan_p50_largest_over_smallest": scan_growth})

    data = {
        "description": "random-offset lookup latency: Log.read(offset, 1) vs scanning batch headers",
        "units": {"latency": "microseconds"},
        "filesystem": fs, "scratch_dir": str(common.TMP), "page_cache": "warm",
        "records_per_batch": RECORDS_PER_BATCH, "value_bytes": VALUE_SIZE,
        "batch_bytes": len(template), "lookups_per_size": N_LOOKUPS, "big": BIG,
        "runs": runs,
    }
    path = common.write_json("lookup", data)
    png = common.plot("lookup", lambda axes: _draw(axes, runs), ncols=len(runs), width=5.0)
    print(f"-> {path.relative_to(common.ROOT)}, {png.relative_to(common.ROOT)}")
    return data


def _draw(axes, runs) -> None:
    ymin = min(r["indexed"]["p50_us"] for run in runs for r in run["sizes"]) / 2
    ymax = max(r["scan"]["p99_us"] for run in runs for r in run["sizes"]) * 2
    for ax, run in zip(axes, runs):
        xs = [r["records"] for r in run["sizes"]]
        ax.plot(xs, [r["indexed"]["p50_us"] for r in run["sizes"]], "o-", color="tab:blue",
                label="indexed p50")
        ax.plot(xs, [r["indexed"]["p99_us"] for r in run["sizes"]], "o:", color="tab:blue",
                label="indexed p99")
        ax.plot(xs, [r["scan"]["p50_us"] for r in run["sizes"]], "s-", color="tab:red",
                label="header scan p50")
        ax.plot(xs, [r["scan"]["p99_us"] for r in run["sizes"]], "s:", color="tab:red",
                label="header scan p99 (few samples)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(ymin, ymax)
        ax.set_xlabel("records in the log")
        ax.set_ylabel("latency per lookup (µs)")
        ax.set_title(f"{run['config']}\n{run['sizes'][-1]['segments']} segment(s) at the largest size",
                     fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")


if __name__ == "__main__":
    main()

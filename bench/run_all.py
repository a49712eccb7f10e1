"""Run every kstore benchmark and print a summary (`make bench`).

    .venv/bin/python bench/run_all.py
    KSTORE_BENCH_SCALE=0.1 .venv/bin/python bench/run_all.py     # quick smoke run
    KSTORE_BENCH_BIG=1     .venv/bin/python bench/run_all.py     # adds the 10^7-record log

Writes bench/results/{append,lookup,compaction,fetch,replication,spark,goals}.{json,png}. The
summary starts with the goal table (bench_goals): each speed goal, pure-Python codec and native
codec side by side, from this run. Scratch data lives in bench/results/tmp/ and is
deleted after each benchmark (and before the run, in case an earlier run was interrupted).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_append  # noqa: E402
import bench_compaction  # noqa: E402
import bench_fetch  # noqa: E402
import bench_goals  # noqa: E402
import bench_lookup  # noqa: E402
import bench_replication  # noqa: E402
import bench_spark  # noqa: E402
import bench_widgets  # noqa: E402
import common  # noqa: E402


def main() -> dict:
    common.clean_tmp()
    info = common.machine_info()
    fs = common.filesystem_of(common.RESULTS)
    print(f"kstore {info['kstore_version']} @ {(info['git_commit'] or '?')[:12]}"
          f"{' (kstore/ modified)' if info['kstore_dir_dirty'] else ''} | Python {info['python']} | "
          f"{info['cpu_count']} CPUs | {info['platform']} | data on {fs['type']} ({fs['device']}) | "
          f"load {info['loadavg_1_5_15'][0]}")
    t0 = common.now()
    append = bench_append.main()   # each benchmark removes its own scratch data
    print()
    lookup = bench_lookup.main()
    print()
    compaction = bench_compaction.main()
    print()
    fetch = bench_fetch.main()
    print()
    replication = bench_replication.main()
    print()
    goals = bench_goals.main(fetch)
    print()
    spark = bench_spark.main()
    print()
    widgets = bench_widgets.main()
    elapsed = common.now() - t0

    print("\n== summary ==")
    print("goals (pure-Python codec | native codec, same run):")
    for line in bench_goals.table(goals["results"]):
        print(line)
    enc = {r["records_per_batch"]: r for r in append["encode"]}
    best = max(append["encode"], key=lambda r: r["records_per_s"])
    print(f"build_batch alone (encoding only, pre-built Records, best of trials): "
          f"{best['records_per_s']:,.0f} records/s at {best['records_per_batch']} records/batch "
          f"({enc[1]['records_per_s']:,.0f}/s at 1)")
    for label, rows in (("no fsync", append["append_no_fsync"]),
                        ("fsync/16MB", append["append_fsync"])):
        cells = ", ".join(f"{bench_append._size(r['batch_bytes'])} {r['append_MB_s']:.0f} MB/s "
                          f"({r['ratio_append_over_raw']:.3f})" for r in rows)
        print(f"append    : {label:<10} Log.append_as_leader of a ready batch, MB/s wall clock "
              f"(÷ raw os.write): {cells}")
    for run in lookup["runs"]:
        rows = run["sizes"]
        cells = ", ".join(f"{r['records']:.0e}: {r['indexed']['p50_us']:.0f}/{r['indexed']['p99_us']:.0f}us"
                          f" (scan x{r['ratio_scan_over_indexed_p50']:.0f})" for r in rows)
        print(f"lookup    : {run['config']:<28} p50/p99 {cells}; "
              f"p50 growth {run['ratio_indexed_p50_largest_over_smallest']:.2f}")
    c = compaction["cleaning"]
    print(f"compaction: LogCleaner.clean_log ÷ raw sequential read of the same segments = "
          f"{c['clean_vs_raw_read']:.3f} wall ({c['clean_vs_raw_read_cpu']:.3f} CPU; goal ≥ 0.25); "
          f"{c['clean_mb_s']:.1f} MB/s cleaned, {c['clean_vs_decoding_read']:.2f}x a read that "
          f"decodes every record; {c['space_saved_fraction']:.0%} saved")
    print("fetch     : " + bench_fetch.summary(fetch))
    print("replication: " + bench_replication.summary(replication))
    print("spark     : " + bench_spark.summary(spark))
    print(f"total {elapsed:.0f} s; results in {common.RESULTS.relative_to(common.ROOT)}/")
    return {"append": append, "lookup": lookup, "compaction": compaction, "fetch": fetch,
            "replication": replication, "goals": goals, "spark": spark, "widgets": widgets, "seconds": elapsed}


if __name__ == "__main__":
    main()

"""Compaction and retention benchmarks.

1. Cleaning throughput: a compacted log of 1M records (100-byte values) over 10k keys is cleaned in
   one pass. What is timed: `LogCleaner.clean_log` — the offset-map pass over the dirty segments,
   the filter pass writing the `.cleaned` segment, its fsync and index, the swap and the checkpoint —
   on each of 3 identical copies of the log (copied, then `sync` so no writeback runs during the
   cleaning; best of 3, as for the read). It is compared, in the same run, with a raw sequential
   read of the same segment files (os.read in 1 MiB chunks from the page cache; best of 3) — the
   ratio is the goal — and with a
   read that decodes every record (RecordBatch.records()). Wall clock and CPU time are both
   recorded: on a shared machine the CPU ratio is the steadier one. Also the space saved.
2. Retention pass time vs number of segments: a pass that finds nothing to delete (the common case:
   the walk stops at the first segment) and a pass that deletes every old segment.

    .venv/bin/python bench/bench_compaction.py
    KSTORE_BENCH_SCALE=0.1 ...    # 100k records
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import MB, Timer, fmt_rate, scratch_dir  # noqa: E402
import time  # noqa: E402

from kstore import Log, ManualClock, Record  # noqa: E402
from kstore.cleaner import LogCleaner  # noqa: E402
from kstore.records import build_batch  # noqa: E402

VALUE = b"v" * 100
T0 = 1_700_000_000_000
CLEAN_TRIALS = 3          # each on its own copy of the log: a cleaning changes what it cleans
LOG_CONFIG = {"cleanup.policy": "compact", "segment.bytes": 16 * 1024 * 1024}


class CpuTimer:
    """`with CpuTimer() as t: ...` then `t.seconds` of this process's CPU time."""

    def __enter__(self) -> "CpuTimer":
        self.start = time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.process_time() - self.start


def build_compacted_log(directory: Path, n_records: int, n_keys: int, clock: ManualClock) -> Log:
    log = Log.open(str(directory / "compacted-0"), LOG_CONFIG, clock)
    per_batch = 100
    for start in range(0, n_records, per_batch):
        recs = [Record(f"key-{(start + i) % n_keys:06d}".encode(), VALUE, T0 + start + i)
                for i in range(min(per_batch, n_records - start))]
        log.append_as_leader(build_batch(recs))
    log.roll()   # everything written is now cleanable (the active segment never is)
    return log


def read_raw(log: Log) -> int:
    total = 0
    for segment in log.segments:
        with open(segment.log.path, "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
    return total


def read_decoded(log: Log) -> int:
    records = 0
    for segment in log.segments:
        for batch in segment.log.batches():
            records += len(batch.records())
    return records


def bench_cleaning() -> dict:
    n_records = int(1_000_000 * common.SCALE)
    n_keys = max(10, int(10_000 * min(1.0, common.SCALE * 10)))
    clock = ManualClock(T0 + n_records + 1)
    with scratch_dir("compaction") as d:
        with Timer() as t_build:
            log = build_compacted_log(d, n_records, n_keys, clock)
        before = log.size_in_bytes()
        segments_before = log.number_of_segments
        raw_trials = []
        for _ in range(3):
            with Timer() as t_raw, CpuTimer() as c_raw:
                raw_bytes = read_raw(log)
            raw_trials.append((t_raw.seconds, c_raw.seconds))
        with Timer() as t_dec:
            decoded = read_decoded(log)
        assert raw_bytes == before and decoded == n_records
        log.close()
        clean_trials = []
        for trial in range(CLEAN_TRIALS):
            copy = d / f"trial-{trial}"
            shutil.copytree(d / "compacted-0", copy / "compacted-0")
            copied = Log.open(str(copy / "compacted-0"), LOG_CONFIG, clock)
            os.sync()                     # the copy's writeback is not the cleaner's cost
            cleaner = LogCleaner(str(copy), clock)
            with Timer() as t_clean, CpuTimer() as c_clean:
                result = cleaner.clean_log(copied)
            clean_trials.append((t_clean.seconds, c_clean.seconds))
            after = copied.size_in_bytes()
            survivors = copied.records()
            assert len(survivors) == n_keys and len({r.key for r in survivors}) == n_keys
            copied.close()
            shutil.rmtree(copy)
        clean_seconds = min(w for w, _ in clean_trials)
        clean_cpu_seconds = min(c for _, c in clean_trials)
    out = {
        "records": n_records, "keys": n_keys, "build_seconds": t_build.seconds,
        "segments_before": segments_before, "bytes_before": before, "bytes_after": after,
        "space_saved_fraction": 1 - after / before,
        "clean_seconds": clean_seconds, "clean_mb_s": before / MB / clean_seconds,
        "clean_cpu_seconds": clean_cpu_seconds, "clean_trials_seconds": clean_trials,
        "raw_read_mb_s": before / MB / min(w for w, _ in raw_trials),
        "raw_read_cpu_seconds": min(c for _, c in raw_trials),
        "decoding_read_mb_s": before / MB / t_dec.seconds,
        "records_written": result.stats.records_written,
        "load_average_1min": os.getloadavg()[0],
        "timed": "LogCleaner.clean_log (map pass, filter pass, write + fsync of the cleaned segment, "
                 "swap, checkpoint), best of 3 identical copies (wall and CPU each), vs os.read of "
                 "the same files in 1 MiB chunks (best of 3)",
    }
    out["clean_vs_raw_read"] = out["clean_mb_s"] / out["raw_read_mb_s"]
    out["clean_vs_raw_read_cpu"] = out["raw_read_cpu_seconds"] / max(clean_cpu_seconds, 1e-9)
    out["clean_vs_decoding_read"] = out["clean_mb_s"] / out["decoding_read_mb_s"]
    return out


def bench_retention() -> list[dict]:
    rows = []
    one = build_batch([Record(b"k", VALUE, T0)])
    for n_segments in sorted({10, 100, 1000, int(3000 * max(common.SCALE, 0.34))}):
        clock = ManualClock(T0)
        with scratch_dir("retention") as d:
            log = Log.open(str(d / "t-0"), {"segment.bytes": len(one), "retention.ms": 60_000,
                                             "file.delete.delay.ms": 60_000}, clock)
            for _ in range(n_segments):
                log.append_as_leader(one)
            assert log.number_of_segments == n_segments
            with Timer() as t_nothing:
                assert log.delete_old_segments() == 0      # nothing expired yet
            clock.advance(120_000)
            with Timer() as t_all:         # the pass: roll, rename to .deleted, move the start
                deleted = log.delete_old_segments()
            assert deleted == n_segments
            clock.advance(60_000)
            with Timer() as t_unlink:      # file.delete.delay.ms later: the files really go
                log.scheduler.run_due()
            assert not [n for n in os.listdir(log.dir) if n.endswith(".deleted")]
            log.close()
        rows.append({"segments": n_segments, "nothing_to_delete_ms": t_nothing.seconds * 1000,
                     "delete_all_ms": t_all.seconds * 1000,
                     "per_deleted_segment_ms": t_all.seconds * 1000 / n_segments,
                     "physical_delete_ms": t_unlink.seconds * 1000})
    return rows


def main() -> dict:
    print("== compaction: 1 cleaning pass over the whole dirty log ==")
    c = bench_cleaning()
    print(f"{c['records']:,} records over {c['keys']:,} keys, {c['segments_before']} segments, "
          f"{c['bytes_before'] / MB:.1f} MB → {c['bytes_after'] / MB:.2f} MB "
          f"(space saved {c['space_saved_fraction']:.1%})")
    print(f"LogCleaner.clean_log ÷ raw sequential read of the same segments = "
          f"{c['clean_vs_raw_read']:.3f} (wall clock), {c['clean_vs_raw_read_cpu']:.3f} (CPU time); "
          f"goal ≥ 0.25; load average {c['load_average_1min']:.1f}")
    print(f"clean_log (map + filter + write/fsync + swap) : {c['clean_mb_s']:8.1f} MB/s "
          f"({c['clean_seconds']:.3f} s wall, {c['clean_cpu_seconds']:.3f} s CPU)")
    print(f"raw read (os.read, 1 MiB chunks, best of 3)   : {c['raw_read_mb_s']:8.1f} MB/s")
    print(f"decoding read (RecordBatch.records())         : {c['decoding_read_mb_s']:8.1f} MB/s   "
          f"cleaning ÷ decoding read = {c['clean_vs_decoding_read']:.2f}")
    print("\n== retention pass time vs number of segments ==")
    r = bench_retention()
    for row in r:
        print(f"{row['segments']:6d} segments: nothing to delete {row['nothing_to_delete_ms']:8.3f} ms | "
              f"delete all {row['delete_all_ms']:9.1f} ms ({row['per_deleted_segment_ms']:.3f} "
              f"ms/segment) | unlink after the delay {row['physical_delete_ms']:9.1f} ms")
    common.write_json("compaction", {"cleaning": c, "retention": r})

    def draw(axes):
        ax1, ax2 = axes
        names = ["LogCleaner.clean_log", "RecordBatch.records()\nover the segments",
                 "os.read of the\nsegment files"]
        values = [c["clean_mb_s"], c["decoding_read_mb_s"], c["raw_read_mb_s"]]
        ax1.barh(names, values, color=["tab:orange", "tab:blue", "tab:gray"])
        ax1.set_xscale("log")
        ax1.set_xlabel("MB/s (log scale)")
        ax1.set_title(f"{c['records']:,} records / {c['keys']:,} keys, {c['space_saved_fraction']:.0%} "
                      f"saved\nclean ÷ raw read = {c['clean_vs_raw_read']:.3f} wall, "
                      f"{c['clean_vs_raw_read_cpu']:.3f} CPU (goal ≥ 0.25)", fontsize=9)
        xs = [row["segments"] for row in r]
        ax2.plot(xs, [row["nothing_to_delete_ms"] for row in r], "o-", label="pass, nothing to delete")
        ax2.plot(xs, [row["delete_all_ms"] for row in r], "s-", label="pass deleting every segment")
        ax2.plot(xs, [row["physical_delete_ms"] for row in r], "^--", label="unlink after the delay")
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        ax2.set_xlabel("segments in the log")
        ax2.set_ylabel("ms per retention pass")
        ax2.legend()
        ax2.set_title("retention pass time")
    common.plot("compaction", draw, ncols=2)
    return {"cleaning": c, "retention": r}


if __name__ == "__main__":
    main()

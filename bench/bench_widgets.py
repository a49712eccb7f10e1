"""Widgets on a 1 GB log: how long each view takes to build its state and render it.

A 1 GB log (× KSTORE_BENCH_SCALE) is built fast: one prebuilt batch of 100 records × 10,000-byte
values (~1 MB) appended again and again with `Log.append_as_leader` (the log assigns the offsets),
segment.bytes = 128 MiB (8 segments), index.interval.bytes = 4096 (so every batch but the first of
a segment gets an index entry), message.timestamp.type = LogAppendTime (batches 1 ms apart). Then, for each view, the model is built and rendered several times
and the median / max are reported (milliseconds):

* hex view        — a page (32 rows × 16 bytes) at the start, middle and end of the active segment,
                    of a middle page of the first (128 MiB) segment, and of the preallocated `.index`;
* directory view  — first render (scans every batch header once), then after one more append
                    (only the new bytes are scanned);
* index view      — HTML and the matplotlib PNG of a full 128 MiB segment;
* lookup trace    — tracing random offsets and timestamps (bisect + index probes + scan);
* compaction view — the record snapshot (capped at 5,000 records) and its render;
* zero-copy view  — read+send vs sendfile of a 128 MiB segment over loopback (its own numbers);
* live updates    — the cost an append pays when the models (and ipywidgets views, redrawn
                    synchronously) follow it through events, against an append nobody watches.

Replica and offsets views work on small clusters / `__consumer_offsets`, not on a 1 GB log: not
timed here. Nothing is asserted. Writes bench/results/widgets.{json,png}; the log is deleted.

Run:  .venv/bin/python bench/bench_widgets.py     (KSTORE_BENCH_SCALE=0.1 for a 100 MB smoke run)
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import SCALE, Timer, now  # noqa: E402

from kstore import Log, LogConfig, ManualClock  # noqa: E402
from kstore.records import Record, build_batch  # noqa: E402

TARGET_BYTES = int(1_000_000_000 * SCALE)
VALUE_SIZE = 10_000
RECORDS_PER_BATCH = 100
SEGMENT_BYTES = 128 * 1024 * 1024
T0 = 1_700_000_000_000
REPEATS = 7
SEED = 20240501


def build(directory: Path) -> tuple[Log, float]:
    clock = ManualClock(T0)
    # LogAppendTime: the log stamps each batch with the (manual) clock, 1 ms apart, so the
    # timestamp lookups have distinct timestamps to search although the batch is prebuilt
    log = Log.open(str(directory / "big-0"), LogConfig({"segment.bytes": SEGMENT_BYTES,
                                                        "message.timestamp.type": "LogAppendTime"}),
                   clock)
    value = bytes(random.Random(SEED).randrange(256) for _ in range(VALUE_SIZE))
    batch = build_batch([Record(b"key", value, T0)] * RECORDS_PER_BATCH)
    with Timer() as t:
        while log.size_in_bytes() < TARGET_BYTES:
            log.append_as_leader(batch)
            clock.advance(1)
    return log, t.seconds


def timed(fn, repeats: int = REPEATS) -> dict:
    """Median and max milliseconds of `fn()` over `repeats` calls (plus the first call alone)."""
    times = []
    for _ in range(repeats):
        t0 = now()
        fn()
        times.append((now() - t0) * 1000)
    return {"first_ms": round(times[0], 3), "median_ms": round(statistics.median(times), 3),
            "max_ms": round(max(times), 3), "n": repeats}


def bench_views(log: Log) -> dict:
    from kstore.widgets import (CompactionModel, DirectoryModel, HexModel, IndexModel,
                                trace_offset, trace_timestamp)

    rng = random.Random(SEED)
    out = {}
    first_seg = log.segments[0]

    active = HexModel(log, rows=32)
    out["hex: first page of the active segment"] = timed(lambda: (active.first_page(), active.render_html()))
    out["hex: middle page of the active segment"] = timed(
        lambda: (active.go_to(active.size // 2), active.render_html()))
    out["hex: last page of the active segment"] = timed(lambda: (active.last_page(), active.render_html()))
    seg0 = HexModel(log, segment=first_seg.base_offset, rows=32)
    out["hex: random page of a 128 MiB segment"] = timed(
        lambda: (seg0.go_to(rng.randrange(seg0.size)), seg0.render_html()))
    idx = HexModel(log, "index", rows=32)
    out["hex: page of the preallocated .index"] = timed(lambda: (idx.go_to(0), idx.render_html()))
    out["hex: model construction"] = timed(lambda: HexModel(log).close())

    out["directory: first render (all headers)"] = timed(
        lambda: DirectoryModel(log).render_html(), repeats=3)
    directory = DirectoryModel(log)
    directory.render_html()
    batch = build_batch([Record(b"k", b"v" * 100, T0)])

    def append_and_render():
        log.append_as_leader(batch)
        directory.render_html()
    out["directory: append + re-render"] = timed(append_and_render)

    index = IndexModel(log, first_seg.base_offset)
    out["index: HTML of a full segment"] = timed(index.render_html)
    out["index: PNG of a full segment"] = timed(index.png, repeats=3)

    leo = log.log_end_offset
    out["lookup: trace a random offset"] = timed(lambda: trace_offset(log, rng.randrange(leo)), 50)
    out["lookup: trace a random timestamp"] = timed(
        lambda: trace_timestamp(log, T0 + rng.randrange(leo // RECORDS_PER_BATCH)), 20)

    out["compaction: snapshot + render (5k rec.)"] = timed(
        lambda: CompactionModel(log, max_records=5000).render_html(), repeats=3)
    for m in (active, seg0, idx, directory, index):
        m.close()
    return out


def bench_live_updates(log: Log) -> dict:
    """Append latency with nobody watching, with the models, with the widget views (redraw now)."""
    from kstore.widgets import (CompactionModel, DirectoryModel, DirectoryView, HexModel, HexView,
                                IndexModel, IndexView, LookupModel)

    batch = build_batch([Record(b"k", b"v" * 100, T0)])

    def appends(n: int = 200) -> dict:
        return timed(lambda: log.append_as_leader(batch), n)
    out = {"append, nobody watching": appends()}
    models = [HexModel(log), DirectoryModel(log), IndexModel(log), LookupModel(log, 0),
              CompactionModel(log, max_records=1000)]
    out["append, 5 models following"] = appends()
    for m in models:
        m.close()
    views = [HexView(log, min_interval=0), DirectoryView(log, min_interval=0),
             IndexView(log, min_interval=0)]
    out["append, 3 views redrawn each time"] = appends(30)
    for v in views:
        v.model.close()
    throttled = [HexView(log), DirectoryView(log)]
    out["append, 2 views throttled (0.1 s)"] = appends()
    for v in throttled:
        v.redrawer.cancel()
        v.model.close()
    return out


def plot(result: dict) -> Path:
    """bench/results/widgets.png: median and max per view (log scale)."""
    rows = {**result["views"], **result["live_updates"]}

    def draw(ax):
        names = list(rows)
        ax.barh(names, [r["max_ms"] for r in rows.values()], color="#e9ecef", label="max")
        ax.barh(names, [r["median_ms"] for r in rows.values()], color="#5a8dee", label="median")
        ax.set_xscale("log")
        ax.set_xlabel("milliseconds (log scale)")
        ax.set_ylabel("view / operation")
        ax.set_title(f"widget render / update times on a {result['log_bytes'] / 1e9:.2f} GB log")
        ax.invert_yaxis()
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
    return common.plot("widgets", draw, width=12, height=6)


def main() -> dict:
    fs = common.filesystem_of(common.RESULTS)
    print(f"== widgets on a {TARGET_BYTES / 1e9:.2f} GB log (data on {fs['type']}) ==")
    with common.scratch_dir("widgets") as d:
        log, build_s = build(d)
        size = log.size_in_bytes()
        print(f"built {size / 1e9:.2f} GB, {log.log_end_offset:,} records, "
              f"{log.number_of_segments} segments in {build_s:.1f} s "
              f"({size / build_s / 1e6:.0f} MB/s)")
        views = bench_views(log)
        live = bench_live_updates(log)
        from kstore.widgets import measure_transfer
        zc = measure_transfer(min(SEGMENT_BYTES, log.segments[0].size), path=log.segments[0].log.path)
        log.close()
    print(f"{'view':<48} {'first ms':>9} {'median ms':>10} {'max ms':>9}")
    for name, r in {**views, **live}.items():
        print(f"{name:<48} {r['first_ms']:>9.2f} {r['median_ms']:>10.2f} {r['max_ms']:>9.2f}")
    for method, r in zc["results"].items():
        print(f"zero-copy {method:<10}: {r['MB_per_s']:,.0f} MB/s, {r['syscalls']} syscalls, "
              f"{(r['user_cpu_s'] + r['system_cpu_s']) * 1000:.0f} ms CPU")
    print(f"zero-copy: sendfile ÷ read+send = {zc['speedup']:.2f}x on {zc['bytes'] / 2**20:.0f} MiB")
    result = {"log_bytes": size, "records": log.log_end_offset, "segments": log.number_of_segments,
              "build_seconds": build_s, "filesystem": fs, "views": views, "live_updates": live,
              "zero_copy": zc}
    path = common.write_json("widgets", result)

    png = plot(result)
    print(f"wrote {path.relative_to(common.ROOT)} and {png.relative_to(common.ROOT)}")
    return result


if __name__ == "__main__":
    main()

"""The engine's speed goals, measured with the pure-Python codec and the native one side by side.

Every in-process measurement below runs twice in the same process, interleaved trial by trial:
once inside `kstore.native.pure_python()` (kstore/records.py, the reference the course teaches)
and once with the native codec (kstore/_codec.c). Rates are per CPU-second of this process
(time.process_time: one thread, so one core), the best of TRIALS trials; the wall-clock rate of
the same trial is stored next to it (other processes on the machine slow the wall clock, not the
CPU clock).

  encode_append   build_batch of 100 Records (100-byte random values, key None, no headers, no
                  compression) + Log.append_as_leader of that batch, into a fresh log (1 GiB
                  segments, no fsync): records per CPU-second. Goal: Kafka's published single
                  producer, 821,557 records/s.
  producer_send   kstore.producer.Producer.send of 100-byte values (key None; batch.size 16384,
                  linger.ms 5, acks all) to an in-process Broker with one partition, flush at the
                  end: records per CPU-second. Goal 500,000.
  segment_reader  RecordBatch.records() (decoding every Record) for every batch of the log that
                  encode_append wrote, read with FileRecords.batches(): records per CPU-second.
                  Goal 1,000,000.
  append_vs_raw   Log.append_as_leader of one ready ~100 KB / ~1 MB batch, over and over, MB per
                  CPU-second ÷ os.write of the same bytes into a file in the same directory, MB per
                  CPU-second (the kernel's copy into the page cache is CPU time on both sides; no
                  fsync). Worst of the two sizes. Goal ≥ 0.5. The batch is handed over as the broker
                  hands a Produce request's batch: a writable memoryview of the request buffer, in
                  which the log patches offsets and epoch and which it writes (no copy); its base
                  offset is set back to 0 before each append (a new request; timed too). The rows
                  also give the rate for a read-only `bytes` batch, which the log copies once.
                  bench_append has the wall-clock view.
  compaction      LogCleaner.clean_log of a 16 MiB-segment compacted log (100-byte values, 10k
                  keys) ÷ a raw sequential read of the same segment files (MB/s ÷ MB/s, wall clock,
                  best of 3 reads; the CPU-time ratio is recorded beside it; bench_compaction).
                  Goal ≥ 0.25.

Two goals need a broker process and come from bench_fetch (run_all passes them in):
  produce_e2e     confluent-kafka producing 100-byte records to `kstore serve` over loopback
                  (records/s, wall clock), the broker's CPU seconds per second of it (≤ 1 core).
                  The fastest of three client setups (one process calling produce() per record,
                  two such processes at once, one process calling produce_batch() of 1000): the
                  broker's CPU per record says whether the broker or the client is the bound.
                  The pure-Python column is a broker started with KSTORE_PURE_PYTHON=1.
  fetch_sendfile  the broker serving Fetch with sendfile ÷ a plain os.sendfile server, at 1 MiB
                  fetches and above (the fetch path decodes no records: one column): the median
                  of 7 interleaved trials ÷ the faster plain mode's median (best ÷ best is kept
                  in the JSON). Both servers set the broker's default socket buffers
                  (socket.send.buffer.bytes / socket.receive.buffer.bytes = 102400, Kafka's).
                  In brackets, and in the JSON: the same ratio when the kernel sizes the buffers
                  (-1), where transfers run faster and the broker's ~30 µs of Python per fetch
                  shows against the plain server's none.

    .venv/bin/python bench/bench_goals.py          (KSTORE_BENCH_SCALE scales durations/volumes)
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_append  # noqa: E402
import bench_compaction  # noqa: E402
import common  # noqa: E402
from common import MB, SCALE  # noqa: E402

from kstore import Log, LogConfig, native  # noqa: E402
from kstore.broker import Broker  # noqa: E402
from kstore.producer import Producer  # noqa: E402
from kstore.records import Record, build_batch  # noqa: E402

KAFKA_RPS = bench_append.KAFKA_SINGLE_PRODUCER_RPS
TRIALS = 3
TRIAL_SECONDS = 0.6 * max(SCALE, 0.25)
VALUE_SIZE = 100
TIMESTAMP = 1_700_000_000_000
CODECS = ("pure", "native")

GOALS = {   # name: (what is compared, target, unit)
    "encode_append": ("build_batch + Log.append_as_leader, 100 records of 100 B per batch, "
                      "records per CPU-second", KAFKA_RPS, "records/s"),
    "produce_e2e": ("confluent-kafka -> kstore serve over loopback, records/s (broker ≤ 1 core)",
                    KAFKA_RPS, "records/s"),
    "append_vs_raw": ("Log.append_as_leader of a request buffer MB/s ÷ os.write MB/s (CPU), "
                      "worst of 100 KB and 1 MB batches", 0.5, "ratio"),
    "producer_send": ("in-process Producer.send, records per CPU-second", 500_000, "records/s"),
    "segment_reader": ("RecordBatch.records() over a segment, records per CPU-second", 1_000_000,
                       "records/s"),
    "compaction": ("LogCleaner.clean_log MB/s ÷ raw sequential read MB/s of the same segments",
                   0.25, "ratio"),
    "fetch_sendfile": ("Fetch via sendfile ÷ plain os.sendfile (median trials), worst of 1, 4 "
                       "and 16 MiB fetches, every server with Kafka's default socket buffers "
                       "(in brackets: with buffers the OS sizes)",
                       0.8, "ratio"),
}


def codec_context(codec: str):
    import contextlib
    return native.pure_python() if codec == "pure" else contextlib.nullcontext()


def timed(step, units_per_call: int, seconds: float) -> dict:
    """Call step() until `seconds` of CPU time have passed; units per CPU-second and per wall
    second."""
    calls, c0, w0 = 0, time.process_time(), time.perf_counter()
    while True:
        for _ in range(10):
            step()
        calls += 10
        c1 = time.process_time()
        if c1 - c0 >= seconds:
            break
    w1 = time.perf_counter()
    return {"cpu_rate": calls * units_per_call / (c1 - c0),
            "wall_rate": calls * units_per_call / (w1 - w0)}


def best(trials: list[dict]) -> dict:
    top = max(trials, key=lambda t: t["cpu_rate"])
    return {"value": top["cpu_rate"], "wall_rate_same_trial": top["wall_rate"],
            "trials_cpu_rate": [t["cpu_rate"] for t in trials], "statistic": "best of trials"}


# ------------------------------------------------------------------------------ in-process goals
def bench_encode_append_and_read(tmp: Path) -> tuple[dict, dict]:
    value = os.urandom(VALUE_SIZE)
    recs = [Record(None, value, TIMESTAMP) for _ in range(100)]
    trials = {c: [] for c in CODECS}
    reads = {c: [] for c in CODECS}
    for t in range(TRIALS):
        for codec in CODECS:
            log = Log.open(str(tmp / f"ea-{codec}-{t}" / "bench-0"), LogConfig())
            with codec_context(codec):
                trials[codec].append(timed(lambda: log.append_as_leader(build_batch(recs)), 100,
                                           TRIAL_SECONDS))
                batches = list(log.segments[0].log.batches())
                n = sum(b.records_count for b in batches)

                def read_all():
                    for batch in log.segments[0].log.batches():
                        batch.records()
                reads[codec].append(timed_once(read_all, n))
            log.close(flush=False)
    return ({c: best(trials[c]) for c in CODECS}, {c: best(reads[c]) for c in CODECS})


def timed_once(step, units: int) -> dict:
    c0, w0 = time.process_time(), time.perf_counter()
    step()
    c1, w1 = time.process_time(), time.perf_counter()
    return {"cpu_rate": units / max(c1 - c0, 1e-9), "wall_rate": units / max(w1 - w0, 1e-9)}


def bench_producer_send(tmp: Path) -> dict:
    value = os.urandom(VALUE_SIZE)
    trials = {c: [] for c in CODECS}
    for t in range(TRIALS):
        for codec in CODECS:
            broker = Broker(str(tmp / f"ps-{codec}-{t}"))
            broker.create_topic("t", 1)
            producer = Producer(broker)
            with codec_context(codec):
                result = timed(lambda: producer.send("t", value), 1, TRIAL_SECONDS)
                producer.flush()
            assert broker.get_log("t", 0).log_end_offset == producer.records_sent
            broker.close()
            trials[codec].append(result)
    return {c: best(trials[c]) for c in CODECS}


def bench_append_vs_raw(tmp: Path) -> dict:
    """Per batch size: CPU-seconds of os.write loops and of append_as_leader loops over the same
    bytes, interleaved, best of TRIALS each; the ratio is append MB per CPU-second ÷ raw."""
    value = os.urandom(VALUE_SIZE)
    total = int(64 * MB * max(SCALE, 0.25))
    out = {c: {"rows": []} for c in CODECS}
    for target in (100_000, 1_000_000):
        batch, n = bench_append.batch_near(target, value)
        iterations = max(4, total // len(batch))
        raw, app = [], {c: [] for c in CODECS}
        app_bytes = {c: [] for c in CODECS}
        for t in range(TRIALS):
            raw.append(raw_write_cpu(tmp / "raw.bin", batch, iterations))
            for codec in CODECS:
                with codec_context(codec):
                    app[codec].append(append_cpu(tmp / f"app-{codec}-{target}-{t}", batch,
                                                 iterations, request_buffer=True))
                    app_bytes[codec].append(append_cpu(tmp / f"appb-{codec}-{target}-{t}", batch,
                                                       iterations, request_buffer=False))
        raw_mb_s = iterations * len(batch) / min(raw) / MB
        for codec in CODECS:
            app_mb_s = iterations * len(batch) / min(app[codec]) / MB
            bytes_mb_s = iterations * len(batch) / min(app_bytes[codec]) / MB
            out[codec]["rows"].append({"batch_bytes": len(batch), "records_per_batch": n,
                                       "appends": iterations, "append_MB_per_cpu_s": app_mb_s,
                                       "raw_write_MB_per_cpu_s": raw_mb_s,
                                       "ratio": app_mb_s / raw_mb_s,
                                       "append_bytes_MB_per_cpu_s": bytes_mb_s,
                                       "ratio_bytes_batch": bytes_mb_s / raw_mb_s})
    for codec in CODECS:
        out[codec]["value"] = min(r["ratio"] for r in out[codec]["rows"])
        out[codec]["statistic"] = ("worst batch size; each: best-of-trials append MB per "
                                   "CPU-second ÷ best-of-trials os.write MB per CPU-second")
    return out


def raw_write_cpu(path: Path, batch: bytes, iterations: int) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        c0 = time.process_time()
        for _ in range(iterations):
            os.write(fd, batch)
        return time.process_time() - c0
    finally:
        os.close(fd)
        path.unlink()


def append_cpu(directory: Path, batch: bytes, iterations: int, request_buffer: bool) -> float:
    """CPU seconds of `iterations` leader appends of `batch`: from a writable request buffer
    (base offset reset to 0 each time, as a new request brings it), or as read-only bytes."""
    log = Log.open(str(directory / "bench-0"), LogConfig())
    try:   # the log's first append also writes its leader-epoch checkpoint: not timed
        log.append_as_leader(batch)
        if request_buffer:
            request = memoryview(bytearray(batch))
            c0 = time.process_time()
            for _ in range(iterations):
                struct.pack_into(">q", request, 0, 0)
                log.append_as_leader(request)
        else:
            c0 = time.process_time()
            for _ in range(iterations):
                log.append_as_leader(batch)
        return time.process_time() - c0
    finally:
        log.close(flush=False)
        shutil.rmtree(directory, ignore_errors=True)   # the raw side unlinks its file too


def bench_compaction_ratio() -> dict:
    out = {}
    for codec in CODECS:
        with codec_context(codec):
            c = bench_compaction.bench_cleaning()
        out[codec] = {"value": c["clean_vs_raw_read"], "clean_mb_s": c["clean_mb_s"],
                      "raw_read_mb_s": c["raw_read_mb_s"], "records": c["records"],
                      "cpu_time_ratio": c["clean_vs_raw_read_cpu"],
                      "load_average_1min": c["load_average_1min"],
                      "statistic": "best of 3 cleanings of identical copies ÷ best of 3 raw reads, wall clock"}
    return out


# ------------------------------------------------------------------------------ from bench_fetch
def from_fetch(fetch: dict | None) -> tuple[dict, dict]:
    if not fetch:
        return {}, {}
    produce = {}
    native_keys = ("confluent-kafka", "confluent-kafka-2-producers", "confluent-kafka-produce-batch")
    for codec, keys in (("pure", ("confluent-kafka-pure-broker",)), ("native", native_keys)):
        rows = {k: fetch["e2e"][k] for k in keys if fetch["e2e"].get(k)}
        if rows:   # the fastest client setup: the broker's rate is what the goal asks about
            key = max(rows, key=lambda k: rows[k]["produce"]["records_per_s"])
            p = rows[key]["produce"]
            produce[codec] = {"value": p["records_per_s"],
                              "broker_cores": p["broker_cpu_s"] / p["seconds"],
                              "broker_cpu_us_per_record": p["broker_cpu_us_per_record"],
                              "records": p["records"], "client": key,
                              "all_clients": {k: r["produce"]["records_per_s"] for k, r in rows.items()},
                              "statistic": "one run per client setup, wall clock; the fastest"}
    rows = [r for r in fetch["fetch"]["kstore_sendfile"] if r["fetch_size"] >= 1024 * 1024]
    ratio = min(r["ratio_vs_plain_median"] for r in rows)
    one = {"value": ratio, "by_size": {r["fetch_size"]: r["ratio_vs_plain_median"] for r in rows},
           "best_of_trials": {r["fetch_size"]: r["ratio_vs_plain_best"] for r in rows},
           "statistic": "worst fetch size ≥ 1 MiB (each: median trial ÷ the faster plain mode's "
                        "median trial; best ÷ best in best_of_trials)"}
    os_rows = fetch.get("fetch_os_buffers", {}).get("rows", {}).get("kstore_sendfile", [])
    if os_rows:   # the same ratio with buffers the kernel sizes itself: the broker's own cost shows
        one["os_socket_buffers"] = {r["fetch_size"]: r["ratio_vs_plain_median"] for r in os_rows}
        one["socket_buffers"] = fetch.get("socket_buffers")
    return produce, {"pure": one, "native": one}


# ------------------------------------------------------------------------------ report
def met(name: str, cell: dict | None) -> bool | None:
    if not cell:
        return None
    ok = cell["value"] >= GOALS[name][1]
    if name == "produce_e2e":
        ok = ok and cell["broker_cores"] <= 1.0
    return ok


def _fmt(name: str, cell: dict | None) -> str:
    if not cell:
        return "not run"
    v = cell["value"]
    text = f"{v:,.0f}" if GOALS[name][2] == "records/s" else f"{v:.3f}"
    if name == "append_vs_raw" and "rows" in cell:   # and with a read-only bytes batch (copied)
        text += f" (bytes {min(r['ratio_bytes_batch'] for r in cell['rows']):.3f})"
    if name == "fetch_sendfile" and cell.get("os_socket_buffers"):
        text += f" (OS buffers {min(cell['os_socket_buffers'].values()):.3f})"
    if name == "produce_e2e":   # the broker's CPU per record says what one core could take
        text += f" ({cell['broker_cores']:.2f} cores, {cell['broker_cpu_us_per_record']:.2f} us/rec)"
    return text


def table(results: dict) -> list[str]:
    lines = [f"    {'goal':<15} {'target':>10} {'pure Python':>34} {'native':>34}  met (native)   "
             f"what was timed"]
    for name, (what, target, unit) in GOALS.items():
        cells = results.get(name, {})
        target_s = f"{target:,}" if unit == "records/s" else f"≥ {target}"
        verdict = {True: "yes", False: "NO", None: "-"}[met(name, cells.get("native"))]
        lines.append(f"    {name:<15} {target_s:>10} {_fmt(name, cells.get('pure')):>34} "
                     f"{_fmt(name, cells.get('native')):>34}  {verdict:<13}  {what}")
    return lines


def main(fetch: dict | None = None) -> dict:
    print(f"== goals: pure-Python codec vs native codec, same run (scale {SCALE:g}; native codec: "
          f"{native.description}) ==", flush=True)
    if native.codec is None:
        print("    the native codec is not loaded: both columns run the pure-Python code")
    results: dict = {}
    with common.scratch_dir("goals") as tmp:
        results["encode_append"], results["segment_reader"] = bench_encode_append_and_read(tmp)
        results["producer_send"] = bench_producer_send(tmp)
        results["append_vs_raw"] = bench_append_vs_raw(tmp)
    results["compaction"] = bench_compaction_ratio()
    results["produce_e2e"], results["fetch_sendfile"] = from_fetch(fetch)
    for line in table(results):
        print(line)
    data = {"description": "the engine's speed goals, pure-Python and native codec in one run",
            "goals": {k: {"what": w, "target": t, "unit": u} for k, (w, t, u) in GOALS.items()},
            "codec": native.description, "trials": TRIALS, "trial_cpu_seconds": TRIAL_SECONDS,
            "results": results,
            "met_native": {k: met(k, results.get(k, {}).get("native")) for k in GOALS}}
    path = common.write_json("goals", data)
    png = common.plot("goals", lambda ax: _draw(ax, results), width=8.0, height=4.5)
    print(f"-> {path.relative_to(common.ROOT)}, {png.relative_to(common.ROOT)}")
    return data


def _draw(ax, results: dict) -> None:
    names = [n for n in GOALS if results.get(n)]
    xs = range(len(names))
    w = 0.38
    for off, codec, color in ((-w / 2, "pure", "tab:orange"), (w / 2, "native", "tab:blue")):
        vals = [results[n][codec]["value"] / GOALS[n][1] if results[n].get(codec) else 0
                for n in names]
        bars = ax.bar([x + off for x in xs], vals, w, label=f"{codec} codec", color=color)
        for b, v in zip(bars, vals):
            ax.annotate(f"{v:.2f}", (b.get_x() + b.get_width() / 2, v), ha="center",
                        va="bottom", fontsize=7)
    ax.axhline(1.0, color="tab:red", ls="--", label="goal")
    ax.set_xticks(list(xs), names, rotation=20, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("measured ÷ goal")
    ax.set_title("Speed goals: pure-Python vs native codec (same run)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", which="both", alpha=0.3)


if __name__ == "__main__":
    main()

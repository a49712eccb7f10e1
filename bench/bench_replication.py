"""Replication: produce throughput with replication factor 3 (acks=1, acks=all) beside factor 1,
and the time to elect a new leader and resume after the leader dies.

1. Throughput — in the stepped cluster (`kstore.cluster.Cluster`, ManualClock), 3 brokers, one
   partition, one ready batch of 100 records × 100-byte random values (key None, no compression)
   produced N times (the leader assigns offsets; the batch is built once, outside the timing):
     * "none":      a topic with replication factor 1, acks=1;
     * "async 3x":  replication factor 3, acks=1, the two followers fetch every k batches;
     * "sync 3x":   replication factor 3, acks=all (min.insync.replicas 2), both followers fetch
                    after every produce. The leader learns a follower's LEO from its *next* fetch,
                    so a request is acknowledged one fetch round after its append (pipelined, like
                    a producer with requests in flight); a final round completes the last one.
   Everything runs on one core in one process, so the followers' fetches (read, copy, append) are
   part of the measured time: records/s = records acknowledged ÷ (time from the first produce
   until the followers hold everything and every request is answered); best of 5 trials, the
   three configs interleaved, and — since the stepped cluster runs no threads — also records per
   CPU-second of this process (median), which other load on the machine hardly disturbs. In Kafka's figures the
   followers run on other machines. Printed beside Kafka's published 821,557 / 786,980 / 421,823
   records/s (none / async 3x / sync 3x; Jay Kreps, "Benchmarking Apache Kafka: 2 Million Writes
   Per Second (On Three Cheap Machines)", LinkedIn Engineering, 2014), with the ratios to "none"
   in both systems — the ratios are what can be compared.
2. Failover — running mode (`SystemClock`, a fetcher thread per broker, replica.fetch.wait.max.ms
   100): the leader is killed (`crash`), and the time is taken until a produce to the new leader
   succeeds with acks=all (retrying on NOT_LEADER). `crash()` itself includes the controller's
   election and the LeaderAndIsr push (mostly three fsynced atomic file writes: the controller
   and partition-state metadata, the new leader's leader-epoch-checkpoint). kstore notices a
   death at once; real Kafka first has to notice it (ZooKeeper session timeout, 18 s by default,
   or KRaft's broker.session.timeout.ms, 9 s), which dominates its failover time. Also in the
   stepped cluster (no threads, no polling).

Run:  .venv/bin/python bench/bench_replication.py      (env KSTORE_BENCH_SCALE multiplies N)
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import SCALE, Timer, fmt_rate, now  # noqa: E402

from kstore import ManualClock  # noqa: E402
from kstore.cluster import Cluster  # noqa: E402
from kstore.clock import SystemClock  # noqa: E402
from kstore.records import Record, build_batch  # noqa: E402

# Jay Kreps, "Benchmarking Apache Kafka: 2 Million Writes Per Second (On Three Cheap Machines)",
# LinkedIn Engineering blog, 2014: one producer thread, 100-byte records, 6-partition topic.
KAFKA = {"none": 821_557, "async 3x": 786_980, "sync 3x": 421_823}
KAFKA_SOURCE = ("Jay Kreps, 'Benchmarking Apache Kafka: 2 Million Writes Per Second (On Three "
                "Cheap Machines)', LinkedIn Engineering, 2014 — single producer thread, 100-byte "
                "records: no replication / 3x asynchronous (acks=1) / 3x synchronous (acks=all)")

VALUE_SIZE = 100
RECORDS_PER_BATCH = 100
N_BATCHES = max(20, int(1000 * SCALE))
ASYNC_FETCH_EVERY = 10              # k: followers fetch every k batches with acks=1
TRIALS = 5                          # throughput: best of 5, the configs interleaved
FAILOVER_TRIALS = max(3, int(7 * min(SCALE, 1) + 0.5))
T0 = 1_700_000_000_000
TOPIC = "bench"


def make_batch() -> bytes:
    value = os.urandom(VALUE_SIZE)
    return build_batch([Record(None, value, T0) for _ in range(RECORDS_PER_BATCH)])


# ------------------------------------------------------------------------------ throughput
def run_throughput(directory: Path, config: str, batch: bytes, n_batches: int) -> dict:
    c = Cluster(str(directory / config.replace(" ", "-")), 3, clock=ManualClock(T0))
    try:
        rf = 1 if config == "none" else 3
        c.create_topic(TOPIC, 1, rf, {"min.insync.replicas": 2 if rf == 3 else 1})
        acks = -1 if config == "sync 3x" else 1
        leader = c.brokers[c.leader(TOPIC)]
        followers = [b for b in c.replicas(TOPIC) if b != leader.broker_id]
        fetchers = [c.brokers[b].replica_manager.fetcher for b in followers]
        tp = (TOPIC, 0)
        results = []
        cpu0 = time.process_time()          # the stepped cluster runs no threads: CPU time is
        with Timer() as t:                  # what this process spent, whatever else runs
            for i in range(n_batches):
                results.append(leader.produce_request(TOPIC, 0, batch, acks))
                if config == "sync 3x" or (config == "async 3x" and (i + 1) % ASYNC_FETCH_EVERY == 0):
                    for f in fetchers:
                        f.step(tp, max_wait_ms=0)
            for _ in range(2):               # catch up and acknowledge the last requests
                for f in fetchers:
                    f.step(tp, max_wait_ms=0)
        cpu = time.process_time() - cpu0
        failed = [r for r in results if not r.done or r.error is not None]
        assert not failed, f"{len(failed)} produce requests not acknowledged: {failed[0]}"
        leo = leader.replica_manager.partition(TOPIC, 0).log.log_end_offset
        records = n_batches * RECORDS_PER_BATCH
        assert leo == records
        for b in followers:                  # every follower holds everything
            assert c.brokers[b].replica_manager.partition(TOPIC, 0).log.log_end_offset == records
        return {"seconds": t.seconds, "cpu_seconds": cpu, "records": records,
                "records_per_s": records / t.seconds, "records_per_cpu_s": records / cpu,
                "payload_MB_s": records * VALUE_SIZE / t.seconds / common.MB,
                "produce_requests": n_batches, "follower_fetch_rounds":
                    (n_batches if config == "sync 3x" else
                     n_batches // ASYNC_FETCH_EVERY if config == "async 3x" else 0) + (2 if followers else 0)}
    finally:
        c.shutdown()


def bench_throughput(directory: Path) -> list[dict]:
    batch = make_batch()
    configs = ("none", "async 3x", "sync 3x")
    runs = {config: [] for config in configs}
    for i in range(TRIALS):       # round-robin, so a burst of outside load hits every config alike
        for config in configs:
            runs[config].append(_trial(directory, config, i, batch))
    rows = []
    for config in configs:
        trials = runs[config]
        best = max(trials, key=lambda r: r["records_per_s"])
        rows.append({"config": config, "replication_factor": 1 if config == "none" else 3,
                     "acks": "all" if config == "sync 3x" else 1,
                     "follower_fetch": {"none": "-", "async 3x": f"every {ASYNC_FETCH_EVERY} batches",
                                        "sync 3x": "after every produce"}[config],
                     **best, "trials_records_per_s": [r["records_per_s"] for r in trials],
                     "median_records_per_cpu_s": statistics.median(r["records_per_cpu_s"] for r in trials),
                     "statistic": f"best of {TRIALS} (wall clock), configs interleaved", "kafka_records_per_s": KAFKA[config]})
        print(f"    {config:<9} RF {rows[-1]['replication_factor']} acks={rows[-1]['acks']:<3} "
              f"{best['records_per_s']:>10,.0f} records/s ({best['payload_MB_s']:5.1f} MB/s; "
              f"{rows[-1]['median_records_per_cpu_s']:>9,.0f} per CPU-second)   "
              f"Kafka {KAFKA[config]:>9,}", flush=True)
    base = rows[0]["records_per_s"]
    for r in rows:
        r["ratio_vs_none"] = r["records_per_s"] / base
        r["cpu_ratio_vs_none"] = r["median_records_per_cpu_s"] / rows[0]["median_records_per_cpu_s"]
        r["kafka_ratio_vs_none"] = KAFKA[r["config"]] / KAFKA["none"]
        r["ratio_vs_kafka"] = r["records_per_s"] / KAFKA[r["config"]]
    return rows


def _trial(directory: Path, config: str, i: int, batch: bytes) -> dict:
    sub = directory / f"trial-{i}"
    sub.mkdir(exist_ok=True)
    return run_throughput(sub, config, batch, N_BATCHES)


# ------------------------------------------------------------------------------ failover
def produce_until_acked(c: Cluster, batch: bytes, deadline: float) -> tuple[int, list[str]]:
    errors = []
    while now() < deadline:
        r = c.produce(TOPIC, 0, batch, acks=-1, timeout_ms=2_000).wait(3.0)
        if r.done and r.error is None:
            return r.base_offset, errors
        errors.append(type(r.error).__name__ if r.error else "no answer")
        time.sleep(0.001)
    raise RuntimeError(f"no acks=all produce succeeded: {errors[-5:]}")


def bench_failover_running(directory: Path, batch: bytes) -> list[dict]:
    c = Cluster(str(directory / "running"), 3, clock=SystemClock(),
                broker_config={"replica.fetch.wait.max.ms": 100})
    rows = []
    try:
        c.create_topic(TOPIC, 1, 3, {"min.insync.replicas": 2})
        c.start(poll_ms=1)
        for _ in range(10):
            produce_until_acked(c, batch, now() + 10)
        for trial in range(FAILOVER_TRIALS):
            old = c.leader(TOPIC)
            t0 = now()
            c.crash(old)
            t_elected = now()
            offset, errors = produce_until_acked(c, batch, t0 + 20)
            t1 = now()
            rows.append({"trial": trial, "old_leader": old, "new_leader": c.leader(TOPIC),
                         "leader_epoch": c.metadata.partition_state(TOPIC, 0)["leader_epoch"],
                         "election_ms": (t_elected - t0) * 1e3, "resume_ms": (t1 - t0) * 1e3,
                         "first_offset_after": offset, "failed_attempts": errors})
            print(f"    trial {trial}: leader {old} -> {rows[-1]['new_leader']} (epoch "
                  f"{rows[-1]['leader_epoch']}): elected in {rows[-1]['election_ms']:.2f} ms, "
                  f"acks=all produce succeeded after {rows[-1]['resume_ms']:.2f} ms", flush=True)
            c.restart(old)                    # back as a follower; wait until it is in sync
            deadline = now() + 20
            while set(c.isr(TOPIC)) != {0, 1, 2} and now() < deadline:
                produce_until_acked(c, batch, deadline)
            assert set(c.isr(TOPIC)) == {0, 1, 2}, c.describe(TOPIC)
    finally:
        c.shutdown()
    return rows


def bench_failover_stepped(directory: Path, batch: bytes) -> list[dict]:
    c = Cluster(str(directory / "stepped"), 3, clock=ManualClock(T0))
    rows = []
    try:
        c.create_topic(TOPIC, 1, 3, {"min.insync.replicas": 2})
        for _ in range(10):
            c.produce(TOPIC, 0, batch, acks=-1)
            c.replicate(rounds=1)
        c.replicate(rounds=2)
        for trial in range(FAILOVER_TRIALS):
            old = c.leader(TOPIC)
            t0 = now()
            c.crash(old)
            t_elected = now()
            r = c.produce(TOPIC, 0, batch, acks=-1)
            rounds = 0
            while not r.done:
                c.replicate(rounds=1)
                rounds += 1
            t1 = now()
            assert r.error is None, r.error
            rows.append({"trial": trial, "old_leader": old, "new_leader": c.leader(TOPIC),
                         "election_ms": (t_elected - t0) * 1e3, "resume_ms": (t1 - t0) * 1e3,
                         "fetch_rounds": rounds})
            c.restart(old)
            c.replicate(rounds=3)
            assert set(c.isr(TOPIC)) == {0, 1, 2}, c.describe(TOPIC)
    finally:
        c.shutdown()
    return rows


def _summary(rows: list[dict]) -> dict:
    return {k: {"median": statistics.median(r[k] for r in rows), "min": min(r[k] for r in rows),
                "max": max(r[k] for r in rows)} for k in ("election_ms", "resume_ms")}


# ------------------------------------------------------------------------------ main
def main() -> dict:
    fs = common.filesystem_of(common.RESULTS)
    print(f"== replication benchmark (scale {SCALE:g}) ==")
    with common.scratch_dir("replication") as tmp:
        print(f"-- 1. produce throughput, stepped 3-broker cluster, {N_BATCHES} batches of "
              f"{RECORDS_PER_BATCH} x {VALUE_SIZE}-byte records, best of {TRIALS} "
              f"(in {common.TMP}, {fs['type']})")
        rows = bench_throughput(tmp)
        for r in rows[1:]:
            print(f"    {r['config']}: {r['ratio_vs_none']:.3f} x no replication, by CPU time "
                  f"{r['cpu_ratio_vs_none']:.3f} (Kafka: {r['kafka_ratio_vs_none']:.3f})")
        print(f"    kstore/Kafka: " + ", ".join(f"{r['config']} {r['ratio_vs_kafka']:.3f}" for r in rows))
        print("    (one CPython process does the leader's and both followers' work; Kafka's "
              "followers run on other machines: compare the ratios, not the levels)")
        batch = make_batch()
        print(f"-- 2. failover: kill the leader, time until an acks=all produce succeeds "
              f"({FAILOVER_TRIALS} trials)")
        print("    running cluster (SystemClock, fetcher threads):")
        running = bench_failover_running(tmp, batch)
        stepped = bench_failover_stepped(tmp, batch)
    run_s, step_s = _summary(running), _summary(stepped)
    print(f"    running: election median {run_s['election_ms']['median']:.2f} ms, resume median "
          f"{run_s['resume_ms']['median']:.2f} ms (max {run_s['resume_ms']['max']:.2f})")
    print(f"    stepped (no threads or polling; fsync-bound): election median "
          f"{step_s['election_ms']['median']:.2f} ms, resume median {step_s['resume_ms']['median']:.2f} ms")
    print("    (kstore notices a death at once; Kafka must first detect it: ZooKeeper session "
          "18 s / KRaft broker session 9 s by default)")

    data = {
        "description": "produce throughput RF 3 acks=1 / acks=all vs RF 1 (stepped cluster); "
                       "leader failover time (running and stepped cluster)",
        "units": {"throughput": "records/s", "MB": "10^6 bytes", "time": "milliseconds"},
        "filesystem": fs, "scratch_dir": str(common.TMP),
        "value_bytes": VALUE_SIZE, "records_per_batch": RECORDS_PER_BATCH, "batches": N_BATCHES,
        "async_fetch_every_batches": ASYNC_FETCH_EVERY, "key": None, "compression": "none",
        "kafka_reference": {"records_per_s": KAFKA, "source": KAFKA_SOURCE},
        "throughput": rows,
        "failover": {"running": {"trials": running, "summary": run_s,
                                 "config": {"replica.fetch.wait.max.ms": 100, "poll_ms": 1,
                                            "min.insync.replicas": 2}},
                     "stepped": {"trials": stepped, "summary": step_s}},
    }
    path = common.write_json("replication", data)
    png = common.plot("replication", lambda axes: _draw(axes, rows, running, stepped), ncols=2, width=5.5)
    print(f"-> {path.relative_to(common.ROOT)}, {png.relative_to(common.ROOT)}")
    return data


def summary(data: dict) -> str:
    """One line for run_all.py."""
    t = {r["config"]: r for r in data["throughput"]}
    run = data["failover"]["running"]["summary"]
    return (f"produce of one pre-built batch, encoding not timed, stepped cluster on one core: "
            f"none {t['none']['records_per_s']:,.0f}/s, async 3x {t['async 3x']['records_per_s']:,.0f}/s "
            f"({t['async 3x']['ratio_vs_none']:.2f}x, CPU {t['async 3x']['cpu_ratio_vs_none']:.2f}x; "
            f"Kafka {t['async 3x']['kafka_ratio_vs_none']:.2f}x), sync 3x "
            f"{t['sync 3x']['records_per_s']:,.0f}/s ({t['sync 3x']['ratio_vs_none']:.2f}x, CPU "
            f"{t['sync 3x']['cpu_ratio_vs_none']:.2f}x; Kafka {t['sync 3x']['kafka_ratio_vs_none']:.2f}x); "
            f"failover: elected in "
            f"{run['election_ms']['median']:.1f} ms, acks=all again after {run['resume_ms']['median']:.1f} ms "
            f"(median)")


def _draw(axes, rows, running, stepped) -> None:
    ax = axes[0]
    labels = [r["config"] for r in rows]
    pos = list(range(len(rows)))
    w = 0.27
    bars = ((-w, "ratio_vs_none", "records_per_s", "kstore, wall clock (best)", "tab:blue"),
            (0.0, "cpu_ratio_vs_none", "median_records_per_cpu_s", "kstore, per CPU-second",
             "tab:cyan"),
            (w, "kafka_ratio_vs_none", "kafka_records_per_s", "Kafka 2014 (3 machines)", "tab:red"))
    for off, key, rate, label, color in bars:
        ax.bar([p + off for p in pos], [r[key] for r in rows], w, label=label, color=color)
        for p, r in zip(pos, rows):
            ax.annotate(fmt_rate(r[rate]), (p + off, r[key]), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(pos, labels)
    ax.set_ylim(0, 1.45)
    ax.set_ylabel("throughput ÷ no replication")
    ax.set_title("Produce throughput (labels: records/s)", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(True, axis="y", alpha=0.3)

    ax = axes[1]
    for rows_, label, color in ((running, "running: resume", "tab:blue"),
                                (stepped, "stepped: resume", "tab:cyan")):
        ax.plot([r["trial"] for r in rows_], [r["resume_ms"] for r in rows_], "o-", label=label,
                color=color)
    ax.plot([r["trial"] for r in running], [r["election_ms"] for r in running], "s--",
            label="running: election (crash call)", color="tab:gray")
    ax.set_yscale("log")
    ax.set_xlabel("trial (the leader is killed, then restarted)")
    ax.set_ylabel("ms after the kill")
    ax.set_title("Leader failover until acks=all succeeds")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)


if __name__ == "__main__":
    main()

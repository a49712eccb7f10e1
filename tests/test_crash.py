"""Crash safety with real processes and real files (reference §1.9, §4, §5).

* A crash loop: a writer process (tests/crash_writer.py) appends to a LogManager-managed log and
  acknowledges only fsync'd data; the test SIGKILLs it at a seeded random moment, reopens the log
  directory as a restarted broker would and checks that every acknowledged record survived, that
  everything readable is whole and CRC-valid, that offsets are contiguous and that both indexes are
  consistent; then it appends, reopens, and lets the next writer continue in the same directory.
  Some iterations also simulate a power loss (the unflushed tail of the active segment torn,
  zeroed or garbled) and some writers preallocate their segments.
* Byte flips, torn tails, garbage, zeroed preallocated tails and damaged or missing index files,
  each with an exact expectation computed from the undamaged file.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import crc32c
import pytest

import crash_writer
from crash_writer import PARTITION, TOPIC, make_record, record_bytes
from kstore import Log, LogManager, ManualClock, Record

WRITER = str(Path(crash_writer.__file__).resolve())
PYTHON = sys.executable
T0 = crash_writer.T0

CRASH_CONFIG = {
    "segment.bytes": 4096,
    "index.interval.bytes": 256,
    "segment.index.bytes": 96,     # 12 offset-index / 8 time-index slots: index-full rolls happen
    "segment.ms": 150,             # ~21 offsets of record time: time-based rolls happen too
    "file.delete.delay.ms": 0,
}


# The iterations one log directory lives through before the loop starts a new one. Every
# iteration reopens the log (twice, plus the writer's open) and re-checks every record in it, so
# its cost grows with the log: 0.26 s an iteration over the first 30, 0.58 s on average over 200
# on one log (LogManager.open checks both indexes of every segment). Four logs of 50 SIGKILLs each
# keep the 200 kills and every check, and grow each log to ~4,000 records in a few hundred
# segments.
LOG_LIFETIME = 50


def crash_iterations() -> int:
    env = os.environ.get("KSTORE_CRASH_ITERATIONS")
    if env:
        return int(env)
    return 200 if os.environ.get("CI") == "true" else 50


def report(capsys, line: str) -> None:
    """Visible with or without `-s` (pytest captures fd 2 too, so suspend capturing)."""
    with capsys.disabled():
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


# ------------------------------------------------------------------------------ raw file helpers
def raw_batches(data: bytes) -> list[tuple[int, int, int, int]]:
    """(position, size, base offset, last offset) of each complete, CRC-valid v2 batch from the
    start of `data`, stopping at the first one that is not (what recovery keeps)."""
    out, pos = [], 0
    while pos + 61 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        size = 12 + length
        if length < 49 or pos + size > len(data) or data[pos + 16] != 2:
            break
        (crc,) = struct.unpack_from(">I", data, pos + 17)
        if crc != crc32c.crc32c(data[pos + 21:pos + size]):
            break
        (delta,) = struct.unpack_from(">i", data, pos + 23)
        out.append((pos, size, base, base + delta))
        pos += size
    return out


def segment_files(part_dir: Path, ext: str = ".log") -> list[Path]:
    return sorted(p for p in part_dir.iterdir() if p.name.endswith(ext) and p.name[:20].isdigit())


def digest(offset: int, record) -> bytes:
    return hashlib.blake2b(record_bytes(offset, record), digest_size=16).digest()


# ------------------------------------------------------------------------------ invariants
def check_structure(log: Log, *, final_time_entries: bool = True) -> None:
    """Segments, files and both indexes are consistent with the batches in the `.log` files."""
    segments = log.segments
    assert log.log_start_offset == 0
    assert segments and segments[0].base_offset == 0, segments
    bases = [s.base_offset for s in segments]
    assert bases == sorted(set(bases)), bases
    for i, seg in enumerate(segments):
        nxt = seg.read_next_offset()
        if i + 1 < len(segments):
            assert nxt == segments[i + 1].base_offset, (seg, segments[i + 1])
        else:
            assert nxt == log.log_end_offset, (seg, log.log_end_offset)
        assert os.path.getsize(seg.log.path) == seg.size, (seg, os.path.getsize(seg.log.path))
        data = seg.log.read(0, seg.size)
        batches = raw_batches(data)
        assert sum(b[1] for b in batches) == seg.size, (
            f"{seg}: only {sum(b[1] for b in batches)} of {seg.size} bytes are whole valid batches")
        expected = seg.base_offset
        for pos, size, base, last in batches:
            assert base == expected, (seg, pos, base, expected)
            expected = last + 1
        by_pos = {pos: last for pos, _, _, last in batches}
        max_ts = {}
        running, running_off, seen = -1, None, []
        for pos, size, base, last in batches:
            (mts,) = struct.unpack_from(">q", data, pos + 35)
            if mts > running:
                running, running_off = mts, last
            seen.append((last, mts, running))
            max_ts[last] = mts
        # Offset index: strictly increasing; each entry is the start of a batch ending at its offset.
        entries = seg.offset_index.entries_list()
        for a, b in zip(entries, entries[1:]):
            assert a.offset < b.offset and a.position < b.position, (seg, entries)
        for e in entries:
            assert by_pos.get(e.position) == e.offset, (seg, e, "not a batch start ending there")
        # Time index: timestamps strictly increasing, offsets non-decreasing, each entry = the
        # largest timestamp up to a batch that carries it.
        tentries = seg.time_index.entries_list()
        for a, b in zip(tentries, tentries[1:]):
            assert a.timestamp < b.timestamp and a.offset <= b.offset, (seg, tentries)
        for e in tentries:
            assert max_ts.get(e.offset) == e.timestamp, (seg, e, "no batch with that max ts")
            upto = max((m for last, m, _ in seen if last <= e.offset), default=-1)
            assert upto == e.timestamp, (seg, e, upto)
        if final_time_entries and seg is not segments[-1] and running >= 0:
            assert tentries and tentries[-1] == (running, running_off), (seg, tentries[-1:],
                                                                        running, running_off)


def read_all(log: Log, rng: random.Random) -> list:
    """Every record from offset 0 via log.read (random fetch sizes), each batch CRC-checked, and
    compared with log.records()."""
    out, offset, leo = [], 0, log.log_end_offset
    while offset < leo:
        fetch = log.read(offset, rng.choice([1, 300, 4096, 1 << 20]))
        batches = fetch.batches()
        assert batches, f"read({offset}) returned no complete batch below LEO {leo}"
        assert batches[0].base_offset <= offset <= batches[0].last_offset
        for b in batches:
            b.ensure_valid()
            out.extend(r for r in b.records() if r.offset >= offset)
        offset = batches[-1].next_offset
    assert offset == leo
    assert [r.offset for r in out] == list(range(leo)), "offsets are not contiguous from 0"
    assert log.records() == out
    return out


# ------------------------------------------------------------------------------ the crash loop
class Writer:
    """One writer process; its stdout lines are collected by a thread with arrival times."""

    def __init__(self, log_dir: Path, seed: int, config: dict):
        self.proc = subprocess.Popen([PYTHON, WRITER, str(log_dir), str(seed), json.dumps(config)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[str] = []
        self.opening = threading.Event()
        self.started = threading.Event()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode()
            if not line.endswith("\n"):
                break  # a half-written line is not an acknowledgement
            self.lines.append(line.rstrip("\n"))
            if line.startswith("OPENING"):
                self.opening.set()
            if line.startswith("START"):
                self.started.set()
        self.opening.set()
        self.started.set()

    def kill(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        rc = self.proc.wait()
        self._thread.join()
        err = self.proc.stderr.read().decode(errors="replace")
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc, err


def simulate_power_loss(part_dir: Path, durable_offset: int, rng: random.Random
                        ) -> tuple[str, Path, int, int]:
    """Damage the active segment after its last durable batch, as losing the page cache can.
    Returns the mode, the file, its new length and the length of its whole valid batches."""
    path = segment_files(part_dir)[-1]
    data = path.read_bytes()
    batches = raw_batches(data)
    base = int(path.name[:20])
    if durable_offset >= base:
        ends = [pos + size for pos, size, _, last in batches if last >= durable_offset]
        assert ends, f"acknowledged offset {durable_offset} is not in {path.name}"
        durable_end = ends[0]
    else:
        durable_end = 0
    valid_end = batches[-1][0] + batches[-1][1] if batches else 0
    cut = rng.randint(durable_end, valid_end)
    mode = rng.choice(["cut", "zero", "garbage", "append-garbage"])
    with open(path, "r+b") as f:
        if mode == "cut":
            f.truncate(cut)
        elif mode == "zero":
            f.seek(cut)
            f.write(bytes(max(len(data), valid_end + 1) - cut))
        elif mode == "garbage":
            f.seek(cut)
            f.write(rng.randbytes(max(1, valid_end - cut + rng.randint(0, 64))))
        else:
            f.seek(len(data))
            f.write(rng.randbytes(rng.randint(1, 300)))
    damaged = path.read_bytes()
    return mode, path, len(damaged), sum(b[1] for b in raw_batches(damaged))


@pytest.mark.slow
def test_crash_loop_sigkill_writer(tmp_path, capsys):
    iterations = crash_iterations()
    seed = int(os.environ.get("KSTORE_CRASH_SEED", "20240611"))
    rng = random.Random(seed)
    log_dir = tmp_path / "logs-0"         # a new one every LOG_LIFETIME iterations
    part_dir = log_dir / f"{TOPIC}-{PARTITION}"
    final_ends: list[int] = []           # the log end offset each finished log reached
    clock = ManualClock(T0)
    model: list[bytes] = []          # digest of every record known durable, by offset
    stats = Counter()
    started = time.monotonic()
    debug = bool(os.environ.get("KSTORE_CRASH_DEBUG"))  # keep copies of the files for a post-mortem

    def close(manager: LogManager, clean: bool) -> None:
        if clean:
            manager.shutdown()
        else:  # everything is flushed and checkpointed, then the process "dies"
            manager.flush_all()
            for log in manager.logs().values():
                log.close_without_flush()

    def iteration(it: int, ctx: dict) -> None:
        nonlocal model
        wseed = rng.randrange(1 << 30)
        config = dict(CRASH_CONFIG, preallocate=rng.random() < 0.3)
        writer = Writer(log_dir, wseed, config)
        if rng.random() < 0.15:  # kill while the writer loads and recovers the log
            assert writer.opening.wait(60), "writer did not start"
            time.sleep(rng.random() * rng.choice([0.002, 0.03]))  # small logs load in ~1 ms
        else:
            assert writer.started.wait(60), "writer did not start"
            time.sleep(rng.uniform(0, 0.08))
        alive = writer.proc.poll() is None
        rc, err = writer.kill()
        assert alive and rc == -signal.SIGKILL, f"writer exited by itself ({rc}):\n{err}"
        stats["kills"] += 1

        # What the writer told us before it died.
        start, acks = None, []
        for line in writer.lines:
            words = line.split()
            if words[0] == "START":
                start = int(words[1])
                # The parent left a verified, flushed log: the writer's recovery cuts nothing.
                assert int(words[2]) == 0, f"the writer's recovery truncated {words[2]} bytes"
            elif words[0] == "ACK":
                acks.append((int(words[1]), words[2]))
        if start is not None:
            assert start == len(model), f"writer started at {start}, expected {len(model)}"
        else:
            stats["kills before START"] += 1
        durable = max([len(model) - 1] + [a[0] for a in acks])
        stats["acks"] += len(acks)
        ctx.update(writer_seed=wseed, preallocate=config["preallocate"], start=start,
                   acks=len(acks), durable=durable, model=len(model))
        if debug:
            shutil.rmtree(tmp_path / "after-kill", ignore_errors=True)
            shutil.copytree(log_dir, tmp_path / "after-kill")
        # Simulated power loss: the page cache holding the unflushed tail is lost. Only a writer
        # that got as far as START can have written anything (before, the files were all flushed).
        if start is not None and rng.random() < 0.3:
            damage = simulate_power_loss(part_dir, durable, rng)
            ctx["power loss"] = damage
            stats[f"power loss: {damage[0]}"] += 1
        else:
            damage = None

        # Restart as a broker would: LogManager.open, recovery since there is no clean marker.
        manager = LogManager.open(str(log_dir), CRASH_CONFIG, clock)
        if manager.had_clean_shutdown:  # the writer died before it could remove the marker
            assert start is None
        log = manager.get_or_create_log(TOPIC, PARTITION)
        ctx["load report"] = log.load_report
        if damage is not None:  # recovery cut exactly the damaged tail
            _, path, length, valid = damage
            assert log.load_report.truncated_bytes == length - valid
            assert log.segments[-1].log.path == str(path) and log.segments[-1].size == valid
        stats["bytes truncated"] += log.load_report.truncated_bytes
        stats["segments recovered"] += len(log.load_report.recovered_segments)
        stats["indexes rebuilt"] += len(log.load_report.rebuilt_indexes)
        stats["segments removed"] += len(log.load_report.removed_after_corruption)
        check_structure(log)
        records = read_all(log, rng)
        leo = log.log_end_offset
        assert leo >= durable + 1, f"acknowledged offset {durable} lost: LEO {leo}"
        for off in range(len(model)):
            assert digest(off, records[off]) == model[off], f"durable record {off} changed"
        lo = start
        for last, sha in acks:
            h = hashlib.sha256()
            for off in range(lo, last + 1):
                h.update(record_bytes(off, records[off]))
            assert h.hexdigest() == sha, f"acknowledged records {lo}..{last} differ"
            lo = last + 1
        for off in range(len(model), leo):  # survivors, acknowledged or not, are what was written
            assert start is not None
            assert record_bytes(off, records[off]) == record_bytes(off, make_record(wseed, off)), off
        stats["records verified"] += leo
        model.extend(digest(off, records[off]) for off in range(len(model), leo))

        # The recovered log takes appends and survives a reopen.
        pseed = 10**9 + it
        n = rng.randint(1, 4)
        info = log.append([make_record(pseed, leo + i) for i in range(n)])
        assert (info.first_offset, info.last_offset) == (leo, leo + n - 1)
        clean = rng.random() < 0.5
        close(manager, clean)
        manager = LogManager.open(str(log_dir), CRASH_CONFIG, clock)
        assert manager.had_clean_shutdown == clean
        log = manager.get_log(TOPIC, PARTITION)
        assert log.load_report.truncated_bytes == 0, log.load_report.summary()
        assert log.log_end_offset == leo + n
        tail = log.records(leo)
        assert [record_bytes(r.offset, r) for r in tail] == \
            [record_bytes(leo + i, make_record(pseed, leo + i)) for i in range(n)]
        check_structure(log)
        model.extend(digest(r.offset, r) for r in tail)
        close(manager, rng.random() < 0.5)

    for it in range(iterations):
        if it and it % LOG_LIFETIME == 0:
            final_ends.append(len(model))
            log_dir = tmp_path / f"logs-{it // LOG_LIFETIME}"
            part_dir = log_dir / f"{TOPIC}-{PARTITION}"
            model = []
        ctx: dict = {}
        try:
            iteration(it, ctx)
        except Exception as e:
            raise AssertionError(f"crash-loop iteration {it} (seed {seed}, files in "
                                 f"{log_dir}): {ctx}") from e

    elapsed = time.monotonic() - started
    power = {k.split(": ")[1]: v for k, v in stats.items() if k.startswith("power loss")}
    report(capsys, "\n".join([
        f"\n[crash loop] {iterations} iterations, {stats['kills']} SIGKILLs "
        f"({stats['kills before START']} during the writer's load/recovery), "
        f"{stats['acks']} acknowledged fsyncs, {elapsed:.1f}s",
        f"[crash loop] records verified: {stats['records verified']} record checks in total, "
        f"final log end offsets {final_ends + [len(model)]} (logs of {LOG_LIFETIME} kills; every "
        f"record re-checked after every crash)",
        f"[crash loop] recovery: {stats['bytes truncated']} bytes truncated, "
        f"{stats['segments recovered']} segment recoveries, {stats['indexes rebuilt']} index "
        f"rebuilds, {stats['segments removed']} segments removed after damage; "
        f"simulated power losses: {power}"]))
    assert stats["kills"] == iterations
    assert len(model) > 0


# ------------------------------------------------------------------------------ damaged files
SMALL = {"segment.bytes": 1024, "index.interval.bytes": 128}


def build_log(directory: Path, config: dict, n_batches: int, seed: int, clean: bool = True
              ) -> tuple[Log, list[Record]]:
    rng = random.Random(seed)
    clock = ManualClock(T0)
    log = Log.open(str(directory), config, clock)
    for _ in range(n_batches):
        clock.advance(rng.randint(0, 30))
        n = rng.randint(1, 4)
        recs = [Record(f"k{rng.randrange(100)}".encode(), rng.randbytes(rng.randint(0, 90)),
                       clock.milliseconds() + rng.randint(-20, 20)) for _ in range(n)]
        log.append(recs)
    expected = log.records()
    if clean:
        log.close()
    else:
        log.close_without_flush()
    return log, expected


def content(records) -> list[tuple]:
    return [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in records]


def check_lookups(log: Log, expected: list[Record]) -> None:
    """Every offset and timestamp lookup agrees with a brute-force answer."""
    assert log.log_end_offset == len(expected)
    for off in range(len(expected)):
        fetch = log.read(off, 1)
        batches = fetch.batches()
        assert batches and batches[0].base_offset <= off <= batches[0].last_offset
        got = log.read_records(off, 1)
        assert got and content(got[:1]) == content([expected[off]])
    for r in expected:
        target = r.timestamp
        want = next((x for x in expected if x.timestamp >= target), None)
        ans = log.fetch_offset_by_timestamp(target)
        assert ans is not None and ans.offset == want.offset, (target, ans, want.offset)
    assert log.fetch_offset_by_timestamp(max(r.timestamp for r in expected) + 1) is None
    check_structure(log)


def template_log(tmp_path: Path, seed: int = 1, n_batches: int = 60) -> tuple[Path, list[Record],
                                                                            dict[str, bytes]]:
    src = tmp_path / "template" / "flip-0"
    _, expected = build_log(src, SMALL, n_batches, seed)
    files = {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()}
    return src, expected, files


def restore(dest: Path, files: dict[str, bytes]) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name, data in files.items():
        (dest / name).write_bytes(data)


def protected(pos_in_batch: int) -> bool:
    """Bytes a damaged batch is recognised by: the length, magic, CRC and everything the CRC
    covers. baseOffset (0–7) and partitionLeaderEpoch (12–15) are outside the CRC by design."""
    return not (pos_in_batch < 8 or 12 <= pos_in_batch < 16)


def test_byte_flips_keep_exactly_the_batches_before_the_damage(tmp_path):
    src, expected, files = template_log(tmp_path)
    logs = sorted(n for n in files if n.endswith(".log"))
    assert len(logs) >= 5, logs
    layout = {n: raw_batches(files[n]) for n in logs}
    for n in logs:
        assert sum(b[1] for b in layout[n]) == len(files[n])
    rng = random.Random(7)
    dest = tmp_path / "work" / "flip-0"
    trials = 0
    for trial in range(150):
        damaged = dict(files)
        # One to four flips, usually in one segment, sometimes in two.
        chosen = sorted(set(rng.sample(logs, rng.choice([1, 1, 1, 2]))))
        first_bad = {}  # segment -> index of the first damaged batch
        for name in chosen:
            data = bytearray(damaged[name])
            for _ in range(rng.randint(1, 4)):
                while True:
                    pos = rng.randrange(len(data))
                    bi = max(i for i, b in enumerate(layout[name]) if b[0] <= pos)
                    if protected(pos - layout[name][bi][0]):
                        break
                data[pos] ^= rng.randint(1, 255)
                first_bad[name] = min(first_bad.get(name, bi), bi)
            damaged[name] = bytes(data)
        restore(dest, damaged)
        log = Log.open(str(dest), SMALL, ManualClock(T0), recovery_point=0,
                       had_clean_shutdown=False)
        seg_name = chosen[0]
        bi = first_bad[seg_name]
        cut_pos, _, cut_offset, _ = layout[seg_name][bi]
        later = [int(n[:20]) for n in logs if n > seg_name]
        rep = log.load_report
        assert log.log_end_offset == cut_offset, (trial, rep.summary())
        assert content(log.records()) == content(expected[:cut_offset])
        assert rep.truncated_bytes == len(files[seg_name]) - cut_pos, (trial, rep)
        assert sorted(rep.removed_after_corruption) == later, (trial, rep)
        on_disk = [p.name for p in segment_files(dest)]
        assert on_disk == [n for n in logs if n <= seg_name], (trial, on_disk)
        assert all(not (dest / (n[:20] + ext)).exists() for n in logs if n > seg_name
                   for ext in (".index", ".timeindex"))
        check_structure(log)
        # Still a working log: appends continue at the cut, and a reopen keeps them.
        log.append([("after", "flip")])
        log.close()
        log = Log.open(str(dest), SMALL, ManualClock(T0), recovery_point=0,
                       had_clean_shutdown=False)
        assert log.load_report.truncated_bytes == 0
        assert log.log_end_offset == cut_offset + 1
        assert log.read_records(cut_offset)[0].value == b"flip"
        log.close()
        trials += 1
    assert trials == 150


def test_flips_outside_the_crc_never_break_loading(tmp_path):
    """baseOffset and partitionLeaderEpoch are not covered by the CRC (Kafka rewrites them without
    recomputing it). A flip there is not always detectable, but loading must not fail and what is
    readable must be whole, valid batches."""
    src, expected, files = template_log(tmp_path)
    logs = sorted(n for n in files if n.endswith(".log"))
    layout = {n: raw_batches(files[n]) for n in logs}
    rng = random.Random(11)
    dest = tmp_path / "work" / "flip-0"
    for trial in range(80):
        name = rng.choice(logs)
        data = bytearray(files[name])
        pos, size, base, last = rng.choice(layout[name])
        field = rng.choice([range(0, 8), range(12, 16)])
        data[pos + rng.choice(field)] ^= rng.randint(1, 255)
        restore(dest, dict(files, **{name: bytes(data)}))
        log = Log.open(str(dest), SMALL, ManualClock(T0), recovery_point=0,
                       had_clean_shutdown=False)
        for b in log.read(0, 1 << 20).batches():
            b.ensure_valid()
        log.close()


def test_torn_write_at_every_byte_of_the_last_batch(tmp_path):
    src = tmp_path / "torn-0"
    _, expected = build_log(src, {"segment.bytes": 1 << 20, "index.interval.bytes": 64}, 6, seed=3)
    path = segment_files(src)[0]
    original = path.read_bytes()
    batches = raw_batches(original)
    start, size, base, last = batches[-1]
    assert start + size == len(original)
    index_files = {p.name: p.read_bytes() for p in src.iterdir() if p.suffix != ".log"}
    for cut in range(start, start + size + 1):
        path.write_bytes(original[:cut])
        for name, data in index_files.items():
            (src / name).write_bytes(data)
        log = Log.open(str(src), {"index.interval.bytes": 64}, ManualClock(T0),
                       recovery_point=0, had_clean_shutdown=False)
        whole = cut == start + size
        assert log.log_end_offset == (last + 1 if whole else base), cut
        assert log.load_report.truncated_bytes == (0 if whole else cut - start), cut
        assert content(log.records()) == content(expected[:log.log_end_offset])
        assert os.path.getsize(path) == (cut if whole else start)
        check_structure(log)
        log.close_without_flush()


def test_garbage_appended_to_the_active_segment_is_cut(tmp_path):
    rng = random.Random(5)
    for trial in range(30):
        d = tmp_path / f"garbage-{trial}"
        _, expected = build_log(d, SMALL, 25, seed=trial, clean=rng.random() < 0.5)
        path = segment_files(d)[-1]
        size = os.path.getsize(path)
        junk = rng.randbytes(rng.randint(1, 400))
        if rng.random() < 0.3:  # a plausible-looking header with a bogus CRC
            junk = struct.pack(">qiib", len(expected), 100, 0, 2) + junk
        with open(path, "ab") as f:
            f.write(junk)
        log = Log.open(str(d), SMALL, ManualClock(T0), recovery_point=len(expected),
                       had_clean_shutdown=False)
        assert log.load_report.truncated_bytes == len(junk)
        assert os.path.getsize(path) == size
        assert content(log.records()) == content(expected)
        check_structure(log)
        log.append([("k", "v")])
        assert log.records()[-1].offset == len(expected)
        log.close()


def test_zeroed_preallocated_tail_is_cut(tmp_path):
    config = {"segment.bytes": 8192, "index.interval.bytes": 128, "preallocate": True}
    for crash_after in (0, 1, 7, 40):
        d = tmp_path / f"prealloc-{crash_after}"
        clock = ManualClock(T0)
        log = Log.open(str(d), config, clock)
        for i in range(crash_after):
            log.append([(f"k{i}", os.urandom(i % 50)) for _ in range(1 + i % 3)])
            clock.advance(3)
        expected = log.records()
        sizes = [s.size for s in log.segments]
        log.close_without_flush()  # the crash: the active .log still has its zero tail
        files = segment_files(d)
        assert os.path.getsize(files[-1]) == 8192
        log = Log.open(str(d), config, ManualClock(T0), recovery_point=0,
                       had_clean_shutdown=False)
        assert log.load_report.truncated_bytes == 8192 - sizes[-1]
        assert [s.size for s in log.segments] == sizes
        assert os.path.getsize(files[-1]) == sizes[-1]
        assert content(log.records()) == content(expected)
        check_structure(log)
        log.append([("after", "crash")])
        log.close()
        log = Log.open(str(d), config, ManualClock(T0), had_clean_shutdown=True)
        assert log.log_end_offset == len(expected) + 1
        assert content(log.records())[:-1] == content(expected)
        log.close()


@pytest.mark.parametrize("damage", ["corrupt-index", "missing-index", "missing-timeindex",
                                    "missing-both", "truncated-index"])
@pytest.mark.parametrize("clean", [True, False])
def test_damaged_index_files_are_rebuilt(tmp_path, damage, clean):
    src, expected, files = template_log(tmp_path, seed=9)
    logs = sorted(n for n in files if n.endswith(".log"))
    rng = random.Random(f"{damage}-{clean}")
    dest = tmp_path / "work" / "flip-0"
    originals = {}
    for victim in (logs[0], logs[len(logs) // 2], logs[-1]):
        restore(dest, files)
        prefix = victim[:20]
        originals[victim] = (files[prefix + ".index"], files[prefix + ".timeindex"])
        if damage == "corrupt-index":
            (dest / (prefix + ".index")).write_bytes(rng.randbytes(rng.choice([8, 13, 64, 200])))
        elif damage == "truncated-index":
            data = files[prefix + ".index"]
            # torn: not a whole number of entries
            (dest / (prefix + ".index")).write_bytes(data[:-3] if data else b"\0\0\0")
        if damage in ("missing-index", "missing-both"):
            (dest / (prefix + ".index")).unlink()
        if damage in ("missing-timeindex", "missing-both"):
            (dest / (prefix + ".timeindex")).unlink()
        log = Log.open(str(dest), SMALL, ManualClock(T0), recovery_point=len(expected),
                       had_clean_shutdown=clean)
        rep = log.load_report
        assert [b for b, _ in rep.rebuilt_indexes] == [int(prefix)], rep
        assert rep.truncated_bytes == 0
        check_lookups(log, expected)
        seg = next(s for s in log.segments if s.base_offset == int(prefix))
        # The rebuilt indexes equal what the appends and the close wrote (one batch per append).
        assert seg.offset_index.entries_list() == _entries(files[prefix + ".index"], ">ii", 8,
                                                           int(prefix))
        assert seg.time_index.entries_list() == _entries(files[prefix + ".timeindex"], ">qi", 12,
                                                         int(prefix))
        log.close()
        for ext in (".index", ".timeindex"):
            assert (dest / (prefix + ext)).exists()


def _entries(data: bytes, fmt: str, size: int, base: int) -> list[tuple[int, int]]:
    """Entries of an index file as (offset, position) or (timestamp, offset)."""
    out = []
    for i in range(0, len(data) - len(data) % size, size):
        a, b = struct.unpack_from(fmt, data, i)
        out.append((base + a, b) if size == 8 else (a, base + b))
    return out


@pytest.mark.parametrize("advance_ms", [0, 5])
def test_recovery_of_a_segment_appended_across_many_restarts(tmp_path, advance_ms):
    """Each open restarts the bytes-since-last-index-entry count, so a segment written across
    restarts holds fewer index entries than a rebuild computes; with a small segment.index.bytes
    the rebuild must still fit (it may skip entries) instead of failing the load."""
    d = tmp_path / "restarts-0"
    config = {"segment.bytes": 4096, "index.interval.bytes": 100, "segment.index.bytes": 48}
    clock = ManualClock(T0)
    for i in range(60):
        log = Log.open(str(d), config, clock, had_clean_shutdown=True)
        clock.advance(advance_ms)
        log.append([Record(b"k%d" % i, b"x" * 50, clock.milliseconds())])
        log.close()
    log = Log.open(str(d), config, clock, had_clean_shutdown=True)
    expected = log.records()
    log.close_without_flush()
    log = Log.open(str(d), config, clock, recovery_point=0, had_clean_shutdown=False)
    assert log.load_report.truncated_bytes == 0
    assert len(log.load_report.recovered_segments) == log.number_of_segments
    check_lookups(log, expected)
    log.append([("after", "recovery")])
    assert log.read_records(len(expected))[0].value == b"recovery"
    log.close()

"""The writer process of the crash loop in test_crash.py (which also imports its helpers).

Run as `python tests/crash_writer.py LOG_DIR SEED CONFIG_JSON`. It prints `OPENING`, opens the log
directory the way a restarted broker does (`LogManager.open`, which runs recovery when
`.kafka_cleanshutdown` is absent), prints `START <log end offset> <bytes its recovery truncated>`
and then appends batches to `crash-0` forever. Some appends are followed by `log.flush()` and
`manager.checkpoint_recovery_points()`; only after both returned does it print
`ACK <last offset> <sha256>` (the sha covers every record since the previous ACK, or since START).
The parent kills it with SIGKILL at a random moment.

Every record's content is a pure function of (seed, offset), so the parent can check records that
survived without having been acknowledged too. Keep the imports light: the writer is started 200
times per test run.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import sys
import time

TOPIC, PARTITION = "crash", 0
T0 = 1_700_000_000_000


def make_record(seed: int, offset: int):
    """The record the writer with `seed` puts at `offset` (deterministic)."""
    from kstore import Record
    rng = random.Random(seed * 1_000_003 + offset)
    # Timestamps grow about 7 ms per offset with jitter, so they sometimes go backwards.
    ts = T0 + offset * 7 + rng.randint(-40, 40)
    key = None if rng.random() < 0.1 else f"{seed}:{offset}".encode()
    r = rng.random()
    if r < 0.05:
        value = None
    elif r < 0.85:
        value = rng.randbytes(rng.randint(0, 120))
    else:
        value = rng.randbytes(rng.randint(120, 700))
    headers = ()
    if rng.random() < 0.2:
        headers = (("w", str(seed).encode()), ("n", None))
    return Record(key, value, ts, headers)


def record_bytes(offset: int, record) -> bytes:
    """A canonical encoding of a record's content, for digests."""
    parts = [struct.pack(">qq", offset, record.timestamp)]
    for field in (record.key, record.value):
        parts.append(b"\xff" if field is None else struct.pack(">i", len(field)) + field)
    parts.append(struct.pack(">i", len(record.headers)))
    for k, v in record.headers:
        kb = k.encode() if isinstance(k, str) else k
        parts.append(struct.pack(">i", len(kb)) + kb)
        parts.append(b"\xff" if v is None else struct.pack(">i", len(v)) + v)
    return b"".join(parts)


def main(argv: list[str]) -> int:
    log_dir, seed, config = argv[1], int(argv[2]), json.loads(argv[3])
    from kstore import LogManager
    rng = random.Random(seed)
    flush_probability = rng.choice([0.2, 0.5, 0.9])
    sys.stdout.write("OPENING\n")  # the parent may kill us during the load and recovery
    sys.stdout.flush()
    engine = None
    if os.environ.get("KSTORE_MY_ENGINE"):    # test_my_engine: the learner's saved functions run the log
        from kstore.my_engine import use_my_engine
        engine = use_my_engine(os.environ["KSTORE_MY_ENGINE"], quiet=True)
    manager = LogManager.open(log_dir, config)
    if engine is not None:
        sys.stdout.write(f"YOURS-RAN {','.join(sorted(engine.called))}\n")
    log = manager.get_or_create_log(TOPIC, PARTITION)
    out = sys.stdout
    out.write(f"START {log.log_end_offset} {log.load_report.truncated_bytes}\n")
    out.flush()
    sha = hashlib.sha256()
    deadline = time.monotonic() + 20  # the parent kills us long before; never run away
    while time.monotonic() < deadline:
        leo = log.log_end_offset
        n = rng.randint(1, 5)
        records = [make_record(seed, leo + i) for i in range(n)]
        info = log.append(records)
        if info.first_offset != leo or info.last_offset != leo + n - 1:
            raise AssertionError(f"append of {n} at LEO {leo} returned {info}")
        for i, record in enumerate(records):
            sha.update(record_bytes(leo + i, record))
        if rng.random() < flush_probability:
            log.flush()
            manager.checkpoint_recovery_points()
            # Only now is the data on disk: acknowledge it.
            out.write(f"ACK {info.last_offset} {sha.hexdigest()}\n")
            out.flush()
            sha = hashlib.sha256()
        if rng.random() < 0.3:
            time.sleep(rng.random() * 0.002)
    time.sleep(60)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

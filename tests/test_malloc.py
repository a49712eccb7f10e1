"""kstore.malloc: a Spark Python worker and `kstore serve` keep their freed buffers (glibc's mallopt).

Each case runs in a fresh Python process: the setting is process-wide and set once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not hasattr(os, "confstr") or not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"),
    reason="kstore.malloc tunes glibc's malloc only; this machine's C library is not glibc")

# Reads the same 240,100 records (~28 MB of segments: several 8 MiB chunks) three times, as a
# reader task does, and reports the minor page faults of the last read.
READER = textwrap.dedent("""
    import json, resource, sys
    from kstore.broker import Broker
    from kstore.records import Record, build_batch
    from kstore.spark.backends import LogDirBackend
    from kstore.malloc import keep_freed_buffers
    log_dir = sys.argv[1]
    with Broker(log_dir) as broker:
        broker.create_topic("t", 1)
        for first in range(0, 240_100, 140):
            broker.produce("t", 0, build_batch([Record(b"key-%03d" % (i % 100), b"v" * 100, 0)
                                                for i in range(first, first + 140)]))
    tuned = keep_freed_buffers()
    backend = LogDirBackend(log_dir)

    def read():
        batches = backend.read_arrow("t", 0, 0, 1 << 62, False, columns=["key"])
        return sum(b.num_rows for b in batches)

    read(); read()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    rows = read()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    print(json.dumps({"tuned": tuned, "rows": rows, "faults": faults}))
""")


def environment(**env) -> dict:
    """This environment without malloc settings, plus `env`."""
    return {**{k: v for k, v in os.environ.items()
               if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                            "KSTORE_KEEP_FREED_BUFFERS")}, **env}


def python(args: list[str], **env) -> str:
    """stdout of a fresh Python process, in environment(**env)."""
    out = subprocess.run([sys.executable, *args], env=environment(**env), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_reader_that_keeps_its_freed_buffers_reads_again_without_page_faults(tmp_path):
    script = tmp_path / "reader.py"
    script.write_text(READER)
    result = json.loads(python([str(script), str(tmp_path / "logs")]).strip().splitlines()[-1])
    assert result["tuned"] is True and result["rows"] == 240_100
    # Read into fresh memory, the same read took 9,543 faults of 4 KiB (KSTORE_KEEP_FREED_BUFFERS=0,
    # glibc 2.36); reused memory takes none (at most a few for Python's own small allocations).
    assert result["faults"] < 300, result


# Asks twice in one process: the answer is worked out once and kept.
ASK = ("import kstore.malloc as m; "
       "print(m.keep_freed_buffers(), m.keep_freed_buffers(), m._done)")


def test_it_is_set_once_per_process():
    assert python(["-c", ASK]).split() == ["True", "True", "True"]


@pytest.mark.parametrize("env", [{"KSTORE_KEEP_FREED_BUFFERS": "0"},
                                 {"MALLOC_TRIM_THRESHOLD_": "1000000"},
                                 {"MALLOC_MMAP_THRESHOLD_": "1000000"}])
def test_the_users_own_setting_wins(env):
    assert python(["-c", ASK], **env).split() == ["False", "False", "False"]


def broker_faults(tmp_path, **env) -> int:
    """Minor page faults of a `kstore serve` process while it takes the second half of 48 Produce
    requests of 30 KB to 1 MB, from two connections in turn (as two Spark tasks send theirs),
    sent by kstore's own client."""
    from helpers import serve_log_dir
    from kstore.broker import Broker
    from kstore.records import Record, build_batch
    from kstore.remote_broker import RemoteBroker
    log_dir = tmp_path / "served"
    with Broker(str(log_dir)) as b:
        b.create_topic("t", 4)
    proc, address = serve_log_dir(log_dir, env=environment(**env))

    def faults() -> int:
        with open(f"/proc/{proc.pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[7])
    try:
        batches = [build_batch([Record(b"k", b"v" * 100, 0) for _ in range(n)])
                   for n in (1700, 300, 900, 2500)]
        with RemoteBroker(address) as one, RemoteBroker(address) as other:
            for i in range(48):
                if i == 24:
                    before = faults()
                (one if i % 2 else other).produce_many(
                    [("t", p, batches[(i + p) % 4]) for p in range(1 + i % 4)], acks=1)
            return faults() - before
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc/<pid>/stat")
def test_kstore_serve_receives_big_requests_into_reused_memory(tmp_path):
    kept = broker_faults(tmp_path / "kept")
    fresh = broker_faults(tmp_path / "fresh", KSTORE_KEEP_FREED_BUFFERS="0")
    # glibc 2.36: 1,512 faults with the setting off (mixed sizes make malloc unmap and trim),
    # none with it
    assert kept < 300 and fresh > 1000, (kept, fresh)

"""What a Kafka developer met when poking `kstore serve` with real clients in their default
modes, each fixed and kept fixed here (the larger findings have their own files, e.g.
tests/test_admin_change_apis.py)."""

from __future__ import annotations

import re
import select
import signal
import subprocess
import sys
import time

import confluent_kafka as ck
import pytest

from test_clients import ROOT

pytestmark = pytest.mark.timeout(60)


def test_serve_on_port_0_prints_the_port_it_listens_on(tmp_path):
    """`--port 0` (any free port, the usual way to avoid clashes) printed `on 127.0.0.1:0`, leaving
    no way to connect; the line now names the bound port, and a client reaches the broker there."""
    proc = subprocess.Popen([sys.executable, "-m", "kstore", "serve", "--log-dir", str(tmp_path / "logs"),
                             "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        line, deadline = "", time.monotonic() + 30
        while "serving" not in line and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1)
            if ready:
                line = proc.stdout.readline()
        port = int(re.search(r" on 127\.0\.0\.1:(\d+) ", line).group(1))
        assert port != 0, line
        producer = ck.Producer({"bootstrap.servers": f"127.0.0.1:{port}"})
        producer.produce("t", value=b"v")
        assert producer.flush(15) == 0
        assert "t" in producer.list_topics(timeout=10).topics
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0

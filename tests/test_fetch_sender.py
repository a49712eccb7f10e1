"""The seam chapter 12's capstone plugs into: `KafkaServer(fetch_sender=...)` (or
`live.fetch_serving`, which `kstore serve --my-engine` uses) sends every Fetch response's file
slice with a given function, and real kafka-python clients read through it."""

from __future__ import annotations

import os

import pytest

from kstore.grading import live
from kstore.server import KafkaServer

pytestmark = pytest.mark.timeout(120)


def serve_fetch(sock, file_fd, start, end):
    sent = 0
    while sent < end - start:
        n = os.sendfile(sock.fileno(), file_fd, start + sent, end - start - sent)
        if n == 0:
            break
        sent += n
    return sent


def test_a_plugged_fetch_sender_serves_a_kafka_python_consumer_and_is_unplugged_after(tmp_path):
    seen = []

    def counting(sock, file_fd, start, end):
        seen.append(sock.getblocking())        # the plugged function gets a plain blocking socket
        return serve_fetch(sock, file_fd, start, end)

    with live.plug(live.fetch_serving(counting)):
        assert KafkaServer.fetch_sender is not None
        run = live.kafka_python_through(None, str(tmp_path), records=150)   # KafkaServer's own
    assert KafkaServer.fetch_sender is None
    assert run.consumed == run.produced and run.error is None
    assert len(seen) > 3 and all(seen)          # 2 KiB fetches: several slices, each sent by `counting`


def test_a_failing_fetch_sender_closes_its_connection_and_is_named(tmp_path):
    def broken(sock, file_fd, start, end):
        raise ValueError("no range today")

    run = live.kafka_python_through(broken, str(tmp_path), records=20, timeout_s=5)
    assert run.consumed == []
    assert "serve_fetch raised ValueError: no range today" in run.summary()

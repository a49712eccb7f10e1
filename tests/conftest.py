"""Shared fixtures: a manual clock, fresh partition directories, copies of real Kafka log dirs."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from helpers import KAFKA_LOGS, T0
from kstore import Log, LogConfig, ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def kafka_logs(tmp_path: Path) -> Path:
    """A writable copy of the log directories a real Kafka broker wrote."""
    dest = tmp_path / "kafka-kraft-logs"
    shutil.copytree(KAFKA_LOGS, dest)
    for root, dirs, files in os.walk(dest):
        for name in dirs + files:
            p = os.path.join(root, name)
            os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR)
    os.chmod(dest, os.stat(dest).st_mode | stat.S_IWUSR)
    return dest


@pytest.fixture
def make_log(tmp_path: Path, clock: ManualClock):
    """Open (or reopen) a log `<tmp>/topic-0` with the given config overrides."""
    opened: list[Log] = []

    def make(config: dict | None = None, name: str = "topic-0", **kwargs) -> Log:
        log = Log.open(str(tmp_path / name), LogConfig(config or {}), clock, **kwargs)
        opened.append(log)
        return log

    yield make
    for log in opened:
        if not log.closed:
            log.close_without_flush()

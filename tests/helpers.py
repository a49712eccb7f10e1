"""Small helpers shared by the test modules (import as `from helpers import ...`)."""

from __future__ import annotations

from pathlib import Path

from kstore import Record

FIXTURES = Path(__file__).parent / "fixtures"
KAFKA_LOGS = FIXTURES / "kafka-kraft-logs"
T0 = 1_700_000_000_000


def records(n: int, start: int = 0, size: int = 10, ts: int = T0) -> list[Record]:
    """n keyed records k<start>..; value = a letter repeated `size` times; timestamps ts+i."""
    return [Record(f"k{i}".encode(), bytes([65 + i % 26]) * size, ts + i)
            for i in range(start, start + n)]

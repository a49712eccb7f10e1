"""How many connections the broker holds, per client address and in all.

Mirrors Kafka's `ConnectionQuotas` (in `SocketServer`) with its two limits:
* `max.connections.per.ip` (and `max.connections.per.ip.overrides`, "host:count,..."): a new
  connection from an address that already holds its maximum is closed at once (Kafka logs
  "Rejected connection from ..." and the client sees the socket close);
* `max.connections`: when the broker holds that many, the acceptor stops accepting until one
  closes; new clients wait in the listen backlog meanwhile (Kafka's `waitForConnectionSlot`).
Pure bookkeeping: the server asks, this class counts.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from .errors import ConfigError


def parse_overrides(text: str) -> dict[str, int]:
    """`max.connections.per.ip.overrides`: comma-separated `host:count` pairs."""
    overrides = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, count = item.rpartition(":")
        if not sep or not host or not count.strip().isdigit():
            raise ConfigError(f"Invalid value {text!r} for configuration "
                              f"max.connections.per.ip.overrides: expected host:count pairs")
        overrides[host.strip()] = int(count)
    return overrides


class TooManyConnectionsError(Exception):
    """Kafka's TooManyConnectionsException: this address holds its maximum already."""


class ConnectionQuotas:
    def __init__(self, max_connections: int, max_per_ip: int, overrides: dict[str, int] | None = None):
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.overrides = dict(overrides or {})
        self.per_ip: Counter[str] = Counter()
        self.total = 0
        self._slot_freed: asyncio.Event | None = None

    @classmethod
    def from_config(cls, config) -> "ConnectionQuotas":
        return cls(config["max.connections"], config["max.connections.per.ip"],
                   parse_overrides(config["max.connections.per.ip.overrides"]))

    def limit_for(self, ip: str) -> int:
        return self.overrides.get(ip, self.max_per_ip)

    def inc(self, ip: str) -> None:
        """Count a new connection, or raise TooManyConnectionsError (then close it)."""
        limit = self.limit_for(ip)
        if self.per_ip[ip] >= limit:
            raise TooManyConnectionsError(
                f"Rejected connection from {ip}, address already has the configured maximum of "
                f"{limit} connections.")
        self.per_ip[ip] += 1
        self.total += 1

    def dec(self, ip: str) -> None:
        self.per_ip[ip] -= 1
        if self.per_ip[ip] <= 0:
            del self.per_ip[ip]
        self.total -= 1
        if self._slot_freed is not None:
            self._slot_freed.set()

    def at_max_connections(self) -> bool:
        return self.total >= self.max_connections

    async def wait_for_slot(self) -> None:
        """Block the acceptor while the broker holds max.connections (Kafka does the same)."""
        while self.at_max_connections():
            self._slot_freed = self._slot_freed or asyncio.Event()
            self._slot_freed.clear()
            await self._slot_freed.wait()

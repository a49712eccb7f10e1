"""A Kafka-protocol proxy on loopback that loses Produce responses after the broker appended, for
the tests of idempotent producers (tests/test_idempotence.py) and of the Spark sink
(tests/test_spark.py)."""

from __future__ import annotations

import asyncio
import struct
import threading

from kstore import protocol as P

API = P.API_KEYS


class DroppingProxy:
    """A loopback TCP proxy in front of brokers, on asyncio in its own thread. It forwards Kafka
    frames both ways, points the broker addresses in Metadata and FindCoordinator responses at
    itself (so clients keep coming through it), and for every `drop_every`-th Produce response
    (up to `max_drops`) closes the client's connection instead of forwarding the response: the
    broker has appended, the client never hears so and retries."""

    def __init__(self, drop_every: int = 3, max_drops: int = 20):
        self.drop_every, self.max_drops = drop_every, max_drops
        self.produce_responses = self.dropped = 0
        self._routes: dict[int, int] = {}            # broker port -> proxy listening socket port
        self._listeners = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def add(self, broker_port: int) -> int:
        """Listen for one broker; returns the proxy's port for it."""
        async def listen():
            server = await asyncio.start_server(
                lambda r, w: self._serve(r, w, broker_port), "127.0.0.1", 0)
            self._listeners.append(server)
            return server.sockets[0].getsockname()[1]
        port = asyncio.run_coroutine_threadsafe(listen(), self._loop).result(10)
        self._routes[broker_port] = port
        return port

    def close(self) -> None:
        async def stop():
            for server in self._listeners:
                server.close()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _serve(self, client_r, client_w, broker_port: int) -> None:
        try:
            broker_r, broker_w = await asyncio.open_connection("127.0.0.1", broker_port)
        except OSError:
            client_w.close()
            return
        requests: dict[int, tuple[int, int]] = {}
        up = asyncio.ensure_future(self._requests(client_r, broker_w, requests))
        down = asyncio.ensure_future(self._responses(broker_r, client_w, requests))
        await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        for task in (up, down):
            task.cancel()
        for writer in (client_w, broker_w):
            writer.close()

    @staticmethod
    async def _frame(reader) -> bytes:
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        return await reader.readexactly(size)

    async def _requests(self, client_r, broker_w, requests) -> None:
        while True:
            frame = await self._frame(client_r)
            key, version, correlation = struct.unpack_from(">hhi", frame, 0)
            requests[correlation] = (key, version)
            broker_w.write(struct.pack(">i", len(frame)) + frame)
            await broker_w.drain()

    async def _responses(self, broker_r, client_w, requests) -> None:
        while True:
            frame = await self._frame(broker_r)
            (correlation,) = struct.unpack_from(">i", frame, 0)
            key, version = requests.pop(correlation)
            if key == API["Produce"]:
                self.produce_responses += 1
                if self.produce_responses % self.drop_every == 1 and self.dropped < self.max_drops:
                    self.dropped += 1
                    return                           # the response is lost: close the connection
            elif key in (API["Metadata"], API["FindCoordinator"]):
                frame = self._rewrite(key, version, frame)
            client_w.write(struct.pack(">i", len(frame)) + frame)
            await client_w.drain()

    def _rewrite(self, key: int, version: int, frame: bytes) -> bytes:
        correlation, body = P.decode_response(key, version, frame)
        if key == API["Metadata"]:
            for b in body["brokers"]:
                b["port"] = self._routes.get(b["port"], b["port"])
        elif body.get("port", -1) >= 0:
            body["port"] = self._routes.get(body["port"], body["port"])
        return b"".join(P.encode_response(key, version, correlation, body))

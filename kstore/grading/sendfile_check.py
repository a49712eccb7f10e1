"""What the zero-copy tests (exercises 11 and 12) run the learner's sending function on: a file
holding known bytes, one end of a socketpair, and `os.sendfile` counted (and, as a socket with a
full send buffer would, made to send at most `cap` bytes a call); the other end's bytes collected."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from typing import Any, Callable


def serve_through_socketpair(send: Callable[[socket.socket, int], Any], data: bytes,
                             cap: int | None = None) -> tuple[Any, bytes, dict[str, int]]:
    """`send(sock, file_fd)` → (what it returned, the bytes the peer received, sendfile counts)."""
    calls = {"sendfile": 0, "bytes": 0}
    real = os.sendfile

    def sendfile(out_fd, in_fd, offset, n, *args, **kwargs):
        calls["sendfile"] += 1
        sent = real(out_fd, in_fd, offset, min(n, cap) if cap else n, *args, **kwargs)
        calls["bytes"] += sent
        return sent

    received: list[bytes] = []
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.flush()
        a, b = socket.socketpair()
        reader = threading.Thread(target=lambda: received.extend(iter(lambda: b.recv(65536), b"")), daemon=True)
        reader.start()
        os.sendfile = sendfile
        try:
            result = send(a, f.fileno())
        finally:
            os.sendfile = real
            try:
                a.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            a.close()
            reader.join(10)
            b.close()
    return result, b"".join(received), calls

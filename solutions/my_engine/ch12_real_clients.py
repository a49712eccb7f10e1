"""Chapter 12 — Capstone: your code serves real Kafka clients: my passing functions (serve_fetch).

Written by kstore.my_engine.save("ex12"); a new save replaces this file.
"""

import os

SAVED = ('serve_fetch',)    # the functions whose tests passed: the engine plugs in these


def serve_fetch(sock, file_fd, start, end):
    sent, count = 0, max(0, end - start)
    while sent < count:
        n = os.sendfile(sock.fileno(), file_fd, start + sent, count - sent)
        if n == 0:
            break
        sent += n
    return sent

"""Zero-copy view: read()+send() against sendfile(), drawn and measured on this machine.

Shows the two data paths a broker can use to send log bytes to a consumer — copy through user
space (`read` into a buffer, then `send` it) or let the kernel move page-cache pages to the socket
(`os.sendfile`, Kafka's `FileChannel.transferTo`) — with the copies and user/kernel switches each
one costs, and the numbers measured here: the same file sent over a loopback TCP connection both
ways, timed, with the sending thread's system calls, CPU time (user and system) and context
switches (`getrusage(RUSAGE_THREAD)`).

Engine state read: a segment file (`Log.active_segment.log.path`, or any path) when one is given
and large enough; otherwise a scratch file of the requested size, deleted afterwards.
"""

from __future__ import annotations

import os
import resource
import socket
import tempfile
import threading
import time

from ._base import (WidgetView, attrs, esc, figure_png, fmt_bytes, style, table)

ZC_CSS = """
.ks-zc .ks-paths{display:flex;gap:30px;}
.ks-zc .ks-path{min-width:280px;}
.ks-zc .ks-box{display:inline-block;border:1px solid #555;border-radius:3px;padding:2px 6px;margin:2px;background:#f1f3f5;}
.ks-zc .ks-user{background:#ffe5ec;}
.ks-zc .ks-arrow{font-size:11px;color:#555;margin:0 2px;}
.ks-zc .ks-cpu{color:#c1121f;font-weight:bold;}
"""

CHUNK = 64 * 1024


def _loopback_pair() -> tuple[socket.socket, socket.socket]:
    """A connected TCP pair on 127.0.0.1 (what a consumer on the same host would use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
    return peer, client


def _drain(sock: socket.socket, total: int, out: dict) -> None:
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    got = 0
    while got < total:
        n = sock.recv_into(view)
        if n == 0:
            break
        got += n
    out["received"] = got


def _usage() -> resource.struct_rusage:
    return resource.getrusage(resource.RUSAGE_THREAD)


def _send_copy(fd: int, sock: socket.socket, size: int, chunk: int) -> int:
    """read() a chunk into a Python buffer, send() it; return the system calls made."""
    calls, offset = 0, 0
    while offset < size:
        data = os.pread(fd, min(chunk, size - offset), offset)
        calls += 1
        view = memoryview(data)
        while view:
            n = sock.send(view)
            calls += 1
            view = view[n:]
        offset += len(data)
    return calls


def _send_zero_copy(fd: int, sock: socket.socket, size: int, chunk: int | None = None) -> int:
    """os.sendfile(): the kernel moves page-cache pages to the socket; return the calls made."""
    calls, offset = 0, 0
    while offset < size:
        n = os.sendfile(sock.fileno(), fd, offset, (size - offset) if chunk is None else
                        min(chunk, size - offset))
        calls += 1
        if n == 0:
            break
        offset += n
    return calls


def _one_run(path: str, size: int, method: str, chunk: int) -> dict:
    sender, receiver = _loopback_pair()
    out: dict = {}
    reader = threading.Thread(target=_drain, args=(receiver, size, out), daemon=True)
    reader.start()
    fd = os.open(path, os.O_RDONLY)
    try:
        u0, t0 = _usage(), time.perf_counter()
        if method == "read+send":
            calls = _send_copy(fd, sender, size, chunk)
        else:                       # as Kafka's transferTo: ask for the rest, the kernel decides
            calls = _send_zero_copy(fd, sender, size)
        sender.shutdown(socket.SHUT_WR)
        reader.join(60)
        t1, u1 = time.perf_counter(), _usage()
    finally:
        os.close(fd)
        sender.close()
        receiver.close()
    if out.get("received") != size:
        raise RuntimeError(f"{method}: the receiver got {out.get('received')} of {size} bytes")
    return {"seconds": t1 - t0, "syscalls": calls,
            "user_cpu_s": u1.ru_utime - u0.ru_utime, "system_cpu_s": u1.ru_stime - u0.ru_stime,
            "voluntary_ctx_switches": u1.ru_nvcsw - u0.ru_nvcsw,
            "involuntary_ctx_switches": u1.ru_nivcsw - u0.ru_nivcsw}


def measure_transfer(size_bytes: int = 32 * 1024 * 1024, *, path: str | None = None,
                     chunk: int = CHUNK, repeats: int = 3, on_run=None) -> dict:
    """Send the same bytes over loopback TCP with read()+send() and with sendfile(); best of
    `repeats` runs each. Uses `path` (e.g. a segment) if it holds at least `size_bytes`, else a
    scratch file. The page cache is warmed first, so neither path reads the disk. `on_run()` is
    called after each of the 2 × `repeats` runs (a progress bar)."""
    scratch = None
    if path is None or os.path.getsize(path) < size_bytes:
        fd, scratch = tempfile.mkstemp(prefix="kstore-zerocopy-")
        with os.fdopen(fd, "wb") as f:
            block = os.urandom(1 << 20)
            for _ in range(-(-size_bytes // len(block))):
                f.write(block)
        path = scratch
    try:
        with open(path, "rb") as f:                    # warm the page cache
            while f.read(1 << 22):
                pass
        results = {}
        for method in ("read+send", "sendfile"):
            runs = []
            for _ in range(repeats):
                runs.append(_one_run(path, size_bytes, method, chunk))
                if on_run is not None:
                    on_run()
            best = min(runs, key=lambda r: r["seconds"])
            best["MB_per_s"] = size_bytes / best["seconds"] / 1e6
            best["bytes_through_user_space"] = size_bytes if method == "read+send" else 0
            best["user_kernel_switches"] = 2 * best["syscalls"]
            best["runs"] = len(runs)
            results[method] = best
        cpu = {n: r["user_cpu_s"] + r["system_cpu_s"] for n, r in results.items()}
        return {"bytes": size_bytes, "chunk": chunk, "file": None if scratch else path,
                "results": results,
                "speedup": results["sendfile"]["MB_per_s"] / results["read+send"]["MB_per_s"],
                "cpu_saving": cpu["read+send"] / cpu["sendfile"] if cpu["sendfile"] > 0 else None}
    finally:
        if scratch:
            os.remove(scratch)


# How each path moves one chunk (textbook Linux with a NIC and a cold page cache).
THEORY = {
    "read+send": {"copies": 4, "cpu_copies": 2, "switches_per_chunk": 4,
                  "steps": [("disk", "DMA"), ("page cache", "CPU copy"), ("user buffer", "CPU copy"),
                            ("socket buffer", "DMA"), ("NIC", None)]},
    "sendfile": {"copies": 3, "cpu_copies": 1, "switches_per_chunk": 2,
                 "steps": [("disk", "DMA"), ("page cache", "CPU copy (none with SG-DMA)"),
                           ("socket buffer", "DMA"), ("NIC", None)]},
}


class ZeroCopyModel:
    """Holds the latest measurement and renders the two paths with their numbers."""

    def __init__(self, source=None, size_bytes: int = 32 * 1024 * 1024):
        self.path = None
        if source is not None:
            self.path = source.active_segment.log.path if hasattr(source, "active_segment") else str(source)
        self.size_bytes = size_bytes
        self.measurement: dict | None = None
        self._listeners: list = []

    def on_change(self, listener) -> None:
        self._listeners.append(listener)

    def measure(self, size_bytes: int | None = None, repeats: int = 3, on_run=None) -> dict:
        self.size_bytes = size_bytes or self.size_bytes
        self.measurement = measure_transfer(self.size_bytes, path=self.path, repeats=repeats,
                                            on_run=on_run)
        for listener in self._listeners:
            listener(self, None)
        return self.measurement

    def figure(self):
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7, 2.6))
        if not self.measurement:
            return fig
        res = self.measurement["results"]
        names = list(res)
        colours = ["#e5989b", "#95d5b2"]
        for k, (key, label) in enumerate([("MB_per_s", "throughput MB/s"),
                                          ("cpu_ms", "sender CPU ms: user + system"),
                                          ("syscalls", "system calls")]):
            ax = fig.add_subplot(1, 3, k + 1)
            if key == "cpu_ms":     # where the CPU goes: the copy through user space vs the kernel
                user = [res[n]["user_cpu_s"] * 1000 for n in names]
                system = [res[n]["system_cpu_s"] * 1000 for n in names]
                ax.bar(names, user, color="#f4a261", label="user")
                ax.bar(names, system, bottom=user, color="#457b9d", label="system")
                ax.legend(fontsize=7)
            else:
                ax.bar(names, [res[n][key] for n in names], color=colours)
            ax.set_title(label, fontsize=9)
            ax.tick_params(labelsize=8)
        fig.tight_layout()
        return fig

    def png(self) -> bytes:
        return figure_png(self.figure())

    def _path_html(self, method: str) -> str:
        t = THEORY[method]
        parts = []
        for name, how in t["steps"]:
            cls = "ks-box ks-user" if name == "user buffer" else "ks-box"
            parts.append(f"<span class='{cls}'>{esc(name)}</span>")
            if how:
                c = "ks-arrow ks-cpu" if how == "CPU copy" else "ks-arrow"
                parts.append(f"<span class='{c}'>→ {esc(how)} →</span>")
        calls = "read(), send()" if method == "read+send" else "sendfile()"
        return (f"<div class='ks-path'><h4>{esc(method)}: {calls}</h4>{''.join(parts)}"
                f"<p class='ks-note'>{t['copies']} copies per chunk ({t['cpu_copies']} by the CPU), "
                f"{t['switches_per_chunk']} user↔kernel switches per chunk</p></div>")

    def render_html(self) -> str:
        m = self.measurement
        if m:
            res = m["results"]
            cpu_text = (f", sender CPU time <b>{m['cpu_saving']:.1f}× less</b>"
                        if m.get("cpu_saving") else "")
            rows = [[n, f"{r['MB_per_s']:.0f}", f"{r['seconds'] * 1000:.1f}", r["syscalls"],
                     r["user_kernel_switches"], f"{r['user_cpu_s'] * 1000:.1f}",
                     f"{r['system_cpu_s'] * 1000:.1f}", r["voluntary_ctx_switches"],
                     r["involuntary_ctx_switches"], fmt_bytes(r["bytes_through_user_space"])]
                    for n, r in res.items()]
            numbers = (f"<h4>measured here: {fmt_bytes(m['bytes'])} over loopback TCP, best of "
                       f"{res['sendfile']['runs']} runs; read+send in {m['chunk'] // 1024} KiB chunks, "
                       f"sendfile asked for the rest of the file each call</h4>" +
                       table(["path", "MB/s", "ms", "system calls", "user↔kernel switches",
                              "user CPU ms", "system CPU ms", "voluntary ctx switches",
                              "involuntary ctx switches", "through user space"], rows) +
                       f"<p class='ks-note'>sendfile ÷ read+send: throughput <b>{m['speedup']:.2f}×</b>"
                       f"{cpu_text}. Loopback has no NIC and the page cache is warm, so no DMA copy "
                       f"happens here; what sendfile saves is the copy through a user-space buffer "
                       f"and {_fewer_calls(res)} — the sender's CPU time. The throughput over "
                       f"loopback is also bound by the receiving side (a Python thread copying "
                       f"into its buffer), so it need not follow the CPU saving; numbers vary from "
                       f"run to run on a shared machine.</p>")
        else:
            numbers = "<p class='ks-note'>Not measured yet: press Measure.</p>"
        return (style(ZC_CSS) +
                f'<div class="ks-view ks-zc"{attrs(data_measured=str(bool(m)).lower())}>'
                f"<div class='ks-paths'>{self._path_html('read+send')}{self._path_html('sendfile')}"
                f"</div>{numbers}</div>")


def _fewer_calls(res: dict) -> str:
    """The measured system-call saving in words: '4096 → 1 system calls (4096× fewer)'."""
    copy, zero = res["read+send"]["syscalls"], res["sendfile"]["syscalls"]
    ratio = copy / zero if zero else float("inf")
    return f"system calls, {copy} → {zero} ({ratio:.0f}× fewer)"


class ZeroCopyView(WidgetView):
    """The zero-copy view as a widget: size chooser, Measure button, diagram, numbers, chart."""

    def __init__(self, source=None, size_bytes: int = 32 * 1024 * 1024, measure: bool = False):
        import ipywidgets as W

        self.model = source if isinstance(source, ZeroCopyModel) else ZeroCopyModel(source, size_bytes)
        m = self.model
        sizes = [("8 MiB", 8 << 20), ("32 MiB", 32 << 20), ("128 MiB", 128 << 20)]
        if m.size_bytes not in [v for _, v in sizes]:   # measure what was asked for, not 8 MiB
            sizes = sorted(sizes + [(fmt_bytes(m.size_bytes), m.size_bytes)], key=lambda s: s[1])
        self.size = W.Dropdown(options=sizes, value=m.size_bytes, description="bytes")
        self.button = W.Button(description="Measure", tooltip="send the bytes both ways now")
        self.button.add_class("ks-zc-measure")
        self.html = W.HTML()
        self.image = W.Image(format="png", layout=W.Layout(width="620px"))
        self.button.on_click(lambda _: self._measure())
        self.widget = W.VBox([W.HBox([self.size, self.button]), self.html, self.image])
        self.widget.add_class("kstore-zerocopy")
        self.start_timeline(min_interval=0)
        if measure:
            self._measure()

    def _measure(self) -> None:
        self.button.disabled = True
        self.button.description = "measuring…"
        from .progress import ProgressBar
        bar = ProgressBar(6, f"sending {fmt_bytes(self.size.value)} both ways, 3 runs each", "runs")
        try:
            self.model.measure(self.size.value, on_run=bar.update)
            bar.finish()
        except BaseException as e:
            bar.finish(e)
            raise
        finally:
            self.button.disabled = False
            self.button.description = "Measure"

    frame_parts = ("html", "image")

    def render_frame(self) -> dict:
        return {"html": self.model.render_html(),
                "image": self.model.png() if self.model.measurement else b""}

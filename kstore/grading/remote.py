"""The harness's side of the learner's process (`kstore.grading.sandbox`): start it (confined when
the platform allows), run the notebook's cells in it, call the learner's functions across the
socket, serve what the learner's code asks of the objects a test passed, and start a fresh process
when one dies.

Every answer from the learner is plain data (`kstore.grading.wire`), so nothing the learner's code
does reaches the tests' own objects; the scores are computed here, from the tests' outcomes.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable

from . import wire
from .exercises import FUNCTION_TASK, ROOT


STOPPED = "stopped by the grader"   # how a learner process ends when a test's time limit ends it


class LearnerDied(BaseException):
    """The learner's process ended (exit, crash, kill) or broke the protocol while a test used it.
    A BaseException: no `except Exception` in a test may mistake it for the learner's answer."""

    def __init__(self, how: str):
        super().__init__(how)
        self.how = how


@dataclass
class Options:
    cell_timeout: float = 60.0
    memory_mb: int = 2048
    file_mb: int = 512
    max_output: int = 65536
    scratch: str = "/tmp/kstore-learner"      # the learner's working directory
    hide: list[str] = field(default_factory=list)
    keep: list[str] = field(default_factory=list)
    confine: bool | None = None               # None: when root and `unshare` is there
    call_timeout: float = 30.0                # one call from a thread other than the main one


_CAN_CONFINE: bool | None = None


def can_confine() -> bool:
    """Linux, root, `unshare` installed, and the namespaces really work here (a container may
    refuse them): tried once per process."""
    global _CAN_CONFINE
    if _CAN_CONFINE is None:
        _CAN_CONFINE = False
        if sys.platform.startswith("linux") and os.geteuid() == 0 and shutil.which("unshare"):
            try:
                _CAN_CONFINE = subprocess.run(
                    ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--ipc",
                     "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    timeout=10).returncode == 0
            except (OSError, subprocess.SubprocessError):
                _CAN_CONFINE = False
    return _CAN_CONFINE


def default_hidden(extra: list[str] = ()) -> list[str]:
    """The repository's solutions/, tests/ and git history (a worktree's common .git too)."""
    hidden = [str(ROOT / "solutions"), str(ROOT / "tests"), str(ROOT / ".git"), *extra]
    git = ROOT / ".git"
    if git.is_file():
        try:
            line = git.read_text(encoding="utf-8").strip()
            if line.startswith("gitdir:"):
                common = (ROOT / line[7:].strip()).resolve().parents[1]
                hidden += [str(common), str(common.parent / "solutions"), str(common.parent / "tests")]
        except (OSError, IndexError):
            pass
    return hidden


_MODULE_OR_CLASS = (types.ModuleType, type)


class LearnerProcess:
    """One learner process and its socket."""

    def __init__(self, options: Options):
        self.o = options
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.status_r: int | None = None
        self.report: dict = {}
        self.objects: list[Any] = []
        self.handles: dict[int, int] = {}
        self.fds: set[int] = set()
        self.task_id: str | None = None
        self.dead: str | None = None

    # ---- life
    def start(self) -> None:
        o = self.o
        confine = can_confine() if o.confine is None else o.confine
        parent, child = socket.socketpair()
        status_r, status_w = os.pipe()
        cmd = [sys.executable, "-m", "kstore.grading.sandbox", "--fd", str(child.fileno()),
               "--status-fd", str(status_w), "--scratch", o.scratch, "--memory-mb", str(o.memory_mb),
               "--file-mb", str(o.file_mb), "--max-output", str(o.max_output)]
        for h in o.hide:
            cmd += ["--hide", h]
        for k in o.keep:
            cmd += ["--keep", k]
        if confine:
            cmd = ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--ipc",
                   *cmd, "--confine"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONSAFEPATH": "1"}
        if os.environ.get("KSTORE_SANDBOX_DEBUG_FD"):
            env["KSTORE_SANDBOX_DEBUG_FD"] = "2"
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        self.proc = subprocess.Popen(cmd, pass_fds=(child.fileno(), status_w), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                     cwd="/", start_new_session=not confine)
        child.close()
        os.close(status_w)
        self.sock, self.status_r = parent, status_r
        self.dead = None
        hello = self._recv(timeout=60)
        if not (isinstance(hello, tuple) and hello and hello[0] == "hello" and isinstance(hello[2], dict)):
            raise self._died("did not start")
        self.report = {k: [str(x) for x in v] for k, v in hello[2].items() if isinstance(v, list)}

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                if self.proc.args[0] == "unshare":
                    self.proc.kill()               # --kill-child: the namespace goes with it
                else:
                    os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        if self.status_r is not None:
            os.close(self.status_r)
            self.status_r = None

    def how_it_ended(self) -> str:
        """'exit code 7', 'killed by signal 9 (SIGKILL)', ... as reported by the namespace's init."""
        code = None
        if self.status_r is not None:
            r, _, _ = select.select([self.status_r], [], [], 5)
            if r:
                try:
                    line = os.read(self.status_r, 200).decode("ascii", "replace").strip()
                    code = json.loads(line).get("exit") if line else None
                except (OSError, ValueError, AttributeError):
                    code = None
        if code is None and self.proc is not None:
            try:
                code = self.proc.wait(5)
            except subprocess.TimeoutExpired:
                code = None
        if isinstance(code, int) and code < 0:
            try:
                return f"killed by signal {-code} ({signal.Signals(-code).name})"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}" if code is not None else "it stopped answering"

    def _died(self, what: str) -> LearnerDied:
        how = self.how_it_ended()
        err = b""
        if self.proc is not None and self.proc.stderr is not None:
            try:
                if select.select([self.proc.stderr], [], [], 0)[0]:
                    err = self.proc.stderr.read1(2000)
            except (OSError, ValueError):
                pass
        self.kill()
        text = " ".join(err.decode("utf-8", "replace").split())[-300:]
        self.dead = f"{how}{': ' + text if text and 'Traceback' in text else ''}"
        return LearnerDied(f"{what} ({self.dead})" if what else self.dead)

    # ---- frames
    def _ref(self, obj: Any) -> tuple:
        hid = self.handles.get(id(obj))       # the same object, the same stand-in (identity holds)
        if hid is None:
            self.objects.append(obj)
            hid = self.handles[id(obj)] = len(self.objects) - 1
        return ("ref", hid)

    def _resolve(self, pid: tuple) -> Any:
        if pid[0] == "ref" and len(pid) == 2 and type(pid[1]) is int and 0 <= pid[1] < len(self.objects):
            return self.objects[pid[1]]
        if pid[0] == "obj" and len(pid) == 3 and type(pid[1]) is str and type(pid[2]) is dict \
                and all(type(k) is str for k in pid[2]):
            return wire.LearnerObject(pid[1][:80], pid[2])
        raise wire.WireError("a reference the grader did not hand out")

    def send(self, msg: tuple) -> None:
        try:
            wire.send_frame(self.sock, wire.dumps(msg, self._ref))
        except OSError:
            raise self._died("the notebook's process is gone") from None

    def _recv(self, timeout: float | None = None) -> Any:
        if self.sock is None:
            raise LearnerDied(self.dead or "not running")
        self.sock.settimeout(timeout)
        try:
            return wire.loads(wire.recv_frame(self.sock), self._resolve)
        except socket.timeout:
            raise
        except (wire.Closed, OSError):
            raise self._died("") from None
        except wire.WireError as e:
            raise self._died(f"it sent something that is not plain data: {e}") from None
        finally:
            if self.sock is not None:
                self.sock.settimeout(None)

    def _recv_within(self, limit: float | None, when_late: str) -> Any:
        """The next frame; past `limit` seconds the process is killed and LearnerDied(when_late) raised."""
        try:
            return self._recv(timeout=limit)
        except socket.timeout:
            self.kill()
            self.dead = when_late
            raise LearnerDied(when_late) from None

    # ---- the notebook's cells
    def run_cells(self, cells: list[tuple[int, str | None, str]], on_cell: Callable[[dict], None]) -> dict:
        """Run the cells; on_cell gets one event per cell. Returns the `ready` summary. Raises
        LearnerDied (the process died or overran a cell's time limit: it is killed)."""
        self.send(("cells", cells, self.o.cell_timeout, self.o.max_output))
        limit = self.o.cell_timeout * 1.5 + 5
        for _ in cells:
            msg = self._recv_within(limit, f"killed after {limit:g} s in one cell (it ignored the cell time limit)")
            if not (isinstance(msg, tuple) and len(msg) == 6 and msg[0] == "cell"):
                raise self._died("it sent something that is not a cell result")
            _, index, task, status, error, seconds = msg
            on_cell({"index": index if type(index) is int else -1, "task": task if type(task) is str else None,
                     "status": status if status in ("ok", "timeout", "exit", "error") else "error",
                     "error": str(error)[:600], "seconds": seconds if type(seconds) is float else 0.0})
        msg = self._recv_within(limit, "it stopped answering after its cells")
        if not (isinstance(msg, tuple) and len(msg) == 4 and msg[0] == "ready" and type(msg[1]) is list):
            raise self._died("it sent something that is not a summary")
        return {"names": {n for n in msg[1] if type(n) is str}, "output_chars": msg[2] if type(msg[2]) is int else 0}

    # ---- a call
    def call(self, task_id: str, name: str, args: tuple, kwargs: dict) -> tuple[bool, Any]:
        """(True, value) or (False, the exception the learner's function raised). Raises LearnerDied."""
        self.objects, self.handles, self.task_id = [], {}, task_id
        self.fds = {a for a in args if type(a) is int}
        self.send(("call", task_id, name, args, kwargs))
        # in the main thread the test's SIGALRM stops a call that runs too long; elsewhere (an engine
        # thread calling a plugged-in learner function) the socket's own time limit does
        limit = None if threading.current_thread() is threading.main_thread() else self.o.call_timeout
        while True:
            msg = self._recv_within(limit, f"killed: no answer in {limit or 0:g} s (an endless loop?)")
            kind = msg[0] if isinstance(msg, tuple) and msg else None
            if kind == "return" and len(msg) == 2:
                return True, msg[1]
            if kind == "raise" and len(msg) == 2 and type(msg[1]) is dict:
                return False, _exception(msg[1])
            if kind in ("op", "ref", "hook") and len(msg) == 4:
                try:
                    reply = ("ok", self._serve(msg))
                except (LearnerDied, KeyboardInterrupt, SystemExit):
                    raise
                except Exception as e:
                    reply = ("err", type(e).__name__, str(e)[:500])
                self.send(reply)
                continue
            raise self._died("it broke the grading protocol")

    def _serve(self, msg: tuple) -> Any:
        kind = msg[0]
        if kind == "ref":
            _, name, args, kwargs = msg
            if type(name) is not str or name not in FUNCTION_TASK or FUNCTION_TASK[name] == self.task_id:
                raise NameError(f"{name!r} is not another task's function")
            from .testing import reference
            return reference(name)(*args, **(kwargs if type(kwargs) is dict else {}))
        if kind == "hook":
            _, name, args, kwargs = msg
            if name != "os.sendfile" or type(args) is not tuple or len(args) < 4:
                raise PermissionError(f"{name!r} is not forwarded")
            if args[0] not in self.fds or args[1] not in self.fds:
                raise OSError(9, "Bad file descriptor (only the descriptors the test handed over)")
            return os.sendfile(*args, **(kwargs if type(kwargs) is dict else {}))
        _, op, hid, payload = msg
        obj = self._resolve(("ref", hid))
        if op == "getattr":
            if type(payload) is not str or payload.startswith("_"):
                raise AttributeError(f"{payload!r}: private")
            value = getattr(obj, payload)
            if isinstance(value, _MODULE_OR_CLASS):
                raise AttributeError(f"{payload!r}: not data")
            return value
        if op == "call":
            if isinstance(obj, _MODULE_OR_CLASS) or not callable(obj):
                raise TypeError("not callable")
            args, kwargs = payload
            value = obj(*args, **kwargs)
            if getattr(obj, "__name__", "") == "fileno" and type(value) is int:
                self.fds.add(value)
            return value
        if op == "len":
            return len(obj)
        if op == "getitem":
            return obj[payload]
        if op == "contains":
            return payload in obj
        if op == "iter":
            return iter(obj)
        if op == "next":
            return next(obj)
        if op == "bool":
            return bool(obj)
        if op in ("repr", "str"):
            return (repr if op == "repr" else str)(obj)[:5000]
        raise TypeError(f"unknown operation {op!r}")


def _exception(info: dict) -> BaseException:
    """The learner's exception, rebuilt as the nearest built-in type (a ValueError subclass of the
    learner's becomes a ValueError); `kstore_where` says where in the learner's code it came from."""
    bases = [b for b in info.get("bases", []) if type(b) is str]
    message = str(info.get("message", ""))[:2000]
    if "SystemExit" in bases:
        try:
            code = ast.literal_eval(str(info.get("code", "None")))
        except (ValueError, SyntaxError):
            code = str(info.get("code"))
        e: BaseException = SystemExit(code if type(code) in (int, str, type(None)) else str(code))
    else:
        cls = next((getattr(builtins, b) for b in bases if isinstance(getattr(builtins, b, None), type)
                    and issubclass(getattr(builtins, b), Exception)), RuntimeError)
        try:
            e = cls(message)
        except Exception:
            e = RuntimeError(message)
        if cls is RuntimeError and bases and bases[0] != "RuntimeError":
            e = RuntimeError(f"{bases[0]}: {message}")
    e.kstore_where = str(info.get("where", ""))[:500]
    e.kstore_type = str(bases[0]) if bases else type(e).__name__
    return e


class RemoteLearner:
    """The learner's notebook as the tests see it while `kstore grade` runs: a learner process
    (started again, cells and all, when one dies), the names it defines, and the deaths so far."""

    kstore_remote = True

    def __init__(self, cells: list[tuple[int, str | None, str]], options: Options,
                 on_event: Callable[[dict], None] | None = None):
        self.cells = cells
        self.options = options
        self.on_event = on_event or (lambda ev: None)
        self.proc: LearnerProcess | None = None
        self.names: set[str] = set()
        self.output_chars = 0
        self.report: dict = {}
        self.starts = 0
        self._lock = threading.Lock()

    def start(self, on_cell: Callable[[dict], None] | None = None) -> None:
        """Start a learner process and run the cells. Raises LearnerDied."""
        proc = LearnerProcess(self.options)
        self.proc = proc
        self.starts += 1
        try:
            proc.start()
            self.report = proc.report
            ready = proc.run_cells(self.cells, on_cell or (lambda ev: None))
        except socket.timeout:
            proc.kill()
            raise LearnerDied("it did not start in time") from None
        self.names = ready["names"]
        self.output_chars = max(self.output_chars, ready["output_chars"])

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.sock is not None

    def call(self, task_id: str, name: str, args: tuple, kwargs: dict) -> Any:
        with self._lock:                   # one call at a time on the one socket
            return self._call(task_id, name, args, kwargs)

    def _call(self, task_id: str, name: str, args: tuple, kwargs: dict) -> Any:
        if not self.alive:
            raise LearnerDied(self.proc.dead if self.proc and self.proc.dead else "not running")
        try:
            ok, value = self.proc.call(task_id, name, args, kwargs)
        except LearnerDied:
            raise
        except BaseException:          # a time limit (or anything) mid-call: this process is done
            self.proc.dead = STOPPED
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})   # the test's alarm
            try:                                                                    # re-fires: finish first
                self.proc.kill()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            raise
        if ok:
            return value
        raise value

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.send(("bye",))
            except BaseException:
                pass
            self.proc.kill()

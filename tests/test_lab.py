"""`make lab` really starts JupyterLab on the course.

The test runs the README's command itself — `make lab` with extra LAB_ARGS for a headless run —
in its own process group, waits until the server answers on 127.0.0.1, checks that the course's
notebooks, the JupyterLab page and a Python kernel are served, then stops the whole group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
STARTUP_TIMEOUT = 90  # seconds for the server to answer once `make lab` has nothing to install
SETUP_TIMEOUT = 1200  # seconds for `make`'s own set-up step when .venv is missing or stale


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _port_is_free(port: int) -> bool:
    """Nobody listens on HOST:port (a connection is refused and the port can be bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        if s.connect_ex((HOST, port)) == 0:
            return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT leftovers
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _group_alive(pgid: int) -> bool:
    """Some process of the group still runs (zombies, already dead, do not count)."""
    proc_dir = Path("/proc")
    if proc_dir.is_dir():
        for stat in proc_dir.glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue
            # "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after the last ")"
            fields = text[text.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_group(proc: subprocess.Popen, pgid: int) -> None:
    """SIGTERM the whole process group, then SIGKILL whatever is left."""
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        if not _group_alive(pgid):
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if proc.poll() is None:
                try:
                    proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
            if proc.poll() is not None and not _group_alive(pgid):
                break
            time.sleep(0.1)
    if proc.poll() is None:
        proc.wait(timeout=10)


def _make_env(tmp: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        # do not let an outer `make test` leak its variables and jobserver into `make lab`
        if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "LAB_ARGS", "LAB_HOST"}
    }
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_DATA_DIR", "IPYTHONDIR"):
        path = tmp / var.lower()
        path.mkdir()
        env[var] = str(path)
    env.pop("JUPYTER_PATH", None)
    env.pop("JUPYTER_CONFIG_PATH", None)
    env["BROWSER"] = "true"  # never open a browser, even if --no-browser were dropped
    return env


def _get(url: str, timeout: float = 10) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.geturl(), resp.read().decode("utf-8", "replace")


def _get_json(url: str):
    status, _, body = _get(url)
    assert status == 200, f"GET {url} -> {status}"
    return json.loads(body)


def _log_tail(log: Path, n: int = 60) -> str:
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return "(no output)"
    return "\n".join(lines[-n:])


def _setup_is_current(env: dict[str, str]) -> bool:
    """`make -q` answers whether the .venv set-up that `make lab` depends on is up to date."""
    return (
        subprocess.run(
            ["make", "-q", ".venv/.installed"], cwd=ROOT, env=env, capture_output=True
        ).returncode
        == 0
    )


@pytest.mark.timeout(SETUP_TIMEOUT + 300)
def test_make_lab_serves_the_course(tmp_path):
    disk_notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert disk_notebooks, "notebooks/ holds no notebook"

    env = _make_env(tmp_path)
    port = _free_port()
    lab_args = (
        f"--no-browser --port={port} --ServerApp.port_retries=0 "
        "--ServerApp.token= --ServerApp.password= --allow-root"
    )
    # When .venv is missing or older than pyproject.toml, `make lab` installs first: allow for it.
    startup_timeout = STARTUP_TIMEOUT if _setup_is_current(env) else STARTUP_TIMEOUT + SETUP_TIMEOUT

    log = tmp_path / "make-lab.log"
    base = f"http://{HOST}:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["make", "lab", f"LAB_ARGS={lab_args}"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: make, its shell, jupyter
        )
    pgid = os.getpgid(proc.pid)
    try:
        # 1. the server answers
        deadline = time.monotonic() + startup_timeout
        status = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(
                    f"`make lab` exited with {proc.returncode} before serving:\n{_log_tail(log)}"
                )
            try:
                status = _get_json(f"{base}/api/status")
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        assert status is not None, (
            f"JupyterLab did not answer on {base} within {startup_timeout}s:\n{_log_tail(log)}"
        )
        assert "started" in status

        # 2. the course's notebooks are served from notebooks/
        listing = _get_json(f"{base}/api/contents/notebooks")
        assert listing["type"] == "directory"
        served = {item["name"]: item for item in listing["content"]}
        missing = [name for name in disk_notebooks if name not in served]
        assert not missing, f"notebooks on disk but not served: {missing}; served: {sorted(served)}"
        for name in disk_notebooks:
            assert served[name]["type"] == "notebook", served[name]
            model = _get_json(f"{base}/api/contents/notebooks/{urllib.request.quote(name)}")
            assert model["type"] == "notebook" and model["content"]["nbformat"] == 4, name

        # 3. the JupyterLab page itself, and `/` lands on the course folder
        code, _, html = _get(f"{base}/lab")
        assert code == 200 and "JupyterLab" in html
        code, final_url, _ = _get(f"{base}/")
        assert code == 200 and final_url.endswith("/lab/tree/notebooks"), final_url

        # 4. a Python kernel is available (from the venv, though JUPYTER_DATA_DIR is elsewhere)
        specs = _get_json(f"{base}/api/kernelspecs")
        assert "python3" in specs["kernelspecs"], sorted(specs["kernelspecs"])
        assert specs["kernelspecs"]["python3"]["spec"]["language"] == "python"
        assert specs["default"] == "python3"
    finally:
        _stop_group(proc, pgid)

    assert not _group_alive(pgid), "processes of `make lab` survived SIGKILL"
    deadline = time.monotonic() + 10
    while not _port_is_free(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _port_is_free(port), f"port {port} is still in use after `make lab` was stopped"

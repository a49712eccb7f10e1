"""The widgets in a real browser: JupyterLab (started by `make lab`) + Debian's chromium + Playwright.

The test starts JupyterLab the way tests/test_lab.py does (its helpers: `make lab` in its own
process group, on 127.0.0.1, empty token and password, `--allow-root`, `--no-browser`), copies
`tests/widgets_browser.ipynb` — a notebook that uses every view of `kstore.widgets` — into
`test-artifacts/browser/` (gitignored, served by that JupyterLab), opens it in chromium
(`--no-sandbox`, background networking off), runs all cells from JupyterLab's Run menu, waits for
the kernel to go idle and the last cell's marker, then asserts on the rendered DOM:
* every widget is really there (its root element and its content);
* interactions change what is shown: a click on the hex view's "next" button moves the window, a
  click on the lookup trace's "Step" button reveals a step, typing an offset + Enter recomputes
  the trace, "Produce" in the replica view moves the leader's LEO, "Reveal" shows a quiz answer.
Screenshots go to `test-artifacts/widgets/`. Everything is bounded (pytest timeout 180 s).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
from pathlib import Path

import pytest

from test_lab import (HOST, STARTUP_TIMEOUT, _free_port, _get_json, _group_alive, _log_tail,
                      _make_env, _setup_is_current, _stop_group)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = Path(__file__).with_name("widgets_browser.ipynb")
SERVED_DIR = ROOT / "test-artifacts" / "browser"          # under the server's root_dir, gitignored
SHOTS = ROOT / "test-artifacts" / "widgets"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
WIDGETS = {  # root class (ipywidgets add_class) -> what must be inside it
    "kstore-hexview": ".ks-hex .ks-rows span[title]",
    "kstore-directory": ".ks-dir table",
    "kstore-indexview": "img",
    "kstore-lookup": ".ks-lookup li",
    "kstore-compaction": ".ks-comp .ks-rec",
    "kstore-replicas": ".ks-rep .ks-broker",
    "kstore-zerocopy": ".ks-zc table",
    "kstore-offsets": ".ks-off table",
    "kstore-quiz": ".ks-quiz .ks-card",
    "kstore-progress": ".ks-progress-text",
}

import playwright.sync_api as playwright_api  # noqa: E402  (a declared test dependency)


def _lab_settings(tmp: Path) -> Path:
    """User settings for this JupyterLab: render every cell (no windowing) and fetch no news."""
    settings = tmp / "lab-settings"
    files = {
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": '{"windowingMode": "none"}',
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
            '{"fetchNews": "false", "checkForUpdates": false}',
    }
    for rel, text in files.items():
        path = settings / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return settings


class _Lab:
    """`make lab` on a free port in its own process group; stopped by `close()`."""

    def __init__(self, tmp: Path):
        self.env = _make_env(tmp)
        self.env["JUPYTERLAB_SETTINGS_DIR"] = str(_lab_settings(tmp))
        self.env["JUPYTERLAB_WORKSPACES_DIR"] = str(tmp / "workspaces")
        self.engine_dir = tmp / "engine"
        self.engine_dir.mkdir()
        self.env["KSTORE_WIDGET_TEST_DIR"] = str(self.engine_dir)   # the notebook writes here
        self.port = _free_port()
        self.base = f"http://{HOST}:{self.port}"
        self.log = tmp / "make-lab.log"
        lab_args = (f"--no-browser --port={self.port} --ServerApp.port_retries=0 "
                    "--ServerApp.token= --ServerApp.password= --allow-root")
        if not _setup_is_current(self.env):
            pytest.fail(".venv is older than pyproject.toml: run `make test`, which installs first")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(["make", "lab", f"LAB_ARGS={lab_args}"], cwd=ROOT,
                                         env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.pgid = os.getpgid(self.proc.pid)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"`make lab` exited with {self.proc.returncode}:\n{_log_tail(self.log)}")
            try:
                _get_json(f"{self.base}/api/status")
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        pytest.fail(f"JupyterLab did not answer on {self.base}:\n{_log_tail(self.log)}")

    def close(self) -> None:
        _stop_group(self.proc, self.pgid)
        assert not _group_alive(self.pgid), "processes of `make lab` survived"


def _attr(page, selector: str, name: str) -> str | None:
    return page.locator(selector).first.get_attribute(name)


def _wait_attr(page, selector: str, name: str, expected: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _attr(page, selector, name) == expected:
            return
        page.wait_for_timeout(100)
    raise AssertionError(f"{selector} [{name}] is {_attr(page, selector, name)!r}, not {expected!r}")


def _wait_attr_change(page, selector: str, name: str, old, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = _attr(page, selector, name)
        if value != old:
            return value
        page.wait_for_timeout(100)
    raise AssertionError(f"{selector} [{name}] stayed {old!r} for {timeout}s")


@pytest.mark.timeout(180)
def test_widgets_render_and_respond_in_chromium(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium; "
                    f".ci/run does it in CI)")
    SERVED_DIR.mkdir(parents=True, exist_ok=True)
    SHOTS.mkdir(parents=True, exist_ok=True)
    served = SERVED_DIR / NOTEBOOK.name
    shutil.copyfile(NOTEBOOK, served)
    started = time.monotonic()
    lab = _Lab(tmp_path)
    try:
        lab.wait_ready()
        with playwright_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1500, "height": 1400})
                page.set_default_timeout(60_000)
                _run_notebook(page, lab, served)
                _check_widgets(page)
                _interact(page)
                page.screenshot(path=str(SHOTS / "notebook-end.png"), full_page=False)
            finally:
                browser.close()
    finally:
        lab.close()
        served.unlink(missing_ok=True)
    assert time.monotonic() - started < 170


def _run_notebook(page, lab: _Lab, served: Path) -> None:
    rel = served.relative_to(ROOT).as_posix()
    page.goto(f"{lab.base}/lab/tree/{rel}", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    # the kernel is started and idle: the toolbar indicator and the status bar both say so
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=90_000)
    page.wait_for_selector(".jp-StatusBar-Widget:has-text('| Idle')", timeout=90_000)
    # the file browser takes room from the screenshots: collapse the left sidebar if it is open
    if page.locator(".jp-FileBrowser").is_visible():
        page.locator('.jp-SideBar.jp-mod-left li.lm-TabBar-tab.lm-mod-current').first.click()
    page.screenshot(path=str(SHOTS / "notebook-opened.png"))
    # Run ▸ Run All Cells, from JupyterLab's menu bar (once more if no cell started: a click
    # that lands while the page is still settling can be lost)
    for attempt in range(2):
        page.locator(".jp-Notebook .jp-Cell").first.click()         # the notebook has focus
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        page.locator('li.lm-Menu-item[data-command="runmenu:run-all"], '
                     'li.lm-Menu-item[data-command="notebook:run-all-cells"]').first.click()
        try:
            page.wait_for_selector(".jp-InputArea-prompt:has-text('[*]'), "
                                   ".jp-InputArea-prompt:has-text('[1]')", timeout=20_000)
            break
        except playwright_api.TimeoutError:
            if attempt:
                raise
    # wait for the last cell's marker; a cell that fails stops "Run All": report its traceback
    stderr = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if page.locator(".jp-OutputArea-output:has-text('ALL-CELLS-DONE')").count():
            break
        tracebacks = [t for t in stderr.all_inner_texts() if "Traceback" in t or "Error" in t]
        if tracebacks:
            page.screenshot(path=str(SHOTS / "notebook-error.png"))
            pytest.fail("a notebook cell failed:\n" + "\n".join(tracebacks)[-3000:])
        page.wait_for_timeout(250)
    else:
        page.screenshot(path=str(SHOTS / "notebook-timeout.png"))
        counts = page.locator(".jp-InputArea-prompt").all_inner_texts()
        pytest.fail(f"the notebook did not finish in 120 s; prompts: {counts}\n"
                    f"server log:\n{_log_tail(lab.log, 30)}")
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=60_000)
    tracebacks = [t for t in stderr.all_inner_texts() if "Traceback" in t or "Error" in t]
    assert not tracebacks, tracebacks


def _check_widgets(page) -> None:
    for root, inner in WIDGETS.items():
        box = page.locator(f".{root}")
        box.first.wait_for(state="attached", timeout=30_000)
        assert box.count() >= 1, f"{root} is not in the page"
        assert page.locator(f".{root} {inner}").count() >= 1, f"{root} has no {inner}"
        box.first.scroll_into_view_if_needed()
        box.first.screenshot(path=str(SHOTS / f"{root}.png"))
    # hover text: the CRC field at byte 17 of the first batch is named in its title
    titles = page.locator(".kstore-hexview .ks-rows span[title^='crc [']")
    assert titles.count() >= 1 and "CRC-32C" in titles.first.get_attribute("title")
    # the appends made after display reached the hex view through events: new bytes highlighted
    assert page.locator(".kstore-hexview .ks-new").count() >= 1
    assert page.locator(".kstore-zerocopy .ks-zc").first.get_attribute("data-measured") == "true"
    assert int(page.locator(".kstore-compaction .ks-comp").first.get_attribute("data-removed")) > 0
    assert int(page.locator(".kstore-offsets .ks-off").first.get_attribute("data-rows")) == 2


def _interact(page) -> None:
    # hex view: "first" then "next ▶" moves the window by one page (16 rows of 16 bytes)
    page.locator(".kstore-hexview .ks-hex-first").click()
    _wait_attr(page, ".kstore-hexview .ks-hex", "data-start", "0")
    page.locator(".kstore-hexview .ks-hex-next").click()
    _wait_attr(page, ".kstore-hexview .ks-hex", "data-start", "256")
    page.locator(".kstore-hexview").first.screenshot(path=str(SHOTS / "hexview-after-next.png"))

    # lookup trace: Step reveals one more step
    shown = _attr(page, ".kstore-lookup .ks-lookup", "data-shown")
    page.locator(".kstore-lookup .ks-lookup-step").click()
    assert int(_wait_attr_change(page, ".kstore-lookup .ks-lookup", "data-shown", shown)) == int(shown) + 1
    # ... and a key: type another offset, press Enter, the trace is recomputed for it
    field = page.locator(".kstore-lookup .ks-lookup-target input")
    field.fill("42")
    field.press("Enter")
    page.wait_for_selector(".kstore-lookup h4:has-text('offset 42')", timeout=20_000)
    page.locator(".kstore-lookup .ks-lookup-step").click()
    page.locator(".kstore-lookup .ks-lookup-step").click()
    page.wait_for_selector(".kstore-lookup li[data-phase='segment']", timeout=20_000)
    page.locator(".kstore-lookup").first.screenshot(path=str(SHOTS / "lookup-after-steps.png"))

    # replica view: Produce moves the leader's LEO
    leader = ".kstore-replicas .ks-broker[data-role='leader']"
    leo = _attr(page, leader, "data-leo")
    page.locator(".kstore-replicas .ks-rep-produce").click()
    assert int(_wait_attr_change(page, leader, "data-leo", leo)) == int(leo) + 1
    # two fetch rounds: the first brings the record to the followers, the second reports their
    # new LEO to the leader, which moves the high watermark past it
    page.locator(".kstore-replicas .ks-rep-round").click()
    page.locator(".kstore-replicas .ks-rep-round").click()
    _wait_attr(page, leader, "data-hw", str(int(leo) + 1))
    page.locator(".kstore-replicas").first.screenshot(path=str(SHOTS / "replicas-after-produce.png"))

    # quiz: Reveal shows the answer
    page.locator(".kstore-quiz .ks-quiz-reveal").click()
    page.wait_for_selector(".kstore-quiz .ks-quiz[data-revealed='true'] .ks-a", timeout=20_000)
    page.locator(".kstore-quiz").first.screenshot(path=str(SHOTS / "quiz-revealed.png"))

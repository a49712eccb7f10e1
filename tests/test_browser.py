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

import contextlib
import os
import shutil
import subprocess
import sys
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

from tool_check import require_tool  # noqa: E402

INSTALL_CHROMIUM = "apt-get install chromium"


def need_chromium(environ=os.environ, candidates=(CHROMIUM,)) -> str:
    """Debian's chromium, or a skip naming it and `apt-get install chromium` (a failure in CI)."""
    return require_tool(list(candidates), "Chromium (Debian's chromium package)", INSTALL_CHROMIUM,
                        environ)


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


@contextlib.contextmanager
def _lab_with_chromium(tmp_path: Path, served: list[Path]):
    """JupyterLab (`make lab`) and a headless Chromium; yields (lab, new_page). On the way out the
    browser and the lab are stopped and the `served` notebook copies removed."""
    chromium = need_chromium()
    lab = _Lab(tmp_path)
    try:
        lab.wait_ready()
        with playwright_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)

            def new_page():
                page = browser.new_page(viewport={"width": 1500, "height": 1400})
                page.set_default_timeout(60_000)
                return page
            try:
                yield lab, new_page
            finally:
                browser.close()
    finally:
        lab.close()
        for path in served:
            path.unlink(missing_ok=True)


def _serve(name: str) -> Path:
    SERVED_DIR.mkdir(parents=True, exist_ok=True)
    SHOTS.mkdir(parents=True, exist_ok=True)
    return SERVED_DIR / name


@pytest.mark.timeout(180)
def test_widgets_render_and_respond_in_chromium(tmp_path):
    need_chromium()
    served = _serve(NOTEBOOK.name)
    shutil.copyfile(NOTEBOOK, served)
    started = time.monotonic()
    with _lab_with_chromium(tmp_path, [served]) as (lab, new_page):
        page = new_page()
        _run_notebook(page, lab, served)
        _check_widgets(page)
        _interact(page)
        page.screenshot(path=str(SHOTS / "notebook-end.png"), full_page=False)
    assert time.monotonic() - started < 170


def _run_notebook(page, lab: _Lab, served: Path, workspace: str | None = None) -> None:
    rel = served.relative_to(ROOT).as_posix()
    # a workspace of its own: only this notebook open (not the ones opened before in this lab)
    where = f"workspaces/{workspace}/tree" if workspace else "tree"
    page.goto(f"{lab.base}/lab/{where}/{rel}", wait_until="domcontentloaded")
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
    # the appends made after display reached the hex view through events: it keeps its moment,
    # and "now ▶|" on its timeline shows the new bytes highlighted
    assert page.locator(".kstore-hexview .ks-new").count() == 0
    page.locator(".kstore-hexview .ks-tl-now").click()
    page.wait_for_selector(".kstore-hexview .ks-new", timeout=20_000)
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


# ------------------------------------------------------------------------------------------------
# chapters 01, 02 and 09 after Run All: every view shows its cell's moment; a timeline steps
# ------------------------------------------------------------------------------------------------

CHAPTERS = ["01-record-batch.ipynb", "02-sparse-index.ipynb", "09-replication-hw.ipynb"]


def _served_chapter(name: str) -> Path:
    """The chapter with the moment probe of tests/test_notebooks.py around it (first and last cell)."""
    import nbformat

    from test_notebooks import PROBE, REPORT
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(PROBE))
    nb.cells.append(nbformat.v4.new_code_cell(REPORT + "\nprint('ALL-' + 'CELLS-DONE')"))
    served = _serve(f"chapter-{name}")
    nbformat.write(nb, served)
    return served


def _moments_in_page(page) -> list[dict]:
    import json

    from test_notebooks import MARK
    text = page.locator(f".jp-OutputArea-output:has-text('{MARK}')").first.inner_text()
    line = next(line for line in text.splitlines() if line.startswith(MARK))
    return json.loads(line[len(MARK):])


def _timeline_states(page) -> list[dict]:
    bars = page.locator(".ks-timeline .ks-tl")
    return [{k: bars.nth(i).get_attribute(f"data-{k}") for k in ("frame", "frames", "seq", "bound",
                                                                 "bound-seq")}
            for i in range(bars.count())]


def _check_moments(page, name: str) -> None:
    moments = _moments_in_page(page)
    states = _timeline_states(page)
    assert moments, f"{name}: the probe saw no view"
    assert len(states) == len(moments), (name, states, moments)
    for m, st in zip(moments, states):       # display order = page order
        assert m["shows_its_moment"] and m["moment_is_bound_frame"], (name, m)
        assert st["frame"] == st["bound"], (name, m["view"], st)
        assert int(st["seq"]) == int(st["bound-seq"]) == m["seq_at_cell_end"], (name, m, st)


@pytest.mark.timeout(420)
def test_chapters_01_02_09_show_each_view_at_its_moment_and_step_a_timeline(tmp_path):
    need_chromium()
    served = [_served_chapter(name) for name in CHAPTERS]
    with _lab_with_chromium(tmp_path, served) as (lab, new_page):
        for name, path in zip(CHAPTERS, served):
            page = new_page()
            _run_notebook(page, lab, path, workspace=f"chapter-{name[:2]}")
            _check_moments(page, name)
            getattr(sys.modules[__name__], f"_chapter_{name[:2]}")(page)
            page.screenshot(path=str(SHOTS / f"chapter-{name[:2]}-end.png"))
            page.close()


def _chapter_01(page) -> None:
    # the hex view beside the text about the first record: still on byte 0 after Run All
    hexview = page.locator(".kstore-hexview").first
    assert hexview.locator(".ks-hex").get_attribute("data-start") == "0"
    bar = hexview.locator(".ks-tl")
    bound_seq, frames = int(bar.get_attribute("data-seq")), int(bar.get_attribute("data-frames"))
    assert frames > 1, "later appends were recorded on the hex view's timeline"
    before = hexview.locator(".ks-hex").inner_html()
    hexview.locator(".ks-tl-fwd").click()                   # one engine event later
    _wait_attr_change(page, ".kstore-hexview .ks-tl", "data-seq", str(bound_seq))
    assert int(bar.get_attribute("data-frame")) == int(bar.get_attribute("data-bound")) + 1
    assert hexview.locator(".ks-hex").inner_html() != before
    hexview.screenshot(path=str(SHOTS / "chapter-01-hexview-stepped.png"))
    hexview.locator(".ks-tl-back").click()                  # and back: the same picture as before
    _wait_attr(page, ".kstore-hexview .ks-tl", "data-seq", str(bound_seq))
    assert hexview.locator(".ks-hex").inner_html() == before
    hexview.locator(".ks-tl-now").click()                   # the present: the last frame
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (int(bar.get_attribute("data-frame")) + 1 !=
                                           int(bar.get_attribute("data-frames"))):
        page.wait_for_timeout(100)
    assert int(bar.get_attribute("data-frame")) + 1 == int(bar.get_attribute("data-frames"))
    assert int(bar.get_attribute("data-seq")) > bound_seq


def _chapter_02(page) -> None:
    # "It is empty now": the index view under that sentence shows no entry after Run All
    index = page.locator(".kstore-indexview").first
    assert index.locator(".ks-idx").get_attribute("data-entries") == "0"
    # ▶ steps through the appends the chapter made next, until the first index entry appears
    bar = index.locator(".ks-tl")
    frames = int(bar.get_attribute("data-frames"))
    for _ in range(frames):
        if index.locator(".ks-idx").get_attribute("data-entries") != "0":
            break
        seq = bar.get_attribute("data-seq")
        index.locator(".ks-tl-fwd").click()
        _wait_attr_change(page, ".kstore-indexview .ks-tl", "data-seq", seq)
    assert int(index.locator(".ks-idx").get_attribute("data-entries")) > 0
    assert "index entry" in bar.inner_text()                # the step is named by its event
    index.screenshot(path=str(SHOTS / "chapter-02-indexview-first-entry.png"))
    index.locator(".ks-tl-follow").click()                   # follow live: the present
    _wait_attr(page, ".kstore-indexview .ks-tl", "data-follow", "true")
    _wait_attr(page, ".kstore-indexview .ks-tl", "data-frame",
               str(int(bar.get_attribute("data-frames")) - 1))


def _chapter_09(page) -> None:
    # the first replica view, before "Sequence 1" runs: broker 0 leads epoch 0, both in the ISR
    rep = page.locator(".kstore-replicas .ks-rep").first
    assert rep.get_attribute("data-leader") == "0", rep.get_attribute("data-leader")
    assert rep.get_attribute("data-isr") == "[0, 1]", rep.get_attribute("data-isr")


# ------------------------------------------------------------------------------------------------
# without Chromium: a skip that says what to install (outside CI), a failure in CI
# ------------------------------------------------------------------------------------------------

def test_missing_chromium_skips_outside_ci_and_fails_in_ci(tmp_path):
    missing = str(tmp_path / "no-chromium-here")
    with pytest.raises(pytest.skip.Exception) as skipped:
        need_chromium({"CI": ""}, candidates=(missing,))
    assert "Chromium" in str(skipped.value) and "`apt-get install chromium`" in str(skipped.value)
    with pytest.raises(pytest.fail.Exception) as failed:
        need_chromium({"CI": "true"}, candidates=(missing,))
    assert "apt-get install chromium" in str(failed.value) and "CI=true" in str(failed.value)
    present = tmp_path / "chromium"
    present.write_text("#!/bin/sh\n")
    present.chmod(0o755)
    assert need_chromium({"CI": "true"}, candidates=(missing, str(present))) == str(present)

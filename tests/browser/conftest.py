"""Browser tests: the notebooks in JupyterLab, driven by headless Debian Chromium via Playwright.

One JupyterLab server serves a temporary copy of notebooks/ (and of data/, through
FP16LAB_DATA) for the whole session, so Run All never writes into committed files; it is
always stopped at the end, kernels included, and the session fails if a process is left.
One Chromium, with a fresh user-data dir, opens each notebook in a new tab. Screenshots of
each step go to test-artifacts/browser/<notebook>/.

Without a Chromium binary (or without Playwright) every test here skips with a message that
says how to enable them.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from fp16lab.testing import LabServer, jupyter_server

ROOT = pathlib.Path(__file__).resolve().parents[2]
# FP16LAB_NOTEBOOKS serves another folder of notebooks (a work-in-progress copy, say).
NOTEBOOK_DIR = pathlib.Path(os.environ.get("FP16LAB_NOTEBOOKS", ROOT / "notebooks"))
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
ENABLE_HINT = "install Debian's chromium: apt-get install chromium; `make test` then runs these"
# The defaults `make lab` installs (lab-settings/overrides.json: no news or update pop-ups,
# widget state saved with the notebook), so the tests see what a learner sees; and for the
# tests, windowingMode "none" keeps every cell in the DOM, so a cell below the fold can be read
# and clicked, and recordTiming stores each cell's run time, so the slowest cells can be named.
MAKE_LAB_SETTINGS: dict[str, dict] = json.loads(
    (ROOT / "lab-settings" / "overrides.json").read_text())
LAB_SETTINGS = {
    **MAKE_LAB_SETTINGS,
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none", "recordTiming": True},
}
RUN_ALL_TIMEOUT_S = 600.0
TIMINGS: dict[str, float] = {}  # what -> seconds, printed at the end of the run
TIMINGS_BY_TEST: dict[str, float] = {}  # test id -> set-up + call + tear-down seconds


def find_chromium() -> str | None:
    """Returns the path of a Chromium binary (Debian's /usr/bin/chromium first), or None.

    FP16LAB_CHROMIUM, when set, names the only binary to try.
    """
    override = os.environ.get("FP16LAB_CHROMIUM")
    for name in (override,) if override is not None else CHROMIUM_CANDIDATES:
        path = name if os.path.isabs(name) else shutil.which(name) if name else None
        if path and os.access(path, os.X_OK):
            return path
    return None


def _alive(pids: list[int]) -> list[int]:
    import psutil

    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


# ---------------------------------------------------------------------------- session fixtures

@pytest.fixture(scope="session")
def chromium() -> str:
    """Returns Chromium's path; skips the browser tests, saying how to enable them, without one."""
    path = find_chromium()
    if path is None:
        looked = os.environ.get("FP16LAB_CHROMIUM") or ", ".join(CHROMIUM_CANDIDATES)
        pytest.skip(f"no Chromium binary (looked for {looked}): {ENABLE_HINT}")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("Playwright for Python is missing: pip install -e '.[browser]' "
                    "(no `playwright install`: the tests use Debian's chromium)")
    pytest.importorskip("jupyterlab", reason="JupyterLab is not installed here")
    return path


@pytest.fixture(scope="session")
def lab(chromium, tmp_path_factory) -> Iterator[LabServer]:
    """Yields the session's JupyterLab server, serving a temporary copy of notebooks/."""
    base = tmp_path_factory.mktemp("browser-lab")
    root = base / "notebooks"
    shutil.copytree(NOTEBOOK_DIR, root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    data = base / "data"
    if (ROOT / "data").is_dir():
        shutil.copytree(ROOT / "data", data)
    else:
        data.mkdir()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    pids: list[int] = []
    with jupyter_server(root, user_settings=LAB_SETTINGS, expose_app=True,
                        env={"FP16LAB_DATA": str(data)}) as server:
        TIMINGS["JupyterLab server start"] = time.perf_counter() - t0
        try:
            yield server
        finally:
            pids = server.processes()
    shutil.copyfile(server.log_path, ARTIFACTS / "jupyterlab.log")
    left = _alive(pids)
    assert not left, f"processes of the JupyterLab server outlived it: {left}"


@pytest.fixture(scope="session")
def browser_context(chromium, tmp_path_factory):
    """Yields a Playwright browser context of headless Chromium with a fresh user-data dir."""
    import psutil
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    t0 = time.perf_counter()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    spawned: list[int] = []
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=chromium, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1280, "height": 1000}, device_scale_factor=1)
        context.set_default_timeout(60_000)
        TIMINGS["Chromium start"] = time.perf_counter() - t0
        spawned = [p.pid for p in psutil.Process().children(recursive=True)
                   if p.pid not in before]
        try:
            yield context
        finally:
            context.close()
    left = _alive(spawned)
    assert not left, f"Chromium or Playwright processes outlived the browser fixture: {left}"


# ---------------------------------------------------------------------------- one notebook

NOTEBOOK_STATE_JS = """(path) => {
  const app = window.jupyterapp;
  if (!app) return null;
  let panel = null;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === path) { panel = w; break; }
  }
  if (!panel || !panel.content) return null;
  const session = panel.sessionContext && panel.sessionContext.session;
  const kernel = session ? session.kernel : null;
  const state = {kernel: kernel ? kernel.status : null,
                 connection: kernel ? kernel.connectionStatus : null,
                 running: 0, pending: 0, errors: [], codeCells: 0};
  state.seconds = [];
  panel.content.widgets.forEach((cell, index) => {
    if (cell.model.type !== 'code') return;
    state.codeCells += 1;
    const timing = cell.model.getMetadata('execution') || {};
    const start = timing['iopub.execute_input'], end = timing['shell.execute_reply'];
    if (start && end) state.seconds.push([index, (Date.parse(end) - Date.parse(start)) / 1000]);
    const prompt = cell.node.querySelector('.jp-InputArea-prompt');
    if (prompt && prompt.textContent.includes('[*]')) state.running += 1;
    if (cell.model.sharedModel.getSource().trim() && cell.model.executionCount == null)
      state.pending += 1;
    const outputs = cell.model.outputs;
    for (let j = 0; j < outputs.length; j++) {
      const out = outputs.get(j).toJSON();
      if (out.output_type !== 'error') continue;
      const child = cell.node.querySelectorAll('.jp-OutputArea-child')[j];
      const shown = child ? child.querySelector('.jp-OutputArea-output') : null;
      state.errors.push({cell: index, ename: out.ename, evalue: out.evalue,
                         mime: shown ? shown.getAttribute('data-mime-type') : null,
                         shown: shown ? shown.textContent.slice(-1500) : null});
    }
  });
  return state;
}"""


class Notebook:
    """A notebook open in its own Chromium tab: run it, read its errors, screenshot its steps."""

    def __init__(self, page, server: LabServer, name: str, shots_dir: pathlib.Path):
        self.page, self.server, self.name = page, server, name
        self.stem = pathlib.Path(name).stem
        self.shots_dir = shots_dir
        self.label = f"{shots_dir.name}: {self.stem}" if self.stem not in shots_dir.name \
            else shots_dir.name
        self.shots: list[pathlib.Path] = []
        self.console: list[str] = []
        page.on("pageerror", lambda exc: self.console.append(f"pageerror: {exc}"))
        page.on("console", lambda msg: msg.type == "error"
                and self.console.append(f"console.error: {msg.text}"))

    # -- state
    def state(self) -> dict | None:
        """Returns the kernel's status, running/pending cell counts and error outputs, or None."""
        return self.page.evaluate(NOTEBOOK_STATE_JS, self.name)

    def wait_until(self, done: Callable[[dict], bool], what: str, timeout: float) -> dict:
        """Returns the notebook state once done(state) holds; fails with the last state if not."""
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = self.state()
            if state is not None and done(state):
                return state
            self.page.wait_for_timeout(250)
        self.shot(f"timeout-{what}")
        raise AssertionError(f"{self.name}: not {what} after {timeout:.0f} s; last state {state}")

    def wait_kernel_idle(self, timeout: float = 120.0) -> dict:
        """Returns the state once the kernel is connected and idle."""
        return self.wait_until(lambda s: s["connection"] == "connected" and s["kernel"] == "idle",
                               "kernel idle", timeout)

    # -- actions
    def open(self) -> Notebook:
        """Returns self after loading the notebook in JupyterLab and waiting for an idle kernel."""
        t0 = time.perf_counter()
        # A workspace of its own: the default one would reopen every earlier test's tabs.
        workspace = re.sub(r"[^A-Za-z0-9]+", "-", f"{self.shots_dir.name}-{uuid.uuid4().hex[:8]}")
        self.page.goto(self.server.notebook_url(self.name, workspace=workspace))
        self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").first \
            .wait_for(timeout=90_000)
        self.wait_kernel_idle()
        # The file browser takes a fifth of the width and shows nothing a test looks at.
        self.page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
        TIMINGS[f"{self.label}: open"] = time.perf_counter() - t0
        return self

    def run_all(self, timeout: float = RUN_ALL_TIMEOUT_S) -> dict:
        """Returns the final state after Run > Run All Cells has finished (or stopped at an error)."""
        t0 = time.perf_counter()
        self.page.locator(".lm-MenuBar-itemLabel").get_by_text("Run", exact=True).click()
        self.page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
        state = self.wait_until(
            lambda s: (s["connection"] == "connected" and s["kernel"] == "idle"
                       and s["running"] == 0 and (s["pending"] == 0 or s["errors"])),
            "finished Run All", timeout)
        TIMINGS[f"{self.label}: Run All"] = time.perf_counter() - t0
        slowest = sorted(state.get("seconds") or [], key=lambda c: -c[1])[:3]
        if slowest:
            TIMINGS[f"{self.label}: slowest cells " + ", ".join(
                f"[{i}] {sec:.0f} s" for i, sec in slowest)] = sum(sec for _, sec in slowest)
        return state

    def model_json(self) -> dict:
        """Returns the notebook as JupyterLab holds it now, outputs included (nbformat JSON)."""
        return self.page.evaluate("""(path) => {
          for (const w of window.jupyterapp.shell.widgets('main'))
            if (w.context && w.context.path === path) return w.context.model.toJSON();
          return null;
        }""", self.name)

    def run_all_without_errors(self, keep: dict | None = None) -> dict:
        """Returns the state after Run All, having checked that every code cell ran and none
        shows an error; a screenshot of the whole notebook is saved first. ``keep`` (the
        session's ``lab_executed``) gets the executed notebook and the seconds Run All took,
        for tests/test_notebooks.py to read instead of executing it again."""
        t0 = time.perf_counter()
        state = self.run_all()
        seconds = time.perf_counter() - t0
        self.shot_whole_notebook("after-run-all")
        self.assert_no_errors(state)
        assert state["codeCells"] > 0, f"{self.name} has no code cells"
        assert state["pending"] == 0, f"{self.name}: {state['pending']} code cells did not run"
        if keep is not None:
            keep[self.name] = (self.model_json(), seconds)
        return state

    def assert_no_errors(self, state: dict | None = None) -> None:
        """Fails, quoting the traceback shown, if any cell shows an error output."""
        state = state or self.state()
        if state["errors"]:
            self.shot("error")
            first = state["errors"][0]
            raise AssertionError(
                f"{self.name}: {len(state['errors'])} cell(s) show an error output; first in cell "
                f"{first['cell']}: {first['ename']}: {first['evalue']}\n{first['shown']}")

    def cell_of(self, locator):
        """Returns a locator for the notebook cell that contains locator (a widget, an output)."""
        return locator.locator("xpath=ancestor::div[contains(concat(' ', normalize-space(@class),"
                               " ' '), ' jp-Cell ')][1]")

    def shot(self, step: str, target=None) -> pathlib.Path:
        """Returns the path of a screenshot of the page (or of one locator) named after step."""
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", step)
        self.shots_dir.mkdir(parents=True, exist_ok=True)
        path = self.shots_dir / f"{len(self.shots) + 1:02d}_{safe}.png"
        (target or self.page).screenshot(path=str(path))
        self.shots.append(path)
        return path

    def shot_whole_notebook(self, step: str, max_height: int = 16_000) -> pathlib.Path:
        """Returns the path of a screenshot of the whole notebook, top to bottom.

        JupyterLab scrolls the notebook inside the page, so the page is made as tall as the
        notebook (up to max_height pixels) for the shot and then put back.
        """
        size = self.page.viewport_size
        height = self.page.evaluate(
            "() => { const s = document.querySelector("
            "'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer');"
            " return s ? s.scrollHeight : 0; }")
        tall = min(max(size["height"], height + 200), max_height)
        self.page.set_viewport_size({"width": size["width"], "height": tall})
        try:
            self.page.evaluate(
                "() => document.querySelector("
                "'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer').scrollTo(0, 0)")
            self.page.wait_for_timeout(300)  # let the layout settle at the new size
            return self.shot(step)
        finally:
            self.page.set_viewport_size(size)

    def close(self) -> None:
        """Closes the tab, shuts the notebook's kernel down and writes the console log."""
        try:
            self.page.close()
        finally:
            for session in self.server.api("sessions") or []:
                if session.get("path") == self.name:
                    self.server.api(f"sessions/{session['id']}", method="DELETE")
            if self.console:
                self.shots_dir.mkdir(parents=True, exist_ok=True)
                (self.shots_dir / f"{self.stem}.console.log").write_text(
                    "\n".join(self.console) + "\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"_report_{report.when}", report)
    TIMINGS_BY_TEST[item.nodeid] = TIMINGS_BY_TEST.get(item.nodeid, 0.0) + report.duration
    return report


@pytest.fixture
def open_notebook(request, lab, browser_context) -> Iterator[Callable[[str], Notebook]]:
    """Yields a function that opens a notebook (path relative to notebooks/) in a new tab."""
    opened: list[Notebook] = []

    def _open(name: str) -> Notebook:
        """Opens notebook ``name``, or the one notebook whose name starts with it ("01_")."""
        if not name.endswith(".ipynb"):
            found = sorted(p.name for p in lab.root_dir.glob(f"{name}*.ipynb"))
            if len(found) != 1:
                raise FileNotFoundError(f"expected one notebook {name}*.ipynb in {NOTEBOOK_DIR}, "
                                        f"found {found}")
            name = found[0]
        if not (lab.root_dir / name).is_file():
            known = sorted(p.name for p in lab.root_dir.glob("*.ipynb"))
            raise FileNotFoundError(f"no notebook {name!r} in {NOTEBOOK_DIR}; there are {known}")
        shots = ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name).strip("-")
        if not opened:
            shutil.rmtree(shots, ignore_errors=True)  # an earlier run's shots would mislead
        nb = Notebook(browser_context.new_page(), lab, name, shots)
        opened.append(nb)
        return nb.open()

    yield _open
    failed = getattr(request.node, "_report_call", None)
    for nb in opened:
        if failed is not None and failed.failed and not nb.page.is_closed():
            nb.shot("failure")
        nb.close()
    # Each test leaves the server as it found it: no kernel keeps running into the next one.
    for kernel in lab.api("kernels") or []:
        lab.api(f"kernels/{kernel['id']}", method="DELETE")


def pytest_terminal_summary(terminalreporter):
    if "JupyterLab server start" not in TIMINGS:
        return  # skipped, or only the server tests ran
    terminalreporter.section("browser test timings")
    for what, seconds in TIMINGS.items():
        terminalreporter.write_line(f"{what:<70} {seconds:7.1f} s")
    for test, seconds in TIMINGS_BY_TEST.items():
        terminalreporter.write_line(f"{test.split('::')[-1]:<70} {seconds:7.1f} s")
    terminalreporter.write_line(f"{'all browser tests (set-up, calls, tear-down)':<70} "
                                f"{sum(TIMINGS_BY_TEST.values()):7.1f} s")

"""`make lab`: the JupyterLab command line it runs, and the settings it installs into the venv.

The command line is read with `make -n lab` (nothing runs), then started for real, as the
user this test runs as, with only a port and a token added. JupyterLab's own settings code
(jupyterlab_server) is the oracle for what lab-settings/overrides.json changes.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
OVERRIDES = ROOT / "lab-settings" / "overrides.json"
VENV = pathlib.Path(sys.prefix)  # the venv running the tests; `make -n` only prints
NEWS = "@jupyterlab/apputils-extension:notification"
WIDGETS = "@jupyter-widgets/jupyterlab-manager:plugin"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no `make` here")


def _make_n_lab(**variables: str) -> list[str]:
    """Returns the lines `make -n lab` prints (the commands it would run), for this venv."""
    args = ["make", "-n", "-s", "lab", f"VENV={VENV}"] + [f"{k}={v}" for k, v in
                                                           variables.items()]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def _lab_command(**variables: str) -> list[str]:
    lines = [ln for ln in _make_n_lab(**variables) if ln.startswith(f"{VENV}/bin/jupyter lab")]
    assert len(lines) == 1, _make_n_lab(**variables)
    return shlex.split(lines[0])


@pytest.mark.parametrize("user_id, root", [("0", True), ("1000", False)])
def test_lab_passes_allow_root_only_as_root(user_id, root):
    assert ("--allow-root" in _lab_command(USER_ID=user_id)) is root


def test_lab_as_this_user():
    assert ("--allow-root" in _lab_command()) is (os.geteuid() == 0)


def test_lab_turns_news_and_update_checks_off():
    cmd = _lab_command()
    assert "--LabApp.news_url=" in cmd
    assert "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate" in cmd
    assert "--notebook-dir=notebooks" in cmd


def test_lab_installs_the_overrides_into_the_venv_before_starting():
    lines = _make_n_lab()
    target = f"{VENV}/share/jupyter/lab/settings/overrides.json"
    copy = [i for i, ln in enumerate(lines)
            if shlex.split(ln) == ["cp", "lab-settings/overrides.json", target]]
    start = [i for i, ln in enumerate(lines) if ln.startswith(f"{VENV}/bin/jupyter lab")]
    assert copy and start and copy[0] < start[0], lines


def _settings(plugin: str, app_settings_dir: pathlib.Path, user_dir: pathlib.Path) -> dict:
    """Returns JupyterLab's view of a plugin's settings (schema with defaults, user values)."""
    from jupyter_core.paths import jupyter_path
    from jupyterlab_server.settings_utils import get_settings

    result, warnings = get_settings(
        str(app_settings_dir), str(VENV / "share" / "jupyter" / "lab" / "schemas"),
        str(user_dir), schema_name=plugin, labextensions_path=jupyter_path("labextensions"))
    assert not [w for w in warnings if w], warnings
    return result


def test_overrides_are_valid_defaults_for_jupyterlab(tmp_path):
    pytest.importorskip("jupyterlab_server")
    import jsonschema

    apps, user = tmp_path / "app-settings", tmp_path / "user"
    apps.mkdir()
    user.mkdir()
    before = {p: _settings(p, apps, user)["schema"] for p in (NEWS, WIDGETS)}
    shutil.copy(OVERRIDES, apps / "overrides.json")
    after = {p: _settings(p, apps, user)["schema"] for p in (NEWS, WIDGETS)}
    props = lambda schema, key: schema["properties"][key]["default"]  # noqa: E731
    # the stock defaults ask about news and do not save widget state ...
    assert props(before[NEWS], "fetchNews") == "none"
    assert props(before[WIDGETS], "saveState") is False
    # ... ours never fetch news nor check for updates, and save the widgets' state
    assert props(after[NEWS], "fetchNews") == "false"
    assert props(after[NEWS], "checkForUpdates") is False
    assert props(after[WIDGETS], "saveState") is True
    # every value is allowed by the plugin's own schema (a typo would be dropped silently)
    for plugin, values in json.loads(OVERRIDES.read_text()).items():
        for key, value in values.items():
            jsonschema.validate(value, before[plugin]["properties"][key])


@pytest.mark.slow
def test_lab_command_line_starts_jupyterlab(tmp_path):
    """make lab's command line, run as this user (root here in CI), serves the notebooks."""
    pytest.importorskip("jupyterlab")
    port = _free_port()
    token = secrets.token_hex(8)
    apps = tmp_path / "app-settings"
    apps.mkdir()
    shutil.copy(OVERRIDES, apps / "overrides.json")  # where make puts it, in a private copy
    cmd = _lab_command() + [
        "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
        f"--LabApp.app_settings_dir={apps}", f"--LabApp.user_settings_dir={tmp_path / 'user'}",
        f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}"]
    env = {**os.environ, "JUPYTER_PLATFORM_DIRS": "1",
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    log = tmp_path / "lab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        settings = _wait_for_settings(port, token, proc, log)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # as root, without --allow-root, jupyter would have exited ("Running as root is not
    # recommended") and _wait_for_settings would have failed, quoting the log
    text = log.read_text(errors="replace")
    assert "not recognized" not in text, text[-3000:]  # every flag is one JupyterLab knows
    assert settings["schema"]["properties"]["saveState"]["default"] is True


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_settings(port: int, token: str, proc: subprocess.Popen, log: pathlib.Path,
                       timeout: float = 120.0) -> dict:
    """Returns the widget manager's settings as the running server serves them."""
    url = f"http://127.0.0.1:{port}/lab/api/settings/{WIDGETS}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"make lab's jupyter exited with {proc.returncode}:\n"
                        f"{log.read_text(errors='replace')[-3000:]}")
        try:
            req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
            with urllib.request.urlopen(req, timeout=2) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(0.25)
    pytest.fail(f"make lab's jupyter did not answer within {timeout:.0f} s:\n"
                f"{log.read_text(errors='replace')[-3000:]}")

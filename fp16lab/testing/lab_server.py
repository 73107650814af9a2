"""A JupyterLab server on a loopback port, started for a test and always stopped after it.

``jupyter_server(root_dir)`` starts ``jupyter lab`` in its own process group with a random
token, waits until ``/api/status`` answers, and on leaving the ``with`` block (normally or
through an exception) stops the server, its kernels and anything else it started. Kernels
run in sessions of their own (jupyter_client starts them with ``start_new_session``), so a
process-group kill alone would orphan them: the server's descendants are recorded before it
is stopped and any survivor is killed afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator


@dataclasses.dataclass(frozen=True)
class LabServer:
    """A running JupyterLab server: where it listens, its token, its pid and its log file."""

    port: int
    token: str
    root_dir: pathlib.Path
    pid: int
    log_path: pathlib.Path

    @property
    def base_url(self) -> str:
        """Returns the server's root URL, ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def notebook_url(self, name: str, workspace: str | None = None) -> str:
        """Returns the URL that opens notebook ``name`` (relative to root_dir) in JupyterLab.

        With ``workspace``, the page uses that named workspace instead of the default one, which
        reopens every tab an earlier page left open (and starts their kernels).
        """
        where = f"workspaces/{workspace}/" if workspace else ""
        return f"{self.base_url}/lab/{where}tree/{name}?token={self.token}"

    def api(self, path: str, method: str = "GET", timeout: float = 5.0) -> object:
        """Returns the decoded JSON answer of the server's REST API at ``/api/<path>``."""
        req = urllib.request.Request(f"{self.base_url}/api/{path.lstrip('/')}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def processes(self) -> list[int]:
        """Returns the pids of the server and every process it started that is still alive."""
        import psutil  # a dependency of ipykernel, hence present wherever JupyterLab is

        try:
            proc = psutil.Process(self.pid)
            return [self.pid] + [c.pid for c in proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def free_port() -> int:
    """Returns a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Asks Linux to send SIGTERM to the server if the process that started it dies first.

    Runs in the child between fork and exec; a pytest killed with SIGKILL (a CI time-out)
    then still takes the server, and through the server's shutdown its kernels, with it.
    """
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _jupyter_command() -> list[str]:
    exe = pathlib.Path(sys.executable).with_name("jupyter")
    return [str(exe), "lab"] if exe.exists() else [sys.executable, "-m", "jupyterlab"]


@contextlib.contextmanager
def jupyter_server(root_dir: str | os.PathLike, *, startup_timeout: float = 120.0,
                   log_path: str | os.PathLike | None = None,
                   user_settings: dict[str, dict] | None = None,
                   expose_app: bool = False,
                   env: dict[str, str] | None = None) -> Iterator[LabServer]:
    """Yields a running JupyterLab server serving ``root_dir``; stops it and its kernels on exit.

    Args:
        root_dir: the folder JupyterLab serves (its notebooks are written to when saved, so
            pass a temporary copy, not a committed folder).
        startup_timeout: seconds to wait for ``/api/status`` to answer before giving up.
        log_path: where the server's stdout and stderr go; a file in root_dir's parent by default.
        user_settings: JupyterLab settings by plugin id, e.g.
            ``{"@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"}}``. The server
            gets private settings, workspace and runtime folders, so neither the user's own
            settings nor a previous run's open tabs change what a test sees.
        expose_app: expose the JupyterLab application as ``window.jupyterapp`` (for tests that
            read the notebook model in the page).
        env: extra environment variables for the server and the kernels it starts.

    Raises:
        NotADirectoryError: root_dir is not a folder.
        RuntimeError: the server exited or did not answer within startup_timeout (its log is quoted).
    """
    root = pathlib.Path(root_dir).resolve()
    if not root.is_dir():
        raise NotADirectoryError(f"root_dir must be an existing folder, got {str(root_dir)!r}")
    if startup_timeout <= 0:
        raise ValueError(f"startup_timeout must be > 0 seconds, got {startup_timeout!r}")
    port, token = free_port(), secrets.token_hex(16)
    log = pathlib.Path(log_path) if log_path else root.parent / f"jupyterlab-{port}.log"
    for plugin in user_settings or {}:
        if not plugin.rpartition(":")[0] or not plugin.rpartition(":")[2]:
            raise ValueError(f"user_settings keys are plugin ids like '@scope/package:plugin', "
                             f"got {plugin!r}")
    state = pathlib.Path(tempfile.mkdtemp(prefix="fp16lab-lab-state-"))
    for plugin, values in (user_settings or {}).items():
        package, _, name = plugin.rpartition(":")
        target = state / "settings" / package / f"{name}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))
    cmd = _jupyter_command() + [
        "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--ServerApp.port_retries=0", "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        f"--LabApp.user_settings_dir={state / 'settings'}",
        f"--LabApp.workspaces_dir={state / 'workspaces'}",
    ]
    if expose_app:
        cmd.append("--LabApp.expose_app_in_browser=True")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # CI runs as root
    env = {**os.environ, "JUPYTER_PLATFORM_DIRS": "1", "PYTHONUNBUFFERED": "1",
           "JUPYTER_RUNTIME_DIR": str(state / "runtime"), **(env or {})}
    try:
        with open(log, "wb") as log_file:
            proc = subprocess.Popen(
                cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=root,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    except BaseException:
        shutil.rmtree(state, ignore_errors=True)
        raise
    server = LabServer(port=port, token=token, root_dir=root, pid=proc.pid, log_path=log)
    try:
        _wait_until_up(server, proc, startup_timeout)
        yield server
    finally:
        _stop(proc)
        shutil.rmtree(state, ignore_errors=True)


def _wait_until_up(server: LabServer, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with code {proc.returncode} before answering; "
                               f"log:\n{_tail(server.log_path)}")
        try:
            server.api("status", timeout=2.0)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(0.25)
    raise RuntimeError(f"jupyter lab did not answer on port {server.port} within {timeout:.0f} s; "
                       f"log:\n{_tail(server.log_path)}")


def _tail(path: pathlib.Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as exc:
        return f"(log unreadable: {exc})"


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Stops the server gracefully (it shuts its kernels down), then kills whatever is left."""
    import psutil

    survivors = []
    with contextlib.suppress(psutil.NoSuchProcess):
        survivors = psutil.Process(proc.pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(survivors, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)

"""The launcher: a point's ranks started with torchrun, watched through their files, a row back each.

The files a launch leaves in its work folder are the protocol between the launcher and the
ranks (``fp16lab.distributed_worker``): ``job.json`` (what to run), ``progress_rank<r>.json``
(which point and phase a rank is in, with its pid), ``error_rank<r>.json`` (what a rank raised),
``row_<i>.json`` (rank 0's row for point ``i``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .points import DistPoint

#: Seconds a point may run once its ranks have started it, and seconds torchrun may take to
#: bring the ranks up (import torch, rendezvous, init the process group).
DEFAULT_TIMEOUT_S, DEFAULT_STARTUP_TIMEOUT_S = 300.0, 180.0

#: Environment variables that shape NCCL and are recorded in every row (set or not).
NCCL_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
            "NCCL_ALGO", "NCCL_PROTO", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_P2P_DISABLE")


@dataclass
class Launch:
    """What one torchrun launch returned: a row per item, the exit code, the log's tail."""

    rows: list[dict[str, Any]]
    returncode: int | None
    log_tail: str
    seconds: float
    workdir: str = field(default="")


def launch_command(nproc: int, target: Sequence[str]) -> list[str]:
    """Returns the torchrun command line that starts ``nproc`` ranks of ``target`` on this host."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", *target]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # absent, or caught half-written by a rank
        return None


def _progress(workdir: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for p in workdir.glob("progress_rank*.json"):
        info = _read_json(p)
        if isinstance(info, dict):
            out[int(info["rank"])] = info
    return out


def _stop(proc: subprocess.Popen, workdir: Path) -> None:
    """Ends torchrun and its ranks (each rank runs in its own session): TERM, then KILL by pid."""
    pids = [info.get("pid") for info in _progress(workdir).values() if info.get("pid")]

    def signal_all(sig: int) -> None:
        for kill, target in [(os.killpg, proc.pid)] + [(os.kill, p) for p in pids]:
            try:
                kill(target, sig)
            except (ProcessLookupError, PermissionError):
                pass

    signal_all(signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    signal_all(signal.SIGKILL)  # whatever ignored TERM (a rank stuck in a collective)
    proc.wait()


def run_ranks(nproc: int, target: Sequence[str], items: Sequence[dict[str, Any]], *,
              timeout_s: float = DEFAULT_TIMEOUT_S,
              startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
              env: dict[str, str] | None = None, workdir: str | Path | None = None) -> Launch:
    """Launches ``nproc`` ranks of ``target`` with torchrun and returns a row per item.

    ``target`` is what torchrun runs (``['-m', 'fp16lab.distributed_worker']`` or a script
    path and its arguments); it is given ``--workdir DIR`` and finds the items in
    ``DIR/job.json``. An item whose rank 0 wrote ``row_<i>.json`` gets that row; the item that
    was running when a rank raised, hung past ``timeout_s`` (counted from when its first rank
    started it) or crashed gets ``status='error'`` and the reason; later items get
    ``status='error'`` saying they were not run. The environment is passed through (NCCL's
    variables included) with this package importable.
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive integer, got {nproc!r}")
    if not items:
        raise ValueError("run_ranks needs at least one item to run")
    for name, value in (("timeout_s", timeout_s), ("startup_timeout_s", startup_timeout_s)):
        if not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fp16lab-dist-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "job.json").write_text(json.dumps({"items": list(items)}))
    environ = dict(os.environ if env is None else env)
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding fp16lab/
    environ["PYTHONPATH"] = os.pathsep.join(
        [package_root] + [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    environ.setdefault("OMP_NUM_THREADS", "1")
    log_path = work / "torchrun.log"
    t0 = time.monotonic()
    reason = None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(launch_command(nproc, [*target, "--workdir", str(work)]),
                                stdout=log, stderr=subprocess.STDOUT, env=environ,
                                start_new_session=True)
        while proc.poll() is None:
            time.sleep(0.1)
            done = sum((work / f"row_{i}.json").exists() for i in range(len(items)))
            if done == len(items):
                try:  # every row is in: the ranks are only tearing down
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    _stop(proc, work)
                break
            ranks = _progress(work)
            on_item = {r: info for r, info in ranks.items() if info.get("item") == done}
            now = time.time()
            if on_item:
                started = min(info["item_started"] for info in on_item.values())
                if now - started > timeout_s:
                    phases = ", ".join(f"rank {r} in '{ranks[r]['phase']}' of point {ranks[r]['item']}"
                                       for r in sorted(ranks))
                    missing = sorted(set(range(nproc)) - set(ranks))
                    reason = (f"timed out: the point did not finish within {timeout_s:g} s of starting "
                              f"({phases}{'; ranks ' + str(missing) + ' never reported' if missing else ''})")
                    _stop(proc, work)
            elif done == 0 and time.monotonic() - t0 > startup_timeout_s:
                reason = f"timed out: torchrun did not bring up the ranks within {startup_timeout_s:g} s"
                _stop(proc, work)
    seconds = time.monotonic() - t0
    tail = log_path.read_text(errors="replace")[-4000:]
    rows: list[dict[str, Any]] = []
    failed = False
    for i, item in enumerate(items):
        row = None if failed else _read_json(work / f"row_{i}.json")
        if row is not None:
            rows.append(row)
            continue
        if failed:
            rows.append({**item, "status": "error", "error": "not run: an earlier point of the same launch failed"})
            continue
        failed = True
        errors = [e for e in (_read_json(p) for p in sorted(work.glob("error_rank*.json"))) if e]
        errors = [e for e in errors if e.get("item") == i] or errors
        if reason is None and errors:
            first = min(errors, key=lambda e: e.get("t", 0))
            reason = f"rank {first['rank']} raised {first['type']}: {first['message']}"
        if reason is None:
            last = [ln for ln in tail.splitlines() if ln.strip()][-3:]
            reason = f"torchrun exited with code {proc.returncode} and no row; log ends: {' | '.join(last)}"
        status = "oom" if errors and all(e.get("type") == "OutOfMemoryError" for e in errors) else "error"
        rows.append({**item, "status": status, "error": reason})
    return Launch(rows, proc.returncode, tail, seconds, str(work))


def measure_points(points: Sequence[DistPoint], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                   startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
                   workdir: str | Path | None = None,
                   env_overrides: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Returns one row per point, measured in one torchrun launch of ``gpus`` ranks.

    ``env_overrides`` (e.g. ``{"NCCL_ALGO": "Tree"}``) are set for the ranks on top of this
    process's environment; every row records the NCCL variables its ranks saw.

    All points must share ``gpus`` and ``device``. A row holds the point's settings, ``status``
    (``ok``, ``oom`` or ``error`` with ``error``), the slowest rank's median and mean step time,
    ``samples_per_s`` (all ranks together), ``per_rank`` timings and peak memory, and with
    ``profile_steps`` the communication split of :func:`comm_overlap`.
    """
    points = list(points)
    if not points or not all(isinstance(p, DistPoint) for p in points):
        raise ValueError("measure_points needs a non-empty list of DistPoint")
    shape = {(p.gpus, p.device) for p in points}
    if len(shape) != 1:
        raise ValueError(f"points of one launch must share gpus and device; got {sorted(shape)}")
    gpus, device = shape.pop()
    if device == "cuda":
        import torch

        have = torch.cuda.device_count()
        if gpus > have:
            raise ValueError(f"{gpus} GPUs asked for, torch sees {have} here")
    overrides = dict(env_overrides or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in overrides.items()):
        raise ValueError(f"env_overrides must map names to strings, got {env_overrides!r}")
    items = [{"task": "train", **p.settings()} for p in points]
    launch = run_ranks(gpus, ["-m", "fp16lab.distributed_worker"], items, timeout_s=timeout_s,
                       startup_timeout_s=startup_timeout_s, workdir=workdir,
                       env={**os.environ, **overrides})
    return [{**row, "label": p.label(), "launch_seconds": launch.seconds}
            for p, row in zip(points, launch.rows)]


def measure_point(point: DistPoint, **kwargs: Any) -> dict[str, Any]:
    """Returns the row of one point in its own launch (what a sweep calls per ``gpus`` point)."""
    return measure_points([point], **kwargs)[0]


CHECKS = {
    "found_inf": "GradScaler under DDP with an inf planted on rank inf_rank (optional comm_hook)",
    "allreduce": "one gradient per rank, values[r], averaged by DDP under each of hooks",
    "buffers": "one batch per rank, values[r], through a BatchNorm under DDP with broadcast_buffers",
    "sharded_found_inf": "ShardedGradScaler under FSDP2 (amp-fp16) with an inf planted in rank "
                         "inf_rank's shard of a gradient",
    "sharded_reduce": "a classifier trained under FSDP2 once per reduce_dtypes (default fp32, "
                      "bf16) for steps steps in precision: losses and the first step's gradient "
                      "error",
}


def run_checks(tasks: Sequence[tuple[str, dict[str, Any]]], nproc: int = 2, *, device: str = "cpu",
               timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Returns rank 0's row of each small demonstration run, all in one launch of ``nproc`` ranks.

    ``tasks`` are ``(name, arguments)`` pairs with names from ``CHECKS``; ``device='cpu'`` runs
    them on gloo, ``'cuda'`` on NCCL. Raises RuntimeError with the rank's message if one fails.
    """
    for name, args in tasks:
        if name not in CHECKS:
            raise ValueError(f"task must be one of {', '.join(CHECKS)}, got {name!r}")
        if not isinstance(args, dict):
            raise ValueError(f"the arguments of task {name!r} must be a dict, got {args!r}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' (gloo) or 'cuda' (NCCL), got {device!r}")
    rows = run_ranks(nproc, ["-m", "fp16lab.distributed_worker"],
                     [{"task": name, "device": device, **args} for name, args in tasks],
                     timeout_s=timeout_s).rows
    for (name, _), row in zip(tasks, rows):
        if row.get("status") != "ok":
            raise RuntimeError(f"the {name} run failed: {row.get('error')}")
    return rows


def run_check(task: str, nproc: int = 2, *, device: str = "cpu", timeout_s: float = 60.0,
              **args: Any) -> dict[str, Any]:
    """Returns rank 0's row of one demonstration run (see :func:`run_checks`)."""
    return run_checks([(task, args)], nproc, device=device, timeout_s=timeout_s)[0]

"""Training on several GPUs: a point's ranks launched with torchrun, one measured row back.

PyTorch does the distributed work: ``torchrun`` (``python -m torch.distributed.run``) starts one
process per GPU, DDP or FSDP2 (``fully_shard`` with a ``MixedPrecisionPolicy``) averages the
gradients. fp16lab adds three things:

- :class:`DistPoint`, one measured configuration: model, batch per GPU, precision (``fp32``,
  ``amp-fp16``, ``amp-bf16``), optimizer, number of GPUs, DDP or FSDP, and the settings that decide how
  gradients travel (comm hook, bucket size, ``gradient_as_bucket_view``, ``static_graph``, FSDP
  ``reduce_dtype``) and DDP's ``broadcast_buffers``;
- :func:`measure_points`, which launches the ranks (``fp16lab.distributed_worker`` does the
  work in each), waits at most ``timeout_s`` per point and returns one row per point; a rank that
  raises or hangs makes that point's row ``status='error'`` with the rank's message, and the
  caller goes on;
- the arithmetic of communication: :func:`comm_overlap` (how much of a step the collectives
  take, how much of that no compute kernel hides, and how long the GPU runs nothing),
  :func:`allreduce_seconds` (ring all-reduce time from bytes, ranks and bus bandwidth) and
  :func:`bus_bandwidth_gbs` (the other way round, from a measured time).

The files a launch leaves in its work folder are the protocol between the launcher and the
ranks: ``job.json`` (what to run), ``progress_rank<r>.json`` (which point and phase a rank is
in, with its pid), ``error_rank<r>.json`` (what a rank raised), ``row_<i>.json`` (rank 0's row
for point ``i``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

from .models import MODELS, is_image_model
from .recipes import OPTIMIZERS

#: Precisions a distributed point can train in (the names mean what they mean everywhere).
PRECISIONS = ("fp32", "amp-fp16", "amp-bf16")

#: How the gradients are averaged across ranks.
STRATEGIES = {
    "ddp": "DistributedDataParallel: every rank holds the whole model; gradients all-reduced in buckets",
    "fsdp": "FSDP2 fully_shard: parameters, gradients and optimizer state sharded; all-gather + reduce-scatter",
}

#: DDP communication hooks: the precision the gradient buckets travel in.
COMM_HOOKS = {
    "none": "no hook: buckets all-reduced in the gradients' own dtype (fp32)",
    "fp16": "torch's fp16_compress_hook: bucket cast to fp16, divided by the world size, all-reduced",
    "bf16": "torch's bf16_compress_hook: the same in bf16",
}

#: FSDP reduce dtypes: the precision gradients are reduce-scattered in.
REDUCE_DTYPES = ("fp32", "bf16", "fp16")

#: Models a point can train: fp16lab.models plus a parameter-heavy transformer stack.
DIST_MODELS = {**MODELS, "transformer_stack": (
    "6 pre-norm transformer encoder layers, hidden 2048, 16 heads, on 64 tokens (~300M parameters): "
    "a model whose gradient all-reduce is large next to its compute")}

#: The measurement protocol, written once: warm-up steps, timed steps, cudnn.benchmark (off, as
#: in the one-GPU sweep's default, so the two measure the same thing).
WARMUP, STEPS, CUDNN_BENCHMARK = 10, 30, False

#: Seconds a point may run once its ranks have started it, and seconds torchrun may take to
#: bring the ranks up (import torch, rendezvous, init the process group).
DEFAULT_TIMEOUT_S, DEFAULT_STARTUP_TIMEOUT_S = 300.0, 180.0

#: Environment variables that shape NCCL and are recorded in every row (set or not).
NCCL_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
            "NCCL_ALGO", "NCCL_PROTO", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_P2P_DISABLE")

#: Faults a point can plant, for tests and the notebook: ``raise@R`` (rank R raises in its
#: first timed step) or ``hang@R`` (rank R sleeps forever there).
FAULTS = ("raise", "hang")


@dataclass(frozen=True)
class DistPoint:
    """One distributed training configuration to measure.

    Args:
        model: a name in ``DIST_MODELS``.
        batch: samples per GPU (the global batch is ``batch * gpus``).
        precision: ``fp32``, ``amp-fp16`` (autocast + GradScaler) or ``amp-bf16`` (autocast).
        optimizer: a name in ``fp16lab.recipes.OPTIMIZERS`` (``sgd``, or ``sgd-fused``, whose
            step takes GradScaler's found-inf without a host sync).
        gpus: number of ranks; 1 trains the plain model (the single-GPU baseline, no wrapper).
        strategy: ``ddp`` or ``fsdp``.
        comm_hook: DDP only: ``none``, ``fp16`` or ``bf16``.
        bucket_cap_mb, gradient_as_bucket_view, static_graph: DDP's own arguments.
        broadcast_buffers: DDP's own argument: True broadcasts rank 0's buffers (BatchNorm's
            running statistics) to every rank at the start of each forward; False lets each
            rank keep its own.
        reduce_dtype: FSDP only: the gradients' reduce-scatter dtype.
        layout: ``channels_last`` or ``nchw`` (image models); None picks channels_last for them.
        device: ``cuda`` (NCCL, one GPU per rank) or ``cpu`` (gloo).
        warmup, steps: untimed and timed steps.
        profile_steps: extra steps under torch.profiler to split the step into compute and
            communication (CUDA only; 0 skips).
        fault: ``''``, ``'raise@R'`` or ``'hang@R'`` (see ``FAULTS``).
    """

    model: str = "resnet50"
    batch: int = 256
    precision: str = "amp-fp16"
    optimizer: str = "sgd"
    gpus: int = 1
    strategy: str = "ddp"
    comm_hook: str = "none"
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    broadcast_buffers: bool = True
    reduce_dtype: str = "fp32"
    layout: str | None = None
    device: str = "cuda"
    warmup: int = WARMUP
    steps: int = STEPS
    profile_steps: int = 0
    fault: str = ""

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        check(self.model in DIST_MODELS, f"unknown model {self.model!r}; known: {', '.join(DIST_MODELS)}")
        check(isinstance(self.batch, int) and self.batch >= 1,
              f"batch (per GPU) must be a positive integer, got {self.batch!r}")
        check(self.precision in PRECISIONS,
              f"precision {self.precision!r} is not offered across GPUs; allowed: {', '.join(PRECISIONS)}")
        check(self.optimizer in OPTIMIZERS,
              f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        check(isinstance(self.gpus, int) and self.gpus >= 1, f"gpus must be a positive integer, got {self.gpus!r}")
        check(self.strategy in STRATEGIES, f"strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        check(self.comm_hook in COMM_HOOKS, f"comm_hook must be one of {', '.join(COMM_HOOKS)}, got {self.comm_hook!r}")
        check(self.reduce_dtype in REDUCE_DTYPES,
              f"reduce_dtype must be one of {', '.join(REDUCE_DTYPES)}, got {self.reduce_dtype!r}")
        check(self.strategy == "ddp" or self.comm_hook == "none",
              "comm_hook applies to DDP only; FSDP sets its gradient precision with reduce_dtype")
        check(self.strategy == "fsdp" or self.reduce_dtype == "fp32",
              "reduce_dtype applies to FSDP only; DDP sets its gradient precision with comm_hook")
        # GradScaler's found-inf must agree across ranks; under FSDP every rank holds only a
        # shard of the gradients, a case this package does not measure or check.
        check(not (self.strategy == "fsdp" and self.precision == "amp-fp16"),
              "strategy 'fsdp' is offered with fp32 and amp-bf16 (no loss scaler); use ddp for amp-fp16")
        check(isinstance(self.bucket_cap_mb, (int, float)) and self.bucket_cap_mb > 0,
              f"bucket_cap_mb must be a positive number, got {self.bucket_cap_mb!r}")
        check(isinstance(self.broadcast_buffers, bool),
              f"broadcast_buffers must be True or False, got {self.broadcast_buffers!r}")
        check(self.device in ("cuda", "cpu"), f"device must be 'cuda' or 'cpu', got {self.device!r}")
        image = self.model != "transformer_stack" and is_image_model(self.model)
        if self.layout is None:
            object.__setattr__(self, "layout", "channels_last" if image else "nchw")
        check(self.layout in ("nchw", "channels_last"), f"layout must be 'nchw' or 'channels_last', got {self.layout!r}")
        check(image or self.layout == "nchw", f"layout 'channels_last' applies to image models only, not {self.model!r}")
        for name in ("warmup", "steps", "profile_steps"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= (1 if name == "steps" else 0),
                  f"{name} must be an integer >= {1 if name == 'steps' else 0}, got {value!r}")
        if self.fault:
            kind, _, rank = self.fault.partition("@")
            check(kind in FAULTS and rank.isdigit() and int(rank) < self.gpus,
                  f"fault must be '', 'raise@R' or 'hang@R' with R < gpus={self.gpus}, got {self.fault!r}")

    def settings(self) -> dict[str, Any]:
        """Returns the point's fields as a plain dict (what a row starts with)."""
        return asdict(self)

    def label(self) -> str:
        """Returns a short name like 'resnet50 b256 amp-fp16 x2 ddp hook=fp16' ('opt=sgd-fused' last
        where the optimizer is not the default)."""
        parts = [self.model, f"b{self.batch}", self.precision, f"x{self.gpus}"]
        if self.gpus > 1:
            parts.append(self.strategy)
            if self.strategy == "ddp":
                parts += [f"hook={self.comm_hook}", f"bucket={self.bucket_cap_mb:g}MB"]
                if self.static_graph:
                    parts.append("static_graph")
                if not self.gradient_as_bucket_view:
                    parts.append("no_bucket_view")
                if not self.broadcast_buffers:
                    parts.append("no_broadcast")
            else:
                parts.append(f"reduce={self.reduce_dtype}")
        if self.optimizer != "sgd":
            parts.append(f"opt={self.optimizer}")
        return " ".join(parts)


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
    package_root = str(Path(__file__).resolve().parent.parent)
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


def comm_overlap(kernels: Sequence[tuple[str, float, float]], *, steps: int = 1,
                 comm_marker: str = "nccl") -> dict[str, float]:
    """Returns how much of a step communication takes, and how much of it nothing hides.

    Args:
        kernels: ``(name, start_us, end_us)`` of every GPU kernel in ``steps`` steps (from
            torch.profiler); a kernel is communication when its name contains ``comm_marker``.
        steps: how many steps the kernels cover (the results are per step).

    Returns ``span_us`` (first start to last end), ``compute_us`` and ``comm_us`` (busy time:
    the union of each kind's intervals), ``exposed_comm_us`` (communication while no compute
    kernel runs), ``overlapped_comm_us``, ``idle_us`` (no kernel of either kind running: the
    GPU waits for the host) and the shares ``comm_share``, ``exposed_comm_share`` and
    ``idle_share`` of the span.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    marker = comm_marker.lower()
    comm = _union([(s, e) for n, s, e in kernels if marker in n.lower()])
    compute = _union([(s, e) for n, s, e in kernels if marker not in n.lower()])
    busy_comm = sum(e - s for s, e in comm)
    exposed = busy_comm - _intersection(comm, compute)
    busy = sum(e - s for s, e in _union(comm + compute))
    span = (max(e for _, _, e in kernels) - min(s for _, s, _ in kernels)) if kernels else 0.0
    per = {"span_us": span, "compute_us": sum(e - s for s, e in compute), "comm_us": busy_comm,
           "exposed_comm_us": exposed, "overlapped_comm_us": busy_comm - exposed, "idle_us": span - busy}
    per = {k: v / steps for k, v in per.items()}
    share = (lambda x: x / per["span_us"]) if per["span_us"] > 0 else (lambda x: 0.0)
    return {**per, "comm_share": share(per["comm_us"]), "exposed_comm_share": share(per["exposed_comm_us"]),
            "idle_share": share(per["idle_us"])}


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Returns the length covered by both of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def allreduce_seconds(nbytes: float, ranks: int, bus_gbs: float) -> float:
    """Returns the time of a ring all-reduce of ``nbytes`` over ``ranks`` at ``bus_gbs`` GB/s.

    Each rank sends and receives ``2 (ranks - 1) / ranks`` times the buffer (a reduce-scatter
    then an all-gather); ``bus_gbs`` is the per-rank link rate NCCL reports as bus bandwidth.
    """
    if nbytes < 0 or not isinstance(ranks, int) or ranks < 1 or bus_gbs <= 0:
        raise ValueError(f"need nbytes >= 0, an integer ranks >= 1 and bus_gbs > 0; got "
                         f"{nbytes!r}, {ranks!r}, {bus_gbs!r}")
    return 2 * (ranks - 1) / ranks * nbytes / (bus_gbs * 1e9)


def bus_bandwidth_gbs(nbytes: float, ranks: int, seconds: float) -> float:
    """Returns the bus bandwidth (GB/s) of an all-reduce of ``nbytes`` on ``ranks`` that took ``seconds``.

    NCCL's convention (nccl-tests): ``busbw = 2 (ranks - 1) / ranks * nbytes / seconds``, the
    rate each rank's link carried in a ring all-reduce, comparable across rank counts and with
    the link's own rate; the inverse of :func:`allreduce_seconds`.
    """
    if nbytes < 0 or not isinstance(ranks, int) or ranks < 1 or not seconds > 0:
        raise ValueError(f"need nbytes >= 0, an integer ranks >= 1 and seconds > 0; got "
                         f"{nbytes!r}, {ranks!r}, {seconds!r}")
    return 2 * (ranks - 1) / ranks * nbytes / seconds / 1e9


def scaling_efficiency(rate_n: float, rate_1: float, n: int) -> float:
    """Returns rate on ``n`` GPUs over ``n`` times the rate on one (1.0 is perfect scaling)."""
    if rate_n <= 0 or rate_1 <= 0 or n < 1:
        raise ValueError(f"rates must be positive and n >= 1; got {rate_n!r}, {rate_1!r}, {n!r}")
    return rate_n / (n * rate_1)


def point_fields() -> list[str]:
    """Returns DistPoint's field names (the columns a row starts with)."""
    return [f.name for f in fields(DistPoint)]

"""What each rank runs under torchrun: ``python -m fp16lab.distributed_worker --workdir DIR``.

The rank reads ``DIR/job.json`` (a list of items, each ``{"task": ..., ...}``), runs the items in
order and reports through files: ``progress_rank<r>.json`` when it starts an item or a phase,
``error_rank<r>.json`` when it raises, and, on rank 0, ``row_<i>.json`` with the item's row
(every rank's figures gathered into it). :func:`fp16lab.distributed.run_ranks` reads them.

Tasks: ``train`` (a :class:`fp16lab.distributed.DistPoint` measured: warm-up, timed steps, peak
memory, optionally the profiler's communication split), ``found_inf`` (GradScaler under DDP with
an inf planted on one rank), ``allreduce`` (a chosen gradient per rank averaged by DDP with
each comm hook) and ``buffers`` (a chosen batch per rank through a BatchNorm under DDP, with or
without ``broadcast_buffers``: each rank's running statistics at every forward).
"""

from __future__ import annotations

import argparse
import functools
import gc
import inspect
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .distributed import CUDNN_BENCHMARK, NCCL_ENV, DistPoint, comm_overlap, point_fields
from .distributed.sharded import loss_scaler, shard, sharded_found_inf, sharded_reduce
from .measure import step_times_ms
from .models import NUM_CLASSES, build_model, input_shape
from .profile import gpu_kernels
from . import workload
from .recipes import LR, MOMENTUM, make_train_step, optimizer_factory, set_tf32
from .workload import load_workload

#: The reduce dtypes of FSDP points, by name.


class Reporter:
    """Writes this rank's progress, error and (rank 0) row files into the launch's work folder."""

    def __init__(self, workdir: Path, rank: int):
        self.workdir, self.rank = workdir, rank
        self.item, self.item_started = -1, 0.0

    def _write(self, name: str, payload: dict[str, Any]) -> None:
        tmp = self.workdir / f".{name}.{self.rank}.tmp"
        tmp.write_text(json.dumps(payload))
        tmp.replace(self.workdir / name)  # a reader never sees half a file

    def phase(self, phase: str, item: int | None = None) -> None:
        """Records that this rank entered ``phase`` (of a new ``item`` when given)."""
        if item is not None:
            self.item, self.item_started = item, time.time()
        self._write(f"progress_rank{self.rank}.json",
                    {"rank": self.rank, "pid": os.getpid(), "item": self.item, "phase": phase,
                     "item_started": self.item_started, "t": time.time()})

    def error(self, exc: BaseException) -> None:
        """Records what this rank raised."""
        self._write(f"error_rank{self.rank}.json",
                    {"rank": self.rank, "item": self.item, "type": type(exc).__name__,
                     "message": str(exc).strip().splitlines()[0][:500] if str(exc).strip() else "",
                     "traceback": traceback.format_exc()[-2000:], "t": time.time()})

    def row(self, item: int, row: dict[str, Any]) -> None:
        """Writes the item's row (rank 0 only)."""
        if self.rank == 0:
            self._write(f"row_{item}.json", row)


class Context:
    """The rank's place in the launch: rank, world size, device, backend and reporter."""

    def __init__(self, reporter: Reporter, device: torch.device):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device, self.backend, self.report = device, dist.get_backend(), reporter

    def gather(self, obj: Any) -> list[Any]:
        """Returns every rank's ``obj``, in rank order."""
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


# --------------------------------------------------------------------------- models and steps

class TransformerStack(nn.Module):
    """Pre-norm transformer encoder layers over token embeddings, mean-pooled into a classifier."""

    def __init__(self, hidden: int = 2048, layers: int = 6, heads: int = 16,
                 num_classes: int = NUM_CLASSES):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(hidden, heads, dim_feedforward=4 * hidden, dropout=0.0,
                                       batch_first=True, norm_first=True) for _ in range(layers))
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


STACK_TOKENS, STACK_HIDDEN = 64, 2048


def build(name: str) -> nn.Module:
    """Returns a fresh model by name (``transformer_stack`` or a fp16lab.models name)."""
    return TransformerStack() if name == "transformer_stack" else build_model(name)


def batch_shape(name: str, batch: int) -> tuple[int, ...]:
    """Returns the shape of one input batch for the named model."""
    if name == "transformer_stack":
        return (batch, STACK_TOKENS, STACK_HIDDEN)
    return input_shape(name, batch)


def make_step(precision: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
              optimizer: str = "sgd", scaler: Any = "recipe") -> Callable[[], torch.Tensor]:
    """Returns one full training step (forward, loss, backward, ``optimizer``) in ``precision``:
    :func:`fp16lab.recipes.make_train_step`'s, of the model :func:`wrap` wrapped; ``scaler`` is
    its loss scaler (:func:`fp16lab.distributed.sharded.loss_scaler`)."""
    step, _ = make_train_step(precision, model, x, y, device=x.device.type,
                              optimizer=optimizer_factory(optimizer), loss_scaler=scaler)
    return step


def _bf16_hook_on_gloo(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    # DDP refuses bf16_compress_hook by name unless CUDA and NCCL are there; gloo reduces bf16
    # fine, so on a CPU the same hook is registered under this name.
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(state, bucket)


# DDP checks a hook's annotations as objects; this module's future import made them strings.
_bf16_hook_on_gloo.__annotations__ = {"state": Any, "bucket": dist.GradBucket,
                                      "return": torch.futures.Future[torch.Tensor]}


def comm_hook(name: str, backend: str) -> Callable[..., Any] | None:
    """Returns torch's DDP comm hook for ``name`` (``none``, ``fp16``, ``bf16``), or None."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if name == "none":
        return None
    if name == "fp16":
        return default_hooks.fp16_compress_hook
    return default_hooks.bf16_compress_hook if backend == "nccl" else _bf16_hook_on_gloo


def buffer_sync_argument(flag: bool, ddp_init: Callable[..., Any]) -> dict[str, bool]:
    """Returns the keyword that gives ``ddp_init`` (DDP's ``__init__``) the point's ``broadcast_buffers``.

    torch 2.13 renamed the per-forward broadcast ``forward_sync_buffers`` and warns on the old
    name; older releases (the H200 runs' 2.11) know only ``broadcast_buffers``. The two differ
    only in whether buffers are also synced when DDP is built, which changes nothing here: every
    rank builds its model from the same seed.
    """
    return {("forward_sync_buffers" if "forward_sync_buffers" in _parameters(ddp_init)
             else "broadcast_buffers"): flag}


@functools.cache
def _parameters(fn: Callable[..., Any]) -> frozenset[str]:
    return frozenset(inspect.signature(fn).parameters)


def wrap(point: DistPoint, model: nn.Module, ctx: Context) -> nn.Module:
    """Returns the model wrapped in DDP or FSDP2 as the point says (unwrapped on one GPU)."""
    if ctx.world == 1:
        return model
    if point.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                  bucket_cap_mb=point.bucket_cap_mb,
                  gradient_as_bucket_view=point.gradient_as_bucket_view,
                  static_graph=point.static_graph,
                  **buffer_sync_argument(point.broadcast_buffers, DDP.__init__))
        hook = comm_hook(point.comm_hook, ctx.backend)
        if hook is not None:
            ddp.register_comm_hook(None, hook)  # None: the default (world) process group
        return ddp
    return shard(model, point.precision, point.reduce_dtype,
                 reshard_after_forward=point.reshard_after_forward)


# --------------------------------------------------------------------------- tasks

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _profiled(step: Callable[[], Any], steps: int, device: torch.device) -> dict[str, float]:
    """Returns :func:`comm_overlap` of ``steps`` steps read from torch.profiler's GPU kernels."""
    kernels = gpu_kernels(step, steps, lambda: _sync(device))
    return {**comm_overlap(kernels, steps=steps), "profiled_kernels": len(kernels)}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _workload_step(point: DistPoint, ctx: Context) -> tuple[nn.Module, Callable[[], Any]]:
    """Returns (model, step) of a workload point on this rank: the workload built by name with
    the same seed on every rank, its own batch, wrapped as the point says."""
    w = load_workload(point.model, **point.workload_settings)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = workload.build_model(w)
    w.check_can_run(point.precision, point.layout, model)
    model = model.to(ctx.device)
    inputs, targets = w.batch(point.batch, ctx.device)
    step = workload.step_of(w, point.precision, wrap(point, model, ctx), inputs, targets,
                            device=ctx.device, optimizer=optimizer_factory(point.optimizer),
                            loss_scaler=loss_scaler(point.precision, ctx.device.type,
                                                    point.strategy, ctx.world))
    return model, step


def train(item: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Measures one DistPoint on this rank and returns rank 0's row (all ranks gathered)."""
    point = DistPoint(**{k: item[k] for k in point_fields()})
    dev = ctx.device
    if dev.type == "cuda":
        # fp32 means fp32: no TF32 anywhere; cudnn.benchmark as the protocol says
        set_tf32(False)
        torch.backends.cudnn.benchmark = CUDNN_BENCHMARK
        torch.cuda.reset_peak_memory_stats(dev)
    ctx.report.phase("build")
    if point.is_workload:
        model, step = _workload_step(point, ctx)
    else:
        torch.manual_seed(0)  # the same initial weights on every rank
        with dev:  # initialised where it trains: 300M parameters initialise in seconds on a CPU
            model = build(point.model)
        torch.manual_seed(1000 + ctx.rank)  # different synthetic data on every rank
        x = torch.randn(batch_shape(point.model, point.batch), device=dev)
        y = torch.randint(0, NUM_CLASSES, (point.batch,), device=dev)
        if point.layout == "channels_last":
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        step = make_step(point.precision, wrap(point, model, ctx), x, y, point.optimizer,
                         loss_scaler(point.precision, dev.type, point.strategy, ctx.world))
    params = sum(p.numel() for p in model.parameters())
    ctx.report.phase("warm-up")
    for _ in range(point.warmup):
        step()
    _sync(dev)
    ctx.report.phase("timed steps")
    if point.fault:
        kind, _, rank = point.fault.partition("@")
        if int(rank) == ctx.rank:
            if kind == "raise":
                raise RuntimeError(f"a fault planted for the test: rank {ctx.rank} raises")
            time.sleep(10 ** 6)  # kind == "hang"
    ms = step_times_ms(step, point.steps, dev)
    profile = {}
    if point.profile_steps and dev.type == "cuda":
        ctx.report.phase("profiled steps")
        profile = _profiled(step, point.profile_steps, dev)
    mine = {"rank": ctx.rank, "step_ms_median": _median(ms), "step_ms_mean": sum(ms) / len(ms),
            "step_ms_min": min(ms), "step_ms_max": max(ms),
            "peak_memory_gib": (torch.cuda.max_memory_allocated(dev) / 2**30
                                if dev.type == "cuda" else None),
            "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", **profile}
    ranks = ctx.gather(mine)
    slowest_mean = max(r["step_ms_mean"] for r in ranks)
    row = {**point.settings(), "status": "ok", "error": None, "world_size": ctx.world,
           "backend": ctx.backend, "wrapper": "none" if ctx.world == 1 else point.strategy,
           "parameters": params, "optimizer_fused": bool(step.optimizer.defaults.get("fused")),
           "step_ms_median": max(r["step_ms_median"] for r in ranks), "step_ms_mean": slowest_mean,
           "samples_per_s": ctx.world * point.batch / (slowest_mean / 1e3),
           "peak_memory_gib": max((r["peak_memory_gib"] or 0) for r in ranks) or None,
           "per_rank": ranks, "env": {k: os.environ.get(k) for k in NCCL_ENV},
           "torch": torch.__version__,
           "nccl": (".".join(map(str, torch.cuda.nccl.version())) if ctx.backend == "nccl" else None)}
    if profile:  # rank 0's profile stands for the step (the ranks run in lockstep)
        row.update({k: ranks[0][k] for k in profile})
    return row


def found_inf(item: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """GradScaler under DDP with an inf in rank ``inf_rank``'s batch only: does every rank skip?

    Returns, per rank: whether its own (not yet all-reduced) gradients were finite, whether the
    all-reduced ones were, whether the optimizer step changed the weights, and the scale after
    ``update()``.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    inf_rank, init_scale = int(item.get("inf_rank", 1)), float(item.get("init_scale", 2.0 ** 10))
    hook_name = item.get("comm_hook", "none")
    dev = ctx.device
    ids = [dev.index] if dev.type == "cuda" else None
    torch.manual_seed(0)
    model = build_model("mlp").to(dev)
    ddp = DDP(model, device_ids=ids)
    hook = comm_hook(hook_name, ctx.backend)
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    scaler = torch.amp.GradScaler(dev.type, init_scale=init_scale)
    torch.manual_seed(100 + ctx.rank)
    x = torch.randn(input_shape("mlp", 8)).to(dev)
    y = torch.randint(0, NUM_CLASSES, (8,)).to(dev)
    if ctx.rank == inf_rank:
        x[0, 0] = float("inf")

    def finite_grads() -> bool:
        return all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())

    with ddp.no_sync():  # this rank's own gradients, before any all-reduce
        F.cross_entropy(ddp(x), y).mul(init_scale).backward()
    local = finite_grads()
    opt.zero_grad(set_to_none=True)
    before = [p.detach().clone() for p in model.parameters()]
    with torch.autocast(dev.type, dtype=torch.float16):
        loss = F.cross_entropy(ddp(x), y)
    scaler.scale(loss).backward()
    reduced = finite_grads()
    scaler.step(opt)
    scaler.update()
    stepped = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    ranks = ctx.gather({"rank": ctx.rank, "local_grads_finite": local,
                        "allreduced_grads_finite": reduced, "stepped": stepped,
                        "scale_after": float(scaler.get_scale())})
    return {"task": "found_inf", "status": "ok", "error": None, "inf_rank": inf_rank,
            "comm_hook": hook_name, "init_scale": init_scale, "backend": ctx.backend,
            "world_size": ctx.world, "ranks": ranks}


def allreduce(item: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Averages gradient ``values[rank]`` across ranks with DDP under each hook in ``hooks``.

    The model is ``Linear(n, 1, bias=False)`` and the loss ``sum(w . x)`` with ``x =
    values[rank]``, so each rank's own gradient is exactly its values (in fp32). Returns, per
    hook, every rank's averaged gradient and its dtype.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    values = item["values"]
    if len(values) != ctx.world or len({len(v) for v in values}) != 1:
        raise ValueError(f"values needs one equally long list per rank ({ctx.world}), got {values!r}")
    dev = ctx.device
    out = {}
    for name in item.get("hooks", ["none", "fp16", "bf16"]):
        layer = nn.Linear(len(values[0]), 1, bias=False).to(dev)
        ddp = DDP(layer, device_ids=[dev.index] if dev.type == "cuda" else None)
        hook = comm_hook(name, ctx.backend)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        ddp(torch.tensor([values[ctx.rank]], dtype=torch.float32, device=dev)).sum().backward()
        g = layer.weight.grad[0]
        out[name] = ctx.gather({"rank": ctx.rank, "dtype": str(g.dtype).replace("torch.", ""),
                                "grad": g.tolist()})
    return {"task": "allreduce", "status": "ok", "error": None, "values": values,
            "backend": ctx.backend, "world_size": ctx.world, "hooks": out}


def buffers(item: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Trains ``BatchNorm1d -> Linear`` on batch ``values[rank]`` under DDP with the item's ``broadcast_buffers``.

    The model is wrapped by :func:`wrap` (a DDP point with that setting) and trained ``steps``
    steps by the engine's step (fp32, SGD) on the same batch. Returns, per rank, the BatchNorm's
    ``running_mean`` and ``running_var`` as the wrapped module saw them at the start of each
    forward (after DDP's broadcast, where there is one) and after the last step.
    """
    values, steps = item["values"], int(item.get("steps", 2))
    if len(values) != ctx.world or len({(len(v), len(v[0])) for v in values}) != 1:
        raise ValueError(f"values needs one equally shaped batch (rows of features) per rank "
                         f"({ctx.world}), got {values!r}")
    dev = ctx.device
    # the point carries the DDP settings to wrap(); the model it trains is the one below
    point = DistPoint(model="mlp", batch=len(values[0]), precision="fp32", gpus=ctx.world,
                      device=dev.type, broadcast_buffers=item["broadcast_buffers"], steps=steps)
    features = len(values[0][0])
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.BatchNorm1d(features), nn.Linear(features, NUM_CLASSES)).to(dev)
    bn = model[0]

    def stats() -> dict[str, list[float]]:
        return {"running_mean": bn.running_mean.tolist(), "running_var": bn.running_var.tolist()}

    seen: list[dict[str, list[float]]] = []
    model.register_forward_pre_hook(lambda module, args: seen.append(stats()))
    x = torch.tensor(values[ctx.rank], dtype=torch.float32, device=dev)
    y = torch.arange(len(values[0]), device=dev) % NUM_CLASSES
    step = make_step(point.precision, wrap(point, model, ctx), x, y)
    for _ in range(steps):
        step()
    ranks = ctx.gather({"rank": ctx.rank, "at_forward": seen, "after": stats()})
    return {"task": "buffers", "status": "ok", "error": None, "values": values, "steps": steps,
            "broadcast_buffers": point.broadcast_buffers, "backend": ctx.backend,
            "world_size": ctx.world, "ranks": ranks}


TASKS = {"train": train, "found_inf": found_inf, "allreduce": allreduce, "buffers": buffers,
         "sharded_found_inf": sharded_found_inf, "sharded_reduce": sharded_reduce}


def main(argv: list[str] | None = None) -> int:
    """Runs the job's items on this rank; returns 0, or raises what an item raised."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True, type=Path)
    args = ap.parse_args(argv)
    items = json.loads((args.workdir / "job.json").read_text())["items"]
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    reporter = Reporter(args.workdir, rank)
    reporter.phase("start-up", item=-1)  # counted against the launcher's start-up timeout
    cuda = any(it.get("device") == "cuda" for it in items)
    try:
        if cuda:
            device = torch.device("cuda", local)
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device)
        else:
            device = torch.device("cpu")
            dist.init_process_group("gloo")
        ctx = Context(reporter, device)
        for i, item in enumerate(items):
            reporter.phase("start", item=i)
            reporter.row(i, TASKS[item["task"]](item, ctx))
            gc.collect()  # DDP and FSDP hold reference cycles: free this point's model now
            if device.type == "cuda":
                torch.cuda.empty_cache()
    except BaseException as exc:
        reporter.error(exc)
        raise
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

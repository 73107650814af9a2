"""The hand-written torchrun + DDP loop the distributed benchmark holds fp16lab against, one rank of it.

Each rank runs ``python -m fp16lab.bench.distributed_bare --workdir DIR`` under torchrun
(:func:`fp16lab.distributed.run_ranks` starts it and reads the rows); the items in
``DIR/job.json`` are of two tasks:

- ``busbw``: ``torch.distributed.all_reduce`` of fp32 buffers of ``sizes_mb``, per size the
  slowest rank's mean time and the bus bandwidth (:func:`fp16lab.distributed.bus_bandwidth_gbs`);
- ``loop``: one measurement of the loop a practitioner writes (ResNet-50, channels_last,
  synthetic batch, SGD with momentum) in one of :data:`VARIANTS` (what the step does) and one of
  :data:`MODES` (which GPUs train, and how). Every rank that trains reports its own step times
  (CUDA events), NVML clocks, power and busy share while it ran, and with ``profile_steps`` the
  profiler's split of its GPU time (:func:`fp16lab.distributed.comm_overlap`: compute, NCCL,
  exposed NCCL, idle).

The variants and modes are chosen so that one run tells apart why two GPUs lose speed when the
all-reduce itself is cheap: the host sync in GradScaler.step (gone in ``sgd-fused`` and
``bf16``), one GPU or its host being slower (``gpu0`` against ``gpu1``; idle time on one rank
while the other waits in NCCL), two processes competing for the host (``no-ddp``), DDP's
buffer broadcast at every forward (``ddp-no-broadcast``), and NCCL kernels slowing compute
(compute time under ``ddp`` against ``gpu0``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from fp16lab import validate
from fp16lab.distributed import bus_bandwidth_gbs, comm_overlap
from fp16lab.distributed_worker import Reporter
from fp16lab.models import NUM_CLASSES, build_model, input_shape
from fp16lab.profile import gpu_kernels
from fp16lab.recipes import set_tf32
from fp16lab.telemetry import TelemetrySampler

#: What the step does; each is written out in :func:`_make_step`.
VARIANTS = {
    "sgd": ("autocast fp16 + GradScaler + torch.optim.SGD (foreach): the loop as written; "
            "scaler.step reads found-inf on the host, a sync every step"),
    "sgd-fused": "the same with SGD(fused=True): GradScaler hands found-inf to the kernel, no sync",
    "bf16": "autocast bf16, no scaler, torch.optim.SGD (foreach): no scaler, no sync",
}

#: Which ranks train, and how.
MODES = {
    "gpu0": "rank 0 trains alone, the others wait on the CPU: the one-GPU rate",
    "gpu1": "rank 1 trains alone: whether the second GPU (and its host side) is as fast",
    "no-ddp": "every rank trains its own model at once, no communication: the cost of sharing the host",
    "ddp": "DDP(gradient_as_bucket_view=True): the loop",
    "ddp-no-broadcast": ("DDP(..., broadcast_buffers=False): without the BatchNorm buffers' "
                         "broadcast from rank 0 at the start of every forward"),
}

#: The precision and optimizer name (fp16lab's words) of each variant.
VARIANT_SETTINGS = {"sgd": ("amp-fp16", "sgd"), "sgd-fused": ("amp-fp16", "sgd-fused"),
                    "bf16": ("amp-bf16", "sgd")}


def trains(mode: str, rank: int) -> bool:
    """Returns whether ``rank`` trains in ``mode``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    return {"gpu0": rank == 0, "gpu1": rank == 1}.get(mode, True)


def loop_items(variants: list[str], modes: list[str], rounds: int, *, model: str, batch: int,
               device: str, warmup: int, steps: int, profile_steps: int) -> list[dict[str, Any]]:
    """Returns the ``loop`` items of a run, round after round, every variant and mode in each.

    Interleaving the rounds spreads a drift in clocks or temperature over every variant alike;
    only the first round profiles (the profiler's own cost stays out of the later rounds).
    """
    for name, chosen, known in (("variant", variants, VARIANTS), ("mode", modes, MODES)):
        bad = [c for c in chosen if c not in known]
        if bad or not chosen:
            raise ValueError(f"{name}s must be a non-empty list from {', '.join(known)}, got {chosen!r}")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    return [{"task": "loop", "variant": v, "mode": m, "round": r, "model": model, "batch": batch,
             "device": device, "warmup": warmup, "steps": steps,
             "profile_steps": profile_steps if r == 0 else 0}
            for r in range(rounds) for v in variants for m in modes]


# --------------------------------------------------------------------------- in the ranks

def _make_step(variant: str, model: Any, x: Any, y: Any, fused: bool) -> tuple[Callable[[], None], Any, Any]:
    """Returns (step, optimizer, scaler or None): the loop's body, written out as in notebook 08."""
    import torch
    import torch.nn.functional as F

    dev = x.device.type
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True if fused else None)
    if fused:  # torch's fused SGD leaves its momentum unset after a skipped first step (see recipes.sgd)
        for p in model.parameters():
            opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    if variant == "bf16":
        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()

        return step, opt, None
    scaler = torch.amp.GradScaler(dev)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev, dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return step, opt, scaler


# On purpose a copy of fp16lab.measure.step_times_ms: this loop is the independent oracle the
# engine (fp16lab.distributed_worker) is held against, so it shares none of the engine's code.
def _step_times_ms(step: Callable[[], None], steps: int, cuda: bool) -> list[float]:
    import torch

    if not cuda:
        out = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    torch.cuda.synchronize()
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    marks[0].record()
    for i in range(steps):
        step()
        marks[i + 1].record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]


def _profile_split(step: Callable[[], None], steps: int) -> dict[str, float]:
    """Returns :func:`fp16lab.distributed.comm_overlap` of ``steps`` steps' GPU kernels."""
    import torch

    return comm_overlap(gpu_kernels(step, steps, torch.cuda.synchronize), steps=steps)


def _loop(item: dict[str, Any], rank: int, local: int, control: Any) -> dict[str, Any]:
    """Measures one loop item on this rank; returns this rank's figures (``trained`` False if idle)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    mine: dict[str, Any] = {"rank": rank, "trained": trains(item["mode"], rank),
                            "cpus": len(os.sched_getaffinity(0))}
    dist.barrier(group=control)  # every rank starts the item together
    if not mine["trained"]:
        dist.barrier(group=control)
        return mine
    cuda = item["device"] == "cuda"
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    with dev:
        model = build_model(item["model"]).to(memory_format=torch.channels_last)
    torch.manual_seed(1000 + rank)
    x = torch.randn(input_shape(item["model"], item["batch"]), device=dev)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, NUM_CLASSES, (item["batch"],), device=dev)
    if item["mode"].startswith("ddp"):
        model = DDP(model, device_ids=[local] if cuda else None, gradient_as_bucket_view=True,
                    broadcast_buffers=item["mode"] == "ddp")
    step, opt, scaler = _make_step(item["variant"], model, x, y, fused=item["variant"] == "sgd-fused")
    for _ in range(item["warmup"]):
        step()
    sampler = TelemetrySampler(device_index=local, interval_s=0.1, enabled=cuda)
    with sampler:
        ms = _step_times_ms(step, item["steps"], cuda)
    profile = _profile_split(step, item["profile_steps"]) if cuda and item["profile_steps"] else {}
    t = sampler.summary
    mine.update({"step_ms": ms, "step_ms_mean": sum(ms) / len(ms), "step_ms_median": sorted(ms)[len(ms) // 2],
                 "optimizer_fused": bool(opt.defaults.get("fused")),
                 "scale_after": None if scaler is None else float(scaler.get_scale()),
                 "params_finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()),
                 "sm_clock_mhz_mean": t.sm_clock_mhz_mean, "power_w_mean": t.power_w_mean,
                 "gpu_busy_mean": t.gpu_busy_mean, **profile})
    del model, opt, scaler, step, x, y
    dist.barrier(group=control)
    return mine


def _busbw(item: dict[str, Any], world: int, local: int, cuda: bool) -> list[dict[str, Any]]:
    """Returns, per size, this rank's mean all-reduce time in ms."""
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    out = []
    for mb in item["sizes_mb"]:
        buf = torch.ones(int(mb * 2**20) // 4, dtype=torch.float32, device=dev)
        for _ in range(3):
            dist.all_reduce(buf)
        iters = item["iters"]
        if cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                dist.all_reduce(buf)
            b.record()
            torch.cuda.synchronize()
            ms = a.elapsed_time(b) / iters
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf)
            ms = (time.perf_counter() - t0) * 1e3 / iters
        out.append({"bytes": buf.numel() * 4, "ms": ms})
        del buf
    return out


def worker(workdir: Path) -> int:
    """One rank: runs the job's items in order, rank 0 writes a row per item."""
    import torch
    import torch.distributed as dist

    items = json.loads((workdir / "job.json").read_text())["items"]
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    report = Reporter(workdir, rank)
    report.phase("start-up", item=-1)
    cuda = items[0]["device"] == "cuda"
    try:
        if cuda:
            torch.cuda.set_device(local)
            dist.init_process_group("nccl", device_id=torch.device("cuda", local))
            set_tf32(False)
            torch.backends.cudnn.benchmark = False  # fp16lab.distributed.CUDNN_BENCHMARK
        else:
            dist.init_process_group("gloo")
        control = dist.new_group(backend="gloo")  # waiting ranks wait on the CPU, not in a GPU kernel
        for i, item in enumerate(items):
            report.phase(item["task"], item=i)
            gathered: list[Any] = [None] * world
            if item["task"] == "busbw":
                dist.all_gather_object(gathered, _busbw(item, world, local, cuda), group=control)
                sizes = [{"bytes": s[0]["bytes"], "ms": max(r["ms"] for r in s)} for s in zip(*gathered)]
                for s in sizes:
                    s["algbw_gbs"] = s["bytes"] / (s["ms"] / 1e3) / 1e9
                    s["busbw_gbs"] = bus_bandwidth_gbs(s["bytes"], world, s["ms"] / 1e3)
                row = {**item, "status": "ok", "error": None, "world_size": world, "sizes": sizes}
            else:
                dist.all_gather_object(gathered, _loop(item, rank, local, control), group=control)
                row = {**item, "status": "ok", "error": None, "world_size": world, "per_rank": gathered}
            report.row(i, row)
            gc.collect()  # DDP holds reference cycles: free this item's model before the next
            if cuda:
                torch.cuda.empty_cache()
    except BaseException as exc:
        report.error(exc)
        raise
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Runs this rank under torchrun: ``--workdir DIR`` holds ``job.json``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True, type=validate.argument(validate.existing_dir))
    return worker(ap.parse_args(argv).workdir)


if __name__ == "__main__":
    raise SystemExit(main())

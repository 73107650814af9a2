"""Two GPUs against one: scaling efficiency of mixed precision under DDP and FSDP2, and where the all-reduce time goes.

Measures, in one run, with torchrun launching the ranks (``fp16lab.distributed``):

- a bare torchrun + DDP loop (this file, run by torchrun with ``--bare-worker``: ResNet-50,
  amp-fp16, channels_last, batch 256 per GPU, synthetic data, ``gradient_as_bucket_view``) on 1
  and 2 GPUs, against the fp16lab path for the same point;
- fp16lab points on 1 and 2 GPUs: ResNet-50 at batch 256 and 64 per GPU in each precision, and a
  parameter-heavy transformer stack (hidden 2048, ~300M parameters, batch 32 per GPU) with the
  settings that decide how gradients travel: comm hooks, bucket sizes, ``static_graph``,
  ``gradient_as_bucket_view``, FSDP2's ``reduce_dtype`` and ``NCCL_ALGO=Tree``;
- on 2 GPUs, the share of the step the collectives take and how much of it no compute kernel
  hides (torch.profiler's NCCL kernels, :func:`fp16lab.distributed.comm_overlap`).

Scaling efficiency = rate on 2 GPUs / (2 x rate on 1 GPU), both in this run. On one GPU the model
is not wrapped (the single-GPU baseline). Protocol: ``fp16lab.distributed.WARMUP`` warm-up and
``STEPS`` timed steps per point, cudnn.benchmark off (the sweep's default), TF32 off, CUDA events, the slowest rank's
mean step. The environment passes through to every rank (keep NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 set where the host needs them).

    python -m fp16lab.bench.distributed            # 2 GPUs, about 3 minutes
    python -m fp16lab.bench.distributed --quick    # CPU, two gloo ranks, smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

from fp16lab import bench
from fp16lab import distributed as dist_lab

TRANSFORMER = dict(model="transformer_stack", batch=32)


def bare_worker(workdir: Path) -> int:
    """The bare loop, one rank of it: plain DDP and GradScaler, timed with two CUDA events."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fp16lab.models import NUM_CLASSES, build_model, input_shape
    from fp16lab.recipes import set_tf32

    job = json.loads((workdir / "job.json").read_text())["items"]
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    cuda = job[0]["device"] == "cuda"
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo")
    set_tf32(False)
    torch.backends.cudnn.benchmark = dist_lab.CUDNN_BENCHMARK
    for i, item in enumerate(job):
        torch.manual_seed(0)
        model = build_model(item["model"]).to(dev).to(memory_format=torch.channels_last)
        x = torch.randn(input_shape(item["model"], item["batch"]), device=dev)
        x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, NUM_CLASSES, (item["batch"],), device=dev)
        if world > 1:
            model = DDP(model, device_ids=[local] if cuda else None, gradient_as_bucket_view=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        scaler = torch.amp.GradScaler(dev.type)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=torch.float16):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

        ms = []
        for _ in range(item["repeats"]):
            for _ in range(item["warmup"]):
                step()
            if cuda:
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for _ in range(item["steps"]):
                    step()
                stop.record()
                torch.cuda.synchronize()
                ms.append(start.elapsed_time(stop) / item["steps"])
            else:
                t0 = time.perf_counter()
                for _ in range(item["steps"]):
                    step()
                ms.append((time.perf_counter() - t0) * 1e3 / item["steps"])
        slowest = torch.tensor(ms, dtype=torch.float64, device=dev)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # synchronous training: the slowest rank sets the pace
        if rank == 0:
            row = {**item, "status": "ok", "error": None, "gpus": world, "step_ms_repeats": slowest.tolist(),
                   "samples_per_s_repeats": [world * item["batch"] / (m / 1e3) for m in slowest.tolist()]}
            (workdir / f"row_{i}.json").write_text(json.dumps(row))
        del model, opt, x, y
    dist.destroy_process_group()
    return 0


def bare_rows(gpus: int, device: str, model: str, batch: int, repeats: int, budget_s: float) -> list[dict[str, Any]]:
    """Returns the bare loop's row on ``gpus`` ranks (its whole launch is bounded by ``budget_s``)."""
    item = {"kind": "bare", "model": model, "batch": batch, "precision": "amp-fp16", "device": device,
            "layout": "channels_last", "warmup": dist_lab.WARMUP if device == "cuda" else 1,
            "steps": dist_lab.STEPS if device == "cuda" else 3, "repeats": repeats}
    launch = dist_lab.run_ranks(gpus, [str(Path(__file__).resolve()), "--bare-worker"], [item],
                                startup_timeout_s=budget_s)
    row = {**launch.rows[0], "gpus": gpus, "label": f"bare {model} b{batch} amp-fp16 x{gpus}"}
    if row["status"] == "ok":
        row["samples_per_s"] = statistics.median(row["samples_per_s_repeats"])
    return [row]


def lab_rows(points: list[dist_lab.DistPoint], deadline: float, timeout_s: float,
             env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Returns the fp16lab rows of ``points``, relaunching after a failed point so one failure costs one point.

    ``env`` (NCCL variables set for these ranks only) is added to each row's label.
    """
    rows: list[dict[str, Any]] = []
    remaining = list(points)
    suffix = "".join(f" {k}={v}" for k, v in (env or {}).items())
    while remaining:
        if time.monotonic() > deadline:
            rows += [{**p.settings(), "label": p.label() + suffix, "status": "error",
                      "error": "not run: the benchmark's time budget was spent"} for p in remaining]
            break
        got = dist_lab.measure_points(remaining, timeout_s=timeout_s, env_overrides=env)
        for p, row in zip(remaining, got):
            row["label"] = p.label() + suffix
            print(f"  {row['label']:<62} {row['status']:>5} "
                  + (f"{row['samples_per_s']:10.1f}/s" if row["status"] == "ok" else row["error"][:120]),
                  flush=True)
        done = next((i for i, r in enumerate(got) if r["status"] != "ok"), len(got))
        rows += [{**r, "kind": "fp16lab"} for r in got[:done + 1]]
        remaining = remaining[done + 1:]
    return rows


def plan(gpus: int, device: str) -> list[tuple[list[dist_lab.DistPoint], dict[str, str]]]:
    """Returns the launches in order: each a list of points sharing ``gpus``, and NCCL variables.

    The ones that answer the questions come first (the time budget cuts from the end): the
    one-GPU baselines, then on ``gpus``: ResNet-50 at batch 256 and 64, the transformer stack
    with each DDP setting, FSDP2's reduce dtypes, NCCL_ALGO=Tree; then the other precisions and
    settings.
    """
    if device == "cpu":
        small = dict(device="cpu", warmup=1, steps=3)
        cnn = lambda **kw: dist_lab.DistPoint(model="small_cnn", batch=16, precision="amp-fp16", **small, **kw)
        return [([cnn(gpus=1)], {}), ([cnn(gpus=gpus, comm_hook=h) for h in ("none", "fp16")], {}),
                ([dist_lab.DistPoint(model="mlp", batch=16, precision="amp-bf16", gpus=gpus, strategy="fsdp",
                                     reduce_dtype="bf16", **small)], {})]
    r50 = lambda batch, prec, **kw: dist_lab.DistPoint(model="resnet50", batch=batch, precision=prec,
                                                        device="cuda", **kw)
    tx = lambda prec, **kw: dist_lab.DistPoint(**TRANSFORMER, precision=prec, device="cuda", **kw)
    n = dict(gpus=gpus, profile_steps=3)
    launches = [
        [r50(256, "amp-fp16", gpus=1), r50(64, "amp-fp16", gpus=1), tx("amp-bf16", gpus=1)],
        [r50(256, "amp-fp16", **n), r50(256, "amp-fp16", comm_hook="fp16", **n),
         r50(64, "amp-fp16", **n), r50(64, "amp-fp16", comm_hook="fp16", **n),
         tx("amp-bf16", **n), tx("amp-bf16", comm_hook="bf16", **n), tx("amp-bf16", bucket_cap_mb=100, **n),
         tx("amp-bf16", static_graph=True, **n), tx("amp-bf16", bucket_cap_mb=400, **n)],
        [tx("amp-bf16", strategy="fsdp", reduce_dtype=r, **n) for r in ("fp32", "bf16")],
        [tx("amp-bf16", **n), r50(64, "amp-fp16", **n)],  # again, under NCCL_ALGO=Tree (below)
        [r50(256, "amp-bf16", gpus=1), tx("amp-fp16", gpus=1), r50(256, "fp32", gpus=1), tx("fp32", gpus=1)],
        [r50(256, "amp-bf16", **n), r50(256, "amp-bf16", comm_hook="bf16", **n),
         tx("amp-fp16", **n), tx("amp-fp16", comm_hook="fp16", **n), r50(256, "fp32", **n), tx("fp32", **n),
         r50(256, "amp-fp16", **n)],  # the engine's batch-256 point again: its second repeat
        [tx("amp-bf16", bucket_cap_mb=5, **n), tx("amp-bf16", gradient_as_bucket_view=False, **n),
         r50(64, "amp-fp16", bucket_cap_mb=100, **n), r50(64, "amp-fp16", static_graph=True, **n),
         tx("fp32", strategy="fsdp", **n)],
    ]
    return [(points, {"NCCL_ALGO": "Tree"} if i == 3 else {}) for i, points in enumerate(launches)]


def setting(row: dict[str, Any]) -> str:
    """Returns how a 2-GPU row's gradients travel, e.g. 'ddp hook=fp16 bucket=25MB'."""
    words = row["label"].split()
    return " ".join(words[4:]) or "-"


def summarize(rows: list[dict[str, Any]], gpus: int, model: str, batch: int) -> dict[str, Any]:
    """Returns efficiencies per 2-GPU row, the engine against the bare loop, and the gap recovered."""
    ok = [r for r in rows if r["status"] == "ok"]

    def rate(kind: str, n: int, model: str, batch: int, precision: str) -> float | None:
        xs = [r["samples_per_s"] for r in ok if r.get("kind") == kind and r["gpus"] == n
              and r["model"] == model and r["batch"] == batch and r["precision"] == precision]
        return statistics.median(xs) if xs else None

    for r in ok:
        if r["gpus"] > 1:
            one = rate(r["kind"], 1, r["model"], r["batch"], r["precision"])
            r["efficiency"] = dist_lab.scaling_efficiency(r["samples_per_s"], one, r["gpus"]) if one else None
    out: dict[str, Any] = {}
    bare_n, bare_1 = rate("bare", gpus, model, batch, "amp-fp16"), rate("bare", 1, model, batch, "amp-fp16")
    lab = [r["samples_per_s"] for r in ok if r.get("kind") == "fp16lab" and r["gpus"] == gpus
           and r["model"] == model and r["batch"] == batch and r["precision"] == "amp-fp16"
           and r["comm_hook"] == "none"]
    if bare_n and bare_1:
        out["bare_efficiency"] = dist_lab.scaling_efficiency(bare_n, bare_1, gpus)
    if bare_n and lab:
        out["engine_vs_bare"] = statistics.median(lab) / bare_n
    tx = [r for r in ok if r["gpus"] > 1 and r["model"] == TRANSFORMER["model"] and r["precision"] == "amp-bf16"
          and r.get("efficiency")]
    default = next((r for r in tx if setting(r) == "ddp hook=none bucket=25MB"), None)
    if default and tx:
        best = max(tx, key=lambda r: r["efficiency"])
        gap = 1 - default["efficiency"]
        out["transformer_default_efficiency"] = default["efficiency"]
        out["transformer_best"] = {"setting": setting(best), "efficiency": best["efficiency"]}
        out["transformer_gap_recovered"] = (best["efficiency"] - default["efficiency"]) / gap if gap > 0 else None
    return out


def _gpu_slug() -> str:
    import torch

    name = torch.cuda.get_device_name(0)
    m = re.search(r"([A-Z]\d{2,4}|RTX ?\d{4})", name)
    return (m.group(1) if m else name).lower().replace(" ", "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CPU, two gloo ranks, tiny models: a smoke test")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for the result file (default: data/local/, or data/ with --replace)")
    ap.add_argument("--replace", action="store_true", help="write the committed file in data/")
    ap.add_argument("--name", default=None, help="result file stem (default distributed_<gpu>x<n>)")
    ap.add_argument("--gpus", type=int, default=2, help="ranks of the multi-GPU points (default 2)")
    ap.add_argument("--budget-s", type=float, default=160.0,
                    help="stop launching new points after this many seconds (default 160)")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="seconds one point may run (default 120)")
    ap.add_argument("--bare-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.bare_worker:
        return bare_worker(args.workdir)
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = "cpu" if args.quick else "cuda"
    if device == "cuda" and have < args.gpus:
        print(f"this benchmark needs {args.gpus} CUDA GPUs, torch sees {have}; run with --quick for the CPU smoke test")
        return 2
    if args.gpus < 2:
        raise SystemExit(f"--gpus must be at least 2 (it is compared with 1), got {args.gpus}")
    name = args.name or (f"distributed_{_gpu_slug()}x{args.gpus}" if device == "cuda" else "distributed_quick")
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    env = {k: os.environ.get(k) for k in dist_lab.NCCL_ENV}
    print(f"{name}: {device}, {args.gpus} ranks; NCCL environment {env}", flush=True)
    rows: list[dict[str, Any]] = []
    model, batch, repeats = ("resnet50", 256, 2) if device == "cuda" else ("small_cnn", 16, 1)
    for n in (1, args.gpus):
        rows += bare_rows(n, device, model, batch, repeats, max(args.budget_s / 4, 60))
        print(f"  {rows[-1]['label']:<62} {rows[-1]['status']:>5} "
              + (f"{rows[-1]['samples_per_s']:10.1f}/s" if rows[-1]["status"] == "ok" else rows[-1]["error"][:120]),
              flush=True)
    protocol = {"warmup": dist_lab.WARMUP, "steps": dist_lab.STEPS, "cudnn_benchmark": dist_lab.CUDNN_BENCHMARK,
                "tf32": False, "rate": "all ranks' samples over the slowest rank's mean step",
                "efficiency": "rate on n GPUs / (n x rate on 1 GPU), same run, same point"}

    def write(complete: bool) -> Path:
        summary = {**summarize(rows, args.gpus, model, batch), "wall_s": time.monotonic() - t0,
                   "complete": complete}
        meta = {"summary": summary, "gpus": args.gpus, "env": env, "protocol": protocol}
        return bench.write_result(name, rows, meta=meta, data_dir=args.out, replace=args.replace)

    for points, nccl_env in plan(args.gpus, device):
        rows += lab_rows(points, deadline, args.timeout_s, nccl_env)
        write(complete=False)  # what is measured so far survives a run cut short
    path = write(complete=True)
    summary = bench.read_result(path)["meta"]["summary"]
    print(f"\nwrote {path}")
    print(json.dumps(summary, indent=1, default=str))
    print(f"\n{'point':<62} {'samples/s':>10} {'eff':>6} {'comm':>6} {'exposed':>8}")
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['label']:<62} {r['status']:>10}  {r['error'][:60]}")
            continue
        eff = r.get("efficiency")
        comm = r.get("comm_share")
        exposed = r.get("exposed_comm_share")
        print(f"{r['label']:<62} {r['samples_per_s']:10.1f} {'' if eff is None else f'{eff:.3f}':>6} "
              f"{'' if comm is None else f'{comm:.0%}':>6} {'' if exposed is None else f'{exposed:.0%}':>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

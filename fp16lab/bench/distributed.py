"""Two GPUs against one: scaling efficiency of mixed precision under DDP and FSDP2, and where the all-reduce time goes.

Measures, in one run, with torchrun launching the ranks (``fp16lab.distributed``):

- ``nvidia-smi topo -m`` and an all-reduce bus-bandwidth probe (1 MB to 256 MB), into the meta;
- a bare torchrun + DDP loop (:mod:`fp16lab.bench.distributed_bare`: ResNet-50, channels_last,
  batch 256 per GPU, synthetic data, ``gradient_as_bucket_view``) in one launch of two ranks, in
  three variants (amp-fp16 with foreach SGD, as written; with fused SGD, no host sync in
  GradScaler.step; amp-bf16, no scaler) and five modes (GPU 0 alone, GPU 1 alone, both at once
  without DDP, DDP, DDP without the buffer broadcast), interleaved round by round, with each
  rank's step times, clocks and profiled idle, compute and NCCL time. The summary's
  ``diagnosis`` sets them side by side: where the ~5 ms a step that two GPUs lose goes;
- fp16lab points on 1 and 2 GPUs: ResNet-50 at batch 256 and 64 per GPU in each precision, and a
  parameter-heavy transformer stack (hidden 2048, ~300M parameters, batch 32 per GPU) with the
  settings that decide how gradients travel: comm hooks, bucket sizes, ``static_graph``,
  ``gradient_as_bucket_view``, FSDP2's ``reduce_dtype`` and ``reshard_after_forward``, and ResNet-50 with fused SGD (the
  engine's ``optimizer`` setting) and without DDP's buffer broadcast (``broadcast_buffers``,
  the bare loop's ``ddp-no-broadcast`` as an engine setting); what earlier runs measured and
  this one drops is in :data:`DROPPED` and the meta;
- on 2 GPUs, the share of the step the collectives take and how much of it no compute kernel
  hides (torch.profiler's NCCL kernels, :func:`fp16lab.distributed.comm_overlap`).

Scaling efficiency = rate on 2 GPUs / (2 x rate on 1 GPU), both in this run. On one GPU the model
is not wrapped (the single-GPU baseline). Protocol: ``fp16lab.distributed.WARMUP`` warm-up and
``STEPS`` timed steps per point, cudnn.benchmark off (the sweep's default), TF32 off, CUDA events, the slowest rank's
mean step. The environment passes through to every rank (keep NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 set where the host needs them).

    python -m fp16lab.bench.distributed            # 2 GPUs, about 7 minutes
    python -m fp16lab.bench.distributed --quick    # CPU, two gloo ranks, smoke test

What the result file says (efficiencies, the diagnosis, the notebook's tables) is read by
:mod:`fp16lab.bench.distributed_report`.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from fp16lab import distributed as dist_lab
from fp16lab import measure, validate
from fp16lab.bench import add_output_arguments, argument_parser
from fp16lab.bench import distributed_bare as bare
from fp16lab.bench.distributed_report import TRANSFORMER, diagnosis, summarize

def nvidia_smi_topology() -> str:
    """Returns ``nvidia-smi topo -m`` (how the GPUs are linked: NV# is NVLink, PIX/PXB/PHB/SYS
    PCIe paths), or why it could not be read."""
    try:
        got = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"not read: {type(e).__name__}: {e}"
    return got.stdout if got.returncode == 0 else f"not read: exit {got.returncode}: {got.stderr.strip()[:300]}"


def diagnose(gpus: int, device: str, model: str, batch: int, rounds: int, timeout_s: float,
             variants: list[str] | None = None,
             modes: list[str] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Returns (the bare loop's rows, the all-reduce probe) from one torchrun launch of ``gpus`` ranks.

    One row per variant and mode of :mod:`fp16lab.bench.distributed_bare` (all of them unless
    given), its rounds pooled (:func:`pool_rounds`); the probe is rank 0's ``busbw`` row (or
    its error).
    """
    cuda = device == "cuda"
    items = [{"task": "busbw", "device": device, "iters": 20 if cuda else 3,
              "sizes_mb": [2 ** k for k in range(9)] if cuda else [1, 2]}]
    items += bare.loop_items(variants or list(bare.VARIANTS), modes or list(bare.MODES), rounds,
                             model=model, batch=batch,
                             device=device, warmup=dist_lab.WARMUP if cuda else 1,
                             steps=dist_lab.STEPS if cuda else 3, profile_steps=3 if cuda else 0)
    launch = dist_lab.run_ranks(gpus, ["-m", "fp16lab.bench.distributed_bare"], items,
                                timeout_s=timeout_s)
    probe = {k: v for k, v in launch.rows[0].items() if k != "task"}
    return pool_rounds(launch.rows[1:]), probe


def pool_rounds(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Returns one row per (variant, mode) from the rows of its rounds.

    A round's rate is every training rank's samples over the slowest training rank's mean step;
    the row's ``samples_per_s`` is the median over rounds. ``per_rank`` keeps each rank's mean
    step per round, and from the profiled round its split, clocks and end state; rank 0's split
    (of the ranks that trained, the first) is copied to the row as for the fp16lab rows.
    """
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for it in items:
        key = (it["variant"], it["mode"])
        precision, optimizer = bare.VARIANT_SETTINGS[it["variant"]]
        row = out.setdefault(key, {
            "kind": "bare", "variant": it["variant"], "mode": it["mode"], "model": it["model"],
            "batch": it["batch"], "precision": precision, "optimizer": optimizer, "device": it["device"],
            "layout": "channels_last", "warmup": it["warmup"], "steps": it["steps"], "status": "ok",
            "error": None, "step_ms_repeats": [], "samples_per_s_repeats": [], "per_rank": {}})
        if it["status"] != "ok":  # the row keeps the rounds that ran, and says which did not
            row.update(status=it["status"], error=it["error"])
            row.setdefault("round_errors", []).append({"round": it["round"], "error": it["error"]})
            continue
        active = [r for r in it["per_rank"] if r["trained"]]
        row["gpus"] = len(active)
        slowest = max(r["step_ms_mean"] for r in active)
        row["step_ms_repeats"].append(slowest)
        row["samples_per_s_repeats"].append(len(active) * it["batch"] / (slowest / 1e3))
        for r in active:
            mine = row["per_rank"].setdefault(r["rank"], {"rank": r["rank"], "step_ms_mean_repeats": []})
            mine["step_ms_mean_repeats"].append(r["step_ms_mean"])
            if it["profile_steps"] or "cpus" not in mine:
                mine.update({k: v for k, v in r.items()
                             if k not in ("step_ms", "step_ms_mean", "step_ms_median", "trained")})
    rows = []
    for (variant, mode), row in out.items():
        row["per_rank"] = [row["per_rank"][k] for k in sorted(row["per_rank"])]
        if row["samples_per_s_repeats"]:
            row["samples_per_s"] = statistics.median(row["samples_per_s_repeats"])
            row["status"], row["error"] = "ok", None  # a round that failed is left out, not the row
            first = row["per_rank"][0]
            row.update({k: first[k] for k in ("span_us", "compute_us", "comm_us", "exposed_comm_us",
                                              "overlapped_comm_us", "idle_us", "comm_share",
                                              "exposed_comm_share", "idle_share") if k in first})
        row.setdefault("gpus", 1 if mode in ("gpu0", "gpu1") else None)
        extra = [] if optimizer_is_default(row) else [f"opt={row['optimizer']}"]
        extra += [] if mode in ("gpu0", "ddp") else [mode]
        row["label"] = " ".join([f"bare {row['model']} b{row['batch']} {row['precision']} x{row['gpus']}", *extra])
        rows.append(row)
    return rows


def optimizer_is_default(row: dict[str, Any]) -> bool:
    """True where a row's optimizer is fp16lab's default (rows written before it was a setting too)."""
    return row.get("optimizer", "sgd") == "sgd"


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
    one-GPU baselines, then on ``gpus``: ResNet-50 at batch 256 (with each optimizer, also
    without the buffer broadcast) and 64, the transformer stack with each DDP setting, FSDP2's
    reduce dtypes; then the other precisions and settings. What was dropped, and why, is in
    :data:`DROPPED`. On the CPU (``--quick``) a few small points stand in for them.
    """
    if device == "cpu":
        small = dict(device="cpu", warmup=1, steps=3)
        cnn = lambda **kw: dist_lab.DistPoint(model="small_cnn", batch=16, precision="amp-fp16", **small, **kw)
        return [([cnn(gpus=1)], {}),
                ([cnn(gpus=gpus, comm_hook=h) for h in ("none", "fp16")]
                 + [cnn(gpus=gpus, broadcast_buffers=False)], {}),
                ([dist_lab.DistPoint(model="mlp", batch=16, precision="amp-bf16", gpus=gpus, strategy="fsdp",
                                     reduce_dtype="bf16", **small)], {})]
    r50 = lambda batch, prec, **kw: dist_lab.DistPoint(model="resnet50", batch=batch, precision=prec,
                                                        device="cuda", **kw)
    tx = lambda prec, **kw: dist_lab.DistPoint(**TRANSFORMER, precision=prec, device="cuda", **kw)
    n = dict(gpus=gpus, profile_steps=3)
    launches = [
        [r50(256, "amp-fp16", gpus=1), r50(256, "amp-fp16", optimizer="sgd-fused", gpus=1),
         r50(64, "amp-fp16", gpus=1), tx("amp-bf16", gpus=1)],
        [r50(256, "amp-fp16", **n), r50(256, "amp-fp16", optimizer="sgd-fused", **n),
         r50(256, "amp-fp16", comm_hook="fp16", **n),
         r50(256, "amp-fp16", broadcast_buffers=False, **n),
         r50(256, "amp-fp16", optimizer="sgd-fused", broadcast_buffers=False, **n),
         r50(256, "amp-fp16", optimizer="sgd-fused", broadcast_buffers=False, bucket_cap_mb=100, **n),
         r50(256, "amp-fp16", optimizer="sgd-fused", broadcast_buffers=False, static_graph=True, **n),
         r50(64, "amp-fp16", **n), r50(64, "amp-fp16", comm_hook="fp16", **n),
         tx("amp-bf16", **n), tx("amp-bf16", comm_hook="bf16", **n), tx("amp-bf16", bucket_cap_mb=100, **n),
         tx("amp-bf16", static_graph=True, **n), tx("amp-bf16", bucket_cap_mb=400, **n)],
        [tx("amp-bf16", strategy="fsdp", reduce_dtype=r, **n) for r in ("fp32", "bf16")]
        + [tx("amp-bf16", strategy="fsdp", reshard_after_forward=False, **n)],
        [r50(256, "amp-bf16", gpus=1), tx("amp-fp16", gpus=1), r50(256, "fp32", gpus=1), tx("fp32", gpus=1)],
        [r50(256, "amp-bf16", **n), r50(256, "amp-bf16", comm_hook="bf16", **n),
         tx("amp-fp16", **n), tx("amp-fp16", comm_hook="fp16", **n), r50(256, "fp32", **n), tx("fp32", **n),
         r50(256, "amp-fp16", **n)],  # the engine's batch-256 point again: its second repeat
        # 5 MB buckets were the transformer's best setting (54% and 46% of the gap to 1.0
        # recovered in two runs): smaller still, and with the static graph on top
        [tx("amp-bf16", bucket_cap_mb=5, **n), tx("amp-bf16", bucket_cap_mb=1, **n),
         tx("amp-bf16", bucket_cap_mb=5, static_graph=True, **n),
         tx("amp-bf16", gradient_as_bucket_view=False, **n),
         r50(64, "amp-fp16", bucket_cap_mb=100, **n), r50(64, "amp-fp16", static_graph=True, **n),
         tx("fp32", strategy="fsdp", **n)],
    ]
    return [(points, {}) for points in launches]


#: What earlier runs measured that this one leaves out, and why (written into the result's meta).
DROPPED = {
    "NCCL_ALGO=Tree launch (transformer_stack b32 amp-bf16, resnet50 b64 amp-fp16 on 2 GPUs)": (
        "on the 2 x H200 host of 2026-11-30, NCCL 2.28.9 refused Tree for 2 ranks on one node "
        "('invalid usage'); measuring it again costs a launch and answers nothing"),
    "bare loop in its own world-1 and world-2 launches": (
        "the same loop is now measured in one 2-rank launch (fp16lab.bench.distributed_bare), "
        "interleaved with its variants: 'x1' rows train on GPU 0 while rank 1 waits on the CPU; "
        "the labels 'bare resnet50 b256 amp-fp16 x1/x2' are kept"),
}


def _gpu_slug() -> str:
    import torch

    name = torch.cuda.get_device_name(0)
    m = re.search(r"([A-Z]\d{2,4}|RTX ?\d{4})", name)
    return (m.group(1) if m else name).lower().replace(" ", "")


def main(argv: list[str] | None = None) -> int:
    ap = argument_parser("distributed", __doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="CPU, two gloo ranks, tiny models: a smoke test")
    add_output_arguments(ap, "distributed_<gpu>x<n> on GPUs, distributed_quick on a CPU")
    ap.add_argument("--gpus", type=validate.argument(validate.count, low=2), default=2,
                    help="ranks of the multi-GPU points (default 2)")
    ap.add_argument("--budget-s", type=validate.argument(validate.number, low=0, low_open=True),
                    default=380.0,
                    help="stop launching new fp16lab points this many seconds after the start (default 380)")
    ap.add_argument("--timeout-s", type=validate.argument(validate.number, low=0, low_open=True),
                    default=120.0, help="seconds one point may run (default 120)")
    ap.add_argument("--rounds", type=validate.argument(validate.count), default=3,
                    help="interleaved rounds of the bare loop's variants and modes (default 3; 1 with --quick)")
    args = ap.parse_args(argv)
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = "cpu" if args.quick else "cuda"
    if device == "cuda" and have < args.gpus:
        print(f"this benchmark needs {args.gpus} CUDA GPUs, torch sees {have}; run with --quick for the CPU smoke test")
        return 2
    name = args.name or (f"distributed_{_gpu_slug()}x{args.gpus}" if device == "cuda" else "distributed_quick")
    folder = args.out if args.out is not None else (measure.data_dir() if args.replace else measure.local_dir())
    try:  # before any work: a run of minutes must not end in a file it cannot write
        measure.check_can_write(Path(folder) / f"{name}.json")
    except ValueError as e:
        ap.error(str(e))
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    env = {k: os.environ.get(k) for k in dist_lab.NCCL_ENV}
    print(f"{name}: {device}, {args.gpus} ranks; NCCL environment {env}", flush=True)
    topology = nvidia_smi_topology()
    print(topology, flush=True)
    model, batch = ("resnet50", 256) if device == "cuda" else ("small_cnn", 16)
    rows, probe = diagnose(args.gpus, device, model, batch, args.rounds if device == "cuda" else 1,
                           timeout_s=args.timeout_s)
    for r in rows:
        print(f"  {r['label']:<62} {r['status']:>5} "
              + (f"{r['samples_per_s']:10.1f}/s" if r["status"] == "ok" else str(r["error"])[:120]), flush=True)
    for size in probe.get("sizes", []):
        print(f"  all_reduce {size['bytes'] / 2**20:6.0f} MiB {size['ms']:8.3f} ms  busbw {size['busbw_gbs']:7.1f} GB/s",
              flush=True)
    protocol = {"warmup": dist_lab.WARMUP, "steps": dist_lab.STEPS, "cudnn_benchmark": dist_lab.CUDNN_BENCHMARK,
                "tf32": False, "rate": "all ranks' samples over the slowest rank's mean step",
                "efficiency": "rate on n GPUs / (n x rate on 1 GPU), same run, same point",
                "bare_rounds": args.rounds if device == "cuda" else 1,
                "bare_variants": bare.VARIANTS, "bare_modes": bare.MODES}

    def write(complete: bool) -> Path:
        summary = {**summarize(rows, args.gpus, model, batch), "diagnosis": diagnosis(rows),
                   "wall_s": time.monotonic() - t0, "complete": complete}
        meta = {"summary": summary, "gpus": args.gpus, "env": env, "protocol": protocol,
                "topology": topology, "allreduce_busbw": probe, "dropped": DROPPED}
        return measure.write_result(name, rows, meta=meta, data_dir=args.out, replace=args.replace)

    write(complete=False)
    for points, nccl_env in plan(args.gpus, device):
        rows += lab_rows(points, deadline, args.timeout_s, nccl_env)
        write(complete=False)  # what is measured so far survives a run cut short
    path = write(complete=True)
    summary = measure.read_result(path, meta_needs=("summary",))["meta"]["summary"]
    print(f"\nwrote {path}")
    print(json.dumps(summary, indent=1, default=str))
    print(f"\n{'point':<62} {'samples/s':>10} {'eff':>6} {'comm':>6} {'exposed':>8} {'idle':>6}")
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['label']:<62} {r['status']:>10}  {str(r['error'])[:60]}")
            continue
        eff = r.get("efficiency")
        comm = r.get("comm_share")
        exposed, idle = r.get("exposed_comm_share"), r.get("idle_share")
        print(f"{r['label']:<62} {r['samples_per_s']:10.1f} {'' if eff is None else f'{eff:.3f}':>6} "
              f"{'' if comm is None else f'{comm:.0%}':>6} {'' if exposed is None else f'{exposed:.0%}':>8} "
              f"{'' if idle is None else f'{idle:.0%}':>6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

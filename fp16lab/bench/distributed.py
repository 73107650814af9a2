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
  ``gradient_as_bucket_view``, FSDP2's ``reduce_dtype``, and ResNet-50 with fused SGD (the
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
from fp16lab import measure
from fp16lab.bench import argument_parser
from fp16lab.bench import distributed_bare as bare

TRANSFORMER = dict(model="transformer_stack", batch=32)


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
        [tx("amp-bf16", strategy="fsdp", reduce_dtype=r, **n) for r in ("fp32", "bf16")],
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


def setting(row: dict[str, Any]) -> str:
    """Returns how a 2-GPU row's gradients travel, e.g. 'ddp hook=fp16 bucket=25MB'."""
    words = row["label"].split()
    return " ".join(words[4:]) or "-"


_DEFAULT_POINT = dist_lab.DistPoint(model="mlp", batch=1, precision="fp32", gpus=2, device="cpu")
#: DDP's own defaults among the settings a row records (a row without one of them has the
#: default), as :class:`fp16lab.distributed.DistPoint` has them.
DDP_DEFAULTS = {k: getattr(_DEFAULT_POINT, k) for k in ("bucket_cap_mb", "static_graph")}
#: How :func:`setting` names a multi-GPU row whose DDP settings are all the defaults.
DEFAULT_SETTING = setting({"label": _DEFAULT_POINT.label()})


def summarize(rows: list[dict[str, Any]], gpus: int, model: str, batch: int) -> dict[str, Any]:
    """Returns efficiencies per 2-GPU row, the engine against the bare loop, and the gap recovered.

    A row's efficiency is its rate over ``gpus`` times the one-GPU rate of the same kind, model,
    batch, precision and optimizer (for the bare loop: trained on GPU 0, mode ``gpu0``). The
    engine's figures are those of its DDP defaults; ``engine_efficiency_no_broadcast`` (and
    ``_fused``) those of its points with ``broadcast_buffers=False``.
    """
    ok = [r for r in rows if r["status"] == "ok"]

    def rate(kind: str, n: int, precision: str, optimizer: str = "sgd", mode: str | None = None,
             model: str = model, batch: int = batch, broadcast: bool = True, **match: Any) -> float | None:
        # a row without broadcast_buffers (written before it was a setting) broadcast: DDP's default
        xs = [r["samples_per_s"] for r in ok if r.get("kind") == kind and r["gpus"] == n
              and r["model"] == model and r["batch"] == batch and r["precision"] == precision
              and r.get("optimizer", "sgd") == optimizer and r.get("mode") in (mode, None)
              and r.get("broadcast_buffers", True) == broadcast
              and all(r.get(k, DDP_DEFAULTS.get(k)) == v for k, v in match.items())]
        return statistics.median(xs) if xs else None

    for r in ok:
        if r["gpus"] > 1:
            one = rate(r["kind"], 1, r["precision"], r.get("optimizer", "sgd"), "gpu0",
                       model=r["model"], batch=r["batch"])
            r["efficiency"] = dist_lab.scaling_efficiency(r["samples_per_s"], one, r["gpus"]) if one else None
    out: dict[str, Any] = {}
    for opt, suffix in (("sgd", ""), ("sgd-fused", "_fused")):
        bare_n = rate("bare", gpus, "amp-fp16", opt, "ddp")
        bare_1 = rate("bare", 1, "amp-fp16", opt, "gpu0")
        defaults = dict(comm_hook="none", **DDP_DEFAULTS)
        lab = rate("fp16lab", gpus, "amp-fp16", opt, **defaults)
        if bare_n and bare_1:
            out["bare_efficiency" + suffix] = dist_lab.scaling_efficiency(bare_n, bare_1, gpus)
        if bare_n and lab:
            out["engine_vs_bare" + suffix] = lab / bare_n
        lab_1 = rate("fp16lab", 1, "amp-fp16", opt)
        if lab and lab_1:
            out["engine_efficiency" + suffix] = dist_lab.scaling_efficiency(lab, lab_1, gpus)
        lab_own = rate("fp16lab", gpus, "amp-fp16", opt, broadcast=False, **defaults)
        if lab_own and lab_1:  # each rank kept its own BatchNorm statistics
            out["engine_efficiency_no_broadcast" + suffix] = dist_lab.scaling_efficiency(lab_own, lab_1, gpus)
    r50 = [r for r in ok if r.get("kind") == "fp16lab" and r["gpus"] > 1 and r["model"] == model
           and r["batch"] == batch and r["precision"] == "amp-fp16" and r.get("efficiency")]
    if r50:  # the engine's best setting for the headline point, whatever it is
        best = max(r50, key=lambda r: r["efficiency"])
        out["engine_best"] = {"setting": setting(best), "efficiency": best["efficiency"]}
    tx = [r for r in ok if r["gpus"] > 1 and r["model"] == TRANSFORMER["model"] and r["precision"] == "amp-bf16"
          and r.get("efficiency")]
    default = next((r for r in tx if setting(r) == DEFAULT_SETTING), None)
    if default and tx:
        best = max(tx, key=lambda r: r["efficiency"])
        gap = 1 - default["efficiency"]
        out["transformer_default_efficiency"] = default["efficiency"]
        out["transformer_best"] = {"setting": setting(best), "efficiency": best["efficiency"]}
        out["transformer_gap_recovered"] = (best["efficiency"] - default["efficiency"]) / gap if gap > 0 else None
    return out


def diagnosis(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Returns, per variant of the bare loop, what tells the suspects apart (after :func:`summarize`).

    ``rate`` and ``efficiency`` per mode; ``gpu1_over_gpu0`` (one GPU slower than the other);
    ``vs_each_alone`` (the DDP rate over the sum of what GPU 0 and GPU 1 do alone, so a slower
    second GPU is not counted against DDP); and per mode and rank, in ms per step from the
    profiled round: ``idle`` (no kernel running: the GPU waits for its host), ``compute``
    (non-NCCL kernels busy), ``nccl`` and ``exposed_nccl`` (a rank waiting in NCCL for a later
    rank shows here), with the mean SM clock and whether the weights stayed finite.
    """
    out: dict[str, Any] = {}
    for r in rows:
        if r.get("kind") != "bare" or r["status"] != "ok":
            continue
        v = out.setdefault(r["variant"], {"rate": {}, "efficiency": {}, "per_rank": {}})
        v["rate"][r["mode"]] = r["samples_per_s"]
        if r.get("efficiency") is not None:
            v["efficiency"][r["mode"]] = r["efficiency"]
        ms = lambda x: None if x is None else x / 1e3  # noqa: E731
        v["per_rank"][r["mode"]] = [
            {"rank": p["rank"], "step_ms": statistics.median(p["step_ms_mean_repeats"]),
             "idle": ms(p.get("idle_us")), "compute": ms(p.get("compute_us")), "nccl": ms(p.get("comm_us")),
             "exposed_nccl": ms(p.get("exposed_comm_us")), "sm_clock_mhz": p.get("sm_clock_mhz_mean"),
             "params_finite": p.get("params_finite"), "scale_after": p.get("scale_after")}
            for p in r["per_rank"]]
    for v in out.values():
        rate = v["rate"]
        if rate.get("gpu0") and rate.get("gpu1"):
            v["gpu1_over_gpu0"] = rate["gpu1"] / rate["gpu0"]
            if rate.get("ddp"):
                v["vs_each_alone"] = rate["ddp"] / (rate["gpu0"] + rate["gpu1"])
    return out


def wait_shares(row: dict[str, Any]) -> dict[str, float | None]:
    """Returns where a multi-GPU row's ranks spent the profiled step, as shares of it.

    The row's own shares are rank 0's; a rank that waits for the other shows its wait on that
    rank only. So: ``compute_share`` is the smallest rank's compute share, ``exposed_comm_share``
    (NCCL running with no compute beside it) and ``idle_share`` (no kernel running) the largest
    over the ranks. Without per-rank profiles, the row's own shares; None where not profiled.
    """
    per_rank = row.get("per_rank")
    per_rank = per_rank if isinstance(per_rank, list) else []  # NaN where a table row lacks it
    ranks = [p for p in per_rank if isinstance(p, dict) and p.get("span_us")] or [row]
    def pick(key: str, f: Any) -> float | None:
        xs = [p.get(key) for p in ranks if p.get(key) is not None]
        return f(xs) if xs else None
    compute = [p["compute_us"] / p["span_us"] for p in ranks if p.get("compute_us") is not None and p.get("span_us")]
    return {"compute_share": min(compute) if compute else None,
            "exposed_comm_share": pick("exposed_comm_share", max), "idle_share": pick("idle_share", max)}


def setting_effects(rows: list[dict[str, Any]]) -> Any:
    """Returns, for every multi-GPU fp16lab row with an efficiency, the efficiency of the DDP
    defaults (hook none, 25 MB buckets) for the same model, batch, precision and optimizer, and
    the change; rows measured more than once appear once per measurement."""
    import pandas as pd

    ok = [r for r in rows if r.get("status") == "ok" and r.get("kind", "fp16lab") == "fp16lab"
          and r.get("gpus", 1) > 1 and r.get("efficiency") is not None]
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        opt = r.get("optimizer")
        return r["model"], r["batch"], r["precision"], opt if isinstance(opt, str) else "sgd"  # NaN: older rows
    defaults: dict[Any, list[float]] = {}
    for r in ok:
        if setting(r) == DEFAULT_SETTING:
            defaults.setdefault(key(r), []).append(r["efficiency"])
    out = []
    for r in ok:
        base = defaults.get(key(r))
        if not base or setting(r) == DEFAULT_SETTING:
            continue
        b = statistics.median(base)
        out.append({"model": r["model"], "batch": r["batch"], "precision": r["precision"],
                    "setting": setting(r), "defaults": round(b, 3), "efficiency": round(r["efficiency"], 3),
                    "change": round(r["efficiency"] - b, 3)})
    if not out:
        return pd.DataFrame(out)
    return (pd.DataFrame(out).sort_values(["model", "batch", "precision", "change"],
                                         ascending=[True, True, True, False]).reset_index(drop=True))


#: How the notebook names the bare loop's variants and modes (see VARIANTS and MODES of
#: :mod:`fp16lab.bench.distributed_bare` for what each does).
VARIANT_NAMES = {"sgd": "fp16 + GradScaler, SGD", "sgd-fused": "fp16 + GradScaler, fused SGD",
                 "bf16": "bf16, no scaler"}
MODE_NAMES = {"gpu0": "GPU 0 alone", "gpu1": "GPU 1 alone", "no-ddp": "both, no DDP",
              "ddp": "DDP", "ddp-no-broadcast": "DDP, no buffer broadcast"}


def diagnosis_table(diag: dict[str, Any]) -> Any:
    """Returns :func:`diagnosis` as a DataFrame a learner can read: one row per variant, mode and
    rank, with the mode's samples/s and efficiency and the rank's milliseconds per step (step,
    GPU idle, compute, NCCL, NCCL with no compute beside it)."""
    import pandas as pd

    rows = []
    for variant, v in diag.items():
        for mode, ranks in v.get("per_rank", {}).items():
            for p in ranks:
                rows.append({"loop": VARIANT_NAMES.get(variant, variant),
                             "ranks": MODE_NAMES.get(mode, mode), "rank": p["rank"],
                             "samples/s": v["rate"].get(mode), "efficiency": v["efficiency"].get(mode),
                             "step ms": p.get("step_ms"), "idle ms": p.get("idle"),
                             "compute ms": p.get("compute"), "NCCL ms": p.get("nccl"),
                             "exposed NCCL ms": p.get("exposed_nccl")})
    if not rows:
        return pd.DataFrame()
    ms = {c: 1 for c in ("step ms", "idle ms", "compute ms", "NCCL ms", "exposed NCCL ms")}
    return pd.DataFrame(rows).set_index(["loop", "ranks", "rank"]).round({"samples/s": 0, "efficiency": 3, **ms})


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """Returns sentences about :func:`summarize`'s figures and, per variant of the bare loop,
    what its DDP step waits for; figures absent from ``summary`` are left out."""
    lines = []
    for suffix, name in (("", "SGD"), ("_fused", "fused SGD")):
        if "bare_efficiency" + suffix in summary:
            lines.append(f"hand-written DDP loop, ResNet-50 amp-fp16 with {name}: scaling efficiency "
                         f"{summary['bare_efficiency' + suffix]:.3f}")
        if "engine_efficiency" + suffix in summary:
            vs = summary.get("engine_vs_bare" + suffix)
            lines.append(f"fp16lab's point, same setting: {summary['engine_efficiency' + suffix]:.3f}"
                         + (f" ({vs:.2f}x the hand-written loop's samples/s)" if vs else ""))
        if "engine_efficiency_no_broadcast" + suffix in summary:
            lines.append(f"fp16lab's point with broadcast_buffers=False: "
                         f"{summary['engine_efficiency_no_broadcast' + suffix]:.3f}")
    if summary.get("engine_best"):
        lines.append(f"fp16lab's best amp-fp16 setting at this batch: {summary['engine_best']['setting']}, "
                     f"{summary['engine_best']['efficiency']:.3f}")
    if "transformer_default_efficiency" in summary:
        best = summary.get("transformer_best") or {}
        if best.get("setting") == DEFAULT_SETTING:  # no setting beat the defaults
            lines.append(f"transformer stack, amp-bf16, DDP defaults: {summary['transformer_default_efficiency']:.3f}; "
                         "no other setting did better in this run")
        else:
            lines.append(f"transformer stack, amp-bf16, DDP defaults: {summary['transformer_default_efficiency']:.3f}; "
                         f"best setting {best.get('setting')}: {best.get('efficiency', float('nan')):.3f}"
                         + (f", {summary['transformer_gap_recovered']:.0%} of the gap to 1.0 recovered"
                            if summary.get("transformer_gap_recovered") is not None else ""))
    for variant, v in summary.get("diagnosis", {}).items():
        eff = v.get("efficiency", {})
        parts = [f"{MODE_NAMES[m]} {eff[m]:.3f}" for m in ("no-ddp", "ddp", "ddp-no-broadcast") if m in eff]
        if parts:
            lines.append(f"{VARIANT_NAMES.get(variant, variant)}: " + ", ".join(parts))
        ranks = v.get("per_rank", {}).get("ddp") or []
        if len(ranks) > 1 and all(p.get("exposed_nccl") is not None and p.get("idle") is not None for p in ranks):
            waits = max(ranks, key=lambda p: p["exposed_nccl"])
            other = min(ranks, key=lambda p: p["exposed_nccl"])
            lines.append(f"  under DDP, in a profiled step, rank {waits['rank']} waits {waits['exposed_nccl']:.1f} ms "
                         f"in NCCL with no compute beside it, while rank {other['rank']}'s GPU sits idle "
                         f"{other['idle']:.1f} ms waiting for its host (a step without the profiler: "
                         f"{waits['step_ms']:.1f} ms)")
    return lines


def _gpu_slug() -> str:
    import torch

    name = torch.cuda.get_device_name(0)
    m = re.search(r"([A-Z]\d{2,4}|RTX ?\d{4})", name)
    return (m.group(1) if m else name).lower().replace(" ", "")


def main(argv: list[str] | None = None) -> int:
    ap = argument_parser("distributed", __doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CPU, two gloo ranks, tiny models: a smoke test")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for the result file (default: data/local/, or data/ with --replace)")
    ap.add_argument("--replace", action="store_true", help="write the committed file in data/")
    ap.add_argument("--name", default=None, help="result file stem (default distributed_<gpu>x<n>)")
    ap.add_argument("--gpus", type=int, default=2, help="ranks of the multi-GPU points (default 2)")
    ap.add_argument("--budget-s", type=float, default=380.0,
                    help="stop launching new fp16lab points this many seconds after the start (default 380)")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="seconds one point may run (default 120)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds of the bare loop's variants and modes (default 3; 1 with --quick)")
    args = ap.parse_args(argv)
    if args.gpus < 2:
        raise SystemExit(f"--gpus must be at least 2 (it is compared with 1), got {args.gpus}")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    for flag, value in (("--budget-s", args.budget_s), ("--timeout-s", args.timeout_s)):
        if not value > 0:
            raise SystemExit(f"{flag} must be a positive number of seconds, got {value}")
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
        raise SystemExit(str(e))
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
    summary = measure.read_result(path)["meta"]["summary"]
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

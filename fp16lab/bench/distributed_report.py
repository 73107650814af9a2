"""Reading the distributed benchmark's rows: scaling efficiencies, the bare loop's diagnosis, tables.

:func:`summarize` and :func:`diagnosis` make the summary :mod:`fp16lab.bench.distributed` writes
into its result's meta; :func:`wait_shares`, :func:`setting_effects`, :func:`diagnosis_table`
and :func:`summary_lines` are what notebook 08 shows of a result file.
"""

from __future__ import annotations

import statistics
from typing import Any

import pandas as pd

from fp16lab import distributed as dist_lab

#: The parameter-heavy point (model, batch per GPU) the benchmark measures with every DDP setting.
TRANSFORMER = dict(model="transformer_stack", batch=32)


def setting(row: dict[str, Any]) -> str:
    """Returns how a 2-GPU row's gradients travel, e.g. 'ddp hook=fp16 bucket=25MB'."""
    words = row["label"].split()
    return " ".join(words[4:]) or "-"


_DEFAULT_POINT = dist_lab.DistPoint(model="mlp", batch=1, precision="fp32", gpus=2, device="cpu")
#: The baseline's values of the settings a row records (a row without one of them has the
#: baseline's), as :class:`fp16lab.distributed.DistPoint` has them: DDP's own defaults, except
#: that the baseline keeps ``gradient_as_bucket_view=True`` (DDP's default is False; the
#: ``no_bucket_view`` rows are DDP's true default).
DDP_DEFAULTS = {k: getattr(_DEFAULT_POINT, k) for k in ("bucket_cap_mb", "static_graph")}
#: How :func:`setting` names a multi-GPU row whose DDP settings are all the baseline's.
DEFAULT_SETTING = setting({"label": _DEFAULT_POINT.label()})


def summarize(rows: list[dict[str, Any]], gpus: int, model: str, batch: int) -> dict[str, Any]:
    """Returns efficiencies per 2-GPU row, the engine against the bare loop, and the gap recovered.

    A row's efficiency is its rate over ``gpus`` times the one-GPU rate of the same kind, model,
    batch, precision and optimizer (for the bare loop: trained on GPU 0, mode ``gpu0``). The
    engine's figures are those of its baseline settings; ``engine_efficiency_no_broadcast`` (and
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
    """Returns, for every multi-GPU fp16lab row with an efficiency, the efficiency of the baseline
    (hook none, 25 MB buckets, gradient_as_bucket_view=True) for the same model, batch, precision
    and optimizer, and
    the change; rows measured more than once appear once per measurement."""
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
                    "setting": setting(r), "baseline": round(b, 3), "efficiency": round(r["efficiency"], 3),
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
        if best.get("setting") == DEFAULT_SETTING:  # no setting beat the baseline
            lines.append(f"transformer stack, amp-bf16, the baseline (DDP's defaults but gradient_as_bucket_view=True): {summary['transformer_default_efficiency']:.3f}; "
                         "no other setting did better in this run")
        else:
            lines.append(f"transformer stack, amp-bf16, the baseline (DDP's defaults but gradient_as_bucket_view=True): {summary['transformer_default_efficiency']:.3f}; "
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

"""Reading a sweep's rows: one row per point, stability flags, throughput/ratio/scaler tables, reference files."""

from __future__ import annotations

import math
from typing import Any, Sequence

import pandas as pd

from ..measure import describe_source, find_result, read_result
from ..recipes import SCALED_PRECISIONS
from ..scaling import ScalerSettings
from .axes import AXIS_DEFAULTS, variant_label
from .results import META_COLUMNS, drop_duplicate_measurements, read_results
from .point import SCALER_FIELDS
from .spec import check_tolerance

_POINT_COLUMNS = ("model", "batch", "layout", "precision", *SCALER_FIELDS, "cudnn_benchmark",
                  "device", *AXIS_DEFAULTS)


#: Telemetry averaged over a point's repeats: NVML's counters, and Hopper's GPM counters where
#: the GPU has them (None elsewhere).
_MEAN_COLUMNS = ("final_scale", "skipped_steps", "gpu_busy_mean", "mem_busy_mean",
                 "sm_clock_mhz_mean", "power_w_mean", "power_w_max", "sm_util_mean",
                 "sm_occupancy_mean", "tensor_util_mean", "dram_bw_util_mean")


def summarize_results(rows: pd.DataFrame, tolerance: float | None = None) -> pd.DataFrame:
    """Returns one row per point: the median over repeats, the repeat spread and the flags.

    ``repeat_spread`` is (max - min) / median of the repeats' median step times; a point is
    ``unstable`` when it exceeds ``tolerance`` (by default the tolerance the sweep was run with).
    ``status`` is 'oom' or 'error' when any repeat failed, else 'ok'. Rows of one point
    measured with different protocols (``warmup``, ``steps``) are summarized apart, one row each;
    two rows of one repeat (two sweeps measured it) count once.
    """
    if tolerance is not None:
        check_tolerance(tolerance)
    rows, _ = drop_duplicate_measurements(rows)
    out = []
    for (key, _, _), g in rows.groupby(["key", "warmup", "steps"], sort=False, dropna=False):
        first = g.iloc[0]
        ok = g[g["status"] == "ok"]
        bad = g[g["status"] != "ok"]
        tol = tolerance if tolerance is not None else float(first.get("tolerance") or 0.03)
        rec: dict[str, Any] = {c: first.get(c, AXIS_DEFAULTS.get(c)) for c in _POINT_COLUMNS}
        rec.update(key=key, warmup=first.get("warmup"), steps=first.get("steps"))
        rec["status"] = bad["status"].iloc[0] if len(bad) else "ok"
        rec["error"] = bad["error"].iloc[0] if len(bad) else ""
        rec["repeats"] = len(ok)
        if len(ok):
            med = ok["step_ms_median"].astype(float)
            m = float(med.median())
            rec["step_ms"] = m
            gpus = rec["gpus"] if rec["gpus"] == rec["gpus"] and rec["gpus"] else 1  # NaN: 1
            rec["samples_per_s"] = float(first["batch"]) * float(gpus) / (m / 1e3)
            rec["spread"] = float(ok["spread"].astype(float).median())
            rec["repeat_spread"] = float((med.max() - med.min()) / m) if len(ok) > 1 else 0.0
            rec["unstable"] = bool(rec["repeat_spread"] > tol)
            for c in ("peak_mem_allocated_mb", "peak_mem_reserved_mb"):
                vals = pd.to_numeric(ok[c], errors="coerce")
                rec[c] = float(vals.max()) if vals.notna().any() else None
            for c in _MEAN_COLUMNS:
                vals = pd.to_numeric(ok[c], errors="coerce") if c in ok else pd.Series(dtype=float)
                rec[c] = float(vals.mean()) if vals.notna().any() else None
            emulated = ok["fp8_emulated"].dropna() if "fp8_emulated" in ok else []
            rec["fp8_emulated"] = bool(any(emulated)) if len(emulated) else None
        else:
            rec["unstable"] = False
        for c in META_COLUMNS:
            rec[c] = first.get(c)
        out.append(rec)
    cols = ["key", *_POINT_COLUMNS, "warmup", "steps", "status", "repeats", "step_ms", "samples_per_s", "spread",
            "repeat_spread", "unstable", "peak_mem_allocated_mb", "peak_mem_reserved_mb",
            *_MEAN_COLUMNS, "fp8_emulated", "error", *META_COLUMNS]
    return pd.DataFrame(out).reindex(columns=cols)


def describe_rows(rows: pd.DataFrame) -> str:
    """Returns one line naming the device, driver, torch and CUDA versions of a results table."""
    if not len(rows):
        return "no rows"
    parts = []
    def filled(column: str, blank: str) -> pd.Series:  # a CSV's empty column reads as float
        return rows[column].astype(object).fillna(blank)

    for (gpu, drv, cuda, tv), _ in rows.groupby(
            [filled("gpu_name", "CPU"), filled("driver_version", "n/a"),
             filled("cuda_runtime_version", "n/a"), filled("torch", "?")]):
        parts.append(f"{gpu} (driver {drv}, CUDA {cuda}, torch {tv})")
    when = rows["finished_at"].dropna()
    span = f", {when.min()} to {when.max()}" if len(when) else ""
    return "measured on " + "; ".join(parts) + span


def format_report(rows: pd.DataFrame, tolerance: float | None = None) -> str:
    """Returns a readable table of a sweep's results, one line per point."""
    if not len(rows):
        return "no results"
    s = summarize_results(rows, tolerance)
    show = pd.DataFrame({
        "model": s["model"], "batch": s["batch"], "layout": s["layout"],
        "precision": s["precision"],
        "variant": _variants(s),
        "scale0": s["init_scale"].map(_pow2),
        "grow every": s["growth_interval"].map(lambda v: "" if pd.isna(v) else f"{int(v)}"),
        "warm-up+steps": [_protocol(w, n) for w, n in zip(s["warmup"], s["steps"])],
        "status": s["status"],
        "samples/s": s["samples_per_s"].map(lambda v: "" if pd.isna(v) else f"{v:,.0f}"),
        "step ms": s["step_ms"].map(lambda v: "" if pd.isna(v) else f"{v:.2f}"),
        "spread": s["spread"].map(lambda v: "" if pd.isna(v) else f"{100 * v:.1f}%"),
        "repeats": s["repeats"],
        "rep. spread": [("" if pd.isna(v) else f"{100 * v:.1f}%") + (" UNSTABLE" if u else "")
                        for v, u in zip(s["repeat_spread"], s["unstable"])],
        "peak alloc MB": s["peak_mem_allocated_mb"].map(lambda v: "" if pd.isna(v) else f"{v:,.0f}"),
        "peak resv MB": s["peak_mem_reserved_mb"].map(lambda v: "" if pd.isna(v) else f"{v:,.0f}"),
        "final scale": s["final_scale"].map(_pow2),
        "skipped": s["skipped_steps"].map(lambda v: "" if pd.isna(v) else f"{v:g}"),
        "GPU busy": s["gpu_busy_mean"].map(lambda v: "" if pd.isna(v) else f"{v:.0f}%"),
        "power W": s["power_w_mean"].map(lambda v: "" if pd.isna(v) else f"{v:.0f}"),
    })
    if not show["variant"].astype(bool).any():  # no execution, input or gpus but the defaults
        show = show.drop(columns="variant")
    lines = [describe_rows(rows), show.to_string(index=False)]
    _, twice = drop_duplicate_measurements(rows)
    if twice:
        lines.append(f"{twice} row(s) repeat a (key, repeat) another row holds (two sweeps "
                     f"measured it): each repeat is counted once, from its first row")
    errs = s[s["status"] != "ok"]
    for _, e in errs.iterrows():
        v = variant_label(e.to_dict())
        lines.append(f"{e['status']}: {e['model']} b{e['batch']} {e['layout']} {e['precision']}"
                     f"{' ' + v if v else ''}: {e['error']}")
    protocols = s[["warmup", "steps"]].drop_duplicates()
    if len(protocols) > 1:
        lines.append(f"the rows come from {len(protocols)} protocols (warm-up+steps "
                     f"{', '.join(_protocol(w, n) for w, n in protocols.itertuples(index=False))}); "
                     f"a point measured with two is shown once for each")
    emulated = s[s["fp8_emulated"].eq(True)]  # None where no FP8 ran; all-NaN floats from a CSV
    for _, e in emulated.iterrows():
        lines.append(f"{e['model']} b{e['batch']} {e['precision']}: FP8 matmuls emulated (no "
                     f"torch._scaled_mm for them here): its samples/s is not an FP8 speed")
    n_unstable = int(s["unstable"].sum())
    if n_unstable:
        lines.append(f"{n_unstable} point(s) UNSTABLE: their repeat medians differ by more than "
                     f"the tolerance; re-run them on a quieter machine or with more steps")
    return "\n".join(lines)


def _variants(s: pd.DataFrame) -> list[str]:
    """Returns each summarized point's non-default execution, input and gpus ('' for none)."""
    return [variant_label(r) for r in s.to_dict("records")]


def _protocol(warmup: Any, steps: Any) -> str:
    """Returns a point's protocol as 'warm-up+steps', e.g. '3+10'."""
    return "?" if pd.isna(warmup) or pd.isna(steps) else f"{int(warmup)}+{int(steps)}"


def _pow2(v: Any) -> str:
    """Returns a scale as '2^k' when it is a power of two, else in %g form; '' for none."""
    if v is None or pd.isna(v):
        return ""
    k = math.log2(v) if v > 0 else float("nan")
    return f"2^{k:.0f}" if k == round(k) else f"{v:g}"


def throughput_table(rows: pd.DataFrame, *, model: str | None = None,
                     index: str = "batch", columns: Sequence[str] = ("layout", "precision")
                     ) -> pd.DataFrame:
    """Returns samples/s pivoted by batch size (rows) and layout/precision (columns).

    Only points measured with the default scaler settings (or none), eager on synthetic input
    on one GPU, are used, so those variations do not average into the table.
    """
    s = summarize_results(rows)
    s = s[(s["status"] == "ok") & (pd.Series(_variants(s), index=s.index) == "")]
    if model is not None:
        s = s[s["model"] == model]
    default = ScalerSettings()
    for field in SCALER_FIELDS:
        s = s[s[field].isna() | (s[field] == getattr(default, field))]
    return s.pivot_table(index=index, columns=list(columns), values="samples_per_s",
                         aggfunc="median")


def ratio_table(rows: pd.DataFrame, *, model: str | None = None, by: str = "precision",
                baseline: str = "fp32") -> pd.DataFrame:
    """Returns samples/s of every value of ``by`` divided by the ``baseline``'s, per batch size.

    ``by`` is 'precision' (columns: layout, precision) or 'layout' (columns: precision,
    layout); a value above 1 is a speed-up over the baseline measured at the same batch size and
    other setting.
    """
    if by not in ("precision", "layout"):
        raise ValueError(f"by must be 'precision' or 'layout', got {by!r}")
    other = "layout" if by == "precision" else "precision"
    t = throughput_table(rows, model=model, columns=(other, by))
    ratios = {}
    for o in t.columns.get_level_values(0).unique():
        sub = t[o]
        if baseline not in sub.columns:
            continue
        for v in sub.columns:
            if v != baseline:
                ratios[(o, f"{v} / {baseline}")] = sub[v] / sub[baseline]
    if not ratios:
        raise ValueError(f"no {by} {baseline!r} points to compare with")
    out = pd.DataFrame(ratios)
    out.columns = pd.MultiIndex.from_tuples(out.columns, names=[other, by])
    return out


def scaler_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Returns the points that differ only in loss-scaler settings, side by side.

    Shows what the settings change (skipped steps, the final scale) next to what they do not
    (samples/s), for every model, batch, layout and precision measured with several settings.
    Scales are given as log2 (16 for 65536).
    """
    s = summarize_results(rows)
    s = s[s["precision"].isin(SCALED_PRECISIONS) & (s["status"] == "ok")]
    group = ["model", "batch", "layout", "precision"]
    n = s.groupby(group)[list(SCALER_FIELDS)].transform(lambda c: c.nunique()).max(axis=1) if len(s) else []
    s = s[pd.Series(n, index=s.index) > 1] if len(s) else s
    steps = rows.groupby("key")[["warmup", "steps"]].first().sum(axis=1).rename("steps_per_repeat")
    s = s.join(steps, on="key")
    s = s.assign(log2_init_scale=_log2(s["init_scale"]), log2_final_scale=_log2(s["final_scale"]))
    return s[[*group, "log2_init_scale", "growth_factor", "backoff_factor", "growth_interval",
              "steps_per_repeat", "skipped_steps", "log2_final_scale", "samples_per_s",
              "repeat_spread"]].reset_index(drop=True)


def _log2(x: pd.Series) -> pd.Series:
    import numpy as np

    return np.log2(pd.to_numeric(x, errors="coerce").astype(float))


def load_reference(name: str = "sweep_reference_h200") -> pd.DataFrame | None:
    """Returns the rows of a reference sweep in data/, or None (saying so) when it is absent."""
    path = find_result(name, ".parquet")
    if not path.exists():
        print(f"{path.name} is not in {path.parent} yet: run `fp16lab bench sweep_reference` on a "
              f"GPU to make it. The cells that use it print nothing.")
        return None
    rows = read_results(path)
    print(f"{path.name} ({'measured on this machine' if path.parent.name == 'local' else 'shipped with fp16lab'}): "
          f"{len(rows)} rows, {describe_rows(rows)}")
    return rows


def engine_check(name: str = "sweep_engine_vs_loop") -> str:
    """Returns the engine-versus-bare-loop benchmark's findings as a few lines of text."""
    try:
        r = read_result(name, meta_needs=[f"summary.{k}" for k in (
            "model", "batch", "layout", "precision", "repeats", "steps", "repeat_spread",
            "bare_ms", "engine_ms", "engine_vs_bare", "telemetry_overhead")],
                        allow_empty=True)  # the findings are the meta's summary, not its rows
    except FileNotFoundError:
        return (f"{name}.json is not in the data folder yet: run `fp16lab bench "
                f"sweep_engine_vs_loop` on a GPU to make it")
    m = r["meta"]
    s = m["summary"]
    spread = max(s["repeat_spread"].values())
    return "\n".join([
        f"{s['model']} b{s['batch']} {s['layout']} {s['precision']}, {s['repeats']} interleaved "
        f"repeats of {s['steps']} steps; {describe_source(m)}",
        f"bare loop {s['bare_ms']:.2f} ms/step, engine {s['engine_ms']:.2f} ms/step: the engine "
        f"takes {s['engine_vs_bare']:.3f}x the bare loop's time",
        f"the repeats of each way agree within {100 * spread:.2f}%",
        f"sampling the GPU counters changes the step time by {100 * s['telemetry_overhead']:+.2f}%",
    ])

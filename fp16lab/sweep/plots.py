"""Plotting a sweep: samples/s, peak memory and GPU busy % against batch size.

A series is one layout, precision and variant (non-default execution, input or gpus): colour
by precision (the fp8 recipes after the recipes' five, drawn with diamonds), line style by
layout, and a dotted line with a marker of its own for a variant.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pandas as pd

from ..scaling import ScalerSettings
from .axes import SWEEP_PRECISIONS, variant_label
from .report import summarize_results
from .point import SCALER_FIELDS

_LAYOUT_STYLE = {"nchw": ("-", "o"), "channels_last": ("--", "s")}
#: Marker of a variant, by its first word (execution, input, or xN for several GPUs).
_VARIANT_MARKERS = {"cuda-graph": "P", "compile": "X", "dataloader": "v", "gpu-decode": "<",
                    "dali": ">"}
_PLOT_PANELS = (("samples_per_s", "samples/s"),
                ("peak_mem_allocated_mb", "peak memory allocated (MB)"),
                ("gpu_busy_mean", "GPU busy % (NVML)"))
#: Where the points have Hopper's GPM counters, the third panel shows SM utilisation instead of
#: NVML's busy %, which only says that some kernel ran during each sample period.
_GPM_PANEL = ("sm_util_mean", "SM utilisation % (NVML GPM)")
_PERCENT_PANELS = ("gpu_busy_mean", "sm_util_mean")


def _plot_points(rows: pd.DataFrame, model: str | None) -> pd.DataFrame:
    """Returns the summarized 'ok' points a plot shows: default scaler settings (or none) only."""
    if not len(rows):
        return pd.DataFrame()
    s = summarize_results(rows)
    s = s[s["status"] == "ok"]
    if model is not None:
        s = s[s["model"] == model]
    scaler = s[list(SCALER_FIELDS)]
    default = scaler.isna().all(axis=1) | (scaler == pd.Series(asdict(ScalerSettings()))).all(axis=1)
    return s[default]


def plot_style(layout: str, precision: str, variant: str = "") -> dict[str, Any]:
    """Returns the matplotlib line style of a series: colour by precision, line and marker by
    layout, diamonds for fp8, a dotted line and a marker of its own for a variant."""
    ls, marker = _LAYOUT_STYLE.get(layout, (":", "^"))
    if precision.startswith("fp8-"):
        marker = "D"
    if variant:
        first = variant.split()[0].split("(")[0]
        ls, marker = ":", "*" if first.startswith("x") else _VARIANT_MARKERS.get(first, "*")
    return dict(color=f"C{list(SWEEP_PRECISIONS).index(precision) % 10}", ls=ls, marker=marker)


def plot_results(rows: pd.DataFrame, *, model: str | None = None, fig: Any = None) -> Any:
    """Returns a matplotlib Figure: samples/s, peak memory and GPU busy % against batch size.

    One line per layout and precision: colour is the precision, line style and marker the
    layout; every point has a marker, so a single batch size shows too. A hollow marker is an
    UNSTABLE point (its repeats differ by more than the tolerance). With several models, each
    model gets its own row of panels. Only points measured with the default loss-scaler settings
    (or none) are drawn, so scaler variations do not average in. Pass a
    ``matplotlib.figure.Figure`` as ``fig`` to draw without pyplot (from a background thread);
    without one, a pyplot figure is made and closed, so a notebook shows it once, as the value.
    """
    s = _plot_points(rows, model)
    models = list(dict.fromkeys(s["model"])) if len(s) else [model or ""]
    if fig is None:
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(14, 3.6 * len(models)), layout="constrained")
        plt.close(fig)
    axes = fig.subplots(len(models), 3, squeeze=False)
    handles: dict[str, Any] = {}
    any_unstable = False
    for r, m in enumerate(models):
        sm = s[s["model"] == m] if len(s) else s
        sm = sm.assign(variant=[variant_label(r) for r in sm.to_dict("records")])
        panels = list(_PLOT_PANELS)
        if len(sm) and "sm_util_mean" in sm and pd.to_numeric(sm["sm_util_mean"], errors="coerce").notna().any():
            panels[2] = _GPM_PANEL
        for ax, (col, title) in zip(axes[r], panels):
            ax.set_title(f"{m}: {title}" if len(models) > 1 else title, fontsize=10)
            ax.set_xlabel("batch size")
            has = len(sm) and pd.to_numeric(sm[col], errors="coerce").notna().any()
            if not has:
                why = ("not measured on a CPU" if len(sm) and (sm["device"] == "cpu").all()
                       else "no points yet")
                ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes,
                        color="0.4")
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            for (lay, prec, var), g in sm.groupby(["layout", "precision", "variant"], sort=False):
                g = g.assign(y=pd.to_numeric(g[col], errors="coerce")).dropna(subset=["y"])
                g = g.sort_values("batch")
                if not len(g):
                    continue
                style = plot_style(lay, prec, var)
                name = f"{lay} {prec}{' ' + var if var else ''}"
                unstable = g["unstable"].astype(bool).to_numpy()
                stable_at = [i for i, u in enumerate(unstable) if not u]
                (line,) = ax.plot(g["batch"].to_numpy(), g["y"].to_numpy(), **style, ms=6,
                                  markevery=stable_at, label=name)
                if unstable.any():
                    any_unstable = True
                    ax.plot(g["batch"].to_numpy()[unstable], g["y"].to_numpy()[unstable],
                            ls="none", marker=style["marker"], ms=6, color=style["color"],
                            mfc="white", zorder=line.get_zorder() + 0.1)
                handles.setdefault(name, line)
            batches = sorted(sm["batch"].unique())
            if len(batches) > 1:
                ax.set_xscale("log", base=2)
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.minorticks_off()
            ax.set_ylim(0, 105) if col in _PERCENT_PANELS else ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
    if handles:
        from matplotlib.lines import Line2D

        labels = list(handles)
        hs = [Line2D([], [], **{k: v for k, v in (("color", h.get_color()),
                                                  ("ls", h.get_linestyle()),
                                                  ("marker", h.get_marker()))})
              for h in handles.values()]
        if any_unstable:
            labels.append("hollow: UNSTABLE")
            hs.append(Line2D([], [], ls="none", marker="o", color="0.3", mfc="white"))
        fig.legend(hs, labels, loc="outside right upper", fontsize=8, frameon=False)
    return fig

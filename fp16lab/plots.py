"""Plots the notebooks share: the log2|x| histogram against format ranges, ULP vs magnitude.

``plot_census`` draws a tensor's histogram of binary exponents with each format's subnormal
range (light) and normal range (darker) shaded behind it, in the manner of the gradient
histogram of Micikevicius et al., "Mixed Precision Training" (ICLR 2018), Figure 3.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np

from . import validate
from .bits import ulp
from .census import CensusResult, census
from .formats import format_info

#: One colour per format, so a format looks the same in every plot.
FORMAT_COLOURS = {"fp32": "#7f7f7f", "tf32": "#8c564b", "fp16": "#1f77b4", "bf16": "#ff7f0e",
                  "fp8_e4m3": "#2ca02c", "fp8_e5m2": "#d62728"}


def _axes(ax):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=(9, 3.6))
    return ax


def shade_format_ranges(ax, formats: Iterable[str] = ("fp16",), *, label: bool = True) -> None:
    """Shades each format's subnormal and normal ranges of log2|x| on an axis (x in exponents)."""
    for i, name in enumerate(formats):
        f = format_info(name)
        colour = FORMAT_COLOURS.get(f.name, f"C{i}")
        sub_lo = math.log2(f.smallest_subnormal)
        norm_lo = math.log2(f.smallest_normal)
        hi = math.log2(f.max_finite)
        ax.axvspan(sub_lo, norm_lo, color=colour, alpha=0.08, lw=0,
                   label=f"{f.name} subnormal" if label else None)
        ax.axvspan(norm_lo, hi, color=colour, alpha=0.16, lw=0,
                   label=f"{f.name} normal" if label else None)
        for xv in (sub_lo, hi):
            ax.axvline(xv, color=colour, lw=1, ls="--")


def plot_census(data: Any, formats: Iterable[str] = ("fp16",), ax=None, *,
                label: str | None = None, title: str | None = None, logy: bool = True,
                scale: float = 1.0, xlim: tuple[float, float] | None = None):
    """Returns a matplotlib Axes with the log2|x| histogram of one or more tensors over the
    ranges of the given formats.

    Args:
        data: a :class:`~fp16lab.census.CensusResult`, a tensor / array (counted here), or a
            dict ``{label: result or tensor}`` to overlay several histograms.
        formats: formats whose subnormal and normal ranges are shaded.
        ax: axes to draw on (a new figure if None).
        label, title: legend label for a single histogram, and the axes title.
        logy: logarithmic count axis (zeros are not drawn).
        scale: multiply the data by this before counting (e.g. a loss scale), which shifts the
            histogram by log2(scale) bins. Only applies to tensors, not to finished results.
        xlim: exponent range to show; default the data's range and the first format's range.
    """
    formats = tuple(formats)
    ax = _axes(ax)
    items = data.items() if isinstance(data, Mapping) else [(label, data)]
    shade_format_ranges(ax, formats)
    zero_notes = []
    spans = []
    for i, (name, item) in enumerate(items):
        if not isinstance(item, CensusResult):
            item = census(item * scale if scale != 1.0 else item, formats[0] if formats else "fp16")
        frac = item.hist / max(item.n, 1)
        keep = item.hist > 0
        if item.log2_range():
            spans.append(item.log2_range())
        # bin e holds 2^e <= |x| < 2^(e+1): a bar from e to e+1
        ax.bar(item.exponents[keep], frac[keep], width=1.0, align="edge", alpha=0.55,
               color=f"C{i + 4}" if name else "0.25", label=name or "values", edgecolor="none")
        if item.counts.get("zero"):
            who = f"{name}: " if name else ""
            zero_notes.append(f"{who}{100 * item.fractions['zero']:.1f}% zeros")
    if logy:
        ax.set_yscale("log")
    if xlim is None and spans:
        lo = min(min(a for a, _ in spans), math.log2(format_info(formats[0]).smallest_subnormal)
                 if formats else 0)
        hi = max(max(b for _, b in spans), math.log2(format_info(formats[0]).max_finite)
                 if formats else 0)
        xlim = (lo - 4, hi + 4)
    if xlim is not None:
        ax.set_xlim(*xlim)
    ax.set_xlabel("log2 |x|  (binary exponent)")
    ax.set_ylabel("fraction of values")
    if title:
        ax.set_title(title)
    if zero_notes:
        ax.text(0.01, 0.97, "; ".join(zero_notes) + " (not drawn)", transform=ax.transAxes,
                va="top", fontsize=8)
    ax.legend(fontsize=8, loc="upper right", ncol=2)
    return ax


def plot_ulp(formats: Iterable[str] = ("fp16", "bf16"), ax=None, *, points: int = 2000,
             relative: bool = False, xlim: tuple[float, float] | None = None):
    """Returns Axes with the spacing between neighbouring numbers (ULP) against magnitude,
    on log-log axes, for each format from its smallest subnormal to its largest finite value.

    With ``relative=True`` plots ULP/|x| instead: flat (epsilon/2 .. epsilon) over the normal
    range and rising through the subnormals, where precision is lost. The x range defaults to
    the first format's range (``xlim`` overrides it).
    """
    points = validate.count("points", points, low=2)
    validate.boolean("relative", relative)
    ax = _axes(ax)
    formats = tuple(formats)
    if xlim is None and formats:
        f0 = format_info(formats[0])
        xlim = (f0.smallest_subnormal / 4, f0.max_finite * 4)
    shown: list[np.ndarray] = []
    for i, name in enumerate(formats):
        f = format_info(name)
        x = np.logspace(math.log10(f.smallest_subnormal), math.log10(f.max_finite), points)
        y = ulp(x, f)
        if relative:
            y = y / x
        if xlim is not None:
            shown.append(y[(x >= xlim[0]) & (x <= xlim[1])])
        ax.step(x, y, where="post", color=FORMAT_COLOURS.get(f.name, f"C{i}"), label=f.name)
        ax.axvline(f.smallest_normal, color=FORMAT_COLOURS.get(f.name, f"C{i}"), ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    if xlim is not None:
        ax.set_xlim(*xlim)
        ys = np.concatenate(shown) if shown else np.array([])
        if ys.size:  # fit the y axis to what is inside the x range, not to every format's span
            ax.set_ylim(ys.min() / 2, ys.max() * 2)
    ax.set_xlabel("|x|  (dotted: smallest normal)")
    ax.set_ylabel("ULP / |x|" if relative else "ULP (gap to the next number)")
    ax.legend()
    return ax


def census_table(df, column: str = "underflow", *, kinds: Iterable[str] = (
        "weight", "activation", "gradient"), split_tensors: bool = True):
    """Returns a DataFrame of one class's fraction per row label and kind from
    :func:`~fp16lab.census.census_model`'s DataFrame.

    With ``split_tensors`` (the default) each parameter gets its own row (``bn.weight`` and
    ``bn.bias``: a BatchNorm's weights, all 1, and biases, all 0, are not one "50% zero" layer);
    activations keep the layer's name. Without it, rows are layers and each layer's fraction is
    over all of its elements (the tensors weighted by their element counts ``n``).
    """
    missing = {"layer", "kind", "tensor", "n", column} - set(df.columns)
    if missing:
        raise ValueError(f"census_table needs census_model's columns; missing {sorted(missing)}")
    sub = df[df["kind"].isin(tuple(kinds))]
    label = sub["layer"]
    if split_tensors:
        param = sub["kind"] != "activation"
        label = label.where(~param, sub["layer"] + "." + sub["tensor"])
        label = label.str.lstrip(".")
    counted = sub.assign(label=label, _hits=sub[column] * sub["n"])
    sums = counted.groupby(["label", "kind"], sort=False)[["_hits", "n"]].sum()
    table = (sums["_hits"] / sums["n"]).unstack("kind")
    return table.reindex(index=list(dict.fromkeys(label)),
                         columns=[k for k in kinds if k in table.columns])


def plot_census_table(df, column: str = "underflow", ax=None, *, kinds: Iterable[str] = (
        "weight", "activation", "gradient"), split_tensors: bool = True):
    """Returns Axes with one class's fraction per layer (or parameter) and kind, drawn from
    :func:`census_table` (e.g. how much of each layer's gradient would underflow)."""
    ax = _axes(ax)
    table = census_table(df, column, kinds=kinds, split_tensors=split_tensors)
    table.plot.bar(ax=ax, width=0.8)
    ax.set_ylabel(f"fraction {column}")
    ax.set_xlabel("parameter or layer" if split_tensors else "layer")
    ax.tick_params(axis="x", labelrotation=90)  # one name per bar group, none overlapping
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def plot_waves(rows: list[Mapping[str, Any]], ax=None, *, mark: Iterable[int] = (256, 320)):
    """Plots measured TFLOP/s of a GEMM against the batch, beside the tile-and-wave efficiency.

    ``rows`` are those of ``fp16lab.bench.wave_quantization`` (batch, tflops, efficiency, waves).
    The efficiency, on the right axis, is the arithmetic of :mod:`fp16lab.waves` for the tile
    each call's kernel name states; where the two curves move together, the tiles explain the
    rate. Returns the axes.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4))
    batch = [r["batch"] for r in rows]
    ax.plot(batch, [r["tflops"] for r in rows], "o-", ms=3, color="C0", label="measured TFLOP/s")
    ax.set_xlabel("batch (rows M of the GEMM)")
    ax.set_ylabel("TFLOP/s")
    right = ax.twinx()
    eff = [(b, r["efficiency"]) for b, r in zip(batch, rows) if r.get("efficiency") is not None]
    if eff:
        right.plot(*zip(*eff), "--", color="C1", label="tiles x waves efficiency")
    right.set_ylabel("useful share of SM-tile slots")
    right.set_ylim(0, 1.05)
    for b in mark:
        ax.axvline(b, color="0.6", lw=0.8, ls=":")
    lines = ax.get_lines()[:1] + right.get_lines()[:1]
    ax.legend(lines, [line.get_label() for line in lines], loc="upper left",
              bbox_to_anchor=(0, -0.18), ncol=2, frameon=False)
    ax.set_title("Linear(4096, 4096) in fp16: rate against batch, with the tile arithmetic")
    return ax

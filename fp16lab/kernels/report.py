"""Reading the measured GEMM results: tables, plots, a roofline and source diffs.

The notebook calls these on files written by ``fp16lab.bench.gemm`` and ``fp16lab.bench.alignment``
(loaded with :func:`fp16lab.measure.read_result`), so every number it shows comes from a measurement.
The alignment lesson's functions live in :mod:`fp16lab.alignment` and are re-exported here.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from ..alignment import (alignment_classes, alignment_finding, alignment_table,  # noqa: F401
                         gemm_kernel_names, plot_alignment, uses_tensor_cores)
from .. import validate
from ..bits import decode
from . import KERNELS, LADDER
from .compiler import source_path


def kernels_table(variants: bool = False):
    """Returns a DataFrame describing the ladder's kernels, one per step (step, tiles, threads,
    shared memory); with ``variants=True`` the tuning variants of steps 4-6 too."""
    import pandas as pd

    specs = (KERNELS if validate.boolean("variants", variants) else LADDER).values()
    return pd.DataFrame([{"step": k.step, "kernel": k.name, "what it adds": k.title,
                          "block tile": f"{k.bm}x{k.bn}", "threads": k.threads,
                          "dynamic smem (KB)": round(k.dynamic_smem / 1024, 1),
                          "source": k.source} for k in specs]).set_index("kernel")


def _rows(payload: dict[str, Any]):
    import pandas as pd

    df = pd.DataFrame(payload["rows"])
    # keep the kernels this version of the package still has, and cuBLAS
    return df[(df["kind"] == "cublas") | df["impl"].isin(list(KERNELS))]


def ladder_table(payload: dict[str, Any], shape: str | None = None):
    """Returns a DataFrame of every measured implementation: TFLOP/s and % of cuBLAS (cupy.matmul)."""
    df = _rows(payload)
    if shape is not None:
        df = df[df["shape"] == shape]
    cols = ["shape", "impl", "step", "tflops", "pct_cublas", "rel_err", "median_ms"]
    return df[cols].sort_values(["shape", "step", "impl"]).reset_index(drop=True)


def largest_square(payload: dict[str, Any]) -> int:
    """Returns the largest M = N = K that a measured file holds."""
    return max(r["m"] for r in payload["rows"] if r["m"] == r["n"] == r["k"])


def best_per_step(payload: dict[str, Any], size: int | None = None) -> dict[int, str]:
    """Returns {step: the best kernel of that step at size^3} (default: the largest size).

    Best means the highest % of cuBLAS: each kernel's ratio comes from blocks timed alternately
    with cuBLAS, so, unlike TFLOP/s taken seconds apart, it does not depend on how warm the card
    was when that kernel's turn came.
    """
    size = size or largest_square(payload)
    df = _rows(payload)
    df = df[(df["shape"] == f"{size}x{size}x{size}") & (df["kind"] == "kernel")]
    return {int(step): g.sort_values("pct_cublas")["impl"].iloc[-1] for step, g in df.groupby("step")}


def mma_sync_peak(payload: dict[str, Any]) -> float | None:
    """Returns the best measured mma.sync peak (TFLOP/s) stored with a gemm result, if any."""
    peak = payload["meta"].get("mma_sync_peak")
    return max(p["tflops"] for p in peak) if peak else None


def ladder_summary(payload: dict[str, Any], size: int | None = None):
    """Returns the ladder at size^3 (default: the largest size measured): the best kernel of each
    step with TFLOP/s and its ratios.

    Columns: the kernel, TFLOP/s, % of cuBLAS and the TFLOP/s of the cupy.matmul blocks timed
    alongside it (their ratio; older files lack the latter), % of the measured
    mma.sync peak (the ceiling of any kernel built on that instruction), and the speed-up over
    the step before.
    """
    import pandas as pd

    size = size or largest_square(payload)
    df = _rows(payload)
    df = df[df["shape"] == f"{size}x{size}x{size}"].set_index("impl")
    peak = mma_sync_peak(payload)
    rows = []
    for step, name in sorted(best_per_step(payload, size).items()):
        r = df.loc[name]
        rows.append({"step": step, "kernel": name, "TFLOP/s": r["tflops"],
                     "% of cuBLAS": r["pct_cublas"],
                     "cuBLAS alongside": r.get("cublas_paired_tflops", float("nan")),
                     "% of mma.sync peak": 100 * r["tflops"] / peak if peak else float("nan"),
                     "rel. error": r["rel_err"]})
    out = pd.DataFrame(rows).set_index("step")
    out["x previous step"] = out["TFLOP/s"] / out["TFLOP/s"].shift(1)
    for impl in ("cupy.matmul", "torch.matmul"):
        if impl in df.index:
            out.loc[f"cuBLAS ({impl})"] = {"kernel": impl, "TFLOP/s": df.loc[impl, "tflops"],
                                           "% of cuBLAS": df.loc[impl, "pct_cublas"],
                                           "cuBLAS alongside": df.loc[impl].get(
                                               "cublas_paired_tflops", float("nan")),
                                           "% of mma.sync peak": float("nan"),
                                           "rel. error": df.loc[impl, "rel_err"],
                                           "x previous step": float("nan")}
    return out


#: The ladder's kernel families, the steps each covers, and the % of cuBLAS the benchmark asks of it.
FAMILIES = (("best WMMA-API kernel (steps 1-4)", (1, 2, 3, 4), 50.0),
            ("best mma.sync kernel (step 5)", (5,), 70.0),
            ("best wgmma kernel (step 6)", (6,), 90.0))


def best_by_family(payload: dict[str, Any], size: int = 8192):
    """Returns the fastest kernel of each family at size^3: its TFLOP/s, % of cuBLAS (burst
    timings alternating with cuBLAS) and, where the file has it, the ratio over a second of
    back-to-back calls each."""
    import pandas as pd

    df = _rows(payload)
    df = df[(df["shape"] == f"{size}x{size}x{size}") & (df["kind"] == "kernel")]
    out = []
    for label, steps, _ in FAMILIES:
        g = df[df["step"].isin(steps)].sort_values("pct_cublas")
        if g.empty:
            continue
        best = g.iloc[-1]
        out.append({"family": label, "kernel": best["impl"], "TFLOP/s": best["tflops"],
                    "% of cuBLAS": best["pct_cublas"],
                    "% of cuBLAS, sustained": best.get("pct_cublas_sustained", float("nan"))})
    return pd.DataFrame(out).set_index("family")


def targets(payload: dict[str, Any], size: int = 8192):
    """Returns :func:`best_by_family` against the benchmark's targets (best WMMA-API kernel >= 50%
    of cuBLAS, best mma.sync kernel >= 70%, best wgmma kernel >= 90%), with whether each is met."""
    best = best_by_family(payload, size)
    goals = {label: goal for label, _, goal in FAMILIES}
    out = best.assign(met=[bool(pct >= goals[f]) for f, pct in best["% of cuBLAS"].items()])
    out.index = [f"{f} >= {goals[f]:.0f}% of cuBLAS" for f in out.index]
    out.index.name = "target"
    return out[["kernel", "TFLOP/s", "% of cuBLAS", "met", "% of cuBLAS, sustained"]]


def ceiling_table(payload: dict[str, Any]):
    """Returns the rows of ``fp16lab.bench.gemm_ceiling``: what limits the mma.sync kernels.

    Columns: the instruction, burst TFLOP/s and % of cuBLAS (timed alongside it), sustained
    TFLOP/s with the median SM clock and board power over about a second, and for Triton rows
    the tile configuration that did best.
    """
    import pandas as pd

    df = pd.DataFrame(payload["rows"])
    cols = {"what": "what", "instruction": "instruction", "tflops": "TFLOP/s",
            "pct_cublas": "% of cuBLAS", "sustained_tflops": "sustained TFLOP/s",
            "sm_clock_mhz": "SM clock (MHz)", "power_w": "power (W)", "config": "config"}
    df = df[[c for c in cols if c in df.columns]].rename(columns=cols)
    return df.set_index("what")


def sizes_table(payload: dict[str, Any], kernels: list[str] | None = None, value: str = "tflops"):
    """Returns a kernels x shapes DataFrame of TFLOP/s (or another column, e.g. pct_cublas)."""
    df = _rows(payload)
    if kernels is not None:
        df = df[df["impl"].isin(kernels)]
    order = list(dict.fromkeys(df["shape"]))
    t = df.pivot_table(index="impl", columns="shape", values=value, sort=False)
    return t[order].loc[list(dict.fromkeys(df["impl"]))]


def kernel_colour(impl: str, step: int | None) -> str:
    """Returns the colour of a kernel in every plot of notebook 03: one per ladder step, cuBLAS black."""
    return "black" if step is None or impl in ("cupy.matmul", "torch.matmul") else f"C{int(step) - 1}"


def plot_ladder(payload: dict[str, Any], kernels: list[str] | None = None, ax=None):
    """Returns an Axes with TFLOP/s against square size; by default the best kernel of each step."""
    import matplotlib.pyplot as plt

    df = _rows(payload)
    if kernels is None:
        kernels = list(best_per_step(payload).values())
    sq = df[(df.m == df.n) & (df.n == df.k) & (df.m % 1024 == 0)]
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 4.5), layout="constrained")
    for impl in ["cupy.matmul", "torch.matmul"] + kernels:
        g = sq[sq["impl"] == impl].sort_values("m")
        if g.empty:
            continue
        if g["kind"].iloc[0] == "cublas":
            ax.plot(g["m"], g["tflops"], "k--" if impl == "cupy.matmul" else "k:", label=f"cuBLAS ({impl})")
        else:
            step = g["step"].iloc[0]
            ax.plot(g["m"], g["tflops"], "o-", color=kernel_colour(impl, step), label=f"{step}. {impl}")
    peak = mma_sync_peak(payload)
    if peak:
        ax.axhline(peak, color="tab:red", lw=1, ls="-.", label=f"mma.sync peak ({peak:.0f})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(sq["m"].unique()), [str(x) for x in sorted(sq["m"].unique())])
    ax.set_xlabel("M = N = K")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("fp16 GEMM on " + str(payload["meta"].get("gpu_name")) + ": the ladder against cuBLAS")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside, not over, the lines
    ax.grid(alpha=0.3)
    return ax


def plot_roofline(payload: dict[str, Any], kernels: list[str] | None = None, ax=None):
    """Returns an Axes with the roofline and the measured points of every square size.

    A GEMM of M x N x K does 2*M*N*K operations and must move at least A and B once and C once,
    2*(M*K + K*N + M*N) bytes in fp16: their ratio is the point's intensity.
    The flat roof is the best cuBLAS rate measured in the run, the slope the measured
    device-to-device copy rate; a second flat line marks the measured mma.sync peak, the roof
    for kernels that use that instruction (cuBLAS uses Hopper's wgmma instead).
    """
    import matplotlib.pyplot as plt
    import numpy as np

    df = _rows(payload)
    if kernels is None:
        kernels = list(best_per_step(payload).values())
    peak = df[df.kind == "cublas"]["tflops"].max()
    bw = payload["meta"].get("copy_gbs")
    mma_peak = mma_sync_peak(payload)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 4.5), layout="constrained")
    x = np.logspace(1, 4, 200)
    if bw:
        ax.plot(x, np.minimum(peak, x * bw / 1e3), "k-", lw=2,
                label=f"roof: min({peak:.0f} TFLOP/s cuBLAS, {bw / 1e3:.2f} TB/s x intensity)")
        ridge = peak * 1e3 / bw
        ax.axvline(ridge, color="gray", lw=0.8, ls=":")
        ax.annotate(f" ridge: {ridge:.0f} FLOP/B", (ridge, 3), fontsize=8, color="gray")
    if mma_peak:
        ax.plot(x, np.minimum(mma_peak, x * (bw or np.inf) / 1e3), color="tab:red", ls="-.",
                label=f"mma.sync roof ({mma_peak:.0f} TFLOP/s measured)")
    sq = df[(df.m == df.n) & (df.n == df.k) & (df.m % 1024 == 0)]
    for impl in ["cupy.matmul"] + kernels:
        g = sq[sq["impl"] == impl].sort_values("m")
        ai = 2 * g.m * g.n * g.k / (2 * (g.m * g.k + g.k * g.n + g.m * g.n))
        step = None if g.empty or impl == "cupy.matmul" else g["step"].iloc[0]
        ax.plot(ai, g["tflops"], "x--" if impl == "cupy.matmul" else "o-", label=impl, ms=5,
                color=kernel_colour(impl, step))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(1, 2 * peak)
    ax.set_xlabel("arithmetic intensity: FLOP per byte of the fewest bytes moved (square sizes)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("Roofline: every size is right of the ridge, so the ceiling is arithmetic")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, which="both")
    return ax


def source_diff(before: str, after: str, context: int = 1, max_lines: int | None = None) -> str:
    """Returns a unified diff between two of the package's .cu files (what one ladder step adds)."""
    a = source_path(before).read_text().splitlines()
    b = source_path(after).read_text().splitlines()
    lines = list(difflib.unified_diff(a, b, before, after, n=context, lineterm=""))
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more diff lines: "
                                     f"source_diff({before!r}, {after!r}) shows all)"]
    return "\n".join(lines)


def source_function(filename: str, name: str) -> str:
    """Returns one function of a .cu file, from the comment block above it to its closing brace.

    A step that rewrites its predecessor (step 6 shares little text with step 5) reads better a
    function at a time than as a diff.
    """
    lines = source_path(filename).read_text().splitlines()
    pattern = re.compile(rf"^\S.*\b{re.escape(name)}\(")
    try:
        start = next(i for i, ln in enumerate(lines) if pattern.match(ln))
    except StopIteration:
        raise ValueError(f"no function {name!r} defined in {filename}") from None
    while start > 0 and (lines[start - 1].startswith("//") or lines[start - 1].startswith("template")):
        start -= 1
    depth, end = 0, None
    for i in range(start, len(lines)):
        depth += lines[i].count("{") - lines[i].count("}")
        if "{" in "".join(lines[start:i + 1]) and depth == 0:
            end = i
            break
    return "\n".join(lines[start:end + 1])


def bits_table(values: Any, printed: str | None = None):
    """Returns a DataFrame: each fp16 value, its code from numpy, the code the device printed, decoded.

    ``printed`` is the text of :func:`fp16lab.kernels.print_fp16_bits` (``None`` where the kernel
    did not run); the codes are decoded with notebook 01's :func:`fp16lab.bits.decode`.
    """
    import numpy as np
    import pandas as pd

    v = np.asarray(values, dtype=np.float16).ravel()
    codes = v.view(np.uint16).astype(np.int64)
    dev = {}
    for line in (printed or "").splitlines():
        m = re.match(r"fp16\[(\d+)\] = 0x([0-9a-f]{4})", line.strip())
        if m:
            dev[int(m.group(1))] = m.group(2)
    return pd.DataFrame({"value": v.astype(np.float64), "numpy code": [f"{c:04x}" for c in codes],
                         "device printf": [dev.get(i, "not run") for i in range(len(v))],
                         "decoded (fp16lab.bits)": decode(codes, "fp16")})


# ----------------------------------------------------------------------- Nsight Compute's counters

def _ladder_counters(payload: dict[str, Any]):
    import pandas as pd

    return pd.DataFrame([r for r in payload["rows"] if r.get("part") == "ladder"])


def counters_table(payload: dict[str, Any]):
    """Returns one line per ladder step and cuBLAS from a ``fp16lab bench counters`` file: rate,
    measured intensity, the counters in % of their peaks, the bottleneck they name, and the stall
    reason each step cut most from the step before (in stalled warp-cycles, before -> after)."""
    df = _ladder_counters(payload)
    moved = [f"{r.moved}: {r.moved_before / 1e9:.2f} -> {r.moved_after / 1e9:.2f}"
             if isinstance(r.moved, str) else "" for r in df.itertuples()]
    out = df.assign(cut=moved).set_index("impl")[
        ["step", "tflops", "intensity_flop_per_byte", "tensor", "sm", "dram", "issue",
         "occupancy", "bottleneck", "cut"]]
    return out.rename(columns={"tflops": "TFLOP/s", "intensity_flop_per_byte": "FLOP/byte",
                               "tensor": "tensor %", "sm": "SM %", "dram": "DRAM %",
                               "issue": "issue %", "occupancy": "occupancy %",
                               "cut": "stall cut most (G warp-cycles)"}).round(1)


def counter_ceilings(payload: dict[str, Any]) -> tuple[float, float]:
    """Returns (the DRAM bandwidth in GB/s, the tensor-pipe rate in TFLOP/s) that the counters'
    percentages are of: the median over the ladder of bytes/s over the DRAM %, and cuBLAS's
    TFLOP/s over its tensor-pipe % (the rate its kernel would reach with the pipes always busy)."""
    import numpy as np

    df = _ladder_counters(payload)
    cublas = df[df["impl"] == "cupy.matmul"].iloc[0]
    return float(np.median(df["dram_peak_gbs"])), float(cublas["tflops"] / (cublas["tensor"] / 100))


def plot_counter_roofline(payload: dict[str, Any], ax=None):
    """Returns an Axes with the ladder and cuBLAS at their measured intensity (FLOPs of the shape
    over the DRAM bytes the counters read) and rate, under the roofs :func:`counter_ceilings`
    derives from the same counters."""
    import matplotlib.pyplot as plt
    import numpy as np

    df = _ladder_counters(payload)
    bw, peak = counter_ceilings(payload)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4.5), layout="constrained")
    x = np.logspace(0, 4, 200)
    ax.plot(x, np.minimum(peak, x * bw / 1e3), "k-", lw=2,
            label=f"roof: min({peak:.0f} TFLOP/s, {bw / 1e3:.2f} TB/s x intensity)")
    for r in df.itertuples():
        ax.plot(r.intensity_flop_per_byte, r.tflops, "x" if r.step == 0 else "o", ms=8,
                color=kernel_colour(r.impl, None if r.step == 0 else r.step),
                label=f"{r.impl} ({r.bottleneck})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(5, 2 * peak)
    ax.set_xlabel("FLOP per byte read from or written to DRAM (measured)")
    ax.set_ylabel("TFLOP/s")
    size = int(df["size"].iloc[0])
    ax.set_title(f"The ladder at {size}^3 under Nsight Compute: intensity from the DRAM counters")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, which="both")
    return ax

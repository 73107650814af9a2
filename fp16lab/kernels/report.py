"""Reading the measured GEMM and alignment results: tables, plots, a roofline and source diffs.

The notebook calls these on files written by ``benchmarks/gemm.py`` and ``benchmarks/alignment.py``
(loaded with :func:`fp16lab.bench.read_result`), so every number it shows comes from a measurement.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from .compiler import source_path

# Substrings of cuBLAS/CUTLASS kernel names that mean a Tensor Core path: Hopper's warpgroup
# MMA (gmma), the older warp MMA (hmma, xmma, tensorop) and the instruction shapes in names
# such as s16816gemm or h1688gemm. A plain "sgemm"/"gemv" without these is a CUDA-core kernel.
# cuBLAS 13's own Hopper kernels are named nvjet_sm90_* (built on wgmma).
_TC_PATTERNS = re.compile(r"nvjet|gmma|hmma|xmma|tensorop|16816|1688|884|_mma|cutlass.*f16", re.I)
_NOT_KERNELS = re.compile(r"^(Memset|Memcpy)", re.I)


def gemm_kernel_names(names: list[str]) -> list[str]:
    """Returns the names that are GPU kernels, dropping the profiler's Memset/Memcpy entries."""
    return [n for n in names if not _NOT_KERNELS.match(n)]


def uses_tensor_cores(kernel_name: str) -> bool:
    """Returns True when a GPU kernel's name marks it as a Tensor Core GEMM (a name heuristic)."""
    return bool(_TC_PATTERNS.search(kernel_name))


def ladder_table(payload: dict[str, Any], shape: str | None = None):
    """Returns a DataFrame of implementations x shapes: TFLOP/s and % of cuBLAS (cupy.matmul)."""
    import pandas as pd

    df = pd.DataFrame(payload["rows"])
    if shape is not None:
        df = df[df["shape"] == shape]
    cols = ["shape", "impl", "step", "tflops", "pct_cublas", "rel_err", "median_ms"]
    return df[cols].sort_values(["shape", "step", "impl"], key=None).reset_index(drop=True)


def ladder_summary(payload: dict[str, Any], size: int = 8192):
    """Returns one row per implementation at size^3 (TFLOP/s, % of cuBLAS), in ladder order."""
    df = ladder_table(payload, f"{size}x{size}x{size}")
    return df.sort_values(["step", "impl"]).set_index("impl")[["step", "tflops", "pct_cublas",
                                                                  "rel_err"]]


def plot_ladder(payload: dict[str, Any], ax=None):
    """Returns a matplotlib Axes with TFLOP/s against square size for every implementation."""
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.DataFrame(payload["rows"])
    sq = df[(df.m == df.n) & (df.n == df.k) & (df.m % 1024 == 0)]
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.5))
    for impl, g in sq.groupby("impl", sort=False):
        g = g.sort_values("m")
        style = "k--" if g["kind"].iloc[0] == "cublas" else "o-"
        ax.plot(g["m"], g["tflops"], style, label=impl, alpha=0.6 if style == "k--" else 1.0)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M = N = K")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("fp16 GEMM: the kernel ladder against cuBLAS")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    return ax


def roofline_points(payload: dict[str, Any], size: int = 8192) -> list[dict[str, float]]:
    """Returns, per implementation at size^3, its arithmetic intensity (FLOP per byte) and TFLOP/s.

    The intensity counts the fewest bytes a GEMM must move: A and B read once (fp16) and C
    written once (fp16), 2*(M*K + K*N + M*N) bytes, against 2*M*N*K operations.
    """
    out = []
    for r in payload["rows"]:
        if r["m"] == r["n"] == r["k"] == size:
            m, n, k = r["m"], r["n"], r["k"]
            out.append({"impl": r["impl"], "intensity": 2 * m * n * k / (2 * (m * k + k * n + m * n)),
                        "tflops": r["tflops"]})
    return out


def plot_roofline(payload: dict[str, Any], ax=None):
    """Returns an Axes with the roofline (measured cuBLAS peak, measured copy bandwidth) and points.

    The flat roof is the best cuBLAS rate measured in the run, the slope the measured
    device-to-device copy rate; each implementation is drawn at the intensity of every square size.
    """
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    df = pd.DataFrame(payload["rows"])
    peak = df[df.kind == "cublas"]["tflops"].max()
    bw = payload["meta"].get("copy_gbs")
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.5))
    x = np.logspace(0, 4, 200)
    if bw:
        ax.plot(x, np.minimum(peak, x * bw / 1e3), "k-", lw=2,
                label=f"roof: min({peak:.0f} TFLOP/s, {bw / 1e3:.1f} TB/s x intensity)")
    else:
        ax.axhline(peak, color="k", lw=2, label=f"cuBLAS peak {peak:.0f} TFLOP/s")
    sq = df[(df.m == df.n) & (df.n == df.k) & (df.m % 1024 == 0)]
    for impl, g in sq.groupby("impl", sort=False):
        ai = 2 * g.m * g.n * g.k / (2 * (g.m * g.k + g.k * g.n + g.m * g.n))
        ax.plot(ai, g["tflops"], "o" if g["kind"].iloc[0] == "kernel" else "x", label=impl)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of the fewest bytes moved)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("Roofline: 1024..8192 cubed, all far right of the ridge (compute-bound)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3, which="both")
    return ax


def source_diff(before: str, after: str, context: int = 1) -> str:
    """Returns a unified diff between two of the package's .cu files (what one ladder step adds)."""
    a = source_path(before).read_text().splitlines()
    b = source_path(after).read_text().splitlines()
    return "\n".join(difflib.unified_diff(a, b, before, after, n=context, lineterm=""))


def alignment_table(payload: dict[str, Any], mode: str = "square"):
    """Returns a DataFrame of d, N, TFLOP/s, relative speed and the first kernel name for one mode."""
    import pandas as pd

    df = pd.DataFrame([r for r in payload["rows"] if r["mode"] == mode])
    df["kernel"] = df["kernels"].map(lambda ks: (gemm_kernel_names(ks) or [""])[0])
    # classify again from the recorded names, so older files get today's rule
    df["tensor_core_by_name"] = df["kernel"].map(uses_tensor_cores)
    base = float(df.loc[df.d == 0, "tflops"].iloc[0])
    df["vs_d0"] = df["tflops"] / base
    return df[["d", "n", "mult8", "mult16", "tflops", "vs_d0", "tensor_core_by_name", "kernel"]]


def alignment_finding(payload: dict[str, Any], mode: str = "square") -> str:
    """Returns one paragraph answering: must dimensions be multiples of 16, of 8, or neither?"""
    df = alignment_table(payload, mode)
    g = df.groupby(df["n"].map(lambda n: "16" if n % 16 == 0 else "8" if n % 8 == 0 else "other"))
    mean = g["tflops"].mean()
    tc = g["tensor_core_by_name"].all()
    parts = [f"multiples of {key if key != 'other' else 'neither 8 nor 16'}: mean "
             f"{mean[key]:.0f} TFLOP/s, Tensor Core kernel names {'always' if tc[key] else 'NOT always'}"
             for key in ("16", "8", "other") if key in mean]
    slow = mean.get("other", float("nan")) / mean.get("16", float("nan"))
    verdict = ("every size ran on Tensor Core kernels" if df["tensor_core_by_name"].all() else
               "some sizes fell back to kernels whose names show no Tensor Core path")
    return (f"{mode}: {verdict}; " + "; ".join(parts) +
            f". Sizes that are not multiples of 8 reach {100 * slow:.0f}% of the multiple-of-16 rate.")

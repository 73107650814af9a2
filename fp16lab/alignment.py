"""The cuBLAS alignment lesson: which GEMM shapes run on Tensor Cores, and how fast, read from kernel names.

One heuristic (:func:`uses_tensor_cores`) classifies the kernels ``torch.profiler`` saw; the
tables and plots read the file of ``fp16lab.bench.alignment`` (notebook 03) and the figures of
the alignment claim (notebook 05).
"""

from __future__ import annotations

import re
from typing import Any

# Substrings of cuBLAS/CUTLASS kernel names that mean a Tensor Core path: Hopper's warpgroup
# MMA (gmma), the older warp MMA (hmma, xmma, tensorop) and the instruction shapes in names
# such as s16816gemm or h1688gemm. A plain "sgemm"/"gemv" without these is a CUDA-core kernel.
# cuBLAS 13's own Hopper kernels are named nvjet_sm90_* (built on wgmma).
_TC_PATTERNS = re.compile(r"nvjet|gmma|hmma|xmma|tensorop|16816|1688|884|_mma|cutlass.*f16", re.I)
_SIMT = re.compile(r"simt|ffma|hfma|sgemm", re.I)
_NOT_KERNELS = re.compile(r"^(Memset|Memcpy)", re.I)


def gemm_kernel_names(names: list[str]) -> list[str]:
    """Returns the names that are GPU kernels, dropping the profiler's Memset/Memcpy entries."""
    return [n for n in names if not _NOT_KERNELS.match(n)]


def uses_tensor_cores(kernel_name: str) -> bool:
    """Returns True when a GPU kernel's name marks it as a Tensor Core GEMM (a name heuristic).

    Names that also say SIMT (``simt``, ``ffma``, ``hfma``, ``sgemm``) are CUDA-core kernels even
    when they carry a tensor-core word: some cuBLAS CUDA-core kernels have ``xmma`` in their names.
    """
    return bool(_TC_PATTERNS.search(kernel_name)) and not _SIMT.search(kernel_name)


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


def _family(name: str) -> str:
    if name.startswith("nvjet"):
        return "nvjet (cuBLAS Hopper kernels, wgmma)"
    m = re.search(r"cutlass_(\d+)_tensorop.*?(s\d+gemm).*?(align\d+)", name)
    if m:
        return f"cutlass sm{m.group(1)} tensorop {m.group(2)} {m.group(3)}"
    return name[:60]


def alignment_classes(payload: dict[str, Any], mode: str = "square"):
    """Returns, per divisibility class of N (by 16, by 8 only, by 2 only, odd), the mean TFLOP/s,
    its ratio to the multiples of 16, whether every kernel is a Tensor Core one, and the kernel families."""
    import pandas as pd

    df = alignment_table(payload, mode)

    def cls(n: int) -> str:
        return ("multiple of 16" if n % 16 == 0 else "multiple of 8, not 16" if n % 8 == 0 else
                "even, not a multiple of 8" if n % 2 == 0 else "odd")
    df["class"] = df["n"].map(cls)
    df["family"] = df["kernel"].map(_family)
    g = df.groupby("class", sort=False)
    out = pd.DataFrame({"sizes": g["n"].apply(lambda s: ", ".join(map(str, s))),
                        "mean TFLOP/s": g["tflops"].mean(),
                        "Tensor Core kernel": g["tensor_core_by_name"].all(),
                        "kernels": g["family"].apply(lambda s: "; ".join(sorted(set(s))))})
    out["vs multiples of 16"] = out["mean TFLOP/s"] / out.loc["multiple of 16", "mean TFLOP/s"]
    order = ["multiple of 16", "multiple of 8, not 16", "even, not a multiple of 8", "odd"]
    return out.loc[[c for c in order if c in out.index]]


def alignment_finding(payload: dict[str, Any], mode: str = "square") -> str:
    """Returns one paragraph answering: must dimensions be multiples of 16, of 8, or neither?"""
    c = alignment_classes(payload, mode)
    r8 = c.loc["multiple of 8, not 16", "vs multiples of 16"] if "multiple of 8, not 16" in c.index else float("nan")
    rest = c.drop(index=[i for i in ("multiple of 16", "multiple of 8, not 16") if i in c.index])
    tc_all = bool(c["Tensor Core kernel"].all())
    return (f"{mode}: multiples of 8 run at {100 * r8:.0f}% of the multiples-of-16 rate on the same "
            f"kernel family ({c.loc['multiple of 16', 'kernels']}); sizes that are not multiples of 8 "
            f"drop to {100 * rest['vs multiples of 16'].min():.0f}-{100 * rest['vs multiples of 16'].max():.0f}% "
            f"({'; '.join(rest['kernels'])}). "
            + ("Every size ran on Tensor Core kernels: what a multiple of 8 buys is the fast Hopper "
               "path with 16-byte aligned loads, not the use of Tensor Cores at all."
               if tc_all else "Some sizes ran on kernels whose names show no Tensor Core path."))


def plot_alignment(payload: dict[str, Any], ax=None):
    """Returns an Axes with cuBLAS TFLOP/s against d for N = base + d, one line per mode."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.8))
    for mode, style in (("square", "o-"), ("n_only", "s--")):
        if not any(r["mode"] == mode for r in payload["rows"]):
            continue
        df = alignment_table(payload, mode)
        ax.plot(df["d"], df["tflops"], style, label={"square": "M = N = K = 4096 + d",
                                                     "n_only": "M = K = 4096, N = 4096 + d"}[mode])
    for d in (0, 8, 16):
        ax.axvline(d, color="green", lw=0.8, alpha=0.5)
    ax.set_xticks(range(0, 17))
    ax.set_xlabel("d (green lines: N a multiple of 8)")
    ax.set_ylabel("TFLOP/s (torch.matmul, fp16)")
    ax.set_title("cuBLAS fp16 GEMM at N = 4096 + d")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


def plot_claim(claim: Any, axes: Any = None) -> Any:
    """Returns matplotlib axes with the alignment claim's figures (claim 1 of :mod:`fp16lab.claims`).

    Left: fp16 GEMM TFLOP/s against N; right: Linear TFLOP/s against batch size.

    Bars are green where the profiled kernel's name marks a tensor-core kernel or the rate is
    above what CUDA cores can reach; the dashed line is the CUDA-core fp16 ceiling (twice the fp32 GEMM with TF32 off). Returns None
    (and says why) when the claim has no figures.
    """
    import matplotlib.pyplot as plt

    f = claim.figures
    if not f.get("gemm"):
        print(f"claim {claim.id} has no figures to plot ({claim.verdict}: {claim.reason})")
        return None
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    ax1, ax2 = axes
    gemm = f["gemm"]
    ceiling = f["cuda_core_fp16_ceiling_tflops"]
    colours = ["tab:green" if uses_tensor_cores(r["kernel"]) or r["tflops"] > ceiling
               else "tab:blue" for r in gemm]
    ax1.bar([str(r["n"]) for r in gemm], [r["tflops"] for r in gemm], color=colours)
    ax1.axhline(ceiling, ls="--", color="grey", label="CUDA-core fp16 ceiling (2x fp32 GEMM)")
    ax1.set(xlabel="N (fp16 GEMM N x N x N)", ylabel="TFLOP/s",
            title="green: tensor cores (kernel name, or a rate above the ceiling)")
    ax1.legend(fontsize=8)
    lin = f["linear"]
    ax2.bar([str(r["batch"]) for r in lin], [r["tflops"] for r in lin],
            color=["tab:orange" if r["batch"] % 256 == 0 else "tab:grey" for r in lin])
    ax2.set(xlabel=f"batch (Linear {f['linear_features']} -> {f['linear_features']}, fp16)",
            ylabel="TFLOP/s", title="orange: a multiple of 256")
    ax1.figure.suptitle(claim.source, fontsize=8)
    ax1.figure.tight_layout()
    return axes

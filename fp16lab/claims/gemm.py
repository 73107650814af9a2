"""Claims about GEMMs on tensor cores: dimension alignment (claim 1) and fp16 against fp32 (claim 11)."""

from __future__ import annotations

import re
from typing import Any, Callable

from ..alignment import uses_tensor_cores
from ..measure import cuda_kernels
from ..recipes import tf32 as _tf32
from .. import validate
from .core import (FAILS, HOLDS, MATERIAL_GAIN, PARTLY, Claim, Figures, Judgement, _device, _ratio,
                   _sizes, _timer, _torch)


def _gemm_tflops(n: int, dtype, *, repeat: int) -> float:
    """Returns the TFLOP/s of torch.matmul on n x n CUDA matrices of ``dtype``."""
    torch = _torch()
    dev = _device()
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    c = torch.empty(n, n, device=dev, dtype=dtype)
    t = _timer(dev)(lambda: torch.matmul(a, b, out=c), warmup=3, repeat=repeat)
    return 2 * n**3 / (t.median_ms * 1e-3) / 1e12


def _gpu_kernel_name(fn: Callable[[], Any]) -> str:
    """Returns the name of the CUDA kernel that runs longest in one call of ``fn`` (torch.profiler).

    The kernels come from ``measure.cuda_kernels``, as in fp16lab.bench.alignment; "Memset" and
    other helpers are shorter than the GEMM itself.
    """
    torch = _torch()
    if not torch.cuda.is_available():
        return "n/a (no CUDA)"
    try:
        kernels = cuda_kernels(fn, warmup=1)
        if not kernels:
            return "no kernel recorded"
        return max(kernels, key=lambda k: k[1])[0]
    except Exception as e:  # profiling is supporting evidence; never fail the claim on it
        return f"unavailable ({type(e).__name__}: {e})"


# --------------------------------------------------------------------------------------------
# Claim 1: multiples of 16, tensor-core fallback, batch multiple of 256
# --------------------------------------------------------------------------------------------

def experiment_alignment(quick: bool = False) -> Figures:
    """Returns fp16 GEMM TFLOP/s at N = base + d, the FP32 CUDA-core ceiling, and Linear TFLOP/s
    at batches around 256 (CUDA)."""
    validate.boolean("quick", quick)
    torch = _torch()
    dev = _device()
    base, feats, rep = _sizes(quick, (4096, 4096, 30), (1024, 1024, 10), (32, 32, 2))
    gemm = []
    for d in (0, 1, 2, 4, 8, 16):
        n = base + d
        a = torch.randn(n, n, device=dev, dtype=torch.float16)
        b = torch.randn(n, n, device=dev, dtype=torch.float16)
        gemm.append({"n": n, "offset": d, "tflops": _gemm_tflops(n, torch.float16, repeat=rep),
                     "kernel": _gpu_kernel_name(lambda: a @ b)})
        del a, b
    with _tf32(False, False):
        fp32 = _gemm_tflops(base, torch.float32, repeat=rep)
    w = torch.randn(feats, feats, device=dev, dtype=torch.float16)
    linear = []
    for batch in (192, 248, 255, 256, 257, 264, 320):
        x = torch.randn(batch, feats, device=dev, dtype=torch.float16)
        inner = 10

        def calls() -> None:
            for _ in range(inner):
                torch.nn.functional.linear(x, w)

        t = _timer(dev)(calls, warmup=3, repeat=rep)
        linear.append({"batch": batch,
                       "tflops": 2 * batch * feats * feats * inner / (t.median_ms * 1e-3) / 1e12})
    return {"n_base": base, "gemm": gemm, "fp32_simt_tflops": fp32,
            "cuda_core_fp16_ceiling_tflops": 2 * fp32, "linear_features": feats, "linear": linear}


def judge_alignment(f: Figures) -> Judgement:
    """Rules on claim 1 from GEMM and Linear throughputs."""
    t = {r["offset"]: r["tflops"] for r in f["gemm"]}
    kernel = {r["offset"]: r["kernel"] for r in f["gemm"]}
    lin = {r["batch"]: r["tflops"] for r in f["linear"]}
    ceiling = f["cuda_core_fp16_ceiling_tflops"]
    odd, aligned = t[1], max(t[0], t[16])
    fallback = odd <= ceiling and not uses_tensor_cores(kernel[1])
    needs16 = _ratio(t[16], t[8]) >= MATERIAL_GAIN
    b256 = _ratio(lin[256], max(lin[192], lin[320])) >= MATERIAL_GAIN
    gain = _ratio(aligned, odd)
    name = re.sub(r"^void |\(.*$", "", kernel[1])[:90]
    cores = ("no sign of tensor cores" if fallback else
             "the kernel name says tensor cores" if uses_tensor_cores(kernel[1]) else
             "above the measured CUDA-core ceiling: most likely tensor cores")
    facts = (f"fp16 GEMM N={f['n_base'] + 1}: {odd:.0f} TFLOP/s (CUDA-core fp16 ceiling "
             f"{ceiling:.0f}) in {name} ({cores}); "
             f"aligned/odd = {gain:.2f}x; multiple of 16 vs 8: {_ratio(t[16], t[8]):.2f}x; "
             f"batch 256 vs best of 192/320: {_ratio(lin[256], max(lin[192], lin[320])):.2f}x")
    held = [name for name, ok in (("tensor cores are lost off alignment", fallback),
                                  ("multiples of 16 beat multiples of 8", needs16),
                                  ("batch 256 is special", b256)) if ok]
    if fallback and needs16 and b256:
        return HOLDS, facts
    if not held and gain < MATERIAL_GAIN:
        return FAILS, facts
    if not held:
        return PARTLY, (f"unaligned sizes are slower (aligned ones {gain:.2f}x faster), "
                        f"but not from a fallback: they still run on tensor cores; multiples of "
                        f"8 suffice, and batch 256 is not special. {facts}")
    return PARTLY, f"only these parts: {', '.join(held)}. {facts}"


# --------------------------------------------------------------------------------------------
# Claim 11: fp16 tensor-core throughput is 8x fp32
# --------------------------------------------------------------------------------------------

#: The claimed ratio and the band (relative) within which it counts as holding.
CLAIMED_RATIO, RATIO_BAND = 8.0, 0.25


def experiment_fp16_vs_fp32(quick: bool = False) -> Figures:
    """Returns cuBLAS GEMM TFLOP/s in fp16, fp32 (TF32 off) and TF32, and their ratios (CUDA)."""
    validate.boolean("quick", quick)
    torch = _torch()
    n, rep = _sizes(quick, (8192, 20), (2048, 10), (32, 2))
    fp16 = _gemm_tflops(n, torch.float16, repeat=rep)
    with _tf32(False, False):
        fp32 = _gemm_tflops(n, torch.float32, repeat=rep)
    with _tf32(True, True):
        tf32 = _gemm_tflops(n, torch.float32, repeat=rep)
    return {"n": n, "fp16_tflops": fp16, "fp32_tflops": fp32, "tf32_tflops": tf32,
            "ratio_fp16_fp32": fp16 / fp32, "ratio_fp16_tf32": fp16 / tf32}


def judge_fp16_vs_fp32(f: Figures) -> Judgement:
    """Rules on claim 11 from the measured fp16/fp32 GEMM throughput ratio."""
    r = f["ratio_fp16_fp32"]
    facts = (f"N={f['n']}: fp16 {f['fp16_tflops']:.0f}, fp32 {f['fp32_tflops']:.0f}, TF32 "
             f"{f['tf32_tflops']:.0f} TFLOP/s; fp16/fp32 = {r:.1f}x, fp16/TF32 = "
             f"{f['ratio_fp16_tf32']:.1f}x (8x is V100's datasheet 125/15.7)")
    if abs(r / CLAIMED_RATIO - 1) <= RATIO_BAND:
        return HOLDS, facts
    return FAILS, facts


CLAIM_1 = Claim(
    1, "dims x16, batch x256",
    "Matrix dimensions must be multiples of 16, or Tensor Cores fall back to CUDA cores; "
    "batch sizes that are multiples of 256 give peak Tensor Core use.",
    "fp16 GEMM at N=4096+d: 'fall back' holds if at odd N the profiled kernel is not a "
    "tensor-core kernel by name and runs no faster than 2x the fp32 CUDA-core GEMM; 'x16' if N%16 beats N%8 by >=10%; 'x256' if a Linear at batch 256 beats "
    "batches 192 and 320 by >=10%; all three: holds; none and aligned/odd < 1.1x: does not "
    "hold; else holds in part.",
    experiment_alignment, judge_alignment, needs_gpu=True,
    origin=("a widely read WMMA-kernel tutorial and an RTX 3090 tuning recipe, both saying "
            "that Tensor Cores need dimensions that are multiples of 16, and the recipe that "
            "batches in multiples of 256 use them best"))


CLAIM_11 = Claim(
    11, "fp16 = 8x fp32",
    "FP16 Tensor Core throughput is 8 times FP32 throughput.",
    "cuBLAS GEMM fp16/fp32 (TF32 off) TFLOP/s ratio within 25% of 8: holds; otherwise "
    "does not hold.",
    experiment_fp16_vs_fp32, judge_fp16_vs_fp32, needs_gpu=True,
    origin=("a widely read WMMA-kernel tutorial quoting the A100's 312 TFLOPS of FP16 as 8 "
            "times its FP32 rate"))

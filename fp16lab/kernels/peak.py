"""The measured ceiling of the instruction the ladder's kernels run on: mma.sync's peak rate.

A GEMM kernel built on ``mma.sync`` (or on the WMMA API, which compiles to the same HMMA
instructions) cannot beat the rate at which the tensor cores execute that instruction with
operands already in registers. :func:`mma_sync_peak` measures it with ``mma_peak.cu``: every
warp issues independent ``mma.sync.m16n8k16`` into 16 accumulators, with no memory traffic.
On Hopper, cuBLAS uses ``wgmma`` instead, so this number, not cuBLAS, is the roof for the ladder.
"""

from __future__ import annotations

from typing import Any, Callable

from ..measure import time_cuda
from .compiler import get_function, require_cupy

_ACC = 16                 # accumulators per warp in mma_peak.cu
_FLOP_PER_MMA = 2 * 16 * 8 * 16


def peak_launch(operands: str = "constant", warps_per_sm: int = 8,
                iters: int = 20000) -> tuple[Callable[[], Any], Any, int]:
    """Returns (launch, out, flops): a callable that runs ``mma_peak.cu`` once on every SM, the
    array it writes one sum per thread into, and the floating-point operations of one launch.

    ``operands="constant"`` multiplies the same fragments every time (the instruction's ceiling);
    ``"random"`` cycles through 4 A and 4 B fragments of random finite fp16 values, so that the
    operands change on every instruction as in a GEMM (the ceiling under the card's power limit).
    """
    import numpy as np

    if operands not in ("constant", "random"):
        raise ValueError(f"operands must be 'constant' or 'random', got {operands!r}")
    cupy = require_cupy()
    sms = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["multiProcessorCount"]
    threads = min(warps_per_sm, 32) * 32
    blocks = sms * max(1, warps_per_sm // 32)
    out = cupy.empty(blocks * threads, dtype=cupy.float32)
    if operands == "random":
        fn = get_function("mma_peak.cu", "mma_sync_peak_varied")
        halfs = np.random.default_rng(0).standard_normal(32 * 24 * 2).astype(np.float16)
        args: tuple = (cupy.asarray(halfs.view(np.uint32)), out, np.int32(iters))
    else:
        fn = get_function("mma_peak.cu", "mma_sync_peak")
        args = (out, np.int32(iters))
    flops = blocks * (threads // 32) * iters * _ACC * _FLOP_PER_MMA
    return (lambda: fn((blocks,), (threads,), args)), out, flops


def mma_sync_peak(warps_per_sm: tuple[int, ...] = (4, 8, 16), iters: int = 20000,
                  repeat: int = 10, operands: str = "constant") -> list[dict[str, Any]]:
    """Returns, per warps-per-SM setting, the median mma.sync rate in TFLOP/s over ``repeat`` runs
    of :func:`peak_launch` (``operands`` as there)."""
    rows = []
    for warps in warps_per_sm:
        launch, out, flops = peak_launch(operands, warps, iters)
        t = time_cuda(launch, warmup=2, repeat=repeat, backend="cupy")
        rows.append({"warps_per_sm": warps, "operands": operands,
                     "tflops": flops / (t.median_ms * 1e-3) / 1e12,
                     "median_ms": t.median_ms, "finite": bool(require_cupy().isfinite(out).all())})
    return rows

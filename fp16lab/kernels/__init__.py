"""Tensor-core GEMM kernels in CUDA C++, compiled and launched through CuPy: a ladder from slow to fast.

``gemm(a, b, kernel=NAME)`` multiplies row-major fp16 matrices ``a`` (M x K) and ``b`` (K x N)
with fp32 accumulation and returns ``c`` (M x N) in fp32 or fp16. ``LADDER`` holds one kernel per
step, the best measured configuration of each idea, each step keeping the previous one's and
adding one:

1. ``wmma_naive``: one warp per 16x16 tile of C, fragments read straight from global memory;
2. ``wmma_smem``: 128x128 block tiles, 8 warps, A and B staged through shared memory;
3. ``wmma_padded``: padded shared-memory rows against bank conflicts, 16-byte vector loads;
4. ``wmma_pipeline``: ``cp.async`` copies with stages in flight in dynamic shared memory,
   64x64 warp tiles;
5. ``mma_sync``: inline-PTX ``mma.sync.m16n8k16`` with ``ldmatrix`` from XOR-swizzled shared
   memory, 64x64 warp tiles, fragments double-buffered in registers;
6. ``wgmma``: Hopper's warpgroup MMA reading both operands from shared memory, filled by TMA
   copies on an mbarrier pipeline, a producer warpgroup and two consumer warpgroups
   (:mod:`.wgmma`; built by nvcc for sm_90a through :mod:`.cubin`, so Hopper GPUs only).

``VARIANTS`` holds the other configurations of steps 4 to 6 (tiles, stages, schedules) that the
benchmarks and their tests time and check; ``KERNELS`` holds both. The tile sizes are written
once, in the tables below: steps 4 to 6 receive them as -D flags.

Any M, N, K works. Steps 1 and 2 handle edges element by element inside the kernel. Steps 3 to 6
move 16-byte chunks (step 6: TMA boxes), zero-filled outside the matrices, which needs K and N to
be multiples of 8: when they are not, the launcher copies A and B into zero-padded arrays (K and N
rounded up to 8; an extra read and write of A and B, and of C) and returns the M x N part. Inputs
whose data pointer is not 256-byte aligned (offset views) are copied first.

``print_fp16_bits`` runs a debugging kernel that prints fp16 bit patterns with device ``printf``;
:mod:`.peak` measures the mma.sync ceiling, :mod:`.emulate` emulates one fragment multiply on the
CPU, :mod:`.report` reads measured results, :mod:`.measure` runs checks and timings from a notebook.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from fp16lab import validate

from . import wgmma as _wgmma_launch
from .compiler import (KernelUnavailable, available, find_cuda_include, get_function,
                       load_module, require_cupy, source_path)

__all__ = ["KERNELS", "LADDER", "VARIANTS", "KernelSpec", "KernelUnavailable", "available", "find_cuda_include", "gemm",
           "load_module", "print_fp16_bits", "source_path", "gemm_flops"]


@dataclass(frozen=True)
class KernelSpec:
    """How to launch one kernel of the ladder."""

    name: str
    step: int
    title: str
    source: str          # .cu file in this package
    function: str        # extern "C" name, without the _f32/_f16 suffix
    bm: int              # rows of C per block
    bn: int              # columns of C per block
    threads: int
    dynamic_smem: int    # bytes of dynamic shared memory (0: static only)
    layout: str          # "warp_tiles": one warp per 16x16 tile; "grid2d": (N/BN, M/BM); "linear";
                         # "tma": TMA tensor maps and thread-block clusters (fp16lab.kernels.wgmma)
    chunked: bool        # moves 16-byte chunks: needs K and N multiples of 8 (else padded)
    builder: str = "nvrtc"   # "nvrtc": CuPy compiles the source; "nvcc": a cached sm_90a cubin
    defines: tuple[tuple[str, int], ...] = ()  # -D flags the source is compiled with

    @property
    def uses_mma_ptx(self) -> bool:
        """True for the inline-PTX mma.sync kernels, False for the WMMA-API ones."""
        return self.function.startswith("mma")


def _ring(stages: int, bm: int, bn: int, bk: int = 32, pad: int = 0) -> int:
    return stages * (bm * (bk + pad) + bk * (bn + pad)) * 2


def _wmma(name: str, bm: int, bn: int, bk: int, warps: tuple[int, int], stages: int, pipe: int,
          note: str = "") -> KernelSpec:
    wm, wn = warps
    defines = (("CFG_BM", bm), ("CFG_BN", bn), ("CFG_BK", bk), ("CFG_WARPS_M", wm),
               ("CFG_WARPS_N", wn), ("CFG_STAGES", stages), ("CFG_PIPE", pipe))
    return KernelSpec(name, 4, f"cp.async pipeline, {bm}x{bn}x{bk} blocks, {wm * wn} warps of "
                      f"{bm // wm}x{bn // wn}, {stages} stages{note}", "wmma_pipeline.cu",
                      "wmma_pipeline", bm, bn, wm * wn * 32, _ring(stages, bm, bn, bk, pad=8),
                      "linear", True, "nvrtc", defines)


def _mma(name: str, bm: int, bn: int, bk: int, warps: tuple[int, int], stages: int,
         group_m: int = 8, prefetch: int = 0, note: str = "") -> KernelSpec:
    wm, wn = warps
    defines = (("CFG_BM", bm), ("CFG_BN", bn), ("CFG_BK", bk), ("CFG_WARPS_M", wm),
               ("CFG_WARPS_N", wn), ("CFG_STAGES", stages), ("CFG_GROUP_M", group_m),
               ("CFG_PF", prefetch))
    return KernelSpec(name, 5, f"PTX mma.sync + ldmatrix, swizzled smem, {bm}x{bn}x{bk} blocks, "
                      f"{wm * wn} warps, {stages} stages{note}", "mma_sync.cu", "mma_sync", bm, bn,
                      wm * wn * 32, _ring(stages, bm, bn, bk), "linear", True, "nvrtc", defines)


def _wgmma(name: str, bn: int, stages: int, *, cluster_m: int = 1, persistent: int = 0,
           note: str = "") -> KernelSpec:
    bm, bk = 128, 64  # two consumer warpgroups of 64 rows; one 128-byte swizzle row of K
    defines = (("BM", bm), ("BN", bn), ("BK", bk), ("STAGES", stages), ("CLUSTER_M", cluster_m),
               ("GROUP_M", 8), ("PERSISTENT", persistent))
    return KernelSpec(name, 6, f"wgmma + TMA, {bm}x{bn}x{bk} blocks, {stages} stages, producer "
                      f"warpgroup + 2 consumer warpgroups{note}", "wgmma.cu", "wgmma", bm, bn,
                      _wgmma_launch.THREADS, _wgmma_launch.dynamic_smem(bm, bn, bk, stages), "tma",
                      True, "nvcc", defines)


# The tile sizes of every configuration are written here once: steps 4 to 6 are compiled with
# them as -D flags (one module per configuration), so the .cu files hold one kernel each.

#: The ladder: one kernel per step, the best measured configuration of each idea
#: (benchmarks/gemm.py at 8192^3 on the H200; benchmarks/KERNEL_NOTES.md has the history).
LADDER: dict[str, KernelSpec] = {s.name: s for s in (
    KernelSpec("wmma_naive", 1, "naive WMMA: one warp per 16x16 tile, operands from global memory",
               "wmma_naive.cu", "wmma_naive", 32, 32, 128, 0, "warp_tiles", False),
    KernelSpec("wmma_smem", 2, "shared-memory tiles: 128x128 blocks, 8 warps of 64x32",
               "wmma_smem.cu", "wmma_smem", 128, 128, 256, 0, "grid2d", False),
    KernelSpec("wmma_padded", 3, "padded shared memory against bank conflicts, 16-byte loads",
               "wmma_padded.cu", "wmma_padded", 128, 128, 256, 0, "grid2d", True),
    _wmma("wmma_pipeline", 128, 128, 32, (2, 2), 4, 1, ", A fragments prefetched"),
    _mma("mma_sync", 128, 256, 64, (2, 4), 3),
    _wgmma("wgmma", 256, 4),
)}

#: Tuning variants of steps 4 to 6 (other tiles, stages and schedules), timed by the benchmarks
#: and checked by the GPU tests like the ladder; ``gemm`` runs them by name too.
VARIANTS: dict[str, KernelSpec] = {s.name: s for s in (
    _wmma("wmma_pipeline_8w", 128, 128, 32, (2, 4), 3, 0),
    _wmma("wmma_pipeline_k64", 128, 128, 64, (2, 4), 3, 0),
    _wmma("wmma_pipeline_256", 128, 256, 32, (2, 4), 3, 0),
    _wmma("wmma_pipeline_256_k64", 128, 256, 64, (2, 4), 3, 1, ", A fragments prefetched"),
    _wmma("wmma_pipeline_256_k64s4", 128, 256, 64, (2, 4), 4, 1, ", A fragments prefetched"),
    _wmma("wmma_pipeline_256x128", 256, 128, 64, (4, 2), 3, 1, ", A fragments prefetched"),
    _wmma("wmma_pipeline_lb", 128, 128, 32, (2, 2), 4, 2, ", late barrier"),
    _wmma("wmma_pipeline_256_lb", 128, 256, 64, (2, 4), 4, 2, ", late barrier"),
    _wmma("wmma_pipeline_256x128_lb", 256, 128, 64, (4, 2), 4, 2, ", late barrier"),
    _wmma("wmma_pipeline_256_mb", 128, 256, 64, (2, 4), 3, 3, ", mma_sync's schedule"),
    _wmma("wmma_pipeline_256x128_mb", 256, 128, 64, (4, 2), 3, 3, ", mma_sync's schedule"),
    _wmma("wmma_pipeline_256_mbs4", 128, 256, 64, (2, 4), 4, 3, ", mma_sync's schedule"),
    _wmma("wmma_pipeline_256x128_mbs4", 256, 128, 64, (4, 2), 4, 3, ", mma_sync's schedule"),
    _mma("mma_sync_k32", 128, 256, 32, (2, 4), 4),
    _mma("mma_sync_s4", 128, 256, 64, (2, 4), 4),
    _mma("mma_sync_g16", 128, 256, 64, (2, 4), 3, group_m=16, note=", 16 block-rows per L2 group"),
    _mma("mma_sync_pf", 128, 256, 64, (2, 4), 3, prefetch=1, note=", L2::256B prefetch hint"),
    _mma("mma_sync_256x128", 256, 128, 64, (4, 2), 3),
    _mma("mma_sync_128", 128, 128, 32, (2, 2), 4),
    _mma("mma_sync_256x128s4", 256, 128, 64, (4, 2), 4),
    _wgmma("wgmma_persistent", 256, 4, persistent=1, note=", persistent (one block per SM)"),
    _wgmma("wgmma_128", 128, 6),
    _wgmma("wgmma_cluster2", 256, 4, cluster_m=2, note=", clusters of 2 blocks multicasting B"),
)}

#: Every kernel ``gemm`` runs: the ladder, then the variants.
KERNELS: dict[str, KernelSpec] = {**LADDER, **VARIANTS}

_OUT_DTYPES = ("float32", "float16")
_INT_MAX = 2**31 - 1


def gemm_flops(m: int, n: int, k: int) -> int:
    """Returns the floating-point operations of an M x N x K matrix product (2*M*N*K)."""
    return 2 * validate.count("m", m) * validate.count("n", n) * validate.count("k", k)


def _check_operand(cupy: Any, x: Any, name: str) -> None:
    if not isinstance(x, cupy.ndarray):
        raise TypeError(f"{name} must be a cupy.ndarray on the GPU, got {type(x).__module__}."
                        f"{type(x).__name__}; convert with cupy.asarray({name})")
    if x.dtype != cupy.float16:
        raise TypeError(f"{name} has dtype {x.dtype}; the kernels take float16 inputs "
                        f"(convert with {name}.astype(cupy.float16))")
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got shape {x.shape}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} is not C-contiguous (shape {x.shape}, strides {x.strides}); the "
                         f"kernels read row-major memory: pass cupy.ascontiguousarray({name})")
    if max(x.shape) > _INT_MAX:
        raise ValueError(f"{name} has a dimension over 2**31-1: {x.shape}")


def _aligned(x: Any) -> Any:
    # 16-byte loads and direct WMMA loads need aligned base pointers; a fresh allocation is.
    return x if x.data.ptr % 256 == 0 else x.copy()


def _round8(n: int) -> int:
    return -(-n // 8) * 8


def gemm(a: Any, b: Any, kernel: str = "mma_sync", *, out_dtype: str = "float32",
         out: Any = None) -> Any:
    """Returns ``a @ b`` computed by one kernel of the ladder (fp16 inputs, fp32 accumulation).

    Args:
        a: (M, K) float16 cupy array, C-contiguous.
        b: (K, N) float16 cupy array, C-contiguous.
        kernel: a name from ``KERNELS`` (the ``wgmma*`` ones need a Hopper GPU, nvcc and
            cuda-bindings).
        out_dtype: ``"float32"`` or ``"float16"`` (the fp32 sums rounded once at the end).
        out: optional C-contiguous (M, N) array of ``out_dtype`` to write into.

    Raises:
        KernelUnavailable: no CuPy, no GPU or no complete CUDA headers here; for step 6, every
            one of CuPy/GPU, a Hopper GPU, nvcc and cuda-bindings that is missing.
        TypeError, ValueError: wrong types, dtypes, layouts or mismatched shapes.
    """
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    if str(out_dtype) not in _OUT_DTYPES:
        raise ValueError(f"out_dtype must be 'float32' or 'float16', got {out_dtype!r}")
    spec = KERNELS[kernel]
    if spec.builder == "nvcc":
        _wgmma_launch.require()  # names everything missing: CuPy/GPU, Hopper, nvcc, cuda-bindings
    cupy = require_cupy()
    _check_operand(cupy, a, "a")
    _check_operand(cupy, b, "b")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"shapes do not match for a @ b: a is {a.shape}, b is {b.shape} "
                         f"(a's columns {k} != b's rows {k2})")
    dt = cupy.dtype(str(out_dtype))
    if out is None:
        out = cupy.empty((m, n), dtype=dt)
    elif (not isinstance(out, cupy.ndarray) or out.shape != (m, n) or out.dtype != dt
          or not out.flags.c_contiguous):
        raise ValueError(f"out must be a C-contiguous cupy array of shape {(m, n)} and dtype "
                         f"{dt}, got {getattr(out, 'shape', type(out))} "
                         f"{getattr(out, 'dtype', '')}")
    if m == 0 or n == 0:
        return out
    if k == 0:
        out.fill(0)
        return out

    a, b = _aligned(a), _aligned(b)
    kp, np_ = (_round8(k), _round8(n)) if spec.chunked else (k, n)
    if (kp, np_) != (k, n):  # pad K and N up to multiples of 8 with zeros
        ap = cupy.zeros((m, kp), dtype=cupy.float16)
        ap[:, :k] = a
        bp = cupy.zeros((kp, np_), dtype=cupy.float16)
        bp[:k, :n] = b
        a, b = ap, bp
    target = out if (np_ == n and out.data.ptr % 256 == 0) else cupy.empty((m, np_), dtype=dt)

    suffix = "_f32" if dt == cupy.float32 else "_f16"
    if spec.layout == "tma":
        _wgmma_launch.launch(a, b, target, defines=dict(spec.defines), function=spec.function + suffix)
        if target is not out:
            out[...] = target[:, :n]
        return out
    fn = get_function(spec.source, spec.function + suffix, spec.dynamic_smem, dict(spec.defines))
    if spec.layout == "warp_tiles":
        tiles = -(-m // 16) * -(-np_ // 16)
        grid = (-(-tiles // (spec.threads // 32)),)
    elif spec.layout == "grid2d":
        grid = (-(-np_ // spec.bn), -(-m // spec.bm))
    else:
        grid = (-(-np_ // spec.bn) * -(-m // spec.bm),)
    args = (a, b, target, _i32(m), _i32(np_), _i32(kp))
    fn(grid, (spec.threads,), args, shared_mem=spec.dynamic_smem)
    if target is not out:
        out[...] = target[:, :n]
    return out


def _i32(x: int) -> Any:
    import numpy as np
    return np.int32(x)


def print_fp16_bits(x: Any, *, capture: bool = True) -> str:
    """Returns the lines a device-side ``printf("%04x", __half_as_ushort(x))`` prints for ``x``.

    The kernel prints ``fp16[i] = 0x....`` for every element of the 1-D fp16 array ``x`` (a few
    values: device printf is slow and its buffer is small). Device printf goes to the process's
    stdout (file descriptor 1), which a notebook does not show; with ``capture=True`` that file
    descriptor is pointed at a temporary file around the launch and synchronisation, the lines
    are sorted by index and returned. With ``capture=False`` they go wherever stdout goes and
    an empty string is returned.
    """
    cupy = require_cupy()
    x = cupy.ascontiguousarray(cupy.asarray(x))
    if x.dtype != cupy.float16 or x.ndim != 1:
        raise TypeError(f"print_fp16_bits takes a 1-D float16 array, got {x.dtype} {x.shape}")
    if x.size > 4096:
        raise ValueError(f"print_fp16_bits prints every value: give it at most 4096, got {x.size}")
    fn = get_function("debug_bits.cu", "print_fp16_bits")
    launch = lambda: fn((-(-x.size // 128),), (128,), (x, _i32(x.size)))  # noqa: E731
    if not capture or x.size == 0:
        launch()
        cupy.cuda.runtime.deviceSynchronize()
        return ""
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            launch()
            cupy.cuda.runtime.deviceSynchronize()  # the driver flushes device printf here
            libc.fflush(None)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("fp16[")]
    lines.sort(key=lambda ln: int(ln[5:ln.index("]")]))
    return "\n".join(lines)

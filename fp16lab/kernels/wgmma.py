"""Launching step 6 (``wgmma.cu``): what it needs, its TMA tensor maps and its grid.

The kernel reads A and B through tensor maps: 128-byte descriptors that the driver builds on the
host (``cuTensorMapEncodeTiled``, called through NVIDIA's ``cuda-bindings``) from a base pointer,
the matrix's sizes and row pitch, the box one copy moves and the swizzle to write it in. The
kernel takes them by value as ``__grid_constant__`` parameters; CuPy passes them as one-element
numpy arrays of a 128-byte structured dtype, which it copies into the launch's parameters.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from .compiler import KernelUnavailable, require_cupy
from .cubin import HOPPER_ARCH, find_nvcc, load_cubin

THREADS = 384  # a producer warpgroup and two consumer warpgroups
BOX_COLS = 64  # 64 fp16 = 128 bytes, the widest box row the 128-byte swizzle allows
_TENSOR_MAP = np.dtype([("opaque", np.uint64, (16,))])


def missing() -> list[str]:
    """Returns what this machine lacks to run the wgmma kernels (empty when nothing is missing)."""
    problems = []
    try:
        cupy = require_cupy()
    except KernelUnavailable as e:
        problems.append(f"a CUDA GPU through CuPy ({e})")
    else:
        dev = cupy.cuda.Device()
        if dev.compute_capability != "90":
            name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
            cc = dev.compute_capability
            problems.append(f"a Hopper GPU (compute capability 9.0; this is {name}, "
                            f"compute capability {cc[:-1]}.{cc[-1]}): wgmma exists only on {HOPPER_ARCH}")
    if find_nvcc() is None:
        problems.append(f"nvcc, to build the {HOPPER_ARCH} cubin (NVRTC through CuPy is not used "
                        "for it); install the CUDA toolkit and put its bin/ on PATH or set CUDA_PATH")
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        problems.append("NVIDIA's cuda-bindings, for cuTensorMapEncodeTiled "
                        "(`pip install cuda-bindings`, the major version of your CUDA driver)")
    return problems


_READY: set[int] = set()  # devices already found complete: the checks stay off the timed path


def require() -> None:
    """Raises KernelUnavailable naming everything the wgmma kernels lack here; returns if nothing."""
    try:
        import cupy
        if cupy.cuda.Device().id in _READY:
            return
    except Exception:  # no CuPy or no GPU: missing() says which
        pass
    problems = missing()
    if problems:
        raise KernelUnavailable("the wgmma kernels (step 6) cannot run here; missing:\n  - "
                                + "\n  - ".join(problems))
    _READY.add(require_cupy().cuda.Device().id)


def tensor_map(x: Any, box_rows: int, box_cols: int = BOX_COLS) -> np.ndarray:
    """Returns the tensor map of a row-major 2-D fp16 cupy array for boxes of box_rows x box_cols,
    written to shared memory with the 128-byte swizzle, as a one-element array CuPy can pass.

    Rows and columns outside the array read as zeros. The row pitch must be a multiple of 16
    bytes (a multiple of 8 fp16 columns) and the base pointer 16-byte aligned. A map depends on
    nothing but these five numbers, so the last few are kept: encoding one costs tens of
    microseconds of host time, as long as a whole 1024^3 product on the GPU.
    """
    rows, cols = x.shape
    if cols % 8 or x.data.ptr % 16:
        raise ValueError(f"a TMA tensor map needs a 16-byte row pitch and base: got {cols} fp16 "
                         f"columns at address {x.data.ptr:#x}")
    return encode_tensor_map(x.data.ptr, rows, cols, box_rows, box_cols)


@functools.lru_cache(maxsize=64)
def encode_tensor_map(ptr: int, rows: int, cols: int, box_rows: int, box_cols: int) -> np.ndarray:
    """Returns the tensor map of a rows x cols fp16 row-major matrix at device address ``ptr``:
    boxes of box_rows x box_cols, 128-byte swizzle, zeros outside the matrix."""
    from cuda.bindings import driver

    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    err, tmap = driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, ptr,
        [u64(cols), u64(rows)],            # sizes, innermost first
        [u64(cols * 2)],                   # byte pitch of each row
        [u32(box_cols), u32(box_rows)],
        [u32(1), u32(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)  # NONE: zeros
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with {err!r} for a {rows} x {cols} "
                           f"fp16 array, box {box_rows} x {box_cols}")
    out = np.frombuffer(ctypes.string_at(tmap.getPtr(), _TENSOR_MAP.itemsize), dtype=_TENSOR_MAP).copy()
    out.flags.writeable = False  # shared by every call with the same five numbers
    return out


def dynamic_smem(bm: int, bn: int, bk: int, stages: int) -> int:
    """Returns the dynamic shared memory of one block: the stages, plus 1 KB to align them to 1024."""
    return stages * (bm * bk + bk * bn) * 2 + 1024


def grid(m: int, n: int, bm: int, bn: int, cluster_m: int = 1, persistent_blocks: int = 0) -> int:
    """Returns the number of blocks: one per tile (block-rows rounded up to whole clusters, times
    block-columns), or, for the persistent schedule, at most ``persistent_blocks`` (one per SM)."""
    tiles = -(-m // (bm * cluster_m)) * cluster_m * -(-n // bn)
    return min(tiles, persistent_blocks) if persistent_blocks else tiles


@functools.lru_cache(maxsize=None)
def _sm_count(device_id: int) -> int:
    return require_cupy().cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"]


@functools.lru_cache(maxsize=None)
def _function(defines: tuple[tuple[str, int], ...], function: str, device_id: int, smem: int) -> Any:
    fn = load_cubin("wgmma.cu", dict(defines)).get_function(function)
    fn.max_dynamic_shared_size_bytes = smem  # above 48 KB only once raised
    return fn


def launch(a: Any, b: Any, c: Any, *, defines: dict[str, int], function: str) -> None:
    """Runs the kernel ``function`` of ``wgmma.cu`` built with ``defines`` on C = A @ B.

    ``a`` (M x K) and ``b`` (K x N) are fp16 with K and N multiples of 8, ``c`` (M x N) the output.
    """
    bm, bn, bk, stages = defines["BM"], defines["BN"], defines["BK"], defines["STAGES"]
    smem = dynamic_smem(bm, bn, bk, stages)
    device = require_cupy().cuda.Device().id
    fn = _function(tuple(sorted(defines.items())), function, device, smem)
    (m, k), n = a.shape, b.shape[1]
    map_a = tensor_map(a, box_rows=bm)
    map_b = tensor_map(b, box_rows=bk)
    blocks = grid(m, n, bm, bn, defines.get("CLUSTER_M", 1),
                  _sm_count(device) if defines.get("PERSISTENT") else 0)
    fn((blocks,), (THREADS,), (map_a, map_b, c, np.int32(m), np.int32(n), np.int32(k)),
       shared_mem=smem)

"""Launching steps 6 and 7 (``wgmma.cu``, ``wgmma_fp8.cu``): what they need, their TMA tensor
maps and their grids.

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

from .. import validate
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
        raise KernelUnavailable("the wgmma kernels (steps 6 and 7) cannot run here; missing:\n  - "
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
def encode_tensor_map(ptr: int, rows: int, cols: int, box_rows: int, box_cols: int,
                      element_bytes: int = 2) -> np.ndarray:
    """Returns the tensor map of a rows x cols row-major matrix at device address ``ptr`` of
    fp16 (``element_bytes`` 2) or one-byte codes (1: FP8, read as bytes): boxes of box_rows x
    box_cols, 128-byte swizzle, zeros outside the matrix."""
    from cuda.bindings import driver

    kind = {2: driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            1: driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8}[element_bytes]
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    err, tmap = driver.cuTensorMapEncodeTiled(
        kind, 2, ptr,
        [u64(cols), u64(rows)],            # sizes, innermost first
        [u64(cols * element_bytes)],       # byte pitch of each row
        [u32(box_cols), u32(box_rows)],
        [u32(1), u32(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)  # NONE: zeros
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with {err!r} for a {rows} x {cols} "
                           f"array of {element_bytes}-byte elements, box {box_rows} x {box_cols}")
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


#: Step 7 (``wgmma_fp8.cu``): its tile (rows, columns, K per stage; fixed in the kernel) and stages.
FP8_TILE = (128, 128, 128)
FP8_STAGES = 6
#: K of one block scale: the rows of A's 1 x 128 tiles, and B's 128 x 128 tiles.
FP8_BLOCK = 128
#: Step 7's schedules (``wgmma_fp8.cu``'s -D switches): how blocks are given their tiles. The
#: first is the ladder's step 7; the others are its measured variants (fp16lab.bench.fp8).
FP8_SCHEDULES: dict[str, dict[str, int]] = {
    "tile per block": {},
    "persistent": {"PERSISTENT": 1},
    "cluster of 2, B multicast": {"CLUSTER_M": 2},
    "cluster of 2, B multicast, cluster-scope release": {"CLUSTER_M": 2, "ARRIVE_CLUSTER": 1},
}
#: Step 7's diagnostic builds: wrong products by design, timed to say what a part costs.
FP8_DIAGNOSTICS: dict[str, dict[str, int]] = {
    "no promotion": {"PROMOTE": 0},            # all of K summed in the tensor cores, no factors
    "promotion, factors not loaded": {"PROMOTE": 2},  # the promotion with factors of 1
}


def fp8_dynamic_smem(stages: int = FP8_STAGES) -> int:
    """Returns step 7's dynamic shared memory: the stages (a 128 x 128 byte tile each of A and
    B), plus 1 KB to align them to 1024."""
    stages = validate.count("stages", stages)
    bm, bn, bk = FP8_TILE
    return stages * (bm * bk + bn * bk) + 1024


def fp8_grid(m: int, n: int, schedule: str = "tile per block", sms: int | None = None) -> int:
    """Returns step 7's number of blocks under ``schedule``: one per 128 x 128 tile of C (block-rows
    rounded up to whole clusters), or for the persistent schedule at most ``sms``, the GPU's
    number of SMs (one block each), which that schedule needs."""
    m, n = validate.count("m", m), validate.count("n", n)
    defines = FP8_SCHEDULES[validate.choice("schedule", schedule, FP8_SCHEDULES)]
    if sms is not None:
        sms = validate.count("sms", sms)
    if defines.get("PERSISTENT") and sms is None:
        raise ValueError("the persistent schedule launches one block per SM: give sms, the GPU's "
                         "number of SMs")
    bm, bn, _ = FP8_TILE
    return grid(m, n, bm, bn, defines.get("CLUSTER_M", 1), sms if defines.get("PERSISTENT") else 0)


def check_fp8_operands(m: int, n: int, k: int, sa_shape: tuple[int, ...],
                       sb_shape: tuple[int, ...]) -> None:
    """Raises ValueError where step 7 cannot multiply these shapes: K must be a multiple of 16
    (a TMA row pitch of 16 bytes) and N of 8 (paired stores); sa must be (ceil(K/128), M) and sb
    (ceil(N/128), ceil(K/128))."""
    m, n, k = (validate.count(name, v) for name, v in (("M", m), ("N", n), ("K", k)))
    kb, nb = -(-k // FP8_BLOCK), -(-n // FP8_BLOCK)
    problems = []
    if k % 16:
        problems.append(f"K={k} is not a multiple of 16 (TMA reads rows of 16-byte multiples)")
    if n % 8:
        problems.append(f"N={n} is not a multiple of 8 (the results are stored in pairs)")
    if tuple(sa_shape) != (kb, m):
        problems.append(f"sa must be (ceil(K/128), M) = {(kb, m)}, got {tuple(sa_shape)}")
    if tuple(sb_shape) != (nb, kb):
        problems.append(f"sb must be (ceil(N/128), ceil(K/128)) = {(nb, kb)}, "
                        f"got {tuple(sb_shape)}")
    if problems:
        raise ValueError("step 7 cannot multiply these operands: " + "; ".join(problems))


def launch_fp8(a: Any, b: Any, sa: Any, sb: Any, c: Any, *, stages: int = FP8_STAGES,
               overlap: bool = True, schedule: str = "tile per block",
               diagnostic: str | None = None) -> None:
    """Runs step 7 (``wgmma_fp8.cu``): ``c = (a * sa) @ (b * sb).T`` with block factors.

    Args:
        a: (M, K) e4m3 codes as a C-contiguous uint8 cupy array (K contiguous).
        b: (N, K) e4m3 codes, uint8, K contiguous (the right operand transposed).
        sa: (ceil(K/128), M) float32: the factor of each row of A in each K block of 128.
        sb: (ceil(N/128), ceil(K/128)) float32: the factor of each 128 x 128 tile of B.
        c: (M, N) float32, or int16 / uint16 holding bfloat16 bits (CuPy has no bfloat16).
        overlap: multiply the next K block while this one is promoted (the kernel's OVERLAP).
        schedule: a key of :data:`FP8_SCHEDULES`.
        diagnostic: None, or a key of :data:`FP8_DIAGNOSTICS`: a build that computes a wrong
            product by design, for timing what a part of the kernel costs.
    """
    (m, k), n = a.shape, b.shape[0]
    if b.shape[1] != k or c.shape != (m, n):
        raise ValueError(f"step 7 multiplies (M, K) by (N, K) into (M, N): got a {a.shape}, "
                         f"b {b.shape}, c {c.shape}")
    check_fp8_operands(m, n, k, sa.shape, sb.shape)
    kinds = {"float32": "wgmma_fp8_f32", "int16": "wgmma_fp8_bf16", "uint16": "wgmma_fp8_bf16"}
    if (c.dtype.name not in kinds or a.dtype.itemsize != 1 or b.dtype.itemsize != 1
            or sa.dtype.name != "float32" or sb.dtype.name != "float32"):
        raise ValueError(f"step 7 takes one-byte codes and float32 factors, and writes float32 or "
                         f"bfloat16 bits (int16/uint16); got a {a.dtype}, b {b.dtype}, sa "
                         f"{sa.dtype}, sb {sb.dtype}, c {c.dtype}")
    for name, x in (("a", a), ("b", b), ("sa", sa), ("sb", sb), ("c", c)):
        if not x.flags.c_contiguous:
            raise ValueError(f"step 7 needs C-contiguous arrays; {name} is not")
    for name, x in (("a", a), ("b", b)):
        if x.data.ptr % 16:
            raise ValueError(f"step 7 reads {name} through TMA, which needs a 16-byte aligned "
                             f"base; {name} starts at {x.data.ptr:#x}")
    overlap = validate.boolean("overlap", overlap)
    defines = FP8_SCHEDULES[validate.choice("schedule", schedule, FP8_SCHEDULES)]
    if diagnostic is not None:
        defines = {**defines, **FP8_DIAGNOSTICS[validate.choice("diagnostic", diagnostic,
                                                                 FP8_DIAGNOSTICS)]}
    require()
    smem = fp8_dynamic_smem(stages)
    device = require_cupy().cuda.Device().id
    defines = {"STAGES": stages, "OVERLAP": int(overlap), **defines}
    fn = _function_fp8(tuple(sorted(defines.items())), kinds[c.dtype.name], device, smem)
    bm, bn, bk = FP8_TILE
    map_a = encode_tensor_map(a.data.ptr, m, k, bm, bk, element_bytes=1)
    # in a cluster each block fetches its share of B's tile rows and multicasts them
    map_b = encode_tensor_map(b.data.ptr, n, k, bn // defines.get("CLUSTER_M", 1), bk,
                              element_bytes=1)
    blocks = fp8_grid(m, n, schedule, _sm_count(device) if defines.get("PERSISTENT") else None)
    fn((blocks,), (THREADS,), (map_a, map_b, sa, sb, c, np.int32(m), np.int32(n), np.int32(k)),
       shared_mem=smem)


@functools.lru_cache(maxsize=None)
def _function_fp8(defines: tuple[tuple[str, int], ...], function: str, device_id: int,
                  smem: int) -> Any:
    fn = load_cubin("wgmma_fp8.cu", dict(defines)).get_function(function)
    fn.max_dynamic_shared_size_bytes = smem
    return fn

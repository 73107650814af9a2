"""Exponent histograms of many gradients in one go: the bins, and the bincount, histc and CuPy backends."""

from __future__ import annotations

from typing import Any

import torch

from ..kernels.compiler import get_function
from ..kernels.launch import cupy_or_none, current_stream_ptr, enqueue  # they load CuPy only when called

#: Bins of the monitor's histogram, read straight from the float32 bit pattern of |g|:
#: 0 zero, 1 float32 subnormal (|g| < 2**-126), then one bin per binary exponent
#: floor(log2|g|) = -126 .. 127, then inf, then NaN.
EXP_MIN, EXP_MAX = -126, 127
_ZERO_BIN = 0
_F32_SUBNORMAL_BIN = 1
_INF_BIN = EXP_MAX - EXP_MIN + 3
_NAN_BIN = _INF_BIN + 1
N_BINS = _NAN_BIN + 1
#: Parameters per torch.histc call on the CUDA path: 23 * N_BINS counts fit in 48 KiB of shared
#: memory even as float64, and CUDA histc sizes its grid from (elements / bins), so calls over
#: fewer, similar-sized parameters run on more blocks.
_HISTC_PARAMS_PER_CALL = 23
#: Upper edges (exclusive) of bins 0 .. N_BINS-2 on the bit pattern of |g| read as an int32:
#: 0 -> zero, [1, 2**23) -> float32 subnormal, [E * 2**23, (E+1) * 2**23) -> exponent E - 127,
#: 0x7F800000 -> inf, above -> NaN.
_BIN_UPPER_EDGES = [1] + [e << 23 for e in range(1, 256)] + [0x7F800001]


def _bin_of_exponent(e: int) -> int:
    return e - EXP_MIN + 2


def _flat_view(g: torch.Tensor) -> torch.Tensor:
    """Returns g's elements as a 1-D tensor, in memory order (without a copy for contiguous and
    channels_last tensors: a histogram does not care about element order)."""
    if g.dim() == 4 and not g.is_contiguous() and g.is_contiguous(
            memory_format=torch.channels_last):
        return g.permute(0, 2, 3, 1).reshape(-1)
    return g.reshape(-1)


def _widened_cat(flats: list[torch.Tensor]) -> torch.Tensor:
    """Returns the 1-D tensors concatenated as a new float32 tensor (float16 / bfloat16 widen
    exactly), which the caller may overwrite."""
    flat = torch.cat(flats)
    return flat if flat.dtype == torch.float32 else flat.float()


def _bin_codes(flat: torch.Tensor, method: str = "ops",
               boundaries: torch.Tensor | None = None) -> torch.Tensor:
    """Returns the monitor's histogram bin (int32) of every element of a float32 tensor, which
    it overwrites with |bits|.

    ``"ops"``: bin = E + 1 - [g == 0] + [g is NaN] from the biased exponent field E, a few
    integer passes (fastest on the CPU); ``"search"``: one ``torch.bucketize`` of the bits over
    ``boundaries`` (``_BIN_UPPER_EDGES`` as int32 on flat's device), fewer bytes moved on a GPU.
    """
    if flat.dtype != torch.float32 or flat.dim() != 1:
        raise ValueError(f"flat must be a 1-D float32 tensor, got {flat.dtype} {list(flat.shape)}")
    bits = flat.view(torch.int32).bitwise_and_(0x7FFFFFFF)  # |g|, also for -NaN
    if method == "ops":
        return (bits >> 23).add_(1).add_((bits > 0x7F800000).int()).sub_((bits == 0).int())
    if method == "search":
        if boundaries is None:
            boundaries = torch.tensor(_BIN_UPPER_EDGES, dtype=torch.int32, device=flat.device)
        return torch.bucketize(bits, boundaries, right=True, out_int32=True)
    raise ValueError(f"method must be 'ops' or 'search', got {method!r}")


def _segment_plan(sizes: list[int], device: torch.device, backend: str) -> dict[str, Any]:
    """Returns the per-element key offsets (and for ``"histc"`` the parameter order, histc calls
    and bin boundaries) for gradients of these sizes; built once per model and device.

    ``"bincount"``: int32 offsets (parameter index) * N_BINS, in parameter order.
    ``"histc"``: parameters sorted by size, largest first, in calls of
    ``_HISTC_PARAMS_PER_CALL``; float offsets (position * N_BINS + 0.5: the half keeps histc's
    float binning arithmetic away from the bin edges), float64 where one parameter has more than
    2**24 elements (histc counts in the keys' dtype); ``inverse`` maps the rows back.
    """
    n = len(sizes)
    if backend == "bincount":
        base = torch.repeat_interleave(
            torch.arange(n, device=device, dtype=torch.int32) * N_BINS,
            torch.tensor(sizes, device=device))
        return {"base": base}
    order = sorted(range(n), key=lambda i: -sizes[i])
    inverse = [0] * n
    for pos, i in enumerate(order):
        inverse[i] = pos
    sorted_sizes = [sizes[i] for i in order]
    dtype = torch.float64 if max(sizes) > 2**24 else torch.float32
    base = torch.repeat_interleave(
        torch.arange(n, device=device, dtype=dtype) * N_BINS + 0.5,
        torch.tensor(sorted_sizes, device=device))
    offsets = [0]
    for k in sorted_sizes:
        offsets.append(offsets[-1] + k)
    chunks = []
    for lo in range(0, n, _HISTC_PARAMS_PER_CALL):
        hi = min(lo + _HISTC_PARAMS_PER_CALL, n)
        chunks.append((lo, hi, offsets[lo], offsets[hi]))
    return {"base": base, "order": order, "chunks": chunks,
            "inverse": torch.tensor(inverse, device=device, dtype=torch.long),
            "boundaries": torch.tensor(_BIN_UPPER_EDGES, dtype=torch.int32, device=device)}


#: The CUDA path (with CuPy): one kernel counts every gradient's histogram and max|g| in one
#: pass over the gradients where they are. Each block takes one chunk of one gradient, bins its
#: elements into a shared-memory histogram (one atomic per distinct bin per warp:
#: ``__match_any_sync`` groups the lanes), and adds the non-zero bins to the gradient's row of
#: the output with one global atomic each; max|g| is the largest |g| bit pattern (NaN above inf,
#: as torch's norm(inf) has it), one atomicMax per block.
_BACKENDS = ("auto", "bincount", "histc", "cupy")
_STATS_CHUNK = 16384  # elements per block
_STATS_THREADS = 256
_STATS_KINDS = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
#: The monitor kernel's source, in fp16lab/kernels/ with the package's other CUDA code.
_STATS_FILE = "grad_stats.cu"


def auto_backend(device_type: str) -> str:
    """Returns the statistics backend ``"auto"`` picks for gradients on this kind of device:
    ``"bincount"`` off CUDA, ``"cupy"`` on CUDA where CuPy is installed, else ``"histc"``."""
    if device_type != "cuda":
        return "bincount"
    return "cupy" if cupy_or_none() is not None else "histc"


def _stats_function(device_index: int):
    """Returns the compiled ``grad_stats`` kernel for a device (compiled once per device)."""
    with cupy_or_none().cuda.Device(device_index):
        return get_function(_STATS_FILE, "grad_stats", cuda_headers=False,
                            defines={"N_BINS": N_BINS, "THREADS": _STATS_THREADS})


def _stats_plan(sizes: list[int], kinds: list[int], device: torch.device) -> dict[str, Any]:
    """Returns the chunk table of the ``grad_stats`` kernel for gradients of these sizes: one
    block per chunk of at most ``_STATS_CHUNK`` elements of one gradient."""
    grad, start, end = [], [], []
    for i, n in enumerate(sizes):
        for s0 in range(0, n, _STATS_CHUNK):
            grad.append(i)
            start.append(s0)
            end.append(min(n, s0 + _STATS_CHUNK))
    return {"kinds": torch.tensor(kinds, dtype=torch.int32, device=device),
            "chunk_grad": torch.tensor(grad, dtype=torch.int32, device=device),
            "chunk_start": torch.tensor(start, dtype=torch.int64, device=device),
            "chunk_end": torch.tensor(end, dtype=torch.int64, device=device),
            "blocks": len(grad), "ptrs": None, "ptrs_dev": None}


def _cupy_statistics(grads: list[torch.Tensor], plan: dict[str, Any]):
    """Returns (int64 histogram [n, N_BINS], float32 max|g| [n]) from one ``grad_stats`` launch
    on torch's current stream (no host sync)."""
    import numpy as np

    device = grads[0].device
    index = device.index if device.index is not None else torch.cuda.current_device()
    flats = [_flat_view(g) for g in grads]  # views (a copy only for odd layouts)
    ptrs = tuple(f.data_ptr() for f in flats)
    if ptrs != plan["ptrs"]:  # the gradients moved: upload their addresses (asynchronously)
        host = torch.tensor(ptrs, dtype=torch.int64).pin_memory()
        plan["ptrs_dev"] = host.to(device, non_blocking=True)
        plan["ptrs"] = ptrs
    n = len(grads)
    # one zeroed buffer holds the histograms and, after them, the max|g| bit patterns
    out = torch.zeros(n * N_BINS + (n + 1) // 2, dtype=torch.int64, device=device)
    hist = out[:n * N_BINS].view(n, N_BINS)
    maxbits = out[n * N_BINS:].view(torch.int32)[:n]
    args = tuple(np.uint64(t.data_ptr()) for t in (
        plan["ptrs_dev"], plan["kinds"], plan["chunk_grad"], plan["chunk_start"],
        plan["chunk_end"], hist, maxbits))
    # (a copy made by _flat_view may be freed on return: torch's allocator reuses memory in
    # stream order, after the kernel that reads it)
    enqueue(_stats_function(index), plan["blocks"], _STATS_THREADS, args,
            current_stream_ptr(index), index)
    return hist, maxbits.view(torch.float32)


def exponent_of_bin(b: int) -> int:
    """Returns floor(log2|g|) for a GradientMonitor histogram bin (2 .. N_BINS-3)."""
    if not 2 <= b <= _INF_BIN - 1:
        raise ValueError(f"bin {b} is not an exponent bin; those are 2..{_INF_BIN - 1} "
                         f"(0 zero, 1 float32 subnormals, {_INF_BIN} inf, {_NAN_BIN} NaN)")
    return b + EXP_MIN - 2

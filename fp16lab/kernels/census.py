"""Launching the one-pass census kernel (census.cu) on a CUDA tensor, on torch's current stream.

:func:`fp16lab.census.census` calls :func:`cupy_census` for CUDA tensors; benchmarks time the
bare launch with :func:`cupy_kernel_launcher`.
"""

from __future__ import annotations

import platform
from functools import lru_cache
from typing import Any

import numpy as np

from ..bits.patterns import HIST_MAX, HIST_MIN, thresholds
from ..bits.patterns import pattern_below as _pattern_below  # public name; body keeps the old one
from ..formats import FormatInfo, format_info
from .compiler import get_function
from .launch import ParamBlock, cupy_or_none, current_stream_ptr, enqueue


# ---------------------------------------------------------------------------------- CUDA kernel
# One pass over the data, on the data's own bit patterns (no conversion): each thread counts
# ``|x| <= T1, T2, T3`` and NaNs in registers and the exponent field of each element in its own
# 16-bit counters in shared memory (no atomics, no bank conflicts); the rare subnormals of the
# data's own type go to a small shared histogram of their leading one. Each block adds its sums
# to a scratch buffer in global memory with one atomic per non-zero counter; the last block to
# finish (a ticket counter) turns the scratch into the result layout and zeroes the scratch, so
# a census is a single launch with no memset. Loads are 16 bytes (4 floats or 8 halves), several
# in flight per thread, the next trip's issued before this trip's are counted; a scalar prologue
# and epilogue cover unaligned starts and ragged ends.
_ACC_SIZE = 8 + 256 + 32 + 1  # classes, exponent fields, subnormal leading ones, ticket
_PER_THREAD_CAP = 60_000  # elements per thread at most: its 16-bit field counters never wrap
#: The kernels' source, in fp16lab/kernels/ with the package's other CUDA code.
KERNEL_FILE = "census.cu"

#: Kernel name, threads per block and (numpy pattern type, float type name) per torch dtype name.
_KERNELS = {"float32": ("census_f32", 64, np.uint32, "float32"),
            "bfloat16": ("census_bf16", 64, np.uint16, "bfloat16"),
            "float16": ("census_f16", 256, np.uint16, "float16")}


def kernel_defines() -> dict[str, int]:
    """Returns the preprocessor values census.cu is compiled with: the histogram's range."""
    return {"HIST_MIN": HIST_MIN, "NBINS": HIST_MAX - HIST_MIN + 1}


@lru_cache(maxsize=None)
def _kernel_limits(fmt_name: str, dtype_name: str) -> tuple[Any, Any, Any]:
    """Returns the three class thresholds as bit patterns of the data's own type (np.uint32)."""
    f = format_info(fmt_name)
    if dtype_name == "bfloat16":
        import ml_dtypes

        dt, udt = ml_dtypes.bfloat16, np.uint16
    else:
        dt, udt = np.dtype(dtype_name).type, _KERNELS[dtype_name][2]
    th = thresholds(f)
    return tuple(np.uint32(_pattern_below(th[k], dt, udt, strict=s))
                 for k, s in (("under", False), ("normal", True),
                              ("over", th["over_inclusive"])))


class _DeviceState:
    """What one GPU's census launches reuse: kernels, grid sizes, buffers, a lock, and the
    parameter block of the launch (refilled in place: the lock covers launch to read-back)."""

    def __init__(self, device):
        import ctypes
        import threading

        import torch

        cupy = cupy_or_none()

        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self.lock = threading.Lock()
        nbins = HIST_MAX - HIST_MIN + 1
        self.out_len = 5 + nbins + 1  # the counts, the bins, the done flag
        self.seq = 0  # the flag value of the last launch
        # poll the flag in mapped memory rather than wait in cudaStreamSynchronize, where the
        # host orders its loads (x86); elsewhere, or when the flag is late, synchronize
        self.poll = platform.machine().lower() in ("x86_64", "amd64", "i686")
        # scratch (zero at rest: the kernels leave it so) and a device result, in one allocation
        self.buf = torch.zeros(_ACC_SIZE + self.out_len, dtype=torch.int64,
                               device=torch.device("cuda", self.index))
        self.acc = self.buf[:_ACC_SIZE]
        self.out = self.buf[_ACC_SIZE:]
        self.acc_ptr = self.acc.data_ptr()
        self.out_ptr = self.out.data_ptr()
        # census() has the last block write its result straight into mapped, pinned host memory:
        # no copy to launch, and the one wait is for the kernel itself
        self.host = self.host_dev_ptr = None
        rt = cupy.cuda.runtime
        with cupy.cuda.Device(self.index):
            self.host_error = None
            try:
                ptr = rt.hostAlloc(self.out_len * 8, 2)  # 2: cudaHostAllocMapped
                get_dev_ptr = getattr(rt, "hostGetDevicePointer", None)
                if get_dev_ptr is not None:
                    self.host_dev_ptr = get_dev_ptr(ptr, 0)
                elif rt.deviceGetAttribute(41, self.index):  # 41: cudaDevAttrUnifiedAddressing
                    self.host_dev_ptr = ptr  # mapped host memory has one address under UVA
                else:
                    raise RuntimeError("no unified addressing and no hostGetDevicePointer")
                # held for the life of the process, like the device's kernels
                self.host = np.ctypeslib.as_array(
                    (ctypes.c_int64 * self.out_len).from_address(ptr))
            except Exception as e:  # no mapped memory here: census() copies the result back
                self.host, self.host_error = None, f"{type(e).__name__}: {e}"
        if self.host is None:
            self.host_pinned = torch.empty(self.out_len, dtype=torch.int64, pin_memory=True)
        self.params = ParamBlock(8)  # the launch's parameters, refilled under the lock
        sms = torch.cuda.get_device_properties(self.index).multi_processor_count
        self.kernels: dict[str, tuple[Any, int, int]] = {}
        with cupy.cuda.Device(self.index):
            for dtype_name, (name, threads, _, _) in _KERNELS.items():
                raw = get_function(KERNEL_FILE, name, defines=kernel_defines(), cuda_headers=False)
                fn = getattr(raw, "kernel", raw)  # CuPy's RawKernel wraps a Function
                try:  # one full wave of resident blocks
                    per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                        fn.ptr, threads, 0)
                except Exception:
                    per_sm = 0
                if per_sm <= 0:  # fall back to what the shared memory allows on any sm_80+
                    per_sm = 2048 // threads if threads == 256 else 5
                self.kernels[dtype_name] = (fn, threads, sms * per_sm)
        torch.cuda.synchronize(self.index)  # the zeroed scratch is there before any stream uses it


_STATES: dict[int, _DeviceState] = {}


def _state(device) -> _DeviceState:
    key = device.index if device.index is not None else -1
    st = _STATES.get(key)
    if st is None:
        st = _STATES[key] = _DeviceState(device)
    return st


def _kernel_dtype(x) -> str | None:
    """Returns the dtype name of ``x`` ("float32", ...) where the census kernel can count it (a
    non-empty CUDA tensor of a dtype it knows, CuPy installed), else None."""
    if not x.is_cuda or x.numel() == 0 or cupy_or_none() is None:
        return None
    dtype_name = str(x.dtype)[6:]  # "torch.float16" -> "float16"
    return dtype_name if dtype_name in _KERNELS else None


def _enqueue(x, dtype_name: str, f: FormatInfo, to_host: bool):
    """Enqueues the census of ``x`` (whose :func:`_kernel_dtype` is ``dtype_name``) on torch's
    current stream and returns ``(state, stream_ptr)``, or None where the kernel cannot run (a
    misaligned start). The result lands in
    ``state.host`` (mapped host memory) when ``to_host`` and the state has it, else in
    ``state.out`` on the device. The caller holds ``state.lock`` until it has read the result.
    (A contiguous copy of ``x`` made here may be freed on return: torch's allocator reuses its
    memory in stream order, after the kernel.)"""
    if x.dim() != 1 or not x.is_contiguous():
        x = x.detach().reshape(-1).contiguous()  # a copy only if x was not contiguous
    ptr = x.data_ptr()
    if ptr % x.element_size():
        return None
    st = _state(x.device)
    fn, threads, wave = st.kernels[dtype_name]
    n = x.numel()
    per_trip = 32 if dtype_name == "bfloat16" else 16  # elements of one thread's loop trip
    # one full wave (fewer blocks for small tensors), more only where a thread would otherwise
    # count more than _PER_THREAD_CAP elements
    blocks = max(1, min(wave, -(-n // (threads * per_trip))),
                 -(-n // (threads * _PER_THREAD_CAP)))
    t1, t2, t3 = _kernel_limits(f.name, dtype_name)
    out_ptr = st.host_dev_ptr if (to_host and st.host is not None) else st.out_ptr
    st.seq += 1
    stream_ptr = current_stream_ptr(st.index)
    args = (np.uint64(ptr), np.int64(n), t1, t2, t3, np.uint64(st.acc_ptr), np.uint64(out_ptr),
            np.uint64(st.seq))
    enqueue(fn, blocks, threads, args, stream_ptr, st.index, st.params)
    return st, stream_ptr


def cupy_kernel_launcher(x, fmt: str | FormatInfo = "fp16"):
    """Returns ``(launch, out)``: a function that enqueues the one-pass census kernel on torch's
    current stream, and the int64 CUDA tensor it writes (zeros, the cumulative counts
    ``|x| <= T1, T2, T3``, NaNs, then the histogram); or None where the kernel cannot run (no
    CuPy, a dtype other than float32 / float16 / bfloat16, an empty tensor).

    ``launch()`` counts ``x`` into ``out`` in one kernel launch without synchronising and returns
    ``out``; benchmarks time it alone. ``out`` is this device's result buffer: the next launch
    overwrites it, and launches on different streams must not overlap.
    """
    import torch

    f = format_info(fmt)
    dtype_name = _kernel_dtype(x) if isinstance(x, torch.Tensor) else None
    if dtype_name is None:
        return None
    x = x.detach().reshape(-1).contiguous()
    st = _state(x.device)

    out = st.out[:-1]  # the result without the done flag

    def launch():
        _enqueue(x, dtype_name, f, to_host=False)
        return out

    launch.tensor = x
    return launch, out


def cupy_census(x, f: FormatInfo):
    """Returns (counts, hist) computed by the one-pass kernel, or None where it cannot run."""
    dtype_name = _kernel_dtype(x)
    if dtype_name is None:
        return None
    st = _state(x.device)
    with st.lock:  # the scratch, the result and the parameter block are the device's
        got = _enqueue(x, dtype_name, f, to_host=True)
        if got is None:
            return None
        _, stream_ptr = got
        rt = cupy_or_none().cuda.runtime
        if st.host is not None:  # the kernel writes the host memory: wait for it, read it
            _wait_for_flag(st, stream_ptr, x.numel() * x.element_size())
            res = st.host.copy()
        else:  # one copy to pinned host memory (a true async copy), then the one wait
            rt.memcpyAsync(st.host_pinned.data_ptr(), st.out_ptr, st.out_len * 8, 2, stream_ptr)
            rt.streamSynchronize(stream_ptr)
            res = st.host_pinned.numpy().copy()
    counts = np.array([res[0], res[1], res[2], res[3], x.numel(), res[4]], dtype=np.int64)
    return counts, res[5:-1]


def _wait_for_flag(st: _DeviceState, stream_ptr: int, nbytes: int) -> None:
    """Waits until the census just launched has written its result to mapped host memory: polls
    its done flag for about as long as reading ``nbytes`` at 1 TB/s takes (plus 200 us), then
    falls back to cudaStreamSynchronize, after which the flag must be there."""
    import time

    flag = st.host[-1:]  # a view: every read goes to the memory the GPU writes
    if st.poll:
        seq = st.seq
        deadline = time.perf_counter() + 2e-4 + nbytes / 1e12
        spins = 0
        while flag[0] != seq:
            spins += 1
            if not spins & 63 and time.perf_counter() > deadline:
                break
        else:
            return
    cupy_or_none().cuda.runtime.streamSynchronize(stream_ptr)
    if flag[0] != st.seq:
        raise RuntimeError(f"the census kernel finished without writing its result (flag "
                           f"{int(flag[0])}, expected {st.seq})")

"""Launching compiled kernels on torch's CUDA stream: finding CuPy, wrapping the stream, one cuLaunchKernel.

The census and the gradient monitor run on torch tensors, on torch's current stream, so they
order with the torch work around them without any synchronisation. Their ``.cu`` files are
compiled by :mod:`fp16lab.kernels.compiler`.
"""

from __future__ import annotations

from typing import Any

from .. import validate

_CUPY: list = []  # [cupy module or None], filled on first use
_STREAMS: dict[tuple[int, int], Any] = {}


def cupy_or_none():
    """Returns the cupy module, or None where it is not installed (looked up once)."""
    if not _CUPY:
        try:
            import cupy
        except ImportError:
            cupy = None
        _CUPY.append(cupy)
    return _CUPY[0]


def current_stream_ptr(device_index: int) -> int:
    """Returns the raw ``cudaStream_t`` of torch's current stream on a device."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:  # one C call, no Stream object
        return raw(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


class _StreamHandle:
    """A raw CUDA stream in the CUDA stream protocol (``__cuda_stream__``), for CuPy >= 14."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def external_stream(ptr: int, device_index: int):
    """Returns a CuPy stream object for the CUDA stream ``ptr`` (torch's), cached."""
    s = _STREAMS.get((device_index, ptr))
    if s is None:
        import cupy

        from_external = getattr(cupy.cuda.Stream, "from_external", None)
        if from_external is not None:  # CuPy >= 14 (ExternalStream is deprecated there)
            s = from_external(_StreamHandle(ptr))
        else:
            s = cupy.cuda.ExternalStream(ptr, device_index)
        _STREAMS[(device_index, ptr)] = s
    return s


_DIRECT: list[bool] = [True]  # cleared when the driver call is missing or refuses


def direct_launches() -> bool:
    """Returns whether launches still go through one cuLaunchKernel call (not CuPy's own)."""
    cupy = cupy_or_none()
    return _DIRECT[0] and cupy is not None and hasattr(cupy.cuda.driver, "launchKernel")


class ParamBlock:
    """A kernel's parameters for cuLaunchKernel: one 8-byte slot each (a value narrower than 8
    bytes sits in the low bytes, as little-endian x86 / ARM hosts store it) and the array of
    the slots' addresses. cuLaunchKernel copies the parameters, so a caller that launches from
    one thread at a time may keep one block and refill it for every launch."""

    def __init__(self, n: int):
        import numpy as np

        n = validate.count("n", n)
        self.values = np.zeros(n, dtype=np.uint64)
        self.addresses = (np.arange(n, dtype=np.uint64) * np.uint64(8)
                          + np.uint64(self.values.__array_interface__["data"][0]))
        self.ptr = self.addresses.__array_interface__["data"][0]

    def fill(self, args: tuple) -> int:
        v = self.values
        for i, a in enumerate(args):
            v[i] = a
        return self.ptr


def enqueue(kernel, blocks: int, threads: int, args: tuple, stream_ptr: int,
            device_index: int, params: ParamBlock | None = None) -> None:
    """Launches a CuPy RawKernel on the CUDA stream ``stream_ptr`` of device ``device_index``:
    one cuLaunchKernel call where CuPy offers it (no per-argument conversions, no stream
    object), else CuPy's own launch.

    ``args``: numpy scalars of the kernel's parameter types (``np.uint64`` for a pointer,
    ``np.uint32`` for an ``unsigned int``...), none wider than 8 bytes. ``params``: a block to
    fill for the direct launch (a new one per call when None)."""
    cupy = cupy_or_none()
    fn = getattr(kernel, "kernel", kernel)  # CuPy's RawKernel wraps a Function
    rt = cupy.cuda.runtime
    prev = rt.getDevice()
    if prev != device_index:
        rt.setDevice(device_index)
    try:
        if direct_launches():
            block = params if params is not None else ParamBlock(len(args))
            try:
                cupy.cuda.driver.launchKernel(fn.ptr, blocks, 1, 1, threads, 1, 1, 0, stream_ptr,
                                              block.fill(args), 0)
                return
            except Exception:  # e.g. no current context in this thread yet: let CuPy do it
                _DIRECT[0] = False
        launch(kernel, blocks, threads, args, external_stream(stream_ptr, device_index))
    finally:
        if prev != device_index:
            rt.setDevice(prev)


def launch(fn, blocks: int, threads: int, args: tuple, stream) -> None:
    """Launches a CuPy kernel function on ``stream`` (passed to it, or entered around it)."""
    try:
        fn((blocks,), (threads,), args, stream=stream)
    except TypeError:  # a RawKernel rather than its Function: it takes the current stream
        with stream:
            fn((blocks,), (threads,), args)

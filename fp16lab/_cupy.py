"""What fp16lab's CuPy kernels share: finding CuPy, wrapping torch's CUDA stream, launching.

fp16lab's own CUDA kernels (the census, the gradient monitor) run on torch tensors, on torch's
current stream, so they order with the torch work around them without any synchronisation.
"""

from __future__ import annotations

from typing import Any

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


def enqueue(kernel, blocks: int, threads: int, pointers: tuple[int, ...], stream_ptr: int,
            device_index: int) -> None:
    """Launches a CuPy RawKernel whose parameters are all 8-byte values (pointers, int64) on the
    CUDA stream ``stream_ptr``: one cuLaunchKernel call where CuPy offers it (no per-argument
    conversions, no stream object), else CuPy's own launch."""
    import numpy as np

    cupy = cupy_or_none()
    fn = getattr(kernel, "kernel", kernel)  # CuPy's RawKernel wraps a Function
    if _DIRECT[0] and hasattr(cupy.cuda.driver, "launchKernel"):
        values = np.array(pointers, dtype=np.uint64)
        params = (np.arange(len(pointers), dtype=np.uint64) * np.uint64(8)
                  + np.uint64(values.__array_interface__["data"][0]))
        try:  # cuLaunchKernel copies the parameters: the arrays may go when it returns
            cupy.cuda.driver.launchKernel(fn.ptr, blocks, 1, 1, threads, 1, 1, 0, stream_ptr,
                                          params.__array_interface__["data"][0], 0)
            return
        except Exception:  # e.g. no current context in this thread yet: let CuPy do it
            _DIRECT[0] = False
    launch(kernel, blocks, threads, tuple(np.uint64(p) for p in pointers),
           external_stream(stream_ptr, device_index))


def launch(fn, blocks: int, threads: int, args: tuple, stream) -> None:
    """Launches a CuPy kernel function on ``stream`` (passed to it, or entered around it)."""
    try:
        fn((blocks,), (threads,), args, stream=stream)
    except TypeError:  # a RawKernel rather than its Function: it takes the current stream
        with stream:
            fn((blocks,), (threads,), args)

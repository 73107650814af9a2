"""The handful of integer array operations decode and encode share, for numpy and torch.

decode, encode and ulp are written once against these operations; a torch tensor gets the same
integer arithmetic in torch, so a CUDA tensor stays on the GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def is_torch(x: Any) -> bool:
    """Returns whether x is a torch tensor, known by its type alone (torch is not imported)."""
    mod = type(x).__module__
    return mod.startswith("torch") and type(x).__name__ in ("Tensor", "Parameter")


class NumpyOps:
    """The handful of array operations encode/decode need, for numpy."""

    where = staticmethod(np.where)
    maximum = staticmethod(np.maximum)
    minimum = staticmethod(np.minimum)

    @staticmethod
    def f64_bits(x):
        return np.asarray(x, dtype=np.float64).view(np.int64)

    @staticmethod
    def to_f64(x):
        return x.astype(np.float64)

    @staticmethod
    def exp2i(values, exps):
        return np.ldexp(values, exps.astype(np.int32))

    @staticmethod
    def full_like_int(x, v):
        return np.full(np.shape(x), v, dtype=np.int64)


class TorchOps:
    """The same operations for torch tensors (any device)."""

    def __init__(self):
        import torch

        self.torch = torch
        self.where = torch.where

    # the bounds are always Python ints (exponent limits, shift caps)
    def maximum(self, a, b: int):
        return a.clamp(min=b)

    def minimum(self, a, b: int):
        return a.clamp(max=b)

    def f64_bits(self, x):
        return x.to(self.torch.float64).contiguous().view(self.torch.int64)

    def to_f64(self, x):
        return x.to(self.torch.float64)

    def exp2i(self, values, exps):
        # values * 2^exps, exactly: build each power of two from its bit pattern (exp2 and pow
        # on a GPU are not guaranteed exact), in two halves so |exps| up to 2044 stays normal
        t = self.torch
        e = exps.to(t.int64)
        h1 = t.div(e, 2, rounding_mode="floor")
        h2 = e - h1

        def pow2(h):
            return ((h + 1023) << 52).view(t.float64)

        return values * pow2(h1) * pow2(h2)

    def full_like_int(self, x, v):
        return self.torch.full(x.shape, v, dtype=self.torch.int64, device=x.device)


def array_ops(x: Any):
    """Returns the operations for x: :class:`TorchOps` for a tensor, else :class:`NumpyOps`."""
    return TorchOps() if is_torch(x) else NumpyOps

"""FP8 scales: the factor each tensor, row or tile is multiplied by before its cast to e4m3 or e5m2.

A scale ``s`` maps a high-precision tensor ``x`` into a format's range: the stored value is
``q = fp8(clamp(x * s, -M, M))`` (the product in fp32) and ``x`` is read back as ``q / s``.

* **Current scaling** takes ``s = M / amax(x)`` (``M`` = 448 for e4m3fn, 57344 for e5m2), so the
  largest magnitude lands on ``M`` and nothing saturates. The amax is taken over the whole tensor
  (``tensorwise``), each row (``rowwise``: one scale per row of the operand's contraction
  dimension) or each tile (``1x128``, ``128x128``: one scale per block, as recent large-model
  recipes use). ``amax`` is clamped to ``EPS`` first, so an all-zero block gets a huge but finite
  scale (as torchao does).
* **Delayed scaling** (Transformer Engine's recipe, :class:`DelayedScaling`) takes
  ``s = M / max(last N amaxes) / 2^margin``: the scale is known before the tensor is, at the
  price of missing a spike until it enters the history; values beyond ``M`` then saturate.

A granularity is named once here, with the tile it means for an operand whose contraction
dimension is dim 1 (the left operand of ``a @ b``); the right operand's tile is the transpose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import validate

__all__ = ["DTYPES", "EPS", "GRANULARITIES", "DelayedScaling", "Quantized", "amax", "compile_casts",
           "dequantize", "fp8_max", "quantize", "scale_from_amax", "tile_shape"]

#: The two FP8 formats by their short names: e4m3 (forward), e5m2 (gradients).
DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
#: Smallest amax a scale is computed from, so that an all-zero tensor gets a finite scale.
EPS = 1e-12
#: Granularities, with the tile of a left operand (rows, columns); -1 means the whole dimension.
GRANULARITIES = {"tensorwise": (-1, -1), "rowwise": (1, -1), "1x128": (1, 128),
                 "128x128": (128, 128)}


def _dtype(fmt: str) -> torch.dtype:
    if not isinstance(fmt, str) or fmt not in DTYPES:
        raise ValueError(f"unknown FP8 format {fmt!r}; allowed: {', '.join(DTYPES)}")
    return DTYPES[fmt]


# Read once here: torch.finfo called inside an autograd.Function that torch.compile traces
# with dynamic shapes fails (torch 2.11 and 2.14 raise an AssertionError inside dynamo), and the
# compiled FP8 layers call fp8_max there.
_FP8_MAX = {fmt: float(torch.finfo(dtype).max) for fmt, dtype in DTYPES.items()}


def fp8_max(fmt: str) -> float:
    """Returns the largest finite value of an FP8 format (448 for e4m3, 57344 for e5m2)."""
    _dtype(fmt)  # the format's check
    return _FP8_MAX[fmt]


def tile_shape(granularity: str, shape: tuple[int, int], contraction_dim: int = 1) -> tuple[int, int]:
    """Returns the concrete tile (rows, columns) of a granularity for a 2-D operand of ``shape``.

    Raises:
        ValueError: for an unknown granularity, a contraction_dim other than 0 or 1, or a shape
            the tile does not divide.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r}; allowed: {', '.join(GRANULARITIES)}")
    if isinstance(contraction_dim, bool) or contraction_dim not in (0, 1):
        raise ValueError(f"contraction_dim must be 0 or 1, got {contraction_dim!r}")
    tile = GRANULARITIES[granularity]
    if contraction_dim == 0:
        tile = tile[::-1]
    # a whole-dimension tile of an empty dimension is 1 long: no tiles along it, as no values
    tile = tuple((n or 1) if t == -1 else t for t, n in zip(tile, shape))
    if any(n % t for t, n in zip(tile, shape)):
        raise ValueError(f"{granularity} tiles of {tile[0]}x{tile[1]} do not divide a "
                         f"{shape[0]}x{shape[1]} tensor; pad it to a multiple of the tile")
    return tile


def _check_2d(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        what = f"a {x.dim()}-d {x.dtype} tensor" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"FP8 scaling works on 2-d floating-point tensors, got {what}")


def amax(x: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """Returns the absolute maximum of each ``tile`` of a 2-d tensor, in fp32, shaped (M/tr, K/tc)."""
    _check_2d(x)
    (m, k), (tr, tc) = x.shape, tile
    if (tr, tc) == (m, k):
        # one reduction pass, no |x| temporary
        return torch.linalg.vector_norm(x, math.inf).float().reshape(1, 1)
    return x.abs().reshape(m // tr, tr, k // tc, tc).amax(dim=(1, 3)).float()


def scale_from_amax(amax: torch.Tensor, fmt: str, margin: int = 0) -> torch.Tensor:
    """Returns ``M / max(amax, EPS) / 2^margin`` in fp32 (computed in fp64, as torchao does).

    Raises:
        ValueError: an amax that is negative or NaN (an absolute maximum is neither), or a
            margin that is not a whole number >= 0 (as :class:`DelayedScaling` requires).
    """
    margin = validate.count("margin", margin, low=0)
    amax = torch.as_tensor(amax)
    bad = amax[~(amax.double() >= 0)]  # NaN fails the comparison too
    if bad.numel():
        raise ValueError(f"amax must be >= 0 (an absolute maximum), got {bad.flatten()[0].item()}")
    return _scale_from_amax(amax, fmt, margin)


def _scale_from_amax(amax: torch.Tensor, fmt: str, margin: int) -> torch.Tensor:
    # unchecked: the hot path's amaxes are |x| maxima, read on the device without a host sync
    return (fp8_max(fmt) / amax.double().clamp(min=EPS) / 2.0 ** margin).float()


def _expand(scale: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """Returns the per-tile ``scale`` repeated to one entry per element (a broadcast where it can)."""
    if scale.shape[0] > 1 and tile[0] > 1:
        scale = scale.repeat_interleave(tile[0], dim=0)
    if scale.shape[1] > 1 and tile[1] > 1:
        scale = scale.repeat_interleave(tile[1], dim=1)
    return scale


def _scale_and_cast(x: torch.Tensor, scale: torch.Tensor, top: float, dtype: torch.dtype,
                    saturate: bool) -> torch.Tensor:
    """Returns fp8(clamp(x * scale, -top, top)), the product in fp32."""
    scaled = x.float() * scale
    if saturate:
        scaled = scaled.clamp_(-top, top)
    return scaled.to(dtype)


# Eager, the cast is three passes over the tensor (to fp32, times the scale, to fp8), each
# writing a full temporary; torch.compile fuses them into one. Off by default: compiling takes
# seconds per shape, and the eager path is what the CPU tests check.
_CASTS = {"compiled": None}


def compile_casts(enabled: bool = True) -> bool:
    """Turns on (or off) a torch.compile-fused cast for CUDA tensors; returns whether it is on."""
    enabled = validate.boolean("enabled", enabled)
    _CASTS["compiled"] = torch.compile(_scale_and_cast, dynamic=None) if enabled else None
    return _CASTS["compiled"] is not None


@dataclass(frozen=True)
class Quantized:
    """An FP8 tensor with its scales: ``data / scale`` (scale repeated per tile) is the value.

    Attributes:
        data: the FP8 codes, same shape as the original.
        scale: fp32, one per tile, shaped (rows / tile rows, columns / tile columns).
        tile: the tile (rows, columns) each scale covers.
        fmt: "e4m3" or "e5m2".
    """

    data: torch.Tensor
    scale: torch.Tensor
    tile: tuple[int, int]
    fmt: str

    def t(self) -> "Quantized":
        """Returns the transpose (a view of the codes; the scales transposed with them)."""
        return Quantized(self.data.t(), self.scale.t(), self.tile[::-1], self.fmt)


def quantize(x: torch.Tensor, fmt: str, granularity: str = "tensorwise", *,
             contraction_dim: int = 1, scale: torch.Tensor | None = None,
             saturate: bool = True) -> Quantized:
    """Returns ``x`` cast to FP8 with one scale per tile of ``granularity`` (current scaling by default).

    Args:
        x: a 2-d floating-point tensor.
        fmt: "e4m3" (activations, weights) or "e5m2" (gradients).
        granularity: one of ``GRANULARITIES``.
        contraction_dim: the dimension the matmul sums over (1 for ``a`` in ``a @ b``, 0 for ``b``).
        scale: given scales (delayed scaling), shaped like the tile grid; None computes them now.
        saturate: clamp to +-M before the cast. Current scaling never exceeds M (up to one fp32
            rounding, which rounds back to M), so the clamp can be skipped there; a given scale
            can be exceeded by a spike, and then the clamp is what keeps inf/NaN out.

    Raises:
        ValueError: a given scale that is not finite and positive (0, inf or NaN would turn
            every code into NaN, inf or 0).
    """
    if scale is not None:
        given = torch.as_tensor(scale, dtype=torch.float32)
        bad = given[~(torch.isfinite(given) & (given > 0))]
        if bad.numel():
            raise ValueError(f"scale must be finite and > 0, got {bad.flatten()[0].item()}")
    return _quantize(x, fmt, granularity, contraction_dim=contraction_dim, scale=scale,
                     saturate=validate.boolean("saturate", saturate))


def _quantize(x: torch.Tensor, fmt: str, granularity: str = "tensorwise", *,
              contraction_dim: int = 1, scale: torch.Tensor | None = None,
              saturate: bool = True) -> Quantized:
    """:func:`quantize` without the check of a given scale (a device sync): Float8Linear's
    delayed scales are finite and positive by construction."""
    dtype = _dtype(fmt)
    _check_2d(x)
    tile = tile_shape(granularity, tuple(x.shape), contraction_dim)
    grid = (x.shape[0] // tile[0], x.shape[1] // tile[1])
    if scale is None:
        scale = _scale_from_amax(amax(x, tile), fmt, 0)
    else:
        scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device).reshape(grid)
    cast = _CASTS["compiled"] if x.is_cuda and _CASTS["compiled"] is not None else _scale_and_cast
    data = cast(x, _expand(scale, tile), fp8_max(fmt), dtype, saturate)
    return Quantized(data, scale, tile, fmt)


def dequantize(q: Quantized) -> torch.Tensor:
    """Returns the fp32 values an FP8 tensor stands for: codes divided by their tile's scale."""
    return q.data.float() / _expand(q.scale, q.tile)


class DelayedScaling:
    """Delayed scaling of one tensor: its scale comes from the amaxes of the last ``history_len`` steps.

    Each step uses :attr:`scale`, computed before the tensor is seen, then :meth:`update` records
    the tensor's amax (newest first in :attr:`history`) and computes the next scale,
    ``M / max(history) / 2^margin``. Until an amax is recorded, and whenever the history's maximum
    is zero or not finite, the scale stays where it was (it starts at 1), as Transformer Engine does.

    Args:
        fmt: "e4m3" or "e5m2".
        history_len: how many past amaxes the scale looks at (>= 1).
        margin: extra power-of-two headroom (>= 0): the scale is divided by 2^margin.
    """

    def __init__(self, fmt: str = "e4m3", history_len: int = 16, margin: int = 0) -> None:
        _dtype(fmt)
        # not validate.count: tests/test_fp8.py pins these exact messages
        if isinstance(history_len, bool) or not isinstance(history_len, int) or history_len < 1:
            raise ValueError(f"history_len must be an integer >= 1, got {history_len!r}")
        if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
            raise ValueError(f"margin must be an integer >= 0, got {margin!r}")
        self.fmt, self.history_len, self.margin = fmt, history_len, margin
        self.history = torch.zeros(history_len, dtype=torch.float32)
        self.scale = torch.ones((), dtype=torch.float32)
        self.steps = 0

    def update(self, amax: torch.Tensor | float) -> torch.Tensor:
        """Records this step's amax and returns the scale the next step will use."""
        amax = torch.as_tensor(amax, dtype=torch.float32).reshape(()).to(self.history.device)
        self.history = torch.cat([amax.reshape(1), self.history[:-1]])
        self.steps += 1
        top = self.history.max()
        new = _scale_from_amax(top, self.fmt, self.margin)
        # keep the old scale where the history says nothing (all zeros) or holds an inf/NaN
        keep = (top <= 0) | ~torch.isfinite(top)
        self.scale = torch.where(keep, self.scale, new)
        return self.scale

    def to(self, device: torch.device | str) -> "DelayedScaling":
        """Moves the history and the scale to ``device`` (returns self)."""
        self.history, self.scale = self.history.to(device), self.scale.to(device)
        return self

    def __repr__(self) -> str:
        return (f"DelayedScaling({self.fmt}, history_len={self.history_len}, margin={self.margin}, "
                f"scale={float(self.scale):g}, steps={self.steps})")

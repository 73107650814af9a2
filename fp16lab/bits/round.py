"""Values to values: a format's rounding of a value (quantize), its spacing there (ulp), and a
running sum kept in the format (accumulate)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..formats import FormatInfo, format_info
from .arrays import array_ops, is_torch
from .checks import check_values
from .decode import decode
from .encode import encode, rounding_mode


def quantize(values: Any, fmt: str | FormatInfo = "fp16", **kwargs):
    """Returns values rounded to the nearest number of a format, as float64 (``decode(encode(x))``).

    Keyword arguments go to :func:`encode` (``rounding``, ``saturate``, ``seed``).
    """
    return decode(encode(values, fmt, **kwargs), fmt)


def ulp(values: Any, fmt: str | FormatInfo = "fp16"):
    """Returns the spacing of the format at each value: ``2^(max(floor(log2|x|), emin) - m)``.

    The spacing is that of the binade the value falls in (for 1.0 in fp16, 2^-10); zero and
    subnormals get the subnormal spacing; inf and NaN give NaN.
    """
    f = format_info(fmt)
    v = check_values(values, "ulp")
    ops = array_ops(v)
    bits = ops.f64_bits(v)
    a = bits & 0x7FFF_FFFF_FFFF_FFFF
    e_field = a >> 52
    e = ops.maximum(e_field, 1) - 1023
    e_eff = ops.maximum(e, f.emin)
    out = ops.exp2i(ops.to_f64(ops.full_like_int(e, 1)), e_eff - f.mantissa_bits)
    out = ops.where(e_field == 0x7FF, math.nan, out)
    if np.isscalar(values) or isinstance(values, (int, float)):
        return float(out)
    return out



def accumulate(values: Any, fmt: str | FormatInfo = "fp16", *, rounding: str = "nearest",
               seed: int | None = None) -> np.ndarray:
    """Returns the running sums of values when the accumulator is stored in a format, rounding
    after every addition (as a kernel that keeps its sum in fp16 registers would).

    The addition itself is exact (float64 holds the sum of two fp16 / bf16 / fp8 numbers), so
    the only error is the rounding of each partial sum back into the format.
    """
    f = format_info(fmt)
    mode = rounding_mode(rounding)
    v = check_values(values, "accumulate")
    if is_torch(v):
        v = v.detach().cpu().numpy()
    xs = quantize(np.asarray(v, dtype=np.float64).ravel(), f)
    rng = np.random.default_rng(seed)
    out = np.empty_like(xs)
    acc = 0.0
    for i, x in enumerate(xs):
        acc = decode(encode(acc + x, f, rounding=mode, generator=rng), f)
        out[i] = acc
    return out

"""Codes to values: ``decode(codes, fmt)`` by integer bit arithmetic.

Each code is split into sign, exponent and mantissa fields and the value built as
``(-1)^s * 2^(E - bias) * (1 + M / 2^m)`` (or the subnormal / special case), in int64 /
float64 arithmetic on numpy arrays and in the same arithmetic in torch for tensors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..formats import FormatInfo, format_info
from .arrays import array_ops, is_torch
from .checks import check_codes


def decode(codes: Any, fmt: str | FormatInfo = "fp16"):
    """Returns the float64 values of integer codes of a format (array or tensor, same shape).

    Args:
        codes: integers in ``0 .. 2^bits - 1`` (numpy array, list, int or torch tensor; for a
            tensor the result is a float64 tensor on the same device).
        fmt: format name or :class:`~fp16lab.formats.FormatInfo`.

    Raises:
        ValueError: for non-integer codes or codes out of range for the format.
    """
    f = format_info(fmt)
    scalar = np.isscalar(codes) or (isinstance(codes, int))
    c = check_codes(codes, f)
    ops = array_ops(c)
    m = f.mantissa_bits
    sign = (c >> (f.bits - 1)) & 1
    e_field = (c >> m) & f.exponent_field_max
    mant = c & f.mantissa_field_max
    normal = e_field > 0
    signif = ops.to_f64(mant + ops.where(normal, 1 << m, 0))
    exp = ops.maximum(e_field, 1) - f.bias - m
    mag = ops.exp2i(signif, exp)
    inf = math.inf
    if f.specials == "ieee":
        special = e_field == f.exponent_field_max
        mag = ops.where(special & (mant == 0), inf, mag)
        mag = ops.where(special & (mant != 0), math.nan, mag)
    else:
        mag = ops.where((e_field == f.exponent_field_max) & (mant == f.mantissa_field_max),
                        math.nan, mag)
    out = ops.where(sign == 1, -mag, mag)
    if scalar and not is_torch(out):
        return float(out)
    return out

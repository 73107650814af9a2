"""Values to codes: ``encode(values, fmt)`` without any library cast, in three rounding modes.

Each value is taken as a float64 ``|x| = S * 2^(E - 52)`` with an integer significand
``S < 2^53``. The format's spacing ("quantum") at that magnitude is ``2^(max(E, emin) - m)``, so
the value in quanta is ``S`` shifted right by ``k = 52 - m + max(0, emin - E)`` bits. The bits
shifted off, ``r``, decide the rounding:

* nearest-even: up when ``r > 2^(k-1)``, or ``r == 2^(k-1)`` and the kept part is odd;
* toward-zero: never up;
* stochastic: up with probability ``r / 2^k``, so the rounding is unbiased on average.

The code is then ``((max(E, emin) + bias - 1) << m) + q``: a mantissa carry into the
exponent and the subnormal-to-normal step both fall out of the integer addition. Codes above
the largest finite one overflow to infinity (fp16, bf16, e5m2, fp32, tf32) or to NaN
(e4m3fn, as ml_dtypes does), or to the largest finite value with ``saturate=True``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..formats import FormatInfo, format_info
from .arrays import array_ops, is_torch
from .checks import check_values

ROUNDINGS = ("nearest", "toward_zero", "stochastic")
_ROUNDING_ALIASES = {"nearest_even": "nearest", "rne": "nearest", "rtz": "toward_zero",
                     "truncate": "toward_zero", "sr": "stochastic"}


def rounding_mode(rounding: str) -> str:
    """Returns the rounding mode's name in ``ROUNDINGS`` (aliases such as "rne" resolved)."""
    r = _ROUNDING_ALIASES.get(rounding, rounding)
    if r not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; allowed: {', '.join(ROUNDINGS)}")
    return r


def encode(values: Any, fmt: str | FormatInfo = "fp16", *, rounding: str = "nearest",
           saturate: bool = False, seed: int | None = None, generator: Any = None):
    """Returns the int64 codes of values rounded into a format (array or tensor, same shape).

    Args:
        values: real numbers (scalar, list, numpy array or torch tensor on any device).
        fmt: format name or FormatInfo.
        rounding: ``"nearest"`` (ties to even, the IEEE default), ``"toward_zero"`` or
            ``"stochastic"`` (up with probability equal to the distance from the lower
            neighbour in units of the spacing).
        saturate: clamp overflow to the largest finite value instead of inf (or NaN for
            e4m3fn, which has no inf). Toward-zero rounding always saturates finite values.
        seed: seed for stochastic rounding of numpy input.
        generator: a ``numpy.random.Generator`` or ``torch.Generator`` for stochastic rounding.

    Raises:
        ValueError: for anything but real numbers (None, strings, complex, datetime64 and
            timedelta64 values are refused, not cast), or an unknown rounding mode.
    """
    f = format_info(fmt)
    mode = rounding_mode(rounding)
    scalar = np.isscalar(values) or isinstance(values, (int, float))
    v = check_values(values)
    ops = array_ops(v)
    bits = ops.f64_bits(v)
    m = f.mantissa_bits
    sign = (bits >> 63) & 1
    a = bits & 0x7FFF_FFFF_FFFF_FFFF
    e_field = a >> 52
    frac = a & ((1 << 52) - 1)
    is_nan = a > 0x7FF0_0000_0000_0000
    is_inf = a == 0x7FF0_0000_0000_0000
    # |x| = S * 2^(E - 52) with S < 2^53 (float64 subnormals: no implicit bit, E = -1022)
    signif = frac + ops.where(e_field > 0, 1 << 52, 0)
    e = ops.maximum(e_field, 1) - 1023
    e_eff = ops.maximum(e, f.emin)
    shift = 52 - m + (e_eff - e)
    k = ops.minimum(shift, 54)  # beyond 54 bits everything is shifted off anyway
    q = signif >> k
    r = signif & ((1 << k) - 1)
    if mode == "nearest":
        half = 1 << (k - 1)
        up = (r > half) | ((r == half) & ((q & 1) == 1))
    elif mode == "toward_zero":
        up = r < 0  # all False, same shape and type
    else:
        # probability r / 2^shift, computed exactly in float64 (r < 2^53)
        p = ops.exp2i(ops.to_f64(r), -shift)
        up = _uniform_like(p, seed, generator) < p
    q = q + ops.where(up, 1, 0)
    mag = ((e_eff + f.bias - 1) << m) + q
    over = mag > f.max_finite_code
    if mode == "toward_zero" or saturate:
        over_code = f.max_finite_code
    else:
        over_code = f.inf_code if f.has_infs else f.nan_code
    mag = ops.where(over, over_code, mag)
    if f.has_infs:
        inf_code = f.max_finite_code if saturate else f.inf_code
    else:
        inf_code = f.max_finite_code if saturate else f.nan_code
    mag = ops.where(is_inf, inf_code, mag)
    mag = ops.where(is_nan, f.nan_code, mag)
    code = mag | (sign << (f.bits - 1))
    if scalar and not is_torch(code):
        return int(code)
    return code


def _uniform_like(p, seed, generator):
    """Returns float64 uniforms in [0, 1) shaped like p (on its device for a tensor)."""
    if is_torch(p):
        import torch

        return torch.rand(p.shape, dtype=torch.float64, device=p.device, generator=generator)
    rng = generator if generator is not None else np.random.default_rng(seed)
    return rng.random(np.shape(p))

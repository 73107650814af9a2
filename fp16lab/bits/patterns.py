"""A format's class boundaries under round-to-nearest-even, as float64 thresholds and as bit
patterns of the data's own float type, and the binary-exponent range of the census histogram.

Positive floats are ordered like their bit patterns, so once each threshold is replaced by the
nearest pattern of the data's type on the correct side, "does |x| underflow / turn subnormal /
overflow in fp16?" is an integer comparison on x's own bits. :mod:`fp16lab.census` (numpy and
torch) and the CUDA census kernel (:mod:`fp16lab.kernels.census`) both count this way.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..formats import FormatInfo, format_info

#: Histogram bins: binary exponents from HIST_MIN to HIST_MAX (float64 data beyond them is clamped).
HIST_MIN, HIST_MAX = -160, 130


def thresholds(fmt: str | FormatInfo) -> dict[str, float]:
    """Returns the class boundaries of a format in float64, with how each is compared.

    ``under`` (``|x| <= under`` underflows), ``normal`` (``|x| < normal`` is subnormal) and
    ``over`` (``|x| >= over`` overflows, or ``>`` when ``over_inclusive`` is False).
    """
    f = format_info(fmt)
    s = f.smallest_subnormal
    top_ulp = math.ldexp(1.0, f.emax - f.mantissa_bits)
    return {"under": s / 2, "normal": f.smallest_normal - s / 2,
            "over": f.max_finite + top_ulp / 2,
            "over_inclusive": bool(f.max_finite_code & 1)}


def bit_layout(dtype) -> tuple[Any, int, int] | None:
    """Returns (unsigned view dtype, mantissa bits, exponent bits) of an IEEE-style float dtype."""
    name = np.dtype(dtype).name
    return {"float16": (np.uint16, 10, 5), "bfloat16": (np.uint16, 7, 8),
            "float32": (np.uint32, 23, 8), "float64": (np.uint64, 52, 11)}.get(name)


def pattern_below(t: float, dtype, udtype, strict: bool) -> int:
    """Returns the bit pattern of the largest ``dtype`` value <= t (< t when strict), t > 0.

    Positive floats are ordered like their bit patterns, so ``|x| <= t`` is ``bits <= pattern``.
    """
    with np.errstate(over="ignore", under="ignore"):  # thresholds beyond the type's range
        v = np.array([t], dtype=np.float64).astype(dtype)
    p = int(v.view(udtype)[0])
    if float(v[0]) > t or (strict and float(v[0]) == t):
        p -= 1  # the next value down (from +inf: the largest finite)
    return p

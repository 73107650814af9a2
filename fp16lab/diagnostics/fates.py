"""What FP16 does to gradient values when they are stored: exact fractions per fate, per layer and scale.

What FP16 does to a gradient value ``g`` when it is stored (round to nearest even):

* ``|g| <= 2**-25`` (and ``g != 0``): rounds to zero - *underflow*, the update is lost;
* ``2**-25 < |g| < 2**-14``: a *subnormal*, kept with fewer significant bits;
* ``2**-14 <= |g| < 65520``: a *normal* number, 11 significant bits;
* ``|g| >= 65520``: rounds to inf - *overflow*, and a loss scaler skips the step.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

from ..census import census
from ..scaling import DEFAULT_INIT_SCALE


#: FP16 facts used below (IEEE binary16).
FP16_MIN_SUBNORMAL = 2.0**-24
FP16_MIN_NORMAL = 2.0**-14
FP16_MAX = 65504.0
FP16_OVERFLOW_AT = 65520.0  # the rounding midpoint between 65504 and 2**16

FATES = ("zero", "underflow", "subnormal", "normal", "overflow", "nonfinite")


# --------------------------------------------------------------------------------------------
# Exact fates of values stored in FP16
# --------------------------------------------------------------------------------------------
def fp16_fate(values: torch.Tensor, scale: float = 1.0) -> dict[str, float]:
    """Returns the fractions of ``values * scale`` that FP16 stores as zero, underflow, etc.

    The fates (``FATES``) partition the elements: ``zero`` (already exactly zero), ``underflow``
    (non-zero, becomes 0), ``subnormal``, ``normal``, ``overflow`` (finite, becomes inf) and
    ``nonfinite`` (already inf/NaN). The product is taken in float64 and cast to FP16 once, so
    the answer is exact for any float32 input and any scale.
    """
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"values must be a torch.Tensor, got {type(values).__name__}")
    if isinstance(scale, bool) or not (isinstance(scale, (int, float)) and math.isfinite(scale)
                                       and scale > 0):  # not validate.number: a test pins these words
        raise ValueError(f"scale must be a finite positive number, got {scale!r}")
    x = values.detach().to("cpu", torch.float64).reshape(-1) * float(scale)
    n = x.numel()
    if n == 0:
        return {f: 0.0 for f in FATES}
    finite = torch.isfinite(x)
    # float64 -> float16 via float32 could round twice; x is a float32 times a scale, so use
    # the exact thresholds instead of a cast.
    a = x.abs()
    zero = (x == 0)
    under = finite & ~zero & (a <= 2.0**-25)
    over = finite & (a >= FP16_OVERFLOW_AT)
    # rounds to a subnormal: (2**-25, 2**-14 - 2**-25); the midpoint ties to 2**-14 (even)
    sub = finite & (a > 2.0**-25) & (a < FP16_MIN_NORMAL - 2.0**-25)
    normal = finite & ~zero & ~under & ~over & ~sub
    counts = {"zero": zero, "underflow": under, "subnormal": sub, "normal": normal,
              "overflow": over, "nonfinite": ~finite}
    return {k: float(v.sum()) / n for k, v in counts.items()}


def gradient_fate_table(named_grads: Iterable[tuple[str, torch.Tensor]],
                        scales: Iterable[float] = (1.0, DEFAULT_INIT_SCALE)):
    """Returns a DataFrame: per parameter and scale, the FP16 fate fractions of its gradient.

    ``lost`` is the underflow fraction (non-zero values FP16 turns to 0) and ``kept`` the
    fraction that stays non-zero and finite (subnormal + normal); feed it FP32 gradients.
    """
    import pandas as pd

    rows = []
    for name, g in named_grads:
        if g is None:
            continue
        for s in scales:
            f = fp16_fate(g, s)
            rows.append({"param": name, "scale": float(s), "numel": g.numel(), **f,
                         "lost": f["underflow"], "kept": f["subnormal"] + f["normal"]})
    return pd.DataFrame(rows)


def census_lost_kept(named_grads: Iterable[tuple[str, torch.Tensor]],
                     scale: float = DEFAULT_INIT_SCALE):
    """Returns a DataFrame from :func:`fp16lab.census.census`: per parameter, the fraction of its
    gradient lost to FP16 underflow at scale 1 and the fraction kept (finite, non-zero) at
    ``scale``, with the overflow fraction at ``scale``. Feed it FP32 gradients."""
    import pandas as pd

    rows = []
    for name, g in named_grads:
        g = g.detach().float().cpu()
        one = census(g, "fp16").fractions
        big = census(g.double() * float(scale), "fp16").fractions  # exact: a float64 product
        rows.append({"param": name, "numel": g.numel(), "zero": one["zero"],
                     "lost_at_1": one["underflow"],
                     "kept_at_1": one["subnormal"] + one["normal"],
                     "lost_at_S": big["underflow"], "kept_at_S": big["subnormal"] + big["normal"],
                     "overflow_at_S": big["overflow"], "S": float(scale)})
    return pd.DataFrame(rows)

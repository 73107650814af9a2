"""Loss-scaler settings: torch.amp.GradScaler's defaults written out once, and their checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import validate

#: torch.amp.GradScaler's defaults, written out.
DEFAULT_INIT_SCALE = 2.0**16
DEFAULT_GROWTH_FACTOR = 2.0
DEFAULT_BACKOFF_FACTOR = 0.5
DEFAULT_GROWTH_INTERVAL = 2000

#: The growth counter is an int32 tensor in torch; a longer interval could never be reached.
MAX_GROWTH_INTERVAL = 2**31 - 1

FLOAT32_MAX = float(np.finfo(np.float32).max)

#: The smallest loss scale: float32's smallest normal number, 2**-126. The gradients are unscaled
#: by the scale's float32 reciprocal, which is inf for a smaller (subnormal) scale, and a
#: subnormal scale backs off to 0; either way the step would apply inf or NaN gradients, which
#: torch's GradScaler does (it checks the gradients before it multiplies them). Scales are
#: refused below it and a dynamic scale never backs off below it.
MIN_SCALE = 2.0**-126

#: The smallest backoff factor: the same float32 bound, 2**-126.
MIN_BACKOFF_FACTOR = 2.0**-126


def f32(x: float) -> float:
    """Returns x rounded to the nearest float32, as a Python float."""
    return float(np.float32(x))


def check_scale(name: str, value: Any) -> float:
    """Returns a loss scale rounded to float32, if it is a number from MIN_SCALE to float32's max.

    Raises:
        TypeError: not a real number (a string, a bool, None).
        ValueError: NaN, infinite, or outside [MIN_SCALE, 3.4e38] once rounded to float32.
    """
    v = validate.number(name, value)
    with np.errstate(over="ignore", under="ignore"):
        v32 = f32(v)
    if not MIN_SCALE <= v32 <= FLOAT32_MAX:
        raise ValueError(f"{name} must be a finite positive number that fits in float32 "
                         f"({MIN_SCALE:.2g} <= {name} <= 3.4e38; a smaller scale's reciprocal, "
                         f"which unscales the gradients, is inf), got {value!r}")
    return v32


def check_growth_factor(value: Any) -> float:
    """Returns growth_factor as a float if it is a finite number > 1 (torch's limit)."""
    return float(validate.number("growth_factor", value, low=1.0, low_open=True))


def check_backoff_factor(value: Any) -> float:
    """Returns backoff_factor as a float if it lies in [MIN_BACKOFF_FACTOR, 1) (torch: < 1)."""
    v = float(validate.number("backoff_factor", value, low=0.0, high=1.0, low_open=True,
                              high_open=True))
    if v < MIN_BACKOFF_FACTOR:
        raise ValueError(f"backoff_factor must be at least {MIN_BACKOFF_FACTOR:.2g} (2**-126, "
                         f"float32's smallest normal number), got {value!r}: the scale is a "
                         f"float32, and a smaller factor takes any scale up to 1 below float32's "
                         f"normal range in one backoff (torch's GradScaler to 0, after which it "
                         f"steps with NaN gradients)")
    return v


def check_growth_interval(value: Any) -> int:
    """Returns growth_interval as an int if it is an integer from 1 to MAX_GROWTH_INTERVAL."""
    if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
            or not 1 <= value <= MAX_GROWTH_INTERVAL):
        raise ValueError(f"growth_interval must be an integer from 1 to {MAX_GROWTH_INTERVAL}, "
                         f"got {value!r}")
    return int(value)


@dataclass(frozen=True)
class ScalerSettings:
    """Dynamic loss-scaler settings, with torch.amp.GradScaler's defaults (checked on creation).

    The scale starts at ``init_scale``; a step whose gradients hold an inf or NaN is skipped and
    the scale multiplied by ``backoff_factor``; after ``growth_interval`` finite steps in a row
    the scale is multiplied by ``growth_factor``. The sweep, notebook 02's runs and
    :class:`DynamicLossScaler` take their defaults from here.
    """

    init_scale: float = DEFAULT_INIT_SCALE
    growth_factor: float = DEFAULT_GROWTH_FACTOR
    backoff_factor: float = DEFAULT_BACKOFF_FACTOR
    growth_interval: int = DEFAULT_GROWTH_INTERVAL

    def __post_init__(self) -> None:
        problems: list[Exception] = []
        for check in (lambda: check_scale("init_scale", self.init_scale),
                      lambda: check_growth_factor(self.growth_factor),
                      lambda: check_backoff_factor(self.backoff_factor),
                      lambda: check_growth_interval(self.growth_interval)):
            try:
                check()
            except (TypeError, ValueError) as e:
                problems.append(e)
        if problems:
            kind = TypeError if all(isinstance(e, TypeError) for e in problems) else ValueError
            raise kind("bad scaler settings: " + "; ".join(map(str, problems)))

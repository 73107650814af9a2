"""Loss-scaler settings: torch.amp.GradScaler's defaults written out once, and their checks."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: torch.amp.GradScaler's defaults, written out.
DEFAULT_INIT_SCALE = 2.0**16
DEFAULT_GROWTH_FACTOR = 2.0
DEFAULT_BACKOFF_FACTOR = 0.5
DEFAULT_GROWTH_INTERVAL = 2000

#: The growth counter is an int32 tensor in torch; a longer interval could never be reached.
MAX_GROWTH_INTERVAL = 2**31 - 1


def f32(x: float) -> float:
    """Returns x rounded to the nearest float32, as a Python float."""
    return float(np.float32(x))


def check_scale(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}") from None
    with np.errstate(over="ignore"):
        v32 = f32(v)
    if not math.isfinite(v32) or v32 <= 0:
        raise ValueError(f"{name} must be a finite positive number that fits in float32 "
                         f"(0 < {name} <= 3.4e38), got {value!r}")
    return v32


def check_dynamic_params(growth_factor: float, backoff_factor: float,
                          growth_interval: int) -> None:
    if not (isinstance(growth_factor, (int, float)) and math.isfinite(growth_factor)
            and growth_factor > 1.0):
        raise ValueError(f"growth_factor must be a finite number > 1.0, got {growth_factor!r}")
    if not (isinstance(backoff_factor, (int, float)) and 0.0 < backoff_factor < 1.0):
        raise ValueError(f"backoff_factor must lie strictly between 0 and 1, "
                         f"got {backoff_factor!r}")
    if (isinstance(growth_interval, bool) or not isinstance(growth_interval, (int, np.integer))
            or not 1 <= growth_interval <= MAX_GROWTH_INTERVAL):
        raise ValueError(f"growth_interval must be an integer from 1 to {MAX_GROWTH_INTERVAL}, "
                         f"got {growth_interval!r}")


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
        problems = []
        for check in (lambda: check_scale("init_scale", self.init_scale),
                      lambda: check_dynamic_params(self.growth_factor, self.backoff_factor,
                                                    self.growth_interval)):
            try:
                check()
            except ValueError as e:
                problems.append(str(e))
        if problems:
            raise ValueError("bad scaler settings: " + "; ".join(problems))

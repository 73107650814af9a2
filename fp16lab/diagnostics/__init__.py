"""Gradient health in FP16: where gradients fall, cheap per-layer hooks, and the first inf/NaN.

What FP16 does to a gradient value ``g`` when it is stored (round to nearest even):

* ``|g| <= 2**-25`` (and ``g != 0``): rounds to zero - *underflow*, the update is lost;
* ``2**-25 < |g| < 2**-14``: a *subnormal*, kept with fewer significant bits;
* ``2**-14 <= |g| < 65520``: a *normal* number, 11 significant bits;
* ``|g| >= 65520``: rounds to inf - *overflow*, and a loss scaler skips the step.

The modules, one job each:

* :mod:`.fates`: :func:`fp16_fate` / :func:`gradient_fate_table`, the exact fractions above for
  a tensor, and for every parameter's gradient at several loss scales;
* :mod:`.monitor`: :class:`GradientMonitor`, per-parameter statistics collected by hooks during
  backward, computed on the device for all parameters at once (the histograms of
  :mod:`.histogram`) and never read back until asked - cheap enough to leave on
  (``fp16lab.bench.diagnostics_overhead`` measures it; :mod:`.overhead` reads its file);
* :mod:`.locator`: :func:`locate_first_nonfinite` runs one step and names the first module whose
  forward output or backward gradient became inf/NaN;
* :mod:`.islands` and :mod:`.demos`: measured demonstrations (:func:`fp32_island_demo`,
  :func:`clipping_demo`, :func:`scheduler_warning_demo`, :func:`overflow_demo`).
"""

from .demos import clipping_demo, overflow_demo, overflow_demo_model, scheduler_warning_demo
from .fates import (FATES, FP16_MAX, FP16_MIN_NORMAL, FP16_MIN_SUBNORMAL, FP16_OVERFLOW_AT,
                    census_lost_kept, fp16_fate, gradient_fate_table)
from .histogram import EXP_MAX, EXP_MIN, N_BINS, auto_backend, exponent_of_bin
from .islands import FP32Island, Gram, fp32_island_demo
from .locator import NonFiniteReport, locate_first_nonfinite
from .monitor import GradientMonitor
from .overhead import overhead_summary

__all__ = ["EXP_MAX", "EXP_MIN", "FATES", "FP16_MAX", "FP16_MIN_NORMAL", "FP16_MIN_SUBNORMAL",
           "FP16_OVERFLOW_AT", "FP32Island", "GradientMonitor", "Gram", "N_BINS",
           "NonFiniteReport", "auto_backend", "census_lost_kept", "clipping_demo",
           "exponent_of_bin", "fp16_fate", "fp32_island_demo", "gradient_fate_table",
           "locate_first_nonfinite", "overflow_demo", "overflow_demo_model", "overhead_summary",
           "scheduler_warning_demo"]

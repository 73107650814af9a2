"""The two scalers you can read: :class:`StaticLossScaler` and :class:`DynamicLossScaler`
(torch.amp.GradScaler's rule), on the training-loop state machine they share."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable

import numpy as np

from .events import ScaleCollapseMonitor, ScaleCollapseWarning, ScaleEvent, events_frame
from .settings import (DEFAULT_BACKOFF_FACTOR, DEFAULT_GROWTH_FACTOR, DEFAULT_GROWTH_INTERVAL,
                       DEFAULT_INIT_SCALE, MIN_SCALE, check_backoff_factor, check_growth_factor,
                       check_growth_interval, check_scale, f32)


class OptimizerStage(Enum):
    """Where one optimizer is in the current iteration (torch.amp.GradScaler's ``OptState``)."""

    READY = 0      # nothing done since the last update()
    UNSCALED = 1   # its gradients were divided by the scale and checked for inf/NaN
    STEPPED = 2    # step(optimizer) ran (or was skipped) this iteration


@dataclass
class _OptimizerState:
    stage: OptimizerStage = OptimizerStage.READY
    found_inf: bool | None = None  # None: no gradient was checked (the optimizer had none)


def _check_found_inf(found_inf: Any) -> bool:
    """Returns found_inf as a bool; only a bool or a one-element tensor is taken as a flag."""
    if isinstance(found_inf, (bool, np.bool_)):
        return bool(found_inf)
    if type(found_inf).__module__.startswith("torch") and hasattr(found_inf, "numel"):
        if found_inf.numel() != 1:
            raise ValueError(f"update(found_inf=...) takes a one-element tensor, got shape "
                             f"{tuple(found_inf.shape)}")
        return bool(found_inf.detach().reshape(()).item() != 0)
    raise TypeError(f"update(found_inf=...) takes True, False or a one-element tensor (nonzero "
                    f"means the gradients held inf/NaN), got {type(found_inf).__name__} "
                    f"{found_inf!r}")


class _LossScalerBase:
    """What static and dynamic scalers share: the history and GradScaler's loop calls.

    Each optimizer goes through GradScaler's stages between two ``update()`` calls:
    READY -> (``unscale_``) UNSCALED -> (``step``) STEPPED. Calls out of that order raise
    instead of silently stepping with gradients that are still scaled, or stepping twice:

    * ``unscale_``/``step`` before ``scale()`` in this iteration (a plain ``loss.backward()``
      leaves gradients the scaler never multiplied; dividing them by the scale would shrink
      the update by that factor). torch raises here only on the first iteration, before its
      scale tensor exists; these scalers check every iteration.
    * ``unscale_`` twice, or after ``step``, for one optimizer;
    * ``step`` twice for one optimizer;
    * ``step`` on an optimizer none of whose parameters has a gradient;
    * ``update()`` with nothing unscaled or stepped, and ``update(found_inf=...)`` after
      an optimizer was unscaled or stepped (its gradients already decided found_inf).
    """

    def __init__(self, scale: float):
        self._scale = scale
        self._step = 0
        self._scaled = False  # scale() was called since the last update()
        self._optimizers: dict[int, _OptimizerState] = {}
        self.history: list[ScaleEvent] = []

    # -- state ---------------------------------------------------------------------------------
    @property
    def scale_value(self) -> float:
        """Returns the current scale (a float32 value)."""
        return self._scale

    def get_scale(self) -> float:
        """Returns the current scale, like ``torch.amp.GradScaler.get_scale``."""
        return self._scale

    def _next_scale(self, found_inf: bool) -> float:
        raise NotImplementedError

    # -- the state machine ---------------------------------------------------------------------
    def update(self, found_inf: bool | None = None) -> ScaleEvent:
        """Returns the event for this step after applying the scale rule.

        Args:
            found_inf: whether this step's gradients held an inf or NaN: True, False or a
                one-element tensor (nonzero: they did). Give it only to drive the rule without
                an optimizer; after ``step(optimizer)`` leave it ``None``: the gradients
                decided it.

        Raises:
            TypeError: found_inf is neither None, a bool nor a tensor.
            RuntimeError: found_inf is None and no optimizer was unscaled or stepped since the
                last update(), or found_inf is given after one was.
        """
        checked = [st.found_inf for st in self._optimizers.values() if st.found_inf is not None]
        if found_inf is None:
            if not checked:
                raise RuntimeError("update() found no inf/NaN check since the last update(): "
                                   "call scaler.step(optimizer) first, or pass "
                                   "update(found_inf=True/False) to drive the rule by hand")
            found_inf = any(checked)
        else:
            found_inf = _check_found_inf(found_inf)
            if self._optimizers:
                raise RuntimeError("update(found_inf=...) after unscale_()/step(optimizer): the "
                                   "optimizer's gradients already decided whether this step "
                                   "overflowed; call update() without found_inf")
        used = self._scale
        self._scale = self._next_scale(found_inf)
        event = ScaleEvent(self._step, used, found_inf, found_inf, self._scale)
        self.history.append(event)
        self._step += 1
        self._scaled = False
        self._optimizers = {}
        return event

    # -- GradScaler-style training calls -------------------------------------------------------
    def scale(self, loss):
        """Returns ``loss * scale`` (call ``.backward()`` on it)."""
        self._scaled = True
        return loss * self._scale

    def _require_scaled(self, call: str) -> None:
        if not self._scaled:
            raise RuntimeError(
                f"{call} before scale() in this iteration: the gradients were not multiplied "
                f"by the scale ({self._scale:g}), so unscaling them would divide the update by "
                f"it. Write scaler.scale(loss).backward(), not loss.backward(), then "
                f"scaler.step(optimizer) and scaler.update()")

    def unscale_(self, optimizer) -> bool:
        """Returns whether any gradient is inf/NaN, after dividing the gradients by the scale.

        Raises:
            RuntimeError: called before ``scale()`` this iteration, or a second time for this
                optimizer, or after ``step(optimizer)``, since the last ``update()``.
            ValueError: a gradient is FP16 (unscaling in FP16 would flush small values to zero;
                keep FP32 parameters, as autocast does, or FP32 master weights).
        """
        import torch

        self._require_scaled("unscale_(optimizer)")
        state = self._optimizers.setdefault(id(optimizer), _OptimizerState())
        if state.stage is OptimizerStage.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update()")
        if state.stage is OptimizerStage.STEPPED:
            raise RuntimeError("unscale_() is being called after step(): unscale before "
                               "stepping, then call update()")
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if any(gr.dtype == torch.float16 for gr in grads):
            raise ValueError("cannot unscale FP16 gradients (their small values would flush to "
                             "zero): give the optimizer FP32 parameters (autocast keeps them) "
                             "or FP32 master weights")
        found = None
        if grads:
            by_key: dict[tuple, list] = {}
            for gr in grads:
                by_key.setdefault((gr.device, gr.dtype), []).append(gr)
            flags = []
            # like torch: the reciprocal in float64, rounded to float32. Scales lie in
            # [2**-126, float32's max], so it never divides by zero or overflows; above 2**126 it
            # is a float32 subnormal, a cast that np.seterr(under="raise") would refuse
            with np.errstate(under="ignore"):
                inv_value = float(np.float32(np.float64(1.0) / np.float64(self._scale)))
            for (device, _), group in by_key.items():
                found_inf = torch.zeros((), dtype=torch.float32, device=device)
                inv = torch.full((), inv_value, dtype=torch.float32, device=device)
                torch._amp_foreach_non_finite_check_and_unscale_(group, found_inf, inv)
                flags.append(found_inf)
            found = bool(sum(float(f.item()) for f in flags))  # one host sync per device
        state.stage = OptimizerStage.UNSCALED
        state.found_inf = found
        return bool(found)

    def step(self, optimizer, *args, **kwargs):
        """Returns the optimizer's return value, or None when the step is skipped for inf/NaN.

        Raises:
            RuntimeError: called before ``scale()`` this iteration, a second time for this
                optimizer since the last ``update()``, with a ``closure``, or for an optimizer
                none of whose parameters has a gradient.
        """
        if "closure" in kwargs:
            raise RuntimeError("step(optimizer, closure=...) is not supported: a closure would "
                               "recompute an unscaled loss; call scaler.scale(loss).backward() "
                               "yourself before step()")
        self._require_scaled("step(optimizer)")
        state = self._optimizers.setdefault(id(optimizer), _OptimizerState())
        if state.stage is OptimizerStage.STEPPED:
            raise RuntimeError("step() has already been called on this optimizer since the last "
                               "update(): call scaler.update() once after each step")
        if state.stage is OptimizerStage.READY:
            self.unscale_(optimizer)
        if state.found_inf is None:
            raise RuntimeError("no inf/NaN check was recorded for this optimizer: none of its "
                               "parameters has a gradient. Call scaler.scale(loss).backward() "
                               "on a loss that depends on them before step()")
        retval = None if state.found_inf else optimizer.step(*args, **kwargs)
        state.stage = OptimizerStage.STEPPED
        return retval

    def history_frame(self):
        """Returns the history as a pandas DataFrame, one row per step."""
        return events_frame(self.history)


class StaticLossScaler(_LossScalerBase):
    """A fixed loss scale S: steps with inf/NaN gradients are skipped, S never changes.

    Args:
        scale: the factor S the loss is multiplied by (finite, > 0; held in float32).
    """

    def __init__(self, scale: float = 2.0**10):
        super().__init__(check_scale("scale", scale))

    def _next_scale(self, found_inf: bool) -> float:
        return self._scale

    def __repr__(self) -> str:
        return f"StaticLossScaler(scale={self._scale!r})"


class DynamicLossScaler(_LossScalerBase):
    """A dynamic loss scale following torch.amp.GradScaler's rule, with an optional floor/ceiling.

    The algorithm (see the module docstring for the exact float32 arithmetic):
    start at ``init_scale``; on a step whose gradients hold inf/NaN, skip the step, multiply the
    scale by ``backoff_factor`` and reset the clean-step counter; after ``growth_interval``
    consecutive clean steps multiply it by ``growth_factor`` (unless that overflows float32) and
    reset the counter. ``min_scale``/``max_scale`` clamp backoffs and growths (Apex's floor and
    ceiling; torch has neither, and with both ``None`` this scaler matches torch exactly while
    the scale stays within float32's normal range). A backoff never goes below
    :data:`~fp16lab.scaling.settings.MIN_SCALE` (2**-126) either: below it torch's scale
    reaches 0 or a reciprocal of inf, and its next step applies NaN or inf gradients.

    Args:
        init_scale: first scale (default ``2**16``; from 2**-126 to float32's max).
        growth_factor: multiplier after ``growth_interval`` clean steps (default 2.0; must be > 1).
        backoff_factor: multiplier after an inf/NaN step (default 0.5; must be in [2**-126, 1)).
        growth_interval: clean steps between growths (default 2000; an integer >= 1).
        min_scale: floor for backoffs, or None (torch's behaviour, except that the scale never
            goes below 2**-126).
        max_scale: ceiling for growths, or None (torch's behaviour: only float32's max).
        collapse_halvings: warn with :class:`ScaleCollapseWarning` after this many backoffs in a
            row (default 12, a factor 4096 for backoff 0.5); the scale falling below 1 warns too.
    """

    def __init__(self, init_scale: float = DEFAULT_INIT_SCALE,
                 growth_factor: float = DEFAULT_GROWTH_FACTOR,
                 backoff_factor: float = DEFAULT_BACKOFF_FACTOR,
                 growth_interval: int = DEFAULT_GROWTH_INTERVAL,
                 min_scale: float | None = None, max_scale: float | None = None,
                 collapse_halvings: int = 12):
        init = check_scale("init_scale", init_scale)
        growth_factor = check_growth_factor(growth_factor)
        backoff_factor = check_backoff_factor(backoff_factor)
        growth_interval = check_growth_interval(growth_interval)
        lo = None if min_scale is None else check_scale("min_scale", min_scale)
        hi = None if max_scale is None else check_scale("max_scale", max_scale)
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"min_scale must be <= max_scale, got {min_scale!r} > {max_scale!r}")
        if (lo is not None and init < lo) or (hi is not None and init > hi):
            raise ValueError(f"init_scale must lie within [min_scale, max_scale] = "
                             f"[{min_scale}, {max_scale}], got {init_scale!r}")
        if isinstance(collapse_halvings, bool) or not isinstance(collapse_halvings, int) \
                or collapse_halvings < 1:
            raise ValueError(f"collapse_halvings must be an integer >= 1, "
                             f"got {collapse_halvings!r}")
        super().__init__(init)
        self.init_scale = init
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.min_scale = lo
        self.max_scale = hi
        self.collapse_halvings = collapse_halvings
        self.growth_tracker = 0
        self._monitor = ScaleCollapseMonitor(collapse_halvings)

    def _next_scale(self, found_inf: bool) -> float:
        s = self._scale
        with np.errstate(over="ignore", under="ignore"):
            if found_inf:
                self.growth_tracker = 0
                s = f32(s * self.backoff_factor)
                floor = MIN_SCALE if self.min_scale is None else self.min_scale
                if s < floor:  # torch has no floor and would reach 0, then step with NaNs
                    s = floor
            else:
                self.growth_tracker += 1
                if self.growth_tracker == self.growth_interval:
                    self.growth_tracker = 0
                    grown = f32(s * self.growth_factor)
                    if math.isfinite(grown):  # torch: never grow to inf
                        s = grown
                    if self.max_scale is not None and s > self.max_scale:
                        s = self.max_scale  # Apex: min(max_scale, grown)
        return s

    def update(self, found_inf: bool | None = None) -> ScaleEvent:
        """Returns this step's event after the rule; warns if the scale collapses."""
        event = super().update(found_inf)
        self._monitor.observe(event, stacklevel=2)
        return event

    def __repr__(self) -> str:
        return (f"DynamicLossScaler(init_scale={self.init_scale!r}, growth_factor="
                f"{self.growth_factor!r}, backoff_factor={self.backoff_factor!r}, "
                f"growth_interval={self.growth_interval!r}, min_scale={self.min_scale!r}, "
                f"max_scale={self.max_scale!r})")


def simulate_dynamic(found_inf: Iterable[bool], **scaler_kwargs: Any) -> list[ScaleEvent]:
    """Returns the history of a :class:`DynamicLossScaler` fed a sequence of found_inf flags."""
    scaler = DynamicLossScaler(**scaler_kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScaleCollapseWarning)
        for f in found_inf:
            scaler.update(found_inf=bool(f))
    return scaler.history

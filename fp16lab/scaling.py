"""Loss scalers you can read: static, dynamic (torch.amp.GradScaler's rule), and a recorder.

Why scale at all: FP16's smallest subnormal is 2**-24 (about 6e-8). Gradients smaller than half of
that round to zero when they are stored in FP16, and the update they carried is lost. Multiplying
the loss by ``S`` multiplies every gradient by ``S`` (the chain rule is linear), lifting them out
of the underflow zone; dividing the FP32 gradients by ``S`` before the optimizer step undoes it.
Too large an ``S`` overflows (``|g| * S >= 65520`` becomes inf), so a dynamic scaler searches for
the largest ``S`` that does not overflow.

The dynamic rule, exactly as ``torch.amp.GradScaler`` applies it (``torch._amp_update_scale_``,
the same on CPU and CUDA), with the scale held in float32 and a step counter ``tracker``:

* gradients contain inf or NaN: skip the optimizer step, ``scale = float32(scale * backoff_factor)``
  and ``tracker = 0``;
* otherwise: step, ``tracker += 1``; when ``tracker == growth_interval``: ``tracker = 0`` and
  ``scale = float32(scale * growth_factor)`` unless that product is inf in float32, in which case
  the scale stays where it is.

(The products are taken in float64 and rounded once to float32, as torch's kernels do.)

torch has neither a floor nor a ceiling for the scale. Apex's scalers have both
(``min_loss_scale``, ``max_loss_scale``); here they are ``min_scale`` and ``max_scale``: a backoff
never goes below ``min_scale`` and a growth never goes above ``max_scale``. With both left at
``None`` the scalers follow torch bit for bit (``tests/test_scaling.py`` checks this against
``torch.amp.GradScaler`` itself).

Three classes:

* :class:`StaticLossScaler` - a fixed ``S``; skips steps whose gradients are not finite.
* :class:`DynamicLossScaler` - the rule above, optionally with an Apex-style floor and ceiling.
* :class:`GradScalerRecorder` - wraps a real ``torch.amp.GradScaler`` and keeps the same history.

All three keep ``history``, a list of :class:`ScaleEvent` (step, scale used, found_inf, skipped,
scale after the update), and share GradScaler's training-loop calls: ``scale(loss)``,
``unscale_(optimizer)``, ``step(optimizer)``, ``update()``. Our two scalers also take
``update(found_inf=...)`` directly, which is all the state machine needs. Like GradScaler, they
raise on calls out of order (``step`` without ``scale`` in the iteration, two ``step`` or two
``unscale_`` calls before ``update``) rather than step with gradients that are still scaled.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Iterable

import numpy as np

#: torch.amp.GradScaler's defaults, written out.
DEFAULT_INIT_SCALE = 2.0**16
DEFAULT_GROWTH_FACTOR = 2.0
DEFAULT_BACKOFF_FACTOR = 0.5
DEFAULT_GROWTH_INTERVAL = 2000

#: The growth counter is an int32 tensor in torch; a longer interval could never be reached.
MAX_GROWTH_INTERVAL = 2**31 - 1


@dataclass(frozen=True)
class ScaleEvent:
    """One optimizer iteration as a scaler saw it."""

    step: int
    scale: float        # the scale the loss was multiplied by at this step
    found_inf: bool     # the gradients held an inf or a NaN
    skipped: bool       # the optimizer step was skipped
    next_scale: float   # the scale after update(), used by the next step

    def as_dict(self) -> dict[str, Any]:
        """Returns the fields as a dict (one row of a history table)."""
        return asdict(self)


class ScaleCollapseWarning(UserWarning):
    """The dynamic loss scale fell below 1 or was halved many times in a row."""


COLLAPSE_CAUSES = (
    "the loss or activations are already inf/NaN in the forward pass (an FP16 overflow in a "
    "layer, e.g. exp/softmax/sum of squares without an FP32 island), so no scale can help; "
    "the learning rate is too high and training diverged; "
    "the model was pretrained in bf16 and its activations exceed FP16's range; "
    "the loss is computed in FP16 instead of FP32"
)


def _f32(x: float) -> float:
    """Returns x rounded to the nearest float32, as a Python float."""
    return float(np.float32(x))


def _check_scale_value(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}") from None
    with np.errstate(over="ignore"):
        v32 = _f32(v)
    if not math.isfinite(v32) or v32 <= 0:
        raise ValueError(f"{name} must be a finite positive number that fits in float32 "
                         f"(0 < {name} <= 3.4e38), got {value!r}")
    return v32


def _check_dynamic_params(growth_factor: float, backoff_factor: float,
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
        for check in (lambda: _check_scale_value("init_scale", self.init_scale),
                      lambda: _check_dynamic_params(self.growth_factor, self.backoff_factor,
                                                    self.growth_interval)):
            try:
                check()
            except ValueError as e:
                problems.append(str(e))
        if problems:
            raise ValueError("bad scaler settings: " + "; ".join(problems))


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
            # like torch: the reciprocal in float64, rounded to float32 (inf for a zero scale)
            with np.errstate(divide="ignore", over="ignore"):
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
        super().__init__(_check_scale_value("scale", scale))

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
    ceiling; torch has neither, and with both ``None`` this scaler matches torch exactly).

    Args:
        init_scale: first scale (default ``2**16``).
        growth_factor: multiplier after ``growth_interval`` clean steps (default 2.0; must be > 1).
        backoff_factor: multiplier after an inf/NaN step (default 0.5; must be in (0, 1)).
        growth_interval: clean steps between growths (default 2000; an integer >= 1).
        min_scale: floor for backoffs, or None (torch's behaviour: no floor).
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
        init = _check_scale_value("init_scale", init_scale)
        _check_dynamic_params(growth_factor, backoff_factor, growth_interval)
        lo = None if min_scale is None else _check_scale_value("min_scale", min_scale)
        hi = None if max_scale is None else _check_scale_value("max_scale", max_scale)
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
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
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
                s = _f32(s * self.backoff_factor)
                if self.min_scale is not None and s < self.min_scale:
                    s = self.min_scale
            else:
                self.growth_tracker += 1
                if self.growth_tracker == self.growth_interval:
                    self.growth_tracker = 0
                    grown = _f32(s * self.growth_factor)
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


def events_frame(events: Iterable[ScaleEvent]):
    """Returns a list of ScaleEvents as a pandas DataFrame, one row per step."""
    import pandas as pd

    cols = ["step", "scale", "found_inf", "skipped", "next_scale"]
    return pd.DataFrame([e.as_dict() for e in events], columns=cols)


def replay_with_gradscaler(found_inf: Iterable[bool], device: str = "cpu",
                           **gradscaler_kwargs: Any) -> list[ScaleEvent]:
    """Returns the history of a real ``torch.amp.GradScaler`` fed gradients that are inf where
    ``found_inf`` is True and finite elsewhere (to compare with :func:`simulate_dynamic`)."""
    import torch

    p = torch.nn.Parameter(torch.zeros(1, device=device))
    opt = torch.optim.SGD([p], lr=0.0)
    rec = GradScalerRecorder(torch.amp.GradScaler(device, **gradscaler_kwargs))
    rec.scale(torch.ones((), device=device))  # creates the scale tensor
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScaleCollapseWarning)
        for bad in found_inf:
            p.grad = torch.full((1,), math.inf if bad else 1.0, device=device)
            rec.step(opt)
            rec.update()
    return rec.history


class ScaleCollapseMonitor:
    """Watches scale events and warns (:class:`ScaleCollapseWarning`) when the scale collapses.

    It warns once when the scale used drops below 1, and once per run of ``halvings`` consecutive
    backoffs (a single long run warns once, not at every further backoff).
    """

    def __init__(self, halvings: int = 12):
        if isinstance(halvings, bool) or not isinstance(halvings, int) or halvings < 1:
            raise ValueError(f"halvings must be an integer >= 1, got {halvings!r}")
        self.halvings = halvings
        self.consecutive_backoffs = 0
        self.warned_below_one = False
        self.warnings: list[str] = []

    def observe(self, event: ScaleEvent, stacklevel: int = 2) -> None:
        """Updates the counters with one event and warns if the scale is collapsing."""
        self.consecutive_backoffs = self.consecutive_backoffs + 1 if event.found_inf else 0
        msg = None
        if self.consecutive_backoffs == self.halvings:
            msg = (f"loss scale backed off {self.halvings} steps in a row (now "
                   f"{event.next_scale:.3g} at step {event.step}); every one of those steps was "
                   f"skipped")
        elif event.next_scale < 1.0 and not self.warned_below_one:
            self.warned_below_one = True
            msg = (f"loss scale fell below 1 ({event.next_scale:.3g} at step {event.step}): "
                   f"the gradients overflow FP16 even unscaled")
        if msg:
            full = f"{msg}. Likely causes: {COLLAPSE_CAUSES}."
            self.warnings.append(full)
            warnings.warn(full, ScaleCollapseWarning, stacklevel=stacklevel + 1)


class GradScalerRecorder:
    """Wraps a real ``torch.amp.GradScaler`` and records a :class:`ScaleEvent` per ``update()``.

    Use it exactly like the GradScaler it wraps::

        rec = GradScalerRecorder(torch.amp.GradScaler("cuda"))
        rec.scale(loss).backward(); rec.step(optimizer); rec.update()
        rec.history_frame()   # step, scale, found_inf, skipped, next_scale

    Recording costs one extra host read of the scale and the inf flags per step (GradScaler's
    ``step`` already synchronises once to decide whether to skip).

    Args:
        scaler: the GradScaler to wrap.
        collapse_halvings: see :class:`DynamicLossScaler`.
    """

    def __init__(self, scaler, collapse_halvings: int = 12):
        self.scaler = scaler
        self.history: list[ScaleEvent] = []
        self._monitor = ScaleCollapseMonitor(collapse_halvings)
        self._step = 0

    def scale(self, loss):
        """Returns the scaled loss (GradScaler.scale)."""
        return self.scaler.scale(loss)

    def unscale_(self, optimizer) -> None:
        """Unscales the optimizer's gradients in place (GradScaler.unscale_)."""
        self.scaler.unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        """Returns what GradScaler.step returns."""
        return self.scaler.step(optimizer, *args, **kwargs)

    def get_scale(self) -> float:
        """Returns the current scale."""
        return self.scaler.get_scale()

    def _found_inf(self) -> bool:
        states = getattr(self.scaler, "_per_optimizer_states", {})
        flags = [f for st in states.values() for f in st.get("found_inf_per_device", {}).values()]
        return bool(sum(float(f.item()) for f in flags))

    def update(self, new_scale=None) -> ScaleEvent:
        """Returns this step's event after GradScaler.update(); warns if the scale collapses."""
        used = self.scaler.get_scale()
        found = self._found_inf()
        self.scaler.update(new_scale)
        event = ScaleEvent(self._step, used, found, found, self.scaler.get_scale())
        self.history.append(event)
        self._step += 1
        self._monitor.observe(event, stacklevel=2)
        return event

    def history_frame(self):
        """Returns the history as a pandas DataFrame, one row per step."""
        return events_frame(self.history)


def classify_skips(history: list[ScaleEvent], warmup_steps: int | None = None) -> dict[str, Any]:
    """Returns whether a run's skipped steps look like harmless warm-up or a real problem.

    Warm-up skips are the scale calibrating down from a too-large ``init_scale``: a run of
    consecutive skips from step 0, after which skips are rare (about one per growth interval, when
    the scale grows one step too far). A problem looks different: no step ever succeeds, skips
    keep coming after the warm-up or come in runs, or the scale falls below 1.

    Args:
        history: the scaler's events.
        warmup_steps: how many leading skips count as warm-up (default: the leading run).

    Returns:
        dict with ``warmup_skips``, ``later_skips``, ``later_skip_rate``, ``longest_later_run``,
        ``min_scale``, and ``verdict`` ("no skips", "warm-up only", "occasional" or "problem").
    """
    skipped = [e.skipped for e in history]
    lead = 0
    while lead < len(skipped) and skipped[lead]:
        lead += 1
    if warmup_steps is not None:
        lead = min(lead, warmup_steps)
    later = skipped[lead:]
    longest = run = 0
    for s in later:
        run = run + 1 if s else 0
        longest = max(longest, run)
    n_later = sum(later)
    rate = n_later / len(later) if later else 0.0
    min_scale = min((e.next_scale for e in history), default=float("nan"))
    if not any(skipped):
        verdict = "no skips"
    elif lead == len(skipped) or min_scale < 1.0:
        verdict = "problem"  # never a clean step, or a scale too small to be a calibration
    elif n_later == 0:
        verdict = "warm-up only"
    elif longest <= 2 and rate <= 0.01 and min_scale >= 1.0:
        verdict = "occasional"
    else:
        verdict = "problem"
    return {"warmup_skips": lead, "later_skips": n_later, "later_skip_rate": rate,
            "longest_later_run": longest, "min_scale": min_scale, "verdict": verdict}

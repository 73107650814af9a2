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
``torch.amp.GradScaler`` itself) as long as the scale stays at or above float32's smallest
normal number, 2**-126 (``MIN_SCALE``). Below it torch's scale becomes subnormal and then 0,
its reciprocal inf, and GradScaler steps with inf or NaN gradients (it checks the gradients
before it unscales them); here no scale below ``MIN_SCALE`` is accepted and a backoff stops
there.

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

The package, one idea per module: :mod:`~fp16lab.scaling.settings` (the defaults and
:class:`ScalerSettings`), :mod:`~fp16lab.scaling.scalers` (the two scalers),
:mod:`~fp16lab.scaling.recorder` (the GradScaler recorder), :mod:`~fp16lab.scaling.events`
(the history and the collapse warning) and :mod:`~fp16lab.scaling.skips` (reading the skips).
"""

from .events import (COLLAPSE_CAUSES, ScaleCollapseMonitor, ScaleCollapseWarning, ScaleEvent,
                     events_frame)
from .recorder import GradScalerRecorder, replay_with_gradscaler
from .scalers import DynamicLossScaler, OptimizerStage, StaticLossScaler, simulate_dynamic
from .settings import (DEFAULT_BACKOFF_FACTOR, DEFAULT_GROWTH_FACTOR, DEFAULT_GROWTH_INTERVAL,
                       DEFAULT_INIT_SCALE, MAX_GROWTH_INTERVAL, MIN_BACKOFF_FACTOR, MIN_SCALE,
                       ScalerSettings)
from .skips import classify_skips

__all__ = ["COLLAPSE_CAUSES", "DEFAULT_BACKOFF_FACTOR", "DEFAULT_GROWTH_FACTOR",
           "DEFAULT_GROWTH_INTERVAL", "DEFAULT_INIT_SCALE", "MAX_GROWTH_INTERVAL",
           "MIN_BACKOFF_FACTOR", "MIN_SCALE",
           "DynamicLossScaler", "GradScalerRecorder", "OptimizerStage", "ScaleCollapseMonitor",
           "ScaleCollapseWarning", "ScaleEvent", "ScalerSettings", "StaticLossScaler",
           "classify_skips", "events_frame", "replay_with_gradscaler", "simulate_dynamic"]

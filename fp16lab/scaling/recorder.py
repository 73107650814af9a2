"""A real torch.amp.GradScaler with the same history as fp16lab's scalers, and a replay of
found_inf flags through one."""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable

from .events import ScaleCollapseMonitor, ScaleCollapseWarning, ScaleEvent, events_frame


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

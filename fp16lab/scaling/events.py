"""What a scaler records: one :class:`ScaleEvent` per iteration, as a table, and the warning
when the scale collapses."""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any, Iterable

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


def events_frame(events: Iterable[ScaleEvent]):
    """Returns a list of ScaleEvents as a pandas DataFrame, one row per step."""
    import pandas as pd

    cols = ["step", "scale", "found_inf", "skipped", "next_scale"]
    return pd.DataFrame([e.as_dict() for e in events], columns=cols)


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

"""What every check of the doctor reads: the :class:`Visit` (the workload's probe, the
starting configuration, what earlier checks found) and the thresholds they share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..recipes import PRECISIONS
from .numerics import ModuleNumerics, module_numerics
from .probe import Config, Measurement, Probe

#: A measured ratio counts as a gain only above 1 + NOISE.
NOISE = 0.03
#: A larger batch is recommended only for a gain above this: it changes the optimisation.
BATCH_GAIN = 0.10
#: Share of non-zero gradient values FP16 may flush at the reached scale before it is a finding.
UNDERFLOW_SHARE = 0.01
#: A module's autocast output is precision-sensitive above this relative error...
SENSITIVE_ERROR = 0.05
#: ...and wrong (training in the start configuration is broken there) above this one.
BROKEN_ERROR = 0.5
#: The GPU's idle share of a step above which the step is launch-bound.
IDLE_SHARE = 0.30


class Unchecked(Exception):
    """A check that cannot run here; the message says why."""


@dataclass
class Visit:
    """What every check reads: the probe, the starting configuration and what is found so far."""

    probe: Probe
    start: Config
    numerics: list[ModuleNumerics] | None = None
    best: Config | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.probe.device.type == "cuda"

    def baseline(self) -> Measurement:
        return self.probe.measure(self.start)

    def gain(self, after: Measurement, before: Measurement | None = None) -> float | None:
        before = before or self.baseline()
        if not (after.ran and before.ran):
            return None
        return after.samples_per_s / before.samples_per_s

    def fastest_gain(self, tried: list[Measurement], before: Measurement,
                     threshold: float) -> tuple[Measurement, float] | None:
        """Returns the fastest of ``tried`` and its gain over ``before``, where that gain is at
        least ``1 + threshold``; else None."""
        tried = [m for m in tried if m.ran]
        if not tried:
            return None
        best = max(tried, key=lambda m: m.samples_per_s)
        gain = self.gain(best, before)
        return (best, gain) if gain is not None and gain >= 1 + threshold else None

    def low_precision(self) -> str:
        """The autocast precision the numeric checks take: the start's, else amp-fp16."""
        p = PRECISIONS[self.start.precision]
        return self.start.precision if p.autocast_dtype and p.autocast_recipe else "amp-fp16"

    def module_numerics(self) -> list[ModuleNumerics]:
        if self.numerics is None:
            self.numerics = module_numerics(self.probe.workload_for(self.start.but(
                fp32_modules=())), self.probe.device, self.probe.batch_size,
                low=self.low_precision(), init_scale=self.start.init_scale or 2.0**16)
        return self.numerics



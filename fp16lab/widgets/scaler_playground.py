"""ScalerPlayground: move the dynamic loss scaler's knobs and watch the scale trajectory redraw.

Sliders for ``init_scale`` (as log2), ``growth_factor``, ``backoff_factor``, ``growth_interval``
and the rate of overflowing steps. Each redraw simulates :class:`~fp16lab.scaling.DynamicLossScaler`
over ``steps`` steps of a synthetic gradient stream: the largest gradient of a step is
``2**(grad_log2_max + noise)``; the step overflows when ``scale * max|g| >= 65520`` (FP16's
overflow point) or, with probability ``overflow rate``, because of a random spike (a bad batch).
The plot (a PNG in an ``ipywidgets.Image``, CSS class ``fp16lab-scaler-plot``) shows the scale
used at each step, the skipped steps, and the scale FP16 could have afforded.

A scale that is too small costs too: each step's gradient is ``n_values`` magnitudes spread below
its largest one (``log2`` offsets ``-|N(0, spread)|``, drawn once), and the panel counts the
share of them that ``scale * g`` flushes to zero in FP16 (a second axis, in percent). Too large
a scale skips steps; too small a scale silently loses gradient.

Stable CSS classes for browser tests: ``fp16lab-slider-init-scale``,
``fp16lab-slider-growth-factor``, ``fp16lab-slider-backoff-factor``,
``fp16lab-slider-growth-interval``, ``fp16lab-slider-overflow-rate``, ``fp16lab-scaler-plot``,
``fp16lab-scaler-summary`` and ``fp16lab-scaler-playground`` on the panel.
"""

from __future__ import annotations

import io
import math

import ipywidgets as w
import numpy as np

from .. import validate
from ..scaling import DynamicLossScaler, ScaleCollapseWarning

FP16_OVERFLOW_AT = 65520.0


class ScalerPlayground(w.VBox):
    """An ipywidgets panel simulating a dynamic loss scaler under the sliders' settings.

    Args:
        steps: simulated steps per redraw.
        grad_log2_max: log2 of the typical largest gradient magnitude of a step.
        noise: standard deviation of that log2 from step to step.
        seed: seed of the synthetic gradient stream (the same stream for every redraw).

    Attributes:
        trajectory: the scale used at each step of the last simulation (numpy float64 array).
        found_inf: whether each step overflowed.
        underflow: the share of each step's gradient values that the scale left at zero in FP16.
        redraws: how many times the plot was drawn.
        sliders: dict name -> slider widget.
    """

    def __init__(self, steps: int = 600, grad_log2_max: float = -4.0, noise: float = 0.5,
                 seed: int = 0, spread: float = 10.0, n_values: int = 2048, **kwargs):
        steps = validate.count("steps", steps)
        n_values = validate.count("n_values", n_values)
        spread = validate.number("spread", spread, low=0)  # in binades
        grad_log2_max = validate.number("grad_log2_max", grad_log2_max)
        noise = validate.number("noise", noise, low=0)
        seed = validate.count("seed", seed, low=0)
        self.steps = steps
        rng = np.random.default_rng(seed)
        self._log2_gmax = grad_log2_max + noise * rng.standard_normal(steps)
        self._uniform = rng.random(steps)
        self._log2_offsets = -np.abs(spread * rng.standard_normal(n_values))
        self.redraws = 0
        style = {"description_width": "150px"}
        lay = w.Layout(width="520px")
        self.sliders = {
            "init-scale": w.IntSlider(16, 0, 30, description="log2 init_scale", style=style,
                                      layout=lay, continuous_update=False),
            "growth-factor": w.FloatSlider(2.0, min=1.05, max=4.0, step=0.05,
                                           description="growth_factor", style=style, layout=lay,
                                           continuous_update=False),
            "backoff-factor": w.FloatSlider(0.5, min=0.05, max=0.95, step=0.05,
                                            description="backoff_factor", style=style,
                                            layout=lay, continuous_update=False),
            "growth-interval": w.IntSlider(50, 1, 1000, description="growth_interval",
                                           style=style, layout=lay, continuous_update=False),
            "overflow-rate": w.FloatSlider(0.002, min=0.0, max=0.3, step=0.005,
                                           description="spike rate", style=style, layout=lay,
                                           readout_format=".3f", continuous_update=False),
        }
        for name, s in self.sliders.items():
            s.add_class(f"fp16lab-slider-{name}")
            s.observe(self._on_change, names="value")
        self.plot = w.Image(format="png", layout=w.Layout(width="720px"))
        self.plot.add_class("fp16lab-scaler-plot")
        self.summary = w.HTML()
        self.summary.add_class("fp16lab-scaler-summary")
        super().__init__([*self.sliders.values(), self.summary, self.plot], **kwargs)
        self.add_class("fp16lab-scaler-playground")
        self.trajectory = np.zeros(0)
        self.found_inf = np.zeros(0, dtype=bool)
        self._redraw()

    # -- model ---------------------------------------------------------------------------------
    def params(self) -> dict[str, float]:
        """Returns the DynamicLossScaler arguments the sliders set now."""
        s = self.sliders
        return {"init_scale": 2.0 ** s["init-scale"].value,
                "growth_factor": float(s["growth-factor"].value),
                "backoff_factor": float(s["backoff-factor"].value),
                "growth_interval": int(s["growth-interval"].value)}

    def simulate(self) -> DynamicLossScaler:
        """Returns a DynamicLossScaler run over the synthetic gradient stream."""
        import warnings

        scaler = DynamicLossScaler(**self.params())
        rate = float(self.sliders["overflow-rate"].value)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScaleCollapseWarning)
            for t in range(self.steps):
                overflow = math.log2(scaler.scale_value) + self._log2_gmax[t] >= math.log2(
                    FP16_OVERFLOW_AT)
                spike = self._uniform[t] < rate
                scaler.update(found_inf=bool(overflow or spike))
        return scaler

    def gradients(self, step: int) -> np.ndarray:
        """Returns the float64 gradient magnitudes of ``step`` (before scaling)."""
        return np.exp2(self._log2_gmax[step] + self._log2_offsets)

    def underflow_fraction(self, scales: np.ndarray) -> np.ndarray:
        """Returns, per step, the share of ``scale * g`` that is zero in FP16."""
        scaled = np.exp2(self._log2_gmax[:, None] + self._log2_offsets[None, :]) * \
            np.asarray(scales, dtype=np.float64)[:, None]
        return (scaled.astype(np.float16) == 0).mean(axis=1)

    # -- drawing -------------------------------------------------------------------------------
    def _on_change(self, _change) -> None:
        self._redraw()

    def _redraw(self) -> None:
        scaler = self.simulate()
        hist = scaler.history
        self.trajectory = np.array([e.scale for e in hist], dtype=np.float64)
        self.found_inf = np.array([e.found_inf for e in hist], dtype=bool)
        with np.errstate(over="ignore"):  # inf where the step overflows: not counted as lost
            self.underflow = self.underflow_fraction(self.trajectory)
        self.plot.value = self._render()
        n_skip = int(self.found_inf.sum())
        taken = ~self.found_inf
        lost = 100 * float(self.underflow[taken].mean()) if taken.any() else 0.0
        self.summary.value = (f"<b>{n_skip}</b> of {self.steps} steps skipped "
                              f"({100 * n_skip / self.steps:.1f}%); on the steps taken, "
                              f"<b>{lost:.1f}%</b> of gradient values lost to underflow; final "
                              f"scale 2^{math.log2(max(scaler.scale_value, 1e-45)):.1f}")
        self.redraws += 1

    def _render(self) -> bytes:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        fig = Figure(figsize=(8, 3.8), dpi=90)
        ax = fig.add_subplot()
        steps = np.arange(self.steps)
        ax.plot(steps, np.log2(np.maximum(self.trajectory, 1e-45)), lw=1.5,
                label="log2 scale used")
        ceiling = math.log2(FP16_OVERFLOW_AT) - self._log2_gmax
        ax.plot(steps, ceiling, color="0.6", lw=0.8, label="largest scale without overflow")
        skipped = steps[self.found_inf]
        ax.scatter(skipped, np.log2(np.maximum(self.trajectory[self.found_inf], 1e-45)),
                   color="C3", s=12, zorder=3, label="skipped step")
        ax.set_xlabel("step")
        ax.set_ylabel("log2 scale")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole steps and exponents
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        lost = ax.twinx()
        lost.plot(steps, 100 * self.underflow, color="C2", lw=1.0,
                  label="% of gradient lost to underflow")
        lost.set_ylabel("% lost to underflow", color="C2")
        lost.set_ylim(0, 100)
        handles = ax.get_legend_handles_labels()
        extra = lost.get_legend_handles_labels()
        ax.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=7, loc="upper center",
                  bbox_to_anchor=(0.5, -0.18), ncol=4)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()

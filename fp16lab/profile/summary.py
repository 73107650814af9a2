"""Where one lane's time went in a window: busy time, idle fraction and the time of each kind."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from .intervals import busy_us, intervals, window_of
from .trace import KINDS


@dataclass(frozen=True)
class GpuTimeSummary:
    """Where the device's time went in a window of a trace."""

    window_us: float
    busy_us: float
    idle_fraction: float
    kernel_us: float
    by_kind: pd.DataFrame = field(repr=False)
    lane: str = "gpu"

    def as_dict(self) -> dict[str, Any]:
        """Returns the figures as a flat dict (per-kind totals as ``<kind>_us``)."""
        out = {"window_us": self.window_us, "busy_us": self.busy_us,
               "idle_fraction": self.idle_fraction, "kernel_us": self.kernel_us, "lane": self.lane}
        for kind, row in self.by_kind.iterrows():
            out[f"{kind}_us"] = float(row["total_us"])
        return out


def gpu_time_summary(events: pd.DataFrame, window: tuple[float, float] | None = None,
                     *, lane: str = "gpu") -> GpuTimeSummary:
    """Returns where the time of one lane went: per kind, busy time and idle fraction.

    Args:
        events: a table from :func:`read_trace`.
        window: (start_us, end_us) to measure in; by default from the lane's first event to
            its last. Events are clipped to it.
        lane: 'gpu' (kernels, copies); 'cpu' summarises the top-level CPU operators instead,
            which is what a trace without a GPU has.
    """
    if lane not in ("gpu", "cpu"):
        raise ValueError(f"lane must be 'gpu' or 'cpu', got {lane!r}")
    ev = events[events["lane"] == lane]
    if lane == "cpu":
        ev = ev[ev["top_level"].astype(bool)]
    if ev.empty:
        raise ValueError(f"the trace has no {lane} events to summarise"
                         + (" (was it profiled on a machine without a GPU? use lane='cpu')"
                            if lane == "gpu" else ""))
    intervals(ev["start_us"], ev["end_us"])  # finite, and no event ends before it starts
    if window is None:
        window = (float(ev["start_us"].min()), float(ev["end_us"].max()))
    lo, hi = window_of(window)
    clipped_start = ev["start_us"].clip(lower=lo, upper=hi)
    clipped_end = ev["end_us"].clip(lower=lo, upper=hi)
    dur = clipped_end - clipped_start
    busy = busy_us(clipped_start, clipped_end)
    table = (pd.DataFrame({"kind": ev["kind"], "dur": dur})
             .groupby("kind")["dur"].agg(["count", "sum"])
             .rename(columns={"count": "n", "sum": "total_us"}))
    table = table.reindex([k for k in KINDS if k in table.index])
    kernel_total = float(dur.sum())
    table["share"] = table["total_us"] / kernel_total if kernel_total > 0 else 0.0
    return GpuTimeSummary(window_us=hi - lo, busy_us=busy, idle_fraction=1.0 - busy / (hi - lo),
                          kernel_us=kernel_total, by_kind=table, lane=lane)

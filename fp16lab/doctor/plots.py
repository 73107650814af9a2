"""The doctor's plot: samples/s of every configuration it measured, the start and the
combined configuration marked."""

from __future__ import annotations

from typing import Any


def plot_speed(report: Any, ax: Any = None) -> Any:
    """Returns a figure: one bar per measured configuration (samples/s), the starting one grey,
    the combined one dark; runs whose loss is not finite are hatched."""
    if ax is None:
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 0.32 * max(len(report.measurements), 3) + 1))
    else:
        fig = ax.figure
    ms = [m for m in report.measurements if m.ran]
    labels = [f"{m.label or m.config.describe()} (b{m.batch_size})" for m in ms]
    values = [m.samples_per_s for m in ms]
    start = report.baseline.label if report.baseline and report.baseline.label else None
    combined = report.combined.label if report.combined and report.combined.label else None

    def color(m: Any) -> str:
        if (m.label == start) if start else m.config == report.start:
            return "0.6"
        if report.combined is not None and ((m.label == combined) if combined else
                                            m.config == report.combined.config):
            return "#1f3b73"
        return "#6c9bd2"

    colors = [color(m) for m in ms]
    bars = ax.barh(range(len(ms)), values, color=colors)
    for bar, m in zip(bars, ms):
        if not m.finite:
            bar.set_hatch("//")
    ax.set_yticks(range(len(ms)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("samples/s (grey: the start; dark: all changes together; hatched: loss not "
                  "finite)")
    ax.set_title(f"{report.workload} on {report.device}", fontsize=10)
    return fig

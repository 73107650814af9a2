"""A trace's events drawn as a timeline: the CPU lane above the GPU lane, coloured by kind."""

from __future__ import annotations

from typing import Any

import pandas as pd

from .trace import KINDS

#: Colours of the host's CUDA calls on the CPU lane: kernel launches and waits for the GPU.
_HOST_COLOURS = {"launch": "black", "sync": "#e377c2"}


def plot_timeline(events: pd.DataFrame, *, window: tuple[float, float] | None = None,
                  ax: Any = None, title: str = "") -> Any:
    """Returns a matplotlib Axes with the CPU lane above the GPU lane, events coloured by kind.

    The CPU lane shows top-level operators (coloured by kind), kernel launches (black) and waits
    for the GPU (pink); the GPU lane shows kernels and copies. White space in the GPU lane is
    time the device sat idle. Each kind is drawn with one ``broken_barh`` call, so thousands of
    kernels draw in well under a second.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(11, 2.6))
    ev = events
    if window is not None:
        lo, hi = window
        ev = ev[(ev["end_us"] > lo) & (ev["start_us"] < hi)]
    host_calls = ev["kind"].isin(["launch", "sync"])
    lanes = [("CPU", (ev["lane"] == "cpu") & (ev["top_level"].astype(bool) | host_calls), 1.0),
             ("GPU", ev["lane"] == "gpu", 0.0)]
    origin = float(window[0]) if window is not None else 0.0
    used = set()
    for _, mask, y in lanes:
        sub = ev[mask]
        for kind, group in sub.groupby("kind"):
            colour = KINDS.get(kind, _HOST_COLOURS.get(kind, "black"))
            spans = list(zip((group["start_us"] - origin) / 1e3, group["dur_us"] / 1e3))
            ax.broken_barh(spans, (y + 0.1, 0.8), facecolors=colour, linewidth=0)
            used.add(kind)
    ax.set_yticks([0.5, 1.5])
    ax.set_yticklabels(["GPU", "CPU"])
    ax.set_ylim(0, 2)
    ax.set_xlabel("time (ms)")
    if window is not None:
        ax.set_xlim(0, (window[1] - window[0]) / 1e3)
    handles = [Patch(color=c, label=k) for k, c in {**KINDS, **_HOST_COLOURS}.items() if k in used]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    if title:
        ax.set_title(title)
    return ax

"""Reading what the gradient monitor costs, from the ``diagnostics_overhead`` benchmark's result file."""

from __future__ import annotations

from typing import Any


def overhead_summary(result: dict[str, Any]):
    """Returns a DataFrame from a ``diagnostics_overhead`` result: per device, model and
    statistics backend, the median step time without and with the hooks, the overhead in %,
    and where it was measured."""
    import pandas as pd

    rows = pd.DataFrame(result["rows"])
    out = []
    for (device, model), g in rows.groupby(["device", "model"], sort=False):
        off = g[g.variant == "hooks off"].iloc[0]
        for _, on in g[g.variant.str.startswith("hooks on")].iterrows():
            backend = on.get("monitor_backend")
            out.append({"device": device, "device_name": off.device_name, "model": model,
                        "batch": int(off.batch), "amp": bool(off.amp),
                        "backend": backend if isinstance(backend, str) else "",
                        "off_ms": off.median_ms, "on_ms": on.median_ms,
                        "overhead_pct": on.overhead_pct,
                        "overhead_p10_pct": on.get("overhead_p10_pct", float("nan")),
                        "torch": off.torch})
    return pd.DataFrame(out)

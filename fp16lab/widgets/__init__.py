"""ipywidgets panels for the notebooks (JupyterLab 4, ipywidgets 8).

Each panel lives in its own module and is imported on first use, so importing
``fp16lab.widgets`` stays cheap.
"""

from __future__ import annotations

import importlib

_PANELS = {
    "BitExplorer": "fp16lab.widgets.bit_explorer",
    "ScalerPlayground": "fp16lab.widgets.scaler_playground",
    "SweepPanel": "fp16lab.widgets.sweep_panel",
}

__all__ = list(_PANELS)


def __getattr__(name: str):
    if name in _PANELS:
        return getattr(importlib.import_module(_PANELS[name]), name)
    raise AttributeError(f"module 'fp16lab.widgets' has no attribute {name!r}")

"""FP32 islands: running one layer outside autocast, and a measured demonstration of why casting matters."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .. import validate
from .locator import _tensors


class FP32Island(nn.Module):
    """Runs a wrapped module in FP32 inside an autocast region, done correctly.

    Disabling autocast is not enough: tensors arriving from autocast regions are already FP16,
    and with autocast off an op simply runs in its inputs' dtype. So the island disables
    autocast *and* casts floating inputs to float32.
    """

    def __init__(self, inner: nn.Module, cast_inputs: bool = True):
        super().__init__()
        self.inner = inner
        self.cast_inputs = validate.boolean("cast_inputs", cast_inputs)

    def forward(self, *args, **kwargs):
        dev = next((t.device.type for t in _tensors((*args, *kwargs.values()))), "cpu")
        with torch.autocast(device_type=dev, enabled=False):
            if self.cast_inputs:
                args = tuple(_fp32(a) for a in args)
                kwargs = {k: _fp32(v) for k, v in kwargs.items()}
            return self.inner(*args, **kwargs)


def _fp32(value):
    return value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


class Gram(nn.Module):
    """Returns x @ x^T: unnormalised attention-like scores, a classic FP16 overflow."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ x.transpose(-1, -2)


def fp32_island_demo(device: str = "cpu", width: int = 256, level: float = 20.0
                     ) -> "Any":
    """Returns a DataFrame comparing a precision-sensitive layer under FP16 autocast three ways.

    A linear layer (autocast: FP16) feeds :class:`Gram`, whose entries (``~ level**2 * width``)
    exceed FP16's 65504. Rows: no island; autocast disabled but inputs left in FP16 (the common
    mistake); :class:`FP32Island` (disabled and cast). Columns: the output dtype, how many outputs
    are inf, and the relative error against a float64 reference.
    """
    import pandas as pd

    device = validate.device("device", device)
    width = validate.count("width", width)
    level = validate.number("level", level, low=0, low_open=True)
    torch.manual_seed(0)
    lin = nn.Linear(width, width, device=device)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(width, device=device))
        lin.bias.zero_()
    x = level + torch.randn(8, width, device=device)
    with torch.no_grad():
        ref = Gram()(lin.double()(x.double())).float()
    lin.float()
    variants = {"no island (FP16 matmul)": Gram(),
                "autocast off, inputs still FP16": FP32Island(Gram(), cast_inputs=False),
                "FP32 island (off + cast to FP32)": FP32Island(Gram(), cast_inputs=True)}
    rows = []
    for name, layer in variants.items():
        with torch.no_grad(), torch.autocast(device, dtype=torch.float16):
            h = lin(x)
            out = layer(h)
        o = out.float()
        fin = torch.isfinite(o)
        err = float(((o - ref).norm() / ref.norm())) if bool(fin.all()) else math.inf
        rows.append({"variant": name, "input_dtype": str(h.dtype).replace("torch.", ""),
                     "output_dtype": str(out.dtype).replace("torch.", ""),
                     "n_inf": int((~fin).sum()), "numel": o.numel(), "rel_error": err})
    return pd.DataFrame(rows)

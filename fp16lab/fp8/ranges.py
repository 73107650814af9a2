"""Where a model's activations and gradients land in e4m3 / e5m2 after scaling at each granularity.

``capture_linear_tensors`` records, for every ``nn.Linear`` of a model, the input it multiplies
(an activation, cast to e4m3 in FP8 training) and the gradient of its output (cast to e5m2),
over one forward and backward pass. ``granularity_census`` scales each tensor as the FP8 cast
would (no scale, or current scaling per tensor, row or tile) and counts with
:func:`fp16lab.census.census` how much underflows, lands among the subnormals, or saturates.
"""

from __future__ import annotations

from typing import Iterable

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from ..census import census
from .scales import _expand, _scale_from_amax, amax, tile_shape

__all__ = ["capture_linear_tensors", "granularity_census", "scaled"]

_FORMAT_NAMES = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}


def capture_linear_tensors(model: nn.Module, x: torch.Tensor,
                           y: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
    """Returns {"activations": {layer: input}, "gradients": {layer: d loss / d output}} of one step.

    Each tensor is flattened to 2-d (tokens x features), detached, in fp32. The loss is the
    cross-entropy of the model's output (flattened for token models) against ``y``.
    """
    acts: dict[str, torch.Tensor] = {}
    grads: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and type(module) is nn.Linear:
            def forward_hook(mod, inputs, output, name=name):
                acts[name] = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1])

            def backward_hook(mod, grad_in, grad_out, name=name):
                grads[name] = grad_out[0].detach().float().reshape(-1, grad_out[0].shape[-1])
            handles += [module.register_forward_hook(forward_hook),
                        module.register_full_backward_hook(backward_hook)]
    try:
        model.zero_grad(set_to_none=True)
        out = model(x)
        F.cross_entropy(out.float().flatten(0, -2), y.flatten()).backward()
    finally:
        for h in handles:
            h.remove()
    return {"activations": acts, "gradients": grads}


def scaled(x: torch.Tensor, fmt: str, granularity: str | None) -> torch.Tensor:
    """Returns ``x`` times its current-scaling scales (fp32, before the cast); None: unscaled."""
    if granularity is None:
        return x.float()
    tile = tile_shape(granularity, tuple(x.shape))
    return x.float() * _expand(_scale_from_amax(amax(x, tile), fmt, 0), tile)


def granularity_census(tensors: dict[str, torch.Tensor], fmt: str,
                       granularities: Iterable[str | None] = (None, "tensorwise", "rowwise", "1x128"),
                       ) -> pd.DataFrame:
    """Returns one row per (tensor, granularity): the percent of values per census class in ``fmt``.

    Granularity None means no scale at all (the tensor cast as it is). Tiles must divide the
    tensor (raises otherwise; ``1x128`` needs a multiple of 128 features).
    """
    if fmt not in _FORMAT_NAMES:
        raise ValueError(f"unknown FP8 format {fmt!r}; allowed: {', '.join(_FORMAT_NAMES)}")
    rows = []
    for name, x in tensors.items():
        for g in granularities:
            result = census(scaled(x, fmt, g), _FORMAT_NAMES[fmt])
            fr = result.fractions
            rows.append({"tensor": name, "scaling": g or "none", "n": result.n,
                         **{k: 100 * fr[k] for k in ("zero", "underflow", "subnormal", "normal",
                                                     "overflow")}})
    return pd.DataFrame(rows)

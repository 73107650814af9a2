"""locate_first_nonfinite on small hand-built models whose first inf/NaN is known by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fp16lab.diagnostics.locator import NonFiniteReport, locate_first_nonfinite


class Times(nn.Module):
    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


class Sqrt(nn.Module):
    def forward(self, x):
        return x.sqrt()  # d sqrt(x)/dx is inf at 0


class Pair(nn.Module):
    def forward(self, x):
        return {"finite": x, "inf": x / 0}  # 1 / 0 = inf where x > 0


def _x():
    return torch.tensor([[1.0, -2.0], [0.5, 3.0], [0.0, 1.0]])


def test_forward_names_the_module_that_made_the_inf_with_numpys_counts():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), Times(1e38), Times(10.0), nn.ReLU())
    x = _x()
    r = locate_first_nonfinite(model, lambda: model(x).sum(), backward=False)
    y = (model[0](x) * 1e38 * 10.0).detach().numpy()  # what module "2" produced
    fin = y[np.isfinite(y)].astype(np.float64)
    assert (r.module, r.phase, r.tensor, r.dtype, r.shape) == ("2", "forward", "output 0",
                                                                "float32", (3, 2))
    assert (r.n_inf, r.n_nan) == (int(np.isinf(y).sum()), int(np.isnan(y).sum()))
    assert r.n_inf > 0
    np.testing.assert_equal((r.finite_min, r.finite_max),
                            (fin.min(), fin.max()) if fin.size else (np.nan, np.nan))
    assert str(r) == (f"first non-finite value in forward of '2' (output 0, float32 [3, 2]): "
                      f"{r.n_inf} inf, {r.n_nan} NaN; finite values range over "
                      f"[{r.finite_min:.3g}, {r.finite_max:.3g}]")
    assert r.as_dict()["module"] == "2" and r.as_dict()["shape"] == (3, 2)
    assert all(p.grad is None for p in model.parameters())  # backward=False: no backward


def test_backward_names_the_module_whose_input_gradient_is_inf():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), Sqrt())
    with torch.no_grad():
        model[0].weight.copy_(torch.eye(2))
        model[0].bias.zero_()
    x = _x()  # row 3 has a 0, and ReLU makes -2 a 0: sqrt's gradient there is inf
    r = locate_first_nonfinite(model, lambda: model(x).sum())
    assert (r.module, r.phase, r.tensor) == ("2", "backward", "input 0")
    assert (r.n_inf, r.n_nan) == (2, 0)
    # the other gradients, 1 / (2 sqrt(v)) for v = 1, 0.5, 3, 1, computed in float32
    assert (r.finite_min, r.finite_max) == (pytest.approx(0.5 / math.sqrt(3.0), rel=1e-6),
                                            pytest.approx(0.5 / math.sqrt(0.5), rel=1e-6))
    assert not model[2]._forward_pre_hooks and not model[2]._forward_hooks  # hooks removed


def test_parameter_gradients_and_the_loss_itself():
    lin = nn.Linear(2, 1)
    x = _x()
    r = locate_first_nonfinite(lin, lambda: lin(x).sum(), loss_scale=1e39)
    assert (r.module, r.phase) == ("", "parameter gradient") and r.tensor in ("weight", "bias")
    # a loss made inf outside any module is the loss's own fault
    model = nn.Sequential(nn.Linear(2, 2))
    r = locate_first_nonfinite(model, lambda: model(x).sum() * 1e39, backward=False)
    assert (r.module, r.phase, r.tensor, r.shape) == ("", "forward", "loss", ())
    assert math.isnan(r.finite_min) and math.isnan(r.finite_max)  # no finite value at all


def test_inputs_already_inf_are_not_blamed_on_the_module():
    model = nn.Sequential(nn.Linear(2, 2))
    x = torch.tensor([[math.inf, 1.0]])
    r = locate_first_nonfinite(model, lambda: model(x).sum(), backward=False)
    assert (r.module, r.phase, r.tensor, r.n_inf) == ("", "input batch", "input 0", 1)


def test_outputs_in_dicts_and_lists_are_looked_into():
    model = nn.Sequential(Pair())
    r = locate_first_nonfinite(model, lambda: sum(v.sum() for v in model(_x()).values()),
                               backward=False)
    assert (r.module, r.tensor) == ("0", "output 1")
    assert (r.n_inf, r.n_nan) == (5, 1)  # x / 0 is +-inf, but 0 / 0 is NaN


def test_a_clean_step_gives_none_and_a_non_tensor_loss_is_refused():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert locate_first_nonfinite(model, lambda: model(_x()).sum()) is None
    assert model[0].weight.grad is not None  # backward ran
    with pytest.raises(TypeError, match="^step\\(\\) must return the loss tensor, got float$"):
        locate_first_nonfinite(model, lambda: 1.0)
    assert not model[0]._forward_hooks and not model[0]._forward_pre_hooks
    assert NonFiniteReport("m", "forward", "loss", "float32", (), 1, 0, 0.0, 0.0).as_dict() == {
        "module": "m", "phase": "forward", "tensor": "loss", "dtype": "float32", "shape": (),
        "n_inf": 1, "n_nan": 0, "finite_min": 0.0, "finite_max": 0.0}


class _DividesThenLinear(nn.Module):
    """Makes its inf itself (x / 0) between the input and its only layer."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x / 0.0)


def test_an_inf_the_model_makes_itself_is_blamed_on_the_model_not_the_batch_or_the_layer():
    model = _DividesThenLinear()
    x = torch.ones(3, 2)
    report = locate_first_nonfinite(model, lambda: model(x).sum(), backward=False)
    # the layer only passed on what it was given; the batch was clean; the model's code made it
    assert (report.module, report.phase, report.tensor) == ("", "forward", "output 0")
    assert str(report).startswith("first non-finite value in forward of '<model>' (output 0, ")


class _NaNGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * math.nan


class NaNBackward(nn.Module):
    def forward(self, x):
        return _NaNGradient.apply(x)


def test_a_nan_gradient_is_blamed_on_the_layer_not_on_the_block_holding_it():
    from collections import OrderedDict

    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(a=nn.Linear(2, 2), block=nn.Sequential(
        OrderedDict(nan=NaNBackward(), c=nn.Linear(2, 1)))))
    x = torch.ones(3, 2)
    report = locate_first_nonfinite(model, lambda: model(x).sum())
    assert (report.module, report.phase, report.tensor) == ("block.nan", "backward", "input 0")


def test_a_frozen_parameter_does_not_hide_the_next_ones_gradient():
    model = nn.Sequential(nn.Linear(2, 1))
    model[0].weight.requires_grad_(False)
    x = torch.ones(3, 2)
    report = locate_first_nonfinite(model, lambda: model(x).sum(), loss_scale=math.inf)
    assert (report.module, report.phase, report.tensor) == ("0", "parameter gradient", "0.bias")

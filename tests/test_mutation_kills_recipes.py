"""fp16lab.recipes, beyond tests/test_recipes.py: each precision's settings and defaults, asserted
against what its description promises (and torch's own defaults for the GradScaler)."""

from __future__ import annotations

import pytest
import torch

from fp16lab import recipes
from fp16lab.models import build_model, input_shape

#: name -> (autocast dtype, scaled, tf32, master weights), as each description says.
PROMISED = {
    "fp32": (None, False, False, False),
    "tf32": (None, False, True, False),
    "amp-fp16": ("float16", True, False, False),
    "amp-bf16": ("bfloat16", False, False, False),
    "fp16-o2": (None, True, False, True),
}


@pytest.mark.parametrize("name", list(PROMISED))
def test_each_recipe_precision_has_the_settings_its_description_promises(name):
    p = recipes.PRECISIONS[name]
    assert (p.autocast_dtype, p.scaled, p.tf32, p.master_weights) == PROMISED[name]
    assert p.fp8_recipe is None and not p.fp8 and str(p) == p.description
    assert p.converts_model == (name == "fp16-o2")
    assert p.autocast_recipe == (name in ("fp32", "amp-fp16", "amp-bf16"))


def test_fp8_precisions_autocast_to_bf16_and_convert_the_model():
    fp8 = [n for n in recipes.PRECISIONS if n.startswith("fp8-")]
    assert fp8 and recipes.precisions(fp8=True) == tuple(fp8)
    for n in fp8:
        p = recipes.PRECISIONS[n]
        assert p.fp8 and p.converts_model and not p.autocast_recipe and not p.scaled
        assert p.autocast_dtype == "bfloat16" and p.fp8_recipe == n.removeprefix("fp8-")
    assert recipes.RECIPE_PRECISIONS == tuple(PROMISED)
    assert recipes.SCALED_PRECISIONS == ("amp-fp16", "fp16-o2")


def _step(precision, **kw):
    torch.manual_seed(0)
    model = build_model("mlp")
    x = torch.randn(input_shape("mlp", 4))
    y = torch.randint(0, 10, (4,))
    return model, recipes.make_train_step(precision, model, x, y, device="cpu", **kw)


@pytest.mark.parametrize("name", list(PROMISED))
def test_every_recipe_trains_with_the_default_sgd(name):
    model, (step, scaler) = _step(name)
    opt = step.optimizer
    g = opt.param_groups[0]
    assert type(opt) is torch.optim.SGD
    assert (g["lr"], g["momentum"], g["fused"]) == (0.01, 0.9, None)
    assert (scaler is not None) == PROMISED[name][1]
    if name == "fp16-o2":  # the optimizer steps fp32 master copies of the fp16 weights
        assert all(p.dtype == torch.float32 for p in g["params"])
        assert all(p.dtype == torch.float16 for p in model.parameters())
    else:
        assert [id(p) for p in g["params"]] == [id(p) for p in model.parameters()]


def test_the_default_grad_scaler_has_torchs_defaults():
    _, (step, scaler) = _step("amp-fp16")
    ref = torch.amp.GradScaler("cpu")
    assert type(scaler) is torch.amp.GradScaler
    assert scaler.get_scale() == ref.get_scale() == 65536.0
    assert scaler.get_growth_factor() == ref.get_growth_factor() == 2.0
    assert scaler.get_backoff_factor() == ref.get_backoff_factor() == 0.5
    assert scaler.get_growth_interval() == ref.get_growth_interval() == 2000


def test_loss_scaler_none_trains_without_one_and_a_bad_string_is_refused():
    _, (step, scaler) = _step("amp-fp16", loss_scaler=None)
    assert scaler is None
    assert torch.isfinite(step())
    with pytest.raises(ValueError, match="loss_scaler"):
        _step("amp-fp16", loss_scaler="static")

"""fp16lab.recipes: each precision's definition against the recipe it names, and each check's
words. Written against the survivors of a mutation run of recipes.py (69.3%)."""

from __future__ import annotations

import pytest
import torch

from fp16lab import recipes
from fp16lab.recipes import PRECISIONS

# What each precision is, written from the recipes themselves (torch.autocast's dtypes, Apex O2's
# master weights, GradScaler for fp16 only): (autocast dtype, scaled, tf32, master weights, FP8)
EXPECTED = {
    "fp32": (None, False, False, False, None),
    "tf32": (None, False, True, False, None),
    "amp-fp16": ("float16", True, False, False, None),
    "amp-bf16": ("bfloat16", False, False, False, None),
    "fp16-o2": (None, True, False, True, None),
}


def test_each_precision_is_the_recipe_it_names():
    fp8 = {f"fp8-{r}": ("bfloat16", False, False, False, r) for r in recipes.FP8_RECIPES}
    want = {**EXPECTED, **fp8}
    assert list(PRECISIONS) == list(want)  # the order every table and sweep uses
    for name, (dtype, scaled, tf32, master, recipe) in want.items():
        p = PRECISIONS[name]
        assert (p.name, p.autocast_dtype, p.scaled, p.tf32, p.master_weights, p.fp8_recipe) == (
            name, dtype, scaled, tf32, master, recipe), name


def test_each_precision_says_what_it_does():
    words = {"fp32": ("fp32", "TF32 off"), "tf32": ("TF32 tensor cores", "no effect on a CPU"),
             "amp-fp16": ("fp16", "GradScaler"), "amp-bf16": ("bf16", "no scaler"),
             "fp16-o2": ("master weights", "BatchNorm kept in fp32", "Apex O2")}
    for name, needed in words.items():
        text = str(PRECISIONS[name])
        assert text == PRECISIONS[name].description and all(w in text for w in needed), text
    for r, what in recipes.FP8_RECIPES.items():
        assert str(PRECISIONS[f"fp8-{r}"]) == f"FP8 linear layers: {what}; the rest as amp-bf16"


@pytest.mark.parametrize("call, name", [
    (lambda: recipes.sgd([torch.zeros(1, requires_grad=True)], lr=0), "lr"),
    (lambda: recipes.sgd([torch.zeros(1, requires_grad=True)], momentum=-0.1), "momentum"),
    (lambda: recipes.autocast("amp-fp16", "cpu", cache_enabled=1), "cache_enabled"),
    (lambda: recipes.autocast("amp-fp16", "gpu0"), "device"),
    (lambda: recipes.grad_scaler("amp-fp16", 7), "device"),
    (lambda: recipes.set_tf32(1), "matmul"),
    (lambda: recipes.set_tf32(True, conv="on"), "conv"),
    (lambda: recipes.sgd([torch.zeros(1, requires_grad=True)], fused=1), "fused"),
])
def test_each_check_names_its_parameter(call, name):
    with pytest.raises((TypeError, ValueError)) as e:
        call()
    assert str(e.value).startswith(f"{name} must be"), str(e.value)


def test_sgd_takes_what_its_bounds_allow():
    p = [torch.zeros(1, requires_grad=True)]
    assert recipes.sgd(p, lr=1e-9, momentum=0).param_groups[0]["momentum"] == 0
    with pytest.raises(ValueError, match="^lr must be > 0, got 0$"):
        recipes.sgd(p, lr=0.0)
    with pytest.raises(ValueError, match="^momentum must be >= 0, got -0.1$"):
        recipes.sgd(p, momentum=-0.1)


def test_autocast_keeps_its_cache_setting():
    with recipes.autocast("amp-bf16", "cpu", cache_enabled=False):
        assert not torch.is_autocast_cache_enabled()
    with recipes.autocast("amp-bf16", "cpu", cache_enabled=True):
        assert torch.is_autocast_cache_enabled()

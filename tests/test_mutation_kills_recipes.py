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


#: The table as the package holds it, and as its builder makes it when called (the module-level
#: table is built once, at import: a mutation test plants its bug after that).
TABLES = pytest.mark.parametrize("table", [lambda: PRECISIONS, recipes._all_precisions],
                                 ids=["PRECISIONS", "built again"])


@TABLES
def test_each_precision_is_the_recipe_it_names(table):
    table = table()
    fp8 = {f"fp8-{r}": ("bfloat16", False, False, False, r) for r in recipes.FP8_RECIPES}
    want = {**EXPECTED, **fp8}
    assert list(table) == list(want)  # the order every table and sweep uses
    for name, (dtype, scaled, tf32, master, recipe) in want.items():
        p = table[name]
        assert (p.name, p.autocast_dtype, p.scaled, p.tf32, p.master_weights, p.fp8_recipe) == (
            name, dtype, scaled, tf32, master, recipe), name


@TABLES
def test_each_precision_says_what_it_does(table):
    table = table()
    words = {"fp32": ("fp32 weights and maths", "TF32 off for matmul and cuDNN"),
             "tf32": ("fp32 weights", "TF32 tensor cores", "(no effect on a CPU)"),
             "amp-fp16": ("autocast to fp16", "with a GradScaler"),
             "amp-bf16": ("autocast to bf16", "no scaler", "fp32's exponent range"),
             "fp16-o2": ("pure fp16 model", "fp32 master weights", "dynamic loss scaler",
                         "BatchNorm kept in fp32", "Apex O2")}
    for name, needed in words.items():
        text = str(table[name])
        assert text == table[name].description and all(w in text for w in needed), text
    # and word for word, as `fp16lab sweep --help` and notebook 04 print them
    assert [str(table[n]) for n in words] == [
        "fp32 weights and maths; TF32 off for matmul and cuDNN",
        "fp32 weights; matmul and convolutions on TF32 tensor cores (no effect on a CPU)",
        "autocast to fp16 with a GradScaler",
        "autocast to bf16, no scaler (bf16 has fp32's exponent range)",
        "pure fp16 model with fp32 master weights in the optimizer and a dynamic loss scaler "
        "(the Apex O2 recipe; BatchNorm kept in fp32)"]
    for r, what in recipes.FP8_RECIPES.items():
        assert str(table[f"fp8-{r}"]) == f"FP8 linear layers: {what}; the rest as amp-bf16"


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


def test_a_known_precision_not_offered_says_where():
    with pytest.raises(ValueError) as e:
        recipes.check_precision("amp-fp16", ["fp32", "tf32"])
    assert str(e.value) == "precision 'amp-fp16' is not offered here; allowed: fp32, tf32"
    with pytest.raises(ValueError) as e:
        recipes.make_train_step("fp8-tensorwise", torch.nn.Linear(4, 2), torch.zeros(2, 4),
                                torch.zeros(2, dtype=torch.long), device="cpu")
    assert "not offered by recipes.make_train_step (an fp8 precision's step is " \
           "fp16lab.fp8.training.make_fp8_step)" in str(e.value)


def _linear_step(precision="fp32", **kwargs):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    step, gs = recipes.make_train_step(precision, model, x, y, device="cpu", **kwargs)
    return model, x, y, step, gs


def test_a_forward_given_is_what_the_batch_goes_through():
    """The loss is the forward's, and the optimizer steps the model's parameters."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    doubled = lambda xb: 2.0 * model(xb)  # noqa: E731
    step, _ = recipes.make_train_step("fp32", model, x, y, device="cpu", forward=doubled)
    want = torch.nn.functional.cross_entropy(2.0 * model(x), y)
    assert torch.equal(step().detach(), want.detach())


def test_the_batch_step_trains_on_is_kept_and_o2_keeps_the_fp16_copy():
    model, x, y, step, _ = _linear_step()
    assert step.batch[0] is x and step.batch[1] is y
    _, x16, y16, o2, _ = _linear_step("fp16-o2")
    assert o2.batch[0].dtype == torch.float16 and torch.equal(o2.batch[0], x16.half())
    assert o2.batch[1] is y16


def _gradients_seen(precision, **kwargs):
    """(the |gradient| sum after backward, and as the optimizer step is entered)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    seen = {}
    step, gs = recipes.make_train_step(
        precision, model, x, y, device="cpu", **kwargs,
        after_backward=lambda: seen.setdefault("after backward", model.weight.grad.abs().sum()))
    if gs is not None:
        real_step = gs.step

        def stepping(opt, *args, **kwargs):
            seen["at the step"] = model.weight.grad.abs().sum()
            return real_step(opt, *args, **kwargs)
        gs.step = stepping
    step()
    return {k: float(v) for k, v in seen.items()}


def test_after_backward_sees_scaled_gradients_and_unscale_first_unscales_before_the_step():
    """GradScaler multiplies the loss by its scale (2^16 at first): the gradients a hook reads
    after backward are that many times fp32's; unscale_first divides them back in a call of its
    own before the optimizer step (where clipping goes), else the step does it inside."""
    plain = _gradients_seen("fp32")["after backward"]
    inside = _gradients_seen("amp-fp16")  # the default: unscaled inside the optimizer step
    first = _gradients_seen("amp-fp16", unscale_first=True)
    assert inside["after backward"] == pytest.approx(plain * 65536.0, rel=1e-2)
    assert inside["at the step"] == pytest.approx(plain * 65536.0, rel=1e-2)
    assert first["after backward"] == pytest.approx(plain * 65536.0, rel=1e-2)
    assert first["at the step"] == pytest.approx(plain, rel=1e-2)


def test_the_autocast_cache_setting_reaches_autocast():
    seen = []
    model = torch.nn.Linear(4, 3)

    def forward(xb):
        seen.append(torch.is_autocast_cache_enabled())
        return model(xb)
    for cache in (False, True):
        step, _ = recipes.make_train_step("amp-bf16", model, torch.randn(2, 4),
                                          torch.tensor([0, 1]), device="cpu", forward=forward,
                                          autocast_cache=cache)
        step()
    assert seen == [False, True]


def test_the_loss_function_gets_the_models_output_as_it_is():
    """Under autocast the output stays 16-bit for the loss (cross-entropy casts it to fp32 on
    its own; a loss of the user's sees what the model gave); fp16-o2's fp16 output is made fp32
    first, since no autocast is there to do it."""
    seen = []

    def loss(out, y):
        seen.append(out.dtype)
        return out.float().square().mean()
    model = torch.nn.Linear(4, 3)
    for precision in ("amp-bf16", "fp32", "fp16-o2"):
        step, _ = recipes.make_train_step(precision, model, torch.randn(2, 4),
                                          torch.tensor([0, 1]), device="cpu", loss_fn=loss)
        step()
    assert seen == [torch.bfloat16, torch.float32, torch.float32]

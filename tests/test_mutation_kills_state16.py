"""state16's messages, bounds and defaults, each asserted (the behaviour test_state16 does not pin)."""

from __future__ import annotations

import pytest
import torch

from fp16lab.state16 import AdamW16, bytes_per_parameter, stochastic_round_bf16, vanished_share


def _p():
    return [torch.nn.Parameter(torch.ones(2))]


@pytest.mark.parametrize("kwargs, name", [
    ({"lr": 0.0}, "lr"), ({"lr": -1e-3}, "lr"),
    ({"betas": (-0.1, 0.9)}, r"betas\[0\]"), ({"betas": (1.0, 0.9)}, r"betas\[0\]"),
    ({"betas": (0.9, -0.1)}, r"betas\[1\]"), ({"betas": (0.9, 1.0)}, r"betas\[1\]"),
    ({"betas": (0.9, 1.5)}, r"betas\[1\]"), ({"eps": 0.0}, "eps"),
    ({"weight_decay": -0.1}, "weight_decay"), ({"rounding": "up"}, "rounding"),
    ({"state_dtype": torch.float16}, "state_dtype")])
def test_each_bad_setting_is_refused_by_its_own_name(kwargs, name):
    with pytest.raises((TypeError, ValueError), match=rf"^{name} must"):
        AdamW16(_p(), **kwargs)


def test_bounds_that_hold_and_the_defaults():
    AdamW16(_p(), betas=(0.0, 0.0), weight_decay=0.0)  # zero is allowed for both
    opt = AdamW16(_p())
    assert opt.defaults == {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
    assert opt.vanished == 0.0 and opt.rounding == "nearest"
    assert opt.state_dtype == torch.float32


def test_bytes_per_parameter_names_what_is_wrong():
    with pytest.raises(ValueError, match="^method must"):
        bytes_per_parameter("fp64")
    with pytest.raises(TypeError, match="^gradient must"):
        bytes_per_parameter("fp32-master", gradient=1)


def test_stochastic_rounding_names_the_dtype_returns_bf16_and_follows_its_generator():
    with pytest.raises(TypeError, match="torch.float64"):
        stochastic_round_bf16(torch.ones(2, dtype=torch.float64))
    with pytest.raises(TypeError, match="list"):
        stochastic_round_bf16([1.0])
    x = torch.full((4096,), 1 + 2.0**-9)
    a = stochastic_round_bf16(x, torch.Generator().manual_seed(3))
    b = stochastic_round_bf16(x, torch.Generator().manual_seed(3))
    c = stochastic_round_bf16(x, torch.Generator().manual_seed(4))
    assert a.dtype == torch.bfloat16 and torch.equal(a, b) and not torch.equal(a, c)


def test_vanished_share_adds_the_update_and_names_the_dtype():
    w = torch.ones(1, dtype=torch.bfloat16)
    # 1 - 2^-8 is a bf16 value (below 1 the spacing is 2^-8): the weight moves;
    # 1 + 2^-8 would tie back to 1
    assert vanished_share(w, torch.tensor([-(2.0**-8)])) == 0.0
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        vanished_share(torch.ones(1), torch.ones(1))


def test_the_noise_takes_every_16_bit_value_zero_included():
    # dropped part 0xFFFF: up unless the noise is exactly 0, which 2^20 seeded draws do hit
    # (expected 16 times); noise drawn from 1 up would never round down
    x = (torch.tensor([1.0]).view(torch.int32) + 0xFFFF).view(torch.float32).repeat(1 << 20)
    out = stochastic_round_bf16(x, torch.Generator().manual_seed(0)).float()
    downs = int((out == 1.0).sum())
    assert 0 < downs < 64


def test_the_noise_is_made_on_the_tensor_s_device():
    out = stochastic_round_bf16(torch.empty(8, device="meta"))
    assert out.device.type == "meta" and out.dtype == torch.bfloat16


# ------------------------------------------------------------ the field's optimizers, as built

def _field(method, dtype):
    from fp16lab.state16 import field_optimizer
    p = torch.nn.Parameter(torch.zeros(8, dtype=dtype))
    return field_optimizer(method, [p], 3e-3, weight_decay=0.05, betas=(0.8, 0.95), eps=1e-7), p


@pytest.mark.parametrize("method", ["fp32-master", "bf16-nearest"])
def test_field_torch_adamw_gets_every_setting(method):
    opt, p = _field(method, torch.float32 if method == "fp32-master" else torch.bfloat16)
    assert type(opt) is torch.optim.AdamW and opt.param_groups[0]["params"] == [p]
    d = opt.defaults
    assert (d["lr"], d["betas"], d["eps"], d["weight_decay"]) == (3e-3, (0.8, 0.95), 1e-7, 0.05)


def test_field_kahan_is_optimi_with_kahan_summation_and_every_setting():
    optimi = pytest.importorskip("optimi")
    opt, p = _field("bf16-kahan", torch.bfloat16)
    assert type(opt) is optimi.AdamW
    d = opt.defaults
    assert d["kahan_sum"] is True and d["foreach"] is False  # foreach: one parameter at a time
    assert (d["lr"], d["beta1"], d["beta2"], d["eps"], d["weight_decay"]) == (
        3e-3, 0.8, 0.95, 1e-7, 0.05)


@pytest.mark.parametrize("method, cls", [("bf16-stochastic", "_AdamW"),
                                         ("bf16-8bit-state", "AdamW8bit")])
def test_field_torchao_optimizers_round_stochastically_with_every_setting(method, cls):
    pytest.importorskip("torchao")
    opt, _ = _field(method, torch.bfloat16)
    assert type(opt).__name__ == cls and opt.bf16_stochastic_round is True
    d = opt.defaults
    assert (d["lr"], d["betas"], d["eps"], d["weight_decay"]) == (3e-3, (0.8, 0.95), 1e-7, 0.05)


def test_field_unavailable_names_the_extra_and_refuses_an_unknown_method():
    from fp16lab import state16
    real = __import__

    def missing(name, *args, **kwargs):
        if name == "torchao":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    import builtins
    builtins.__import__ = missing
    try:
        why = state16.field_unavailable("bf16-stochastic")
    finally:
        builtins.__import__ = real
    assert why == ("bf16-stochastic from the field needs torchao (pip install torchao, or pip "
                   "install 'fp16lab[state16]')")
    with pytest.raises(ValueError, match=r"^method"):
        state16.field_unavailable("bf16-fast")


def test_state_bytes_counts_a_storage_once_at_its_largest_view_and_empty_as_nothing():
    from fp16lab.state16 import state_bytes

    class Holder(torch.optim.Optimizer):
        def step(self, closure=None):
            return None

    p = torch.nn.Parameter(torch.zeros(2))
    opt = Holder([p], {})
    big = torch.zeros(100)
    opt.state[p] = {"view": big[:10], "whole": big, "none": torch.zeros(0),
                    "param": torch.nn.Parameter(torch.zeros(3))}
    assert state_bytes(opt) == 100 * 4 + 3 * 4
    opt.state[p] = {"whole": big, "view": big[:10]}  # the other order: still the whole storage
    assert state_bytes(opt) == 100 * 4

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

"""Weights and optimizer state in 16 bits, against counted and float64 oracles and torch's AdamW."""

from __future__ import annotations

import math

import pytest
import torch

from fp16lab.state16 import (AdamW16, bytes_per_parameter, state_bytes, stochastic_round_bf16,
                             vanished_share)


def _neighbours(x: float) -> tuple[float, float]:
    """The bf16 values just below and above x (x > 0, not a bf16 value), by truncating bits."""
    t = torch.tensor([x], dtype=torch.float32)
    low = (t.view(torch.int32) & -65536).view(torch.float32)
    high = (low.view(torch.int32) + 65536).view(torch.float32)
    return float(low), float(high)


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75, 1 / 3, 0.01])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_stochastic_rounding_goes_up_with_the_distance_as_probability(fraction, sign):
    low, high = _neighbours(1.7)
    x = sign * (low + fraction * (high - low))
    n = 200_000
    g = torch.Generator().manual_seed(1)
    out = stochastic_round_bf16(torch.full((n,), x, dtype=torch.float32), g).float()
    assert set(out.unique().tolist()) <= {sign * low, sign * high}
    up = float((out.abs() == high).float().mean())
    frac = (abs(x) - low) / (high - low)  # the float32 x's own fraction, counted exactly
    sigma = math.sqrt(frac * (1 - frac) / n)
    assert abs(up - frac) < 5 * sigma + 1e-6
    assert float(out.double().mean()) == pytest.approx(x, rel=1e-4)  # unbiased


def test_stochastic_rounding_keeps_bf16_values_and_non_finite_ones():
    x = torch.tensor([1.0, -2.5, 0.0, float("inf"), -float("inf"), 3.0e38], dtype=torch.float32)
    x = torch.cat([x, torch.tensor([float("nan")])])
    out = stochastic_round_bf16(x, torch.Generator().manual_seed(0)).float()
    assert out[:5].tolist() == [1.0, -2.5, 0.0, float("inf"), -float("inf")]
    assert math.isnan(out[6])
    with pytest.raises(TypeError, match="float32"):
        stochastic_round_bf16(torch.ones(2, dtype=torch.float64))


def test_vanished_share_by_hand():
    w = torch.ones(4, dtype=torch.bfloat16)  # bf16 spacing above 1 is 2^-7, below 2^-8
    u = torch.tensor([2.0**-10, 2.0**-6, 0.0, -2.0**-10])
    assert vanished_share(w, u) == pytest.approx(2 / 3)
    assert vanished_share(w, torch.zeros(4)) == 0.0
    with pytest.raises(TypeError):
        vanished_share(torch.ones(2), u[:2])


def _constant_gradient_run(rounding: str, dtype: torch.dtype, steps: int = 1000, lr: float = 1e-4):
    p = torch.nn.Parameter(torch.ones(64, dtype=dtype))
    opt = AdamW16([p], lr=lr, weight_decay=0.0, rounding=rounding,
                  generator=torch.Generator().manual_seed(0))
    shares = []
    for _ in range(steps):
        p.grad = torch.ones_like(p)
        opt.step()
        shares.append(opt.vanished)
    return p.detach().double(), shares


def test_nearest_bf16_swamps_kahan_and_stochastic_follow_float64():
    # each step moves w by lr * g / (|g| + eps): float64 says 1 - 1000 * 1e-4 = 0.9
    ref = 1.0 - 1000 * 1e-4 / (1 + 1e-8)
    nearest, shares = _constant_gradient_run("nearest", torch.bfloat16)
    assert torch.all(nearest == 1.0) and min(shares) == 1.0  # every update rounded away
    kahan, _ = _constant_gradient_run("kahan", torch.bfloat16)
    assert torch.all((kahan - ref).abs() <= 2.0**-8)  # within one bf16 spacing at 0.9
    sr, sr_shares = _constant_gradient_run("stochastic", torch.bfloat16)
    assert abs(float(sr.mean()) - ref) < 2.0**-8
    assert 0.9 < sum(sr_shares) / len(sr_shares) < 1.0  # most steps round down, some up
    fp32, shares32 = _constant_gradient_run("nearest", torch.float32)
    assert torch.allclose(fp32, torch.full_like(fp32, ref), atol=1e-5) and max(shares32) == 0.0


def test_adamw16_on_fp32_weights_is_torch_adamw():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(33, 7))
    b = torch.nn.Parameter(a.detach().clone())
    ours = AdamW16([a], lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)
    theirs = torch.optim.AdamW([b], lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05,
                               foreach=False)
    for _ in range(25):
        g = torch.randn_like(a)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    assert torch.equal(a, b)  # the same operations in the same order: bit for bit


def test_bytes_per_parameter_and_counted_state():
    assert [bytes_per_parameter(m) for m in ("fp32-master", "bf16-nearest", "bf16-stochastic",
                                             "bf16-kahan", "bf16-8bit-state")] == [16, 12, 12, 14, 6]
    assert bytes_per_parameter("fp32-master", gradient=False) == 12
    p = torch.nn.Parameter(torch.ones(100, dtype=torch.bfloat16))
    opt = AdamW16([p], rounding="kahan")
    p.grad = torch.ones_like(p)
    opt.step()
    assert state_bytes(opt) == 100 * (4 + 4 + 2)
    opt16 = AdamW16([p], rounding="nearest", state_dtype=torch.bfloat16)
    opt16.step()
    assert state_bytes(opt16) == 100 * (2 + 2)
    with pytest.raises(ValueError, match="method"):
        bytes_per_parameter("fp64")


@pytest.mark.parametrize("kwargs, words", [({"lr": -1.0}, "lr"), ({"eps": 0.0}, "eps"),
                                           ({"betas": (1.0, 0.9)}, "betas"),
                                           ({"rounding": "up"}, "rounding"),
                                           ({"state_dtype": torch.float16}, "state_dtype")])
def test_adamw16_refuses_bad_settings(kwargs, words):
    with pytest.raises((TypeError, ValueError), match=words):
        AdamW16([torch.nn.Parameter(torch.ones(2))], **kwargs)

"""ScalerPlayground: moving a slider redraws, and the trajectory is torch's GradScaler rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fp16lab.widgets import ScalerPlayground


def _torch_trajectory(found_inf, params):
    """Oracle: torch.amp.GradScaler('cpu') fed finite or inf gradients in the same pattern."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", **params)
    scaler.scale(torch.ones(()))
    used = []
    for bad in found_inf:
        p.grad = torch.full((1,), math.inf if bad else 1.0)
        used.append(scaler.get_scale())
        scaler.step(opt)
        scaler.update()
    return np.array(used)


def test_sliders_have_stable_classes_and_plot_is_an_image():
    pg = ScalerPlayground(steps=100)
    for name in ("init-scale", "growth-factor", "backoff-factor", "growth-interval",
                 "overflow-rate"):
        assert f"fp16lab-slider-{name}" in pg.sliders[name]._dom_classes
    assert "fp16lab-scaler-plot" in pg.plot._dom_classes
    assert pg.plot.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert "fp16lab-scaler-playground" in pg._dom_classes


@pytest.mark.parametrize("slider, value", [("init-scale", 24), ("growth-factor", 3.0),
                                           ("backoff-factor", 0.25), ("growth-interval", 10),
                                           ("overflow-rate", 0.1)])
def test_moving_a_slider_redraws_with_torch_rule(slider, value):
    pg = ScalerPlayground(steps=300)
    before_png, before_traj, n = pg.plot.value, pg.trajectory.copy(), pg.redraws
    pg.sliders[slider].value = value
    assert pg.redraws == n + 1
    assert pg.plot.value != before_png
    assert not np.array_equal(pg.trajectory, before_traj)
    want = _torch_trajectory(pg.found_inf, pg.params())
    np.testing.assert_array_equal(pg.trajectory, want)


def test_overflow_happens_where_scale_times_gradient_exceeds_fp16():
    pg = ScalerPlayground(steps=200, noise=0.0, grad_log2_max=-6.0)
    pg.sliders["overflow-rate"].value = 0.0
    pg.sliders["growth-interval"].value = 5
    # with no spikes, a step overflows exactly when scale * 2**-6 >= 65520
    np.testing.assert_array_equal(pg.found_inf, pg.trajectory * 2.0**-6 >= 65520)
    assert pg.found_inf.any() and not pg.found_inf.all()


def test_bad_steps():
    with pytest.raises(ValueError, match="steps must be >= 1"):
        ScalerPlayground(steps=0)


def test_underflow_share_is_what_torch_float16_flushes():
    pg = ScalerPlayground(steps=50, seed=3)
    assert pg.underflow.shape == (50,)
    for t in (0, 17, 49):
        # oracle: torch's float16 cast of the step's gradients times the scale used
        scaled = torch.from_numpy(pg.gradients(t) * pg.trajectory[t]).to(torch.float16)
        if torch.isinf(scaled).any():
            continue
        assert pg.underflow[t] == pytest.approx(float((scaled == 0).double().mean()), abs=1e-12)


def test_a_small_scale_skips_nothing_but_loses_gradient():
    pg = ScalerPlayground(steps=300)
    pg.sliders["overflow-rate"].value = 0.0
    pg.sliders["growth-interval"].value = 1000   # no growth within the run
    pg.sliders["init-scale"].value = 0
    small_lost, small_skips = pg.underflow.mean(), pg.found_inf.sum()
    pg.sliders["init-scale"].value = 22
    big_lost, big_skips = pg.underflow[~pg.found_inf].mean(), pg.found_inf.sum()
    assert small_skips == 0 and small_lost > 0.02 and big_lost < small_lost / 5
    assert big_skips > 0  # 2^22 * 2^-4 overflows FP16 at first
    assert "lost to underflow" in pg.summary.value


def test_bad_spread_and_values():
    with pytest.raises(ValueError, match="spread must be >= 0"):
        ScalerPlayground(spread=-1)
    with pytest.raises(ValueError, match="n_values"):
        ScalerPlayground(n_values=0)

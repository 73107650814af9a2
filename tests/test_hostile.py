"""The public API fed the bad input and the misuse a hostile (or hurried) user tries.

Each test names the wrong call, checks that it raises before doing any work, and that the
message says what was wrong and what is allowed. Where an independent tool faces the same
call (torch.amp.GradScaler, numpy, ml_dtypes), it is the oracle: it raises too, or gives the
value we must give.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from fp16lab import bits
from fp16lab.census import census_model
from fp16lab.formats import FORMATS
from fp16lab.scaling import DynamicLossScaler, StaticLossScaler

# ------------------------------------------------------------------------ loss scalers (#18.7)

SCALERS = {
    "dynamic": lambda: DynamicLossScaler(init_scale=2.0**16),
    "static": lambda: StaticLossScaler(2.0**16),
    "torch": lambda: torch.amp.GradScaler("cpu", init_scale=2.0**16),
}
OURS = ("dynamic", "static")
# torch.amp.GradScaler signals misuse with RuntimeError, AssertionError or ValueError
TORCH_MISUSE = (RuntimeError, AssertionError, ValueError)


class _Setup:
    """A tiny model, its SGD optimizer, and a count of the real optimizer steps."""

    def __init__(self, dtype=torch.float32):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1).to(dtype)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.steps = 0
        real_step = self.opt.step

        def counting_step(*args, **kwargs):
            self.steps += 1
            return real_step(*args, **kwargs)

        self.opt.step = counting_step
        self.x = torch.ones(2, 4, dtype=dtype)

    def loss(self):
        return self.model(self.x).float().pow(2).mean()

    def weights(self):
        return [p.detach().clone() for p in self.model.parameters()]

    def good_iteration(self, scaler):
        self.opt.zero_grad()
        scaler.scale(self.loss()).backward()
        scaler.step(self.opt)
        scaler.update()


def _raises(kind, call):
    """Runs call(); returns the exception our scaler raises, or checks torch raises too."""
    expected = TORCH_MISUSE if kind == "torch" else (RuntimeError, ValueError, TypeError)
    with pytest.raises(expected) as info:
        call()
    return info.value


@pytest.mark.parametrize("kind", list(SCALERS))
def test_step_after_plain_backward_raises(kind):
    # torch raises when the first iteration's step() comes without scale(); so must we, and
    # without touching the weights (they would move by a gradient divided by 65536)
    s, scaler = _Setup(), SCALERS[kind]()
    before = s.weights()
    s.loss().backward()
    err = _raises(kind, lambda: scaler.step(s.opt))
    assert s.steps == 0 and all(torch.equal(a, b) for a, b in zip(before, s.weights()))
    if kind != "torch":
        assert "scale(loss).backward()" in str(err) and "before scale()" in str(err)


@pytest.mark.parametrize("kind", OURS)
def test_step_without_scale_raises_in_every_iteration(kind):
    # torch checks only the first iteration (before its scale tensor exists); ours check each
    s, scaler = _Setup(), SCALERS[kind]()
    s.good_iteration(scaler)
    s.opt.zero_grad()
    s.loss().backward()
    before, n = s.weights(), s.steps
    with pytest.raises(RuntimeError, match="before scale"):
        scaler.step(s.opt)
    with pytest.raises(RuntimeError, match="before scale"):
        scaler.unscale_(s.opt)
    assert s.steps == n and all(torch.equal(a, b) for a, b in zip(before, s.weights()))


@pytest.mark.parametrize("kind", list(SCALERS))
def test_two_steps_before_update_raise(kind):
    s, scaler = _Setup(), SCALERS[kind]()
    scaler.scale(s.loss()).backward()
    scaler.step(s.opt)
    err = _raises(kind, lambda: scaler.step(s.opt))
    assert s.steps == 1  # the optimizer ran once, not twice
    if kind != "torch":
        assert "already been called" in str(err) and "update()" in str(err)


@pytest.mark.parametrize("kind", list(SCALERS))
def test_unscale_twice_raises(kind):
    s, scaler = _Setup(), SCALERS[kind]()
    scaler.scale(s.loss()).backward()
    scaler.unscale_(s.opt)
    once = [p.grad.clone() for p in s.model.parameters()]
    err = _raises(kind, lambda: scaler.unscale_(s.opt))
    # the gradients were not divided a second time
    assert all(torch.equal(a, p.grad) for a, p in zip(once, s.model.parameters()))
    if kind != "torch":
        assert "already been called" in str(err)


@pytest.mark.parametrize("kind", list(SCALERS))
def test_unscale_after_step_raises(kind):
    s, scaler = _Setup(), SCALERS[kind]()
    scaler.scale(s.loss()).backward()
    scaler.step(s.opt)
    err = _raises(kind, lambda: scaler.unscale_(s.opt))
    if kind != "torch":
        assert "after step()" in str(err)


@pytest.mark.parametrize("kind", list(SCALERS))
def test_step_with_no_gradients_raises(kind):
    s, scaler = _Setup(), SCALERS[kind]()
    scaler.scale(s.loss())  # scaled, but no backward: no parameter has a gradient
    err = _raises(kind, lambda: scaler.step(s.opt))
    assert s.steps == 0
    if kind != "torch":
        assert "none of its parameters has a gradient" in str(err)


@pytest.mark.parametrize("kind", list(SCALERS))
def test_update_with_nothing_checked_raises(kind):
    s, scaler = _Setup(), SCALERS[kind]()
    scaler.scale(s.loss()).backward()
    err = _raises(kind, scaler.update)
    if kind != "torch":
        assert "found_inf" in str(err) and "step(optimizer)" in str(err)


@pytest.mark.parametrize("kind", list(SCALERS))
def test_step_with_closure_raises(kind):
    s, scaler = _Setup(), SCALERS[kind]()
    scaler.scale(s.loss()).backward()
    _raises(kind, lambda: scaler.step(s.opt, closure=s.loss))
    assert s.steps == 0


@pytest.mark.parametrize("kind", list(SCALERS))
def test_fp16_gradients_raise(kind):
    s, scaler = _Setup(torch.float16), SCALERS[kind]()
    scaler.scale(s.loss()).backward()
    err = _raises(kind, lambda: scaler.step(s.opt))
    assert s.steps == 0
    if kind != "torch":
        assert isinstance(err, ValueError) and "FP16 gradients" in str(err)


@pytest.mark.parametrize("kind", OURS)
@pytest.mark.parametrize("flag", ["False", "True", 0, 1, 1.0, [True], np.array(False), object()])
def test_update_found_inf_must_be_bool_or_tensor(kind, flag):
    scaler = SCALERS[kind]()
    with pytest.raises(TypeError, match="True, False or a one-element tensor"):
        scaler.update(found_inf=flag)
    assert scaler.history == [] and scaler.get_scale() == 2.0**16  # nothing was applied


@pytest.mark.parametrize("flag, overflow", [(True, True), (False, False), (np.bool_(True), True),
                                            (torch.tensor(1.0), True), (torch.tensor(0.0), False),
                                            (torch.tensor([2.0]), True),
                                            (torch.tensor(False), False)])
def test_update_found_inf_accepts_bools_and_one_element_tensors(flag, overflow):
    scaler = DynamicLossScaler(init_scale=8.0)
    event = scaler.update(found_inf=flag)
    assert event.found_inf is overflow and event.skipped is overflow
    assert scaler.get_scale() == (4.0 if overflow else 8.0)


def test_update_found_inf_tensor_of_many_elements_raises():
    with pytest.raises(ValueError, match="one-element tensor"):
        DynamicLossScaler().update(found_inf=torch.tensor([0.0, 1.0]))


@pytest.mark.parametrize("kind", OURS)
def test_update_found_inf_after_step_raises(kind):
    # the step already ran with clean gradients; recording it as skipped would be a lie
    s, scaler = _Setup(), SCALERS[kind]()
    scaler.scale(s.loss()).backward()
    scaler.step(s.opt)
    with pytest.raises(RuntimeError, match="call update\\(\\) without found_inf"):
        scaler.update(found_inf=True)


@pytest.mark.parametrize("kind", OURS)
def test_loop_continues_normally_after_each_refused_call(kind):
    # a misuse that raised leaves the scaler usable: the next iterations match torch's weights
    ours_setup, theirs_setup = _Setup(), _Setup()
    ours, theirs = SCALERS[kind](), torch.amp.GradScaler("cpu", init_scale=2.0**16,
                                                          growth_interval=10**6)
    ours.scale(ours_setup.loss()).backward()
    ours.step(ours_setup.opt)
    with pytest.raises(RuntimeError):
        ours.step(ours_setup.opt)
    ours.update()
    theirs_setup.good_iteration(theirs)
    for _ in range(3):
        ours_setup.good_iteration(ours)
        theirs_setup.good_iteration(theirs)
    assert all(torch.equal(a, b) for a, b in zip(ours_setup.weights(), theirs_setup.weights()))
    assert ours_setup.steps == theirs_setup.steps == 4

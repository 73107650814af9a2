"""RecordingScaler beside torch's GradScaler (the oracle): every argument a learner's step passes
reaches the GradScaler, and ``called`` names each method used."""

from __future__ import annotations

import pytest
import torch

from fp16lab.exercises.recording import RecordingScaler


class _RecordingSGD(torch.optim.SGD):
    def __init__(self, params):
        super().__init__(params, lr=0.1)
        self.step_args: list[tuple] = []

    def step(self, *args, **kwargs):
        self.step_args.append((args, kwargs))
        return super().step()


def _loss(param):
    return (param * 3.0).sum()


def test_positional_and_keyword_arguments_reach_the_gradscaler():
    scaler = RecordingScaler("cpu", 8.0, growth_interval=7)
    oracle = torch.amp.GradScaler("cpu", 8.0, growth_interval=7)
    assert scaler.is_enabled() and oracle.is_enabled()
    assert (scaler.get_scale(), scaler.get_growth_interval()) == (8.0, 7)
    assert scaler.state_dict() == oracle.state_dict()


def test_step_passes_the_optimizers_arguments_on_and_update_its_new_scale():
    param = torch.nn.Parameter(torch.ones(4))
    opt = _RecordingSGD([param])
    scaler = RecordingScaler("cpu", init_scale=4.0)
    scaler.scale(_loss(param)).backward()
    scaler.step(opt, 5, flag=True)
    assert opt.step_args == [((5,), {"flag": True})]
    assert torch.equal(param.detach(), torch.full((4,), 1 - 0.1 * 3.0))  # unscaled gradient
    scaler.update(2.0)
    assert scaler.get_scale() == 2.0
    assert scaler.called == {"scale", "step", "update"}


@pytest.mark.parametrize("used", [("scale",), ("scale", "step"), ("scale", "step", "update")])
def test_called_names_exactly_the_methods_used(used):
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.1)
    scaler = RecordingScaler("cpu")
    assert scaler.called == set()
    scaler.scale(_loss(param)).backward()
    if "step" in used:
        scaler.step(opt)
    if "update" in used:
        scaler.update()
    assert scaler.called == set(used)

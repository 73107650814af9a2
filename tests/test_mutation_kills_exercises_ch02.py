"""Notebook 02's q3 (the AMP step) on each wrong answer its checker has a message for, and the
scenario it runs pinned against a loop written here (oracle: torch's GradScaler rules)."""

import math

import torch
import torch.nn.functional as F

from fp16lab.exercises import ch02


def _step(*, extra_step=False, update_to=None, no_unscale_no_update=False, clip_factor=1.0,
          raises=None):
    def amp_step(model, optimizer, scaler, x, y, max_norm):
        if raises:
            raise RuntimeError(raises)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=x.device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        if not no_unscale_no_update:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm * clip_factor)
        scaler.step(optimizer)
        if extra_step:
            optimizer.step()  # as well: the overflowing gradients are applied
        if update_to is not None:
            scaler.update(update_to)
        elif not no_unscale_no_update:
            scaler.update()
    return amp_step


def _message(step) -> str:
    fb = ch02.q3.check(step)
    assert not fb
    return fb.message


def test_q3_an_applied_overflow_is_named():
    assert _message(_step(extra_step=True)).startswith(
        "the weights contain inf/NaN: an overflowing step was applied.")


def test_q3_a_scale_pinned_by_hand_is_named():
    assert _message(_step(update_to=2.0**10)).startswith(
        "the scale never changed although the first steps overflowed")


def test_q3_a_second_step_without_update_is_gradscalers_own_message():
    message = _message(_step(no_unscale_no_update=True))
    assert message.startswith("GradScaler says: ") and "since the last update()" in message


def test_q3_another_runtime_error_is_not_blamed_on_gradscaler():
    message = _message(_step(raises="the learner's own bug"))
    assert "GradScaler says" not in message and "the learner's own bug" in message


def test_q3_a_step_that_differs_otherwise_gets_the_recipe():
    assert _message(_step(clip_factor=2.0)).startswith(
        "the weights after 5 steps differ from the AMP recipe's.")


def test_q3_scenario_is_the_one_the_notebook_describes():
    """The reference run, rebuilt here: the model, the five batches, SGD at lr 0.5 and a
    GradScaler from 2^40 backing off by 2^-10, growing after 2 clean steps; clipping at 0.05. Its scales follow
    GradScaler's rules: three overflows (2^40 -> 2^30 -> 2^20 -> 2^10), two clean steps at
    2^10, then growth to 2^11."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 8, generator=g), torch.randint(0, 4, (64,), generator=g))
               for _ in range(5)]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40, backoff_factor=2.0**-10,
                                  growth_interval=2)
    scales = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    assert [math.log2(s) for s in scales] == [30, 20, 10, 10, 11]
    weights, ref_scales, called = ch02._q3_run(None)
    assert ref_scales == scales and called == {"scale", "step", "update"}
    assert all(torch.equal(a, b.detach()) for a, b in zip(weights, model.parameters()))


def test_q2_a_word_is_refused_as_a_scale():
    assert _message_q2("sixteen") == "give the scale as a number such as 2**-12, not 'sixteen'."


def _message_q2(answer) -> str:
    fb = ch02.q2.check(answer)
    assert not fb
    return fb.message

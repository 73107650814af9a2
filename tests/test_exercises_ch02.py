"""Notebook 02's exercises, with right and wrong answers (oracles: float16 casts, torch's GradScaler)."""

import math

import torch
import torch.nn.functional as F

from fp16lab import training
from fp16lab.exercises import ch02


def test_q1_smallest_scale_that_keeps_layer_0():
    g = training.reference_gradients()[0][1]
    kept = [float(((g.double() * 2.0**k).half() != 0).double().mean()) for k in range(40)]
    k = next(k for k, v in enumerate(kept) if v >= 0.99)
    assert ch02.q1.check(2**k)
    assert "keeps only" in ch02.q1.check(2 ** (k - 1)).message
    assert "smaller power" in ch02.q1.check(2 ** (k + 1)).message
    assert "power of two" in ch02.q1.check(1000).message
    assert not ch02.q1.check("big")


def test_q2_gradscaler_trajectory():
    # oracle: drive torch's GradScaler by hand
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=3)
    scaler.scale(torch.ones(()))
    used = []
    for bad in ch02.Q2_FOUND_INF:
        used.append(scaler.get_scale())
        p.grad = torch.full((1,), math.inf if bad else 1.0)
        scaler.step(opt)
        scaler.update()
    assert ch02.q2.check(used[-1]) and used[-1] == 2.0**16
    assert "double it again" in ch02.q2.check(2**15).message
    assert "growth_interval clean steps" in ch02.q2.check(2**17).message
    assert not ch02.q2.check(2**20)


def _amp_step(model, optimizer, scaler, x, y, max_norm):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=x.device.type, dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss


def _variant(*, unscale=True, clip=True, scaler_step=True, update=True, autocast=True):
    def step(model, optimizer, scaler, x, y, max_norm):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=x.device.type, dtype=torch.float16, enabled=autocast):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        if unscale:
            scaler.unscale_(optimizer)
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if scaler_step:
            scaler.step(optimizer)
        else:
            optimizer.step()
        if update:
            scaler.update()
    return step


def test_q3_amp_step_right_and_each_usual_mistake():
    assert ch02.q3.check(_amp_step)
    cases = {"unscale_(optimizer) before clip": _variant(unscale=False),
             "were not clipped": _variant(clip=False),
             "instead of optimizer.step()": _variant(scaler_step=False),
             "Call scaler.update()": _variant(update=False),
             "ran in FP32": _variant(autocast=False)}
    for message, step in cases.items():
        fb = ch02.q3.check(step)
        assert not fb and message in fb.message, (message, fb.message)
    assert "function itself" in ch02.q3.check(None).message

    def no_scaler(model, optimizer, scaler, x, y, max_norm):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
    fb = ch02.q3.check(no_scaler)
    assert not fb and "never used the scaler" in fb.message and "update()" not in fb.message.split(":")[0]

    def empty(model, optimizer, scaler, x, y, max_norm):
        ...
    assert "changed neither" in ch02.q3.check(empty).message
    assert "must take" in ch02.q3.check(lambda model: None).message


def test_q4_skips_after_resuming_without_the_scaler_state():
    # oracle: a fresh torch GradScaler whose steps overflow while its scale is above 2^10
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.ones(()))
    skipped = 0
    while True:
        bad = scaler.get_scale() > ch02.Q4_SETTLED
        p.grad = torch.full((1,), math.inf if bad else 1.0)
        scaler.step(opt)
        scaler.update()
        if not bad:
            break
        skipped += 1
    assert ch02.q4.check(skipped) and skipped == 6
    assert "init_scale" in ch02.q4.check(0).message
    assert not ch02.q4.check(5) and not ch02.q4.check(6.5) and not ch02.q4.check("six")

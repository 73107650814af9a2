"""Exercises of notebook 02 (underflow and loss scaling), checked against torch's GradScaler."""

from __future__ import annotations

import copy
import inspect
import math

import torch
import torch.nn.functional as F

from ..scaling import replay_with_gradscaler, simulate_dynamic
from ..training import reference_gradients
from .core import Exercise, Wrong, expect_power_of_two
from .recording import RecordingScaler

__all__ = ["q1", "q2", "q3", "q4"]

#: q1 calls a layer alive in FP16 when at least this share of its gradient survives the cast.
ALIVE = 0.99
#: q2's overflow pattern and scaler settings.
Q2_FOUND_INF = (False, True, False, False, False, False)
Q2_SETTINGS = {"init_scale": 2.0**16, "growth_interval": 3}
#: q4: the scale the run had settled at, and the largest scale its gradients allow.
Q4_SETTLED = 2.0**10


def kept_in_fp16(grad: torch.Tensor, scale: float) -> float:
    """Returns the share of ``grad * scale`` (computed in float64) that is finite and non-zero in FP16."""
    scaled = (grad.double() * scale).to(torch.float16)
    return float((torch.isfinite(scaled) & (scaled != 0)).double().mean())


def _check_q1(answer: object) -> str:

    value = expect_power_of_two(answer, "the scale")
    name, grad = reference_gradients()[0]
    right = next(2.0**k for k in range(0, 40) if kept_in_fp16(grad, 2.0**k) >= ALIVE)
    kept = kept_in_fp16(grad, value)
    if value == right:
        below = kept_in_fp16(grad, right / 2)
        return (f"2^{math.log2(right):.0f}: FP16 keeps {kept:.1%} of {name}'s gradient at that scale "
                f"and {below:.1%} at half of it.")
    if value < right:
        raise Wrong(f"at {value:g} FP16 keeps only {kept:.1%} of {name}'s gradient; it needs "
                    f"{ALIVE:.0%}.")
    raise Wrong(f"{value:g} keeps {kept:.1%} of the gradient, but a smaller power of two is enough.")


q1 = Exercise(
    "q1", f"What is the smallest power-of-two loss scale at which FP16 keeps at least {ALIVE:.0%} "
          "of layer 0's gradient (training.reference_gradients()[0])? Answer like 2**12.",
    _check_q1,
    hint="Multiply the FP32 gradient by 2**k, cast it to torch.float16, and count the non-zero "
         "elements; try k = 0, 1, 2, ... until the share reaches 0.99.",
    solution="Loop over k and keep the first scale that passes.",
    solution_code="g = training.reference_gradients()[0][1]\n"
                  "next(2**k for k in range(40)\n"
                  "     if ((g.double() * 2**k).half() != 0).double().mean() >= 0.99)")


def _check_q2(answer: object) -> str:

    value = expect_power_of_two(answer, "the scale")
    used = [e.scale for e in replay_with_gradscaler(Q2_FOUND_INF, **Q2_SETTINGS)]
    right = used[-1]
    if value == right:
        return ("2^16: the overflow at step 1 halves it to 2^15 and resets the clean-step count; "
                "steps 2, 3 and 4 are clean, and the third clean step doubles it back for step 5.")
    if value == right / 2:
        raise Wrong("the scale does halve at the overflow, but growth_interval=3 clean steps in a "
                    "row double it again.")
    if value == right * 2:
        raise Wrong("a clean step does not double the scale by itself: it takes growth_interval "
                    "clean steps in a row, and the overflow reset the count.")
    raise Wrong(f"2^{math.log2(value):.0f} is not the scale GradScaler uses at step 5 (steps count "
                "from 0): start at 2^16, halve at each overflow, double after growth_interval clean "
                "steps in a row.")


q2 = Exercise(
    "q2", "GradScaler(init_scale=2**16, growth_interval=3) sees these steps: fine, overflow, fine, "
          "fine, fine, fine. Which scale does it use at the last step? Answer like 2**15.",
    _check_q2,
    hint="An overflow multiplies the scale by backoff_factor (0.5) and resets the count of clean "
         "steps; growth_interval clean steps in a row multiply it by growth_factor (2).",
    solution="2**16: 2^16, overflow -> 2^15, three clean steps -> 2^16.",
    solution_code="from fp16lab import scaling\n"
                  "[e.scale for e in scaling.replay_with_gradscaler([False, True, False, False, "
                  "False, False], init_scale=2**16, growth_interval=3)]")


# -- q3: the AMP training step ------------------------------------------------------------------
_Q3_MAX_NORM = 0.05


def _q3_setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 8, generator=g), torch.randint(0, 4, (64,), generator=g))
               for _ in range(5)]
    return model, batches


def _q3_run(step, *, autocast=True, unscale=True, clip=True, update=True, scaler_step=True):
    """Runs ``step`` (the learner's) or the reference with some parts left out, on 5 batches.

    Returns (the weights, the scale after each step, the scaler methods the step called).
    """
    model, batches = _q3_setup()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    # starts far too high, so the first steps overflow and must be skipped
    scaler = RecordingScaler("cpu", init_scale=2.0**40, backoff_factor=2.0**-10,
                              growth_interval=2)
    scales = []
    for x, y in batches:
        if step is not None:
            step(model, opt, scaler, x, y, _Q3_MAX_NORM)
        else:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            if unscale:
                scaler.unscale_(opt)
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), _Q3_MAX_NORM)
            if scaler_step:
                scaler.step(opt)
            else:
                opt.step()
            if update:
                scaler.update()
        scales.append(scaler.get_scale())
    return [p.detach().clone() for p in model.parameters()], scales, scaler.called


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a[0], b[0])) and a[1] == b[1]


def _check_q3(answer: object) -> str:
    if not callable(answer):
        raise Wrong("give the function itself: q3.check(amp_step), without calling it.")
    try:
        inspect.signature(answer).bind(None, None, None, None, None, None)
    except (TypeError, ValueError):
        raise Wrong("amp_step must take (model, optimizer, scaler, x, y, max_norm).") from None
    try:
        got = _q3_run(answer)
    except RuntimeError as exc:  # GradScaler's own misuse checks
        if "after step()" in str(exc) or "since the last update()" in str(exc):
            raise Wrong("GradScaler says: " + str(exc) + " Call scaler.update() at the end of "
                        "every step.") from None
        raise
    untouched = [p.detach().clone() for p in _q3_setup()[0].parameters()]
    if all(torch.equal(a, b) for a, b in zip(got[0], untouched)) and len(set(got[1])) == 1:
        raise Wrong("amp_step changed neither the weights nor the scale: write its body in place "
                    "of the ... (zero_grad, forward under autocast, backward through the scaler, "
                    "unscale_, clip, step, update).")
    if "scale" not in got[2]:
        raise Wrong("your step never used the scaler: the loss went backward unscaled, so small "
                    "FP16 gradients can underflow and nothing checks for inf. Backward through "
                    "scaler.scale(loss).backward(), then scaler.unscale_(optimizer), clip, "
                    "scaler.step(optimizer) and scaler.update().")
    if "step" not in got[2]:
        raise Wrong("your step never called scaler.step: call scaler.step(optimizer) instead of "
                    "optimizer.step(). It unscales the gradients and skips the step when they hold "
                    "inf/NaN (the first steps here overflow).")
    if _same(got, _q3_run(None)):
        return ("your step matches the reference bit for bit over 5 steps, the first ones "
                "overflowing: they were skipped and the scale backed off, then clipping saw the "
                "true (unscaled) gradient norm.")
    if any(not torch.isfinite(p).all() for p in got[0]):
        raise Wrong("the weights contain inf/NaN: an overflowing step was applied. Call "
                    "scaler.step(optimizer), which skips the step when the gradients hold "
                    "inf/NaN, instead of optimizer.step().")
    if len(set(got[1])) == 1:
        raise Wrong("the scale never changed although the first steps overflowed: call "
                    "scaler.update() at the end of every step.")
    diagnoses = (({"unscale": False}, "you clipped the scaled gradients: call "
                  "scaler.unscale_(optimizer) before clip_grad_norm_, so max_norm applies to the "
                  "true gradient."),
                 ({"clip": False}, "the gradients were not clipped: call "
                  "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) after unscale_."),
                 ({"autocast": False}, "the forward pass ran in FP32: wrap it in "
                  "torch.autocast(device_type=x.device.type, dtype=torch.float16)."))
    for parts, message in diagnoses:
        if _same(got, _q3_run(None, **parts)):
            raise Wrong(message)
    raise Wrong("the weights after 5 steps differ from the AMP recipe's. The order is: zero_grad, "
                "forward under autocast, scaler.scale(loss).backward(), scaler.unscale_(opt), "
                "clip, scaler.step(opt), scaler.update().")


q3 = Exercise(
    "q3", "Write amp_step(model, optimizer, scaler, x, y, max_norm): one FP16 AMP training step "
          "with cross-entropy and gradient clipping, on x's device.", _check_q3,
    hint="Six lines: zero_grad; loss under torch.autocast(device_type=x.device.type, "
         "dtype=torch.float16); scaler.scale(loss).backward(); scaler.unscale_; clip_grad_norm_; "
         "scaler.step; scaler.update.",
    solution="The loop of section 4, as a function.",
    solution_code="def amp_step(model, optimizer, scaler, x, y, max_norm):\n"
                  "    optimizer.zero_grad(set_to_none=True)\n"
                  "    with torch.autocast(device_type=x.device.type, dtype=torch.float16):\n"
                  "        loss = F.cross_entropy(model(x), y)\n"
                  "    scaler.scale(loss).backward()\n"
                  "    scaler.unscale_(optimizer)\n"
                  "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"
                  "    scaler.step(optimizer)\n"
                  "    scaler.update()\n"
                  "    return loss")


def _check_q4(answer: object) -> str:

    try:
        value = int(answer)
    except (TypeError, ValueError):
        raise Wrong(f"give a whole number of steps, not {answer!r}.") from None
    if value != answer:
        raise Wrong(f"give a whole number of steps, not {answer!r}.")
    # a fresh scaler starts at torch's default; a step overflows while the scale is above 2^10
    scale, flags = 2.0**16, []
    while scale > Q4_SETTLED:
        flags.append(True)
        scale *= 0.5
    events = simulate_dynamic(flags + [False])
    right = sum(e.skipped for e in events)
    if value == right:
        return (f"{right}: the fresh GradScaler starts at 2^16 and halves once per skipped step "
                f"down to 2^{math.log2(Q4_SETTLED):.0f}. Saving scaler.state_dict() with the "
                "checkpoint and loading it on resume skips none.")
    if value == 0:
        raise Wrong("a fresh GradScaler() does not know the old scale: it starts at its "
                    "init_scale, 2^16.")
    raise Wrong(f"{value} is not it: count the halvings from 2^16 down to 2^10.")


q4 = Exercise(
    "q4", "A run's scale had settled at 2**10 (any higher overflows). You resume from a checkpoint "
          "that saved the model and optimizer but not the scaler, with a fresh GradScaler(). How "
          "many steps are skipped before the first one is taken?", _check_q4,
    hint="GradScaler() starts at init_scale=2**16 and halves after every overflowing step.",
    solution="6: 2^16, 2^15, ..., 2^11 overflow; 2^10 does not.",
    solution_code="import math\nint(math.log2(2**16 / 2**10))")


"""What FP16's range and precision do to each module of a workload: one forward and backward
in fp32, and each module run again under autocast on the inputs it received.

:func:`module_numerics` returns, per leaf module (a module with no submodules):

- ``act_max`` and ``act_overflow``: the largest output magnitude in fp32 and the share of the
  output FP16 rounds to inf (at or above 65520, half a step above its largest value, 65504);
- ``grad_max``, ``grad_nonzero`` and the exponent histogram of the gradient of its output (what
  the backward pass carries, in FP16 under amp-fp16) and of its parameters' gradients, from
  which :func:`underflow_share` gives the share that FP16 flushes to zero at a loss scale;
- ``local_error``: ``||autocast(module)(x) - module(x)|| / ||module(x)||`` with ``x`` the fp32
  inputs it received, cast to the dtype they arrive in under autocast (FP16 after a linear
  layer, say), so each module's own error, not the error its inputs bring (inf where the
  autocast output is not finite). A module that draws random numbers (a dropout) is compared
  with both runs in eval mode (a dropout as the identity): on a GPU the same random state draws
  a different mask for a 16-bit input than for an fp32 one (on the H200, a dropout replayed
  from its random state differed from its fp32 output by 0.95 relative), so its error in
  training mode would be the masks', not the rounding's;
- ``grad_error``: the relative distance of its parameters' gradients between fp32 and the whole
  model under autocast (the loss scaled by ``scale`` and unscaled after, as GradScaler does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import validate
from ..diagnostics.fates import FP16_MAX, FP16_OVERFLOW_AT
from ..recipes import autocast, autocast_dtype
from ..workload import Workload, _loss_of, build_model, step_of
from ..workloads.batches import ModelInputs

#: Exponents (``torch.frexp``'s, ``|x| = m * 2**e`` with ``0.5 <= m < 1``) the histograms keep.
EXP_LOW, EXP_HIGH = -160, 130


@dataclass
class ModuleNumerics:
    """The figures of one leaf module (see the module's docstring)."""

    name: str
    kind: str
    act_max: float = 0.0
    act_overflow: float = 0.0
    act_count: int = 0
    grad_max: float = 0.0
    grad_hist: torch.Tensor | None = field(default=None, repr=False)
    local_error: float = 0.0
    grad_error: float | None = None

    def row(self) -> dict[str, Any]:
        return {"module": self.name, "kind": self.kind, "act_max": self.act_max,
                "act_overflow": self.act_overflow, "grad_max": self.grad_max,
                "local_error": self.local_error, "grad_error": self.grad_error}


def _exp_hist(t: torch.Tensor) -> torch.Tensor:
    a = t.detach().float().abs().reshape(-1)
    a = a[(a > 0) & torch.isfinite(a)]
    _, e = torch.frexp(a)
    e = e.clamp(EXP_LOW, EXP_HIGH) - EXP_LOW
    return torch.bincount(e.long(), minlength=EXP_HIGH - EXP_LOW + 1).cpu()


def underflow_share(hist: torch.Tensor | None, scale: float) -> float:
    """Returns the share of a histogram's non-zero values that FP16 flushes to zero once
    multiplied by ``scale`` (a power of two): ``|x| * scale < 2**-25``, half FP16's smallest
    subnormal, which rounds to zero."""
    scale = validate.number("scale", scale, low=0, low_open=True)
    if hist is None or int(hist.sum()) == 0:
        return 0.0
    k = math.log2(scale)
    # |x| = m 2^e, 0.5 <= m < 1: |x| * 2^k < 2^-25 exactly when e + k <= -25
    cut = int(math.floor(-25 - k)) - EXP_LOW
    lost = int(hist[: max(0, min(cut + 1, len(hist)))].sum())
    return lost / int(hist.sum())


def reached_scale(grad_max: float, init_scale: float = 2.0**16) -> float:
    """Returns the scale GradScaler settles at from ``init_scale`` (halving on each overflow)
    for gradients whose largest magnitude is ``grad_max``: the largest ``init_scale / 2**n``
    with ``grad_max * scale <= 65504``."""
    if not (grad_max > 0 and math.isfinite(grad_max)):
        return init_scale
    scale = init_scale
    while grad_max * scale > FP16_MAX and scale > 2.0**-24:
        scale /= 2
    return scale


def fitting_scale(grad_max: float) -> float:
    """Returns the largest power of two that keeps ``grad_max`` (scaled) at or below half of
    FP16's max, a factor of headroom for the gradients to grow."""
    if not (grad_max > 0 and math.isfinite(grad_max)):
        return 2.0**16
    return 2.0 ** math.floor(math.log2(FP16_MAX / 2 / grad_max))


def _leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    leaves = [(n, m) for n, m in model.named_modules() if not any(True for _ in m.children())]
    return leaves or [("", model)]


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((t for t in map(_first_tensor, value) if t is not None), None)
    if isinstance(value, dict) or hasattr(value, "values"):
        try:
            return next((t for t in map(_first_tensor, value.values()) if t is not None), None)
        except TypeError:
            return None
    return None


def _relative(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.detach().float(), ref.detach().float()
    if not torch.isfinite(a).all():
        return math.inf
    denom = float(ref.norm())
    return float((a - ref).norm()) / denom if denom > 0 else float(a.norm())


def module_numerics(workload: Workload, device: Any, batch_size: int, *, low: str = "amp-fp16",
                    init_scale: float = 2.0**16, seed: int = 0) -> list[ModuleNumerics]:
    """Returns the :class:`ModuleNumerics` of each leaf module of a fresh ``workload`` model on
    one batch of ``batch_size`` (see the module's docstring); ``low`` is the autocast precision
    the local and gradient errors are taken under."""
    device = torch.device(device)
    torch.manual_seed(seed)
    model = build_model(workload).to(device)
    inputs, targets = workload.batch(batch_size, device)
    step = step_of(workload, "fp32", model, inputs, targets, device=device)
    leaves = _leaves(model)
    found = {name: ModuleNumerics(name, type(m).__name__) for name, m in leaves}
    dev = device.type
    dtypes = _input_dtypes(step, leaves, low, dev)
    hooks = []
    replaying = False
    rng: dict[str, Any] = {}

    def pre_hook(name):
        def hook(module, args):
            if not replaying:  # the random state before it: did it draw (a dropout)?
                rng[name] = _rng_state(device)
        return hook

    def forward_hook(name):
        def hook(module, args, kwargs, output):
            nonlocal replaying
            out = _first_tensor(output)
            if replaying or out is None or not out.is_floating_point():
                return
            a = out.detach().float().abs()
            f = found[name]
            f.act_max = max(f.act_max, float(a.max()) if a.numel() else 0.0)
            f.act_overflow = float((a >= FP16_OVERFLOW_AT).sum()) / max(a.numel(), 1)
            f.act_count = a.numel()
            # the module again under autocast, here and now: an in-place op after it (a
            # ReLU(inplace=True), a residual +=) changes its output before a later replay
            random = _drew_random(rng.pop(name, None), device)
            replaying = True
            try:
                low_out = _replay(module, args, kwargs, dtypes.get(name, ()), low, device,
                                  random)
                ref = out if not random else _replay(
                    module, args, kwargs, _dtypes_of(args), "fp32", device, random)
            finally:
                replaying = False
            if low_out is not None and ref is not None:  # called twice or more: its worst call
                f.local_error = max(f.local_error, _relative(low_out, ref))
            if out.requires_grad:
                out.register_hook(grad_hook(name))
        return hook

    def grad_hook(name):
        def hook(grad):
            f = found[name]
            h = _exp_hist(grad)
            f.grad_hist = h if f.grad_hist is None else f.grad_hist + h
            g = grad.detach().abs()
            f.grad_max = max(f.grad_max, float(g[torch.isfinite(g)].max()) if g.numel() else 0.0)
        return hook

    for name, m in leaves:
        hooks.append(m.register_forward_pre_hook(pre_hook(name)))
        hooks.append(m.register_forward_hook(forward_hook(name), with_kwargs=True))
    try:
        model.zero_grad(set_to_none=True)
        loss = step.forward_loss()
        loss.backward()
    finally:
        for h in hooks:
            h.remove()
    grads32 = {}
    for name, m in leaves:
        f = found[name]
        for p in m.parameters(recurse=False):
            if p.grad is not None:
                h = _exp_hist(p.grad)
                f.grad_hist = h if f.grad_hist is None else f.grad_hist + h
                g = p.grad.detach().abs()
                f.grad_max = max(f.grad_max, float(g.max()) if g.numel() else 0.0)
        grads32[name] = [p.grad.detach().clone() for p in m.parameters(recurse=False)
                         if p.grad is not None]
    scale = reached_scale(max((f.grad_max for f in found.values()), default=0.0), init_scale)
    model.zero_grad(set_to_none=True)
    with autocast(low, dev):
        loss = _loss_of(workload)(step.forward(ModelInputs(inputs)), targets)
    if dtype_scaled(low):
        (loss.float() * scale).backward()
    else:
        loss.float().backward()
    for name, m in leaves:
        low_grads = [p.grad for p in m.parameters(recurse=False) if p.grad is not None]
        if grads32[name] and len(low_grads) == len(grads32[name]):
            div = scale if dtype_scaled(low) else 1.0
            errs = [_relative(g / div, ref) for g, ref in zip(low_grads, grads32[name])]
            found[name].grad_error = max(errs)
    model.zero_grad(set_to_none=True)
    return [found[name] for name, _ in leaves]


def _input_dtypes(step: Any, leaves: list[tuple[str, nn.Module]], low: str,
                  dev: str) -> dict[str, tuple[Any, ...]]:
    """Returns the dtype of each positional input of each leaf in a forward under autocast
    (None for an argument that is not a floating tensor): what the module receives there."""
    dtypes: dict[str, tuple[Any, ...]] = {}

    def hook(name):
        def record(module, args):
            dtypes.setdefault(name, tuple(a.dtype if isinstance(a, torch.Tensor)
                                          and a.is_floating_point() else None for a in args))
        return record

    hooks = [m.register_forward_pre_hook(hook(n)) for n, m in leaves]
    try:
        with torch.no_grad(), autocast(low, dev):
            step.forward(ModelInputs(step.inputs))
    finally:
        for h in hooks:
            h.remove()
    return dtypes


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    return (torch.get_rng_state(),
            torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _drew_random(before: tuple[torch.Tensor, torch.Tensor | None] | None,
                 device: torch.device) -> bool:
    """Whether the random state moved since ``before`` (:func:`_rng_state`): the module that
    just ran drew random numbers."""
    if before is None:
        return False
    return any(b is not None and not torch.equal(b, a)
               for b, a in zip(before, _rng_state(device)))


def _dtypes_of(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.dtype if isinstance(a, torch.Tensor) and a.is_floating_point() else None
                 for a in args)


def _replay(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
            dtypes: tuple[Any, ...], low: str, device: torch.device,
            random: bool = False) -> torch.Tensor | None:
    """Returns ``module``'s output under autocast ``low`` on copies of ``args`` cast to
    ``dtypes`` (what it receives under autocast), or None where it cannot be called on them
    again. ``random``: a module that draws random numbers, run in eval mode (a dropout as the
    identity), its training mode put back after. The random state after the replay is the one
    before: the fp32 pass goes on as if there had been none."""
    args = tuple(_as_dtype(a, d) for a, d in zip(args, dtypes)) + tuple(args[len(dtypes):])
    cuda = [device] if device.type == "cuda" else []
    training = module.training
    try:
        if random:
            module.train(False)
        with torch.random.fork_rng(devices=cuda), torch.no_grad(), autocast(low, device.type):
            return _first_tensor(module(*args, **kwargs))
    except Exception:  # noqa: BLE001 - a module that cannot be called on its own inputs again
        return None
    finally:
        module.train(training)


def _as_dtype(value: Any, dtype: Any) -> Any:
    """A copy of ``value`` in ``dtype`` (a copy: an in-place module replayed must not change
    the tensor the model goes on with)."""
    if dtype is None or not isinstance(value, torch.Tensor):
        return value
    return value.detach().to(dtype, copy=True)


def dtype_scaled(precision: str) -> bool:
    return autocast_dtype(precision) == torch.float16

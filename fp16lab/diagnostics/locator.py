"""Finding the first inf/NaN of a training step: which module produced it, forward or backward."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
from torch import nn


@dataclass(frozen=True)
class NonFiniteReport:
    """Where an inf/NaN first appeared during one training step."""

    module: str            # dotted module name ("" is the whole model)
    phase: str             # "input batch" (the batch fed to the model already holds it),
                           # "forward", "backward" (gradient w.r.t. the module's input) or
                           # "parameter gradient"
    tensor: str            # which tensor: "output 0", "input 0", or the parameter's name
    dtype: str
    shape: tuple[int, ...]
    n_inf: int
    n_nan: int
    finite_min: float      # of the finite values (nan if none)
    finite_max: float

    def as_dict(self) -> dict[str, Any]:
        """Returns the fields as a dict."""
        return asdict(self)

    def __str__(self) -> str:
        where = self.module or "<model>"
        if self.phase == "input batch":
            return (f"the input batch itself holds non-finite values ({self.tensor} of the model, "
                    f"{self.dtype} {list(self.shape)}: {self.n_inf} inf, {self.n_nan} NaN): "
                    f"no layer produced them; look at the data pipeline")
        return (f"first non-finite value in {self.phase} of {where!r} ({self.tensor}, "
                f"{self.dtype} {list(self.shape)}): {self.n_inf} inf, {self.n_nan} NaN; finite "
                f"values range over [{self.finite_min:.3g}, {self.finite_max:.3g}]")


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _tensors(item)]
    return []


def _describe(t: torch.Tensor) -> tuple[int, int, float, float]:
    t = t.detach()
    n_inf = int(torch.isinf(t).sum())
    n_nan = int(torch.isnan(t).sum())
    fin = t[torch.isfinite(t)].double()
    lo = float(fin.min()) if fin.numel() else math.nan
    hi = float(fin.max()) if fin.numel() else math.nan
    return n_inf, n_nan, lo, hi


def _nonfinite(t: torch.Tensor) -> bool:
    return t.is_floating_point() and not bool(torch.isfinite(t.detach()).all())


def locate_first_nonfinite(model: nn.Module, step: Callable[[], torch.Tensor], *,
                           backward: bool = True, loss_scale: float = 1.0
                           ) -> NonFiniteReport | None:
    """Returns where the first inf/NaN of one training step appeared, or None if none did.

    Runs ``loss = step()`` (the forward pass and loss, e.g. under autocast) and, if ``backward``,
    ``(loss * loss_scale).backward()``, with temporary hooks:

    * forward: a module *produced* a non-finite value if its output has one and its inputs do
      not; the innermost such module reports first;
    * backward: a tensor hook on every leaf module's inputs sees the gradient that module's
      backward produced; the first non-finite one in backward order is reported (a functional
      op between two modules is attributed to the module whose input it feeds);
    * parameter gradients are checked as they are accumulated;
    * an inf/NaN already in the input batch (a tensor given to the model) is reported as phase
      ``"input batch"``: no layer is to blame.

    Gradients left in ``.grad`` by an earlier step are set to None first (as
    ``optimizer.zero_grad()`` does): a NaN gradient from an earlier step would otherwise be
    accumulated into this step's and blamed on it. The parameters' ``.grad`` after the call are
    this step's.

    This syncs with the device at every module: a debugging tool, not something to leave on.
    """
    names = {m: n for n, m in model.named_modules()}
    leaves = {m for m in names if not list(m.children())}
    found: list[NonFiniteReport] = []
    handles = []

    def report(module_name, phase, what, t):
        if found:
            return
        n_inf, n_nan, lo, hi = _describe(t)
        found.append(NonFiniteReport(module_name, phase, what, str(t.dtype).replace("torch.", ""),
                                     tuple(t.shape), n_inf, n_nan, lo, hi))

    def pre_hook(module, args):
        if module is model:
            bad = [(k, t) for k, t in enumerate(_tensors(args)) if _nonfinite(t)]
            if bad:
                report("", "input batch", f"input {bad[0][0]}", bad[0][1])
        if not backward or module not in leaves:
            return
        for k, t in enumerate(_tensors(args)):
            if t.requires_grad:
                def on_grad(g, _k=k, _name=names[module]):
                    if _nonfinite(g):
                        report(_name, "backward", f"input {_k}", g)
                t.register_hook(on_grad)

    def fwd_hook(module, args, output):
        if found:
            return
        outs = _tensors(output)
        bad = [i for i, t in enumerate(outs) if _nonfinite(t)]
        if bad and not any(_nonfinite(t) for t in _tensors(args)):
            report(names[module], "forward", f"output {bad[0]}", outs[bad[0]])

    for m in names:
        handles.append(m.register_forward_pre_hook(pre_hook))
        handles.append(m.register_forward_hook(fwd_hook))
    for mod_name, m in model.named_modules():
        for p_name, p in m.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            full = f"{mod_name}.{p_name}" if mod_name else p_name

            def on_param(q, _m=mod_name, _f=full):
                if _nonfinite(q.grad):
                    report(_m, "parameter gradient", _f, q.grad)
            handles.append(p.register_post_accumulate_grad_hook(on_param))
    if backward:
        for p in model.parameters():
            p.grad = None  # a stale NaN from an earlier step must not be blamed on this one
    try:
        loss = step()
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"step() must return the loss tensor, got {type(loss).__name__}")
        if not found and _nonfinite(loss):
            report("", "forward", "loss", loss)
        if backward:
            (loss * loss_scale).backward()
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None

"""Measured demonstrations for notebook 02: an overflowing model, clipping before unscale_, a scheduler warning."""

from __future__ import annotations

import copy
import warnings
from typing import Any, Callable

import torch
from torch import nn

from .. import validate
from ..scaling import DEFAULT_INIT_SCALE, GradScalerRecorder, ScaleCollapseWarning, classify_skips
from .islands import Gram


def overflow_demo_model(device: str = "cpu", width: int = 64, level: float = 20.0
                        ) -> tuple[nn.Module, torch.Tensor]:
    """Returns (model, inputs) whose ``scores`` layer (a :class:`Gram`) overflows FP16 under
    autocast: a stand-in for an unnormalised attention or a sum of squares."""
    device = validate.device("device", device)
    width = validate.count("width", width)
    level = validate.number("level", level, low=0, low_open=True)
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("embed", nn.Linear(width, width))
    model.add_module("act", nn.Tanh())
    model.add_module("proj", nn.Linear(width, width))
    model.add_module("scores", Gram())
    model.add_module("head", nn.Flatten())
    with torch.no_grad():
        model.proj.weight.mul_(level * width**0.5)  # large activations, as after a bad init
    return model.to(device), torch.randn(8, width, device=device)


def overflow_demo(device: str = "cpu") -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    """Returns (model, step): :func:`overflow_demo_model` and a function running its forward
    pass under FP16 autocast and returning a loss, ready for :func:`locate_first_nonfinite`."""
    model, x = overflow_demo_model(device)

    def step() -> torch.Tensor:
        with torch.autocast(device, dtype=torch.float16):
            out = model(x)
        return out.float().mean()

    return model, step


def clipping_demo(device: str = "cpu", max_norm: float = 1.0,
                  init_scale: float = DEFAULT_INIT_SCALE,
                  seed: int = 0) -> "Any":
    """Returns a DataFrame: gradient clipping with and without ``scaler.unscale_`` first.

    One step of a small model with a real ``torch.amp.GradScaler``. ``true_grad_norm`` is the
    unscaled gradient norm (from an unscaled backward), ``norm_seen_by_clip`` what
    ``clip_grad_norm_`` returned, ``applied_grad_norm`` the norm of the gradients the optimizer
    actually used (read after ``scaler.step``), and ``update_norm / lr`` the same, measured from
    the parameters. Without ``unscale_`` the clip acts on scaled gradients: the applied norm is
    ``max_norm / scale`` instead of ``max_norm``.
    """
    import pandas as pd

    device = validate.device("device", device)
    max_norm = validate.number("max_norm", max_norm, low=0, low_open=True)
    init_scale = validate.number("init_scale", init_scale, low=0, low_open=True)
    torch.manual_seed(validate.count("seed", seed, low=0))
    base = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    x = torch.randn(64, 32, device=device)
    y = torch.randn(64, 4, device=device) * 10

    def loss_of(model):
        with torch.autocast(device, dtype=torch.float16):
            out = model(x)
        return (out.float() - y).pow(2).mean()

    ref = copy.deepcopy(base)
    loss_of(ref).backward()
    true_norm = float(torch.norm(torch.stack([p.grad.norm() for p in ref.parameters()])))
    rows = []
    lr = 0.1
    for unscale_first in (True, False):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(device, init_scale=init_scale)
        before = [p.detach().clone() for p in model.parameters()]
        scaler.scale(loss_of(model)).backward()
        if unscale_first:
            scaler.unscale_(opt)
        seen = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
        scaler.step(opt)
        scaler.update()
        applied = float(torch.norm(torch.stack([p.grad.norm() for p in model.parameters()])))
        upd = float(torch.norm(torch.stack([(p.detach() - b).norm()
                                            for p, b in zip(model.parameters(), before)])))
        rows.append({"recipe": "unscale_ then clip" if unscale_first else "clip scaled grads",
                     "scale": init_scale, "max_norm": max_norm, "true_grad_norm": true_norm,
                     "norm_seen_by_clip": seen, "applied_grad_norm": applied,
                     "update_norm_over_lr": upd / lr})
    return pd.DataFrame(rows)


def scheduler_warning_demo(device: str = "cpu", steps: int = 40, seed: int = 0) -> dict[str, Any]:
    """Returns what happens to the LR-scheduler warning and the skips in two short runs.

    ``warm-up``: a healthy model with ``init_scale=2**24``: the first steps overflow and are
    skipped while the scale calibrates, so the first ``scheduler.step()`` comes before any
    ``optimizer.step()`` and PyTorch warns about the call order (harmless here).
    ``broken``: the inputs overflow FP16 in the forward pass (values ~1e5), so every step is
    skipped and the scale collapses: the same warning, but a real problem.

    Returns:
        dict run -> {"scheduler_warning": text or None, "collapse_warning": text or None,
        "skipped": list of skipped step indices, "history": DataFrame, **classify_skips(...)}.
    """
    device = validate.device("device", device)
    steps = validate.count("steps", steps)
    seed = validate.count("seed", seed, low=0)
    out = {}
    for run, x_level, init_scale in (("warm-up", 1.0, 2.0**24), ("broken", 1e5, 2.0**16)):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
        rec = GradScalerRecorder(torch.amp.GradScaler(device, init_scale=init_scale,
                                                      growth_interval=1000))
        x = torch.randn(32, 16, device=device) * x_level
        y = torch.randn(32, 1, device=device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(steps):
                opt.zero_grad()
                with torch.autocast(device, dtype=torch.float16):
                    pred = model(x)
                loss = (pred.float() - y).pow(2).mean()
                rec.scale(loss).backward()
                rec.step(opt)
                rec.update()
                sched.step()
        sched_w = next((str(w.message) for w in caught
                        if "lr_scheduler.step()" in str(w.message)), None)
        coll_w = next((str(w.message) for w in caught
                       if issubclass(w.category, ScaleCollapseWarning)), None)
        hist = rec.history
        out[run] = {"scheduler_warning": sched_w, "collapse_warning": coll_w,
                    "skipped": [e.step for e in hist if e.skipped],
                    "history": rec.history_frame(), **classify_skips(hist)}
    return out

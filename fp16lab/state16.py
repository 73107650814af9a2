"""Weights and optimizer state in 16 bits: when the FP32 master copy can go, and what it costs.

A BF16 weight has 8 significant bits, so an update smaller than half its spacing rounds away
(*swamping*): ``w + u == w``. Mixed precision avoids it with an FP32 master copy of every
weight; the ways to do without it, written here as small readable versions of what the field's
packages do:

- :func:`stochastic_round_bf16`: round an FP32 tensor to BF16 up or down with probabilities
  given by the distance to each neighbour, so a small update survives on average;
- Kahan-compensated updates: a BF16 buffer per weight keeps what the last rounding lost and
  adds it back into the next update;
- :class:`AdamW16`: AdamW over BF16 (or FP32) weights with ``rounding="nearest"``,
  ``"stochastic"`` or ``"kahan"`` and its moments in FP32 or BF16;
- :func:`vanished_share`: the share of non-zero updates that leave a 16-bit weight unchanged;
- :func:`bytes_per_parameter`: what each way holds per parameter, predicted.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from . import validate

#: The ways to hold weights and optimizer state this module predicts the bytes of.
METHODS = ("fp32-master", "bf16-nearest", "bf16-stochastic", "bf16-kahan", "bf16-8bit-state")
ROUNDINGS = ("nearest", "stochastic", "kahan")


def stochastic_round_bf16(x: torch.Tensor, generator: torch.Generator | None = None
                          ) -> torch.Tensor:
    """Returns ``x`` (float32) rounded to bfloat16 stochastically: to the neighbour above with
    probability (distance from the one below) / (their spacing), else to the one below.

    BF16 is FP32 with the low 16 bits dropped, so adding a uniform random 16-bit integer to the
    bits and then dropping the low 16 rounds up exactly when the dropped part plus the random
    number carries: with probability dropped / 2**16. Infinities and NaN are kept as they are."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError(f"x must be a float32 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    bits = x.view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device,
                          generator=generator)
    rounded = ((bits + noise) & -65536).view(torch.float32)  # -65536 == 0xFFFF0000
    out = torch.where(torch.isfinite(x), rounded, x)
    return out.to(torch.bfloat16)  # exact: the low 16 bits are zero


def vanished_share(weights: torch.Tensor, update: torch.Tensor) -> float:
    """Returns the share of the non-zero entries of ``update`` that leave ``weights`` (a 16-bit
    tensor) unchanged once added and rounded to its dtype to nearest: the updates swamped."""
    if weights.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"weights must be bfloat16 or float16, got {weights.dtype}")
    moved = update != 0
    n = int(moved.sum())
    if n == 0:
        return 0.0
    after = (weights.float() + update.float()).to(weights.dtype)
    return int(((after == weights) & moved).sum()) / n


def bytes_per_parameter(method: str, *, gradient: bool = True) -> int:
    """Returns the bytes per parameter that ``method`` of :data:`METHODS` holds for AdamW: the
    weight, its gradient (with ``gradient``), the two moments, and the master copy or the
    compensation buffer. fp32-master: 4 (FP32 weight, autocast's BF16 copies are transient) + 4
    + 8; bf16-nearest and bf16-stochastic: 2 + 2 + 8; bf16-kahan: 2 + 2 + 8 + 2; bf16-8bit-state:
    2 + 2 + 2 (the moments in one byte each; the per-block scales are left out)."""
    validate.choice("method", method, METHODS)
    validate.boolean("gradient", gradient)
    weight = 4 if method == "fp32-master" else 2
    moments = 2 if method == "bf16-8bit-state" else 8
    extra = 2 if method == "bf16-kahan" else 0
    return weight + (weight if gradient else 0) + moments + extra


class AdamW16(torch.optim.Optimizer):
    """AdamW for weights held in BF16 (or FP32), the update rounded as ``rounding`` says.

    The update is computed in FP32 from FP32 (or ``state_dtype``) moments, as
    ``torch.optim.AdamW`` computes it (decoupled weight decay, bias-corrected moments); then:

    - ``"nearest"``: ``w = bf16(w + u)``, where updates below half of w's spacing vanish;
    - ``"stochastic"``: ``w = stochastic_round_bf16(w + u)``, unbiased on average;
    - ``"kahan"``: ``y = u + c; w_new = bf16(w + y); c = bf16(y - (w_new - w))``, the buffer
      ``c`` carrying what the rounding lost into the next step.

    ``vanished`` (after each step) is the share of non-zero updates that left their weight
    unchanged, over all parameters (under ``"kahan"`` such an update is not lost: it waits in
    the buffer). With FP32 weights every rounding is FP32's, as ``torch.optim.AdamW`` does.
    The moments in 8 bits (bitsandbytes' optimizers) are not written here.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, *, rounding: str = "nearest",
                 state_dtype: torch.dtype = torch.float32,
                 generator: torch.Generator | None = None):
        lr = validate.number("lr", lr, low=0, low_open=True)
        b1 = validate.number("betas[0]", betas[0], low=0, high=1, high_open=True)
        b2 = validate.number("betas[1]", betas[1], low=0, high=1, high_open=True)
        eps = validate.number("eps", eps, low=0, low_open=True)
        weight_decay = validate.number("weight_decay", weight_decay, low=0)
        validate.choice("rounding", rounding, ROUNDINGS)
        validate.choice("state_dtype", state_dtype, (torch.float32, torch.bfloat16))
        super().__init__(params, {"lr": lr, "betas": (b1, b2), "eps": eps,
                                  "weight_decay": weight_decay})
        self.rounding, self.state_dtype, self.generator = rounding, state_dtype, generator
        self.vanished = 0.0

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        lost = moved = 0
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["m"] = torch.zeros_like(p, dtype=self.state_dtype)
                    st["v"] = torch.zeros_like(p, dtype=self.state_dtype)
                    if self.rounding == "kahan":
                        st["c"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                g = p.grad.float()
                m = st["m"].float().lerp_(g, 1 - b1)  # torch.optim.AdamW's order of operations
                v = st["v"].float().mul_(b2).addcmul_(g, g, value=1 - b2)
                st["m"].copy_(m)
                st["v"].copy_(v)
                w = p.float()
                step_size = group["lr"] / (1 - b1 ** t)
                denom = (v.sqrt() / (1 - b2 ** t) ** 0.5).add_(group["eps"])
                exact = (w * (1 - group["lr"] * group["weight_decay"])).addcdiv_(
                    m, denom, value=-step_size)
                u = exact - w
                moved += int((u != 0).sum())
                if p.dtype == torch.float32:
                    new = exact
                elif self.rounding == "stochastic":
                    new = stochastic_round_bf16(w + u, self.generator).to(p.dtype)
                elif self.rounding == "kahan":
                    y = u + st["c"].float()
                    new = (w + y).to(p.dtype)
                    st["c"].copy_((y - (new.float() - w)).to(p.dtype))
                else:
                    new = (w + u).to(p.dtype)
                lost += int(((new == p) & (u != 0)).sum())
                p.copy_(new)
        self.vanished = lost / moved if moved else 0.0
        return loss


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Returns the bytes the optimizer's state tensors hold (moments, buffers), counted."""
    return sum(v.numel() * v.element_size() for st in optimizer.state.values()
               for v in st.values() if isinstance(v, torch.Tensor))


__all__ = ["AdamW16", "METHODS", "ROUNDINGS", "bytes_per_parameter", "state_bytes",
           "stochastic_round_bf16", "vanished_share"]

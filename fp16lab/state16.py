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
from .device import import_torchao_quietly

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


def _adamw_settings(lr: Any, betas: Any, eps: Any, weight_decay: Any) -> dict[str, Any]:
    """Returns AdamW's settings checked (the same checks for AdamW16 and the field's optimizers)."""
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be two numbers (beta1, beta2), got {betas!r}")
    return {"lr": validate.number("lr", lr, low=0, low_open=True),
            "betas": (validate.number("betas[0]", betas[0], low=0, high=1, high_open=True),
                      validate.number("betas[1]", betas[1], low=0, high=1, high_open=True)),
            "eps": validate.number("eps", eps, low=0, low_open=True),
            "weight_decay": validate.number("weight_decay", weight_decay, low=0)}


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
    The moments in 8 bits are not written here: :func:`field_optimizer` gives torchao's
    (and the other ways as the field's packages hold them, to check this one against).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, *, rounding: str = "nearest",
                 state_dtype: torch.dtype = torch.float32,
                 generator: torch.Generator | None = None):
        hyper = _adamw_settings(lr, betas, eps, weight_decay)
        validate.choice("rounding", rounding, ROUNDINGS)
        validate.choice("state_dtype", state_dtype, (torch.float32, torch.bfloat16))
        super().__init__(params, hyper)
        self.rounding, self.state_dtype, self.generator = rounding, state_dtype, generator
        self._counts: tuple[Any, Any] = (0, 0)  # (lost, moved) of the last step, on the device

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's add_param_group (which the constructor calls for each group too), refusing
        weights other than float32 and bfloat16: the class rounds to BF16."""
        params = param_group["params"]
        for p in [params] if isinstance(params, torch.Tensor) else list(params):
            if p.dtype not in (torch.float32, torch.bfloat16):
                raise TypeError(f"AdamW16 updates float32 or bfloat16 weights, got a {p.dtype} "
                                f"tensor of shape {tuple(p.shape)}")
        super().add_param_group(param_group)

    @property
    def vanished(self) -> float:
        """The share of the last step's non-zero updates that left their weight unchanged (0.0
        before the first step). Counted on the device during the step and read here, once:
        a read per parameter would stop the GPU at every parameter."""
        lost, moved = (int(c) for c in self._counts)
        return lost / moved if moved else 0.0

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        lost: Any = 0
        moved: Any = 0
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for dtype in dict.fromkeys(p.dtype for p in params):  # one pass per weight dtype
                counts = self._update([p for p in params if p.dtype == dtype], group)
                lost, moved = lost + counts[0], moved + counts[1]
        self._counts = (lost, moved)
        return loss

    def _update(self, params: list[torch.Tensor], group: dict[str, Any]) -> tuple[Any, Any]:
        """Updates ``params`` (all of one dtype) in place; returns (lost, moved) on the device.

        The arithmetic is the per-tensor lines of the class docstring applied to every tensor
        of the list at once (``torch._foreach_*``, as ``torch.optim.AdamW(foreach=True)`` does):
        one launch per operation instead of one per operation and tensor, which on a GPU is
        what a small model's step costs. The rounding and the counting run on the
        concatenated tensors, for the same reason."""
        b1, b2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        states = [self._state(p) for p in params]
        for st in states:
            st["step"] += 1
        steps = [st["step"] for st in states]
        g = [p.grad.float() for p in params]
        m = [st["m"].float() for st in states]  # the state itself when it is FP32
        v = [st["v"].float() for st in states]
        torch._foreach_lerp_(m, g, 1 - b1)  # torch.optim.AdamW's order of operations
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, g, g, value=1 - b2)
        if self.state_dtype != torch.float32:
            torch._foreach_copy_([st["m"] for st in states], m)
            torch._foreach_copy_([st["v"] for st in states], v)
        w = [p.float() for p in params]  # the weight itself when it is FP32
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, [(1 - b2 ** t) ** 0.5 for t in steps])
        torch._foreach_add_(denom, eps)
        exact = torch._foreach_mul(w, 1 - lr * wd)
        torch._foreach_addcdiv_(exact, m, denom, [-lr / (1 - b1 ** t) for t in steps])
        u = torch._foreach_sub(exact, w)
        dtype = params[0].dtype
        flat_w, flat_u = concat_flat(w), concat_flat(u)
        if dtype == torch.float32:
            new = concat_flat(exact)
        elif self.rounding == "stochastic":
            new = stochastic_round_bf16(flat_w + flat_u, self.generator)  # BF16, as the weights
        elif self.rounding == "kahan":
            c = [st["c"] for st in states]
            y = flat_u + concat_flat(c).float()
            new = (flat_w + y).to(dtype)
            torch._foreach_copy_(c, _split(y - (new.float() - flat_w), c))
        else:
            new = (flat_w + flat_u).to(dtype)
        nonzero = flat_u != 0
        lost = ((new == concat_flat(params)) & nonzero).sum()
        torch._foreach_copy_(params, _split(new, params))
        return lost, nonzero.sum()

    def _state(self, p: torch.Tensor) -> dict[str, Any]:
        """Returns ``p``'s state, made on its first step: the step count, the two moments and,
        under ``"kahan"``, the compensation buffer (in ``p``'s dtype)."""
        st = self.state[p]
        if not st:
            st["step"] = 0
            st["m"] = torch.zeros_like(p, dtype=self.state_dtype)
            st["v"] = torch.zeros_like(p, dtype=self.state_dtype)
            if self.rounding == "kahan":
                st["c"] = torch.zeros_like(p)
        return st


def concat_flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Returns the tensors' values one after another in one 1-D tensor (a copy)."""
    return torch.cat([t.reshape(-1) for t in tensors])


def _split(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Returns ``flat`` cut into views shaped as the tensors of ``like``, in order."""
    parts = flat.split([t.numel() for t in like])
    return [part.view(t.shape) for part, t in zip(parts, like)]


def _storages(t: torch.Tensor) -> list[torch.Tensor]:
    """Returns the plain tensors that hold ``t``'s bytes: ``t`` itself, or for a tensor subclass
    (torchao's 8-bit state: codes, per-block scales, a code map) the tensors it is made of."""
    if hasattr(t, "__tensor_flatten__"):  # plain tensors (and Parameters) have no such method
        names, _ = t.__tensor_flatten__()
        return [s for n in names for s in _storages(getattr(t, n))]
    return [t]


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Returns the bytes the optimizer's state tensors hold (moments, buffers, a quantized
    state's codes and scales), counted once per storage."""
    seen: dict[tuple[str, int], int] = {}
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                for t in _storages(v):
                    key = (str(t.device), t.untyped_storage().data_ptr())
                    seen[key] = max(seen.get(key, 0), t.numel() * t.element_size())
    return sum(seen.values())


#: Where the field's packages hold each way of :data:`METHODS`: (package, what it is).
FIELD = {
    "fp32-master": ("torch", "torch.optim.AdamW on FP32 weights"),
    "bf16-nearest": ("torch", "torch.optim.AdamW on BF16 weights (its moments BF16 too)"),
    "bf16-stochastic": ("torchao", "torchao.optim._AdamW(bf16_stochastic_round=True)"),
    "bf16-kahan": ("optimi", "torch-optimi's optimi.AdamW(kahan_sum=True), moments BF16"),
    "bf16-8bit-state": ("torchao", "torchao.optim.AdamW8bit(bf16_stochastic_round=True): moments "
                                   "in 8 bits per block of 256, BF16 weights rounded stochastically"),
}
_PIP = {"torch": "torch", "torchao": "torchao", "optimi": "torch-optimi"}


def field_unavailable(method: str) -> str | None:
    """Returns why the field package for ``method`` cannot be used here, or None."""
    validate.choice("method", method, METHODS)
    package = FIELD[method][0]
    try:
        __import__(package)
    except ImportError:
        return (f"{method} from the field needs {_PIP[package]} (pip install {_PIP[package]}, "
                "or pip install 'fp16lab[state16]')")
    return None


def field_optimizer(method: str, params: Iterable[Any], lr: float, *, weight_decay: float = 0.0,
                    betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
                    ) -> torch.optim.Optimizer:
    """Returns the field package's AdamW for ``method`` (see :data:`FIELD`), with the same
    hyperparameters :class:`AdamW16` takes; raises ValueError naming the package to install
    where it is missing. The weights must already be in the method's dtype."""
    why = field_unavailable(method)
    if why:
        raise ValueError(why)
    hyper = _adamw_settings(lr, betas, eps, weight_decay)
    if method in ("fp32-master", "bf16-nearest"):
        return torch.optim.AdamW(params, **hyper)
    if method == "bf16-kahan":
        import optimi  # optional: torch-optimi
        return optimi.AdamW(params, kahan_sum=True, foreach=False, **hyper)
    import_torchao_quietly()
    import torchao.optim  # optional: torchao
    cls = torchao.optim.AdamW8bit if method == "bf16-8bit-state" else torchao.optim._AdamW
    return cls(params, bf16_stochastic_round=True, **hyper)


__all__ = ["AdamW16", "FIELD", "METHODS", "ROUNDINGS", "bytes_per_parameter", "concat_flat",
           "field_optimizer", "field_unavailable", "state_bytes", "stochastic_round_bf16",
           "vanished_share"]

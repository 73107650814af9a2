"""One training step per precision: the maths flags, autocast, the GradScaler and master weights.

Five recipes, one name each, used everywhere in fp16lab (the sweep, notebook 02's runs, the
claims and the benchmarks):

* ``fp32``: fp32 weights and maths, TF32 off for matmul and cuDNN;
* ``tf32``: fp32 weights, matmul and convolutions on TF32 tensor cores;
* ``amp-fp16``: ``torch.autocast(device, torch.float16)`` with a ``torch.amp.GradScaler``;
* ``amp-bf16``: ``torch.autocast(device, torch.bfloat16)``, no scaler (bf16 has fp32's range);
* ``fp16-o2``: the whole model in fp16 (BatchNorm kept in fp32), fp32 master weights in the
  optimizer and a GradScaler (the Apex O2 recipe).

The step a practitioner writes for ``amp-fp16`` is the one in notebook 02::

    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

from .scaling import ScalerSettings

#: Precision names, with what each one does to the training step.
PRECISIONS = {
    "fp32": "fp32 weights and maths; TF32 off for matmul and cuDNN",
    "tf32": "fp32 weights; matmul and convolutions on TF32 tensor cores (no effect on a CPU)",
    "amp-fp16": "autocast to fp16 with a GradScaler",
    "amp-bf16": "autocast to bf16, no scaler (bf16 has fp32's exponent range)",
    "fp16-o2": ("pure fp16 model with fp32 master weights in the optimizer and a dynamic loss "
                "scaler (the Apex O2 recipe; BatchNorm kept in fp32)"),
}

#: Precisions whose step uses a loss scaler (so the scaler settings matter).
SCALED_PRECISIONS = ("amp-fp16", "fp16-o2")

#: The dtype autocast runs in, per precision (absent: autocast off).
AUTOCAST_DTYPES = {"amp-fp16": "float16", "amp-bf16": "bfloat16"}

#: Learning rate and momentum of the SGD optimizer every measured training step uses.
LR, MOMENTUM = 0.01, 0.9


def check_precision(precision: str) -> str:
    """Returns ``precision`` when it names a recipe, else raises ValueError listing the names."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; allowed: {', '.join(PRECISIONS)}")
    return precision


def autocast(precision: str, device: str) -> Any:
    """Returns the ``torch.autocast`` context of a precision (a disabled one where it has none)."""
    import torch

    dtype = AUTOCAST_DTYPES.get(check_precision(precision))
    return torch.autocast(device, dtype=getattr(torch, dtype or "float16"), enabled=dtype is not None)


def grad_scaler(precision: str, device: str, settings: ScalerSettings | None = None) -> Any:
    """Returns a ``torch.amp.GradScaler``, enabled only for the precisions that scale the loss."""
    import torch

    s = settings or ScalerSettings()
    return torch.amp.GradScaler(device, init_scale=s.init_scale, growth_factor=s.growth_factor,
                                backoff_factor=s.backoff_factor, growth_interval=s.growth_interval,
                                enabled=check_precision(precision) in SCALED_PRECISIONS)


def _per_backend_api(b: Any) -> bool:
    """True where torch has the per-backend TF32 settings (``fp32_precision``, torch >= 2.9)."""
    return hasattr(b.cuda.matmul, "fp32_precision") and hasattr(b.cudnn, "conv")


def tf32_state() -> dict[str, bool]:
    """Returns whether fp32 matmuls (cuBLAS) and cuDNN convolutions may run on TF32 tensor cores.

    Read through ``fp32_precision`` where torch has it: torch >= 2.9 warns that reading or
    setting the older ``allow_tf32`` flags will be deprecated, and refuses to read them once
    the newer settings were used.
    """
    import torch

    b = torch.backends
    if _per_backend_api(b):
        return {"matmul": b.cuda.matmul.fp32_precision == "tf32",
                "conv": b.cudnn.conv.fp32_precision == "tf32"}
    return {"matmul": bool(b.cuda.matmul.allow_tf32), "conv": bool(b.cudnn.allow_tf32)}


def set_tf32(matmul: bool, conv: bool | None = None) -> Callable[[], None]:
    """Lets fp32 matmuls (and cuDNN convolutions: ``conv``, by default as ``matmul``) run on TF32
    tensor cores or not, and returns a function that puts the previous settings back.

    Where torch has them (>= 2.9), the per-backend settings are used, as torch asks::

        torch.backends.cuda.matmul.fp32_precision = "tf32"   # or "ieee"
        torch.backends.cudnn.conv.fp32_precision = "tf32"

    else the older ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32``.
    No effect on a CPU's maths.
    """
    import torch

    b = torch.backends
    conv = matmul if conv is None else conv
    if _per_backend_api(b):
        saved = (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision,
                 b.cudnn.rnn.fp32_precision)
        b.cuda.matmul.fp32_precision = "tf32" if matmul else "ieee"
        b.cudnn.conv.fp32_precision = b.cudnn.rnn.fp32_precision = "tf32" if conv else "ieee"

        def restore() -> None:
            b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, \
                b.cudnn.rnn.fp32_precision = saved
    else:
        old = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32)
        b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = bool(matmul), bool(conv)

        def restore() -> None:
            b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = old
    return restore


@contextlib.contextmanager
def tf32(matmul: bool, conv: bool | None = None) -> Iterator[None]:
    """:func:`set_tf32` for the block only: the previous settings are back afterwards."""
    restore = set_tf32(matmul, conv)
    try:
        yield
    finally:
        restore()


@contextlib.contextmanager
def math_flags(precision: str, cudnn_benchmark: bool | None = None) -> Iterator[None]:
    """Sets TF32 (on only for 'tf32') and, when given, cudnn.benchmark; restores both after."""
    import torch

    b = torch.backends
    restore = set_tf32(check_precision(precision) == "tf32")
    benchmark = b.cudnn.benchmark
    if cudnn_benchmark is not None:
        b.cudnn.benchmark = cudnn_benchmark
    try:
        yield
    finally:
        restore()
        b.cudnn.benchmark = benchmark


def _keep_batchnorm_fp32(model: Any) -> None:
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.float()


#: The optimizers a measured training step can use, by name; ``sgd`` is the default everywhere.
OPTIMIZERS = {
    "sgd": ("torch.optim.SGD with the kernels torch picks (foreach on a GPU); GradScaler.step reads "
            "found-inf on the host first, a host sync every step"),
    "sgd-fused": ("torch.optim.SGD(fused=True): one fused update that takes GradScaler's scale and "
                  "found-inf as device tensors and skips on device, no host sync"),
}


def sgd(params: Any, lr: float = LR, momentum: float = MOMENTUM, fused: bool = False) -> Any:
    """Returns the SGD optimizer (``LR`` and ``MOMENTUM`` by default) the measured steps use.

    ``fused=True`` asks torch for its fused kernel. Otherwise ``fused`` is left unset rather than
    False: torch reads an explicit False as "not fused, not foreach" and falls back to its
    slowest, per-tensor loop, while unset lets it pick foreach kernels on a GPU.
    """
    import torch

    opt = torch.optim.SGD(params, lr=lr, momentum=momentum, fused=True if fused else None)
    if fused and momentum:
        # torch's fused SGD makes its momentum buffers with empty_like in its first step and
        # leaves them unwritten when GradScaler's found-inf skips that step: the next step then
        # reads uninitialised memory. Zeros give the same start, since with dampening 0 the first
        # update b = momentum * 0 + g equals torch's first-step rule b = g.
        for group in opt.param_groups:
            for p in group["params"]:
                opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    return opt


def optimizer_factory(name: str) -> Callable[[Any], Any]:
    """Returns the constructor (parameters -> optimizer) of the optimizer ``name`` in :data:`OPTIMIZERS`."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; allowed: {', '.join(OPTIMIZERS)}")
    return functools.partial(sgd, fused=name == "sgd-fused")


def make_train_step(precision: str, model: Any, x: Any, y: Any, *, device: str,
                    scaler: ScalerSettings | None = None,
                    optimizer: Callable[[Any], Any] = sgd,
                    loss_fn: Callable[[Any, Any], Any] | None = None,
                    ) -> tuple[Callable[[], Any], Any]:
    """Returns (step, scaler): a closure running one full training step, and its GradScaler or None.

    ``step.optimizer`` is the optimizer the step uses; ``step()`` returns the loss. ``step(xb,
    yb)`` trains on another batch of the same kind instead of (x, y) (an input pipeline's next
    batch, on ``device`` in the same layout).

    The model, input and labels must already be on ``device``, in their memory layout. For
    ``fp16-o2`` the model is converted to fp16 here (BatchNorm stays fp32) and the optimizer
    steps fp32 master copies of the weights, which are copied back into the model after each
    step. The maths flags are not set here: run the step inside :func:`math_flags`.

    Args:
        precision: a name from :data:`PRECISIONS`.
        scaler: GradScaler settings for the scaled precisions (default: torch's defaults).
        optimizer: called with the parameters (the fp32 master copies for ``fp16-o2``).
        loss_fn: ``loss_fn(logits, labels)``; cross-entropy by default.
    """
    import torch
    import torch.nn.functional as F

    check_precision(precision)
    loss_fn = loss_fn or F.cross_entropy
    dev = device
    if precision == "fp16-o2":
        model.half()
        _keep_batchnorm_fp32(model)
        x = x.half()
        params = [p for p in model.parameters() if p.requires_grad]
        master = [p.detach().float().clone() for p in params]
        opt = optimizer(master)
        gs = grad_scaler(precision, dev, scaler)

        def step(xb: Any = None, yb: Any = None) -> Any:
            model.zero_grad(set_to_none=True)
            xb, yb = (x, y) if xb is None else (xb.half(), yb)
            loss = loss_fn(model(xb).float(), yb)
            gs.scale(loss).backward()
            # fp16 gradients (inf where the scaled loss overflowed) become fp32 master gradients;
            # the scaler unscales them in fp32, skips the step on inf/NaN and adjusts the scale.
            for m, p in zip(master, params):
                m.grad = None if p.grad is None else p.grad.float()
            gs.step(opt)
            gs.update()
            with torch.no_grad():
                for m, p in zip(master, params):
                    p.copy_(m)
            return loss

        step.optimizer = opt
        return step, gs

    opt = optimizer(model.parameters())
    if precision == "amp-fp16":
        gs = grad_scaler(precision, dev, scaler)

        def step(xb: Any = None, yb: Any = None) -> Any:
            opt.zero_grad(set_to_none=True)
            xb, yb = (x, y) if xb is None else (xb, yb)
            with autocast(precision, dev):
                loss = loss_fn(model(xb), yb)
            gs.scale(loss).backward()
            gs.step(opt)
            gs.update()
            return loss

        step.optimizer = opt
        return step, gs

    def step(xb: Any = None, yb: Any = None) -> Any:
        opt.zero_grad(set_to_none=True)
        xb, yb = (x, y) if xb is None else (xb, yb)
        with autocast(precision, dev):
            loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    step.optimizer = opt
    return step, None

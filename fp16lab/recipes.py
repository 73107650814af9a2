"""One training step per precision: the maths flags, autocast, the GradScaler and master weights.

Every precision fp16lab knows is one :class:`Precision` in :data:`PRECISIONS`, used everywhere
(the sweep, the execution modes, notebook 02's runs, the input pipeline, the distributed ranks,
FP8, the claims and the benchmarks); an engine that offers only some of them asks for those by
their properties (:func:`precisions`) and checks a name with :func:`check_precision`.

* ``fp32``: fp32 weights and maths, TF32 off for matmul and cuDNN;
* ``tf32``: fp32 weights, matmul and convolutions on TF32 tensor cores;
* ``amp-fp16``: ``torch.autocast(device, torch.float16)`` with a ``torch.amp.GradScaler``;
* ``amp-bf16``: ``torch.autocast(device, torch.bfloat16)``, no scaler (bf16 has fp32's range);
* ``fp16-o2``: the whole model in fp16 (BatchNorm kept in fp32), fp32 master weights in the
  optimizer and a GradScaler (the Apex O2 recipe);
* ``fp8-<recipe>``: the model's linear layers in FP8 (:mod:`fp16lab.fp8`, one precision per
  recipe in :data:`FP8_RECIPES`), the rest as ``amp-bf16``.

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
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Iterator

from . import validate
from .scaling import ScalerSettings

#: FP8 recipes: how each tensor's scale is chosen (:mod:`fp16lab.fp8.linear` implements them).
FP8_RECIPES = {
    "tensorwise": "one scale per tensor, from its amax now (current scaling)",
    "rowwise": "one scale per row along the summed dimension, from the amax now",
    "blockwise": "activations and gradients per 1x128 tile, weights per 128x128 tile",
    "delayed": "one scale per tensor, from the amax history of the last N steps, with a margin",
}


@dataclass(frozen=True)
class Precision:
    """What one precision does to the training step; ``str()`` is its description.

    Args:
        name: the name used everywhere (``amp-fp16``).
        description: what the step does, in a line.
        autocast_dtype: the torch dtype name ``torch.autocast`` runs in (None: autocast off).
        scaled: the loss goes through a loss scaler (a GradScaler), so its settings matter.
        tf32: fp32 matmuls and cuDNN convolutions may run on TF32 tensor cores.
        master_weights: the model is converted to fp16 and the optimizer steps fp32 copies.
        fp8_recipe: the FP8 recipe (:data:`FP8_RECIPES`) of the linear layers swapped for
            ``Float8Linear`` (None: no FP8).
    """

    name: str
    description: str
    autocast_dtype: str | None = None
    scaled: bool = False
    tf32: bool = False
    master_weights: bool = False
    fp8_recipe: str | None = None

    def __str__(self) -> str:
        return self.description

    @property
    def fp8(self) -> bool:
        """True where the step swaps linear layers for FP8 ones (its step is fp16lab.fp8's)."""
        return self.fp8_recipe is not None

    @property
    def converts_model(self) -> bool:
        """True where the step changes the model it is given (to fp16, or FP8 linear layers);
        the engines that capture, compile or feed the model as built leave these out."""
        return self.master_weights or self.fp8

    @property
    def autocast_recipe(self) -> bool:
        """True where the step is fp32 training changed only by torch.autocast and a GradScaler:
        the model as built, TF32 off. Notebook 02's runs compare these, and the distributed
        ranks train these (their protocol turns TF32 off; FSDP takes autocast's dtype as its
        parameter dtype)."""
        return not self.tf32 and not self.converts_model


def _all_precisions() -> dict[str, Precision]:
    named = [
        Precision("fp32", "fp32 weights and maths; TF32 off for matmul and cuDNN"),
        Precision("tf32", "fp32 weights; matmul and convolutions on TF32 tensor cores (no effect "
                  "on a CPU)", tf32=True),
        Precision("amp-fp16", "autocast to fp16 with a GradScaler", autocast_dtype="float16",
                  scaled=True),
        Precision("amp-bf16", "autocast to bf16, no scaler (bf16 has fp32's exponent range)",
                  autocast_dtype="bfloat16"),
        Precision("fp16-o2", "pure fp16 model with fp32 master weights in the optimizer and a "
                  "dynamic loss scaler (the Apex O2 recipe; BatchNorm kept in fp32)",
                  scaled=True, master_weights=True),
        *(Precision(f"fp8-{r}", f"FP8 linear layers: {what}; the rest as amp-bf16",
                    autocast_dtype="bfloat16", fp8_recipe=r) for r, what in FP8_RECIPES.items()),
    ]
    return {p.name: p for p in named}


#: Every precision fp16lab knows, by name.
PRECISIONS: dict[str, Precision] = _all_precisions()


def precisions(**wanted: bool) -> tuple[str, ...]:
    """Returns the names of the precisions whose properties have the ``wanted`` values, in
    :data:`PRECISIONS` order: ``precisions(scaled=True)`` is ``('amp-fp16', 'fp16-o2')``."""
    for prop in wanted:
        if not hasattr(Precision, prop) and prop not in Precision.__dataclass_fields__:
            raise ValueError(f"a Precision has no property {prop!r}")
    return tuple(n for n, p in PRECISIONS.items()
                 if all(bool(getattr(p, k)) == bool(v) for k, v in wanted.items()))


#: Precisions whose step uses a loss scaler (so the scaler settings matter).
SCALED_PRECISIONS = precisions(scaled=True)

#: Precisions whose whole step :func:`make_train_step` writes (an FP8 one first swaps layers:
#: :func:`fp16lab.fp8.training.make_fp8_step`).
RECIPE_PRECISIONS = precisions(fp8=False)

#: Learning rate and momentum of the SGD optimizer every measured training step uses.
LR, MOMENTUM = 0.01, 0.9


def check_precision(precision: Any, allowed: Iterable[str] | None = None, *,
                    where: str = "here") -> str:
    """Returns ``precision`` if it is one of ``allowed`` (default: every precision), else raises
    ValueError saying what is allowed; ``where`` names the engine in the message (``"across
    GPUs"``) when a known precision is one it does not offer."""
    names = tuple(PRECISIONS if allowed is None else allowed)
    if isinstance(precision, str) and precision in names:
        return precision
    listed = ", ".join(names)
    if isinstance(precision, str) and precision in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not offered {where}; allowed: {listed}")
    raise ValueError(f"unknown precision {precision!r}; allowed: {listed}")


def autocast_dtype(precision: str) -> Any:
    """Returns the torch dtype ``torch.autocast`` runs a precision in, or None (autocast off)."""
    import torch

    dtype = PRECISIONS[check_precision(precision)].autocast_dtype
    return None if dtype is None else getattr(torch, dtype)


def autocast(precision: str, device: str, cache_enabled: bool | None = None) -> Any:
    """Returns the ``torch.autocast`` context of a precision (a disabled one where it has none).

    ``cache_enabled=False`` turns autocast's cast cache off, as capturing a CUDA graph requires
    (None: torch's setting, on by default).
    """
    import torch

    device = validate.device("device", device)
    if cache_enabled is not None:
        validate.boolean("cache_enabled", cache_enabled)
    dtype = autocast_dtype(precision)
    return torch.autocast(torch.device(device).type, dtype=dtype or torch.float16, enabled=dtype is not None,
                          cache_enabled=cache_enabled)


def grad_scaler(precision: str, device: str, settings: ScalerSettings | None = None) -> Any:
    """Returns a ``torch.amp.GradScaler``, enabled only for the precisions that scale the loss."""
    import torch

    s = settings or ScalerSettings()
    device = torch.device(validate.device("device", device)).type
    return torch.amp.GradScaler(device, init_scale=s.init_scale, growth_factor=s.growth_factor,
                                backoff_factor=s.backoff_factor, growth_interval=s.growth_interval,
                                enabled=PRECISIONS[check_precision(precision)].scaled)


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
    matmul = validate.boolean("matmul", matmul)
    conv = matmul if conv is None else validate.boolean("conv", conv)
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
    """Sets TF32 (on only for the precisions that use it: 'tf32') and, when given,
    cudnn.benchmark; restores both after."""
    import torch

    b = torch.backends
    if cudnn_benchmark is not None:
        validate.boolean("cudnn_benchmark", cudnn_benchmark)
    restore = set_tf32(PRECISIONS[check_precision(precision)].tf32)
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

    lr = validate.number("lr", lr, low=0, low_open=True)
    momentum = validate.number("momentum", momentum, low=0)
    fused = validate.boolean("fused", fused)
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


def _no_region(name: str) -> ContextManager[None]:
    return contextlib.nullcontext()


def make_train_step(precision: str, model: Any, x: Any, y: Any, *, device: str,
                    scaler: ScalerSettings | None = None,
                    optimizer: Callable[[Any], Any] = sgd,
                    loss_fn: Callable[[Any, Any], Any] | None = None,
                    loss_scaler: Any = "recipe",
                    forward: Callable[[Any], Any] | None = None,
                    autocast_cache: bool | None = None,
                    after_backward: Callable[[], None] | None = None,
                    unscale_first: bool = False,
                    region: Callable[[str], ContextManager[Any]] | None = None,
                    ) -> tuple[Callable[[], Any], Any]:
    """Returns (step, scaler): a closure running one full training step, and its loss scaler or None.

    ``step.optimizer`` is the optimizer the step uses; ``step()`` returns the loss. ``step(xb,
    yb)`` trains on another batch of the same kind instead of (x, y) (an input pipeline's next
    batch, on ``device`` in the same layout).

    The model, input and labels must already be on ``device``, in their memory layout. For
    ``fp16-o2`` the model is converted to fp16 here (BatchNorm stays fp32) and the optimizer
    steps fp32 master copies of the weights, which are copied back into the model after each
    step. The maths flags are not set here: run the step inside :func:`math_flags`.

    Every engine's step is this one; the keywords after ``loss_fn`` are what an engine adds:

    Args:
        precision: a name from :data:`RECIPE_PRECISIONS` (an FP8 one's step is
            :func:`fp16lab.fp8.training.make_fp8_step`, which builds on this one).
        scaler: GradScaler settings for the scaled precisions (default: torch's defaults).
        optimizer: called with the parameters (the fp32 master copies for ``fp16-o2``).
        loss_fn: ``loss_fn(logits, labels)``; cross-entropy by default.
        loss_scaler: what scales the loss, with torch.amp.GradScaler's ``scale``, ``step`` and
            ``update``: ``"recipe"`` (the default) is the precision's own (a GradScaler for the
            scaled precisions, none for the others); None trains without one; any other object
            (a static scaler, a recording one) replaces it.
        forward: what the batch goes through (default: ``model``; a compiled model, say); the
            optimizer steps ``model``'s parameters either way.
        autocast_cache: autocast's cast cache (False while capturing a CUDA graph).
        after_backward: called once the gradients are in, before the optimizer step (where
            a practitioner inspects or clips them; scaled where a scaler is used).
        unscale_first: unscale the gradients in a call of their own (``unscale_``) before the
            optimizer step, where gradient clipping would go, instead of inside it.
        region: ``region(name)`` is entered around each phase (zero_grad, forward, backward,
            unscale, optimizer_step, scaler_update): :func:`fp16lab.profile.phase` marks them.
    """
    import torch
    import torch.nn.functional as F

    check_precision(precision, RECIPE_PRECISIONS, where="by recipes.make_train_step (an fp8 "
                    "precision's step is fp16lab.fp8.training.make_fp8_step)")
    if isinstance(loss_scaler, str) and loss_scaler != "recipe":
        raise ValueError(f"loss_scaler must be 'recipe', None or a scaler, got {loss_scaler!r}")
    loss_fn = loss_fn or F.cross_entropy
    region = region or _no_region
    forward = model if forward is None else forward
    master_weights = PRECISIONS[precision].master_weights
    if master_weights:
        model.half()
        _keep_batchnorm_fp32(model)
        x = x.half()
        params = [p for p in model.parameters() if p.requires_grad]
        master = [p.detach().float().clone() for p in params]
        opt = optimizer(master)
    else:
        opt = optimizer(model.parameters())
    gs = loss_scaler
    if isinstance(loss_scaler, str):  # "recipe": the precision's own
        gs = grad_scaler(precision, device, scaler) if PRECISIONS[precision].scaled else None

    def step(xb: Any = None, yb: Any = None) -> Any:
        with region("zero_grad"):
            (model if master_weights else opt).zero_grad(set_to_none=True)
        if xb is None:
            xb, yb = x, y
        elif master_weights:
            xb = xb.half()
        with region("forward"):
            with autocast(precision, device, autocast_cache):
                out = forward(xb)
                loss = loss_fn(out.float() if master_weights else out, yb)
        with region("backward"):
            (loss if gs is None else gs.scale(loss)).backward()
        if master_weights:
            # fp16 gradients (inf where the scaled loss overflowed) become fp32 master gradients;
            # the scaler unscales them in fp32, skips the step on inf/NaN and adjusts the scale.
            for m, p in zip(master, params):
                m.grad = None if p.grad is None else p.grad.float()
        if after_backward is not None:
            after_backward()
        if gs is not None and unscale_first:
            with region("unscale"):
                gs.unscale_(opt)
        with region("optimizer_step"):
            if gs is None:
                opt.step()
            else:
                gs.step(opt)
        if gs is not None:
            with region("scaler_update"):
                gs.update()
        if master_weights:
            with torch.no_grad():
                for m, p in zip(master, params):
                    p.copy_(m)
        return loss

    step.optimizer = opt
    step.batch = (x, y)  # what step() trains on without arguments (fp16-o2: the fp16 copy)
    return step, gs

"""Workloads: the model, batch, loss and optimizer one training point trains, defined by the user.

A :class:`Workload` is what every engine trains instead of a built-in model name. A user
writes it in a few lines::

    def my_workload(width: int = 64) -> Workload:
        return Workload(
            name="my-mlp",
            build=lambda: nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 10)),
            batch=synthetic_batch((32,), num_classes=10),
            settings={"width": width})

(``synthetic_batch`` is in :mod:`fp16lab.workloads.batches`) and names it ``"my_package.my_module:my_workload"``: :func:`load_workload` imports the module,
calls the factory with the settings, and checks what comes back. The name and the settings
(plain values only) are all a torchrun rank needs to build the same workload, so a workload
pickles as that pair.

:func:`train_step` builds one training step of a workload under any precision of
:data:`fp16lab.recipes.PRECISIONS`, on :func:`fp16lab.recipes.make_train_step` (an FP8 one
swaps the linear layers first, as :mod:`fp16lab.fp8` does, then trains as ``amp-bf16``). A
workload that cannot run a setting (channels_last without a convolution, FP8 without a linear
layer FP8 can take, a precision the workload rules out) raises :class:`WorkloadCannotRun`,
naming the workload and the setting.

Inputs may be one tensor (``model(x)``), a tuple (``model(*x)``) or a dict (``model(**x)``,
as Hugging Face models take ``input_ids``); a model returning a dict or a ``ModelOutput``
says which entry the loss takes with ``output="logits"`` (or a function of the output).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import nn

from . import validate
from .fp8.linear import convert_to_fp8
from .recipes import PRECISIONS, autocast, check_precision, make_train_step, math_flags, sgd
from .scaling import ScalerSettings
from .workloads import WORKLOADS, WorkloadNeedsPackage
from .workloads.batches import ModelInputs, channels_last_images, cross_entropy, map_float

#: Memory layouts a workload's step can take; ``channels_last`` only where the model convolves.
LAYOUTS = ("nchw", "channels_last")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}$")
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class WorkloadCannotRun(ValueError):
    """A workload cannot run a setting (a precision, a layout); the message names both."""


class WorkloadNotFound(ImportError):
    """A workload name that does not import: no such module, or no such factory in it."""


def _plain(name: str, value: Any) -> Any:
    """Returns a settings value if it is plain (None, bool, int, finite float, str, or a
    list/tuple/dict of those), so that it pickles and writes to JSON for the ranks."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return validate.number(name, value)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(f"{name}[{i}]", v) for i, v in enumerate(value))
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, str):
                raise TypeError(f"{name} keys must be strings, got {k!r}")
        return {k: _plain(f"{name}[{k!r}]", v) for k, v in value.items()}
    raise TypeError(f"{name} must be a plain value (None, bool, int, float, str, or a list or "
                    f"dict of those) so that it can travel to the ranks; got "
                    f"{type(value).__name__}")


def check_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Returns ``settings`` as a dict if every key is a Python name and every value plain."""
    if not isinstance(settings, Mapping):
        raise TypeError(f"workload settings must be a dict, got {type(settings).__name__}")
    for key in settings:
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"a workload setting's name must be a Python name, got {key!r}")
    return {k: _plain(f"setting {k!r}", v) for k, v in settings.items()}


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError("a workload name must be 1-100 letters, digits or _.+- (starting with a "
                         f"letter or digit), got {name!r}")
    return name


@dataclass(eq=False)
class Workload:
    """What one training point trains: the model, its batches, its loss and its optimizer.

    Args:
        name: what the rows and messages call it (``"bert-base-mlm"``).
        build: ``build() -> nn.Module``, a freshly initialised model (on the CPU, in fp32).
        batch: ``batch(size, device) -> (inputs, targets)``; inputs a tensor, a tuple (the
            model's positional arguments) or a dict (its keywords). :func:`~fp16lab.workloads.batches.synthetic_batch`
            makes one; :func:`~fp16lab.workloads.batches.loader_batch` draws from a DataLoader.
        loss: ``loss(output, targets) -> scalar tensor``; cross-entropy by default (computed
            in fp32 whatever the output's dtype, as autocast would).
        output: which part of the model's output the loss takes: None (the output itself),
            a key (``"logits"``, for a dict or a transformers ``ModelOutput``) or a function.
        optimizer: ``optimizer(params) -> torch.optim.Optimizer``; the recipes' SGD by default.
        layouts: the memory layouts it accepts (:data:`LAYOUTS`); None: detected from the model
            (``channels_last`` only where it has a convolution).
        precisions: the precision names it can run (None: every one of
            :data:`fp16lab.recipes.PRECISIONS`); the others raise :class:`WorkloadCannotRun`.
        settings: plain values (see :func:`check_settings`) that built it, which travel with
            its ``reference`` to torchrun ranks.
        reference: ``"package.module:factory"`` that built it; set by :func:`load_workload`
            (a workload without one does not pickle).
        arguments: the settings that factory was called with (what a rank calls it with).
    """

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int, Any], tuple[Any, Any]]
    loss: Callable[[Any, Any], torch.Tensor] | None = None
    output: str | Callable[[Any], Any] | None = None
    optimizer: Callable[[Iterable[Any]], torch.optim.Optimizer] | None = None
    layouts: tuple[str, ...] | None = None
    precisions: tuple[str, ...] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    reference: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        _check_name(self.name)
        for what in ("build", "batch"):
            if not callable(getattr(self, what)):
                raise TypeError(f"workload {self.name!r}: {what} must be callable")
        for what in ("loss", "optimizer"):
            if getattr(self, what) is not None and not callable(getattr(self, what)):
                raise TypeError(f"workload {self.name!r}: {what} must be callable or None")
        if self.output is not None and not (isinstance(self.output, str) or callable(self.output)):
            raise TypeError(f"workload {self.name!r}: output must be a key, a function or None")
        if self.layouts is not None:
            self.layouts = tuple(validate.choice("layout", lay, LAYOUTS) for lay in self.layouts)
        if self.precisions is not None:
            self.precisions = tuple(check_precision(p) for p in self.precisions)
        self.settings = check_settings(self.settings)

    def __reduce__(self) -> Any:
        if self.reference is None:
            raise TypeError(f"workload {self.name!r} was not made by load_workload, so it cannot "
                            "travel to another process: give it a 'package.module:factory' name")
        return _load_with_settings, (self.reference, self.arguments)

    def logits(self, out: Any) -> Any:
        """Returns the part of the model's output the loss takes (see ``output``)."""
        if self.output is None:
            return out
        if callable(self.output):
            return self.output(out)
        return out[self.output] if isinstance(out, Mapping) else getattr(out, self.output)

    def accepted_layouts(self, model: nn.Module | None = None) -> tuple[str, ...]:
        """Returns the layouts it accepts: its own list, else ``channels_last`` too where the
        model (built here if not given) has a convolution."""
        if self.layouts is not None:
            return self.layouts
        model = self.build() if model is None else model
        convolves = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
        return LAYOUTS if convolves else ("nchw",)

    def check_can_run(self, precision: str, layout: str = "nchw",
                      model: nn.Module | None = None) -> None:
        """Raises :class:`WorkloadCannotRun` where the workload cannot run the setting."""
        check_precision(precision)
        validate.choice("layout", layout, LAYOUTS)
        if self.precisions is not None and precision not in self.precisions:
            raise WorkloadCannotRun(f"workload {self.name!r} cannot run precision {precision!r}: "
                                    f"it runs {', '.join(self.precisions)}")
        if layout not in self.accepted_layouts(model):
            raise WorkloadCannotRun(f"workload {self.name!r} cannot run layout {layout!r}: it has "
                                    "no convolution for channels_last to speed up"
                                    if self.layouts is None else
                                    f"workload {self.name!r} cannot run layout {layout!r}: it "
                                    f"accepts {', '.join(self.accepted_layouts(model))}")


def _load_with_settings(reference: str, settings: dict[str, Any]) -> Workload:
    return load_workload(reference, **settings)


# ----------------------------------------------------------------------------- by name

def load_workload(name: str, **settings: Any) -> Workload:
    """Returns the workload ``name`` builds with ``settings``.

    ``name`` is a built-in workload (:data:`fp16lab.workloads.WORKLOADS`) or
    ``"package.module:factory"``, a function returning a :class:`Workload`; the module must be
    importable (on ``sys.path``). The workload records the name and the settings, so it
    pickles and a torchrun rank rebuilds it with ``load_workload(w.reference, **w.arguments)``;
    its ``settings`` (what a row records) are its own with these on top.
    """
    if not isinstance(name, str):
        raise TypeError(f"a workload name must be a str, got {type(name).__name__}")
    settings = check_settings(settings)
    reference = WORKLOADS.get(name, name)
    module_name, sep, attr = reference.partition(":")
    if not sep or not _DOTTED.match(module_name) or not attr.isidentifier():
        known = ", ".join(WORKLOADS)
        raise ValueError(f"workload {name!r} is neither a built-in one ({known}) nor "
                         "'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise WorkloadNotFound(f"workload {name!r}: module {module_name!r} cannot be imported "
                               f"({e}); is it on sys.path?") from e
    factory = getattr(module, attr, None)
    if factory is None:
        raise WorkloadNotFound(f"workload {name!r}: module {module_name!r} has no {attr!r}")
    if not callable(factory):
        raise TypeError(f"workload {name!r}: {reference} is a {type(factory).__name__}, not a "
                        "function returning a Workload")
    try:
        built = factory(**settings)
    except WorkloadNeedsPackage:
        raise
    except Exception as e:
        raise RuntimeError(f"workload {name!r}: {reference}({_shown(settings)}) raised "
                           f"{type(e).__name__}: {e}") from e
    if not isinstance(built, Workload):
        raise TypeError(f"workload {name!r}: {reference} returned a {type(built).__name__}, "
                        "not a fp16lab.workload.Workload")
    built.reference, built.arguments = reference, settings
    built.settings = {**built.settings, **settings}
    return built


def workload_name(name: str, value: Any) -> str:
    """Returns ``value`` if :func:`load_workload` builds a workload from it with its defaults
    (a command line's check: a name that does not import is a ValueError saying why)."""
    value = validate.text(name, value)
    try:
        load_workload(value)
    except (ImportError, TypeError, RuntimeError) as e:
        raise ValueError(f"{name}: {e}") from None
    return value


def _shown(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in settings.items())


# ----------------------------------------------------------------------------- the step

@dataclass
class WorkloadStep:
    """One workload's training step: ``loss = step()`` trains once on the batch it was built
    with (``step(inputs, targets)`` on another batch of the same kind, on the device).

    What the other engines take from it: ``model`` (a :class:`fp16lab.diagnostics.GradientMonitor`
    watches its parameters), :meth:`forward_loss` (the step's forward and loss alone, what
    :func:`fp16lab.diagnostics.locate_first_nonfinite` runs), :meth:`loss` with ``inputs`` and
    ``targets`` (what :func:`fp16lab.census.census_model` needs) and the step itself (what
    :func:`fp16lab.profile.profile_steps` times).
    """

    run: Callable[..., torch.Tensor]
    workload: Workload
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any
    inputs: Any
    targets: Any
    precision: str
    layout: str
    converted: list[str] = field(default_factory=list)
    forward: Callable[[Any], Any] | None = field(default=None, repr=False)

    def loss(self, output: Any, targets: Any) -> torch.Tensor:
        """The workload's loss of a model ``output`` (its logits taken as the workload says)."""
        return _loss_of(self.workload)(_FloatLogits(self.workload.logits(output)), targets)

    def forward_loss(self) -> torch.Tensor:
        """Returns the loss of one forward pass on the step's batch, computed as the step
        computes it (the precision's autocast; fp16 inputs where the model is fp16), with no
        backward pass and no optimizer step."""
        p = PRECISIONS["amp-bf16" if PRECISIONS[self.precision].fp8 else self.precision]
        inputs = ModelInputs(self.inputs)
        if p.master_weights:
            inputs = inputs.half()
        forward = self.forward or _forward_of(self.workload, None, self.model)
        with math_flags(self.precision), autocast(p.name, self.inputs_device.type):
            out = forward(inputs)
            return _loss_of(self.workload)(out.float() if p.master_weights else out, self.targets)

    def __call__(self, inputs: Any = None, targets: Any = None) -> torch.Tensor:
        with math_flags(self.precision):
            if inputs is None:
                return self.run()
            if self.layout == "channels_last":
                inputs = map_float(inputs, channels_last_images)
            return self.run(ModelInputs(inputs), targets)

    def next_batch(self) -> torch.Tensor:
        """Trains once on the workload's next batch (a DataLoader's next, say)."""
        inputs, targets = self.workload.batch(_batch_size(self.targets), self.inputs_device)
        return self(inputs, targets)

    @property
    def inputs_device(self) -> torch.device:
        return next(self.model.parameters()).device


def _batch_size(targets: Any) -> int:
    return len(targets)


def train_step(workload: Workload, precision: str, device: str | torch.device, batch_size: int, *,
               layout: str = "nchw", scaler: ScalerSettings | None = None, seed: int = 0,
               compile_mode: str | None = None, **engine: Any) -> WorkloadStep:
    """Returns a :class:`WorkloadStep` training a fresh ``workload`` model under ``precision``.

    The model is built (seeded by ``seed``), moved to ``device`` and put in ``layout``; the
    batch is the workload's of ``batch_size``. The step is :func:`fp16lab.recipes.make_train_step`
    with the workload's loss and optimizer; an FP8 precision first swaps the linear layers FP8
    can take (:func:`fp16lab.fp8.linear.convert_to_fp8`) and trains as ``amp-bf16``. The maths
    flags (TF32) are set around each call. ``engine`` passes make_train_step's keywords an
    engine adds (``forward``, ``autocast_cache``, ``after_backward``, ``unscale_first``,
    ``region``, ``loss_scaler``). ``compile_mode`` (``"default"``, ``"reduce-overhead"``,
    ``"max-autotune"``...) runs the forward through ``torch.compile(model, mode=...)``; the
    loss, the scaler and the optimizer stay eager, as :mod:`fp16lab.execution` compiles.

    Raises:
        WorkloadCannotRun: the workload rules out the precision or the layout, or an FP8
            precision finds no linear layer it can take.
    """
    check_precision(precision)
    batch_size = validate.count("batch_size", batch_size)
    validate.choice("layout", layout, LAYOUTS)
    torch.manual_seed(validate.count("seed", seed, low=0))
    model = build_model(workload)
    workload.check_can_run(precision, layout, model)
    p = PRECISIONS[precision]
    converted: list[str] = []
    if p.fp8:
        converted = convert_to_fp8(model, p.fp8_recipe)
        if not converted:
            raise WorkloadCannotRun(
                f"workload {workload.name!r} cannot run precision {precision!r}: it has no "
                "nn.Linear FP8 can take (features multiples of 16, or 128 for blockwise; the "
                "output layer named 'head' is kept)")
    device = torch.device(device)
    model = model.to(device)
    inputs, targets = workload.batch(batch_size, device)
    if layout == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        inputs = map_float(inputs, channels_last_images)
    if compile_mode is not None:
        mode = validate.text("compile_mode", compile_mode)
        engine["forward"] = torch.compile(model, mode=None if mode == "default" else mode)
    return step_of(workload, precision, model, inputs, targets, device=device, scaler=scaler,
                   layout=layout, converted=converted, **engine)


def build_model(workload: Workload) -> nn.Module:
    """Returns ``workload.build()``, checked to be a module; its failure names the workload."""
    try:
        model = workload.build()
    except Exception as e:
        raise RuntimeError(f"workload {workload.name!r}: build() raised {type(e).__name__}: {e}") \
            from e
    if not isinstance(model, nn.Module):
        raise TypeError(f"workload {workload.name!r}: build() returned a {type(model).__name__}, "
                        "not a torch.nn.Module")
    return model


def step_of(workload: Workload, precision: str, model: nn.Module, inputs: Any, targets: Any, *,
            device: str | torch.device, scaler: ScalerSettings | None = None,
            optimizer: Callable[[Iterable[Any]], torch.optim.Optimizer] | None = None,
            layout: str = "nchw", converted: list[str] | None = None,
            **engine: Any) -> WorkloadStep:
    """Returns the :class:`WorkloadStep` of a workload's model that is already built, on
    ``device`` with its batch (and wrapped, where an engine wraps it: DDP, FSDP2).

    :func:`train_step` builds and places the model and calls this; a distributed rank wraps it
    first. ``optimizer`` replaces the workload's (and the recipes' SGD); FP8 precisions train
    as ``amp-bf16`` once the layers are converted.
    """
    p = PRECISIONS[check_precision(precision)]
    device = torch.device(device)
    engine = {**engine, "forward": _forward_of(workload, engine.get("forward"), model)}
    body, gs = make_train_step("amp-bf16" if p.fp8 else precision, model, ModelInputs(inputs),
                               targets, device=device.type, scaler=scaler,
                               optimizer=optimizer or workload.optimizer or sgd,
                               loss_fn=_loss_of(workload), **engine)
    return WorkloadStep(body, workload, model, body.optimizer, gs, inputs, targets, precision,
                        layout, list(converted or []), engine["forward"])


def _forward_of(workload: Workload, forward: Any, model: nn.Module) -> Callable[[ModelInputs], Any]:
    through = model if forward is None else forward

    def run(inputs: ModelInputs) -> Any:
        return _FloatLogits(workload.logits(inputs.call(through)))

    return run


class _FloatLogits:
    """The output the loss takes; make_train_step calls ``.float()`` on it under fp16-o2."""

    def __init__(self, value: Any):
        self.value = value

    def float(self) -> "_FloatLogits":
        return _FloatLogits(map_float(self.value, torch.Tensor.float))


def _loss_of(workload: Workload) -> Callable[[_FloatLogits, Any], torch.Tensor]:
    loss = workload.loss or cross_entropy

    def run(out: _FloatLogits, targets: Any) -> torch.Tensor:
        value = loss(out.value, targets)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise TypeError(f"workload {workload.name!r}: loss must return a scalar tensor, got "
                            f"{type(value).__name__}")
        return value

    return run


__all__ = ["LAYOUTS", "Workload", "WorkloadCannotRun", "WorkloadNotFound", "WorkloadStep",
           "build_model", "check_settings", "load_workload", "step_of", "train_step",
           "workload_name"]

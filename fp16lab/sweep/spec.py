"""What a sweep measures: the grid (:class:`SweepSpec`) and its points (:class:`Point`), checked on creation.

Beside model, batch, layout, precision and the scaler, a point has the later chapters' axes
(execution, input, gpus and the ``fp8-<recipe>`` precisions; :mod:`.axes`). A grid crosses each
value only with the points it applies to (channels_last and file inputs with image models, fp8
with models of linear layers, several GPUs with fp32, amp-fp16 and amp-bf16, ...); a value that
applies to no point is an error before anything runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .. import validate
from ..models import MODELS, is_image_model
from ..recipes import SCALED_PRECISIONS
from ..scaling import ScalerSettings
from ..workload import Workload, load_workload
from .axes import (AXIS_DEFAULTS, BACKENDS, COMPILE_MODES, EXECUTIONS, SWEEP_PRECISIONS,
                   check_execution_axis, check_gpus_axis, check_input_axis, fp8_problem,
                   variant_label)

#: Memory layouts, for image models only.
LAYOUTS = {
    "nchw": "contiguous NCHW tensors (PyTorch's default)",
    "channels_last": "NHWC in memory (torch.channels_last), what tensor-core convolutions prefer",
}

#: The loss-scaler settings a point records as columns, named as :class:`ScalerSettings` names them.
SCALER_FIELDS = tuple(f.name for f in dataclasses.fields(ScalerSettings))


@dataclass(frozen=True)
class Protocol:
    """How a training point is measured on a GPU: cuDNN autotuning, warm-up steps, timed steps."""

    cudnn_benchmark: bool
    warmup: int
    steps: int

    def __str__(self) -> str:
        return (f"{self.warmup} warm-up steps, then {self.steps} timed steps, cuDNN autotuning "
                f"(cudnn.benchmark) {'on' if self.cudnn_benchmark else 'off'}")


#: The one GPU measurement protocol, written once: the reference sweep, the GPU grid of
#: :meth:`SweepSpec.for_this_machine` and notebook 05's training claims all measure this way, so
#: the same setting gives the same figure in all three.
GPU_PROTOCOL = Protocol(cudnn_benchmark=True, warmup=5, steps=12)


def _unique(xs: Iterable[Any]) -> tuple[Any, ...]:
    out: list[Any] = []
    for x in xs:
        if x not in out:
            out.append(x)
    return tuple(out)


def _check_names(kind: str, given: Sequence[str], allowed: Iterable[str]) -> None:
    allowed = list(allowed)
    if not given:
        raise ValueError(f"the sweep needs at least one {kind}; allowed: {', '.join(allowed)}")
    bad = [g for g in given if g not in allowed]
    if bad:
        raise ValueError(f"unknown {kind} {', '.join(map(repr, bad))}; allowed: {', '.join(allowed)}")


def _resolve_model(entry: Any) -> tuple[str, Workload | None]:
    """Returns (the name rows record, the workload or None) for one ``models`` entry: a built-in
    model name, a :class:`fp16lab.workload.Workload`, or a workload's name for
    :func:`fp16lab.workload.load_workload` (built-in or ``"package.module:function"``)."""
    if isinstance(entry, Workload):
        return entry.name, entry
    if isinstance(entry, str) and entry in MODELS:
        return entry, None
    if not isinstance(entry, str):
        raise TypeError(f"a sweep model must be a model name, a workload name or a Workload, "
                        f"got {type(entry).__name__}")
    try:
        return entry, load_workload(entry)
    except (ImportError, TypeError, RuntimeError) as e:  # one kind of refusal for the sweep
        raise ValueError(f"model {entry!r}: {e}") from None
    except ValueError as e:
        raise ValueError(f"unknown model {entry!r}: not one of {', '.join(MODELS)}, and {e}") \
            from None


class PointError(ValueError):
    """A point that cannot run, blaming the sweep axis (``gpus``, ``inputs``, ...) whose value is why."""

    def __init__(self, axis: str, message: str):
        super().__init__(message)
        self.axis = axis


def _blame(axis: str, check: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Returns ``check(*args, **kwargs)``; its ValueError becomes a :class:`PointError` blaming ``axis``."""
    try:
        return check(*args, **kwargs)
    except ValueError as e:
        raise PointError(axis, str(e)) from None


def _refuse(message: str) -> None:
    raise ValueError(message)


@dataclass(frozen=True)
class Point:
    """One configuration to measure. ``key`` identifies it in a results file (for resuming).

    The later axes (see the module docstring and ``AXIS_DEFAULTS``): ``execution`` with
    ``compile_mode`` (filled in as 'default' for compile, None otherwise); ``input`` with its
    pipeline settings, used by file inputs only (``num_workers`` None means 75% of the cores,
    resolved here; ``pin_memory``, ``non_blocking``, ``normalize_on`` apply to the dataloader
    and default to True, True, 'cpu') and ``images_dir``, the image folder they read; ``gpus``,
    the number of ranks (batch is per GPU).
    """

    model: str
    batch: int
    layout: str = "nchw"
    precision: str = "fp32"
    scaler: ScalerSettings | None = None
    cudnn_benchmark: bool = False
    device: str = "cpu"
    execution: str = "eager"
    compile_mode: str | None = None
    input: str = "synthetic"
    num_workers: int | None = None
    pin_memory: bool | None = None
    non_blocking: bool | None = None
    normalize_on: str | None = None
    images_dir: str | None = None
    gpus: int = 1
    #: the workload this point trains (its ``model`` is then the workload's name); None: the
    #: built-in model ``model``. A workload decides at run time what it cannot run (a layout,
    #: an FP8 recipe), and the row records that error.
    workload: Workload | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.workload is not None:
            self._check_workload_point()
            return
        _check_names("model", [self.model], MODELS)
        _check_names("layout", [self.layout], LAYOUTS)
        _check_names("precision", [self.precision], SWEEP_PRECISIONS)
        _check_batches([self.batch])
        if self.layout == "channels_last" and not is_image_model(self.model):
            raise PointError("layouts", f"layout 'channels_last' applies to image models only; "
                                        f"{self.model!r} takes no NCHW input (use 'nchw')")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"a point's device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.precision in SCALED_PRECISIONS and self.scaler is None:
            object.__setattr__(self, "scaler", ScalerSettings())
        if self.precision not in SCALED_PRECISIONS:
            object.__setattr__(self, "scaler", None)  # the settings would change nothing
        problem = fp8_problem(self.model, self.precision) if self.precision.startswith("fp8-") \
            else None
        if problem:
            raise PointError("precisions", problem)
        mode = _blame("executions", check_execution_axis, self.execution, self.compile_mode,
                      precision=self.precision, device=self.device)
        object.__setattr__(self, "compile_mode", mode)
        kept = _blame("inputs", check_input_axis, self.input, model=self.model,
                      device=self.device, images_dir=self.images_dir,
                      num_workers=self.num_workers, pin_memory=self.pin_memory,
                      non_blocking=self.non_blocking, normalize_on=self.normalize_on)
        for name, value in kept.items():
            object.__setattr__(self, name, value)
        _blame("gpus", check_gpus_axis, self.gpus, device=self.device, precision=self.precision,
               execution=self.execution, input=self.input, scaler=self.scaler,
               cudnn_benchmark=self.cudnn_benchmark)

    def _check_workload_point(self) -> None:
        if not isinstance(self.workload, Workload):
            raise TypeError(f"a point's workload must be a Workload, got "
                            f"{type(self.workload).__name__}")
        _check_names("layout", [self.layout], LAYOUTS)
        _check_names("precision", [self.precision], SWEEP_PRECISIONS)
        _check_batches([self.batch])
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"a point's device must be 'cpu' or 'cuda', got {self.device!r}")
        allowed = self.workload.precisions
        if allowed is not None and self.precision not in allowed:
            raise PointError("precisions", f"workload {self.workload.name!r} runs "
                                           f"{', '.join(allowed)}, not {self.precision!r}")
        if self.precision in SCALED_PRECISIONS and self.scaler is None:
            object.__setattr__(self, "scaler", ScalerSettings())
        if self.precision not in SCALED_PRECISIONS:
            object.__setattr__(self, "scaler", None)
        if self.execution == "cuda-graph":
            raise PointError("executions", f"workload {self.workload.name!r}: the sweep runs a "
                                           "workload eager or compiled; cuda-graph capture takes "
                                           "the built-in models only")
        mode = _blame("executions", check_execution_axis, self.execution, self.compile_mode,
                      precision=self.precision, device=self.device)
        object.__setattr__(self, "compile_mode", mode)
        if self.input != "synthetic":
            raise PointError("inputs", f"workload {self.workload.name!r} makes its own batches; "
                                       f"input {self.input!r} feeds the built-in image models only")
        if self.gpus != 1:
            raise PointError("gpus", f"workload {self.workload.name!r}: the sweep runs a workload "
                                     "on one GPU (gpus 1)")
        if self.cudnn_benchmark not in (True, False):
            raise ValueError(f"cudnn_benchmark must be True or False, got {self.cudnn_benchmark!r}")

    def settings(self) -> dict[str, Any]:
        """Returns the point's settings as flat columns (scaler fields None when unused)."""
        s = self.scaler
        return {
            "model": self.model, "batch": self.batch, "layout": self.layout,
            "precision": self.precision,
            **{f.name: type(f.default)(getattr(s, f.name)) if s else None  # as typed: 2000, not 2000.0
               for f in dataclasses.fields(ScalerSettings)},
            "cudnn_benchmark": bool(self.cudnn_benchmark), "device": self.device,
            **{name: getattr(self, name) for name in AXIS_DEFAULTS},
            "images_dir": self.images_dir,
        }

    @property
    def key(self) -> str:
        """Returns a stable 16-hex-digit hash of the settings.

        Axes at their ``AXIS_DEFAULTS`` value and ``images_dir`` (where the same images are) are
        left out, so a point of the original grid keeps the key older results files hold.
        """
        kept = {k: v for k, v in self.settings().items()
                if k != "images_dir" and not (k in AXIS_DEFAULTS and v == AXIS_DEFAULTS[k])}
        if self.workload is not None and self.workload.settings:  # another build, another point
            kept["workload_settings"] = self.workload.settings
        blob = json.dumps(kept, sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]

    def variant(self) -> str:
        """Returns the later axes' non-default values, e.g. 'compile(default) dataloader w4 x2'."""
        return variant_label(self.settings())

    def label(self) -> str:
        """Returns a short human-readable name like 'resnet50 b256 channels_last amp-fp16'."""
        extra = f" scale0={self.scaler.init_scale:g}" if self.scaler else ""
        variant = self.variant()
        return (f"{self.model} b{self.batch} {self.layout} {self.precision}{extra}"
                f"{' ' + variant if variant else ''}")


#: SweepSpec's fields that are lists of values crossed into the grid.
_GRID_AXES = ("models", "batches", "layouts", "precisions", "scalers", "cudnn_benchmark",
              "executions", "compile_modes", "inputs", "num_workers", "pin_memory",
              "non_blocking", "normalize_on", "gpus")

#: The grid axes crossed only with some points, and what a point needs for each to apply.
_NEEDS = {"scalers": f"a precision that uses a loss scaler ({', '.join(SCALED_PRECISIONS)})",
          "compile_modes": "execution 'compile'",
          "num_workers": "a file input (input other than 'synthetic')",
          "pin_memory": "input 'dataloader'", "non_blocking": "input 'dataloader'",
          "normalize_on": "input 'dataloader'"}


def check_images_dir(value: Any, name: str = "images_dir") -> Path:
    """Returns ``images_dir`` as a Path once file inputs can read it, else raises OSError/ValueError.

    It must be a readable folder, or one :func:`fp16lab.inputs.make_image_folder` can write (an
    empty or absent folder whose place is writable); a file or an unwritable place is refused.
    Messages call it ``name``.
    """
    try:
        path = validate.existing_dir(name, value)
    except FileNotFoundError:  # make_image_folder makes it
        return validate.output_dir(name, value)
    if not any(path.iterdir()):
        validate.output_dir(name, path)  # empty: make_image_folder writes it
    return path


def check_tolerance(tolerance: Any, name: str = "tolerance") -> None:
    """Raises ValueError unless ``tolerance`` (a repeat-spread fraction) is in (0, 1)."""
    if isinstance(tolerance, bool) or not (isinstance(tolerance, (int, float))
                                           and 0 < tolerance < 1):
        raise ValueError(f"{name} must be a fraction in (0, 1) (0.03 flags repeats more than 3% "
                         f"apart), got {tolerance!r}")


def _axis_text(value: Any) -> str:
    if isinstance(value, ScalerSettings):
        log2 = math.log2(value.init_scale)
        init = f"2^{log2:.0f}" if log2.is_integer() else f"{value.init_scale:.4g}"
        return (f"scaler(init {init}, growth x{value.growth_factor:g} every "
                f"{value.growth_interval}, backoff x{value.backoff_factor:g})")
    return str(value)


def _check_batches(batches: Sequence[Any]) -> None:
    if not batches:
        raise ValueError("the sweep needs at least one batch size (a positive integer)")
    bad = [b for b in batches if isinstance(b, bool) or not isinstance(b, int) or b < 1]
    if bad:
        raise ValueError(f"batch sizes must be positive integers, got {', '.join(map(repr, bad))}")


@dataclass(frozen=True)
class SweepSpec:
    """A grid of points and how to measure each.

    Layout ``channels_last`` is crossed with image models only; scaler settings only with the
    precisions that use a scaler (``amp-fp16``, ``fp16-o2``); ``compile_modes`` with execution
    ``compile``; the pipeline settings with file inputs; every value only with the points it
    applies to (:class:`Point` says which). Everything is checked on creation, so a bad name or
    value, or one that applies to no point, fails before anything runs. ``images_dir`` is the
    image folder file inputs read; :func:`fp16lab.sweep.run_sweep` writes it first
    (:func:`fp16lab.data.make_image_folder`, ``images`` files) when it holds no images yet.

    ``models`` takes the built-in models (:data:`fp16lab.models.MODELS`) and workloads: a
    :class:`fp16lab.workload.Workload`, or the name :func:`fp16lab.workload.load_workload`
    builds one from (a built-in workload such as ``"bert-base"``, or
    ``"package.module:function"``). A workload point trains the workload's model on its own
    batches (input ``synthetic``), eager or compiled, on one GPU; what the workload cannot run
    (channels_last without a convolution, FP8 without a linear layer it can take) is an error
    recorded in that point's row, and the sweep goes on.
    """

    models: tuple[str | Workload, ...] = ("small_cnn",)
    batches: tuple[int, ...] = (8, 16)
    layouts: tuple[str, ...] = ("nchw",)
    precisions: tuple[str, ...] = ("fp32",)
    scalers: tuple[ScalerSettings, ...] = (ScalerSettings(),)
    cudnn_benchmark: tuple[bool, ...] = (False,)
    executions: tuple[str, ...] = ("eager",)
    compile_modes: tuple[str, ...] = ("default",)
    inputs: tuple[str, ...] = ("synthetic",)
    num_workers: tuple[int | None, ...] = (None,)
    pin_memory: tuple[bool, ...] = (True,)
    non_blocking: tuple[bool, ...] = (True,)
    normalize_on: tuple[str, ...] = ("cpu",)
    gpus: tuple[int, ...] = (1,)
    images_dir: str | None = None
    images: int = 1024
    device: str = "auto"
    warmup: int = 3
    steps: int = 10
    repeats: int = 3
    tolerance: float = 0.03
    telemetry: bool = True
    telemetry_interval_s: float = 0.05
    #: the workload of each ``models`` entry that is one, by the name rows record (filled in)
    workloads: dict[str, Workload] = field(default_factory=dict, init=False, repr=False,
                                           compare=False)

    def __post_init__(self) -> None:
        for name in _GRID_AXES:
            value = getattr(self, name)
            if value is None or isinstance(value, (str, int, ScalerSettings, bool, Workload)):
                value = (value,)
            object.__setattr__(self, name, _unique(value))
        if not self.models:
            raise ValueError(f"the sweep needs at least one model; allowed: {', '.join(MODELS)}, "
                             "a workload's name or a Workload")
        resolved = [_resolve_model(m) for m in self.models]
        object.__setattr__(self, "models", _unique(name for name, _ in resolved))
        object.__setattr__(self, "workloads", {name: w for name, w in resolved if w is not None})
        _check_batches(self.batches)
        _check_names("layout", self.layouts, LAYOUTS)
        _check_names("precision", self.precisions, SWEEP_PRECISIONS)
        _check_names("execution", self.executions, EXECUTIONS)
        _check_names("compile mode", self.compile_modes, COMPILE_MODES)
        _check_names("input", self.inputs, BACKENDS)
        if isinstance(self.images, bool) or not isinstance(self.images, int) or self.images < 1:
            raise ValueError(f"images must be a positive integer, got {self.images!r}")
        if not self.scalers or not all(isinstance(s, ScalerSettings) for s in self.scalers):
            raise ValueError("scalers must be one or more ScalerSettings")
        if not self.cudnn_benchmark or not all(isinstance(b, bool) for b in self.cudnn_benchmark):
            raise ValueError(f"cudnn_benchmark must be one or more of True/False, "
                             f"got {self.cudnn_benchmark!r}")
        for m in self.models:
            if m in MODELS and m.startswith("resnet") and importlib.util.find_spec("torchvision") is None:
                raise ValueError(f"model {m!r} needs torchvision, which is not installed "
                                 f"(pip install 'fp16lab[vision]')")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        for name, low in (("warmup", 0), ("steps", 1), ("repeats", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        check_tolerance(self.tolerance)
        validate.boolean("telemetry", self.telemetry)
        validate.number("telemetry_interval_s", self.telemetry_interval_s, low=0, high=60,
                        low_open=True)
        self.resolved_device()  # fails now if 'cuda' was asked for without a GPU
        points = self.points()  # fails now if a value is bad or applies to no point
        if self.images_dir is not None:
            if all(p.input == "synthetic" for p in points):
                _refuse(f"images_dir {str(self.images_dir)!r} applies to no point of this "
                        f"sweep: it needs a file input (input other than 'synthetic')")
            check_images_dir(self.images_dir)

    def __str__(self) -> str:
        """Returns the grid in a few lines: the axes that vary or differ from the defaults, the
        number of points, and how each is measured."""
        defaults = SweepSpec.__dataclass_fields__
        lines = []
        for name in _GRID_AXES:
            value = getattr(self, name)
            if name in ("models", "batches", "precisions") or len(value) > 1 \
                    or value != defaults[name].default:
                shown = [_axis_text(v) for v in value]
                lines.append(f"  {name.replace('_', ' ')}: {', '.join(shown)}")
        n = len(self.points())
        return (f"a sweep of {n} point{'s' if n != 1 else ''} on {self.resolved_device()}:\n"
                + "\n".join(lines) + "\n"
                f"  each: {self.warmup} warm-up + {self.steps} timed steps, {self.repeats} "
                f"repeat{'s' if self.repeats != 1 else ''} interleaved, UNSTABLE above "
                f"{self.tolerance:.0%} spread")

    def resolved_device(self) -> str:
        """Returns 'cuda' or 'cpu': where the points run."""
        import torch

        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' was asked for, but torch sees no CUDA GPU; "
                             "use device='cpu' or 'auto'")
        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def points(self) -> list[Point]:
        """Returns the grid's points in run order (one entry per point, repeats not included).

        Raises ValueError when a value applies to no point (saying why, for one of its points).
        """
        device = self.resolved_device()
        pts: list[Point] = []
        used: dict[str, set[Any]] = {name: set() for name in _GRID_AXES}
        blamed: dict[tuple[str, Any], str] = {}  # a value that itself cannot run, and why
        why: dict[tuple[str, Any], str] = {}  # a value whose every point another value refused
        for m, prec, ex, inp, g in itertools.product(self.models, self.precisions,
                                                     self.executions, self.inputs, self.gpus):
            scalers = self.scalers if prec in SCALED_PRECISIONS else (None,)
            modes = self.compile_modes if ex == "compile" else (None,)
            file_input = inp != "synthetic"
            dl = inp == "dataloader"
            pipeline = itertools.product(self.num_workers if file_input else (None,),
                                         self.pin_memory if dl else (None,),
                                         self.non_blocking if dl else (None,),
                                         self.normalize_on if dl else (None,))
            for s, mode, (nw, pin, nb, norm), lay, bench, b in itertools.product(
                    scalers, modes, list(pipeline), self.layouts, self.cudnn_benchmark,
                    self.batches):
                axes = {"models": m, "precisions": prec, "executions": ex, "inputs": inp,
                        "gpus": g, "scalers": s, "compile_modes": mode, "num_workers": nw,
                        "pin_memory": pin, "non_blocking": nb, "normalize_on": norm,
                        "layouts": lay, "cudnn_benchmark": bench, "batches": b}
                try:
                    p = Point(model=m, batch=b, layout=lay, precision=prec, scaler=s,
                              cudnn_benchmark=bench, device=device, execution=ex,
                              compile_mode=mode, input=inp, num_workers=nw, pin_memory=pin,
                              non_blocking=nb, normalize_on=norm, images_dir=self.images_dir,
                              gpus=g, workload=self.workloads.get(m))
                except ValueError as e:  # this combination does not apply; others may
                    if isinstance(e, PointError):
                        blamed.setdefault((e.axis, axes[e.axis]), str(e))
                    for name, v in axes.items():
                        why.setdefault((name, v), str(e))
                    continue
                pts.append(p)
                for name, v in axes.items():
                    used[name].add(v)
        unused = [(name, v) for name in _GRID_AXES for v in getattr(self, name)
                  if v not in used[name]]
        # the value that cannot run is named first (gpus 2 on a CPU), not the model it refused
        for reasons in (blamed, why):
            for name, v in unused:
                if (name, v) in reasons:
                    _refuse(f"{name} {v!r} applies to no point of this sweep: {reasons[(name, v)]}")
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, v in unused:  # a setting crossed with no point: refused, not ignored
            if name in _NEEDS and getattr(self, name) != _unique(defaults[name]):
                _refuse(f"{name} {v!r} applies to no point of this sweep: it needs "
                        f"{_NEEDS[name]}")
        if not pts:
            raise ValueError("the sweep has no point: " + next(iter(why.values()), ""))
        return list({p.key: p for p in pts}.values())

    @classmethod
    def for_this_machine(cls) -> "SweepSpec":
        """Returns the ResNet-50 grid on a GPU (small_cnn without torchvision), a quick one on a CPU.

        The GPU grid is batch 64, 128, 256 x both layouts x fp32, tf32, amp-fp16, amp-bf16, measured
        by :data:`GPU_PROTOCOL`: the FP32-versus-FP16 table of the reference results, reproduced
        locally (a few minutes).
        """
        import torch

        if not torch.cuda.is_available():
            return cls.quick(device="cpu")
        model = "resnet50" if importlib.util.find_spec("torchvision") else "small_cnn"
        return cls(models=(model,), batches=(64, 128, 256), layouts=("nchw", "channels_last"),
                   precisions=("fp32", "tf32", "amp-fp16", "amp-bf16"), device="cuda",
                   cudnn_benchmark=GPU_PROTOCOL.cudnn_benchmark, warmup=GPU_PROTOCOL.warmup,
                   steps=GPU_PROTOCOL.steps, repeats=3)

    @classmethod
    def quick(cls, **overrides: Any) -> "SweepSpec":
        """Returns a small sweep that finishes in seconds on a CPU (and quickly on a GPU)."""
        base = dict(models=("small_cnn",), batches=(8, 32), layouts=("nchw", "channels_last"),
                    precisions=("fp32", "amp-bf16"), warmup=1, steps=4, repeats=2)
        base.update(overrides)
        return cls(**base)

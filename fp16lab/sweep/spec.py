"""What a sweep measures: the grid (:class:`SweepSpec`) of points (:class:`.point.Point`), checked on creation.

Beside model, batch, layout, precision and the scaler, a point has the later chapters' axes
(execution, input, gpus and the ``fp8-<recipe>`` precisions; :mod:`.axes`). A grid crosses each
value only with the points it applies to (channels_last and file inputs with image models, fp8
with models of linear layers, several GPUs with fp32, amp-fp16 and amp-bf16, ...); a value that
applies to no point is an error before anything runs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import validate
from ..models import MODELS
from ..recipes import SCALED_PRECISIONS
from ..scaling import ScalerSettings
from ..workload import Workload
from .axes import BACKENDS, COMPILE_MODES, EXECUTIONS, SWEEP_PRECISIONS
from .point import (LAYOUTS, Point, PointError, check_batches, check_names, refuse,
                    resolve_model, unique)

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
    batches (input ``synthetic``), eager, compiled or captured as a CUDA graph, on one GPU; what
    the workload cannot run (channels_last without a convolution, FP8 without a linear layer it
    can take, a step a CUDA graph cannot capture) is an error recorded in that point's row, and
    the sweep goes on.
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
            object.__setattr__(self, name, unique(value))
        if not self.models:
            raise ValueError(f"the sweep needs at least one model; allowed: {', '.join(MODELS)}, "
                             "a workload's name or a Workload")
        resolved = [resolve_model(m) for m in self.models]
        object.__setattr__(self, "models", unique(name for name, _ in resolved))
        object.__setattr__(self, "workloads", {name: w for name, w in resolved if w is not None})
        check_batches(self.batches)
        check_names("layout", self.layouts, LAYOUTS)
        check_names("precision", self.precisions, SWEEP_PRECISIONS)
        check_names("execution", self.executions, EXECUTIONS)
        check_names("compile mode", self.compile_modes, COMPILE_MODES)
        check_names("input", self.inputs, BACKENDS)
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
                refuse(f"images_dir {str(self.images_dir)!r} applies to no point of this "
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
                    refuse(f"{name} {v!r} applies to no point of this sweep: {reasons[(name, v)]}")
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, v in unused:  # a setting crossed with no point: refused, not ignored
            if name in _NEEDS and getattr(self, name) != unique(defaults[name]):
                refuse(f"{name} {v!r} applies to no point of this sweep: it needs "
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

"""One sweep point (:class:`Point`): a model or workload, batch, layout, precision and the later axes.

A point checks on creation that its values apply to each other (channels_last and file inputs
with image models, fp8 with models of linear layers, several GPUs with fp32, amp-fp16 and
amp-bf16, ...); :class:`PointError` names the axis whose value is why. :mod:`.spec` crosses
points into a grid.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from .. import validate
from ..models import MODELS, is_image_model
from ..recipes import SCALED_PRECISIONS
from ..scaling import ScalerSettings
from ..workload import Workload, load_workload
from .axes import (AXIS_DEFAULTS, SWEEP_PRECISIONS, check_execution_axis, check_gpus_axis,
                   check_input_axis, fp8_problem, variant_label)

#: Memory layouts, for image models only.
LAYOUTS = {
    "nchw": "contiguous NCHW tensors (PyTorch's default)",
    "channels_last": "NHWC in memory (torch.channels_last), what tensor-core convolutions prefer",
}

#: The loss-scaler settings a point records as columns, named as :class:`ScalerSettings` names them.
SCALER_FIELDS = tuple(f.name for f in dataclasses.fields(ScalerSettings))


def unique(xs: Iterable[Any]) -> tuple[Any, ...]:
    """Returns ``xs`` without repeats, in order (values need not be hashable)."""
    out: list[Any] = []
    for x in xs:
        if x not in out:
            out.append(x)
    return tuple(out)


def check_names(kind: str, given: Sequence[str], allowed: Iterable[str]) -> None:
    """Raises ValueError, listing what is allowed, unless ``given`` is non-empty and allowed."""
    allowed = list(allowed)
    if not given:
        raise ValueError(f"the sweep needs at least one {kind}; allowed: {', '.join(allowed)}")
    bad = [g for g in given if g not in allowed]
    if bad:
        raise ValueError(f"unknown {kind} {', '.join(map(repr, bad))}; allowed: {', '.join(allowed)}")


def resolve_model(entry: Any) -> tuple[str, Workload | None]:
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


def refuse(message: str) -> None:
    """Raises ValueError(``message``): a point or grid that cannot run."""
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
        w = self.workload
        if w is not None and not isinstance(w, Workload):
            raise TypeError(f"a point's workload must be a Workload, got {type(w).__name__}")
        if w is None:
            check_names("model", [self.model], MODELS)
        check_names("layout", [self.layout], LAYOUTS)
        check_names("precision", [self.precision], SWEEP_PRECISIONS)
        check_batches([self.batch])
        if w is None and self.layout == "channels_last" and not is_image_model(self.model):
            raise PointError("layouts", f"layout 'channels_last' applies to image models only; "
                                        f"{self.model!r} takes no NCHW input (use 'nchw')")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"a point's device must be 'cpu' or 'cuda', got {self.device!r}")
        if w is not None and w.precisions is not None and self.precision not in w.precisions:
            raise PointError("precisions", f"workload {w.name!r} runs "
                                           f"{', '.join(w.precisions)}, not {self.precision!r}")
        if self.precision in SCALED_PRECISIONS and self.scaler is None:
            object.__setattr__(self, "scaler", ScalerSettings())
        if self.precision not in SCALED_PRECISIONS:
            object.__setattr__(self, "scaler", None)  # the settings would change nothing
        # a workload's FP8 layers are its own to find: train_step refuses, in the row
        problem = fp8_problem(self.model, self.precision) \
            if w is None and self.precision.startswith("fp8-") else None
        if problem:
            raise PointError("precisions", problem)
        mode = _blame("executions", check_execution_axis, self.execution, self.compile_mode,
                      precision=self.precision, device=self.device)
        object.__setattr__(self, "compile_mode", mode)
        if w is not None:
            self._check_workload_axes(w)
            return
        kept = _blame("inputs", check_input_axis, self.input, model=self.model,
                      device=self.device, images_dir=self.images_dir,
                      num_workers=self.num_workers, pin_memory=self.pin_memory,
                      non_blocking=self.non_blocking, normalize_on=self.normalize_on)
        for name, value in kept.items():
            object.__setattr__(self, name, value)
        _blame("gpus", check_gpus_axis, self.gpus, device=self.device, precision=self.precision,
               execution=self.execution, input=self.input, scaler=self.scaler,
               cudnn_benchmark=self.cudnn_benchmark)

    def _check_workload_axes(self, w: Workload) -> None:
        """The axes a workload point takes as they are: its own batches, one GPU."""
        if self.input != "synthetic":
            raise PointError("inputs", f"workload {w.name!r} makes its own batches; "
                                       f"input {self.input!r} feeds the built-in image models only")
        if self.gpus != 1:
            raise PointError("gpus", f"workload {w.name!r}: the sweep runs a workload "
                                     "on one GPU (gpus 1)")
        validate.boolean("cudnn_benchmark", self.cudnn_benchmark)

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


def check_batches(batches: Sequence[Any]) -> None:
    """Raises ValueError unless ``batches`` holds one or more positive integers."""
    if not batches:
        raise ValueError("the sweep needs at least one batch size (a positive integer)")
    bad = [b for b in batches if isinstance(b, bool) or not isinstance(b, int) or b < 1]
    if bad:
        raise ValueError(f"batch sizes must be positive integers, got {', '.join(map(repr, bad))}")

"""What a sweep measures: the grid (:class:`SweepSpec`) and its points (:class:`Point`), checked on creation."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..recipes import PRECISIONS, SCALED_PRECISIONS
from ..scaling import ScalerSettings

#: Memory layouts, for image models only.
LAYOUTS = {
    "nchw": "contiguous NCHW tensors (PyTorch's default)",
    "channels_last": "NHWC in memory (torch.channels_last), what tensor-core convolutions prefer",
}


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


@dataclass(frozen=True)
class Point:
    """One configuration to measure. ``key`` identifies it in a results file (for resuming)."""

    model: str
    batch: int
    layout: str = "nchw"
    precision: str = "fp32"
    scaler: ScalerSettings | None = None
    cudnn_benchmark: bool = False
    device: str = "cpu"

    def __post_init__(self) -> None:
        from ..models import MODELS, is_image_model

        _check_names("model", [self.model], MODELS)
        _check_names("layout", [self.layout], LAYOUTS)
        _check_names("precision", [self.precision], PRECISIONS)
        _check_batches([self.batch])
        if self.layout == "channels_last" and not is_image_model(self.model):
            raise ValueError(f"layout 'channels_last' applies to image models only; "
                             f"{self.model!r} takes no NCHW input (use 'nchw')")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"a point's device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.precision in SCALED_PRECISIONS and self.scaler is None:
            object.__setattr__(self, "scaler", ScalerSettings())
        if self.precision not in SCALED_PRECISIONS:
            object.__setattr__(self, "scaler", None)  # the settings would change nothing

    def settings(self) -> dict[str, Any]:
        """Returns the point's settings as flat columns (scaler fields None when unused)."""
        s = self.scaler
        return {
            "model": self.model, "batch": self.batch, "layout": self.layout,
            "precision": self.precision,
            "init_scale": float(s.init_scale) if s else None,
            "growth_factor": float(s.growth_factor) if s else None,
            "backoff_factor": float(s.backoff_factor) if s else None,
            "growth_interval": int(s.growth_interval) if s else None,
            "cudnn_benchmark": bool(self.cudnn_benchmark), "device": self.device,
        }

    @property
    def key(self) -> str:
        """Returns a stable 16-hex-digit hash of the settings."""
        blob = json.dumps(self.settings(), sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]

    def label(self) -> str:
        """Returns a short human-readable name like 'resnet50 b256 channels_last amp-fp16'."""
        extra = f" scale0={self.scaler.init_scale:g}" if self.scaler else ""
        return f"{self.model} b{self.batch} {self.layout} {self.precision}{extra}"


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
    precisions that use a scaler (``amp-fp16``, ``fp16``). Everything is checked on creation, so a
    bad name or value fails before anything runs.
    """

    models: tuple[str, ...] = ("small_cnn",)
    batches: tuple[int, ...] = (8, 16)
    layouts: tuple[str, ...] = ("nchw",)
    precisions: tuple[str, ...] = ("fp32",)
    scalers: tuple[ScalerSettings, ...] = (ScalerSettings(),)
    cudnn_benchmark: tuple[bool, ...] = (False,)
    device: str = "auto"
    warmup: int = 3
    steps: int = 10
    repeats: int = 3
    tolerance: float = 0.03
    telemetry: bool = True
    telemetry_interval_s: float = 0.05

    def __post_init__(self) -> None:
        from ..models import MODELS, is_image_model

        for name in ("models", "batches", "layouts", "precisions", "scalers", "cudnn_benchmark"):
            value = getattr(self, name)
            if isinstance(value, (str, int, ScalerSettings, bool)):
                value = (value,)
            object.__setattr__(self, name, _unique(value))
        _check_names("model", self.models, MODELS)
        _check_batches(self.batches)
        _check_names("layout", self.layouts, LAYOUTS)
        _check_names("precision", self.precisions, PRECISIONS)
        if not self.scalers or not all(isinstance(s, ScalerSettings) for s in self.scalers):
            raise ValueError("scalers must be one or more ScalerSettings")
        if not self.cudnn_benchmark or not all(isinstance(b, bool) for b in self.cudnn_benchmark):
            raise ValueError(f"cudnn_benchmark must be one or more of True/False, "
                             f"got {self.cudnn_benchmark!r}")
        if "channels_last" in self.layouts and not any(is_image_model(m) for m in self.models):
            raise ValueError(f"layout 'channels_last' applies to image models only, and none of "
                             f"{', '.join(self.models)} is one")
        for m in self.models:
            if m.startswith("resnet") and importlib.util.find_spec("torchvision") is None:
                raise ValueError(f"model {m!r} needs torchvision, which is not installed "
                                 f"(pip install 'fp16lab[vision]')")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        for name, low in (("warmup", 0), ("steps", 1), ("repeats", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        if not (isinstance(self.tolerance, (int, float)) and 0 < self.tolerance < 1):
            raise ValueError(f"tolerance must be a fraction in (0, 1), got {self.tolerance!r}")
        if not self.telemetry_interval_s > 0:
            raise ValueError(f"telemetry_interval_s must be > 0, got {self.telemetry_interval_s!r}")
        self.resolved_device()  # fails now if 'cuda' was asked for without a GPU

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
        """Returns the grid's points in run order (one entry per point, repeats not included)."""
        from ..models import is_image_model

        device = self.resolved_device()
        pts: list[Point] = []
        for m in self.models:
            layouts = [lay for lay in self.layouts if lay == "nchw" or is_image_model(m)]
            for prec in self.precisions:
                scalers = self.scalers if prec in SCALED_PRECISIONS else (None,)
                for s in scalers:
                    for lay in layouts:
                        for bench in self.cudnn_benchmark:
                            for b in self.batches:
                                pts.append(Point(m, b, lay, prec, s, bench, device))
        return list({p.key: p for p in pts}.values())

    @classmethod
    def for_this_machine(cls) -> "SweepSpec":
        """Returns the ResNet-50 grid on a GPU (small_cnn without torchvision), a quick one on a CPU.

        The GPU grid is batch 64, 128, 256 x both layouts x fp32, tf32, amp-fp16, amp-bf16: the
        FP32-versus-FP16 table of the reference results, reproduced locally (a few minutes).
        """
        import torch

        if not torch.cuda.is_available():
            return cls.quick(device="cpu")
        model = "resnet50" if importlib.util.find_spec("torchvision") else "small_cnn"
        return cls(models=(model,), batches=(64, 128, 256), layouts=("nchw", "channels_last"),
                   precisions=("fp32", "tf32", "amp-fp16", "amp-bf16"), device="cuda",
                   warmup=4, steps=12, repeats=3)

    @classmethod
    def quick(cls, **overrides: Any) -> "SweepSpec":
        """Returns a small sweep that finishes in seconds on a CPU (and quickly on a GPU)."""
        base = dict(models=("small_cnn",), batches=(8, 32), layouts=("nchw", "channels_last"),
                    precisions=("fp32", "amp-bf16"), warmup=1, steps=4, repeats=2)
        base.update(overrides)
        return cls(**base)

"""Training-step sweeps over batch size, memory layout, precision and loss-scaler settings.

A sweep is a grid of :class:`Point` s built from a :class:`SweepSpec`. Each point is one
full training step (forward, loss, backward, scaler step, optimizer step) on synthetic data
already on the device, measured like this:

1. build a fresh model and batch, run ``warmup`` steps (cuDNN picks algorithms, the caching
   allocator fills, clocks rise);
2. time ``steps`` steps back to back, with CUDA events between consecutive steps on a GPU
   (so gaps between steps count) and ``time.perf_counter`` on a CPU;
3. report the median step time and its 10th-90th percentile spread, samples/s, peak memory
   allocated and reserved, the final loss scale and how many steps the scaler skipped, and GPU
   telemetry sampled by :class:`fp16lab.telemetry.TelemetrySampler` during the timed steps.

Repeats of a point are interleaved with the other points (repeat r of every point before repeat
r+1 of any), so a slow drift of clocks or temperature spreads over all points instead of biasing
one; a point whose repeat medians differ by more than ``tolerance`` is flagged ``unstable``.

Nothing is lost: every finished repeat is appended to a parquet file (with a CSV copy) as soon
as it finishes, atomically. A CUDA out-of-memory point is recorded with status ``oom`` and its
memory released; any other failure is recorded with its message; re-running the same sweep
skips what the file already holds.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib.util
import json
import math
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pandas as pd

#: Precision names, with what each one does to the training step.
PRECISIONS = {
    "fp32": "fp32 weights and maths; TF32 off for matmul and cuDNN",
    "tf32": "fp32 weights; matmul and convolutions on TF32 tensor cores (no effect on a CPU)",
    "amp-fp16": "autocast to fp16 with a GradScaler using the point's scaler settings",
    "amp-bf16": "autocast to bf16, no scaler (bf16 has fp32's exponent range)",
    "fp16": ("pure fp16 model with fp32 master weights in the optimizer and a dynamic loss "
             "scaler (the Apex O2 recipe; BatchNorm kept in fp32)"),
}

#: Memory layouts, for image models only.
LAYOUTS = {
    "nchw": "contiguous NCHW tensors (PyTorch's default)",
    "channels_last": "NHWC in memory (torch.channels_last), what tensor-core convolutions prefer",
}

#: Precisions whose step uses a loss scaler (so the scaler settings matter).
SCALED_PRECISIONS = ("amp-fp16", "fp16")

#: What a results row's ``status`` can be.
STATUSES = ("ok", "oom", "error")

#: Learning rate and momentum of the SGD optimizer every point uses.
LR, MOMENTUM = 0.01, 0.9


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
class ScalerSettings:
    """Dynamic loss-scaler settings, with torch.amp.GradScaler's defaults.

    The scale starts at ``init_scale``; a step whose gradients hold an inf or NaN is skipped and
    the scale multiplied by ``backoff_factor``; after ``growth_interval`` finite steps in a row
    the scale is multiplied by ``growth_factor``.
    """

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        problems = []
        if not (isinstance(self.init_scale, (int, float)) and math.isfinite(self.init_scale)
                and self.init_scale > 0):
            problems.append(f"init_scale must be a finite number > 0, got {self.init_scale!r}")
        if not (isinstance(self.growth_factor, (int, float)) and math.isfinite(self.growth_factor)
                and self.growth_factor > 1):
            problems.append(f"growth_factor must be a finite number > 1, got {self.growth_factor!r}")
        if not (isinstance(self.backoff_factor, (int, float)) and 0 < self.backoff_factor < 1):
            problems.append(f"backoff_factor must be in (0, 1), got {self.backoff_factor!r}")
        if (isinstance(self.growth_interval, bool) or not isinstance(self.growth_interval, int)
                or self.growth_interval < 1):
            problems.append(f"growth_interval must be an integer >= 1, got {self.growth_interval!r}")
        if problems:
            raise ValueError("bad scaler settings: " + "; ".join(problems))


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
        from .models import MODELS, is_image_model

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
        from .models import MODELS, is_image_model

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
        from .models import is_image_model

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


# --------------------------------------------------------------------------- measuring one point

#: Provenance columns copied from fp16lab.device.metadata() into every row.
META_COLUMNS = ("gpu_name", "compute_capability", "driver_version", "cuda_driver_version",
                "cuda_runtime_version", "torch", "cudnn", "host", "python")

#: Every row's columns, in order.
ROW_COLUMNS = (
    "key", "model", "batch", "layout", "precision", "init_scale", "growth_factor",
    "backoff_factor", "growth_interval", "cudnn_benchmark", "device", "repeat", "status",
    "error", "warmup", "steps", "tolerance", "step_ms_median", "step_ms_p10", "step_ms_p90",
    "spread", "samples_per_s", "peak_mem_allocated_mb", "peak_mem_reserved_mb", "memory_note",
    "final_scale", "skipped_steps", "final_loss", "telemetry_samples", "gpu_busy_mean",
    "gpu_busy_max", "mem_busy_mean", "mem_busy_max", "sm_clock_mhz_mean", "sm_clock_mhz_max",
    "power_w_mean", "power_w_max", "telemetry_note", "elapsed_s", "finished_at", *META_COLUMNS,
)

#: Called before every training step as fault_injector(point, repeat, step_index); tests use
#: it to raise an out-of-memory error or an interrupt from inside a point.
FaultInjector = Callable[[Point, int, int], None]


def is_oom(exc: BaseException) -> bool:
    """Returns True when an exception is an out-of-memory error (CUDA or host)."""
    import torch

    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def _save_math_flags() -> dict[str, Any]:
    """Returns the TF32 and cudnn.benchmark settings, read so that reading never fails.

    torch >= 2.9 has a second, per-backend TF32 API (``fp32_precision``); once someone has used
    it, reading the legacy ``allow_tf32`` flags raises, so those are read only where they can be.
    """
    import torch

    b = torch.backends
    state: dict[str, Any] = {"benchmark": b.cudnn.benchmark}
    for name, get in (("matmul", lambda: b.cuda.matmul.allow_tf32),
                      ("cudnn", lambda: b.cudnn.allow_tf32)):
        try:
            state[name] = get()
        except RuntimeError:  # "mix of the legacy and new APIs"
            pass
    if hasattr(b.cuda.matmul, "fp32_precision") and hasattr(b.cudnn, "conv"):
        state["new"] = (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision,
                        b.cudnn.rnn.fp32_precision)
    return state


def _restore_math_flags(state: dict[str, Any]) -> None:
    import torch

    b = torch.backends
    if "matmul" in state:
        b.cuda.matmul.allow_tf32 = state["matmul"]
    if "cudnn" in state:
        b.cudnn.allow_tf32 = state["cudnn"]
    if "new" in state:  # after the legacy flags: the per-backend values win where they are set
        b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision = \
            state["new"]
    b.cudnn.benchmark = state["benchmark"]


@contextlib.contextmanager
def _math_flags(point: Point):
    """Sets TF32 (on only for 'tf32') and cudnn.benchmark for a point, then restores them."""
    import torch

    b = torch.backends
    saved = _save_math_flags()
    tf32 = point.precision == "tf32"
    # the legacy setters also set the per-backend flags, leaving both APIs consistent
    b.cuda.matmul.allow_tf32 = tf32
    b.cudnn.allow_tf32 = tf32
    b.cudnn.benchmark = point.cudnn_benchmark
    try:
        yield
    finally:
        _restore_math_flags(saved)


def _keep_batchnorm_fp32(model: Any) -> None:
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.float()


def make_train_step(point: Point, model: Any, x: Any, y: Any) -> tuple[Callable[[], Any], Any]:
    """Returns (step, scaler): a closure running one full training step, and its scaler or None.

    ``step.optimizer`` is the optimizer the step uses.

    The model, input and labels must already be on the point's device, in its layout. For
    ``fp16`` the model is converted to fp16 here (BatchNorm stays fp32) and the optimizer steps
    fp32 master copies of the weights, which are copied back into the model after each step.
    """
    import torch
    import torch.nn.functional as F

    dev = point.device
    prec = point.precision
    s = point.scaler
    if prec == "fp16":
        model.half()
        _keep_batchnorm_fp32(model)
        x = x.half()
        params = [p for p in model.parameters() if p.requires_grad]
        master = [p.detach().float().clone() for p in params]
        opt = torch.optim.SGD(master, lr=LR, momentum=MOMENTUM)
        scaler = torch.amp.GradScaler(dev, init_scale=s.init_scale, growth_factor=s.growth_factor,
                                      backoff_factor=s.backoff_factor,
                                      growth_interval=s.growth_interval)

        def step() -> Any:
            model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x).float(), y)
            scaler.scale(loss).backward()
            # fp16 gradients (inf where the scaled loss overflowed) become fp32 master gradients;
            # the scaler unscales them in fp32, skips the step on inf/NaN and adjusts the scale.
            for m, p in zip(master, params):
                m.grad = None if p.grad is None else p.grad.float()
            scaler.step(opt)
            scaler.update()
            with torch.no_grad():
                for m, p in zip(master, params):
                    p.copy_(m)
            return loss

        step.optimizer = opt
        return step, scaler

    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    if prec == "amp-fp16":
        scaler = torch.amp.GradScaler(dev, init_scale=s.init_scale, growth_factor=s.growth_factor,
                                      backoff_factor=s.backoff_factor,
                                      growth_interval=s.growth_interval)

        def step() -> Any:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev, dtype=torch.float16):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            return loss

        step.optimizer = opt
        return step, scaler

    autocast = torch.autocast(dev, dtype=torch.bfloat16, enabled=prec == "amp-bf16")

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    step.optimizer = opt
    return step, None


class _ScaleHistory:
    """Records the loss scale after every step without a host sync, to count skipped steps."""

    def __init__(self, scaler: Any):
        self.scaler = scaler
        self.values: list[Any] = []

    def record(self) -> None:
        if self.scaler is None:
            return
        t = getattr(self.scaler, "_scale", None)  # GradScaler's scale tensor, on the device
        # get_scale() would force a GPU sync each step and distort the timing; clone() does not
        self.values.append(t.clone() if t is not None else self.scaler.get_scale())

    def final_and_skipped(self, init_scale: float) -> tuple[float | None, int | None]:
        """Returns (final scale, number of steps whose update lowered the scale)."""
        if self.scaler is None:
            return None, None
        xs = [init_scale] + [float(v) for v in self.values]
        skipped = sum(1 for i in range(1, len(xs)) if xs[i] < xs[i - 1])
        return xs[-1], skipped


def _run_point(point: Point, *, warmup: int, steps: int, telemetry: bool, interval_s: float,
               repeat: int, fault_injector: FaultInjector | None) -> dict[str, Any]:
    """Returns the measurements of one repeat of one point (raises on OOM and other failures)."""
    import torch

    from .bench import summarize
    from .models import NUM_CLASSES, build_model, input_shape
    from .telemetry import TelemetrySampler

    dev = point.device
    cuda = dev == "cuda"
    torch.manual_seed(1234 + repeat)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    model = build_model(point.model).to(dev)
    x = torch.randn(input_shape(point.model, point.batch), device=dev)
    y = torch.randint(0, NUM_CLASSES, (point.batch,), device=dev)
    if point.layout == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    step, scaler = make_train_step(point, model, x, y)
    history = _ScaleHistory(scaler)

    def one(i: int) -> Any:
        if fault_injector is not None:
            fault_injector(point, repeat, i)
        out = step()
        history.record()
        return out

    for i in range(warmup):
        one(i)
    sampler = TelemetrySampler(enabled=telemetry and cuda, interval_s=interval_s)
    if not cuda and telemetry:
        sampler.note = "CPU run: no GPU telemetry"
    if cuda:
        torch.cuda.synchronize()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        sampler.start()
        try:
            events[0].record()
            for i in range(steps):
                loss = one(warmup + i)
                events[i + 1].record()
            torch.cuda.synchronize()
        finally:  # a failure mid-point must not leave the sampler thread running
            tele = sampler.stop()
        times = [events[i].elapsed_time(events[i + 1]) for i in range(steps)]
        peak_alloc = torch.cuda.max_memory_allocated() / 2**20
        peak_res = torch.cuda.max_memory_reserved() / 2**20
        mem_note = ""
    else:
        sampler.start()
        times = []
        try:
            for i in range(steps):
                t0 = time.perf_counter()
                loss = one(warmup + i)
                times.append((time.perf_counter() - t0) * 1e3)
        finally:
            tele = sampler.stop()
        peak_alloc = peak_res = None
        mem_note = "CPU run: torch keeps no peak-memory counter for host allocations"
    timing = summarize(times)
    final_scale, skipped = history.final_and_skipped(point.scaler.init_scale if point.scaler else 1.0)
    return {
        "step_ms_median": timing.median_ms, "step_ms_p10": timing.p10_ms,
        "step_ms_p90": timing.p90_ms, "spread": timing.spread,
        "samples_per_s": point.batch / (timing.median_ms / 1e3),
        "peak_mem_allocated_mb": peak_alloc, "peak_mem_reserved_mb": peak_res,
        "memory_note": mem_note, "final_scale": final_scale, "skipped_steps": skipped,
        "final_loss": float(loss.detach().float()), **tele.as_dict(),
    }


_META_CACHE: dict[str, Any] = {}


def _provenance() -> dict[str, Any]:
    if not _META_CACHE:
        from .device import metadata

        meta = metadata()
        _META_CACHE.update({k: meta.get(k) for k in META_COLUMNS})
        if _META_CACHE.get("cudnn") is not None:
            _META_CACHE["cudnn"] = str(_META_CACHE["cudnn"])
    return dict(_META_CACHE)


def _drop_inner_frames(exc: BaseException) -> None:
    """Cuts an exception's traceback below the current frame.

    Whoever catches an exception keeps its traceback, and with it the frames (and the closures
    of their functions) that hold the point's model, optimizer and activations; cutting the
    traceback here lets that memory go now instead of when the exception is dropped.
    """
    if exc.__traceback__ is not None:
        exc.__traceback__.tb_next = None


def _release_memory() -> None:
    """Frees what a finished or failed point left: unreachable objects, then cached GPU blocks."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def measure_point(point: Point, *, repeat: int = 0, warmup: int = 3, steps: int = 10,
                  tolerance: float = 0.03, telemetry: bool = True, interval_s: float = 0.05,
                  fault_injector: FaultInjector | None = None) -> dict[str, Any]:
    """Returns one results row for one repeat of a point, with status 'ok', 'oom' or 'error'.

    An out-of-memory error or any other exception is caught and recorded in the row; the
    point's model, optimizer and tensors are then released (``gc.collect`` and
    ``torch.cuda.empty_cache``) so the next point starts from the same memory level.
    ``KeyboardInterrupt`` is re-raised after the same release.
    """
    row: dict[str, Any] = dict.fromkeys(ROW_COLUMNS)
    row.update(point.settings(), key=point.key, repeat=repeat, warmup=warmup, steps=steps,
               tolerance=tolerance, error="")
    t0 = time.perf_counter()
    status, error = "ok", ""
    try:
        with _math_flags(point):
            row.update(_run_point(point, warmup=warmup, steps=steps, telemetry=telemetry,
                                  interval_s=interval_s, repeat=repeat,
                                  fault_injector=fault_injector))
    except Exception as e:  # recorded, and the sweep goes on
        status = "oom" if is_oom(e) else "error"
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        _drop_inner_frames(e)
    except BaseException as e:  # KeyboardInterrupt: release the point's memory, then re-raise
        _drop_inner_frames(e)
        _release_memory()
        raise
    _release_memory()
    row.update(status=status, error=error, elapsed_s=time.perf_counter() - t0,
               finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               **_provenance())
    return row


# --------------------------------------------------------------------------- results file

def _csv_path(path: Path) -> Path:
    return path.with_suffix(".csv")


def read_results(path: str | Path) -> pd.DataFrame:
    """Returns the rows of a results file (parquet, or its CSV export); empty if it is absent."""
    p = Path(path)
    if not p.exists():
        return pd.DataFrame(columns=list(ROW_COLUMNS))
    if p.suffix == ".csv":
        return pd.read_csv(p)
    return pd.read_parquet(p)


def _atomic_write(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    if path.suffix == ".csv":
        df.to_csv(tmp, index=False)
    else:
        df.to_parquet(tmp, index=False)
    os.replace(tmp, path)  # a reader never sees half a file, an interrupt never leaves one


def append_rows(path: str | Path, rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Appends rows to a parquet results file (and rewrites its CSV copy); returns all rows."""
    p = Path(path)
    if p.suffix != ".parquet":
        raise ValueError(f"a results file must end in .parquet (a .csv copy is written beside "
                         f"it), got {p}")
    p.parent.mkdir(parents=True, exist_ok=True)
    new = pd.DataFrame([{c: r.get(c) for c in ROW_COLUMNS} for r in rows], columns=list(ROW_COLUMNS))
    old = read_results(p)
    frames = [f for f in (old, new) if len(f)]
    df = pd.concat(frames, ignore_index=True) if frames else new
    _atomic_write(df, p)
    _atomic_write(df, _csv_path(p))
    return df


# --------------------------------------------------------------------------- running a sweep

ResultCallback = Callable[[dict[str, Any], int, int], None]


def run_sweep(spec: SweepSpec, out: str | Path | None = None, *,
              stop: threading.Event | None = None, on_result: ResultCallback | None = None,
              progress: bool = False, fault_injector: FaultInjector | None = None) -> pd.DataFrame:
    """Runs a sweep and returns its rows (one per point and repeat), resuming from ``out``.

    Args:
        spec: the grid and how to measure it.
        out: a ``.parquet`` results file; each finished repeat is appended at once (with a CSV
            copy). Repeats the file already holds are skipped, as are the remaining repeats of
            a point recorded as ``oom`` or ``error`` (delete those rows to retry them). A point's
            key holds its settings, not warmup/steps: measure with another protocol into
            another file.
        stop: when set (from another thread), the sweep ends after the current point.
        on_result: called as ``on_result(row, done, total)`` after every finished repeat.
        progress: show a tqdm progress bar.
        fault_injector: called before every training step; for tests.
    """
    points = spec.points()
    keys = {p.key for p in points}
    existing = read_results(out) if out is not None else pd.DataFrame(columns=list(ROW_COLUMNS))
    existing = existing[existing["key"].isin(keys)] if len(existing) else existing
    done = {(k, int(r)) for k, r, s in zip(existing.get("key", []), existing.get("repeat", []),
                                            existing.get("status", [])) if s == "ok"}
    failed = {k for k, s in zip(existing.get("key", []), existing.get("status", [])) if s != "ok"}
    tasks = [(r, p) for r in range(spec.repeats) for p in points
             if (p.key, r) not in done and p.key not in failed]
    rows: list[dict[str, Any]] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(tasks), unit="point", desc="sweep")
    try:
        for i, (r, p) in enumerate(tasks):
            if stop is not None and stop.is_set():
                break
            if p.key in failed:
                if bar is not None:
                    bar.update(1)
                continue
            if bar is not None:
                bar.set_postfix_str(f"{p.label()} r{r}", refresh=True)
            row = measure_point(p, repeat=r, warmup=spec.warmup, steps=spec.steps,
                                tolerance=spec.tolerance, telemetry=spec.telemetry,
                                interval_s=spec.telemetry_interval_s,
                                fault_injector=fault_injector)
            if out is not None:
                append_rows(out, [row])
            rows.append(row)
            if row["status"] != "ok":
                failed.add(p.key)
            if bar is not None:
                bar.update(1)
            if on_result is not None:
                on_result(row, i + 1, len(tasks))
    finally:
        if bar is not None:
            bar.close()
    if out is not None:
        df = read_results(out)
        return df[df["key"].isin(keys)].reset_index(drop=True)
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))


# --------------------------------------------------------------------------- summaries

_POINT_COLUMNS = ("model", "batch", "layout", "precision", "init_scale", "growth_factor",
                  "backoff_factor", "growth_interval", "cudnn_benchmark", "device")


def summarize_results(rows: pd.DataFrame, tolerance: float | None = None) -> pd.DataFrame:
    """Returns one row per point: the median over repeats, the repeat spread and the flags.

    ``repeat_spread`` is (max - min) / median of the repeats' median step times; a point is
    ``unstable`` when it exceeds ``tolerance`` (by default the tolerance the sweep was run with).
    ``status`` is 'oom' or 'error' when any repeat failed, else 'ok'.
    """
    out = []
    for key, g in rows.groupby("key", sort=False):
        first = g.iloc[0]
        ok = g[g["status"] == "ok"]
        bad = g[g["status"] != "ok"]
        tol = tolerance if tolerance is not None else float(first.get("tolerance") or 0.03)
        rec: dict[str, Any] = {c: first[c] for c in _POINT_COLUMNS}
        rec["key"] = key
        rec["status"] = bad["status"].iloc[0] if len(bad) else "ok"
        rec["error"] = bad["error"].iloc[0] if len(bad) else ""
        rec["repeats"] = len(ok)
        if len(ok):
            med = ok["step_ms_median"].astype(float)
            m = float(med.median())
            rec["step_ms"] = m
            rec["samples_per_s"] = float(first["batch"]) / (m / 1e3)
            rec["spread"] = float(ok["spread"].astype(float).median())
            rec["repeat_spread"] = float((med.max() - med.min()) / m) if len(ok) > 1 else 0.0
            rec["unstable"] = bool(rec["repeat_spread"] > tol)
            for c in ("peak_mem_allocated_mb", "peak_mem_reserved_mb"):
                vals = pd.to_numeric(ok[c], errors="coerce")
                rec[c] = float(vals.max()) if vals.notna().any() else None
            for c in ("final_scale", "skipped_steps", "gpu_busy_mean", "mem_busy_mean",
                      "sm_clock_mhz_mean", "power_w_mean", "power_w_max"):
                vals = pd.to_numeric(ok[c], errors="coerce")
                rec[c] = float(vals.mean()) if vals.notna().any() else None
        else:
            rec["unstable"] = False
        for c in META_COLUMNS:
            rec[c] = first.get(c)
        out.append(rec)
    cols = ["key", *_POINT_COLUMNS, "status", "repeats", "step_ms", "samples_per_s", "spread",
            "repeat_spread", "unstable", "peak_mem_allocated_mb", "peak_mem_reserved_mb",
            "final_scale", "skipped_steps", "gpu_busy_mean", "mem_busy_mean", "sm_clock_mhz_mean",
            "power_w_mean", "power_w_max", "error", *META_COLUMNS]
    return pd.DataFrame(out).reindex(columns=cols)


def describe_rows(rows: pd.DataFrame) -> str:
    """Returns one line naming the device, driver, torch and CUDA versions of a results table."""
    if not len(rows):
        return "no rows"
    parts = []
    for (gpu, drv, cuda, tv), _ in rows.groupby(
            [rows["gpu_name"].fillna("CPU"), rows["driver_version"].fillna("n/a"),
             rows["cuda_runtime_version"].fillna("n/a"), rows["torch"].fillna("?")]):
        parts.append(f"{gpu} (driver {drv}, CUDA {cuda}, torch {tv})")
    when = rows["finished_at"].dropna()
    span = f", {when.min()} to {when.max()}" if len(when) else ""
    return "measured on " + "; ".join(parts) + span


def format_report(rows: pd.DataFrame, tolerance: float | None = None) -> str:
    """Returns a readable table of a sweep's results, one line per point."""
    if not len(rows):
        return "no results"
    s = summarize_results(rows, tolerance)
    show = pd.DataFrame({
        "model": s["model"], "batch": s["batch"], "layout": s["layout"],
        "precision": s["precision"],
        "scale0": s["init_scale"].map(_pow2),
        "grow every": s["growth_interval"].map(lambda v: "" if pd.isna(v) else f"{int(v)}"),
        "status": s["status"],
        "samples/s": s["samples_per_s"].map(lambda v: "" if pd.isna(v) else f"{v:,.0f}"),
        "step ms": s["step_ms"].map(lambda v: "" if pd.isna(v) else f"{v:.2f}"),
        "spread": s["spread"].map(lambda v: "" if pd.isna(v) else f"{100 * v:.1f}%"),
        "repeats": s["repeats"],
        "rep. spread": [("" if pd.isna(v) else f"{100 * v:.1f}%") + (" UNSTABLE" if u else "")
                        for v, u in zip(s["repeat_spread"], s["unstable"])],
        "peak alloc MB": s["peak_mem_allocated_mb"].map(lambda v: "" if pd.isna(v) else f"{v:,.0f}"),
        "peak resv MB": s["peak_mem_reserved_mb"].map(lambda v: "" if pd.isna(v) else f"{v:,.0f}"),
        "final scale": s["final_scale"].map(_pow2),
        "skipped": s["skipped_steps"].map(lambda v: "" if pd.isna(v) else f"{v:g}"),
        "GPU busy": s["gpu_busy_mean"].map(lambda v: "" if pd.isna(v) else f"{v:.0f}%"),
        "power W": s["power_w_mean"].map(lambda v: "" if pd.isna(v) else f"{v:.0f}"),
    })
    lines = [describe_rows(rows), show.to_string(index=False)]
    errs = s[s["status"] != "ok"]
    for _, e in errs.iterrows():
        lines.append(f"{e['status']}: {e['model']} b{e['batch']} {e['layout']} {e['precision']}: "
                     f"{e['error']}")
    n_unstable = int(s["unstable"].sum())
    if n_unstable:
        lines.append(f"{n_unstable} point(s) UNSTABLE: their repeat medians differ by more than "
                     f"the tolerance; re-run them on a quieter machine or with more steps")
    return "\n".join(lines)


def _pow2(v: Any) -> str:
    """Returns a scale as '2^k' when it is a power of two, else in %g form; '' for none."""
    if v is None or pd.isna(v):
        return ""
    k = math.log2(v) if v > 0 else float("nan")
    return f"2^{k:.0f}" if k == round(k) else f"{v:g}"


def throughput_table(rows: pd.DataFrame, *, model: str | None = None,
                     index: str = "batch", columns: Sequence[str] = ("layout", "precision")
                     ) -> pd.DataFrame:
    """Returns samples/s pivoted by batch size (rows) and layout/precision (columns).

    Only points measured with the default scaler settings (or none) are used, so scaler
    variations do not average into the table.
    """
    s = summarize_results(rows)
    s = s[s["status"] == "ok"]
    if model is not None:
        s = s[s["model"] == model]
    default = ScalerSettings().init_scale
    s = s[s["init_scale"].isna() | (s["init_scale"] == default)]
    return s.pivot_table(index=index, columns=list(columns), values="samples_per_s",
                         aggfunc="median")


def ratio_table(rows: pd.DataFrame, *, model: str | None = None, by: str = "precision",
                baseline: str = "fp32") -> pd.DataFrame:
    """Returns samples/s of every value of ``by`` divided by the ``baseline``'s, per batch size.

    ``by`` is 'precision' (columns: layout, precision) or 'layout' (columns: precision,
    layout); a value above 1 is a speed-up over the baseline measured at the same batch size and
    other setting.
    """
    if by not in ("precision", "layout"):
        raise ValueError(f"by must be 'precision' or 'layout', got {by!r}")
    other = "layout" if by == "precision" else "precision"
    t = throughput_table(rows, model=model, columns=(other, by))
    ratios = {}
    for o in t.columns.get_level_values(0).unique():
        sub = t[o]
        if baseline not in sub.columns:
            continue
        for v in sub.columns:
            if v != baseline:
                ratios[(o, f"{v} / {baseline}")] = sub[v] / sub[baseline]
    if not ratios:
        raise ValueError(f"no {by} {baseline!r} points to compare with")
    out = pd.DataFrame(ratios)
    out.columns = pd.MultiIndex.from_tuples(out.columns, names=[other, by])
    return out


def scaler_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Returns the points that differ only in loss-scaler settings, side by side.

    Shows what the settings change (skipped steps, the final scale) next to what they do not
    (samples/s), for every model, batch, layout and precision measured with several settings.
    Scales are given as log2 (16 for 65536).
    """
    s = summarize_results(rows)
    s = s[s["precision"].isin(SCALED_PRECISIONS) & (s["status"] == "ok")]
    group = ["model", "batch", "layout", "precision"]
    scaler_cols = ["init_scale", "growth_factor", "backoff_factor", "growth_interval"]
    n = s.groupby(group)[scaler_cols].transform(lambda c: c.nunique()).max(axis=1) if len(s) else []
    s = s[pd.Series(n, index=s.index) > 1] if len(s) else s
    steps = rows.groupby("key")[["warmup", "steps"]].first().sum(axis=1).rename("steps_per_repeat")
    s = s.join(steps, on="key")
    s = s.assign(log2_init_scale=_log2(s["init_scale"]), log2_final_scale=_log2(s["final_scale"]))
    return s[[*group, "log2_init_scale", "growth_factor", "backoff_factor", "growth_interval",
              "steps_per_repeat", "skipped_steps", "log2_final_scale", "samples_per_s",
              "repeat_spread"]].reset_index(drop=True)


def _log2(x: pd.Series) -> pd.Series:
    import numpy as np

    return np.log2(pd.to_numeric(x, errors="coerce").astype(float))


def load_reference(name: str = "sweep_reference_h200") -> pd.DataFrame | None:
    """Returns the rows of a reference sweep in data/, or None (saying so) when it is absent."""
    from .bench import DATA_DIR

    path = Path(DATA_DIR) / f"{name}.parquet"
    if not path.exists():
        print(f"{path.name} is not in data/ yet: run benchmarks/sweep_reference.py on a GPU to "
              f"make it. The cells that use it print nothing.")
        return None
    rows = read_results(path)
    print(f"{path.name}: {len(rows)} rows, {describe_rows(rows)}")
    return rows


def engine_check(name: str = "sweep_engine_vs_loop") -> str:
    """Returns the engine-versus-bare-loop benchmark's findings as a few lines of text."""
    from .bench import describe_source, read_result

    try:
        r = read_result(name)
    except FileNotFoundError:
        return (f"{name}.json is not in data/ yet: run benchmarks/sweep_engine_vs_loop.py on a "
                f"GPU to make it")
    m = r["meta"]
    s = m["summary"]
    spread = max(s["repeat_spread"].values())
    return "\n".join([
        f"{s['model']} b{s['batch']} {s['layout']} {s['precision']}, {s['repeats']} interleaved "
        f"repeats of {s['steps']} steps; {describe_source(m)}",
        f"bare loop {s['bare_ms']:.2f} ms/step, engine {s['engine_ms']:.2f} ms/step: "
        f"ratio {s['engine_vs_bare']:.3f} (goal: within 5%)",
        f"worst repeat spread {100 * spread:.2f}% (goal: at most 3%)",
        f"telemetry overhead {100 * s['telemetry_overhead']:+.2f}% (goal: under 1%)",
    ])


_LAYOUT_STYLE = {"nchw": ("-", "o"), "channels_last": ("--", "s")}
_PLOT_PANELS = (("samples_per_s", "samples/s"),
                ("peak_mem_allocated_mb", "peak memory allocated (MB)"),
                ("gpu_busy_mean", "GPU busy % (NVML)"))


def _plot_points(rows: pd.DataFrame, model: str | None) -> pd.DataFrame:
    """Returns the summarized 'ok' points a plot shows: default scaler settings (or none) only."""
    if not len(rows):
        return pd.DataFrame()
    s = summarize_results(rows)
    s = s[s["status"] == "ok"]
    if model is not None:
        s = s[s["model"] == model]
    d = ScalerSettings()
    default = (s["init_scale"].isna()
               | ((s["init_scale"] == d.init_scale) & (s["growth_factor"] == d.growth_factor)
                  & (s["backoff_factor"] == d.backoff_factor)
                  & (s["growth_interval"] == d.growth_interval)))
    return s[default]


def plot_style(layout: str, precision: str) -> dict[str, Any]:
    """Returns the matplotlib line style of a series: colour by precision, line and marker by layout."""
    ls, marker = _LAYOUT_STYLE.get(layout, (":", "^"))
    return dict(color=f"C{list(PRECISIONS).index(precision)}", ls=ls, marker=marker)


def plot_results(rows: pd.DataFrame, *, model: str | None = None, fig: Any = None) -> Any:
    """Returns a matplotlib Figure: samples/s, peak memory and GPU busy % against batch size.

    One line per layout and precision: colour is the precision, line style and marker the
    layout; every point has a marker, so a single batch size shows too. A hollow marker is an
    UNSTABLE point (its repeats differ by more than the tolerance). With several models, each
    model gets its own row of panels. Only points measured with the default loss-scaler settings
    (or none) are drawn, so scaler variations do not average in. Pass a
    ``matplotlib.figure.Figure`` as ``fig`` to draw without pyplot (from a background thread);
    without one, a pyplot figure is made and closed, so a notebook shows it once, as the value.
    """
    s = _plot_points(rows, model)
    models = list(dict.fromkeys(s["model"])) if len(s) else [model or ""]
    if fig is None:
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(14, 3.6 * len(models)), layout="constrained")
        plt.close(fig)
    axes = fig.subplots(len(models), 3, squeeze=False)
    handles: dict[str, Any] = {}
    any_unstable = False
    for r, m in enumerate(models):
        sm = s[s["model"] == m] if len(s) else s
        for ax, (col, title) in zip(axes[r], _PLOT_PANELS):
            ax.set_title(f"{m}: {title}" if len(models) > 1 else title, fontsize=10)
            ax.set_xlabel("batch size")
            has = len(sm) and pd.to_numeric(sm[col], errors="coerce").notna().any()
            if not has:
                why = ("not measured on a CPU" if len(sm) and (sm["device"] == "cpu").all()
                       else "no points yet")
                ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes,
                        color="0.4")
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            for (lay, prec), g in sm.groupby(["layout", "precision"], sort=False):
                g = g.assign(y=pd.to_numeric(g[col], errors="coerce")).dropna(subset=["y"])
                g = g.sort_values("batch")
                if not len(g):
                    continue
                style = plot_style(lay, prec)
                unstable = g["unstable"].astype(bool).to_numpy()
                stable_at = [i for i, u in enumerate(unstable) if not u]
                (line,) = ax.plot(g["batch"].to_numpy(), g["y"].to_numpy(), **style, ms=6,
                                  markevery=stable_at, label=f"{lay} {prec}")
                if unstable.any():
                    any_unstable = True
                    ax.plot(g["batch"].to_numpy()[unstable], g["y"].to_numpy()[unstable],
                            ls="none", marker=style["marker"], ms=6, color=style["color"],
                            mfc="white", zorder=line.get_zorder() + 0.1)
                handles.setdefault(f"{lay} {prec}", line)
            batches = sorted(sm["batch"].unique())
            if len(batches) > 1:
                ax.set_xscale("log", base=2)
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.minorticks_off()
            ax.set_ylim(0, 105) if col == "gpu_busy_mean" else ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
    if handles:
        from matplotlib.lines import Line2D

        labels = list(handles)
        hs = [Line2D([], [], **{k: v for k, v in (("color", h.get_color()),
                                                  ("ls", h.get_linestyle()),
                                                  ("marker", h.get_marker()))})
              for h in handles.values()]
        if any_unstable:
            labels.append("hollow: UNSTABLE")
            hs.append(Line2D([], [], ls="none", marker="o", color="0.3", mfc="white"))
        fig.legend(hs, labels, loc="outside right upper", fontsize=8, frameon=False)
    return fig


# --------------------------------------------------------------------------- command line

def _split(text: str, kind: type = str) -> tuple[Any, ...]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        return tuple(kind(t) for t in items)
    except ValueError:
        raise ValueError(f"could not read {text!r} as a comma-separated list of {kind.__name__}")


def _on_off(text: str) -> tuple[bool, ...]:
    table = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}
    bad = [t for t in _split(text) if t.lower() not in table]
    if bad:
        raise ValueError(f"--cudnn-benchmark takes on/off values, got {', '.join(bad)}")
    return tuple(table[t.lower()] for t in _split(text))


def _cmd_sweep(args: Any) -> int:
    scalers = tuple(
        ScalerSettings(init_scale=i, growth_factor=args.growth_factor,
                       backoff_factor=args.backoff_factor, growth_interval=args.growth_interval)
        for i in _split(args.init_scale, float))
    spec = SweepSpec(models=_split(args.model), batches=_split(args.batch, int),
                     layouts=_split(args.layout), precisions=_split(args.precision),
                     scalers=scalers, cudnn_benchmark=_on_off(args.cudnn_benchmark),
                     device=args.device, warmup=args.warmup, steps=args.steps,
                     repeats=args.repeats, tolerance=args.tolerance,
                     telemetry=not args.no_telemetry)
    n = len(spec.points())
    print(f"sweep: {n} points x {spec.repeats} repeats on {spec.resolved_device()}, "
          f"results appended to {args.out}")
    t0 = time.perf_counter()
    try:
        rows = run_sweep(spec, args.out, progress=True)
    except KeyboardInterrupt:
        kept = len(read_results(args.out))
        print(f"\ninterrupted: {args.out} keeps {kept} finished rows; run the same command "
              f"again to resume")
        return 130
    print(f"took {time.perf_counter() - t0:.1f} s")
    print(format_report(rows))
    return 0


def _cmd_report(args: Any) -> int:
    p = Path(args.file)
    if not p.exists():
        raise FileNotFoundError(f"no results file {p}")
    print(format_report(read_results(p), args.tolerance))
    return 0


def register_cli(subparsers: Any) -> None:
    """Adds the ``sweep`` and ``report`` sub-commands to the fp16lab command line."""
    p = subparsers.add_parser("sweep", help="measure training steps over a grid (headless)")
    p.add_argument("--model", default="small_cnn", help=f"comma-separated; one of: "
                   f"{', '.join(__import__('fp16lab.models', fromlist=['MODELS']).MODELS)}")
    p.add_argument("--batch", default="8,16", help="comma-separated batch sizes, e.g. 64,128,256")
    p.add_argument("--layout", default="nchw", help=f"comma-separated; of {', '.join(LAYOUTS)}")
    p.add_argument("--precision", default="fp32",
                   help=f"comma-separated; of {', '.join(PRECISIONS)}")
    p.add_argument("--init-scale", default="65536", help="comma-separated GradScaler init_scale")
    p.add_argument("--growth-factor", type=float, default=2.0)
    p.add_argument("--backoff-factor", type=float, default=0.5)
    p.add_argument("--growth-interval", type=int, default=2000)
    p.add_argument("--cudnn-benchmark", default="off", help="on, off or on,off")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every point")
    p.add_argument("--tolerance", type=float, default=0.03,
                   help="flag a point whose repeat medians differ by more than this fraction")
    p.add_argument("--no-telemetry", action="store_true", help="do not sample NVML")
    p.add_argument("--out", required=True, help="results file (.parquet; a .csv copy is written)")
    p.set_defaults(func=_cmd_sweep)

    r = subparsers.add_parser("report", help="print a sweep's results file as a table")
    r.add_argument("file", help="a .parquet (or .csv) file written by `fp16lab sweep`")
    r.add_argument("--tolerance", type=float, default=None,
                   help="repeat-spread tolerance for the UNSTABLE flag (default: the sweep's)")
    r.set_defaults(func=_cmd_report)

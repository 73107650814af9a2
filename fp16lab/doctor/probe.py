"""How the doctor measures a configuration of a workload: one protocol for every finding.

A :class:`Config` is what the doctor may change (precision, layout, batch size, GradScaler's
settings, a fused optimizer, ``torch.compile``, modules kept in FP32, the workload's own
settings); :meth:`Probe.measure` trains a fresh model under it and returns a
:class:`Measurement`. The protocol, the same for every configuration:

1. build the model (seed 0) and its step with :func:`fp16lab.workload.train_step`;
2. train ``loss_steps`` steps on the step's one batch, recording each loss (these warm up
   cuDNN's and the allocator's choices, and ``torch.compile``);
3. time ``timed_steps`` more with :func:`fp16lab.measure.step_times_ms` (CUDA events on a GPU,
   the host clock on a CPU); the step time is their median.

Where a choice rests on a ratio of speeds (the precision, all changes against the start),
:meth:`Probe.race` times the candidates again side by side, in rounds of balanced orders.

On CUDA the peak is ``torch.cuda.max_memory_allocated`` from before the model is built. A loss
is *within tolerance* of fp32 when every loss is finite and the last one is within
:data:`LOSS_TOLERANCE` of fp32's first loss from fp32's last, at the same batch size.
"""

from __future__ import annotations

import gc
import inspect
import math
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

import torch
from torch import nn

from .. import validate
from ..diagnostics.islands import FP32Island
from ..measure import round_orders, step_times_ms
from ..recipes import PRECISIONS, check_precision, sgd
from ..scaling import ScalerSettings
from ..workload import LAYOUTS, Workload, WorkloadCannotRun, load_workload, train_step

#: How far the last loss of a run may be from fp32's last, as a share of fp32's first loss.
LOSS_TOLERANCE = 0.05


@dataclass(frozen=True)
class Config:
    """One way to train a workload: what the doctor changes, one field at a time."""

    precision: str = "fp32"
    layout: str = "nchw"
    batch_size: int | None = None
    init_scale: float | None = None
    fused: bool = False
    compile_mode: str | None = None
    fp32_modules: tuple[str, ...] = ()
    settings: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        check_precision(self.precision)
        validate.choice("layout", self.layout, LAYOUTS)
        if self.batch_size is not None:
            validate.count("batch_size", self.batch_size)
        if self.init_scale is not None:
            ScalerSettings(init_scale=self.init_scale)
        validate.boolean("fused", self.fused)
        if self.compile_mode is not None:
            validate.choice("compile_mode", self.compile_mode,
                            ("default", "reduce-overhead", "max-autotune"))

    def but(self, **changes: Any) -> "Config":
        """Returns this configuration with ``changes`` applied."""
        return replace(self, **changes)

    def describe(self) -> str:
        """Returns the configuration in words (the fields that differ from the defaults)."""
        parts = [self.precision] + ([self.layout] if self.layout != "nchw" else [])
        if self.batch_size is not None:
            parts.append(f"batch {self.batch_size}")
        if self.init_scale is not None:
            parts.append(f"init_scale 2^{round(math.log2(self.init_scale))}")
        if self.fused:
            parts.append("fused optimizer")
        if self.compile_mode:
            parts.append(f"compile {self.compile_mode}")
        if self.fp32_modules:
            parts.append("FP32: " + ", ".join(self.fp32_modules))
        parts.extend(f"{k}={v}" for k, v in self.settings)
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fp32_modules"] = list(self.fp32_modules)
        d["settings"] = dict(self.settings)
        return d


@dataclass
class Measurement:
    """What :meth:`Probe.measure` found for one configuration (``error`` where it could not run)."""

    config: Config
    batch_size: int
    step_ms: float = math.nan
    samples_per_s: float = math.nan
    peak_bytes: int | None = None
    losses: list[float] = field(default_factory=list)
    final_scale: float | None = None
    error: str | None = None
    seconds: float = 0.0
    raced: bool = False
    label: str | None = field(default=None, repr=False)

    @property
    def ran(self) -> bool:
        return self.error is None

    @property
    def finite(self) -> bool:
        return self.ran and bool(self.losses) and all(math.isfinite(v) for v in self.losses)

    def row(self) -> dict[str, Any]:
        return {"config": self.label or self.config.describe(), "batch_size": self.batch_size,
                "step_ms": self.step_ms, "samples_per_s": self.samples_per_s,
                "peak_bytes": self.peak_bytes, "first_loss": self.losses[0] if self.losses else None,
                "last_loss": self.losses[-1] if self.losses else None,
                "final_scale": self.final_scale, "error": self.error, "raced": self.raced,
                "seconds": round(self.seconds, 2)}


def fused_optimizer(factory: Callable[[Any], torch.optim.Optimizer] | None
                    ) -> Callable[[Any], torch.optim.Optimizer] | None:
    """Returns a factory of the same optimizer with ``fused=True``, or None where torch has no
    fused kernel for it (only SGD, Adam and AdamW have one)."""
    if factory is None:
        return lambda params: sgd(params, fused=True)
    probe = factory([nn.Parameter(torch.zeros(1))])
    cls = type(probe)
    if cls not in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
        return None
    takes = inspect.signature(cls.__init__).parameters
    defaults = {k: v for k, v in probe.defaults.items() if k in takes
                and k not in ("foreach", "fused", "differentiable", "capturable")}
    if cls is torch.optim.SGD:  # recipes.sgd fills the momentum buffers fused SGD leaves unset
        return lambda params: sgd(params, lr=defaults["lr"], momentum=defaults["momentum"],
                                  fused=True) if set(defaults) <= {"lr", "momentum", "dampening",
                                                                   "weight_decay", "nesterov",
                                                                   "maximize"} and not any(
            defaults.get(k) for k in ("dampening", "weight_decay", "nesterov", "maximize")) \
            else cls(params, **defaults, fused=True)
    return lambda params: cls(params, **defaults, fused=True)


def optimizer_is_fused(factory: Callable[[Any], torch.optim.Optimizer] | None) -> bool:
    """Returns whether the workload's optimizer (the recipes' SGD where None) is fused."""
    if factory is None:
        return False
    return bool(factory([nn.Parameter(torch.zeros(1))]).defaults.get("fused"))


def with_fp32_modules(workload: Workload, names: tuple[str, ...]) -> Workload:
    """Returns the workload with the modules ``names`` wrapped in :class:`FP32Island`."""
    if not names:
        return workload

    def build() -> nn.Module:
        model = workload.build()
        for name in names:
            model.set_submodule(name, FP32Island(model.get_submodule(name)))
        return model

    return replace(workload, build=build, reference=None, layouts=workload.layouts)


class Probe:
    """Measures configurations of one workload on one device, by one protocol (the module's)."""

    def __init__(self, workload: Workload, device: str | torch.device, batch_size: int, *,
                 loss_steps: int = 20, timed_steps: int = 10):
        self.workload = workload
        self.device = torch.device(device)
        self.batch_size = validate.count("batch_size", batch_size)
        self.loss_steps = validate.count("loss_steps", loss_steps, low=3)
        self.timed_steps = validate.count("timed_steps", timed_steps)
        self._cache: dict[Config, Measurement] = {}
        self._workloads: dict[tuple[tuple[str, Any], ...], Workload] = {(): workload}

    def workload_for(self, config: Config) -> Workload:
        """Returns the workload a configuration trains (reloaded where its settings change)."""
        if config.settings not in self._workloads:
            if self.workload.reference is None:
                raise WorkloadCannotRun(f"workload {self.workload.name!r} was not loaded by name, "
                                        "so its settings cannot be changed")
            self._workloads[config.settings] = load_workload(
                self.workload.reference, **{**self.workload.arguments, **dict(config.settings)})
        return with_fp32_modules(self._workloads[config.settings], config.fp32_modules)

    def measure(self, config: Config) -> Measurement:
        """Returns the measurement of ``config`` (measured once; later calls return it again)."""
        if config in self._cache:
            return self._cache[config]
        bs = config.batch_size or self.batch_size
        m = Measurement(config, bs)
        t0 = time.perf_counter()
        try:
            self._run(config, m)
        except Exception as e:  # noqa: BLE001 - a configuration that cannot train here
            # (WorkloadCannotRun, out of memory, a compile that fails, a kernel torch lacks)
            # is a measurement's result: the others go on
            m.error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        finally:
            _free(self.device)
        m.seconds = time.perf_counter() - t0
        self._cache[config] = m
        return m

    def _run(self, config: Config, m: Measurement) -> None:
        cuda = self.device.type == "cuda"
        _free(self.device)
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        step = self.build_step(config, m.batch_size)
        m.losses = [float(step().detach()) for _ in range(self.loss_steps)]
        times = step_times_ms(step, self.timed_steps, self.device)
        m.step_ms = statistics.median(times)
        m.samples_per_s = m.batch_size / (m.step_ms / 1e3)
        if step.scaler is not None and getattr(step.scaler, "is_enabled", lambda: True)():
            m.final_scale = float(step.scaler.get_scale())
        if cuda:
            m.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
        del step

    def race(self, configs: list[Config], rounds: int = 3) -> dict[Config, float]:
        """Returns the samples/s of each configuration timed against the others: their steps
        built side by side, warmed up, then ``timed_steps`` of each in turn, ``rounds`` times
        in balanced orders (:func:`~fp16lab.measure.round_orders`), each one's median over all
        its steps. A GPU's clock drifts as it heats, so runs measured one after the other can
        differ by more than their gap; the
        measurements take the raced figures. A configuration that cannot be built beside the
        others (out of memory) keeps its own measurement."""
        rounds = validate.count("rounds", rounds)
        configs = [c for c in dict.fromkeys(configs) if self.measure(c).ran]
        steps: dict[Config, Any] = {}
        _free(self.device)
        for c in configs:
            try:
                steps[c] = self.build_step(c, self.measure(c).batch_size)
                for _ in range(3):
                    steps[c]()
            except Exception:  # noqa: BLE001 - out of memory beside the others
                steps.pop(c, None)
                break
        samples: dict[Config, list[float]] = {c: [] for c in steps}
        for order in round_orders(steps, rounds) if steps else []:
            for c in order:
                samples[c] += step_times_ms(steps[c], self.timed_steps, self.device)
        for c, times in samples.items():
            m = self._cache[c]
            m.step_ms = statistics.median(times)
            m.samples_per_s = m.batch_size / (m.step_ms / 1e3)
            m.raced = True
        steps.clear()
        _free(self.device)
        return {c: self._cache[c].samples_per_s for c in configs}

    def build_step(self, config: Config, batch_size: int) -> Any:
        """Returns the training step of ``config`` at ``batch_size``, built fresh."""
        workload = self.workload_for(config)
        engine: dict[str, Any] = {}
        if config.fused:
            factory = fused_optimizer(workload.optimizer)
            if factory is None:
                raise WorkloadCannotRun(f"workload {workload.name!r}: its optimizer has no fused "
                                        "kernel in torch")
            engine["optimizer"] = factory
        scaler = None if config.init_scale is None else ScalerSettings(init_scale=config.init_scale)
        return train_step(workload, config.precision, self.device, batch_size,
                          layout=config.layout, scaler=scaler, compile_mode=config.compile_mode,
                          **engine)

    def loss_within_tolerance(self, m: Measurement) -> tuple[bool, float]:
        """Returns (within :data:`LOSS_TOLERANCE`, the distance as a share of fp32's first loss)
        of a measurement's last loss from fp32's at the same batch size and settings."""
        if not m.finite:
            return False, math.inf
        ref = self.measure(Config("fp32", batch_size=m.config.batch_size,
                                  settings=m.config.settings))
        if not ref.finite:
            return False, math.inf
        distance = abs(m.losses[-1] - ref.losses[-1]) / max(abs(ref.losses[0]), 1e-12)
        return distance <= LOSS_TOLERANCE, distance

    def measurements(self) -> list[Measurement]:
        return list(self._cache.values())


def _free(device: torch.device) -> None:
    """Frees what earlier steps left (their closures form reference cycles)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def is_scaled(precision: str) -> bool:
    """Returns whether a precision scales the loss (a GradScaler)."""
    return bool(PRECISIONS[check_precision(precision)].scaled)

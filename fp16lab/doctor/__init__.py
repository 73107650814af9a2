"""The mixed-precision doctor: one call measures a workload, says what to change, and
re-measures each change it recommends.

    report = fp16lab.doctor.doctor("gpt2-small", device="cuda", batch_size=8)
    report              # in a notebook: the ranked findings as Markdown
    report.write("out") # out/doctor_gpt2-small.md, .json and a plot

The checks (:data:`fp16lab.doctor.checks.CHECKS`) run in order within a time budget:
precision recipes, FP16's range, precision-sensitive modules, memory layout, shapes, where the
GPU's time goes, the input pipeline, the batch size, several GPUs. Each measurement is the
probe's one protocol (:mod:`fp16lab.doctor.probe`); the findings rank as
:mod:`fp16lab.doctor.report` says; the changes of the findings are then applied together, in
each of the fastest precisions again (:func:`best_combination`), and the fastest whose loss
holds is raced against the starting configuration. ``fp16lab doctor NAME`` is the same from a shell.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from .. import validate
from ..device import metadata
from ..workload import Workload, build_model, load_workload
from .checks import CHECKS, Unchecked, Visit, describe_checks
from .probe import Config, Measurement, Probe, is_scaled
from .report import DoctorReport, Finding, rank

#: The batch size the doctor measures at unless told.
DEFAULT_BATCH = 32


def _workload(workload: Workload | str) -> Workload:
    if isinstance(workload, Workload):
        return workload
    return load_workload(validate.text("workload", workload))


def _checks(names: Any) -> tuple[str, ...]:
    if names is None:
        return tuple(CHECKS)
    if isinstance(names, str):
        names = (names,)
    out = tuple(validate.choice("check", n, CHECKS) for n in names)
    if not out:
        raise ValueError(f"checks must name at least one of {', '.join(CHECKS)}")
    return out


def doctor(workload: Workload | str, device: str | torch.device | None = None, *,
           batch_size: int = DEFAULT_BATCH, precision: str = "fp32", layout: str = "nchw",
           budget_s: float = 300.0, checks: Any = None, loss_steps: int = 20,
           timed_steps: int = 10, progress: bool = True) -> DoctorReport:
    """Measures ``workload`` and returns the :class:`DoctorReport` of what to change.

    Args:
        workload: a :class:`~fp16lab.workload.Workload` or a name :func:`load_workload` takes
            (``"bert-base"``, ``"my_package.my_module:my_workload"``).
        device: where to train (``"cuda"``, ``"cpu"``); default the GPU where torch sees one.
        batch_size: the batch the workload trains at now.
        precision, layout: the configuration it trains in now (the doctor's starting point).
        budget_s: seconds the checks may take; a check that would start after them is listed
            as not checked (a check that started finishes, so a run may overshoot by one).
        checks: the names of the checks to run (default: all of :data:`CHECKS`).
        loss_steps, timed_steps: the probe's protocol: steps whose losses are compared with
            fp32's, then steps timed.
        progress: show a progress bar (one tick a check).
    """
    budget_s = validate.number("budget_s", budget_s, low=0, low_open=True)
    names = _checks(checks)
    validate.boolean("progress", progress)
    device = torch.device(validate.device("device", device) if device is not None else
                          ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but torch sees no CUDA device")
    start = Config(precision, layout)
    wl = _workload(workload)
    try:
        model = build_model(wl)
    except (RuntimeError, TypeError) as e:  # the user's build(): one line, not a traceback
        raise ValueError(f"the doctor cannot measure it: {e}") from e
    wl.check_can_run(precision, layout, model)
    del model
    probe = Probe(wl, device, batch_size, loss_steps=loss_steps, timed_steps=timed_steps)
    visit = Visit(probe, start)
    t0 = time.perf_counter()
    findings: list[Finding] = []
    unchecked: dict[str, str] = {}
    bar = _bar(len(names), wl.name) if progress else None
    timed = _PartTimer(probe)
    with timed("baseline"):
        baseline = probe.measure(start)
    if not baseline.ran:
        raise ValueError(f"workload {wl.name!r} does not train in {start.describe()} on "
                         f"{device}: {baseline.error}")
    for name in names:
        if bar is not None:
            bar.set_postfix_str(name)
        if time.perf_counter() - t0 > budget_s:
            unchecked[name] = f"the budget of {budget_s:.0f} s was spent before it started"
        else:
            with timed(name):
                try:
                    findings += CHECKS[name](visit)
                except Unchecked as e:
                    unchecked[name] = str(e)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    findings = rank(findings)
    combined = None
    config = combine(start, findings)
    if config != start:
        with timed("combination"):
            combined = best_combination(probe, start, config,
                                        visit.notes.get("fine_precisions", [])[:3])
    return DoctorReport(wl.name, _device_name(device), _versions(), start, probe.batch_size,
                        findings, unchecked, probe.measurements(), combined, baseline,
                        time.perf_counter() - t0, budget_s, part_seconds=timed.parts)


class _PartTimer:
    """Times the parts of a doctor run: ``with timer(name):`` adds the part's wall-clock seconds
    and, of them, the seconds of the probe's measurements made inside it (``parts[name]`` is
    ``{"s": ..., "measuring_s": ...}``); the rest is the check's own work (hooks, replays,
    profiles, GEMMs timed alone)."""

    def __init__(self, probe: Probe):
        self.probe = probe
        self.parts: dict[str, dict[str, float]] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        before = {id(m) for m in self.probe.measurements()}
        t0 = time.perf_counter()
        try:
            yield
        finally:
            wall = time.perf_counter() - t0
            measuring = sum(m.seconds for m in self.probe.measurements() if id(m) not in before)
            self.parts[name] = {"s": wall, "measuring_s": min(measuring, wall)}


def best_combination(probe: Probe, start: Config, config: Config,
                     precisions: list[str]) -> Measurement:
    """Returns the measurement of the fastest of ``config`` and its variants in each of
    ``precisions`` (the precision check's fastest within tolerance at the batch it measured),
    whose loss stays within tolerance, raced against the start.

    The precision was chosen at the starting batch; a batch the batch check chose can change
    which is fastest (a step bound by the host at a small batch is bound by the GPU at a large
    one), so the combination is measured again in each."""
    variants = [config] + [config.but(precision=p, init_scale=config.init_scale if is_scaled(p)
                                      else None) for p in precisions if p != config.precision]
    fine = [v for v in variants if probe.loss_within_tolerance(probe.measure(v))[0]]
    if not fine:
        return probe.measure(config)
    speeds = probe.race([start, *fine])
    return probe.measure(max(fine, key=lambda v: speeds[v]))


def combine(start: Config, findings: list[Finding]) -> Config:
    """Returns the starting configuration with the change of every re-measured finding that
    gained (or fixed training), the higher-ranked one first where two set the same field."""
    fields: dict[str, Any] = {}
    for f in findings:
        if not f.verified or not (f.group == "breaks" or (f.gain or 0) > 1):
            continue
        for key, value in f.change.items():
            if key == "settings":
                fields.setdefault("settings", tuple(sorted(value.items())))
            elif key == "fp32_modules":
                fields.setdefault("fp32_modules", tuple(value))
            elif key in Config.__dataclass_fields__:
                fields.setdefault(key, value)
    config = start.but(**fields)
    if config.init_scale is not None and not is_scaled(config.precision):
        config = config.but(init_scale=None)
    return config


def _bar(total: int, name: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with the package
        return None
    return tqdm(total=total, desc=f"doctor {name}", unit="check")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "the CPU"


def _versions() -> dict[str, Any]:
    meta = metadata()
    keep = ("torch", "driver_version", "cuda_runtime_version", "cudnn", "measured_at")
    out = {k: meta.get(k) for k in keep}
    try:
        import transformers
        out["transformers"] = transformers.__version__
    except ImportError:
        pass
    return out


__all__ = ["CHECKS", "DEFAULT_BATCH", "Config", "DoctorReport", "Finding", "Measurement",
           "Probe", "best_combination", "combine", "describe_checks", "doctor"]

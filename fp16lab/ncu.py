"""Nsight Compute's hardware counters for each kernel: a fixed metric set, run, parsed and read.

``ncu`` (Nsight Compute's command line, part of the CUDA toolkit) runs a program, stops at each
kernel it is asked to profile, replays the kernel as many times as its counters need and reads
the GPU's performance counters. Timers say how long a kernel took; counters say why: how busy
the tensor pipes were, how much of the memory bandwidth it used, and what its warps waited for.

:data:`METRICS` is the set fp16lab reads, each counter under a short name with what it means.
Percentages are of the peak the hardware could sustain; ``sm`` and ``dram`` over the kernel's
whole duration ("elapsed"), the others over the cycles the SMs had work ("active"):

- ``tensor``: how busy the tensor pipes were (HMMA/HGMMA: the matrix units);
- ``sm``: the busiest of the SM's units (issue, pipes, shared memory...), as % of its peak;
- ``dram``: DRAM (HBM) throughput;
- ``occupancy``: warps resident on the SMs against the most they can hold;
- ``issue``: cycles in which a warp scheduler issued an instruction (Nsight Compute's
  "issue slots busy"; what a "warp scheduling efficiency" means);
- ``dram_read``, ``dram_write``: bytes moved to and from DRAM (a roofline's denominator);
- ``issued``: instructions issued, to turn the stall ratios into stalled warp-cycles;
- ``stall_<reason>``: warps stalled for that reason per instruction issued (:data:`STALLS`).

:func:`profile` runs a command under ``ncu`` and returns one :class:`KernelCounters` per kernel
(or one per range with ``replay="range"``: the counters of everything in a profiler range,
which is how a whole training step is read); :func:`profile_callable` does so for a Python
function. :func:`unavailable` says why counters cannot be read here. :func:`roofline`,
:func:`bottleneck` and :func:`moved` read the results.

``ncu`` runs with ``--clock-control none``: the GPU keeps its own clocks, as in training
(by default ``ncu`` locks them to base clock), and ``--print-units base`` so every value comes
in one unit (bytes, nanoseconds). It flushes the caches before each replay pass, so the DRAM
bytes are those of a cold-cache run.
"""

from __future__ import annotations

import csv
import io
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from . import validate

__all__ = ["BOUND", "METRICS", "STALLS", "STEP_METRICS", "KernelCounters", "NcuUnavailable",
           "bottleneck", "command", "find_ncu", "implied_peak", "moved", "parse_csv", "profile",
           "profile_callable", "roofline", "unavailable", "weighted"]

#: Short name -> (Nsight Compute metric, what it measures).
METRICS: dict[str, tuple[str, str]] = {
    "duration_ns": ("gpu__time_duration.sum", "the kernel's duration, ns"),
    "tensor": ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
               "tensor pipes busy, % of the active cycles"),
    "sm": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",
           "SM throughput: the busiest SM unit, % of its peak"),
    "dram": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
             "DRAM throughput, % of its peak"),
    "occupancy": ("sm__warps_active.avg.pct_of_peak_sustained_active",
                  "achieved occupancy: resident warps, % of the most an SM holds"),
    "issue": ("smsp__issue_active.avg.pct_of_peak_sustained_active",
              "issue slots busy: cycles a scheduler issued an instruction, %"),
    "dram_read": ("dram__bytes_read.sum", "bytes read from DRAM"),
    "dram_write": ("dram__bytes_write.sum", "bytes written to DRAM"),
    "issued": ("smsp__inst_issued.sum", "warp instructions issued"),
}

#: Why a warp could not issue, as Nsight Compute names the reasons (its "Warp State" section).
STALLS: dict[str, str] = {
    "long_scoreboard": "waiting for global or local memory (an L1TEX load)",
    "short_scoreboard": "waiting for shared memory or a special-function result (MIO)",
    "mio_throttle": "the shared-memory instruction queue is full",
    "lg_throttle": "the global-memory instruction queue is full",
    "barrier": "waiting at a barrier (__syncthreads) for the other warps of the block",
    "wait": "a fixed-latency dependency (the result of the previous instruction)",
    "math_pipe_throttle": "the math pipe it needs (here: the tensor pipe) is busy",
    "gmma": "waiting for a warpgroup MMA (wgmma) to finish",
    "not_selected": "eligible, but the scheduler issued another warp",
    "selected": "issuing (the one cycle every instruction takes)",
    "dispatch_stall": "the dispatcher held the instruction back",
    "no_instruction": "no instruction fetched yet (instruction cache)",
    "membar": "waiting at a memory fence",
    "drain": "draining memory stores at the end",
    "sleeping": "sleeping (nanosleep) or a yield",
    "branch_resolving": "waiting for a branch target",
    "imc_miss": "waiting for the constant cache",
    "misc": "other",
    "tex_throttle": "the texture queue is full",
}
for _reason in STALLS:
    METRICS[f"stall_{_reason}"] = (f"smsp__average_warps_issue_stalled_{_reason}_per_issue_active"
                                   ".ratio", f"warps stalled: {STALLS[_reason]}, per issue")

#: The smaller set read for every kernel of a training step (fewer replay passes).
STEP_METRICS = ("duration_ns", "tensor", "sm", "dram", "occupancy", "issue", "dram_read",
                "dram_write")

_NCU_PATHS = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu")


class NcuUnavailable(RuntimeError):
    """Counters cannot be read here; the message says why and what would help."""


@dataclass
class KernelCounters:
    """One profiled kernel (or range): its name, launch shape and counters by short name."""

    id: int
    name: str
    block: str = ""
    grid: str = ""
    values: dict[str, float] = field(default_factory=dict)

    def __getitem__(self, key: str) -> float:
        return self.values.get(key, math.nan)

    @property
    def seconds(self) -> float:
        return self["duration_ns"] * 1e-9

    @property
    def dram_bytes(self) -> float:
        return self["dram_read"] + self["dram_write"]

    def stalled_cycles(self, reason: str) -> float:
        """Returns the warp-cycles stalled for ``reason``: its per-issue ratio times the
        instructions issued (what a kernel loses to it, comparable across kernels)."""
        return self[f"stall_{validate.choice('reason', reason, STALLS)}"] * self["issued"]

    def top_stalls(self, n: int = 3) -> list[tuple[str, float]]:
        """Returns the ``n`` largest stall reasons (not ``selected``, which is issuing) with their
        warps stalled per issued instruction, largest first."""
        got = [(r, self[f"stall_{r}"]) for r in STALLS
               if r != "selected" and not math.isnan(self[f"stall_{r}"])]
        return sorted(got, key=lambda x: -x[1])[:validate.count("n", n)]


def find_ncu() -> str | None:
    """Returns the path of ``ncu``: on PATH, else where the CUDA toolkit puts it; None if absent."""
    found = shutil.which("ncu")
    if found:
        return found
    return next((p for p in _NCU_PATHS if os.access(p, os.X_OK)), None)


def unavailable() -> str | None:
    """Returns why counters cannot be read here (no ``ncu``, no NVIDIA GPU), or None."""
    if find_ncu() is None:
        return ("Nsight Compute's ncu is not on PATH nor in /usr/local/cuda/bin: it comes with the "
                "CUDA toolkit (or NVIDIA's nsight-compute package); counters need it and a GPU")
    if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidia0"):
        return "no NVIDIA GPU here: ncu reads the counters of a GPU"
    return None


def _number(text: str) -> float:
    text = text.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return math.nan  # "n/a", "" (a metric this kernel does not have)


def parse_csv(text: str, metrics: Iterable[str] | None = None) -> list[KernelCounters]:
    """Returns the kernels in ``ncu --csv --print-units base`` output, in the order profiled.

    ``ncu`` prints one line per (kernel, metric) with the kernel's ID, name, block and grid;
    values carry thousands separators. Lines that are not CSV (``==PROF==`` notes, the
    program's own output) are skipped. ``metrics`` (short names, default :data:`METRICS`) says
    which metrics to keep; a metric absent from the output is absent from ``values``.

    Raises:
        ValueError: the text holds no ncu CSV table.
    """
    wanted = {METRICS[m][0]: m for m in (METRICS if metrics is None else metrics)}
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    if not rows or not {"ID", "Metric Name", "Metric Value"} <= set(rows[0]):
        raise ValueError("no ncu CSV table in this output (expected the header "
                         '"ID",...,"Metric Name","Metric Unit","Metric Value")')
    kernels: dict[int, KernelCounters] = {}
    for r in rows:
        kid = int(r["ID"])
        k = kernels.get(kid)
        if k is None:
            name = r.get("Kernel Name") or r.get("Range Name") or r.get("Name") or f"#{kid}"
            k = kernels[kid] = KernelCounters(kid, name, r.get("Block Size", ""),
                                              r.get("Grid Size", ""))
        short = wanted.get(r["Metric Name"])
        if short is not None:
            k.values[short] = _number(r["Metric Value"])
    return [kernels[i] for i in sorted(kernels)]


def _why_failed(stderr: str, rc: int) -> str:
    if "ERR_NVGPUCTRPERM" in stderr:
        return ("this user may not read the GPU's performance counters (ERR_NVGPUCTRPERM): run as "
                "root, or load the driver with NVreg_RestrictProfilingToAdminUsers=0")
    if "Failed to find metric" in stderr:
        line = next(ln for ln in stderr.splitlines() if "Failed to find metric" in ln)
        return f"this ncu or GPU lacks a metric: {line.strip()}"
    if "No kernels were profiled" in stderr:
        return "no kernel was profiled: the program launched none inside the profiled range"
    tail = " | ".join(ln.strip() for ln in stderr.splitlines()[-4:] if ln.strip())
    return f"ncu exited with status {rc}: {tail or 'no message'}"


def command(argv: Sequence[str], metrics: Iterable[str] = tuple(METRICS), *,
            kernel_regex: str | None = None, from_start: bool = False,
            replay: str = "kernel", launch_count: int | None = None) -> list[str]:
    """Returns the ``ncu`` command line that profiles ``argv`` (what :func:`profile` runs)."""
    ncu = find_ncu()
    if ncu is None:
        raise NcuUnavailable(unavailable() or "ncu is missing")
    names = [METRICS[validate.choice("metric", m, METRICS)][0] for m in metrics]
    validate.choice("replay", replay, ("kernel", "range", "app-range"))
    cmd = [ncu, "--clock-control", "none", "--csv", "--print-units", "base",
           "--replay-mode", replay, "--metrics", ",".join(names)]
    if not from_start and replay == "kernel":  # ranges are what cudaProfilerStart/Stop mark
        cmd += ["--profile-from-start", "off"]
    if kernel_regex:
        cmd += ["--kernel-name", "regex:" + validate.text("kernel_regex", kernel_regex)]
    if launch_count is not None:
        cmd += ["--launch-count", str(validate.count("launch_count", launch_count))]
    return cmd + [validate.text("argv[0]", argv[0]), *argv[1:]]


def profile(argv: Sequence[str], metrics: Iterable[str] = tuple(METRICS), *,
            kernel_regex: str | None = None, from_start: bool = False, replay: str = "kernel",
            launch_count: int | None = None, timeout: float = 600, env: dict[str, str] | None = None) -> list[KernelCounters]:
    """Returns the counters of every kernel ``argv`` launches (a command and its arguments).

    Args:
        metrics: short names from :data:`METRICS`.
        kernel_regex: profile only kernels whose name matches.
        from_start: profile from the start; else only between the program's
            ``cudaProfilerStart()`` and ``cudaProfilerStop()`` (after its warm-up). Range
            replays always read what lies between those two calls.
        replay: ``"kernel"`` (one result per kernel), ``"range"`` (one per profiler range,
            replayed in the process) or ``"app-range"`` (the same, re-running the program).
        launch_count: profile at most this many kernels (or ranges).
        timeout: seconds before ncu is stopped.

    Raises:
        NcuUnavailable: no ncu or GPU here, or ncu could not read counters (why it said so).
    """
    why = unavailable()
    if why:
        raise NcuUnavailable(why)
    metrics = list(metrics)
    cmd = command(argv, metrics, kernel_regex=kernel_regex, from_start=from_start, replay=replay,
                  launch_count=launch_count)
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env,
                             timeout=validate.number("timeout", timeout, low=0, low_open=True))
    except subprocess.TimeoutExpired as e:
        raise NcuUnavailable(f"ncu did not finish within {timeout:g} s") from e
    try:
        kernels = parse_csv(res.stdout, metrics)
    except ValueError:
        raise NcuUnavailable(_why_failed(res.stderr + res.stdout, res.returncode)) from None
    if res.returncode != 0:
        raise NcuUnavailable(_why_failed(res.stderr, res.returncode))
    return kernels


_CALLABLE = """\
import importlib, sys
module, name = sys.argv[1].split(":")
fn = getattr(importlib.import_module(module), name)
import torch
for _ in range(int(sys.argv[2])):
    fn()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
fn()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
"""


def profile_callable(fn: Callable[[], Any], metrics: Iterable[str] = tuple(METRICS), *,
                     warmup: int = 1, **kwargs: Any) -> list[KernelCounters]:
    """Returns the counters of the kernels one call of ``fn()`` launches, after ``warmup``
    calls (compilation, autotuning) that are not profiled.

    ``fn`` runs in a fresh Python process, so it must be importable by name: a function
    defined at the top level of a module (not a lambda, nor one defined in a notebook).
    Other keywords go to :func:`profile`.
    """
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if (not callable(fn) or module in (None, "__main__") or not qualname or "." in qualname
            or "<" in qualname):
        raise ValueError(f"profile_callable runs fn in a fresh process, so it must be a function "
                         f"defined at the top level of an importable module; got {fn!r}")
    warmup = validate.count("warmup", warmup, low=0)
    env = dict(kwargs.pop("env", None) or os.environ)
    root = _import_root(module)
    if root:  # the fresh process finds the module where this one found it
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return profile([sys.executable, "-c", _CALLABLE, f"{module}:{qualname}", str(warmup)],
                   metrics, env=env, **kwargs)


def _import_root(module: str) -> str | None:
    """Returns the folder ``module`` is imported from (the one above its top package)."""
    path = getattr(sys.modules.get(module), "__file__", None)
    if not path:
        return None
    root = os.path.dirname(os.path.abspath(path))
    if os.path.basename(path).startswith("__init__."):
        root = os.path.dirname(root)
    for _ in range(module.count(".")):
        root = os.path.dirname(root)
    return root


def roofline(flops: float, dram_bytes: float, seconds: float) -> tuple[float, float]:
    """Returns (arithmetic intensity in FLOP per DRAM byte, achieved FLOP/s)."""
    flops = validate.number("flops", flops, low=0)
    dram_bytes = validate.number("dram_bytes", dram_bytes, low=0, low_open=True)
    seconds = validate.number("seconds", seconds, low=0, low_open=True)
    return flops / dram_bytes, flops / seconds


def implied_peak(rate: float, percent: float) -> float:
    """Returns the peak a counter's percentage is of: ``rate / (percent / 100)`` (e.g. the DRAM
    bandwidth ncu measures against, from a kernel's bytes per second and its ``dram`` %)."""
    return validate.number("rate", rate, low=0) / (
        validate.number("percent", percent, low=0, low_open=True) / 100)


#: A counter at or above this % of its peak names the bottleneck.
BOUND = 60.0


def bottleneck(k: KernelCounters) -> tuple[str, str]:
    """Returns (what limits the kernel, why), read from its counters.

    ``tensor pipes`` when the tensor pipes are busy at least :data:`BOUND` % of the time (the
    kernel does its maths as fast as the units allow), ``DRAM bandwidth`` when DRAM is at least
    that busy, ``SM throughput`` when another SM unit is; otherwise ``latency``: no unit is busy,
    warps wait, and the largest stall reason says for what.
    """
    if k["tensor"] >= BOUND:
        return "tensor pipes", f"tensor pipes busy {k['tensor']:.0f}% of the time"
    if k["dram"] >= BOUND:
        return "DRAM bandwidth", f"DRAM at {k['dram']:.0f}% of its peak"
    if k["sm"] >= BOUND:
        return "SM throughput", f"an SM unit at {k['sm']:.0f}% of its peak"
    stalls = k.top_stalls(1)
    if not stalls:
        return "latency", "no unit busy (no stall counters read)"
    reason, ratio = stalls[0]
    return "latency", f"no unit busy; warps mostly {STALLS[reason]} ({ratio:.1f} per issue)"


def moved(before: KernelCounters, after: KernelCounters) -> tuple[str, float, float]:
    """Returns (the stall reason that fell most, its stalled warp-cycles before and after)
    from one kernel to the next: what the second removed."""
    drops = [(r, before.stalled_cycles(r), after.stalled_cycles(r)) for r in STALLS
             if r != "selected"]
    drops = [d for d in drops if not (math.isnan(d[1]) or math.isnan(d[2]))]
    if not drops:
        raise ValueError("no stall counters to compare: profile with the stall_* metrics and issued")
    return max(drops, key=lambda d: d[1] - d[2])


def weighted(kernels: Sequence[KernelCounters], key: str) -> float:
    """Returns the duration-weighted mean of a percentage over kernels (what the whole set of
    kernels achieves, the idle time between them not counted)."""
    pairs = [(k["duration_ns"], k[key]) for k in kernels
             if not math.isnan(k[key]) and not math.isnan(k["duration_ns"])]
    total = sum(d for d, _ in pairs)
    if total <= 0:
        raise ValueError(f"no kernel with a duration and {key!r} to weigh")
    return sum(d * v for d, v in pairs) / total

"""Recording steps with torch.profiler: phase marks, one-cycle recordings, and profile_steps."""

from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd

from .summary import GpuTimeSummary, gpu_time_summary
from .trace import read_trace

#: Phases of a training step that :func:`phase` marks, in order.
PHASES = ("zero_grad", "forward", "backward", "unscale", "optimizer_step", "scaler_update")

#: The annotation around each profiled step (a range on the CPU lane).
STEP_MARK = "fp16lab.step"

#: An empty range opened before the profiled steps, so the profiler's start-up is not in them.
PROFILER_START_MARK = "fp16lab.profiler_start"


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Marks a region for torch.profiler (record_function) and, on a GPU, for Nsight (NVTX)."""
    import torch

    nvtx = torch.cuda.is_available()
    if nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        with torch.autograd.profiler.record_function(name):
            yield
    finally:
        if nvtx:
            torch.cuda.nvtx.range_pop()


@dataclass
class StepProfile:
    """What :func:`profile_steps` returns: the trace file, its events, and where the time went."""

    trace_path: Path
    events: pd.DataFrame
    steps: int
    wall_ms: float
    summary: GpuTimeSummary
    window: tuple[float, float]

    @property
    def graph_launches(self) -> int:
        """Returns how many CUDA graph replays the host launched in the profiled steps."""
        launches = self.events[self.events["kind"] == "launch"]
        return int(launches["name"].str.contains("GraphLaunch").sum())

    @property
    def lane(self) -> str:
        """Returns the lane the summary describes: 'gpu', or 'cpu' on a machine without one."""
        return self.summary.lane

    def table(self) -> pd.DataFrame:
        """Returns where the time went per kind, in milliseconds per step and as shares."""
        t = self.summary.by_kind.copy()
        t["ms_per_step"] = t["total_us"] / 1e3 / self.steps
        return t[["n", "ms_per_step", "share"]]


#: torch 2.10-2.11 warn this on one-cycle recordings too, acc_events=True or not (fixed in
#: pytorch/pytorch#180387); fp16lab's recordings have a single cycle, so it never applies.
ONE_CYCLE_WARNING = r"Warning: Profiler clears events at the end of each cycle"


@contextlib.contextmanager
def torch_profiler(activities: list[Any]) -> Iterator[Any]:
    """Records the block with ``torch.profiler.profile(activities=...)`` and yields the profiler.

    One recording, one cycle: ``acc_events=True`` where torch has it, and torch's warning that
    a cycle's events are cleared (:data:`ONE_CYCLE_WARNING`, false for one cycle) is not shown;
    every other warning is.
    """
    import inspect
    import warnings

    from torch.profiler import profile

    extra = {"acc_events": True} if "acc_events" in inspect.signature(profile).parameters else {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=ONE_CYCLE_WARNING, category=UserWarning)
        with profile(activities=activities, **extra) as prof:
            yield prof


def gpu_kernels(step: Callable[[], Any], steps: int,
                sync: Callable[[], Any]) -> list[tuple[str, float, float]]:
    """Returns every GPU kernel of ``steps`` calls of ``step``, recorded by :func:`torch_profiler`,
    as ``(name, start_us, end_us)``; ``sync`` waits for the device, before and after the calls."""
    from torch.profiler import ProfilerActivity

    sync()
    with torch_profiler([ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        sync()
    return [(e.name, float(e.time_range.start), float(e.time_range.end)) for e in prof.events()
            if "CUDA" in str(getattr(e, "device_type", ""))]


def profile_steps(step: Callable[[], Any], *, steps: int = 3, warmup: int = 2,
                  trace_path: str | Path | None = None, cuda: bool | None = None) -> StepProfile:
    """Returns the profile of ``steps`` calls of ``step`` after ``warmup`` unprofiled ones.

    Each profiled call sits inside a ``fp16lab.step`` range; the summary's window runs from the
    start of the first such range to the end of the last device event (on a CPU, of the last
    range), so the GPU's idle time while the host launches work counts.

    The profiler's own start-up stays outside that window: the first range of a session waits
    about a millisecond before the code inside it runs (seen on a CPU and, 1.7 ms, on an
    H200, where it left the GPU idle for 4% of a three-step ResNet-50 window). An empty
    ``fp16lab.profiler_start`` range and a device sync, before the window, absorb it.

    Args:
        step: runs one training step (any callable; what it returns is ignored).
        trace_path: where to write the Chrome trace; by default a new temporary file.
        cuda: profile the GPU too; by default when torch sees a CUDA device.
    """
    import torch
    from torch.profiler import ProfilerActivity

    if not callable(step):
        raise TypeError(f"step must be callable, got {type(step).__name__}")
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("cuda=True, but torch sees no CUDA device")
    if trace_path is None:
        trace_path = Path(tempfile.mkdtemp(prefix="fp16lab-trace-")) / "step_trace.json"
    trace_path = Path(trace_path)
    trace_path.parent.mkdir(parents=True, exist_ok=True)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profiler(activities) as prof:
        with torch.autograd.profiler.record_function(PROFILER_START_MARK):
            sync()  # the first range and CUDA call of a session pay the profiler's start-up
        t0 = time.perf_counter()
        for _ in range(steps):
            with torch.autograd.profiler.record_function(STEP_MARK):
                step()
        sync()
        wall_ms = (time.perf_counter() - t0) * 1e3
    prof.export_chrome_trace(str(trace_path))
    events = read_trace(trace_path)
    marks = events[(events["kind"] == "annotation") & (events["name"] == STEP_MARK)]
    lane = "gpu" if cuda and (events["lane"] == "gpu").any() else "cpu"
    lo = float(marks["start_us"].min())
    end_lane = events[events["lane"] == "gpu"] if lane == "gpu" else marks
    window = (lo, float(max(end_lane["end_us"].max(), marks["end_us"].max())))
    summary = gpu_time_summary(events, window, lane=lane)
    return StepProfile(trace_path, events, steps, wall_ms, summary, window)

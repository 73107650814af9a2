"""Where a training step's time goes: a torch.profiler trace, its event table, and a timeline plot.

:func:`profile_steps` runs a few steps of any step callable under ``torch.profiler`` and writes
the Chrome/Perfetto trace (open it in https://ui.perfetto.dev or chrome://tracing).
:func:`read_trace` turns such a trace (a file, or the JSON dict) into one table of events in two
lanes: ``cpu`` (the host: operators and, on a GPU, the kernel launches) and ``gpu`` (kernels,
copies and fills as the device ran them). Every event gets a *kind*:

- ``gemm-conv``: matrix multiplies and convolutions (on tensor cores in fp16, bf16 and tf32),
- ``elementwise``: pointwise maths (activations, adds, casts, the optimizer's foreach updates),
- ``reduction``: sums, means, norms, softmax, losses,
- ``copy``: memory copies and fills,
- ``nccl``: collective communication between GPUs,
- ``other``: everything else.

:func:`gpu_time_summary` says where the device time went and what fraction of the window the
device sat idle: 1 - (time covered by at least one kernel) / (window length), the window running
from the first device event to the last unless given. A launch-bound step shows up as a large
idle fraction: the GPU finishes each small kernel before the host has launched the next.

:func:`phase` marks a region (forward, backward, unscale, optimizer step) for both torch.profiler
(``record_function``) and Nsight Systems (an NVTX range), so ``nsys profile`` of the same program
shows the same names.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd

#: Kinds of work an event is sorted into, with the colour the timeline draws them in.
KINDS = {
    "gemm-conv": "#d62728",
    "elementwise": "#1f77b4",
    "reduction": "#2ca02c",
    "copy": "#9467bd",
    "nccl": "#ff7f0e",
    "other": "#7f7f7f",
}

#: Name patterns of each kind, tried in this order (first match wins); case-insensitive.
#: Kernel names come from cuBLAS (nvjet, sm90_xmma, cutlass), cuDNN (implicit_convolve, fprop,
#: dgrad, wgrad), PyTorch's own kernels (elementwise_kernel, reduce_kernel) and Triton/inductor
#: (triton_poi = pointwise, triton_red / triton_per = reductions).
_PATTERNS = (
    ("nccl", r"nccl"),
    ("copy", r"memcpy|memset|^aten::(copy_|to|_to_copy|clone|contiguous|fill_|zero_|zeros|empty)$"
             r"|copy_kernel|fill_kernel|cat_?array"),
    ("reduction", r"bn_fw|bn_bw|batch_?norm|layer_?norm|group_?norm|softmax"),
    ("gemm-conv", r"gemm|nvjet|xmma|cutlass|wgmma|hmma|cudnn|conv|fprop|dgrad|wgrad|implicit_"
                  r"|^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_dot_product\w*)$|triton_tem"
                  r"|sm\d+_\w*(s|h)\d{4}|(addmm|bmm|mm|linear)backward"),
    ("reduction", r"reduce|norm|welford|softmax|nll_loss|cross_entropy|sum|mean|\bmax\b|argmax"
                  r"|triton_red|triton_per|_amp_foreach_non_finite|amp_update_scale"),
    ("elementwise", r"elementwise|vectori[sz]ed|unrolled|foreach|pointwise|triton_poi|relu|gelu"
                    r"|silu|sigmoid|tanh|^aten::(add|sub|mul|div|addcmul|addcdiv|lerp|threshold"
                    r"\w*|where|neg|exp|sqrt|rsqrt|_fused_sgd\w*|_fused_adam\w*)_?$|fused_sgd"
                    r"|fused_adam|dropout"),
)
_COMPILED = tuple((kind, re.compile(p, re.IGNORECASE)) for kind, p in _PATTERNS)

#: Colours of the host's CUDA calls on the CPU lane: kernel launches and waits for the GPU.
_HOST_COLOURS = {"launch": "black", "sync": "#e377c2"}

#: Trace categories of device work, and of host calls that launch it.
_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}

#: Phases of a training step that :func:`phase` marks, in order.
PHASES = ("zero_grad", "forward", "backward", "unscale", "optimizer_step", "scaler_update")

#: The annotation around each profiled step (a range on the CPU lane).
STEP_MARK = "fp16lab.step"

#: An empty range opened before the profiled steps, so the profiler's start-up is not in them.
PROFILER_START_MARK = "fp16lab.profiler_start"


def classify(name: str, category: str = "") -> str:
    """Returns the kind (a key of ``KINDS``) of a kernel or operator, from its name and category."""
    if category in ("gpu_memcpy", "gpu_memset"):
        return "copy"
    for kind, pattern in _COMPILED:
        if pattern.search(name):
            return kind
    return "other"


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


def read_trace(trace: str | Path | dict[str, Any]) -> pd.DataFrame:
    """Returns the trace's complete events as a table, one row per event, sorted by start.

    Columns: ``lane`` ('cpu' or 'gpu'), ``category`` (the trace's own: cpu_op, kernel,
    cuda_runtime, ...), ``name``, ``kind`` (see ``KINDS``; annotations get 'annotation'),
    ``start_us``, ``dur_us``, ``end_us`` (microseconds since the trace's first event),
    ``stream`` (the CUDA stream for GPU events), ``top_level`` (True for a CPU operator not
    nested inside another operator of the same thread).

    Args:
        trace: the path of a Chrome trace JSON (what torch.profiler's ``export_chrome_trace``
            writes), or the parsed JSON itself.
    """
    if isinstance(trace, (str, Path)):
        path = Path(trace)
        if not path.exists():
            raise FileNotFoundError(f"no trace file at {path}")
        trace = json.loads(path.read_text())
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError("a Chrome trace is a JSON object with a 'traceEvents' list "
                         f"(or that list itself); got {type(trace).__name__}")
    rows = []
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat = str(e.get("cat", ""))
        name = str(e.get("name", ""))
        if cat in _GPU_CATS:
            lane, kind = "gpu", classify(name, cat)
        elif cat == "gpu_user_annotation":
            continue  # the profiler's copy of a CPU range onto the GPU lane, not device work
        elif cat == "user_annotation":
            lane, kind = "cpu", "annotation"
        elif cat in _LAUNCH_CATS:  # a host wait shows apart from the launches
            lane, kind = "cpu", "sync" if "Synchronize" in name else "launch"
        elif cat == "cpu_op":
            lane, kind = "cpu", classify(name, cat)
        else:
            continue
        args = e.get("args") or {}
        rows.append({"lane": lane, "category": cat, "name": name, "kind": kind,
                     "start_us": float(e["ts"]), "dur_us": float(e["dur"]),
                     "stream": args.get("stream", e.get("tid")) if lane == "gpu" else None,
                     "tid": e.get("tid")})
    columns = ["lane", "category", "name", "kind", "start_us", "dur_us", "end_us", "stream",
               "top_level"]
    if not rows:
        return pd.DataFrame(columns=columns)
    df = pd.DataFrame(rows).sort_values(["start_us", "dur_us"], ascending=[True, False])
    df["start_us"] -= df["start_us"].min()
    df["end_us"] = df["start_us"] + df["dur_us"]
    df["top_level"] = _top_level(df)
    return df[columns].reset_index(drop=True)


def _top_level(df: pd.DataFrame) -> pd.Series:
    """Returns True for CPU operators that no other operator of the same thread encloses."""
    top = pd.Series(False, index=df.index)
    ops = df[(df["lane"] == "cpu") & (df["category"] == "cpu_op")]
    for _, group in ops.groupby("tid"):
        # sorted by start, longest first: an op that starts at or after the furthest end so far
        # is nested in nothing
        reach = float("-inf")
        for idx, start, end in zip(group.index, group["start_us"], group["end_us"]):
            if start >= reach:
                top[idx] = True
            reach = max(reach, end)
    return top


def busy_us(starts: Any, ends: Any, window: tuple[float, float] | None = None) -> float:
    """Returns the time (µs) covered by at least one of the intervals, clipped to the window."""
    spans = sorted(zip(map(float, starts), map(float, ends)))
    if window is not None:
        lo, hi = window
        spans = [(max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi]
    total, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


@dataclass(frozen=True)
class GpuTimeSummary:
    """Where the device's time went in a window of a trace."""

    window_us: float
    busy_us: float
    idle_fraction: float
    kernel_us: float
    by_kind: pd.DataFrame = field(repr=False)
    lane: str = "gpu"

    def as_dict(self) -> dict[str, Any]:
        """Returns the figures as a flat dict (per-kind totals as ``<kind>_us``)."""
        out = {"window_us": self.window_us, "busy_us": self.busy_us,
               "idle_fraction": self.idle_fraction, "kernel_us": self.kernel_us, "lane": self.lane}
        for kind, row in self.by_kind.iterrows():
            out[f"{kind}_us"] = float(row["total_us"])
        return out


def gpu_time_summary(events: pd.DataFrame, window: tuple[float, float] | None = None,
                     *, lane: str = "gpu") -> GpuTimeSummary:
    """Returns where the time of one lane went: per kind, busy time and idle fraction.

    Args:
        events: a table from :func:`read_trace`.
        window: (start_us, end_us) to measure in; by default from the lane's first event to
            its last. Events are clipped to it.
        lane: 'gpu' (kernels, copies); 'cpu' summarises the top-level CPU operators instead,
            which is what a trace without a GPU has.
    """
    if lane not in ("gpu", "cpu"):
        raise ValueError(f"lane must be 'gpu' or 'cpu', got {lane!r}")
    ev = events[events["lane"] == lane]
    if lane == "cpu":
        ev = ev[ev["top_level"].astype(bool)]
    if ev.empty:
        raise ValueError(f"the trace has no {lane} events to summarise"
                         + (" (was it profiled on a machine without a GPU? use lane='cpu')"
                            if lane == "gpu" else ""))
    if window is None:
        window = (float(ev["start_us"].min()), float(ev["end_us"].max()))
    lo, hi = map(float, window)
    if not hi > lo:
        raise ValueError(f"window must have end > start, got {window}")
    clipped_start = ev["start_us"].clip(lower=lo, upper=hi)
    clipped_end = ev["end_us"].clip(lower=lo, upper=hi)
    dur = clipped_end - clipped_start
    busy = busy_us(clipped_start, clipped_end)
    table = (pd.DataFrame({"kind": ev["kind"], "dur": dur})
             .groupby("kind")["dur"].agg(["count", "sum"])
             .rename(columns={"count": "n", "sum": "total_us"}))
    table = table.reindex([k for k in KINDS if k in table.index])
    kernel_total = float(dur.sum())
    table["share"] = table["total_us"] / kernel_total if kernel_total > 0 else 0.0
    return GpuTimeSummary(window_us=hi - lo, busy_us=busy, idle_fraction=1.0 - busy / (hi - lo),
                          kernel_us=kernel_total, by_kind=table, lane=lane)


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


def plot_timeline(events: pd.DataFrame, *, window: tuple[float, float] | None = None,
                  ax: Any = None, title: str = "") -> Any:
    """Returns a matplotlib Axes with the CPU lane above the GPU lane, events coloured by kind.

    The CPU lane shows top-level operators (coloured by kind), kernel launches (black) and waits
    for the GPU (pink); the GPU lane shows kernels and copies. White space in the GPU lane is
    time the device sat idle. Each kind is drawn with one ``broken_barh`` call, so thousands of
    kernels draw in well under a second.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(11, 2.6))
    ev = events
    if window is not None:
        lo, hi = window
        ev = ev[(ev["end_us"] > lo) & (ev["start_us"] < hi)]
    host_calls = ev["kind"].isin(["launch", "sync"])
    lanes = [("CPU", (ev["lane"] == "cpu") & (ev["top_level"].astype(bool) | host_calls), 1.0),
             ("GPU", ev["lane"] == "gpu", 0.0)]
    origin = float(window[0]) if window is not None else 0.0
    used = set()
    for _, mask, y in lanes:
        sub = ev[mask]
        for kind, group in sub.groupby("kind"):
            colour = KINDS.get(kind, _HOST_COLOURS.get(kind, "black"))
            spans = list(zip((group["start_us"] - origin) / 1e3, group["dur_us"] / 1e3))
            ax.broken_barh(spans, (y + 0.1, 0.8), facecolors=colour, linewidth=0)
            used.add(kind)
    ax.set_yticks([0.5, 1.5])
    ax.set_yticklabels(["GPU", "CPU"])
    ax.set_ylim(0, 2)
    ax.set_xlabel("time (ms)")
    if window is not None:
        ax.set_xlim(0, (window[1] - window[0]) / 1e3)
    handles = [Patch(color=c, label=k) for k, c in {**KINDS, **_HOST_COLOURS}.items() if k in used]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    if title:
        ax.set_title(title)
    return ax


def events_from_table(columns: list[str], rows: list[list[Any]]) -> pd.DataFrame:
    """Returns an event table like :func:`read_trace`'s from stored rows (a measured file's).

    The rows need at least the columns lane, kind, start_us and dur_us; stored CPU rows are taken
    to be top-level operators or launches (what the benchmark keeps).
    """
    df = pd.DataFrame(rows, columns=list(columns))
    missing = {"lane", "kind", "start_us", "dur_us"} - set(df.columns)
    if missing:
        raise ValueError(f"stored events lack the columns {sorted(missing)}; they have {list(columns)}")
    bad = set(df["lane"]) - {"cpu", "gpu"}
    if bad:
        raise ValueError(f"lane must be 'cpu' or 'gpu', got {sorted(bad)}")
    df["start_us"] = df["start_us"].astype(float)
    df["dur_us"] = df["dur_us"].astype(float)
    df["end_us"] = df["start_us"] + df["dur_us"]
    df["top_level"] = (df["lane"] == "cpu") & ~df["kind"].isin(["launch", "sync"])
    if "name" not in df:
        df["name"] = ""
    return df.sort_values("start_us").reset_index(drop=True)

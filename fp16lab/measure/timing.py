"""Timing that can be trusted: CUDA events or perf_counter, warm-up, median and spread.

GPU work is asynchronous, so GPU timings use CUDA events around the region after a warm-up (a
training loop's steps: one event between consecutive steps, :func:`step_times_ms`);
CPU timings use ``time.perf_counter``. Every timing is many repeats summarised by the median
and the spread (10th to 90th percentile), never a single run.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

from .. import validate
from ..profile import torch_profiler


@dataclass(frozen=True)
class Timing:
    """Summary of repeated timings, in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    n: int

    @property
    def spread(self) -> float:
        """Returns (p90 - p10) / median: the relative spread of the repeats."""
        return (self.p90_ms - self.p10_ms) / self.median_ms if self.median_ms > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        """Returns the fields and the spread as a dict."""
        return {**asdict(self), "spread": self.spread}


def summarize(samples_ms: Iterable[float]) -> Timing:
    """Returns the median and 10th/90th percentiles of a list of timings (ms)."""
    xs = sorted(float(x) for x in samples_ms)
    if not xs:
        raise ValueError("summarize() needs at least one timing sample, got none")

    def pct(q: float) -> float:
        # linear interpolation between closest ranks, like numpy.percentile's default
        pos = q * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return Timing(statistics.median(xs), pct(0.10), pct(0.90), len(xs))


def _check_counts(warmup: int, repeat: int) -> None:
    if warmup < 0 or repeat < 1:
        raise ValueError(f"need warmup >= 0 and repeat >= 1, got warmup={warmup}, repeat={repeat}")


def time_cpu(fn: Callable[[], Any], *, warmup: int = 2, repeat: int = 10) -> Timing:
    """Returns the timing of ``fn()`` on the host clock (for CPU work)."""
    _check_counts(warmup, repeat)
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return summarize(samples)


def time_cuda(fn: Callable[[], Any], *, warmup: int = 3, repeat: int = 20,
              backend: str = "torch") -> Timing:
    """Returns the timing of ``fn()`` measured with CUDA events on the current stream.

    Args:
        fn: launches the GPU work to time (it need not synchronize).
        backend: ``"torch"`` or ``"cupy"``: whose events and stream to use.
    """
    _check_counts(warmup, repeat)
    return summarize(_cuda_samples(fn, warmup, repeat, backend))


def round_orders(names: Iterable[Any], rounds: int) -> list[list[Any]]:
    """Returns the order to run ``names`` in, for each of ``rounds`` rounds of interleaved timing.

    The orders are a Williams design: over a cycle of n rounds (2n when n is odd; more rounds
    repeat it) each of n names comes at every place in a round equally often, and within the
    rounds right after every other name equally often. A GPU that meets its power limit runs
    slower after heavy work, so a fixed order (each name always after the same one, as when a
    list is rotated) can give one kernel a handicap that another never meets; balanced orders
    share it out. Two names alternate: a b, b a, a b, ...
    """
    rounds = validate.count("rounds", rounds)
    names = list(names)
    n = len(names)
    if n == 0:
        raise ValueError("round_orders needs at least one name, got none")
    # 0, 1, n-1, 2, n-2, ...: shifted by r, row r; with each row's reverse too when n is odd
    base = [0] + [(k + 1) // 2 if k % 2 else n - k // 2 for k in range(1, n)]
    rows = [[(b + r) % n for b in base] for r in range(n)]
    if n % 2:
        rows = [row for r in rows for row in (r, r[::-1])]
    return [[names[i] for i in rows[k % len(rows)]] for k in range(rounds)]


def time_cuda_interleaved(fns: dict[str, Callable[[], Any]], *, rounds: int = 4, warmup: int = 3,
                          repeat: int = 10, backend: str = "torch") -> dict[str, Timing]:
    """Returns {name: timing} of several GPU functions timed in alternating blocks.

    Round r times ``repeat`` calls of every function in turn (after ``warmup`` calls each), in
    the round's order from :func:`round_orders`; each function's timing pools its samples of
    all rounds. A GPU's clock drifts within seconds as it heats and meets its power limit, so
    functions timed one after the other would each see a different clock; interleaved, their
    ratio does not depend on which ran first, nor on which ran just before.
    """
    _check_counts(warmup, repeat)
    if not fns:
        raise ValueError("time_cuda_interleaved needs at least one function, got none")
    orders = round_orders(fns, rounds)  # checks rounds, before anything runs
    samples: dict[str, list[float]] = {n: [] for n in fns}
    for order in orders:
        for name in order:
            samples[name] += _cuda_samples(fns[name], warmup, repeat, backend)
    return {n: summarize(samples[n]) for n in fns}


def _cuda_samples(fn: Callable[[], Any], warmup: int, repeat: int, backend: str) -> list[float]:
    """Returns the CUDA-event times (ms) of ``repeat`` calls of ``fn`` after ``warmup`` calls."""
    if backend == "torch":
        import torch

        def event():
            return torch.cuda.Event(enable_timing=True)

        def sync():
            torch.cuda.synchronize()
    elif backend == "cupy":
        import cupy

        def event():
            return cupy.cuda.Event()

        def sync():
            cupy.cuda.get_current_stream().synchronize()
    else:
        raise ValueError(f"backend must be 'torch' or 'cupy', got {backend!r}")

    for _ in range(warmup):
        fn()
    sync()
    pairs = []
    for _ in range(repeat):
        start, stop = event(), event()
        start.record()
        fn()
        stop.record()
        pairs.append((start, stop))
    sync()
    if backend == "torch":
        return [a.elapsed_time(b) for a, b in pairs]
    import cupy
    return [cupy.cuda.get_elapsed_time(a, b) for a, b in pairs]


def step_times_ms(step: Callable[[], Any], steps: int, device: Any = "cuda") -> list[float]:
    """Returns the time in ms of each of ``steps`` back-to-back calls of ``step`` (a training step).

    On a CUDA ``device`` (a ``torch.device`` or its name) one CUDA event is recorded before the
    first call and one after each, so every step is timed on the GPU from the end of the one
    before, with nothing between them; the device is synchronized before and after. Elsewhere
    each call is timed on the host clock.
    """
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        out = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    torch.cuda.synchronize(dev)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    events[0].record()
    for i in range(steps):
        step()
        events[i + 1].record()
    torch.cuda.synchronize(dev)
    return [a.elapsed_time(b) for a, b in zip(events, events[1:])]


def nvidia_smi_id(cuda_device: int) -> str:
    """Returns what ``nvidia-smi --id`` calls CUDA device ``cuda_device`` of this process.

    CUDA numbers only the devices that CUDA_VISIBLE_DEVICES lets through, in its order; nvidia-smi
    numbers all of them. The variable's entries (indices or UUIDs) are ids nvidia-smi accepts.
    """
    visible = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    return visible[cuda_device] if cuda_device < len(visible) else str(cuda_device)


def time_cuda_sustained(fn: Callable[[], Any], *, seconds: float = 1.0,
                        sample_ms: int = 50) -> dict[str, Any]:
    """Returns the mean time per call of ``fn()`` over about ``seconds`` of back-to-back calls
    on CuPy's current stream, with the median SM clock and board power that nvidia-smi reported
    meanwhile (None where it could not be read).

    A burst of a few calls runs at whatever clock the card had; a second of calls runs at the
    clock its power limit allows, which is what a training loop sees. The clock samples are
    instantaneous; on Ampere and newer, nvidia-smi's power.draw is the board's average over the
    last second, so the power figure lags and mixes in what ran just before: read it from runs of
    a second or more, as a rough figure.
    """
    if seconds <= 0 or sample_ms < 1:
        raise ValueError(f"need seconds > 0 and sample_ms >= 1, got {seconds}, {sample_ms}")
    import shutil
    import subprocess

    import cupy

    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    fn()
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    calls = max(3, int(seconds * 1e3 / max(cupy.cuda.get_elapsed_time(start, stop), 1e-3)))
    smi = None
    if shutil.which("nvidia-smi"):
        smi = subprocess.Popen(["nvidia-smi", f"--id={nvidia_smi_id(cupy.cuda.Device().id)}",
                                "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                f"-lms={sample_ms}"], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
        time.sleep(0.2)  # let it start sampling
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    stop.synchronize()
    ms = cupy.cuda.get_elapsed_time(start, stop)
    clock = power = None
    if smi is not None:
        smi.terminate()
        vals = []
        for line in smi.communicate()[0].splitlines():
            try:
                vals.append(tuple(float(v) for v in line.split(",")))
            except ValueError:  # "[N/A]" and the like
                continue
        busy = [v for v in vals[len(vals) // 4:-1] if len(v) == 2] or vals  # skip the ramp-up
        if busy:
            clock = statistics.median(v[0] for v in busy)
            power = statistics.median(v[1] for v in busy)
    return {"ms_per_call": ms / calls, "calls": calls, "seconds": ms / 1e3,
            "sm_clock_mhz": clock, "power_w": power}


def cuda_kernels(fn: Callable[[], Any], *, warmup: int = 0) -> list[tuple[str, float]]:
    """Returns (name, microseconds) of every CUDA kernel that one call of ``fn`` runs, in order.

    Read with torch.profiler: the kernels are its events whose device type is CUDA. ``warmup``
    calls come first, unprofiled (library heuristics and caches settle on the first call).
    Without a CUDA device the list is empty.
    """
    import torch
    from torch.profiler import ProfilerActivity

    if not torch.cuda.is_available():  # a CPU build of torch cannot profile CUDA at all
        return []
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with torch_profiler([ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [(e.name, float(e.time_range.elapsed_us())) for e in prof.events()
            if "CUDA" in str(getattr(e, "device_type", ""))]


def copy_bandwidth_gbs(nbytes: int = 2**30, *, repeat: int = 20) -> float:
    """Returns the device-to-device copy rate in GB/s (bytes read plus bytes written).

    This is the practical memory-bandwidth ceiling that memory-bound kernels are held against.
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("copy_bandwidth_gbs needs a CUDA GPU; torch sees none")
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    t = time_cuda(lambda: dst.copy_(src), warmup=3, repeat=repeat)
    return 2 * src.numel() * 4 / (t.median_ms * 1e-3) / 1e9


def cuda_missing(benchmark: str) -> str | None:
    """Returns why ``benchmark`` cannot run here (torch sees no CUDA GPU), or None when it can."""
    import torch

    if torch.cuda.is_available():
        return None
    return f"{benchmark} needs a CUDA GPU (torch.cuda.is_available() is False)"

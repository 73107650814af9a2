"""GPU telemetry sampled by a background thread through NVML (nvidia-ml-py) while work runs.

What the counters mean, and what they do not:

- ``gpu_busy_pct`` (NVML "utilization.gpu"): the fraction of the sample period during which *at
  least one kernel* was running. A single tiny kernel on one SM counts as 100% busy, so this says
  whether the GPU was idle (waiting on the CPU, the data loader, a sync), not how much of its
  compute was used.
- ``mem_busy_pct`` (NVML "utilization.memory"): the fraction of the period during which device
  memory was being read or written. Like the above it is time-based, not a share of bandwidth.
- ``sm_clock_mhz``: the SM clock. It drops when the card is power- or heat-limited.
- ``power_w``: board power draw in watts, averaged by the driver over a short window.

On Hopper and newer GPUs NVML also has GPM (GPU Performance Monitoring) metrics, computed from
two snapshots of hardware counters, which say how much of the compute was used, not just whether
something ran (each a percentage over the time between two readings):

- ``sm_util_pct``: the share of SM time with at least one warp resident, over all SMs;
- ``sm_occupancy_pct``: resident warps as a share of the most an SM can hold;
- ``tensor_util_pct``: tensor-core activity of any kind, and ``hmma_util_pct`` that of the
  half-precision (fp16/bf16) HMMA pipe alone;
- ``dram_bw_util_pct``: device-memory bandwidth used, as a share of the peak.

Where the GPU or driver lacks them they stay None, and the summary's ``gpm_note`` says which
could be read.

NVML updates these counters on its own cadence (tens of milliseconds to a second), so a
sample period much shorter than that only repeats values. Without NVML (no driver, CPU only)
the sampler is a no-op and says why.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Protocol

from . import validate

#: The counters a source returns on every read, in this order.
COUNTERS = ("gpu_busy_pct", "mem_busy_pct", "sm_clock_mhz", "power_w")


#: GPM metrics (Hopper and newer), as reading keys, with pynvml's name for each.
GPM_COUNTERS = {
    "sm_util_pct": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_util_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "hmma_util_pct": "NVML_GPM_METRIC_HMMA_TENSOR_UTIL",
    "dram_bw_util_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}

#: Summary field prefix of each counter (``<prefix>_mean``, ``<prefix>_max``).
_PREFIXES = {"gpu_busy_pct": "gpu_busy", "mem_busy_pct": "mem_busy",
             "sm_clock_mhz": "sm_clock_mhz", "power_w": "power_w",
             **{k: k.removesuffix("_pct") for k in GPM_COUNTERS}}


class TelemetrySource(Protocol):
    """Anything that returns one reading: a dict with the keys in ``COUNTERS`` (and those of
    ``GPM_COUNTERS`` too, where the GPU has GPM metrics)."""

    def read(self) -> dict[str, float]: ...


@dataclass(frozen=True)
class TelemetrySummary:
    """Mean and max of each counter over the samples taken while a region ran."""

    n_samples: int
    gpu_busy_mean: float | None = None
    gpu_busy_max: float | None = None
    mem_busy_mean: float | None = None
    mem_busy_max: float | None = None
    sm_clock_mhz_mean: float | None = None
    sm_clock_mhz_max: float | None = None
    power_w_mean: float | None = None
    power_w_max: float | None = None
    sm_util_mean: float | None = None
    sm_util_max: float | None = None
    sm_occupancy_mean: float | None = None
    sm_occupancy_max: float | None = None
    tensor_util_mean: float | None = None
    tensor_util_max: float | None = None
    hmma_util_mean: float | None = None
    hmma_util_max: float | None = None
    dram_bw_util_mean: float | None = None
    dram_bw_util_max: float | None = None
    note: str = ""
    gpm_note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """Returns the fields as a flat dict (column names for a results row)."""
        d = asdict(self)
        d["telemetry_samples"] = d.pop("n_samples")
        d["telemetry_note"] = d.pop("note")
        return d


def summarize_samples(samples: list[dict[str, float]], note: str = "",
                      gpm_note: str = "") -> TelemetrySummary:
    """Returns the mean and max of each counter (GPM ones too) over a list of readings.

    A counter missing or None in a reading is left out of that counter's mean.
    """
    if not samples:
        return TelemetrySummary(0, note=note or "no samples (the region was shorter than one period)",
                                gpm_note=gpm_note)
    out: dict[str, float | None] = {}
    for counter, prefix in _PREFIXES.items():
        xs = [float(s[counter]) for s in samples if s.get(counter) is not None]
        out[f"{prefix}_mean"] = math.fsum(xs) / len(xs) if xs else None
        out[f"{prefix}_max"] = max(xs) if xs else None
    return TelemetrySummary(len(samples), **out, note=note, gpm_note=gpm_note)


class GpmReader:
    """Reads NVML's GPM metrics: each reading covers the time since the previous one.

    GPM metrics come from two hardware-counter snapshots, so the reader keeps the last one;
    :meth:`begin` takes a fresh snapshot (call it when a measured region starts). Readings less
    than ``min_interval_s`` after the last snapshot return None values and keep that snapshot.
    """

    def __init__(self, handle: Any, pynvml: Any, *, min_interval_s: float = 0.02):
        self._nvml, self._handle = pynvml, handle
        self._ids = {name: getattr(pynvml, const) for name, const in GPM_COUNTERS.items()
                     if hasattr(pynvml, const)}
        self._prev = pynvml.nvmlGpmSampleAlloc()
        self._next = pynvml.nvmlGpmSampleAlloc()
        self._t_prev = 0.0
        self.min_interval_s = min_interval_s
        self.readable: set[str] = set()
        self.unreadable: dict[str, str] = {name: "pynvml has no such metric"
                                           for name in GPM_COUNTERS if name not in self._ids}
        self.begin()

    def begin(self) -> None:
        """Takes the snapshot the next reading is measured from."""
        self._nvml.nvmlGpmSampleGet(self._handle, self._prev)
        self._t_prev = time.monotonic()

    def read(self) -> dict[str, float | None]:
        """Returns each GPM metric (None where unreadable) since the previous snapshot."""
        nv = self._nvml
        if time.monotonic() - self._t_prev < self.min_interval_s:
            return dict.fromkeys(GPM_COUNTERS)
        nv.nvmlGpmSampleGet(self._handle, self._next)
        now = time.monotonic()
        get = nv.c_nvmlGpmMetricsGet_t()
        get.version = nv.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(self._ids)
        get.sample1, get.sample2 = self._prev, self._next
        names = list(self._ids)
        for i, name in enumerate(names):
            get.metrics[i].metricId = self._ids[name]
        nv.nvmlGpmMetricsGet(get)
        out: dict[str, float | None] = dict.fromkeys(GPM_COUNTERS)
        for i, name in enumerate(names):
            m = get.metrics[i]
            if m.nvmlReturn == 0 and math.isfinite(m.value):
                out[name] = float(m.value)
                self.readable.add(name)
                self.unreadable.pop(name, None)
            elif name not in self.readable:
                self.unreadable[name] = f"NVML returned error {m.nvmlReturn}"
        self._prev, self._next = self._next, self._prev
        self._t_prev = now
        return out

    def describe(self) -> str:
        """Returns one line saying which GPM metrics could be read, and why the others not."""
        read = ", ".join(n for n in GPM_COUNTERS if n in self.readable) or "none yet"
        missing = "; ".join(f"{n} ({why})" for n, why in self.unreadable.items())
        return f"GPM metrics read: {read}" + (f"; not readable: {missing}" if missing else "")


def gpm_reader(handle: Any, pynvml: Any) -> tuple[GpmReader | None, str]:
    """Returns (a GPM reader, "") where the GPU supports GPM, else (None, why not)."""
    if not hasattr(pynvml, "nvmlGpmQueryDeviceSupport"):
        return None, "GPM metrics unavailable: this nvidia-ml-py has no GPM API (upgrade it)"
    try:
        support = pynvml.nvmlGpmQueryDeviceSupport(handle)
    except Exception as e:  # NVMLError_NotSupported on drivers or GPUs without GPM
        return None, f"GPM metrics unavailable: NVML said {type(e).__name__}: {e}"
    if not support.isSupportedDevice:
        return None, "GPM metrics unavailable: this GPU has none (they start with Hopper)"
    try:
        return GpmReader(handle, pynvml), ""
    except Exception as e:
        return None, f"GPM metrics unavailable: the first snapshot failed ({type(e).__name__}: {e})"


class NvmlSource:
    """Reads the counters of one GPU through NVML, and its GPM metrics where it has them."""

    def __init__(self, handle: Any, pynvml: Any, *, gpm: GpmReader | None = None,
                 gpm_note: str = ""):
        self._handle, self._nvml = handle, pynvml
        self._gpm, self._gpm_note = gpm, gpm_note

    def begin(self) -> None:
        """Starts a measured region: GPM readings count from here."""
        if self._gpm is not None:
            self._gpm.begin()

    @property
    def gpm_note(self) -> str:
        """Returns which GPM metrics could be read (or why none)."""
        return self._gpm.describe() if self._gpm is not None else self._gpm_note

    def read(self) -> dict[str, float]:
        """Returns one reading of every counter."""
        nv, h = self._nvml, self._handle
        util = nv.nvmlDeviceGetUtilizationRates(h)
        out = {
            "gpu_busy_pct": float(util.gpu),
            "mem_busy_pct": float(util.memory),
            "sm_clock_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
        }
        if self._gpm is not None:
            try:
                out.update(self._gpm.read())
            except Exception as e:  # keep the classic counters going without GPM
                self._gpm_note = f"GPM metrics stopped: a read failed ({type(e).__name__}: {e})"
                self._gpm = None
        return out


@functools.lru_cache(maxsize=None)
def nvml_source(device_index: int = 0) -> tuple[NvmlSource | None, str]:
    """Returns (an NVML source for the torch CUDA device, "") or (None, why there is none).

    The NVML handle is looked up by PCI bus id, because NVML numbers GPUs differently from
    CUDA when ``CUDA_VISIBLE_DEVICES`` is set. Cached: NVML is started once per process.
    """
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        import torch
        if not torch.cuda.is_available():
            return None, "no CUDA GPU, so no GPU telemetry"
    except ImportError:
        return None, "torch is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"NVML did not start ({type(e).__name__}: {e})"
    try:
        p = torch.cuda.get_device_properties(device_index)
        bus = f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
    except Exception:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception as e:
            return None, f"NVML found no handle for CUDA device {device_index} ({e})"
    gpm, gpm_note = gpm_reader(handle, pynvml)
    return NvmlSource(handle, pynvml, gpm=gpm, gpm_note=gpm_note), ""


class TelemetrySampler:
    """Samples a telemetry source every ``interval_s`` on a daemon thread between start and stop.

    Use as a context manager; ``summary`` holds the result after the block::

        with TelemetrySampler() as t:
            train_steps()
        t.summary.gpu_busy_mean

    Args:
        source: what to read; by default NVML for CUDA device 0. Pass a fake in tests.
        interval_s: time between readings (NVML itself refreshes about every 20-100 ms).
        enabled: False makes the sampler a no-op (to measure its own overhead).
        sleep: replaces the wait between readings (tests pass a no-op to sample fast).
    """

    def __init__(self, source: TelemetrySource | None = None, *, interval_s: float = 0.05,
                 enabled: bool = True, device_index: int = 0,
                 sleep: Callable[[float], Any] | None = None):
        self.interval_s = validate.number("interval_s", interval_s, low=0, high=60, low_open=True)
        enabled = validate.boolean("enabled", enabled)
        device_index = validate.count("device_index", device_index, low=0)
        self.note = ""
        if not enabled:
            source, self.note = None, "telemetry off"
        elif source is None:
            source, self.note = nvml_source(device_index)
        self._source = source
        self._samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sleep = sleep
        self._error = ""
        self.summary: TelemetrySummary | None = None

    @property
    def active(self) -> bool:
        """Returns True when there is a source to sample."""
        return self._source is not None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._samples.append(self._source.read())
            except Exception as e:  # a failed read must never kill the measured work
                self._error = f"a telemetry read failed ({type(e).__name__}: {e})"
                return
            if self._sleep is not None:
                self._sleep(self.interval_s)
            else:
                self._stop.wait(self.interval_s)

    def start(self) -> "TelemetrySampler":
        """Starts sampling (a no-op without a source) and returns self."""
        self._samples, self.summary, self._error = [], None, ""
        self._stop.clear()
        if self._source is not None:
            if hasattr(self._source, "begin"):
                self._source.begin()
            self._thread = threading.Thread(target=self._loop, name="fp16lab-telemetry",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> TelemetrySummary:
        """Stops sampling, and returns (and keeps in ``summary``) the summary of the samples."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._source is None:
            self.summary = TelemetrySummary(0, note=self.note)
        else:
            self.summary = summarize_samples(list(self._samples), note=self._error,
                                             gpm_note=getattr(self._source, "gpm_note", ""))
        return self.summary

    @property
    def samples(self) -> list[dict[str, float]]:
        """Returns a copy of the readings taken so far."""
        return list(self._samples)

    def __enter__(self) -> "TelemetrySampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def other_gpu_processes(handle: Any = None, pynvml: Any = None) -> tuple[list[dict[str, Any]], str]:
    """Returns (the other processes computing on the GPU, each as pid and MiB used; a note).

    Read with NVML's ``nvmlDeviceGetComputeRunningProcesses``. Inside a container NVML may
    report this process under its host pid: when no listed pid is ours but this process holds a
    CUDA context, one listed process is taken to be this one. The note says why the list could
    not be read (no NVML, no handle); the list is then empty.
    """
    import os

    if handle is None:
        source, why = nvml_source()
        if source is None:
            return [], why
        handle, pynvml = source._handle, source._nvml
    try:
        procs = list(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except Exception as e:  # an old driver or a MIG slice without the query: say so, do not fail
        return [], f"NVML could not list the GPU's processes ({type(e).__name__}: {e})"
    me = os.getpid()
    others = [p for p in procs if p.pid != me]
    if len(others) == len(procs) and others and _holds_cuda_context():
        others = others[1:] if len(others) > 1 else []
    return [{"pid": int(p.pid), "used_mib": (p.usedGpuMemory or 0) / 2**20} for p in others], ""


def _holds_cuda_context() -> bool:
    try:
        import torch
        return torch.cuda.is_initialized()
    except ImportError:
        return False


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

NVML updates these counters on its own cadence (tens of milliseconds to a second), so a
sample period much shorter than that only repeats values. Without NVML (no driver, CPU only)
the sampler is a no-op and says why.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable, Protocol

#: The counters a source returns on every read, in this order.
COUNTERS = ("gpu_busy_pct", "mem_busy_pct", "sm_clock_mhz", "power_w")


class TelemetrySource(Protocol):
    """Anything that returns one reading: a dict with the keys in ``COUNTERS``."""

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
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """Returns the fields as a flat dict (column names for a results row)."""
        d = asdict(self)
        d["telemetry_samples"] = d.pop("n_samples")
        d["telemetry_note"] = d.pop("note")
        return d


def summarize_samples(samples: list[dict[str, float]], note: str = "") -> TelemetrySummary:
    """Returns the mean and max of each counter over a list of readings."""
    if not samples:
        return TelemetrySummary(0, note=note or "no samples (the region was shorter than one period)")
    out: dict[str, float] = {}
    for counter, prefix in zip(COUNTERS, ("gpu_busy", "mem_busy", "sm_clock_mhz", "power_w")):
        xs = [float(s[counter]) for s in samples if s.get(counter) is not None]
        out[f"{prefix}_mean"] = math.fsum(xs) / len(xs) if xs else None
        out[f"{prefix}_max"] = max(xs) if xs else None
    return TelemetrySummary(len(samples), **out, note=note)


class NvmlSource:
    """Reads the counters of one GPU through NVML."""

    def __init__(self, handle: Any, pynvml: Any):
        self._handle, self._nvml = handle, pynvml

    def read(self) -> dict[str, float]:
        """Returns one reading of every counter."""
        nv, h = self._nvml, self._handle
        util = nv.nvmlDeviceGetUtilizationRates(h)
        return {
            "gpu_busy_pct": float(util.gpu),
            "mem_busy_pct": float(util.memory),
            "sm_clock_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
        }


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
    return NvmlSource(handle, pynvml), ""


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
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0 seconds, got {interval_s}")
        self.interval_s = interval_s
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
            self.summary = summarize_samples(list(self._samples), note=self._error)
        return self.summary

    @property
    def samples(self) -> list[dict[str, float]]:
        """Returns a copy of the readings taken so far."""
        return list(self._samples)

    def __enter__(self) -> "TelemetrySampler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


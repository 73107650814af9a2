"""The telemetry sampler, against a fake NVML source and numpy."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from fp16lab.telemetry import COUNTERS, TelemetrySampler, nvml_source, summarize_samples


class FakeSource:
    """Returns a scripted sequence of readings, then repeats the last one."""

    def __init__(self, n: int = 40, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.table = {
            "gpu_busy_pct": rng.integers(0, 101, n).astype(float),
            "mem_busy_pct": rng.integers(0, 101, n).astype(float),
            "sm_clock_mhz": rng.uniform(1000, 1980, n),
            "power_w": rng.uniform(80, 700, n),
        }
        self.reads = 0

    def read(self):
        i = min(self.reads, len(self.table["power_w"]) - 1)
        self.reads += 1
        return {k: float(v[i]) for k, v in self.table.items()}


def test_summary_matches_numpy_over_the_samples_taken():
    src = FakeSource()
    with TelemetrySampler(src, interval_s=0.001) as t:
        deadline = time.monotonic() + 5
        while src.reads < 25 and time.monotonic() < deadline:
            time.sleep(0.002)
    s = t.summary
    taken = t.samples
    assert s.n_samples == len(taken) >= 25
    for counter, prefix in zip(COUNTERS, ("gpu_busy", "mem_busy", "sm_clock_mhz", "power_w")):
        xs = np.array([r[counter] for r in taken])
        assert getattr(s, f"{prefix}_mean") == pytest.approx(xs.mean(), rel=1e-12)
        assert getattr(s, f"{prefix}_max") == xs.max()


def test_the_sampler_waits_its_interval_between_reads():
    waits = []
    stop_after = threading.Event()
    src = FakeSource()

    def fake_sleep(s):
        waits.append(s)
        if len(waits) >= 5:
            stop_after.set()
        time.sleep(0.001)

    t = TelemetrySampler(src, interval_s=0.07, sleep=fake_sleep).start()
    assert stop_after.wait(5)
    t.stop()
    assert waits[:5] == [0.07] * 5
    assert src.reads >= 5


def test_stop_returns_the_summary_and_the_thread_ends():
    t = TelemetrySampler(FakeSource(), interval_s=0.001).start()
    time.sleep(0.02)
    summary = t.stop()
    assert summary is t.summary and summary.n_samples > 0
    assert not any(th.name == "fp16lab-telemetry" for th in threading.enumerate())


def test_disabled_sampler_takes_no_samples_and_says_so():
    src = FakeSource()
    with TelemetrySampler(src, enabled=False) as t:
        time.sleep(0.01)
    assert src.reads == 0
    assert t.summary.n_samples == 0 and t.summary.note == "telemetry off"
    assert t.summary.gpu_busy_mean is None


def test_a_failing_source_is_reported_not_raised():
    class Broken:
        def read(self):
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    with TelemetrySampler(Broken(), interval_s=0.001) as t:
        time.sleep(0.01)
    assert t.summary.n_samples == 0
    assert "NVML_ERROR_GPU_IS_LOST" in t.summary.note


def test_summary_of_no_samples_is_empty_with_a_reason():
    s = summarize_samples([])
    assert s.n_samples == 0 and s.power_w_max is None and "no samples" in s.note
    d = s.as_dict()
    assert d["telemetry_samples"] == 0 and "telemetry_note" in d


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        TelemetrySampler(FakeSource(), interval_s=0)


def test_without_a_gpu_nvml_source_is_none_with_a_reason():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    src, why = nvml_source()
    assert src is None and why
    t = TelemetrySampler()
    assert not t.active and t.note == why


@pytest.mark.gpu
def test_nvml_readings_are_in_range_on_a_gpu():
    src, why = nvml_source()
    assert src is not None, why
    r = src.read()
    assert set(r) == set(COUNTERS)
    assert 0 <= r["gpu_busy_pct"] <= 100 and 0 <= r["mem_busy_pct"] <= 100
    assert r["sm_clock_mhz"] > 0 and r["power_w"] > 0

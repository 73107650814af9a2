"""The telemetry sampler, against a fake NVML source and numpy."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from fp16lab.telemetry import (COUNTERS, GPM_COUNTERS, TelemetrySampler, nvml_source,
                               summarize_samples)


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
    src.begin()
    time.sleep(0.1)  # GPM metrics need two snapshots at least min_interval_s apart
    r = src.read()
    # the classic counters always; the GPM ones exactly where this GPU has GPM (Hopper and newer)
    gpm = set(GPM_COUNTERS) if src._gpm is not None else set()
    assert set(r) == set(COUNTERS) | gpm, src.gpm_note
    assert 0 <= r["gpu_busy_pct"] <= 100 and 0 <= r["mem_busy_pct"] <= 100
    assert r["sm_clock_mhz"] > 0 and r["power_w"] > 0
    for name in gpm:  # None only where NVML said it cannot read that metric
        if r[name] is None:
            assert name in src._gpm.unreadable, (name, src.gpm_note)
        else:
            assert 0 <= r[name] <= 100.5, (name, r[name], src.gpm_note)


# ---------------------------------------------------------------- GPM metrics, against a fake NVML

import types  # noqa: E402

import pynvml  # noqa: E402

from fp16lab.telemetry import GpmReader, NvmlSource, gpm_reader  # noqa: E402


class FakeGpmNvml:
    """NVML with GPM: snapshot k and k+1 give metric values table[metric_id][k+1]."""

    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
    NVML_CLOCK_SM = 1

    def __init__(self, n=30, supported=True, failing=(), seed=1):
        for const in GPM_COUNTERS.values():
            setattr(self, const, getattr(pynvml, const))
        rng = np.random.default_rng(seed)
        self.table = {getattr(pynvml, c): rng.uniform(0, 100, n) for c in GPM_COUNTERS.values()}
        self.supported, self.failing = supported, {getattr(pynvml, c) for c in failing}
        self.snapshots = 0
        self.served = []  # (metric id, value) of every value handed out

    class c_nvmlGpmMetricsGet_t:
        def __init__(self):
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [types.SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)
                            for _ in range(16)]

    def nvmlGpmQueryDeviceSupport(self, handle):
        return types.SimpleNamespace(isSupportedDevice=int(self.supported))

    def nvmlGpmSampleAlloc(self):
        return types.SimpleNamespace(k=None)

    def nvmlGpmSampleGet(self, handle, sample):
        sample.k = self.snapshots
        self.snapshots += 1

    def nvmlGpmMetricsGet(self, get):
        assert get.version == self.NVML_GPM_METRICS_GET_VERSION
        # a metric is defined between a snapshot and the next one taken after it
        assert get.sample2.k > get.sample1.k, "sample2 must be the later snapshot"
        for m in get.metrics[:get.numMetrics]:
            if m.metricId in self.failing:
                m.nvmlReturn = 3  # NVML_ERROR_NOT_SUPPORTED
                continue
            m.nvmlReturn, m.value = 0, float(self.table[m.metricId][get.sample2.k])
            self.served.append((m.metricId, m.value))
        return get

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=50, memory=20)

    def nvmlDeviceGetClockInfo(self, h, which):
        return 1980

    def nvmlDeviceGetPowerUsage(self, h):
        return 400_000


def test_gpm_reader_reads_each_metric_between_consecutive_snapshots():
    nv = FakeGpmNvml()
    reader, why = gpm_reader("h", nv)
    assert reader is not None and why == ""
    reader.min_interval_s = 0
    got = [reader.read() for _ in range(5)]
    sm_id = pynvml.NVML_GPM_METRIC_SM_UTIL
    # snapshot 0 taken at construction; reading i covers snapshots i..i+1
    assert [g["sm_util_pct"] for g in got] == list(nv.table[sm_id][1:6])
    assert [g["dram_bw_util_pct"] for g in got] == list(
        nv.table[pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL][1:6])
    assert "GPM metrics read: sm_util_pct, sm_occupancy_pct, tensor_util_pct, hmma_util_pct, " \
           "dram_bw_util_pct" == reader.describe()


def test_gpm_reader_says_which_metrics_it_could_not_read():
    nv = FakeGpmNvml(failing=("NVML_GPM_METRIC_HMMA_TENSOR_UTIL",))
    reader, _ = gpm_reader("h", nv)
    reader.min_interval_s = 0
    r = reader.read()
    assert r["hmma_util_pct"] is None and r["sm_util_pct"] is not None
    assert "not readable: hmma_util_pct (NVML returned error 3)" in reader.describe()


def test_gpm_reader_waits_for_time_to_pass_between_snapshots():
    reader, _ = gpm_reader("h", FakeGpmNvml())
    reader.min_interval_s = 60
    assert all(v is None for v in reader.read().values())


def test_no_gpm_on_older_gpus_is_said_and_the_classic_counters_still_read():
    nv = FakeGpmNvml(supported=False)
    reader, why = gpm_reader("h", nv)
    assert reader is None and "start with Hopper" in why
    src = NvmlSource("h", nv, gpm=reader, gpm_note=why)
    with TelemetrySampler(src, interval_s=0.001) as t:
        time.sleep(0.02)
    s = t.summary
    assert s.n_samples > 0 and s.gpu_busy_mean == 50 and s.power_w_max == 400
    assert s.sm_util_mean is None and "start with Hopper" in s.gpm_note


def test_sampler_summarises_gpm_metrics_like_numpy():
    nv = FakeGpmNvml(n=400)
    reader, _ = gpm_reader("h", nv)
    src = NvmlSource("h", nv, gpm=reader)
    reader.min_interval_s = 0.0
    with TelemetrySampler(src, interval_s=0.002) as t:
        deadline = time.monotonic() + 5
        while len(nv.served) < 5 * 10 and time.monotonic() < deadline:
            time.sleep(0.002)
    s = t.summary
    for name, const in GPM_COUNTERS.items():
        xs = np.array([v for mid, v in nv.served if mid == getattr(pynvml, const)])
        prefix = name.removesuffix("_pct")
        assert getattr(s, f"{prefix}_mean") == pytest.approx(xs.mean(), rel=1e-12)
        assert getattr(s, f"{prefix}_max") == xs.max()
    assert s.gpm_note.startswith("GPM metrics read: sm_util_pct")
    assert s.as_dict()["gpm_note"] == s.gpm_note


def test_a_failing_gpm_read_stops_gpm_but_not_the_sampler():
    nv = FakeGpmNvml()
    reader, _ = gpm_reader("h", nv)
    reader.min_interval_s = 0

    def broken(get):
        raise RuntimeError("NVML_ERROR_UNKNOWN")
    nv.nvmlGpmMetricsGet = broken
    src = NvmlSource("h", nv, gpm=reader)
    r1, r2 = src.read(), src.read()
    assert r1["gpu_busy_pct"] == r2["gpu_busy_pct"] == 50
    assert "sm_util_pct" not in r2 and "NVML_ERROR_UNKNOWN" in src.gpm_note


@pytest.mark.gpu
def test_gpm_metrics_on_this_gpu_see_tensor_core_work():
    src, why = nvml_source()
    assert src is not None, why
    if src._gpm is None:
        pytest.skip(f"this GPU has no readable GPM metrics: {src.gpm_note}")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    with TelemetrySampler(src, interval_s=0.1) as t:
        t_end = time.monotonic() + 1.5
        while time.monotonic() < t_end:
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()
    s = t.summary
    print(s.gpm_note, s)
    assert s.sm_util_mean is not None and 50 <= s.sm_util_mean <= 100.5, s
    assert s.tensor_util_mean is not None and s.tensor_util_mean > 5, s

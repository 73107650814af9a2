"""fp16lab.telemetry, beyond tests/test_telemetry.py: the summaries, against hand-worked figures
and a fake NVML whose readings change from one snapshot to the next."""

from __future__ import annotations

import threading
import time
import types

import pynvml
import pytest

from fp16lab.telemetry import (GPM_COUNTERS, GpmReader, NvmlSource, TelemetrySampler,
                               summarize_samples)


def test_the_mean_skips_missing_readings_and_the_count_keeps_them():
    samples = [{"gpu_busy_pct": 10.0, "power_w": 100.0}, {"gpu_busy_pct": None, "power_w": 300.0},
               {"power_w": 200.0}, {"gpu_busy_pct": 40.0, "power_w": None}]
    s = summarize_samples(samples, note="n", gpm_note="g")
    assert s.n_samples == 4 and s.note == "n" and s.gpm_note == "g"
    assert s.gpu_busy_mean == 25.0 and s.gpu_busy_max == 40.0  # (10 + 40) / 2, not / 4
    assert s.power_w_mean == 200.0 and s.power_w_max == 300.0  # (100 + 300 + 200) / 3
    assert s.mem_busy_mean is None and s.mem_busy_max is None  # never read
    assert s.sm_util_mean is None


def test_a_counter_whose_readings_are_all_missing_has_no_mean():
    s = summarize_samples([{"sm_util_pct": None}, {"sm_util_pct": None}])
    assert s.n_samples == 2 and s.sm_util_mean is None and s.sm_util_max is None


class _Steady:
    """Returns the same reading, ``value``, until told another."""

    def __init__(self, value):
        self.value, self.reads = value, 0

    def read(self):
        self.reads += 1
        return {"gpu_busy_pct": self.value, "mem_busy_pct": self.value,
                "sm_clock_mhz": self.value, "power_w": self.value}


def _sample_until(sampler, src, n):
    start = src.reads
    sampler.start()
    deadline = time.monotonic() + 10
    while src.reads < start + n and time.monotonic() < deadline:
        time.sleep(0.002)
    return sampler.stop()


def test_a_restarted_sampler_summarises_only_its_new_samples():
    src = _Steady(1000.0)
    sampler = TelemetrySampler(src, interval_s=0.001)
    first = _sample_until(sampler, src, 5)
    assert first.n_samples >= 5 and first.power_w_mean == 1000.0
    src.value = 10.0
    second = _sample_until(sampler, src, 5)
    assert second.gpu_busy_mean == 10.0 and second.power_w_max == 10.0  # none of the 1000s left
    assert second.n_samples == len(sampler.samples) >= 5
    assert all(r["power_w"] == 10.0 for r in sampler.samples)
    assert sampler.summary is second


class _WindowNvml:
    """A fake NVML with GPM whose metric value is the window it covers: sample2.k - sample1.k
    snapshots apart, starting at snapshot sample1.k (value = 100 * k1 + k2)."""

    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
    NVML_CLOCK_SM = 1

    def __init__(self):
        for const in GPM_COUNTERS.values():
            setattr(self, const, getattr(pynvml, const))
        self.snapshots = 0
        self.windows = []

    class c_nvmlGpmMetricsGet_t:
        def __init__(self):
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [types.SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)
                            for _ in range(16)]

    def nvmlGpmSampleAlloc(self):
        return types.SimpleNamespace(k=None)

    def nvmlGpmSampleGet(self, handle, sample):
        sample.k = self.snapshots
        self.snapshots += 1

    def nvmlGpmMetricsGet(self, get):
        self.windows.append((get.sample1.k, get.sample2.k))
        for m in get.metrics[:get.numMetrics]:
            m.nvmlReturn, m.value = 0, float(100 * get.sample1.k + get.sample2.k)

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=55, memory=21)

    def nvmlDeviceGetClockInfo(self, h, which):
        assert which == self.NVML_CLOCK_SM
        return 1755

    def nvmlDeviceGetPowerUsage(self, h):
        return 412_500  # milliwatts


def test_each_gpm_reading_covers_the_window_since_the_one_before():
    nv = _WindowNvml()
    reader = GpmReader("h", nv, min_interval_s=0)
    got = [reader.read()["sm_util_pct"] for _ in range(4)]
    # snapshot 0 at construction; the windows are 0..1, 1..2, 2..3, 3..4: the window rotates
    assert nv.windows == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert got == [1.0, 102.0, 203.0, 304.0]
    reader.begin()  # snapshot 5: a new measured region starts here
    assert reader.read()["tensor_util_pct"] == 506.0 and nv.windows[-1] == (5, 6)


def test_a_gpm_reading_too_soon_reads_nothing_and_keeps_its_window():
    nv = _WindowNvml()
    reader = GpmReader("h", nv, min_interval_s=3600)
    assert reader.read() == dict.fromkeys(GPM_COUNTERS) and nv.windows == [] and nv.snapshots == 1
    reader.min_interval_s = 0
    assert reader.read()["hmma_util_pct"] == 1.0  # still from snapshot 0


def test_nvml_source_converts_units_and_adds_gpm():
    nv = _WindowNvml()
    src = NvmlSource("h", nv, gpm=GpmReader("h", nv, min_interval_s=0))
    r = src.read()
    assert r["gpu_busy_pct"] == 55.0 and r["mem_busy_pct"] == 21.0
    assert r["sm_clock_mhz"] == 1755.0 and r["power_w"] == 412.5
    assert r["dram_bw_util_pct"] == 1.0
    assert NvmlSource("h", nv, gpm_note="none here").read().keys() == {
        "gpu_busy_pct", "mem_busy_pct", "sm_clock_mhz", "power_w"}


# ---------------------------------------------------------------- the GPU's other processes


class _ProcNvml:
    """NVML listing the given processes (pid, bytes used) for handle "h" only."""

    def __init__(self, procs, fail=None):
        self.procs, self.fail = procs, fail

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        if self.fail:
            raise self.fail
        assert handle == "h"
        return [types.SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.procs]


def test_other_processes_leave_this_one_out_and_give_mib(monkeypatch):
    import os

    from fp16lab import telemetry

    monkeypatch.setattr(telemetry, "_holds_cuda_context", lambda: False)
    me = os.getpid()
    nv = _ProcNvml([(me, 2 * 2**20), (111, 3 * 2**30), (222, None)])
    assert telemetry.other_gpu_processes("h", nv) == (
        [{"pid": 111, "used_mib": 3072.0}, {"pid": 222, "used_mib": 0.0}], "")
    # none listed is this process and it holds no CUDA context: every one is another's
    nv = _ProcNvml([(111, 2**20), (222, 2**21)])
    assert telemetry.other_gpu_processes("h", nv) == (
        [{"pid": 111, "used_mib": 1.0}, {"pid": 222, "used_mib": 2.0}], "")


def test_in_a_container_one_listed_process_is_taken_to_be_this_one(monkeypatch):
    from fp16lab import telemetry

    monkeypatch.setattr(telemetry, "_holds_cuda_context", lambda: True)
    nv = _ProcNvml([(111, 2**20), (222, 2**21), (333, 2**22)])
    assert telemetry.other_gpu_processes("h", nv)[0] == [{"pid": 222, "used_mib": 2.0},
                                                         {"pid": 333, "used_mib": 4.0}]
    assert telemetry.other_gpu_processes("h", _ProcNvml([(111, 2**20)])) == ([], "")
    assert telemetry.other_gpu_processes("h", _ProcNvml([])) == ([], "")


def test_a_failed_process_query_is_said_not_raised():
    from fp16lab import telemetry

    got = telemetry.other_gpu_processes("h", _ProcNvml([], fail=RuntimeError("old driver")))
    assert got == ([], "NVML could not list the GPU's processes (RuntimeError: old driver)")


def test_without_a_gpu_the_process_list_is_empty_with_the_reason(monkeypatch):
    from fp16lab import telemetry

    monkeypatch.setattr(telemetry, "nvml_source", lambda: (None, "no CUDA GPU, so no GPU telemetry"))
    assert telemetry.other_gpu_processes() == ([], "no CUDA GPU, so no GPU telemetry")
    src = NvmlSource("h", _ProcNvml([(999999, 2**20)]))
    monkeypatch.setattr(telemetry, "nvml_source", lambda: (src, ""))
    monkeypatch.setattr(telemetry, "_holds_cuda_context", lambda: False)
    assert telemetry.other_gpu_processes() == ([{"pid": 999999, "used_mib": 1.0}], "")


# ---------------------------------------------------------------- why there is no GPM


class _SupportNvml(_WindowNvml):
    def __init__(self, supported=True, fail=None, snapshot_fails=False):
        super().__init__()
        self.supported, self.fail, self.snapshot_fails, self.asked = supported, fail, snapshot_fails, []

    def nvmlGpmQueryDeviceSupport(self, handle):
        self.asked.append(handle)
        if self.fail:
            raise self.fail
        return types.SimpleNamespace(isSupportedDevice=int(self.supported))

    def nvmlGpmSampleGet(self, handle, sample):
        assert handle == "h"
        if self.snapshot_fails:
            raise OSError("busy")
        super().nvmlGpmSampleGet(handle, sample)


def test_gpm_reader_says_why_there_is_none():
    from fp16lab.telemetry import gpm_reader

    assert gpm_reader("h", object()) == (
        None, "GPM metrics unavailable: this nvidia-ml-py has no GPM API (upgrade it)")
    assert gpm_reader("h", _SupportNvml(fail=KeyError("nope"))) == (
        None, "GPM metrics unavailable: NVML said KeyError: 'nope'")
    assert gpm_reader("h", _SupportNvml(supported=False)) == (
        None, "GPM metrics unavailable: this GPU has none (they start with Hopper)")
    assert gpm_reader("h", _SupportNvml(snapshot_fails=True)) == (
        None, "GPM metrics unavailable: the first snapshot failed (OSError: busy)")
    nv = _SupportNvml()
    reader, why = gpm_reader("h", nv)
    assert why == "" and isinstance(reader, GpmReader) and nv.asked == ["h"]
    assert reader.min_interval_s == 0.02


def test_a_reader_says_which_metrics_pynvml_lacks_and_none_read_yet():
    nv = _WindowNvml()
    del nv.NVML_GPM_METRIC_HMMA_TENSOR_UTIL  # an older pynvml without this metric
    reader = GpmReader("h", nv, min_interval_s=0)
    assert reader.describe() == ("GPM metrics read: none yet; not readable: hmma_util_pct "
                                 "(pynvml has no such metric)")
    got = reader.read()
    assert got["hmma_util_pct"] is None and got["sm_util_pct"] == 1.0
    assert reader.describe() == ("GPM metrics read: sm_util_pct, sm_occupancy_pct, tensor_util_pct, "
                                 "dram_bw_util_pct; not readable: hmma_util_pct (pynvml has no such metric)")


def test_summaries_of_no_samples_keep_both_notes():
    s = summarize_samples([], note="", gpm_note="GPM off")
    assert s.n_samples == 0 and s.note == "no samples (the region was shorter than one period)"
    assert s.gpm_note == "GPM off"
    assert summarize_samples([{"power_w": 1.0}]).gpm_note == ""


def test_two_listed_processes_none_of_them_ours_with_a_context_leave_one(monkeypatch):
    from fp16lab import telemetry

    monkeypatch.setattr(telemetry, "_holds_cuda_context", lambda: True)
    assert telemetry.other_gpu_processes("h", _ProcNvml([(111, 2**20), (222, 2**21)]))[0] == [
        {"pid": 222, "used_mib": 2.0}]


def test_the_sampler_defaults_and_its_thread(monkeypatch):
    from fp16lab import telemetry

    asked = []
    monkeypatch.setattr(telemetry, "nvml_source", lambda i: (asked.append(i), (None, "none here"))[1])
    t = TelemetrySampler()
    assert asked == [0] and t.interval_s == 0.05 and t.note == "none here" and not t.active
    src = _Steady(1.0)
    t = TelemetrySampler(src, interval_s=0.01)
    assert t.note == "" and t.summary is None and t.samples == []
    t.start()
    try:
        names = {th.name: th.daemon for th in threading.enumerate()}
        assert names.get("fp16lab-telemetry") is True
    finally:
        s = t.stop()
    assert s.note == "" and s.gpm_note == ""


def test_a_failed_read_is_named_in_the_summary():
    class Failing:
        def read(self):
            raise RuntimeError("gone")

    s = TelemetrySampler(Failing(), interval_s=0.01).start().stop()
    assert s.note == "a telemetry read failed (RuntimeError: gone)" and s.n_samples == 0


class _StrictNvml(_WindowNvml):
    """Every classic counter must be asked of handle "h"."""

    def nvmlDeviceGetUtilizationRates(self, h):
        assert h == "h"
        return super().nvmlDeviceGetUtilizationRates(h)

    def nvmlDeviceGetClockInfo(self, h, which):
        assert h == "h"
        return super().nvmlDeviceGetClockInfo(h, which)

    def nvmlDeviceGetPowerUsage(self, h):
        assert h == "h"
        return super().nvmlDeviceGetPowerUsage(h)

    def nvmlGpmSampleGet(self, handle, sample):
        assert handle == "h"
        super().nvmlGpmSampleGet(handle, sample)


def test_nvml_source_asks_its_own_handle_and_says_when_gpm_stops():
    nv = _StrictNvml()
    src = NvmlSource("h", nv, gpm=GpmReader("h", nv, min_interval_s=0))
    assert src.read()["power_w"] == 412.5 and src.gpm_note == "GPM metrics read: sm_util_pct, " \
        "sm_occupancy_pct, tensor_util_pct, hmma_util_pct, dram_bw_util_pct"
    assert NvmlSource("h", nv).gpm_note == ""

    def broken(get):
        raise OSError("lost")
    nv.nvmlGpmMetricsGet = broken
    r = src.read()
    assert r["sm_clock_mhz"] == 1755.0 and "sm_util_pct" not in r
    assert src.gpm_note == "GPM metrics stopped: a read failed (OSError: lost)"


def test_a_metric_that_reads_again_is_no_longer_listed_as_unreadable():
    nv = _WindowNvml()
    reader = GpmReader("h", nv, min_interval_s=0)
    real = nv.nvmlGpmMetricsGet
    fails = {getattr(pynvml, "NVML_GPM_METRIC_SM_UTIL"), getattr(pynvml, "NVML_GPM_METRIC_DRAM_BW_UTIL")}

    def flaky(get):
        real(get)
        for m in get.metrics[:get.numMetrics]:
            if m.metricId in fails:
                m.nvmlReturn = 3
    nv.nvmlGpmMetricsGet = flaky
    reader.read()
    assert reader.describe() == ("GPM metrics read: sm_occupancy_pct, tensor_util_pct, hmma_util_pct; "
                                 "not readable: sm_util_pct (NVML returned error 3); "
                                 "dram_bw_util_pct (NVML returned error 3)")
    nv.nvmlGpmMetricsGet = real
    reader.read()
    assert reader.unreadable == {}


def test_a_sampler_stopped_twice_or_never_started_says_so_plainly():
    src = _Steady(3.0)
    t = TelemetrySampler(src, interval_s=0.01)
    s = t.stop()  # never started: no samples, and no error to report
    assert s.n_samples == 0 and s.note == "no samples (the region was shorter than one period)"
    _sample_until(t, src, 2)
    again = t.stop()
    assert again.n_samples >= 2 and again.note == ""


def test_start_begins_a_measured_region_on_a_source_that_has_one():
    class WithBegin(_Steady):
        begun = 0

        def begin(self):
            self.begun += 1

    src = WithBegin(1.0)
    t = TelemetrySampler(src, interval_s=0.01)
    t.start()
    t.stop()
    t.start()
    t.stop()
    assert src.begun == 2


def test_the_summary_as_a_row_names_its_note_telemetry_note():
    d = summarize_samples([{"power_w": 2.0}], note="n", gpm_note="g").as_dict()
    assert d["telemetry_note"] == "n" and "note" not in d and d["power_w_mean"] == 2.0
    assert d["gpm_note"] == "g" and d["telemetry_samples"] == 1 and "n_samples" not in d

"""fp16lab.measure.timing, beyond tests/test_measure_timing.py: the timing logic run on a CPU
against fakes of the GPU's pieces.

The fakes keep a virtual clock: each timed call advances it by a known number of milliseconds,
an event's record() reads it, and elapsed_time is the difference, refused (as torch and CuPy
refuse it) for an event that was never recorded or was made without timing. So every expected
figure is the durations the test chose, and the order of calls, records and synchronizations is
checked against the algorithm the docstrings describe.
"""

from __future__ import annotations

import statistics
import sys
import time
import types

import pytest
import torch

from fp16lab.measure import timing
from fp16lab.measure.timing import (Timing, copy_bandwidth_gbs, cuda_kernels, cuda_missing,
                                    nvidia_smi_id, step_times_ms, summarize, time_cpu, time_cuda,
                                    time_cuda_interleaved, time_cuda_sustained)


class Clock:
    """A virtual GPU clock (ms) and a log of what happened, in order."""

    def __init__(self):
        self.now = 0.0
        self.log: list = []

    def work(self, ms: float, tag: str = "call"):
        """Returns a function that logs ``tag`` and advances the clock by ``ms``."""
        def fn():
            self.log.append(tag)
            self.now += ms
            return tag
        return fn

    def durations(self, ms_list, tag: str = "call"):
        """Returns a function whose k-th call advances the clock by ms_list[k]."""
        it = iter(ms_list)

        def fn():
            self.log.append(tag)
            self.now += next(it)
        return fn


class FakeEvent:
    def __init__(self, clock: Clock, enable_timing=False):
        self.clock, self.timing, self.t = clock, enable_timing, None

    def record(self, stream=None):
        self.t = self.clock.now
        self.clock.log.append("record")

    def synchronize(self):
        self.clock.log.append("event sync")

    def elapsed_time(self, end: "FakeEvent") -> float:
        if not isinstance(end, FakeEvent):
            raise TypeError("elapsed_time needs an event")
        if self.timing is not True or end.timing is not True:
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if self.t is None or end.t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        return end.t - self.t


@pytest.fixture
def fake_torch_cuda(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(torch.cuda, "Event",
                        lambda enable_timing=False, **kw: FakeEvent(clock, enable_timing))
    monkeypatch.setattr(torch.cuda, "synchronize",
                        lambda device=None: clock.log.append(("sync", device)))
    return clock


@pytest.fixture
def fake_cupy(monkeypatch):
    """A cupy module with events (timing on, as CuPy's default), a stream and device 1."""
    clock = Clock()

    def get_elapsed_time(start, end):
        return start.elapsed_time(end)

    stream = types.SimpleNamespace(synchronize=lambda: clock.log.append("stream sync"))
    cuda = types.SimpleNamespace(Event=lambda: FakeEvent(clock, True),
                                 get_current_stream=lambda: stream,
                                 get_elapsed_time=get_elapsed_time,
                                 Device=lambda: types.SimpleNamespace(id=1))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    return clock


@pytest.fixture
def host_clock(monkeypatch):
    """time.perf_counter reads a clock (seconds) that only the timed calls advance."""
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", lambda: clock.now / 1e3)
    return clock


# ------------------------------------------------------------------ summaries and counts


def test_as_dict_holds_the_fields_and_the_spread():
    t = Timing(median_ms=2.0, p10_ms=1.5, p90_ms=3.0, n=7)
    assert t.as_dict() == {"median_ms": 2.0, "p10_ms": 1.5, "p90_ms": 3.0, "n": 7,
                           "spread": 0.75}  # (3 - 1.5) / 2
    assert Timing(0.0, 0.0, 1.0, 2).spread == 0.0


def test_summarize_says_what_it_needs():
    with pytest.raises(ValueError) as e:
        summarize([])
    assert str(e.value) == "summarize() needs at least one timing sample, got none"


def test_time_cpu_by_default_warms_up_twice_and_times_ten_calls(host_clock):
    fn = host_clock.durations([100.0, 100.0] + [1.0 + k for k in range(10)])
    t = time_cpu(fn)
    assert len(host_clock.log) == 12 and t.n == 10
    # the two slow warm-up calls are not in the timing: 1..10 ms, median 5.5
    assert t.median_ms == pytest.approx(5.5, abs=1e-9)
    assert t.p90_ms == pytest.approx(9.1, abs=1e-9)


def test_one_repeat_is_enough(host_clock):
    t = time_cpu(host_clock.work(3.0), warmup=0, repeat=1)
    assert (t.n, t.median_ms) == (1, pytest.approx(3.0, abs=1e-9))


# ------------------------------------------------------------------ CUDA events (torch)


def test_time_cuda_times_each_call_between_two_events_after_the_warmup(fake_torch_cuda):
    clock = fake_torch_cuda
    fn = clock.durations([50.0, 50.0] + [2.0, 4.0, 9.0])
    t = time_cuda(fn, warmup=2, repeat=3)
    assert clock.log == ["call", "call", ("sync", None),
                         "record", "call", "record", "record", "call", "record",
                         "record", "call", "record", ("sync", None)]
    assert (t.median_ms, t.n) == (4.0, 3)
    assert (t.p10_ms, t.p90_ms) == (pytest.approx(2.4), pytest.approx(8.0))


def test_time_cuda_by_default_warms_up_three_times_and_times_twenty(fake_torch_cuda):
    clock = fake_torch_cuda
    t = time_cuda(clock.durations([100.0] * 3 + [float(k) for k in range(1, 21)]))
    assert clock.log.count("call") == 23 and t.n == 20
    assert t.median_ms == 10.5  # of 1..20 ms: the warm-up's 100 ms are left out


# ------------------------------------------------------------------ CUDA events (cupy)


def test_the_cupy_backend_uses_cupys_events_and_stream(fake_cupy):
    clock = fake_cupy
    t = time_cuda(clock.durations([30.0, 1.0, 3.0]), warmup=1, repeat=2, backend="cupy")
    assert clock.log == ["call", "stream sync", "record", "call", "record",
                         "record", "call", "record", "stream sync"]
    assert (t.n, t.median_ms) == (2, 2.0)


def test_the_cupy_backend_reads_start_to_stop_not_stop_to_start(fake_cupy):
    t = time_cuda(fake_cupy.work(5.0), warmup=0, repeat=3, backend="cupy")
    assert (t.median_ms, t.p10_ms, t.p90_ms) == (5.0, 5.0, 5.0)


# ------------------------------------------------------------------ interleaved


def test_interleaved_defaults_four_rounds_three_warmups_ten_repeats_on_torch(monkeypatch):
    seen = []

    def fake_samples(fn, warmup, repeat, backend):
        seen.append((fn(), warmup, repeat, backend))
        return [1.0] * repeat

    monkeypatch.setattr(timing, "_cuda_samples", fake_samples)
    out = time_cuda_interleaved({"a": lambda: "a", "b": lambda: "b"})
    assert seen == [(n, 3, 10, "torch") for n in ["a", "b", "b", "a", "a", "b", "b", "a"]]
    assert {n: t.n for n, t in out.items()} == {"a": 40, "b": 40}


def test_interleaved_passes_its_counts_and_backend_on(monkeypatch):
    seen = []
    monkeypatch.setattr(timing, "_cuda_samples",
                        lambda fn, w, r, b: seen.append((w, r, b)) or [2.0] * r)
    out = time_cuda_interleaved({"a": lambda: None}, rounds=1, warmup=0, repeat=2, backend="cupy")
    assert seen == [(0, 2, "cupy")] and out["a"].n == 2


def test_interleaved_on_fake_torch_events_pools_each_functions_own_times(fake_torch_cuda):
    clock = fake_torch_cuda
    out = time_cuda_interleaved({"one": clock.work(1.0, "one"), "two": clock.work(2.0, "two")},
                                rounds=2, warmup=1, repeat=2)
    assert [x for x in clock.log if x in ("one", "two")] == ["one"] * 3 + ["two"] * 6 + ["one"] * 3
    assert (out["one"].median_ms, out["two"].median_ms) == (1.0, 2.0)
    assert (out["one"].n, out["two"].n) == (4, 4)


# ------------------------------------------------------------------ a training loop's steps


def test_step_times_on_cuda_put_one_event_between_consecutive_steps(fake_torch_cuda):
    clock = fake_torch_cuda
    ms = step_times_ms(clock.durations([7.0, 2.0, 5.0], "step"), 3, torch.device("cuda"))
    assert ms == [7.0, 2.0, 5.0]
    dev = torch.device("cuda")
    assert clock.log == [("sync", dev), "record", "step", "record", "step", "record", "step",
                         "record", ("sync", dev)]


def test_step_times_default_to_the_cuda_device(fake_torch_cuda):
    clock = fake_torch_cuda
    assert step_times_ms(clock.durations([3.0, 4.0], "step"), 2) == [3.0, 4.0]
    assert clock.log[0] == ("sync", torch.device("cuda")) and clock.log.count("record") == 3


def test_step_times_on_the_host_are_each_calls_own_milliseconds(host_clock, fake_torch_cuda):
    ms = step_times_ms(host_clock.durations([40.0, 2.5], "step"), 2, "cpu")
    assert ms == [pytest.approx(40.0, abs=1e-9), pytest.approx(2.5, abs=1e-9)]
    assert "record" not in host_clock.log and fake_torch_cuda.log == []


# ------------------------------------------------------------------ nvidia-smi's numbering


def test_nvidia_smi_id_without_the_variable_and_past_its_list(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert nvidia_smi_id(0) == "0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert nvidia_smi_id(2) == "2"  # not listed: CUDA's own number


# ------------------------------------------------------------------ sustained


class FakeSmi:
    """subprocess.Popen for nvidia-smi: records the command, prints ``lines``."""

    def __init__(self, lines):
        self.lines, self.calls, self.terminated = lines, [], False

    def __call__(self, args, **kwargs):
        self.calls.append((args, kwargs))
        return self

    def terminate(self):
        self.terminated = True

    def communicate(self):
        return "\n".join(self.lines) + "\n", None


def _sustained_env(monkeypatch, smi: FakeSmi | None):
    import shutil
    import subprocess

    sleeps = []

    def sleep(s):
        if not isinstance(s, (int, float)):
            raise TypeError("sleep needs a number")
        sleeps.append(s)

    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(shutil, "which",
                        lambda name: "/usr/bin/nvidia-smi" if smi and name == "nvidia-smi" else None)
    if smi is not None:
        monkeypatch.setattr(subprocess, "Popen", smi)
    return sleeps


# parsed: (100,10) (200,20) | (1000,100) (1010,101,7) (1100,110) (1300,130) (1500,150) | (50,5)
SMI_LINES = ["100, 10", "200, 20", "[N/A], [N/A]", "1000, 100", "1010, 101, 7", "1100, 110",
             "1300, 130", "1500, 150", "50, 5"]


def test_sustained_runs_about_the_seconds_asked_and_reads_the_smi_medians(fake_cupy, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    smi = FakeSmi(SMI_LINES)
    sleeps = _sustained_env(monkeypatch, smi)
    clock = fake_cupy
    out = time_cuda_sustained(clock.work(2.0), seconds=0.1, sample_ms=1)
    calls = 100 // 2  # 0.1 s of 2 ms calls, from the one timed probe call
    assert clock.log.count("call") == 2 + calls  # a warm-up call and the probe first
    assert out["calls"] == calls
    assert out["ms_per_call"] == 2.0 and out["seconds"] == pytest.approx(0.1)
    # a quarter of the 8 readings skipped as ramp-up, the last (partial) one too, the line
    # with three fields and the [N/A] line left out: 1000, 1100, 1300, 1500
    assert out["sm_clock_mhz"] == 1200.0 and out["power_w"] == 120.0
    args, kwargs = smi.calls[0]
    assert args == ["nvidia-smi", "--id=6", "--query-gpu=clocks.sm,power.draw",
                    "--format=csv,noheader,nounits", "-lms=1"]
    import subprocess
    assert kwargs == {"stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL, "text": True}
    assert smi.terminated
    assert len(sleeps) == 1 and 0 < sleeps[0] <= 0.5  # a short pause for nvidia-smi to start


def test_sustained_defaults_to_a_second_sampled_every_50_ms(fake_cupy, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    smi = FakeSmi(["900, 90", "1000, 100", "1000, 100", "1000, 100", "1000, 100"])
    _sustained_env(monkeypatch, smi)
    out = time_cuda_sustained(fake_cupy.work(4.0))
    assert out["calls"] == 250 and out["seconds"] == pytest.approx(1.0)
    assert smi.calls[0][0][1] == "--id=1" and smi.calls[0][0][-1] == "-lms=50"
    assert (out["sm_clock_mhz"], out["power_w"]) == (1000.0, 100.0)


def test_sustained_runs_at_least_three_calls(fake_cupy, monkeypatch):
    _sustained_env(monkeypatch, None)
    out = time_cuda_sustained(fake_cupy.work(10.0), seconds=0.01)  # 1 call's worth
    assert out["calls"] == 3 and out["ms_per_call"] == 10.0


def test_sustained_counts_calls_from_a_fast_probe(fake_cupy, monkeypatch):
    _sustained_env(monkeypatch, None)
    out = time_cuda_sustained(fake_cupy.work(0.5), seconds=1.0)  # 1000 ms / 0.5 ms
    assert out["calls"] == 2000 and out["seconds"] == pytest.approx(1.0)


def test_sustained_without_nvidia_smi_has_no_clock_or_power(fake_cupy, monkeypatch):
    sleeps = _sustained_env(monkeypatch, None)
    out = time_cuda_sustained(fake_cupy.work(2.0), seconds=0.02)
    assert out == {"ms_per_call": 2.0, "calls": 10, "seconds": pytest.approx(0.02),
                   "sm_clock_mhz": None, "power_w": None}
    assert sleeps == []


def test_sustained_with_too_few_readings_uses_them_all(fake_cupy, monkeypatch):
    _sustained_env(monkeypatch, FakeSmi(["1000, 100", "1400, 140"]))  # [0:-1] of 2 keeps 1
    out = time_cuda_sustained(fake_cupy.work(2.0), seconds=0.02)
    assert (out["sm_clock_mhz"], out["power_w"]) == (1000.0, 100.0)
    _sustained_env(monkeypatch, FakeSmi(["1000, 100"]))  # [0:-1] of 1 is empty: all of them
    out = time_cuda_sustained(fake_cupy.work(2.0), seconds=0.02)
    assert (out["sm_clock_mhz"], out["power_w"]) == (1000.0, 100.0)
    _sustained_env(monkeypatch, FakeSmi(["[N/A], [N/A]"]))  # nothing readable
    out = time_cuda_sustained(fake_cupy.work(2.0), seconds=0.02)
    assert (out["sm_clock_mhz"], out["power_w"]) == (None, None)


def test_sustained_takes_one_ms_samples_and_refuses_shorter(fake_cupy, monkeypatch):
    _sustained_env(monkeypatch, None)
    assert time_cuda_sustained(fake_cupy.work(2.0), seconds=0.5, sample_ms=1)["calls"] == 250
    with pytest.raises(ValueError, match="sample_ms >= 1"):
        time_cuda_sustained(fake_cupy.work(2.0), seconds=0.5, sample_ms=0)


# ------------------------------------------------------------------ kernels, bandwidth, guard


def _kernel_event(name, us, device_type=None):
    e = types.SimpleNamespace(name=name, time_range=types.SimpleNamespace(elapsed_us=lambda: us))
    if device_type is not None:
        e.device_type = device_type
    return e


def test_cuda_kernels_lists_the_cuda_events_of_one_profiled_call(monkeypatch):
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    log = []
    events = [_kernel_event("aten::mm", 30, DeviceType.CPU), _kernel_event("sm90_gemm", 12, DeviceType.CUDA),
              _kernel_event("no device", 5), _kernel_event("elementwise", 3, DeviceType.CUDA)]

    class Profiler:
        def __init__(self, activities):
            log.append(("profile", list(activities)))

        def __enter__(self):
            return types.SimpleNamespace(events=lambda: events)

        def __exit__(self, *exc):
            log.append("end")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    monkeypatch.setattr(timing, "torch_profiler", Profiler)
    out = cuda_kernels(lambda: log.append("call"), warmup=2)
    assert out == [("sm90_gemm", 12.0), ("elementwise", 3.0)]
    assert all(isinstance(us, float) for _, us in out)
    assert log == ["call", "call", "sync", ("profile", [ProfilerActivity.CUDA]), "call", "sync",
                   "end"]
    log.clear()
    cuda_kernels(lambda: log.append("call"))  # no warm-up by default
    assert log.count("call") == 1


def test_copy_bandwidth_counts_the_bytes_read_and_written(monkeypatch):
    made, timed = [], []
    real_empty = torch.empty

    def empty(*size, dtype=None, device=None):
        made.append((size, dtype, device))
        return real_empty(*size, dtype=dtype)  # on the CPU

    def fake_time_cuda(fn, *, warmup, repeat):
        copied = fn()
        timed.append((warmup, repeat, copied))
        return Timing(median_ms=2.0, p10_ms=1.0, p90_ms=3.0, n=repeat)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(timing, "time_cuda", fake_time_cuda)
    nbytes = 4 * 1000
    gbs = copy_bandwidth_gbs(nbytes)
    assert made == [((1000,), torch.float32, "cuda")]
    (warmup, repeat, copied), = timed
    assert (warmup, repeat) == (3, 20)
    src_like = copied  # dst after dst.copy_(src): the copy really ran
    assert src_like is not None and src_like.dtype == torch.float32 and src_like.numel() == 1000
    assert gbs == pytest.approx(0.004, rel=1e-12)  # 4000 B read + 4000 written in 2 ms
    timed.clear()
    copy_bandwidth_gbs(nbytes, repeat=5)
    assert timed[0][:2] == (3, 5)


def test_copy_bandwidth_copies_the_source_into_the_destination(monkeypatch):
    real_empty = torch.empty
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "empty",
                        lambda *size, dtype=None, device=None: real_empty(*size, dtype=dtype))
    seen = {}

    def fake_time_cuda(fn, *, warmup, repeat):
        dst = fn()
        seen["dst"] = dst.clone()
        seen["again"] = fn()
        return Timing(1.0, 1.0, 1.0, repeat)

    monkeypatch.setattr(timing, "time_cuda", fake_time_cuda)
    copy_bandwidth_gbs(4 * 64)
    assert seen["again"] is not None and torch.equal(seen["dst"], seen["again"])
    assert ((seen["dst"] >= 0) & (seen["dst"] < 1)).all()  # uniform_'s values, copied over


def test_copy_bandwidth_and_the_guard_say_when_there_is_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError) as e:
        copy_bandwidth_gbs()
    assert str(e.value) == "copy_bandwidth_gbs needs a CUDA GPU; torch sees none"
    assert cuda_missing("the census") == ("the census needs a CUDA GPU "
                                          "(torch.cuda.is_available() is False)")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_missing("the census") is None

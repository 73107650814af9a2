"""The trace parser and timeline, on a real CPU trace and on a hand-built GPU-like trace."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fp16lab
from fp16lab import profile as P
from fp16lab.profile import record as prof_mod
from fp16lab.profile import torch_profiler


def _kernel(name, ts, dur, stream=7, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream}}


def _synthetic_trace():
    """A GPU-like trace with known busy time. Times in µs from 1000 (the parser rebases to 0).

    GPU (two streams):  gemm [1000,1100)  relu [1150,1160)  memcpy [1200,1230)
                        reduce [1300,1350) on stream 7 and an nccl kernel [1320,1400) on
                        stream 9 (overlapping), sgd [1500,1520).
    Union of busy intervals: 100 + 10 + 30 + (1300..1400 = 100) + 20 = 260 over [1000,1520)
    = 520 µs, so idle = 1 - 260/520 = 0.5.
    """
    return {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "user_annotation", "name": P.STEP_MARK, "pid": 1, "tid": 1,
         "ts": 990, "dur": 540},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 992, "dur": 20},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 995, "dur": 5},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 996, "dur": 3},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1,
         "ts": 1020, "dur": 500},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "forward", "pid": 0, "tid": 7,
         "ts": 1000, "dur": 500},
        _kernel("sm90_xmma_gemm_f16f16_f32_tn_n_tilesize128x128x64", 1000, 100),
        _kernel("void at::native::vectorized_elementwise_kernel<4, at::native::relu>", 1150, 10),
        _kernel("Memcpy DtoD (Device -> Device)", 1200, 30, cat="gpu_memcpy"),
        _kernel("void at::native::reduce_kernel<512, 1>", 1300, 50),
        _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1320, 80, stream=9),
        _kernel("void at::native::_fused_sgd_kernel", 1500, 20),
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 1, "tid": 1, "ts": 996},
    ]}


def test_synthetic_gpu_trace_idle_fraction_and_kinds_match_hand_computed_values(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_synthetic_trace()))
    ev = P.read_trace(path)
    gpu = ev[ev["lane"] == "gpu"]
    assert len(gpu) == 6, "the GPU-lane annotation is not device work and must be dropped"
    assert ev["start_us"].min() == 0.0
    s = P.gpu_time_summary(ev)
    assert s.window_us == pytest.approx(520)
    assert s.busy_us == pytest.approx(260)
    assert s.idle_fraction == pytest.approx(0.5)
    assert s.kernel_us == pytest.approx(100 + 10 + 30 + 50 + 80 + 20)
    totals = s.by_kind["total_us"].to_dict()
    assert totals == pytest.approx({"gemm-conv": 100, "elementwise": 10 + 20, "copy": 30,
                                    "reduction": 50, "nccl": 80})
    assert s.by_kind["share"].sum() == pytest.approx(1.0)
    # the CPU lane: the launch, the two ops (mm nested in addmm) and the step range
    cpu = ev[ev["lane"] == "cpu"].set_index("name")
    assert cpu.loc["cudaLaunchKernel", "kind"] == "launch"
    assert cpu.loc["cudaDeviceSynchronize", "kind"] == "sync"
    assert bool(cpu.loc["aten::addmm", "top_level"]) and not bool(cpu.loc["aten::mm", "top_level"])
    assert cpu.loc[P.STEP_MARK, "kind"] == "annotation"


def test_an_explicit_window_clips_kernels():
    ev = P.read_trace(_synthetic_trace())
    # window [50, 350) after rebasing (trace starts at 990): gemm part [50,110) = 60,
    # relu [160,170) = 10, memcpy [210,240) = 30, reduce [310,350) = 40, nccl [330,350) = 20
    s = P.gpu_time_summary(ev, window=(50, 350))
    assert s.window_us == 300
    assert s.kernel_us == pytest.approx(60 + 10 + 30 + 40 + 20)
    assert s.busy_us == pytest.approx(60 + 10 + 30 + 40)
    assert s.idle_fraction == pytest.approx(1 - 140 / 300)


def test_busy_time_matches_a_numpy_bitmap_on_random_intervals():
    rng = np.random.default_rng(3)
    starts = rng.integers(0, 1000, 200)
    ends = starts + rng.integers(1, 40, 200)
    covered = np.zeros(1100, dtype=bool)
    for s, e in zip(starts, ends):
        covered[s:e] = True
    assert P.busy_us(starts, ends) == covered.sum()
    assert P.busy_us(starts, ends, window=(100, 600)) == covered[100:600].sum()


@pytest.mark.parametrize("name, kind", [
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNT", "gemm-conv"),
    ("sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc", "gemm-conv"),
    ("cudnn::bn_bw_1C11_kernel_new<float>", "reduction"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_h161616gemm>", "gemm-conv"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::Half>>",
     "elementwise"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<foreach_binary_op>",
     "elementwise"),
    ("triton_poi_fused_relu_0", "elementwise"),
    ("triton_red_fused_native_batch_norm_legit_1", "reduction"),
    ("void at::native::batch_norm_collect_statistics_channels_last_kernel", "reduction"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4>", "reduction"),
    ("Memset (Device)", "copy"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "nccl"),
    ("aten::addmm", "gemm-conv"),
    ("aten::relu_", "elementwise"),
    ("aten::copy_", "copy"),
    ("void at::native::index_elementwise_kernel_gather", "elementwise"),
    ("some_unknown_kernel", "other"),
])
def test_kernel_names_are_classified(name, kind):
    assert P.classify(name) == kind


def test_gpu_memcpy_category_is_copy_whatever_the_name():
    assert P.classify("anything", "gpu_memcpy") == "copy"


def _cpu_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        opt.zero_grad()
        with P.phase("forward"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        with P.phase("backward"):
            loss.backward()
        with P.phase("optimizer_step"):
            opt.step()
        return loss
    return step


def test_real_cpu_trace_is_parsed_into_steps_phases_and_operators(tmp_path):
    prof = P.profile_steps(_cpu_step(), steps=3, warmup=1, trace_path=tmp_path / "cpu.json",
                           cuda=False)
    assert prof.trace_path.exists() and prof.lane == "cpu"
    raw = json.loads(prof.trace_path.read_text())["traceEvents"]
    # oracle: the trace file itself, read without the parser
    raw_ops = [e for e in raw if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    ev = prof.events
    assert (ev["category"] == "cpu_op").sum() == len(raw_ops)
    marks = ev[ev["name"] == P.STEP_MARK]
    assert len(marks) == 3
    for ph in ("forward", "backward", "optimizer_step"):
        assert (ev["name"] == ph).sum() == 3, ph
    # every linear layer's matmul is a gemm-conv op; 2 layers x 3 steps at least
    assert (ev[ev["top_level"]]["kind"] == "gemm-conv").sum() >= 6
    # the CPU summary's busy time is the union of top-level ops, checked against a bitmap in ns
    top = ev[ev["top_level"] & (ev["lane"] == "cpu")]
    lo, hi = prof.window
    grid = np.zeros(int((hi - lo) * 1000) + 2, dtype=bool)
    for s, e in zip(top["start_us"], top["end_us"]):
        grid[int(round((max(s, lo) - lo) * 1000)):int(round((min(e, hi) - lo) * 1000))] = True
    assert prof.summary.busy_us == pytest.approx(grid.sum() / 1000, rel=1e-3, abs=0.01)
    assert 0 <= prof.summary.idle_fraction < 1
    # top-level ops of one thread never overlap
    top = top.sort_values("start_us")
    assert (top["start_us"].to_numpy()[1:] >= top["end_us"].to_numpy()[:-1] - 1e-6).all()
    assert prof.table()["ms_per_step"].sum() == pytest.approx(
        prof.summary.kernel_us / 1e3 / 3)


def test_the_profilers_start_up_falls_before_the_measured_window(tmp_path):
    # the first range of a profiler session waits ~1 ms before its body runs (1.7 ms on the
    # H200, 4% of a ResNet-50 window); profile_steps opens an empty range first to absorb it
    prof = P.profile_steps(_cpu_step(), steps=2, warmup=0, trace_path=tmp_path / "t.json",
                           cuda=False)
    raw = json.loads(prof.trace_path.read_text())["traceEvents"]
    ranges = sorted((e["ts"], e["name"]) for e in raw
                    if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                    and e["name"] in (P.STEP_MARK, P.PROFILER_START_MARK))
    assert [n for _, n in ranges] == [P.PROFILER_START_MARK, P.STEP_MARK, P.STEP_MARK]
    start = prof.events[prof.events["name"] == P.PROFILER_START_MARK]
    assert float(start["end_us"].max()) <= prof.window[0]
    assert (prof.events["name"] == P.STEP_MARK).sum() == 2


def test_gpu_summary_of_a_cpu_trace_says_to_use_the_cpu_lane():
    ev = P.read_trace({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm",
                                        "ts": 0, "dur": 5, "tid": 1}]})
    with pytest.raises(ValueError, match="lane='cpu'"):
        P.gpu_time_summary(ev)


def test_bad_inputs_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError):
        P.read_trace(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="traceEvents"):
        P.read_trace({"events": []})
    with pytest.raises(ValueError, match="steps >= 1"):
        P.profile_steps(lambda: None, steps=0)
    with pytest.raises(TypeError, match="callable"):
        P.profile_steps(3)
    with pytest.raises(ValueError, match="end > start"):
        P.gpu_time_summary(P.read_trace(_synthetic_trace()), window=(5, 5))


def test_timeline_draws_both_lanes_coloured_by_kind_one_artist_per_kind():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ev = P.read_trace(_synthetic_trace())
    # a big trace: the synthetic kernels repeated 2,000 times
    big = pd_concat_shifted(ev, 2000)
    ax = P.plot_timeline(big)
    # what keeps a big trace fast to draw: one collection per (lane, kind), not one per event
    big_paths = sum(len(c.get_paths()) for c in ax.collections)
    assert len(ax.patches) == 0
    assert len(ax.collections) <= sum(big[big.lane == lane].kind.nunique() for lane in ("cpu", "gpu"))
    small = P.plot_timeline(ev)
    assert big_paths == 2000 * sum(len(c.get_paths()) for c in small.collections) > 0
    ax = P.plot_timeline(ev)
    colours = {tuple(np.round(c.get_facecolor()[0], 3)) for c in ax.collections}
    expected = {tuple(np.round(matplotlib.colors.to_rgba(P.KINDS[k]), 3))
                for k in ("gemm-conv", "elementwise", "reduction", "copy", "nccl")}
    assert expected <= colours
    # the GPU lane sits below the CPU lane
    gemm = [c for c in ax.collections
            if np.allclose(c.get_facecolor()[0], matplotlib.colors.to_rgba(P.KINDS["gemm-conv"]))]
    ys = sorted(p.get_extents().y0 for c in gemm for p in c.get_paths())
    assert ys[0] < 1 <= ys[-1]  # a GPU gemm (y 0.1) and the CPU addmm (y 1.1)
    plt.close("all")


def pd_concat_shifted(ev, n):
    import pandas as pd
    span = float(ev["end_us"].max()) + 10
    return pd.concat([ev.assign(start_us=ev["start_us"] + i * span, end_us=ev["end_us"] + i * span)
                      for i in range(n)], ignore_index=True)


def test_stored_events_give_back_the_same_summary_and_timeline():
    ev = P.read_trace(_synthetic_trace())
    keep = ev[(ev["lane"] == "gpu") | ev["top_level"] | ev["kind"].isin(["launch", "sync"])]
    cols = ["lane", "kind", "start_us", "dur_us", "name"]
    back = P.events_from_table(cols, keep[cols].values.tolist())
    a, b = P.gpu_time_summary(ev), P.gpu_time_summary(back)
    assert (a.window_us, a.busy_us, a.kernel_us) == (b.window_us, b.busy_us, b.kernel_us)
    assert a.by_kind["total_us"].to_dict() == b.by_kind["total_us"].to_dict()
    with pytest.raises(ValueError, match="lack the columns"):
        P.events_from_table(["lane", "kind"], [["gpu", "copy"]])
    with pytest.raises(ValueError, match="'cpu' or 'gpu'"):
        P.events_from_table(cols, [["tpu", "copy", 0, 1, "x"]])


def test_torch_profiler_records_one_cycle_and_hides_only_torchs_false_cycle_warning(monkeypatch):
    import inspect
    import warnings

    from torch.profiler import ProfilerActivity, profile

    real_start = profile.start

    def start(self):  # what torch 2.11 does on a one-cycle CUDA recording
        warnings.warn("Warning: Profiler clears events at the end of each cycle.Only events from "
                      "the current cycle will be reported.", UserWarning)
        warnings.warn("something else went wrong", UserWarning)
        real_start(self)

    monkeypatch.setattr(profile, "start", start)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with torch_profiler([ProfilerActivity.CPU]) as prof:
            torch.ones(3).sum()
            warnings.warn("a warning of the profiled code", UserWarning)
    assert isinstance(prof, profile)
    if "acc_events" in inspect.signature(profile).parameters:
        assert prof.acc_events is True
    assert any(e.name == "aten::sum" for e in prof.events())
    assert sorted(str(w.message) for w in seen) == ["a warning of the profiled code",
                                                   "something else went wrong"]


def test_every_recording_in_the_package_goes_through_torch_profiler():
    """A bare torch.profiler.profile(...) shows learners torch 2.10-2.11's false cycle warning
    (seen on the H200 in notebook 06's CUDA-graph capture); only fp16lab.profile may call it."""
    import re
    from pathlib import Path

    root = Path(fp16lab.__file__).parent
    bare = re.compile(r"\bprofile\(\s*activities\s*=")
    offenders = [str(p.relative_to(root)) for p in sorted(root.rglob("*.py"))
                 if p.relative_to(root).as_posix() != "profile/record.py"
                 and bare.search(p.read_text())]
    assert offenders == []


def test_gpu_kernels_returns_the_cuda_events_of_the_recorded_calls(monkeypatch):
    """The one recording of a step's kernels the distributed engine and its bare loop share."""
    import contextlib
    from types import SimpleNamespace

    calls = []
    ev = lambda name, kind, a, b: SimpleNamespace(name=name, device_type=kind,  # noqa: E731
                                                  time_range=SimpleNamespace(start=a, end=b))
    fake = SimpleNamespace(events=lambda: [ev("ncclAllReduce", "DeviceType.CUDA", 5, 9),
                                           ev("aten::mm", "DeviceType.CPU", 1, 2),
                                           ev("gemm", "DeviceType.CUDA", 1, 4)])

    @contextlib.contextmanager
    def recorder(activities):
        calls.append(("record", [str(a) for a in activities]))
        yield fake
        calls.append("stop")

    monkeypatch.setattr(prof_mod, "torch_profiler", recorder)
    got = prof_mod.gpu_kernels(lambda: calls.append("step"), 2, lambda: calls.append("sync"))
    assert got == [("ncclAllReduce", 5.0, 9.0), ("gemm", 1.0, 4.0)]
    assert calls == ["sync", ("record", ["ProfilerActivity.CUDA"]), "step", "step", "sync", "stop"]


# ------------------------------------------------------------------ bad input (#28)
@pytest.mark.parametrize("starts, ends, words", [
    ([0, 10], [5], "one end per start, got 2 starts and 1 ends"),
    ([0], [5, 20], "one end per start, got 1 starts and 2 ends"),
    ([10], [5], r"interval 0 ends before it starts \(10 to 5 µs\)"),
    ([0, 10, 30], [5, 2, 1], "interval 1 ends before it starts.*2 intervals do"),
    ([0, float("nan")], [5, 10], r"starts\[1\] is nan"),
    ([0, 1], [5, float("inf")], r"ends\[1\] is inf"),
])
def test_busy_time_refuses_intervals_that_do_not_pair_up(starts, ends, words):
    with pytest.raises(ValueError, match=words):
        P.busy_us(starts, ends)


@pytest.mark.parametrize("window, error, words", [
    ((3, 1), ValueError, "window must have end > start"),
    ((float("nan"), 10), ValueError, "window start must be finite"),
    ((0, float("inf")), ValueError, "window end must be finite"),
    ((0,), TypeError, r"window must be \(start_us, end_us\)"),
    (("0", "10"), TypeError, "window start must be a number"),
])
def test_busy_time_refuses_a_window_that_is_not_two_ordered_times(window, error, words):
    with pytest.raises(error, match=words):
        P.busy_us([0], [5], window=window)


def test_busy_time_refuses_times_that_are_not_numbers():
    with pytest.raises(TypeError, match="starts must be a sequence of numbers"):
        P.busy_us(["0", "1"], [5, 6])
    with pytest.raises(TypeError, match="ends must be a sequence of numbers"):
        P.busy_us([0, 1], [[5, 6]])
    assert P.busy_us([], []) == 0.0


def test_summary_and_stored_events_refuse_nan_and_backward_events():
    cols = ["lane", "kind", "start_us", "dur_us", "name"]
    with pytest.raises(ValueError, match=r"stored events: starts must be finite.*starts\[0\] is nan"):
        P.events_from_table(cols, [["gpu", "copy", float("nan"), 1, "x"]])
    with pytest.raises(ValueError, match="stored events: interval 0 ends before it starts"):
        P.events_from_table(cols, [["gpu", "copy", 5, -2, "x"]])
    ev = P.events_from_table(cols, [["gpu", "copy", 0, 4, "x"], ["gpu", "gemm-conv", 2, 6, "y"]])
    assert P.gpu_time_summary(ev).busy_us == 8
    ev.loc[1, "end_us"] = float("nan")
    with pytest.raises(ValueError, match=r"ends\[1\] is nan"):
        P.gpu_time_summary(ev)

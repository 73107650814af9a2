"""The GPU training claims (2, 3, 4, 5) on the CPU: ``train_step_figures`` is replaced by a
table of made-up figures, so each experiment's wiring (which points it asks for, at what size,
and the ratios it forms) is checked by hand; ``train_step_figures`` itself is checked against a
made-up sweep row."""

from __future__ import annotations

import math

import pytest
import torch

from fp16lab.claims import core
from fp16lab.claims import training as T

#: samples/s, step ms and peak GiB of each (precision, layout) the fake returns.
FIGS = {("amp-fp16", "nchw"): (400.0, 5.0, 3.0), ("amp-fp16", "channels_last"): (500.0, 4.0, 2.5),
        ("fp32", "nchw"): (100.0, 20.0, 6.0), ("fp32", "channels_last"): (110.0, 18.0, 6.5),
        ("tf32", "nchw"): (250.0, 8.0, 6.0), ("amp-bf16", "nchw"): (380.0, 5.3, 2.7)}


@pytest.fixture
def asked(monkeypatch):
    calls = []

    def fake(model, precision, layout, batch, steps, telemetry=False):
        calls.append((model, precision, layout, batch, steps, telemetry))
        sps, ms, gib = FIGS[(precision, layout)]
        busy = {"fp32": (50.0, 60.0, 40.0, 85.0), "amp-fp16": (70.0, 90.0, 65.0, 92.0)}.get(
            precision, (0.0, 0.0, 0.0, 0.0))
        return {"samples_per_s": sps, "step_ms": ms, "peak_mem_gib": gib,
                "telemetry": f"nvml {precision}", "gpm_note": f"gpm {precision}",
                "gpu_busy_pct": busy[0], "mem_busy_pct": busy[1], "sm_util_pct": busy[2],
                "dram_bw_util_pct": busy[3]}
    monkeypatch.setattr(T, "train_step_figures", fake)
    monkeypatch.setattr(core, "EXERCISE_ON_CPU", True)
    return calls


def test_train_sizes_by_run(monkeypatch):
    monkeypatch.setattr(core, "EXERCISE_ON_CPU", False)
    assert T._train_sizes(False) == (128, T.sweep.GPU_PROTOCOL.steps)
    assert T._train_sizes(True) == (16, 5)
    monkeypatch.setattr(core, "EXERCISE_ON_CPU", True)
    assert T._train_sizes(False) == T._train_sizes(True) == (2, 2)


def test_channels_last_asks_for_four_points_and_divides(asked):
    f = T.experiment_channels_last(quick=True)
    assert asked == [("small_cnn", p, lay, 2, 2, False) for p in ("amp-fp16", "fp32")
                     for lay in ("nchw", "channels_last")]
    assert f == {"model": "small_cnn", "batch": 2, "amp_nchw_sps": 400.0, "amp_cl_sps": 500.0,
                 "speedup_amp": 1.25, "fp32_nchw_sps": 100.0, "fp32_cl_sps": 110.0,
                 "speedup_fp32": pytest.approx(1.1)}


def test_amp_vs_fp32_figures(asked):
    f = T.experiment_amp_vs_fp32(quick=True)
    assert [(p, lay) for _, p, lay, *_ in asked] == [("fp32", "nchw"), ("tf32", "nchw"),
                                                     ("amp-fp16", "nchw")]
    assert f == {"model": "small_cnn", "batch": 2, "fp32_sps": 100.0, "tf32_sps": 250.0,
                 "amp-fp16_sps": 400.0, "fp32_peak_gib": 6.0, "tf32_peak_gib": 6.0,
                 "amp-fp16_peak_gib": 3.0, "speedup_vs_fp32": 4.0, "speedup_vs_tf32": 1.6,
                 "memory_saving": 0.5}


def test_utilisation_times_enough_steps_to_cover_nvmls_window(asked):
    f = T.experiment_utilisation(quick=True)
    # 0.05 s at 20 ms (fp32) is 3 steps, at 5 ms (AMP) 10 steps; at least the 2 timed steps
    assert asked == [("small_cnn", "fp32", "nchw", 2, 2, False),
                     ("small_cnn", "fp32", "nchw", 2, 3, True),
                     ("small_cnn", "amp-fp16", "nchw", 2, 2, False),
                     ("small_cnn", "amp-fp16", "nchw", 2, 10, True)]
    assert f == {"model": "small_cnn", "batch": 2, "seconds": 0.05,
                 "fp32_telemetry": "nvml fp32", "fp32_gpm_note": "gpm fp32",
                 "fp32_sm_util_pct": 40.0, "fp32_dram_bw_util_pct": 85.0,
                 "fp32_gpu_busy_pct": 50.0, "fp32_mem_busy_pct": 60.0,
                 "amp-fp16_telemetry": "nvml amp-fp16", "amp-fp16_gpm_note": "gpm amp-fp16",
                 "amp-fp16_sm_util_pct": 65.0, "amp-fp16_dram_bw_util_pct": 92.0,
                 "amp-fp16_gpu_busy_pct": 70.0, "amp-fp16_mem_busy_pct": 90.0}


def test_bf16_memory_figures(asked):
    from fp16lab.models import build_model, input_shape
    f = T.experiment_bf16_memory(quick=True)
    assert [(p, lay, b, s) for _, p, lay, b, s, _ in asked] == [("amp-fp16", "nchw", 2, 2),
                                                                ("amp-bf16", "nchw", 2, 2)]
    n = sum(p.numel() for p in build_model("transformer_block").parameters())
    assert f["fp16_element_bytes"] == f["bf16_element_bytes"] == 2
    assert f["fp16_param_bytes"] == f["bf16_param_bytes"] == 2 * n
    assert (f["model"], f["batch"], f["fp16_peak_gib"], f["bf16_peak_gib"]) == (
        "small_cnn", 2, 3.0, 2.7)
    if core._autocast_dtype("cpu") == torch.float16:
        torch.manual_seed(0)
        model = build_model("transformer_block")
        x = torch.randn(input_shape("transformer_block", 2))
        assert f["fp16_saved_bytes"] == core.saved_activation_bytes(
            model, x, autocast_dtype=torch.float16)
        assert f["bf16_saved_bytes"] == core.saved_activation_bytes(
            model, x, autocast_dtype=torch.bfloat16)


@pytest.fixture
def one_row(monkeypatch):
    T.train_step_figures.cache_clear()
    seen = []
    row = {"status": "ok", "error": "", "step_ms_median": 12.5, "spread": 0.02,
           "samples_per_s": 160.0, "peak_mem_allocated_mb": 2048.0, "telemetry_note": "",
           "telemetry_samples": 7, "gpu_busy_mean": 55.0, "mem_busy_mean": 66.0,
           "sm_util_mean": 44.0, "dram_bw_util_mean": 77.0, "gpm_note": None}

    def measure(point, warmup, steps, telemetry):
        seen.append((point, warmup, steps, telemetry))
        return dict(row)
    monkeypatch.setattr(T.sweep, "measure_point", measure)
    monkeypatch.setattr(core, "EXERCISE_ON_CPU", True)
    yield seen, row
    T.train_step_figures.cache_clear()


def test_train_step_figures_reads_the_sweeps_row(one_row):
    seen, _ = one_row
    got = T.train_step_figures("small_cnn", "amp-fp16", "channels_last", 8, 3, telemetry=True)
    point, warmup, steps, telemetry = seen[0]
    assert (point.model, point.precision, point.layout, point.batch, point.device) == (
        "small_cnn", "amp-fp16", "channels_last", 8, "cpu")
    assert point.cudnn_benchmark == T.sweep.GPU_PROTOCOL.cudnn_benchmark
    assert (warmup, steps, telemetry) == (T.sweep.GPU_PROTOCOL.warmup, 3, True)
    assert got == {"model": "small_cnn", "precision": "amp-fp16", "layout": "channels_last",
                   "batch": 8, "step_ms": 12.5, "spread": 0.02, "samples_per_s": 160.0,
                   "peak_mem_gib": 2.0, "telemetry": "nvml", "telemetry_samples": 7,
                   "gpu_busy_pct": 55.0, "mem_busy_pct": 66.0, "sm_util_pct": 44.0,
                   "dram_bw_util_pct": 77.0, "gpm_note": ""}
    T.train_step_figures("small_cnn", "amp-fp16", "channels_last", 8, 3, telemetry=True)
    assert len(seen) == 1  # cached: claims sharing a point run it once


def test_train_step_figures_without_a_peak_or_a_good_row(one_row):
    seen, row = one_row
    row.update(peak_mem_allocated_mb=None, telemetry_note="no NVML here", gpm_note="no GPM")
    got = T.train_step_figures("mlp", "fp32", "nchw", 4, 2)
    assert math.isnan(got["peak_mem_gib"]) and got["telemetry"] == "no NVML here"
    assert got["gpm_note"] == "no GPM" and seen[-1][3] is False
    row.update(status="oom", error="out of memory at batch 4")
    with pytest.raises(RuntimeError) as e:
        T.train_step_figures("mlp", "fp32", "nchw", 4, 5)
    assert "ended with oom: out of memory at batch 4" in str(e.value)
    assert str(e.value).startswith("training point mlp")


def test_train_step_figures_needs_a_gpu_unless_exercised(monkeypatch):
    T.train_step_figures.cache_clear()
    monkeypatch.setattr(core, "EXERCISE_ON_CPU", False)
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(RuntimeError, match="train_step_figures needs a CUDA GPU; torch sees none"):
        T.train_step_figures("mlp", "fp32", "nchw", 4, 2)


def test_the_verdicts_name_the_batch_and_layout_they_measured():
    """Claims 2, 4 and 5 say at which batch (and, for 4 and 5, in which layout) the CNN was
    trained; a file recorded before the batch was a figure says neither."""
    cl = {"model": "resnet50", "batch": 128, "speedup_amp": 1.86, "speedup_fp32": 0.99}
    assert T.judge_channels_last(cl)[1] == (
        "only under AMP fp16. resnet50 training at batch 128, channels_last/NCHW: AMP fp16 "
        "1.86x, fp32 0.99x")
    del cl["batch"]
    assert "resnet50 training, channels_last/NCHW" in T.judge_channels_last(cl)[1]
    amp = {"model": "resnet50", "batch": 128, "speedup_vs_fp32": 2.84, "speedup_vs_tf32": 1.3,
           "memory_saving": 0.5}
    assert T.judge_amp_vs_fp32(amp)[1].endswith(
        "resnet50 at batch 128, NCHW: AMP fp16 is 2.84x fp32 (TF32 off), 1.30x TF32; peak "
        "memory 50% lower")
    util = {"model": "resnet50", "batch": 128, "fp32_sm_util_pct": 50.0,
            "amp-fp16_sm_util_pct": 70.0, "fp32_dram_bw_util_pct": 85.0,
            "amp-fp16_dram_bw_util_pct": 90.0}
    assert "read GPM SM utilisation and DRAM bandwidth utilisation while resnet50 trained at " \
           "batch 128, NCHW: SM fp32 50% -> AMP 70%" in T.judge_utilisation(util)[1]
    del util["batch"], util["model"]
    assert "read GPM SM utilisation and DRAM bandwidth utilisation: SM fp32" in \
        T.judge_utilisation(util)[1]

"""fp16lab.bench.profile_step: its point list and the figures it derives, on hand-made rows."""

from __future__ import annotations

import pytest

from fp16lab.bench import profile_step


@pytest.fixture(scope="module")
def bench():
    return profile_step


def test_gpu_points_cover_the_issue_grid_with_compile_last(bench):
    pts = bench.points(cuda=True, quick=False)
    keys = {(p["model"], p["batch"], p["precision"], p["execution"]) for p in pts}
    for ex in ("eager", "cuda-graph", "compile"):
        assert ("resnet50", 64, "amp-fp16", ex) in keys
        for m in ("small_cnn", "transformer_block"):
            for prec in ("fp32", "amp-fp16"):
                assert (m, 64, prec, ex) in keys
    assert ("resnet50", 256, "amp-fp16", "eager") in keys
    kinds = [p["execution"] == "compile" for p in pts]
    assert kinds == sorted(kinds), "compile points must come last (they may be cut by the budget)"
    assert all(p["layout"] == "channels_last" for p in pts if p["model"] == "resnet50")
    modes = [(p["model"], p["batch"], p["precision"], p["mode"]) for p in pts]
    assert len(modes) == len(set(modes)), "two points share a label"
    assert ("resnet50", 64, "amp-fp16", "eager + fused SGD") in modes
    assert ("small_cnn", 64, "fp32", "eager + fused SGD") in modes


def test_cpu_points_stand_small_cnn_in_for_resnet50_and_skip_cuda_graphs(bench):
    for quick in (True, False):
        pts = bench.points(cuda=False, quick=quick)
        assert not any(p["model"] == "resnet50" or p["execution"] == "cuda-graph" for p in pts)
        assert any(p["role"].startswith("resnet50 stand-in") for p in pts)


def _row(model, batch, precision, execution, sps, **kw):
    return dict(model=model, batch=batch, precision=precision, execution=execution,
                samples_per_s=sps, status="ok",
                role=f"resnet50 b{batch}" if model == "resnet50" else "amp vs fp32", **kw)


def test_targets_are_the_ratios_of_this_run(bench):
    rows = [
        _row("resnet50", 64, "amp-fp16", "eager", 3000.0, idle_fraction=0.6, spread=0.1,
             kernel_ms_per_step=12.0, step_ms=21.3),
        _row("resnet50", 64, "amp-fp16", "cuda-graph", 5000.0, idle_fraction=0.02, spread=0.01,
             kernel_ms_per_step=12.5, step_ms=12.8),
        _row("resnet50", 256, "amp-fp16", "eager", 5800.0),
        _row("small_cnn", 64, "fp32", "eager", 30000.0),
        _row("small_cnn", 64, "amp-fp16", "eager", 22000.0),
        _row("small_cnn", 64, "fp32", "cuda-graph", 90000.0),
        _row("small_cnn", 64, "amp-fp16", "cuda-graph", 120000.0),
        {**_row("small_cnn", 64, "amp-fp16", "compile", 0.0), "status": "skipped"},
        {**_row("small_cnn", 64, "amp-fp16", "eager", 95000.0), "mode": "eager + fused SGD"},
    ]
    t = bench.targets(rows)
    assert t["small_batch_best"]["execution"] == "cuda-graph"
    assert t["small_best_over_large_eager"] == pytest.approx(5000 / 5800)
    assert t["small_kernel_time_ceiling_samples_per_s"] == pytest.approx(64 / 0.0125)
    assert t["small_best_over_ceiling"] == pytest.approx(5000 / (64 / 0.0125))
    # the fused-SGD eager row has no fp32 partner: no ratio, and it does not replace plain eager
    assert t["amp_over_fp32_by_execution"]["small_cnn"] == pytest.approx(
        {"eager": 22000 / 30000, "cuda-graph": 120000 / 90000})
    assert t["best_amp_over_best_fp32"]["small_cnn"] == pytest.approx(120000 / 90000)


@pytest.mark.parametrize("gpu, stem", [
    (None, "where_time_goes_cpu"), ("NVIDIA H200", "where_time_goes_h200"),
    ("NVIDIA H100 80GB HBM3", "where_time_goes_h100"),
    ("NVIDIA GeForce RTX 4090", "where_time_goes_nvidia_geforce_rtx_4090"),
])
def test_result_file_is_named_after_the_device(bench, gpu, stem):
    assert bench.default_name(gpu) == stem


def test_the_ceiling_comes_from_the_fused_eager_trace_when_the_graph_trace_is_incomplete(bench):
    rows = [
        {**_row("resnet50", 64, "amp-fp16", "eager", 4000.0, kernel_ms_per_step=12.0,
                idle_fraction=0.3, spread=0.01, step_ms=16.0), "mode": "eager + fused SGD"},
        _row("resnet50", 64, "amp-fp16", "cuda-graph", 5000.0, idle_fraction=0.9, spread=0.01,
             kernel_ms_per_step=1.0, step_ms=12.8, trace_note="the trace covers 8%"),
        _row("resnet50", 256, "amp-fp16", "eager", 5800.0),
    ]
    t = bench.targets(rows)
    assert t["small_kernel_time_from"] == "eager + fused SGD"
    assert t["small_kernel_time_ceiling_samples_per_s"] == pytest.approx(64 / 0.012)

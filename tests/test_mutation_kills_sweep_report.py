"""fp16lab.sweep.report, beyond tests/test_sweep.py: every column of a point's summary against a
hand computation over its repeats (the memory, telemetry and multi-GPU columns no test read)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fp16lab import sweep


def _row(repeat, ms, status="ok", **kw):
    r = dict.fromkeys(sweep.ROW_COLUMNS)
    r.update(key="p", model="small_cnn", batch=8, layout="nchw", precision="fp32", device="cpu",
             repeat=repeat, status=status, error="" if status == "ok" else f"boom {repeat}",
             step_ms_median=ms, spread=0.01 * (repeat + 1), tolerance=0.03, cudnn_benchmark=False,
             warmup=3, steps=10, elapsed_s=1.0, finished_at="2026-01-01T00:00:00+00:00")
    r.update(kw)
    return r


def test_each_summary_column_by_hand():
    rows = pd.DataFrame([
        _row(0, 10.0, peak_mem_allocated_mb=100.0, peak_mem_reserved_mb=120.0, power_w_mean=300.0,
             gpu_busy_mean=90.0, final_scale=1024.0, skipped_steps=1.0),
        _row(1, 12.0, peak_mem_allocated_mb=140.0, peak_mem_reserved_mb=150.0, power_w_mean=None,
             gpu_busy_mean=80.0, final_scale=2048.0, skipped_steps=3.0),
        _row(2, 11.0, peak_mem_allocated_mb=None, peak_mem_reserved_mb=110.0, power_w_mean=500.0,
             gpu_busy_mean=70.0, final_scale=4096.0, skipped_steps=2.0),
        _row(3, None, status="oom"), _row(4, None, status="error"),
    ])
    s = sweep.summarize_results(rows).set_index("key").loc["p"]
    assert s["repeats"] == 3 and s["status"] == "oom" and s["error"] == "boom 3"  # the first failure
    assert s["step_ms"] == 11.0  # the median of 10, 12, 11
    assert s["samples_per_s"] == pytest.approx(8 / 0.011)
    assert s["spread"] == pytest.approx(0.02)  # the median of 0.01, 0.02, 0.03
    assert s["repeat_spread"] == pytest.approx((12 - 10) / 11)
    assert bool(s["unstable"]) is True  # 0.18 > 0.03
    assert s["peak_mem_allocated_mb"] == 140.0 and s["peak_mem_reserved_mb"] == 150.0  # the max
    assert s["power_w_mean"] == pytest.approx(400.0)  # the mean of the repeats that have it
    assert s["gpu_busy_mean"] == pytest.approx(80.0)
    assert s["final_scale"] == pytest.approx((1024 + 2048 + 4096) / 3)
    assert s["skipped_steps"] == pytest.approx(2.0)
    assert s["sm_util_mean"] is None or math.isnan(s["sm_util_mean"])  # never measured
    assert (s["warmup"], s["steps"]) == (3, 10)


def test_samples_per_s_counts_every_gpu_and_one_repeat_has_no_spread():
    rows = pd.DataFrame([_row(0, 20.0, gpus=2)])
    s = sweep.summarize_results(rows).iloc[0]
    assert s["samples_per_s"] == pytest.approx(8 * 2 / 0.020)
    assert s["repeat_spread"] == 0.0 and not s["unstable"] and s["status"] == "ok"
    assert s["peak_mem_allocated_mb"] is None or math.isnan(s["peak_mem_allocated_mb"])


def test_a_point_whose_every_repeat_failed_has_no_timing():
    s = sweep.summarize_results(pd.DataFrame([_row(0, None, status="error")])).iloc[0]
    assert s["repeats"] == 0 and s["status"] == "error" and not s["unstable"]
    assert pd.isna(s["step_ms"]) and pd.isna(s["samples_per_s"])


def test_a_given_tolerance_overrides_the_recorded_one():
    rows = pd.DataFrame([_row(0, 10.0), _row(1, 10.4)])  # spread 0.4 / 10.2 = 0.039
    assert bool(sweep.summarize_results(rows).iloc[0]["unstable"]) is True
    assert bool(sweep.summarize_results(rows, tolerance=0.04).iloc[0]["unstable"]) is False
    loose = pd.DataFrame([_row(0, 10.0, tolerance=0.05), _row(1, 10.4, tolerance=0.05)])
    assert bool(sweep.summarize_results(loose).iloc[0]["unstable"]) is False

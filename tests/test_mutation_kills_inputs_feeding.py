"""fp16lab.inputs.feeding, beyond tests/test_inputs_feeding.py: what mutation testing found unchecked.

Each test states a behaviour against an oracle of its own (a counted call, a slow step made
visible on the host clock, a ratio worked out by hand), not against the code's own output.
"""

from __future__ import annotations

import inspect

import time

import pytest

from fp16lab.inputs import feeding
from fp16lab.inputs.settings import InputSettings

SLOW_S = 0.5
FAST_S = 0.005


def _defaults(func):
    """The keyword-only defaults, read from the signature (mutation testing wraps the
    function, which leaves __kwdefaults__ empty but keeps the signature)."""
    return {n: p.default for n, p in inspect.signature(func).parameters.items()
            if p.kind is p.KEYWORD_ONLY}



def _slow_first(calls: list[float]):
    """A step whose first call sleeps SLOW_S (a cold start), the others FAST_S."""
    def one():
        time.sleep(SLOW_S if not calls else FAST_S)
        calls.append(time.perf_counter())
    return one


def test_a_slow_first_step_in_the_warm_up_is_left_out_of_the_rate():
    calls: list[float] = []
    row: dict = {}
    feeding._timed(row, "cpu", 1, 6, 8, _slow_first(calls))
    assert len(calls) == 1 + 6 and row["warmup"] == 1 and row["timed_steps"] == 6
    # 6 fast steps take about 30 ms; the 500 ms step must not be in the window
    assert row["seconds"] < SLOW_S / 2
    assert row["images_per_s"] > 6 * 8 / (SLOW_S / 2)


def test_without_a_warm_up_the_slow_step_is_in_the_window():
    """The oracle of the test above: the same step, no warm-up, and the slow step shows."""
    calls: list[float] = []
    row: dict = {}
    feeding._timed(row, "cpu", 0, 6, 8, _slow_first(calls))
    assert len(calls) == 6 and row["seconds"] >= SLOW_S
    assert row["images_per_s"] == pytest.approx(6 * 8 / row["seconds"])


class _Pipeline:
    """A stand-in for an input pipeline: counts its batches, the first one slow."""

    implementation = "fake"

    def __init__(self):
        self.calls: list[float] = []
        self.one = _slow_first(self.calls)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __next__(self):
        self.one()
        return None

    def stage_seconds(self):
        return {"batches": len(self.calls), "read_s": 0.001 * len(self.calls)}


def test_measure_loader_warms_up_before_it_times(monkeypatch):
    made = []

    def fake_make_input(settings, root, device):
        made.append(_Pipeline())
        return made[-1]

    monkeypatch.setattr(feeding, "make_input", fake_make_input)
    monkeypatch.setattr(feeding, "unavailable_reason", lambda backend, device: None)
    row = feeding.measure_loader(InputSettings("synthetic", batch=4), device="cpu", warmup=2, steps=5)
    assert row["status"] == "ok" and row["implementation"] == "fake"
    assert len(made[0].calls) == 2 + 5 and row["timed_steps"] == 5 and row["warmup"] == 2
    assert row["seconds"] < SLOW_S / 2 and row["images_per_s"] > 5 * 4 / (SLOW_S / 2)
    # 5 batches made in the window, each 1 ms of reading: 1 ms per batch
    assert row["stage_ms_per_batch"] == {"read": pytest.approx(1.0)}
    assert _defaults(feeding.measure_loader) == {"device": "cuda", "warmup": 3, "steps": 10,
                                                     "min_seconds": 0.0}


# ------------------------------------------------------------------ every cell of the tables


def _train(backend, precision, ips, normalize_on="cpu", status="ok", workers=12, optimizer="sgd"):
    return {"measure": "training", "backend": backend, "precision": precision, "images_per_s": ips,
            "normalize_on": normalize_on, "status": status, "num_workers": workers,
            "optimizer": optimizer}


def _load(backend, workers, ips, busy, util, normalize_on="cpu", impl="x"):
    return {"measure": "loader", "backend": backend, "num_workers": workers, "images_per_s": ips,
            "normalize_on": normalize_on, "status": "ok", "cpu_cores_busy": busy,
            "cpu_util_pct": util, "implementation": impl, "precision": None}


ROWS = [_train("synthetic", "fp32", 500.0), _train("synthetic", "amp-fp16", 2000.0),
        _train("synthetic", "amp-bf16", 1600.0),
        _train("dataloader", "fp32", 400.0), _train("dataloader", "amp-fp16", 800.0),
        _train("dataloader", "amp-bf16", 1000.0, normalize_on="gpu"),
        _train("gpu-decode", "amp-fp16", 1500.0), _train("gpu-decode", "amp-fp16", 1800.0),
        _load("dataloader", 12, 900.0, 10.5, 65.625, impl="torch DataLoader"),
        _load("dataloader", 4, 350.0, 3.5, 21.875, impl="torch DataLoader"),
        _load("gpu-decode", 8, 2500.0, 2.0, 12.5, impl="nvjpeg")]


def test_every_share_is_the_rate_over_the_synthetic_rate_of_its_column():
    t = feeding.training_table(ROWS)
    by_hand = {("synthetic", "fp32"): 500 / 500, ("dataloader", "fp32"): 400 / 500,
               ("synthetic", "amp-fp16"): 2000 / 2000, ("dataloader", "amp-fp16"): 800 / 2000,
               ("gpu-decode", "amp-fp16"): 1800 / 2000,  # the best of its two rows
               ("dataloader uint8", "amp-bf16"): 1000 / 1600, ("synthetic", "amp-bf16"): 1.0}
    for (row, col), share in by_hand.items():
        assert t.loc[row, f"{col} share"] == pytest.approx(share), (row, col)
    assert t.loc["gpu-decode", "amp-fp16"] == 1800.0
    assert t[["fp32", "amp-fp16", "amp-bf16"]].notna().sum().sum() == 7  # 7 (input, precision) pairs


def test_every_speed_up_is_the_rate_over_fp32s_rate_of_the_same_input():
    s = feeding.speedup_table(ROWS)
    assert list(s.columns) == ["amp-fp16 / fp32", "amp-bf16 / fp32"]
    assert s.loc["synthetic", "amp-fp16 / fp32"] == pytest.approx(2000 / 500)
    assert s.loc["synthetic", "amp-bf16 / fp32"] == pytest.approx(1600 / 500)
    assert s.loc["dataloader", "amp-fp16 / fp32"] == pytest.approx(800 / 400)
    assert s.isna().loc["gpu-decode"].all()  # no fp32 row for gpu-decode: nothing to divide by
    over = feeding.speedup_table(ROWS, over="amp-fp16")
    assert over.loc["synthetic", "fp32 / amp-fp16"] == pytest.approx(500 / 2000)
    assert over.loc["dataloader", "fp32 / amp-fp16"] == pytest.approx(400 / 800)


def test_every_column_of_the_loader_table():
    t = feeding.loader_table(ROWS)
    assert list(t.columns) == ["input", "num_workers", "images_per_s", "cpu_cores_busy",
                               "cpu_util_pct", "implementation"]
    assert t.to_dict("records") == [
        {"input": "dataloader", "num_workers": 4, "images_per_s": 350.0, "cpu_cores_busy": 3.5,
         "cpu_util_pct": 21.875, "implementation": "torch DataLoader"},
        {"input": "dataloader", "num_workers": 12, "images_per_s": 900.0, "cpu_cores_busy": 10.5,
         "cpu_util_pct": 65.625, "implementation": "torch DataLoader"},
        {"input": "gpu-decode", "num_workers": 8, "images_per_s": 2500.0, "cpu_cores_busy": 2.0,
         "cpu_util_pct": 12.5, "implementation": "nvjpeg"}]

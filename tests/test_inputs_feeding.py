"""The tables and plot notebook 07 reads from measured rows, against figures worked out by hand."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from fp16lab.inputs.feeding import (input_label, loader_table, plot_training,  # noqa: E402
                                    speedup_table, training_table)


def _train(backend, precision, ips, normalize_on="cpu", status="ok", workers=12, optimizer="sgd"):
    return {"measure": "training", "backend": backend, "precision": precision, "images_per_s": ips,
            "normalize_on": normalize_on, "status": status, "num_workers": workers,
            "optimizer": optimizer}


def _load(backend, workers, ips, normalize_on="cpu"):
    return {"measure": "loader", "backend": backend, "num_workers": workers, "images_per_s": ips,
            "normalize_on": normalize_on, "status": "ok", "cpu_cores_busy": workers * 0.9,
            "cpu_util_pct": workers * 0.9 / 16 * 100, "implementation": "x", "precision": None}


ROWS = [
    _train("synthetic", "fp32", 600.0), _train("synthetic", "amp-fp16", 3000.0),
    _train("dataloader", "fp32", 590.0), _train("dataloader", "amp-fp16", 800.0),
    _train("dataloader", "amp-fp16", 1200.0, normalize_on="gpu"),
    _train("gpu-decode", "amp-fp16", 2900.0), _train("gpu-decode", "fp32", 0.0, status="error"),
    _train("dali", "amp-fp16", None, status="skipped"),
    _load("dataloader", 4, 300.0), _load("dataloader", 12, 850.0), _load("dataloader", 12, 1300.0, "gpu"),
]


def test_input_label():
    assert input_label(_train("dataloader", "fp32", 1, "gpu")) == "dataloader uint8"
    assert input_label(_train("gpu-decode", "fp32", 1, "gpu")) == "gpu-decode"
    assert input_label({**_train("gpu-decode", "fp32", 1), "cpu_decode_share": 0.25}) == "gpu-decode + 25% CPU"
    assert input_label({**_train("dataloader", "fp32", 1), "cpu_decode_share": 0.25}) == "dataloader"
    assert input_label({**_train("hw-decode", "fp32", 1), "cpu_decode_share": 0.25}) == "hw-decode + 25% CPU"


def test_training_table_pivots_ok_rows_and_shares():
    t = training_table(ROWS)
    assert list(t.columns) == ["fp32", "amp-fp16", "fp32 share", "amp-fp16 share"]
    assert set(t.index) == {"synthetic", "dataloader", "dataloader uint8", "gpu-decode"}
    assert t.loc["dataloader", "amp-fp16"] == 800.0 and t.loc["dataloader uint8", "amp-fp16"] == 1200.0
    assert t.loc["gpu-decode", "amp-fp16 share"] == pytest.approx(2900 / 3000)
    assert t.loc["dataloader", "fp32 share"] == pytest.approx(590 / 600)
    assert t.isna().loc["gpu-decode", "fp32"]  # the error row is not a measurement


FUSED = ROWS + [_train("synthetic", "amp-fp16", 3300.0, optimizer="sgd-fused"),
                _train("gpu-decode", "amp-fp16", 3135.0, optimizer="sgd-fused"),
                _train("synthetic", "amp-bf16", 2500.0)]


def test_an_optimizer_other_than_sgd_is_a_column_of_its_own():
    t = training_table(FUSED)
    assert list(t.columns) == ["fp32", "amp-fp16", "amp-fp16 sgd-fused", "amp-bf16", "fp32 share",
                               "amp-fp16 share", "amp-fp16 sgd-fused share", "amp-bf16 share"]
    assert t.loc["gpu-decode", "amp-fp16"] == 2900.0  # the sgd row, not the fused one
    assert t.loc["gpu-decode", "amp-fp16 sgd-fused share"] == pytest.approx(3135 / 3300)
    assert t.loc["gpu-decode", "amp-fp16 share"] == pytest.approx(2900 / 3000)
    s = speedup_table(FUSED)
    assert s.loc["synthetic", "amp-fp16 sgd-fused / fp32"] == pytest.approx(3300 / 600)
    from fp16lab.inputs.feeding import summary_lines
    assert ("amp-fp16 sgd-fused: the model alone trains at 3300 images/s; the fastest real input, "
            "gpu-decode, reaches 3135 (95% of it)") in summary_lines(FUSED)
    plot_training(FUSED)
    older = {k: v for k, v in _train("dataloader", "amp-bf16", 1234.0, "gpu").items() if k != "optimizer"}
    t = training_table(FUSED + [older])  # a row from before the optimizer field counts as sgd
    assert t.loc["dataloader uint8", "amp-bf16"] == 1234.0 and not any("nan" in str(c) for c in t.columns)


def test_speedup_table():
    s = speedup_table(ROWS)
    assert list(s.columns) == ["amp-fp16 / fp32"]
    assert s.loc["synthetic", "amp-fp16 / fp32"] == pytest.approx(5.0)
    assert s.loc["dataloader", "amp-fp16 / fp32"] == pytest.approx(800 / 590)
    with pytest.raises(ValueError, match="no ok training rows in precision 'tf32'"):
        speedup_table(ROWS, over="tf32")


def test_loader_table_and_plot():
    t = loader_table(ROWS)
    assert list(t["input"]) == ["dataloader", "dataloader", "dataloader uint8"]
    assert list(t["num_workers"]) == [4, 12, 12]
    fig = plot_training(ROWS)
    ax = fig.axes[0]
    heights = sorted(round(p.get_height()) for p in ax.patches if p.get_height() == p.get_height())
    assert 3000 in heights and 2900 in heights and 1200 in heights
    ticks = sorted(float(y) for c in ax.collections for seg in c.get_segments() for y in {seg[0][1]})
    assert ticks == [850.0, 850.0, 1300.0, 1300.0]  # the 12-worker loader rates, one tick per precision
    with pytest.raises(ValueError, match="no ok training rows"):
        plot_training([_load("dataloader", 4, 1.0)])


def test_summary_lines_say_what_the_rows_say():
    from fp16lab.inputs.feeding import summary_lines

    lines = summary_lines(ROWS)
    assert lines[0] == ("fp32: the model alone trains at 600 images/s; the fastest real input, "
                        "dataloader, reaches 590 (98% of it)")
    assert lines[1].startswith("amp-fp16: the model alone trains at 3000 images/s; the fastest "
                               "real input, gpu-decode, reaches 2900 (97% of it)")
    assert "amp-fp16 over fp32 with synthetic input: 5.00x" in lines
    assert f"amp-fp16 over fp32 with dataloader input: {800 / 590:.2f}x" in lines
    assert summary_lines([_load("dataloader", 4, 1.0)]) == [
        "no ok training rows with synthetic input to compare with"]


# ------------------------------------------------------------------ the timed window


def test_timed_window_runs_at_least_steps_and_min_seconds():
    import time

    from fp16lab.inputs.feeding import _timed

    calls = []
    row = {}
    _timed(row, "cpu", 2, 3, 8, lambda: calls.append(time.sleep(0.01)))
    assert len(calls) == 5 and row["timed_steps"] == 3 and row["warmup"] == 2
    assert row["images_per_s"] == pytest.approx(3 * 8 / row["seconds"])
    assert "stage_ms_per_batch" not in row
    calls.clear()
    _timed(row, "cpu", 0, 1, 8, lambda: calls.append(time.sleep(0.01)), min_seconds=0.2)
    assert row["seconds"] >= 0.2 and row["timed_steps"] == len(calls) > 1
    assert row["images_per_s"] == pytest.approx(len(calls) * 8 / row["seconds"])


def test_timed_window_reports_the_producers_stages_per_batch():
    from fp16lab.inputs.feeding import _timed

    count = {"batches": 0, "read_s": 0.0, "decode_s": 0.0}

    def one():  # each batch costs 2 ms of reading and 5 ms of decoding, twice per step
        count["batches"] += 2
        count["read_s"] += 0.004
        count["decode_s"] += 0.010

    row = {}
    _timed(row, "cpu", 3, 4, 8, one, stages=lambda: dict(count))
    assert row["stage_ms_per_batch"] == pytest.approx({"read": 2.0, "decode": 5.0})


@pytest.mark.parametrize("kw, match", [(dict(min_seconds=-1.0), "min_seconds must be a finite"),
                                       (dict(min_seconds=float("inf")), "min_seconds must be a finite"),
                                       (dict(steps=0), "steps >= 1")])
def test_measure_refuses_bad_windows(kw, match):
    from fp16lab.inputs.feeding import measure_loader
    from fp16lab.inputs import InputSettings

    with pytest.raises(ValueError, match=match):
        measure_loader(InputSettings("synthetic", batch=2), device="cpu", **{"steps": 2, **kw})

"""The sweep engine: validation, grid, interleaving, flags, OOM/failure/interrupt handling, resume."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fp16lab import sweep
from fp16lab.models import build_model, input_shape
from fp16lab.sweep import Point, ScalerSettings, SweepSpec, engine, steps


def tiny(**kw) -> SweepSpec:
    base = dict(models=("mlp",), batches=(2, 4), layouts=("nchw",), precisions=("fp32",),
                device="cpu", warmup=0, steps=2, repeats=2, telemetry=False)
    base.update(kw)
    return SweepSpec(**base)


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kw, words", [
    (dict(models=("resnet9000",)), ["resnet9000", "small_cnn", "transformer_block"]),
    (dict(layouts=("nhwc",)), ["nhwc", "nchw", "channels_last"]),
    (dict(precisions=("fp8",)), ["fp8", "amp-fp16", "amp-bf16", "tf32"]),
    (dict(batches=(8, 0)), ["positive", "0"]),
    (dict(batches=(-4,)), ["positive", "-4"]),
    (dict(batches=(2.5,)), ["positive", "2.5"]),
    (dict(batches=(True,)), ["positive", "True"]),
    (dict(batches=()), ["at least one batch"]),
    (dict(models=()), ["at least one model"]),
    (dict(layouts=()), ["at least one layout"]),
    (dict(precisions=()), ["at least one precision"]),
    (dict(models=("transformer_block",), layouts=("channels_last",)), ["image models"]),
    (dict(repeats=0), ["repeats"]),
    (dict(steps=0), ["steps"]),
    (dict(warmup=-1), ["warmup"]),
    (dict(tolerance=0.0), ["tolerance"]),
    (dict(device="tpu"), ["'auto', 'cpu' or 'cuda'"]),
])
def test_bad_spec_is_refused_with_what_is_allowed(kw, words):
    with pytest.raises(ValueError) as e:
        tiny(**kw)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("kw, word", [
    (dict(init_scale=0.0), "init_scale"), (dict(init_scale=-1.0), "init_scale"),
    (dict(init_scale=math.inf), "init_scale"), (dict(init_scale=math.nan), "init_scale"),
    (dict(growth_factor=1.0), "growth_factor"), (dict(growth_factor=0.5), "growth_factor"),
    (dict(backoff_factor=1.0), "backoff_factor"), (dict(backoff_factor=0.0), "backoff_factor"),
    (dict(growth_interval=0), "growth_interval"), (dict(growth_interval=2.5), "growth_interval"),
])
def test_scaler_settings_out_of_range_are_refused(kw, word):
    with pytest.raises(ValueError, match=word):
        ScalerSettings(**kw)


def test_cuda_without_gpu_is_refused_before_running():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="no CUDA GPU"):
        tiny(device="cuda")


def test_point_refuses_channels_last_for_a_non_image_model():
    with pytest.raises(ValueError, match="image models only"):
        Point("transformer_block", 8, "channels_last")


# --------------------------------------------------------------------------- the grid

def test_grid_is_the_product_with_layouts_and_scalers_only_where_they_apply():
    scalers = (ScalerSettings(), ScalerSettings(init_scale=1024.0))
    spec = tiny(models=("small_cnn", "transformer_block"), batches=(2, 4),
                layouts=("nchw", "channels_last"), precisions=("fp32", "amp-fp16"), scalers=scalers)
    got = {(p.model, p.batch, p.layout, p.precision, p.scaler.init_scale if p.scaler else None)
           for p in spec.points()}
    want = set()
    for m, b, lay, prec in itertools.product(spec.models, spec.batches, spec.layouts, spec.precisions):
        if lay == "channels_last" and m != "small_cnn":
            continue
        for s in (scalers if prec == "amp-fp16" else (None,)):
            want.add((m, b, lay, prec, s.init_scale if s else None))
    assert got == want
    assert len(spec.points()) == len(want)  # no duplicates


def test_point_keys_are_stable_and_distinguish_settings():
    a = Point("small_cnn", 8, "nchw", "amp-fp16", ScalerSettings(), device="cpu")
    b = Point("small_cnn", 8, "nchw", "amp-fp16", None, device="cpu")  # default scaler filled in
    c = Point("small_cnn", 8, "nchw", "amp-fp16", ScalerSettings(init_scale=2.0), device="cpu")
    d = Point("small_cnn", 8, "nchw", "fp32", ScalerSettings(init_scale=2.0), device="cpu")
    e = Point("small_cnn", 8, "nchw", "fp32", None, device="cpu")
    assert a.key == b.key and len(a.key) == 16
    assert a.key != c.key
    assert d.key == e.key  # a scaler changes nothing for fp32, so it is not part of the point


# --------------------------------------------------------------------------- running

def test_repeats_are_interleaved_round_robin():
    order = []
    spec = tiny(batches=(2, 3, 4), repeats=3)
    sweep.run_sweep(spec, on_result=lambda row, i, n: order.append((row["repeat"], row["key"])))
    keys = [p.key for p in spec.points()]
    assert order == [(r, k) for r in range(3) for k in keys]


def test_rows_carry_measurements_and_provenance_on_cpu(tmp_path):
    out = tmp_path / "r.parquet"
    df = sweep.run_sweep(tiny(batches=(4,), repeats=1, steps=3), out)
    assert len(df) == 1
    row = df.iloc[0]
    assert row["status"] == "ok"
    assert row["step_ms_p10"] <= row["step_ms_median"] <= row["step_ms_p90"]
    assert row["samples_per_s"] == pytest.approx(4 / (row["step_ms_median"] / 1e3))
    assert pd.isna(row["peak_mem_allocated_mb"]) and "CPU" in row["memory_note"]
    assert row["torch"] == torch.__version__
    for c in ("gpu_name", "driver_version", "cuda_runtime_version"):
        assert c in df.columns
    csv = pd.read_csv(tmp_path / "r.csv")
    assert list(csv["key"]) == list(df["key"])


def _raise_at(kind: type[BaseException], where: set[tuple[int, int]], message: str = ""):
    """Returns a fault injector raising ``kind`` at step 0 of the listed (point index, repeat)."""
    seen: list[tuple[str, int]] = []

    def inject(point, repeat, step):
        if step == 0:
            seen.append((point.key, repeat))
            if (inject.index.get(point.key), repeat) in where:
                raise kind(message)

    inject.index = {}
    inject.seen = seen
    return inject


def test_oom_is_recorded_and_the_sweep_goes_on(tmp_path):
    spec = tiny(batches=(2, 3, 4), repeats=2)
    pts = spec.points()
    inject = _raise_at(torch.cuda.OutOfMemoryError, {(1, 0)}, "CUDA out of memory. Tried to allocate 1 TiB")
    inject.index = {p.key: i for i, p in enumerate(pts)}
    out = tmp_path / "oom.parquet"
    df = sweep.run_sweep(spec, out, fault_injector=inject)
    on_disk = pd.read_parquet(out)
    assert len(on_disk) == len(df) == 2 + 1 + 2  # the OOM point is not repeated
    by_key = on_disk.groupby("key")["status"].apply(list).to_dict()
    assert by_key[pts[1].key] == ["oom"]
    assert by_key[pts[0].key] == by_key[pts[2].key] == ["ok", "ok"]
    assert "out of memory" in on_disk.loc[on_disk["status"] == "oom", "error"].iloc[0]
    assert len(pd.read_csv(tmp_path / "oom.csv")) == len(on_disk)
    s = sweep.summarize_results(on_disk).set_index("key")
    assert s.loc[pts[1].key, "status"] == "oom"


def test_a_real_host_oom_on_cpu_is_recorded(tmp_path, monkeypatch):
    # Stand-in for a memory cap: the model build itself fails the way a capped allocator does.
    real = steps.make_train_step

    def capped(precision, model, x, *a, **k):
        if x.shape[0] == 3:
            raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate "
                               "1099511627776 bytes. out of memory")
        return real(precision, model, x, *a, **k)

    monkeypatch.setattr(steps, "make_train_step", capped)
    df = sweep.run_sweep(tiny(batches=(2, 3, 4), repeats=1), tmp_path / "cap.parquet")
    assert list(df["status"]) == ["ok", "oom", "ok"]


def test_other_failures_are_recorded_with_their_message(tmp_path):
    spec = tiny(batches=(2, 4), repeats=1)
    inject = _raise_at(ValueError, {(0, 0)}, "something specific broke")
    inject.index = {p.key: i for i, p in enumerate(spec.points())}
    df = sweep.run_sweep(spec, tmp_path / "e.parquet", fault_injector=inject)
    assert list(df["status"]) == ["error", "ok"]
    assert df["error"].iloc[0] == "ValueError: something specific broke"


def test_interrupt_keeps_finished_points_and_rerun_resumes(tmp_path):
    spec = tiny(batches=(2, 3, 4), repeats=2)
    pts = spec.points()
    out = tmp_path / "int.parquet"
    inject = _raise_at(KeyboardInterrupt, {(1, 1)})  # 5th task: repeat 1 of the second point
    inject.index = {p.key: i for i, p in enumerate(pts)}
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(spec, out, fault_injector=inject)
    first = pd.read_parquet(out)
    finished = [(p.key, 0) for p in pts] + [(pts[0].key, 1)]
    assert sorted(zip(first["key"], first["repeat"])) == sorted(finished)
    assert (first["status"] == "ok").all()
    assert not list(tmp_path.glob(".*tmp"))  # no half-written file left behind

    again = _raise_at(KeyboardInterrupt, set())
    df = sweep.run_sweep(spec, out, fault_injector=again)
    assert again.seen == [(pts[1].key, 1), (pts[2].key, 1)]  # only what was missing ran
    assert len(df) == 6 and (df["status"] == "ok").all()
    kept = df.set_index(["key", "repeat"]).loc[[tuple(x) for x in finished], "finished_at"]
    assert list(kept) == list(first.set_index(["key", "repeat"]).loc[[tuple(x) for x in finished],
                                                                      "finished_at"])
    assert sweep.run_sweep(spec, out, fault_injector=again).shape[0] == 6  # nothing left to do
    assert len(again.seen) == 2


def test_stop_event_ends_the_sweep_between_points(tmp_path):
    import threading

    stop = threading.Event()
    spec = tiny(batches=(2, 3, 4), repeats=1)

    def after(row, i, n):
        if i == 2:
            stop.set()

    df = sweep.run_sweep(spec, tmp_path / "s.parquet", stop=stop, on_result=after)
    assert len(df) == 2


def test_results_file_must_be_parquet(tmp_path):
    with pytest.raises(ValueError, match=".parquet"):
        sweep.append_rows(tmp_path / "x.csv", [{}])


# --------------------------------------------------------------------------- the scaler

@pytest.mark.parametrize("precision", ["amp-fp16", "fp16-o2"])
def test_overflowing_scale_skips_every_step_and_backs_off(precision):
    # Oracle: GradScaler's rule. With a scale of 2**60 every fp16 gradient overflows, so each
    # step is skipped and the scale multiplied by backoff_factor.
    s = ScalerSettings(init_scale=2.0**60, backoff_factor=0.25)
    row = sweep.measure_point(Point("small_cnn", 4, "nchw", precision, s), warmup=1, steps=3,
                              telemetry=False)
    assert row["status"] == "ok", row["error"]
    assert row["skipped_steps"] == 4
    assert row["final_scale"] == 2.0**60 * 0.25**4


@pytest.mark.parametrize("precision", ["amp-fp16", "fp16-o2"])
def test_small_scale_grows_every_growth_interval(precision):
    s = ScalerSettings(init_scale=1.0, growth_factor=3.0, growth_interval=2)
    row = sweep.measure_point(Point("small_cnn", 4, "nchw", precision, s), warmup=1, steps=4,
                              telemetry=False)
    assert row["skipped_steps"] == 0
    assert row["final_scale"] == 3.0 ** (5 // 2)


def test_scaler_columns_are_empty_without_a_scaler():
    row = sweep.measure_point(Point("small_cnn", 4, "nchw", "amp-bf16"), warmup=0, steps=2,
                              telemetry=False)
    assert row["final_scale"] is None and row["skipped_steps"] is None
    assert row["init_scale"] is None


# --------------------------------------------------------------------------- summaries

def _row(key, repeat, ms, status="ok", batch=8):
    r = dict.fromkeys(sweep.ROW_COLUMNS)
    r.update(key=key, model="small_cnn", batch=batch, layout="nchw", precision="fp32",
             device="cpu", repeat=repeat, status=status, error="" if status == "ok" else "boom",
             step_ms_median=ms, spread=0.01, tolerance=0.03, cudnn_benchmark=False, warmup=3,
             steps=10, elapsed_s=1.0, finished_at="2026-01-01T00:00:00+00:00")
    return r


def test_summary_flags_points_whose_repeats_disagree():
    medians = {"a": [10.0, 10.2, 10.1], "b": [10.0, 11.0, 10.5], "c": [5.0]}
    rows = pd.DataFrame([_row(k, i, ms) for k, v in medians.items() for i, ms in enumerate(v)])
    s = sweep.summarize_results(rows).set_index("key")
    for k, v in medians.items():
        v = np.array(v)
        spread = (v.max() - v.min()) / np.median(v)
        assert s.loc[k, "repeat_spread"] == pytest.approx(spread)
        assert s.loc[k, "unstable"] == (spread > 0.03)
        assert s.loc[k, "samples_per_s"] == pytest.approx(8 / (np.median(v) / 1e3))
    assert list(s["unstable"]) == [False, True, False]
    assert not sweep.summarize_results(rows, tolerance=0.2)["unstable"].any()


def test_report_is_readable_and_names_failures():
    rows = pd.DataFrame([_row("a", 0, 10.0), _row("a", 1, 12.0), _row("b", 0, None, "oom", 16)])
    text = sweep.format_report(rows)
    assert "UNSTABLE" in text and "oom" in text and "boom" in text
    assert "11.00" in text


def test_throughput_table_pivots_by_batch():
    rows = pd.DataFrame([_row("a", 0, 10.0, batch=8), _row("b", 0, 10.0, batch=16)])
    t = sweep.throughput_table(rows)
    assert list(t.index) == [8, 16]
    assert t.iloc[:, 0].tolist() == pytest.approx([800.0, 1600.0])


def test_throughput_table_leaves_out_every_non_default_scaler_setting():
    """A point with growth_interval=1 (or any scaler field off its default) is a variant of its
    own: it must not average into the default point's cell."""
    default = ScalerSettings()
    base = dict(precision="amp-fp16", **{f: getattr(default, f) for f in
                                          ("init_scale", "growth_factor", "backoff_factor", "growth_interval")})
    variants = [dict(), dict(growth_interval=1), dict(init_scale=2.0**24), dict(growth_factor=4.0),
                dict(backoff_factor=0.25)]
    rows = pd.DataFrame([{**_row(f"k{i}", 0, 10.0 * (i + 1)), **base, **v} for i, v in enumerate(variants)])
    t = sweep.throughput_table(rows)
    assert t.shape == (1, 1) and t.iloc[0, 0] == pytest.approx(800.0)  # the default point alone


def test_plot_draws_a_line_per_layout_and_precision():
    rows = pd.DataFrame([_row("a", 0, 10.0, batch=8), _row("b", 0, 12.0, batch=16)])
    fig = sweep.plot_results(rows)
    ax = fig.axes[0]
    assert len(ax.lines) == 1
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [800.0, 16 / 0.012])


# --------------------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_gpu_oom_point_is_recorded_and_memory_returns_to_its_start(tmp_path):
    import importlib.util

    model = "resnet50" if importlib.util.find_spec("torchvision") else "small_cnn"
    batch = 100_000 if model == "resnet50" else 4_000_000
    # a small point first, so library workspaces (cuBLAS, cuDNN) that stay allocated exist
    spec = SweepSpec(models=(model,), batches=(32, batch, 64), layouts=("nchw",),
                     precisions=("amp-fp16",), device="cuda", warmup=1, steps=3, repeats=1)
    level = []
    out = tmp_path / "gpu_oom.parquet"
    df = sweep.run_sweep(spec, out, on_result=lambda row, i, n: level.append(
        torch.cuda.memory_allocated()))
    assert list(df["status"]) == ["ok", "oom", "ok"], df["error"].tolist()
    assert level[1] == level[0], "memory after the OOM point differs from before it"
    assert len(pd.read_parquet(out)) == 3
    ok = df[df["status"] == "ok"].iloc[0]
    assert ok["peak_mem_allocated_mb"] > 0 and ok["peak_mem_reserved_mb"] >= ok["peak_mem_allocated_mb"]
    assert ok["telemetry_samples"] >= 0 and ok["gpu_name"]


@pytest.mark.gpu
def test_gpu_point_has_telemetry_and_events_timing():
    row = sweep.measure_point(Point("small_cnn", 256, "channels_last", "amp-fp16", device="cuda"),
                              warmup=3, steps=200, telemetry=True, interval_s=0.02)
    assert row["status"] == "ok", row["error"]
    assert row["telemetry_samples"] > 0, row["telemetry_note"]
    assert 0 <= row["gpu_busy_mean"] <= 100 and row["power_w_mean"] > 0
    assert row["sm_clock_mhz_mean"] > 100


def _prow(key, batch, layout, precision, ms, init_scale=None, growth_interval=None, skipped=None,
          final=None):
    r = _row(key, 0, ms, batch=batch)
    r.update(layout=layout, precision=precision, init_scale=init_scale,
             growth_interval=growth_interval, skipped_steps=skipped, final_scale=final,
             warmup=2, steps=5)
    return r


def test_ratio_table_divides_by_the_baseline():
    rows = pd.DataFrame([
        _prow("a", 64, "nchw", "fp32", 20.0), _prow("b", 64, "nchw", "amp-fp16", 5.0, 65536.0, 2000),
        _prow("c", 64, "channels_last", "fp32", 16.0),
        _prow("d", 64, "channels_last", "amp-fp16", 4.0, 65536.0, 2000),
    ])
    t = sweep.ratio_table(rows)
    assert t.loc[64, ("nchw", "amp-fp16 / fp32")] == pytest.approx(20.0 / 5.0)
    assert t.loc[64, ("channels_last", "amp-fp16 / fp32")] == pytest.approx(16.0 / 4.0)
    lay = sweep.ratio_table(rows, by="layout", baseline="nchw")
    assert lay.loc[64, ("fp32", "channels_last / nchw")] == pytest.approx(20.0 / 16.0)
    with pytest.raises(ValueError, match="by must be"):
        sweep.ratio_table(rows, by="batch")


def test_throughput_table_keeps_ok_default_points_of_the_model_and_takes_their_median():
    """Only status-ok points with the default execution, input and gpus of the chosen model
    count; points sharing a cell (the same batch, layout and precision) give their median."""
    def pt(key, ms, batch=8, model="small_cnn", **kw):
        return {**_row(key, 0, ms, batch=batch), "model": model, **kw}

    rows = pd.DataFrame([
        pt("a", 10.0), pt("b", 8.0, cudnn_benchmark=True), pt("c", 4.0),  # one cell
        pt("d", 2.0, batch=16, execution="compile", compile_mode="default"),  # a variant: left out
        pt("e", 5.0, batch=32, status="error"),  # failed: left out
        pt("f", 1.0, model="resnet18"),  # another model
    ])
    t = sweep.throughput_table(rows, model="small_cnn")
    assert list(t.index) == [8]
    assert t.loc[8].tolist() == pytest.approx([8 / 0.008])  # median of 800, 1000, 2000, not the mean
    assert sweep.throughput_table(rows, model="resnet18").loc[8].tolist() == pytest.approx([8000.0])


def test_ratio_table_per_model_per_group_with_named_columns_and_a_clear_error():
    rows = pd.DataFrame([
        _prow("a", 64, "nchw", "fp32", 20.0), _prow("b", 64, "nchw", "amp-fp16", 5.0, 65536.0, 2000),
        # channels_last has no fp32 point: that group is skipped, nchw's still counts
        _prow("d", 64, "channels_last", "amp-fp16", 4.0, 65536.0, 2000),
        {**_prow("e", 64, "nchw", "fp32", 10.0), "model": "resnet18"},
        {**_prow("f", 64, "nchw", "amp-fp16", 10.0, 65536.0, 2000), "model": "resnet18"},
    ])
    t = sweep.ratio_table(rows, model="small_cnn")
    assert list(t.columns) == [("nchw", "amp-fp16 / fp32")]
    assert list(t.columns.names) == ["layout", "precision"]
    assert t.loc[64, ("nchw", "amp-fp16 / fp32")] == pytest.approx(4.0)
    assert sweep.ratio_table(rows, model="resnet18").loc[64, ("nchw", "amp-fp16 / fp32")] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no precision 'tf32' points to compare with"):
        sweep.ratio_table(rows, model="small_cnn", baseline="tf32")


def test_scaler_table_lists_points_that_differ_only_in_scaler_settings():
    rows = pd.DataFrame([
        _prow("a", 64, "nchw", "amp-fp16", 5.0, 65536.0, 2000, 0, 65536.0),
        _prow("b", 64, "nchw", "amp-fp16", 5.1, 2.0**40, 2000, 7, 2.0**33),
        _prow("c", 128, "nchw", "amp-fp16", 9.0, 65536.0, 2000, 0, 65536.0),  # alone: left out
        _prow("d", 64, "nchw", "fp32", 20.0),
    ])
    t = sweep.scaler_table(rows)
    assert sorted(t["log2_init_scale"]) == [16.0, 40.0]
    assert list(t["steps_per_repeat"]) == [7, 7]
    assert t.set_index("log2_init_scale").loc[40.0, "skipped_steps"] == 7
    assert t.set_index("log2_init_scale").loc[40.0, "log2_final_scale"] == 33.0


def test_load_reference_says_when_the_file_is_absent(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    assert sweep.load_reference("nope") is None
    assert "nope.parquet is not in" in capsys.readouterr().out
    sweep.append_rows(tmp_path / "ref.parquet", [_row("a", 0, 10.0)])
    assert len(sweep.load_reference("ref")) == 1
    assert "(shipped with fp16lab)" in capsys.readouterr().out
    sweep.append_rows(tmp_path / "local" / "ref.parquet", [_row("a", 0, 10.0), _row("a", 1, 11.0)])
    assert len(sweep.load_reference("ref")) == 2  # this machine's file wins over the committed one
    assert "measured on this machine" in capsys.readouterr().out
    assert "not in the data folder yet" in sweep.engine_check("nope")


def test_engine_check_reads_the_benchmark_summary(tmp_path, monkeypatch):
    import fp16lab.measure

    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    summary = {"model": "resnet50", "batch": 256, "layout": "channels_last",
               "precision": "amp-fp16", "repeats": 5, "steps": 30, "bare_ms": 80.0,
               "engine_ms": 81.0, "engine_vs_bare": 81.0 / 80.0, "telemetry_overhead": 0.002,
               "repeat_spread": {"bare": 0.01, "engine": 0.025}}
    fp16lab.measure.write_result("vs", [], meta={"summary": summary})
    text = sweep.engine_check("vs")
    assert "1.012x the bare loop" in text and "within 2.50%" in text and "+0.20%" in text
    assert "goal" not in text


@pytest.mark.gpu
def test_gpu_failure_mid_timing_stops_the_telemetry_thread():
    import threading

    def inject(point, repeat, step):
        if step == 3:  # a timed step (warmup is 2)
            raise ValueError("injected during the timed steps")

    row = sweep.measure_point(Point("small_cnn", 64, device="cuda"), warmup=2, steps=5,
                              telemetry=True, fault_injector=inject)
    assert row["status"] == "error" and "injected" in row["error"]
    assert not any(t.name == "fp16lab-telemetry" for t in threading.enumerate())


def _tf32_state():
    b = torch.backends
    out = {"benchmark": b.cudnn.benchmark}
    if hasattr(b.cuda.matmul, "fp32_precision"):
        out["new"] = (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision,
                      b.cudnn.rnn.fp32_precision)
    for name, get in (("matmul", lambda: b.cuda.matmul.allow_tf32),
                      ("cudnn", lambda: b.cudnn.allow_tf32)):
        try:
            out[name] = get()
        except RuntimeError:
            out[name] = "mixed-API error"
    return out


@pytest.mark.parametrize("other_code_used_the_new_api", [False, True])
@pytest.mark.parametrize("precision, want", [("fp32", False), ("tf32", True), ("amp-bf16", False)])
def test_tf32_is_set_during_a_point_and_restored_after(precision, want, other_code_used_the_new_api):
    b = torch.backends
    if other_code_used_the_new_api and not hasattr(b.cuda.matmul, "fp32_precision"):
        pytest.skip("this torch has no per-backend fp32_precision API")
    initial = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark)
    initial_new = _tf32_state().get("new")
    try:
        if other_code_used_the_new_api:
            b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision = "tf32", "ieee"
        before = _tf32_state()
        seen = []

        def look(point, repeat, step):
            if "new" in before:  # legacy reads raise while the per-backend settings differ
                seen.append((b.cuda.matmul.fp32_precision == "tf32",
                             b.cudnn.conv.fp32_precision == "tf32", b.cudnn.benchmark))
            else:
                seen.append((b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark))

        row = sweep.measure_point(Point("mlp", 4, "nchw", precision, cudnn_benchmark=True),
                                  warmup=0, steps=1, telemetry=False, fault_injector=look)
        assert row["status"] == "ok", row["error"]
        assert seen == [(want, want, True)]
        after = _tf32_state()
        # every flag readable before is back; a legacy flag that raised before (mixed APIs) may
        # now read consistently with the per-backend value, which is what torch uses
        assert {k: v for k, v in after.items() if before[k] != "mixed-API error"} == \
            {k: v for k, v in before.items() if v != "mixed-API error"}
    finally:
        b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark = initial
        if initial_new is not None:
            b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision = \
                initial_new


def test_the_sweep_for_this_machine_is_quick_on_a_cpu():
    spec = SweepSpec.for_this_machine()
    if torch.cuda.is_available():
        assert spec.batches == (64, 128, 256) and "amp-fp16" in spec.precisions
    else:
        assert spec.resolved_device() == "cpu" and spec.models == ("small_cnn",)
        assert len(spec.points()) * spec.repeats * (spec.warmup + spec.steps) <= 100


@pytest.mark.parametrize("exc", [KeyboardInterrupt, ValueError])
def test_an_interrupted_or_failed_point_releases_its_model(monkeypatch, exc):
    # Oracle: a weak reference to the model the point built dies, even while the caller still
    # holds the exception (and its traceback).
    import weakref

    import fp16lab.models

    refs = []
    real = fp16lab.models.build_model

    def build(name):
        m = real(name)
        refs.append(weakref.ref(m))
        return m

    monkeypatch.setattr(fp16lab.models, "build_model", build)

    def inject(point, repeat, step):
        if step == 2:
            raise exc("stop here")

    point = Point("small_cnn", 4, "channels_last", "amp-fp16")
    if exc is KeyboardInterrupt:
        with pytest.raises(KeyboardInterrupt) as info:
            sweep.measure_point(point, warmup=1, steps=3, telemetry=False, fault_injector=inject)
        assert info.value is not None  # the caller still holds it
    else:
        row = sweep.measure_point(point, warmup=1, steps=3, telemetry=False,
                                  fault_injector=inject)
        assert row["status"] == "error"
    assert len(refs) == 1 and refs[0]() is None


@pytest.mark.gpu
def test_gpu_interrupt_returns_memory_to_its_start(tmp_path):
    spec = SweepSpec(models=("small_cnn",), batches=(512, 1024), layouts=("channels_last",),
                     precisions=("amp-fp16",), device="cuda", warmup=2, steps=5, repeats=1)
    sweep.run_sweep(dataclasses.replace(spec, batches=(64,)))  # library workspaces exist now
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()

    def inject(point, repeat, step):
        if point.batch == 1024 and step == 4:
            raise KeyboardInterrupt

    out = tmp_path / "gpu_int.parquet"
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(spec, out, fault_injector=inject)
    assert torch.cuda.memory_allocated() == start
    df = pd.read_parquet(out)
    assert list(df["batch"]) == [512] and (df["status"] == "ok").all()
    assert len(sweep.run_sweep(spec, out)) == 2  # resumes: only batch 1024 measured now


def test_without_a_file_the_rows_are_returned_and_no_bar_unless_asked(capsys):
    spec = tiny(batches=(2, 3), repeats=1, warmup=1, steps=2, tolerance=0.5)
    seen = []
    df = sweep.run_sweep(spec, on_result=lambda row, i, n: seen.append((row["key"], i, n)))
    assert list(df.columns) == list(sweep.ROW_COLUMNS) and list(df["status"]) == ["ok", "ok"]
    assert seen == [(p.key, i + 1, 2) for i, p in enumerate(spec.points())]
    # the spec's protocol reaches every measurement
    assert list(df["warmup"]) == [1, 1] and list(df["steps"]) == [2, 2]
    assert list(df["tolerance"]) == [0.5, 0.5]
    assert "sweep" not in capsys.readouterr().err
    sweep.run_sweep(tiny(batches=(2,), repeats=1), progress=True)
    err = capsys.readouterr().err  # tqdm's bar, on stderr
    assert "sweep: 100%" in err and " 1/1 " in err and "measurement/s" in err
    assert f"{spec.points()[0].label()} r0" in err  # the point being measured


# ---------------------------------------------------- run_sweep's plumbing, with the point stubbed

def _stub_points(monkeypatch, fail_batch: int | None = None) -> list:
    """Replaces measure_point by a recorder: returns its list of (key, keyword arguments)."""
    calls = []

    def measure(point, **kw):
        calls.append((point.key, kw))
        status = "error" if point.batch == fail_batch else "ok"
        return {**dict.fromkeys(sweep.ROW_COLUMNS), "key": point.key, "repeat": kw["repeat"],
                "status": status}

    monkeypatch.setattr(engine, "measure_point", measure)
    return calls


class _Bar:
    """Stands in for tqdm: keeps what the sweep tells its bar."""

    made: list = []

    def __init__(self, total, **kw):
        self.total, self.n, self.postfix, self.closed = total, 0, [], False
        _Bar.made.append(self)

    def update(self, n=1):
        self.n += n

    def set_postfix_str(self, s, refresh=True):
        self.postfix.append((s, refresh))

    def close(self):
        self.closed = True


def test_run_sweep_hands_the_protocol_on_and_the_bar_counts_skipped_repeats(monkeypatch):
    import tqdm.auto

    calls = _stub_points(monkeypatch, fail_batch=4)
    monkeypatch.setattr(tqdm.auto, "tqdm", _Bar)
    _Bar.made = []
    spec = tiny(batches=(2, 4), repeats=2, warmup=3, steps=5, tolerance=0.25, telemetry=True,
                telemetry_interval_s=0.2)
    df = sweep.run_sweep(spec, progress=True)
    keys = [p.key for p in spec.points()]
    # batch 4 fails in repeat 0: its repeat 1 is skipped, not measured, and still counted
    assert [k for k, _ in calls] == [keys[0], keys[1], keys[0]]
    assert all(kw == dict(repeat=kw["repeat"], warmup=3, steps=5, tolerance=0.25, telemetry=True,
                          interval_s=0.2, fault_injector=None) for _, kw in calls)
    assert [kw["repeat"] for _, kw in calls] == [0, 0, 1]
    (bar,) = _Bar.made
    assert (bar.total, bar.n, bar.closed) == (4, 4, True)
    # the point being measured, shown at once (not at the next update, after its measurement)
    assert bar.postfix == [(f"{p.label()} r{r}", True) for r, p in ((0, spec.points()[0]),
                                                                  (0, spec.points()[1]),
                                                                  (1, spec.points()[0]))]
    assert list(df["status"]) == ["ok", "error", "ok"]


def test_a_sweep_stopped_before_its_first_point_returns_an_empty_table_with_the_columns(
        monkeypatch):
    import threading

    calls = _stub_points(monkeypatch)
    stop = threading.Event()
    stop.set()
    df = sweep.run_sweep(tiny(), stop=stop)
    assert calls == [] and len(df) == 0 and list(df.columns) == list(sweep.ROW_COLUMNS)


def test_file_inputs_get_their_image_folder_written_before_any_point(monkeypatch, tmp_path):
    import fp16lab.inputs.dataset

    calls = _stub_points(monkeypatch)
    made = []
    monkeypatch.setattr(fp16lab.inputs.dataset, "make_image_folder",
                        lambda root, images: made.append((Path(root), images)))
    monkeypatch.setattr(fp16lab.inputs.dataset, "scan_image_folder",
                        lambda root: made.append(Path(root)))
    spec = tiny(models=("small_cnn",), batches=(2,), repeats=1, inputs=("dataloader",),
                images_dir=str(tmp_path / "images"), images=6)
    sweep.run_sweep(spec)
    assert made == [(tmp_path / "images", 6), tmp_path / "images"] and len(calls) == 1


def test_the_gpu_protocol_reads_as_a_sentence():
    from fp16lab.sweep import GPU_PROTOCOL, Protocol
    assert str(GPU_PROTOCOL) == (f"{GPU_PROTOCOL.warmup} warm-up steps, then {GPU_PROTOCOL.steps} "
                                 "timed steps, cuDNN autotuning (cudnn.benchmark) on")
    assert str(Protocol(cudnn_benchmark=False, warmup=0, steps=3)).endswith("off")
    assert str(Protocol(cudnn_benchmark=False, warmup=0, steps=3)).startswith("0 warm-up steps, then 3 timed")

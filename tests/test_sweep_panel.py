"""The sweep panel, driven from Python as a user would click it."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

from fp16lab import sweep  # noqa: E402
from fp16lab.widgets import SweepPanel  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def small_panel(**kw) -> SweepPanel:
    panel = SweepPanel(device="cpu", **kw)
    panel.model.value = "small_cnn"
    panel.batches.value = (2, 4)
    panel.layouts.value = ("nchw", "channels_last")
    panel.precisions.value = ("fp32",)
    panel.warmup.value, panel.steps.value, panel.repeats.value = 0, 2, 2
    return panel


def test_run_fills_progress_rows_table_and_plot():
    panel = small_panel()
    seen = []
    panel.progress.observe(lambda ch: seen.append(ch["new"]), names="value")
    panel.run_button.click()
    assert panel.run_button.disabled and not panel.stop_button.disabled
    assert panel.wait(300), "the sweep did not finish"
    assert not panel.error, panel.error
    spec = panel.spec()
    want = {(p.key, r) for p in spec.points() for r in range(spec.repeats)}
    assert set(zip(panel.rows["key"], panel.rows["repeat"])) == want
    assert panel.progress.value == panel.progress.max == len(want)
    assert seen[:len(want)] == list(range(1, len(want) + 1))  # one step per finished point
    assert panel.table.value.count("<tr") == 1 + len(spec.points())  # header + one per point
    assert "None" not in panel.table.value
    assert bytes(panel.plot.value).startswith(PNG)
    assert panel.status.value.startswith("done")
    assert not panel.run_button.disabled and panel.stop_button.disabled


def test_stop_ends_the_sweep_early():
    panel = small_panel()
    panel.repeats.value = 5
    panel.run_button.click()
    panel.stop_button.click()
    assert panel.wait(300)
    assert len(panel.rows) < 4 * 5
    assert panel.status.value.startswith("stopped")


def test_bad_input_shows_an_error_and_runs_nothing():
    panel = small_panel()
    panel.batches.value = ()
    assert panel.run() is False
    assert "batch" in panel.error and "cannot run" in panel.status.value
    assert not panel.running and len(panel.rows) == 0
    panel.batches.value = (2,)
    panel.backoff_factor.value = 1.5
    assert panel.run() is False and "backoff_factor" in panel.error


def test_results_go_to_the_file_and_a_second_run_resumes(tmp_path):
    out = tmp_path / "panel.parquet"
    panel = small_panel(out=out)
    panel.layouts.value = ("nchw",)
    panel.repeats.value = 1
    panel.run_button.click()
    assert panel.wait(300) and not panel.error
    first = sweep.read_results(out)
    assert len(first) == 2
    panel.run_button.click()
    assert panel.wait(300)
    assert sweep.read_results(out).equals(first)  # nothing re-measured


def test_widgets_carry_the_dom_classes_a_browser_test_uses():
    panel = SweepPanel(device="cpu")
    for widget, cls in ((panel.run_button, "run"), (panel.stop_button, "stop"),
                        (panel.progress, "progress"), (panel.table, "table"),
                        (panel.plot, "plot"), (panel.status, "status")):
        assert f"fp16lab-sweep-{cls}" in widget._dom_classes
    bundle = panel._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_every_control_carries_its_dom_class():
    panel = SweepPanel(device="cpu")
    for cls, widget in (("model", panel.model), ("batches", panel.batches),
                        ("layouts", panel.layouts), ("precisions", panel.precisions),
                        ("init-scale", panel.init_scale), ("growth-factor", panel.growth_factor),
                        ("backoff-factor", panel.backoff_factor),
                        ("growth-interval", panel.growth_interval), ("warmup", panel.warmup),
                        ("steps", panel.steps), ("repeats", panel.repeats)):
        mine = [c for c in widget._dom_classes if c.startswith("fp16lab-sweep-")]
        assert mine == [f"fp16lab-sweep-{cls}"], (cls, widget._dom_classes)


def test_plot_is_hidden_until_there_is_a_result_and_the_table_scrolls():
    panel = small_panel()
    panel.batches.value, panel.layouts.value, panel.repeats.value = (2,), ("nchw",), 1
    assert panel.plot.layout.display == "none" and not panel.plot.value  # no broken image
    assert panel.table.layout.overflow == "auto"  # wide summaries scroll, not cut off
    panel.run_button.click()
    assert panel.wait(300) and not panel.error, panel.error
    assert bytes(panel.plot.value).startswith(PNG)
    assert panel.plot.layout.display in (None, "", "block", "flex")


# ------------------------------------------------------------------ sweep.plot_results

def _summary_row(key, repeat, ms, *, batch=8, layout="nchw", precision="fp32", **kw):
    r = dict.fromkeys(sweep.ROW_COLUMNS)
    r.update(key=key, model="small_cnn", batch=batch, layout=layout, precision=precision,
             device="cpu", repeat=repeat, status="ok", error="", step_ms_median=ms, spread=0.01,
             tolerance=0.03, cudnn_benchmark=False)
    r.update(kw)
    return r


def _lines(ax):
    """Returns the labelled (series) lines of an axes by label."""
    return {ln.get_label(): ln for ln in ax.lines if not ln.get_label().startswith("_")}


def test_plot_tells_layouts_apart_at_a_single_batch_size():
    import matplotlib.colors as mc
    import pandas as pd

    rows = pd.DataFrame([_summary_row("a", 0, 10.0, layout="nchw"),
                         _summary_row("b", 0, 8.0, layout="channels_last"),
                         _summary_row("c", 0, 5.0, layout="nchw", precision="amp-bf16")])
    fig = sweep.plot_results(rows)
    lines = _lines(fig.axes[0])
    assert set(lines) == {"nchw fp32", "channels_last fp32", "nchw amp-bf16"}
    a, b, c = lines["nchw fp32"], lines["channels_last fp32"], lines["nchw amp-bf16"]
    # one point each (batch / step time), and visible: every series has a marker
    for ln, ms in ((a, 10.0), (b, 8.0), (c, 5.0)):
        assert list(ln.get_xdata()) == [8]
        assert ln.get_ydata()[0] == pytest.approx(8 / (ms / 1e3))
        assert ln.get_marker() not in (None, "", "None", " ")
    # same precision: same colour; other layout: other marker and line style
    assert mc.same_color(a.get_color(), b.get_color())
    assert a.get_marker() != b.get_marker() and a.get_linestyle() != b.get_linestyle()
    # other precision: other colour, same layout style
    assert not mc.same_color(a.get_color(), c.get_color())
    assert a.get_marker() == c.get_marker() and a.get_linestyle() == c.get_linestyle()
    # the legend has one distinct entry per series
    labels = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert sorted(labels) == sorted(lines)


def test_plot_draws_unstable_points_hollow():
    import matplotlib.colors as mc
    import pandas as pd

    # batch 8: repeats 10 and 13 ms (30% apart: unstable); batch 16: 20 and 20.1 ms (stable)
    rows = pd.DataFrame([_summary_row("a", 0, 10.0), _summary_row("a", 1, 13.0),
                         _summary_row("b", 0, 20.0, batch=16),
                         _summary_row("b", 1, 20.1, batch=16)])
    fig = sweep.plot_results(rows)
    ax = fig.axes[0]
    (line,) = _lines(ax).values()
    np.testing.assert_allclose(line.get_ydata(), [8 / 0.0115, 16 / 0.02005])
    assert list(line.get_markevery()) == [1]  # the filled marker only on the stable point
    hollow = [ln for ln in ax.lines if ln.get_label().startswith("_")]
    assert len(hollow) == 1
    assert list(hollow[0].get_xdata()) == [8]
    assert hollow[0].get_ydata()[0] == pytest.approx(8 / 0.0115)
    assert mc.same_color(hollow[0].get_markerfacecolor(), "white")
    labels = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert any("UNSTABLE" in t for t in labels)


def test_plot_leaves_out_points_with_other_scaler_settings():
    import pandas as pd

    s = sweep.ScalerSettings()
    base = dict(precision="amp-fp16", init_scale=s.init_scale, growth_factor=s.growth_factor,
                backoff_factor=s.backoff_factor, growth_interval=s.growth_interval)
    rows = pd.DataFrame([_summary_row("a", 0, 10.0, **base),
                         _summary_row("b", 0, 40.0, **{**base, "growth_interval": 1}),
                         _summary_row("c", 0, 40.0, **{**base, "init_scale": 2.0 ** 40})])
    (line,) = _lines(sweep.plot_results(rows).axes[0]).values()
    np.testing.assert_allclose(line.get_ydata(), [8 / 0.010])


def test_plot_gives_each_model_its_own_row():
    import pandas as pd

    rows = pd.DataFrame([_summary_row("a", 0, 10.0), _summary_row("b", 0, 10.0, model="mlp")])
    fig = sweep.plot_results(rows)
    assert len(fig.axes) == 6
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].startswith("small_cnn") and titles[3].startswith("mlp")
    assert len(sweep.plot_results(rows, model="mlp").axes) == 3


class _Proc:
    def __init__(self, pid, used):
        self.pid, self.usedGpuMemory = pid, used


class _FakeNvml:
    def __init__(self, procs, fail=None):
        self.procs, self.fail, self.asked = procs, fail, []

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self.asked.append(handle)
        if self.fail:
            raise self.fail
        return self.procs


def test_other_gpu_processes_leaves_this_process_out(monkeypatch):
    import os

    from fp16lab import telemetry
    nv = _FakeNvml([_Proc(os.getpid(), 2**30), _Proc(4242, 3 * 2**30)])
    others, note = telemetry.other_gpu_processes("h", nv)
    assert nv.asked == ["h"] and note == ""
    assert others == [{"pid": 4242, "used_mib": 3072.0}]
    # in a container NVML shows host pids: with a CUDA context of ours, one listed is us
    monkeypatch.setattr(telemetry, "_holds_cuda_context", lambda: True)
    assert telemetry.other_gpu_processes("h", _FakeNvml([_Proc(901, None)]))[0] == []
    assert [p["pid"] for p in telemetry.other_gpu_processes(
        "h", _FakeNvml([_Proc(901, None), _Proc(902, 0)]))[0]] == [902]
    monkeypatch.setattr(telemetry, "_holds_cuda_context", lambda: False)
    assert [p["pid"] for p in telemetry.other_gpu_processes("h", _FakeNvml([_Proc(901, None)]))[0]] == [901]


def test_other_gpu_processes_says_why_it_could_not_tell():
    from fp16lab import telemetry
    others, note = telemetry.other_gpu_processes("h", _FakeNvml([], fail=RuntimeError("not supported")))
    assert others == [] and "could not list" in note and "not supported" in note


def test_panel_warns_when_other_processes_use_the_gpu(monkeypatch):
    from fp16lab import telemetry
    panel = SweepPanel(device="cpu")
    assert panel.check_sharing() == ""  # a CPU sweep shares no GPU
    panel.device = "cuda"
    monkeypatch.setattr(telemetry, "other_gpu_processes",
                        lambda: ([{"pid": 77, "used_mib": 10.0}, {"pid": 78, "used_mib": 0.0}], ""))
    text = panel.check_sharing()
    assert "2 other process(es)" in text and "77, 78" in text and panel.sharing.value == text
    monkeypatch.setattr(telemetry, "other_gpu_processes", lambda: ([], ""))
    assert panel.check_sharing() == "" and panel.sharing.value == ""


def test_gpm_counters_are_averaged_and_plotted_where_the_gpu_has_them():
    import pandas as pd

    gpm = {"a": [40.0, 50.0], "b": [70.0, 90.0]}  # SM utilisation % per repeat
    rows = pd.DataFrame([_summary_row(k, i, 10.0, batch=b, device="cuda", gpu_busy_mean=99.0,
                                      sm_util_mean=v, tensor_util_mean=v / 2)
                         for (k, vs), b in zip(gpm.items(), (8, 16)) for i, v in enumerate(vs)])
    s = sweep.summarize_results(rows).set_index("key")
    for k, vs in gpm.items():
        assert s.loc[k, "sm_util_mean"] == np.mean(vs)
        assert s.loc[k, "tensor_util_mean"] == np.mean(vs) / 2
    ax = sweep.plot_results(rows).axes[2]
    assert ax.get_title() == "SM utilisation % (NVML GPM)"
    (line,) = _lines(ax).values()
    np.testing.assert_allclose(line.get_ydata(), [np.mean(gpm["a"]), np.mean(gpm["b"])])
    # without GPM columns (a CPU, or an older GPU) the panel stays NVML's busy %
    plain = rows.assign(sm_util_mean=None, tensor_util_mean=None)
    assert sweep.plot_results(plain).axes[2].get_title() == "GPU busy % (NVML)"
    assert pd.isna(sweep.summarize_results(plain)["sm_util_mean"]).all()


def test_a_workload_given_to_the_panel_is_on_its_menu_and_is_what_it_sweeps():
    from torch import nn

    from fp16lab.workload import Workload
    from fp16lab.workloads.batches import synthetic_batch

    w = Workload(name="panel-mlp", build=lambda: nn.Sequential(nn.Linear(8, 3)),
                 batch=synthetic_batch((8,), 3))
    panel = SweepPanel(device="cpu", workloads=(w,))
    assert panel.model.options[0] == "panel-mlp" and panel.model.value == "panel-mlp"
    assert "small_cnn" in panel.model.options
    panel.batches.value, panel.layouts.value, panel.precisions.value = (2,), ("nchw",), ("fp32",)
    panel.warmup.value, panel.steps.value, panel.repeats.value = 0, 1, 1
    (point,) = panel.spec().points()
    assert point.workload is w
    panel.run_button.click()
    assert panel.wait(120) and not panel.error, panel.error
    assert list(panel.rows["model"]) == ["panel-mlp"] and list(panel.rows["status"]) == ["ok"]
    with pytest.raises(TypeError, match="tuple of fp16lab.workload.Workload"):
        SweepPanel(device="cpu", workloads=("bert-base",))
    clash = Workload(name="mlp", build=w.build, batch=w.batch)
    with pytest.raises(ValueError, match="a built-in model's"):
        SweepPanel(device="cpu", workloads=(clash,))

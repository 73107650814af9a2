"""The sweep panel, driven from Python as a user would click it."""

from __future__ import annotations

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

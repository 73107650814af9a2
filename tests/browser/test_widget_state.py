"""A notebook saved with widget outputs and reopened draws its widgets, not an error.

JupyterLab's autosave writes the outputs; unless the widget manager's ``saveState`` is on, the
widgets' models are not written with them, and the reopened notebook shows "Error displaying
widget: model not found" until it is run again. `make lab` turns saveState on
(lab-settings/overrides.json), and the browser harness serves the same settings.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("jupyterlab", reason="JupyterLab is not installed here (the GPU host has none)")

NOTEBOOK = "_widget_state.ipynb"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _write_notebook(folder) -> str:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(
        "import ipywidgets as w\n"
        "slider = w.IntSlider(value=7, min=0, max=10, description='kept')\n"
        "slider.add_class('state-slider')\n"
        "slider")]
    nbformat.write(nb, folder / NOTEBOOK)
    return NOTEBOOK


def _saved_models(path) -> list[str]:
    """Returns the widget model names the notebook file holds in its metadata."""
    meta = json.loads(path.read_text()).get("metadata", {})
    state = meta.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    return sorted(m.get("model_name", "") for m in state.values())


def test_reopened_notebook_draws_its_saved_widget(open_notebook, lab):
    name = _write_notebook(lab.root_dir)
    first = open_notebook(name)
    first.run_all_without_errors()
    first.page.locator(".state-slider").first.wait_for(timeout=30_000)
    # what autosave does: save the notebook, outputs and (with saveState) the widget models
    first.page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    path = lab.root_dir / name
    first.page.wait_for_function(
        "() => !document.querySelector('.jp-NotebookPanel .jp-mod-dirty')", timeout=30_000)
    assert "IntSliderModel" in _saved_models(path), _saved_models(path)
    first.close()  # the tab and its kernel: the widget models live on only in the file

    again = open_notebook(name)
    page = again.page
    page.wait_for_function(
        "() => document.querySelector('.state-slider') || document.body.innerText"
        ".includes('model not found')", timeout=60_000)
    again.shot("reopened")
    assert "model not found" not in page.locator(".jp-OutputArea").first.inner_text()
    slider = page.locator(".state-slider").first
    assert slider.is_visible()
    assert "kept" in slider.inner_text() and "7" in slider.inner_text()

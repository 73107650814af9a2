"""The browser harness itself: the server never outlives its block, and the checks can fail.

The server tests need no browser and run everywhere; the two that drive Chromium skip without it.

A throwaway notebook (written into the server's temporary folder, never into notebooks/) has
a cell that writes to stderr, an IntSlider whose observer runs in the kernel, and a cell that
raises. The error check must report exactly the raising cell, and a slider moved in the
browser must reach the kernel and come back.
"""

from __future__ import annotations

import pytest

pytest.importorskip("jupyterlab", reason="JupyterLab is not installed here (the GPU host has none)")
pytest.importorskip("psutil", reason="psutil (an ipykernel dependency) is not installed here")

HARNESS_NOTEBOOK = "_harness_check.ipynb"


def _write_harness_notebook(folder) -> str:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# harness check"),
        nbformat.v4.new_code_cell("import sys\nprint('to stderr, not an error', file=sys.stderr)"),
        nbformat.v4.new_code_cell(
            "import ipywidgets as w\n"
            "slider = w.IntSlider(value=3, min=0, max=10, description='n')\n"
            "slider.add_class('harness-slider')\n"
            "echo = w.Label(value='kernel saw 3')\n"
            "echo.add_class('harness-echo')\n"
            "slider.observe(lambda ch: setattr(echo, 'value', f'kernel saw {ch.new}'), 'value')\n"
            "w.VBox([slider, echo])"),
        nbformat.v4.new_code_cell("1 / 0"),
        nbformat.v4.new_code_cell("print('never runs')"),
    ]
    nbformat.write(nb, folder / HARNESS_NOTEBOOK)
    return HARNESS_NOTEBOOK


def test_server_stops_with_its_kernels(tmp_path):
    import psutil

    from fp16lab.testing import jupyter_server

    with jupyter_server(tmp_path) as server:
        server.api("kernels", method="POST")
        pids = server.processes()
        assert len(pids) >= 2, f"expected the server and a kernel, found {pids}"
    alive = [p for p in pids if psutil.pid_exists(p)
             and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left behind: {alive}"


def test_server_stops_when_the_block_raises(tmp_path):
    import psutil

    from fp16lab.testing import jupyter_server

    pids: list[int] = []
    with pytest.raises(RuntimeError, match="a test failed"):
        with jupyter_server(tmp_path) as server:
            server.api("kernels", method="POST")
            pids = server.processes()
            raise RuntimeError("a test failed")
    assert len(pids) >= 2
    alive = [p for p in pids if psutil.pid_exists(p)
             and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left behind: {alive}"


def test_bad_root_dir_is_refused(tmp_path):
    from fp16lab.testing import jupyter_server

    with pytest.raises(NotADirectoryError, match="missing"):
        with jupyter_server(tmp_path / "missing"):
            pass


@pytest.mark.browser
def test_error_check_fails_on_a_raising_cell_and_a_slider_reaches_the_kernel(lab, open_notebook):
    """One notebook, opened once (opening costs more than both checks): first the error check,
    then the widget round trip through the kernel."""
    from playwright.sync_api import expect

    nb = open_notebook(_write_harness_notebook(lab.root_dir))
    state = nb.run_all(timeout=120)
    nb.shot("after-run-all")
    assert [(e["cell"], e["ename"]) for e in state["errors"]] == [(3, "ZeroDivisionError")]
    # JupyterLab 4 renders an error exactly like a stderr stream: same class, same mime type.
    assert state["errors"][0]["mime"] == "application/vnd.jupyter.stderr"
    assert "ZeroDivisionError" in state["errors"][0]["shown"]
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        nb.assert_no_errors(state)
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        nb.run_all_without_errors()

    echo = nb.page.locator(".harness-echo")
    expect(echo).to_have_text("kernel saw 3")
    handle = nb.page.locator(".harness-slider .noUi-handle")
    handle.focus()
    handle.press("ArrowRight")
    handle.press("ArrowRight")
    expect(echo).to_have_text("kernel saw 5")  # set by the observer, in the kernel
    nb.shot("slider-moved", nb.cell_of(handle).locator(".jp-Cell-outputArea"))

"""Every numbered notebook, opened in JupyterLab and run with Run > Run All Cells, shows no error.

An error output is read from the notebook model in the page (output_type "error"): JupyterLab 4
renders it exactly like text written to stderr, so the DOM alone cannot tell a traceback from a
warning. The harness test proves the check fails on a raising cell.
"""

from __future__ import annotations

import os
import pathlib

import pytest

pytestmark = pytest.mark.browser

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = pathlib.Path(os.environ.get("FP16LAB_NOTEBOOKS", ROOT / "notebooks"))
NOTEBOOKS = sorted(p.name for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("name", NOTEBOOKS, ids=[pathlib.Path(n).stem for n in NOTEBOOKS])
def test_run_all_shows_no_error(open_notebook, name):
    nb = open_notebook(name)
    state = nb.run_all()
    nb.shot_whole_notebook("after-run-all")
    nb.assert_no_errors(state)
    assert state["pending"] == 0, f"{name}: {state['pending']} code cells did not run"
    assert state["codeCells"] > 0, f"{name} has no code cells"

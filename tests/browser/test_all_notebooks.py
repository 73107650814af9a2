"""Every numbered notebook, opened in JupyterLab and run with Run > Run All Cells, shows no error.

Notebooks 01, 02 and 04 are run (and checked) by their widget tests; this file runs the rest.

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
# These run all their cells, and check for errors, in their own tests (test_notebook_NN.py)
# before they exercise the widgets; running them twice would double the slowest part.
WIDGET_TESTED = ("01_", "02_", "04_")
ALL = sorted(p.name for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
NOTEBOOKS = [n for n in ALL if not n.startswith(WIDGET_TESTED)]


@pytest.mark.parametrize("name", NOTEBOOKS, ids=[pathlib.Path(n).stem for n in NOTEBOOKS])
def test_run_all_shows_no_error(open_notebook, name, lab_executed):
    """Each runs once in this session: its outputs, kept in ``lab_executed``, are what
    tests/test_notebooks.py checks for readability, instead of a second execution."""
    open_notebook(name).run_all_without_errors(keep=lab_executed)


def test_widget_notebooks_have_their_own_tests():
    """The notebooks left out above are each run by exactly one widget test."""
    here = pathlib.Path(__file__).parent
    for prefix in WIDGET_TESTED:
        matches = [n for n in ALL if n.startswith(prefix)]
        assert len(matches) == 1, f"expected one notebook {prefix}*.ipynb, found {matches}"
        assert (here / f"test_notebook_{prefix.rstrip('_')}.py").is_file(), prefix

"""Every notebook executes top to bottom on whatever device is here, and is committed clean."""

from __future__ import annotations

import json
import pathlib
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ARTIFACTS = ROOT / "test-artifacts" / "executed"


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no numbered notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"])
             if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))]
    assert not dirty, f"{path.name}: code cells {dirty} carry outputs; clear them before committing"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    try:
        client.execute()
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, ARTIFACTS / path.name)
    elapsed = time.perf_counter() - t0
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    print(f"{path.name} executed in {elapsed:.1f} s")


@pytest.mark.notebook
def test_notebook_04_stops_when_every_training_step_raises():
    """A training step that always raises is recorded as an 'error' row by the sweep; notebook 04
    must stop at its own check with a message, not stay green."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = next(p for p in NOTEBOOKS if p.name.startswith("04_"))
    nb = nbformat.read(path, as_version=4)
    plant = nbformat.v4.new_code_cell(
        "import fp16lab.sweep.steps as _steps\n"
        "_real = _steps.make_train_step\n"
        "def _always_raises(*args, **kwargs):\n"
        "    _, scaler = _real(*args, **kwargs)\n"
        "    def step():\n"
        "        raise RuntimeError('planted: this training step always fails')\n"
        "    return step, scaler\n"
        "_steps.make_train_step = _always_raises")
    nb.cells.insert(0, plant)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    with pytest.raises(CellExecutionError) as info:
        client.execute()
    assert "AssertionError" in str(info.value) and "failed" in str(info.value)
    assert "planted" in str(info.value)  # the learner's message names the error

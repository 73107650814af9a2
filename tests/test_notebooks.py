"""Every notebook executes top to bottom on whatever device is here, and is committed clean."""

from __future__ import annotations

import html
import json
import pathlib
import re
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


_EXECUTED: dict[pathlib.Path, tuple[object, float] | Exception] = {}


def _cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


def executed(path: pathlib.Path, lab_executed: dict):
    """Returns (the executed notebook, seconds): executed once per test session, kept for every
    test that reads its outputs, and written to test-artifacts/executed/ (also when a cell fails).

    A notebook the browser tests ran with Run All in JupyterLab this session, without an error
    and with the cells committed now, is not executed again: its outputs there are read."""
    if path not in _EXECUTED:
        import nbformat
        from nbclient import NotebookClient

        nb = nbformat.read(path, as_version=4)
        if path.name in lab_executed:
            raw, seconds = lab_executed[path.name]
            # JupyterLab's model gives a markdown cell without attachments "attachments": null,
            # which its server drops when it saves; reads() also rejoins multiline strings
            raw = {**raw, "cells": [{k: v for k, v in c.items() if v is not None}
                                    for c in raw["cells"]]}
            in_lab = nbformat.reads(json.dumps(raw), as_version=4)
            if _cells(in_lab) == _cells(nb):
                _EXECUTED[path] = (in_lab, seconds)
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                nbformat.write(in_lab, ARTIFACTS / path.name)
                return _EXECUTED[path]
        client = NotebookClient(nb, timeout=900, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        t0 = time.perf_counter()
        try:
            client.execute()
            _EXECUTED[path] = (nb, time.perf_counter() - t0)
        except Exception as e:  # kept, so the next test reading it fails the same way
            _EXECUTED[path] = e
        finally:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, ARTIFACTS / path.name)
    if isinstance(_EXECUTED[path], Exception):
        raise _EXECUTED[path]
    return _EXECUTED[path]


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, lab_executed):
    nb, elapsed = executed(path, lab_executed)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    where = "in JupyterLab (the browser test's Run All)" if path.name in lab_executed else ""
    print(f"{path.name} executed {where} in {elapsed:.1f} s".replace("  ", " "))


def test_a_lab_run_is_read_only_where_its_cells_are_the_committed_ones(tmp_path):
    """A notebook the browser ran with the same cells: its outputs are read, nothing executes.
    One whose cells differ (edited since): executed here, its Lab outputs ignored."""
    import nbformat
    path = tmp_path / "zz_lab_reuse_check.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")]),
                   path)
    lab = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    lab.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="from the lab\n")]
    raw = json.loads(nbformat.writes(lab))
    raw["cells"][0]["attachments"] = None  # as JupyterLab's model gives it
    try:
        nb, seconds = executed(path, {path.name: (raw, 2.5)})
        assert seconds == 2.5 and nb.cells[0].outputs[0]["text"] == "from the lab\n"
        _EXECUTED.pop(path)
        raw["cells"][0]["source"] = "print(6 * 9)"  # the committed cell changed since the run
        nb, _ = executed(path, {path.name: (raw, 2.5)})
        assert nb.cells[0].outputs[0]["text"] == "42\n"
    finally:
        _EXECUTED.pop(path, None)
        (ARTIFACTS / path.name).unlink(missing_ok=True)


# What a learner reads must be a sentence or a rounded table, never an object's field dump or a
# float carrying every digit it was computed with. The rule, per output a front end shows:
# - which text: a stream's text; for a rich output its text/html with the tags removed when it
#   has one, else its text/plain; outputs a front end draws (an image, a widget) are not read;
# - a repr is ``<... object at 0x...>`` (or ``<... at 0x...>``), or ``Name(field=`` where Name is
#   a dataclass or named tuple of fp16lab (a question that quotes ``GradScaler(init_scale=...)``
#   is code, not a dump);
# - an unrounded float is a decimal number (plain or with an exponent) whose fraction is not all
#   zeros and that has more than MAX_DIGITS significant digits, counted from its first non-zero
#   digit to its last non-zero digit: 0.30000000000000004 and 1234.5678901 fail, 0.9995, 649.8,
#   1195.3 and 6.1e-05 pass, and so do 65536.0 and 1.000000 (whole numbers, whatever pandas
#   pads them with) and integers of any length.
MAX_DIGITS = 5
_DECIMAL = re.compile(r"(?<![\w.])(\d*)\.(\d+)(?:[eE][-+]?\d+)?(?![\w.])")
_OBJECT_AT = re.compile(r"<[\w.]+(?: object)? at 0x[0-9a-fA-F]+>")

# (notebook, cell id): why long digits are what the cell teaches
LONG_DIGITS_ALLOWED = {
    ("01_fp16_bits", "ab2e375e"): "explain(1.0): the exact value and neighbours of a code",
    ("01_fp16_bits", "22c195cb"): "explain(-2.5): the neighbours 2^-9 apart, digit for digit",
    ("01_fp16_bits", "0cbf1f94"): "special values: the smallest subnormal's exact value",
    ("01_fp16_bits", "73d94d29"): "what tiny values become in fp16: the stored value's digits",
    ("01_fp16_bits", "831572b3"): "next value up and ULP at each magnitude, exactly",
    ("01_fp16_bits", "e002faa6"): "the formats' exact limits (max, smallest normal, epsilon)",
    ("01_fp16_bits", "013a36cd"): "the digits a weight keeps after 1000 updates in each format",
    ("01_fp16_bits", "75f9c9d4"): "fp16 against bf16: which digits of 0.1 and 1/3 survive",
    ("01_fp16_bits", "95222510"): "hex codes decoded to their exact values",
    ("08_beyond_one_gpu", "6fa83395"): "what each comm hook's wire format makes of the same values",
    # not a lesson: sweep.format_report prints step ms with 2 decimals, 6 digits for a CPU step
    # over a second; to go once fp16lab/sweep/report.py rounds them
    ("04_interactive_sweeps", "9791b88a"): "CPU step times in ms from format_report",
}


def _fp16lab_record_names() -> set[str]:
    import dataclasses
    import importlib
    import pkgutil

    import fp16lab

    names = set()
    for info in pkgutil.walk_packages(fp16lab.__path__, "fp16lab."):
        try:
            module = importlib.import_module(info.name)
        except Exception:  # a module needing cupy or DALI, absent here
            continue
        for name, obj in vars(module).items():
            if isinstance(obj, type) and obj.__module__ == module.__name__ and (
                    dataclasses.is_dataclass(obj) or hasattr(obj, "_fields")):
                names.add(name)
    return names


def shown_text(output) -> str:
    """Returns the text a front end shows for one output ('' for images and widgets)."""
    if output.get("output_type") == "stream":
        return output.get("text", "")
    data = output.get("data", {})
    if "text/html" in data:
        return html.unescape(re.sub(r"<[^>]+>", " ", data["text/html"]))
    if any(k.startswith("image/") or "widget" in k for k in data):
        return ""
    return data.get("text/plain", "")


def significant_digits(whole: str, fraction: str) -> int:
    digits = (whole + fraction).lstrip("0").rstrip("0")
    return len(digits)


def unreadable(text: str, records: set[str]) -> list[str]:
    """Returns the reprs and unrounded floats in a text, by the rule above."""
    found = _OBJECT_AT.findall(text)
    found += [m.group(0) for m in re.finditer(r"\b([A-Z]\w*)\(\w+=", text) if m.group(1) in records]
    found += [m.group(0) for m in _DECIMAL.finditer(text)
              if m.group(2).strip("0") and significant_digits(m.group(1), m.group(2)) > MAX_DIGITS]
    return found


def test_unreadable_finds_what_the_rule_names():
    records = {"Explanation"}
    assert unreadable("0.30000000000000004 and 1234.5678901", records) == \
        ["0.30000000000000004", "1234.5678901"]
    assert unreadable("0.9995 649.8 1195.3 6.1e-05 65536.0 1.000000 123456789 v1.2.3", records) == []
    assert unreadable("5.960464e-08", records) == ["5.960464e-08"]
    assert unreadable("Explanation(fmt='fp16', given=1.0)", records) == ["Explanation(fmt="]
    assert unreadable("use GradScaler(init_scale=2**16)", records) == []
    assert unreadable("<fp16lab.census.X object at 0x7f00ab12>", records) == \
        ["<fp16lab.census.X object at 0x7f00ab12>"]


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_outputs_are_readable(path, lab_executed):
    """No object repr, and no float with more than MAX_DIGITS significant digits, in what a learner
    reads (the outputs of the same execution as test_notebook_executes)."""
    nb, _ = executed(path, lab_executed)
    records = _fp16lab_record_names()
    bad = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        long_ok = (path.stem, cell.get("id")) in LONG_DIGITS_ALLOWED
        for output in cell.get("outputs", []):
            found = unreadable(shown_text(output), records)
            if long_ok:
                found = [f for f in found if not _DECIMAL.fullmatch(f)]
            if found:
                bad.append(f"cell {i} (id {cell.get('id')}): {', '.join(found[:4])}")
    assert not bad, f"{path.name}: a repr or an unrounded float in a learner's output:\n" + \
        "\n".join(bad)


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

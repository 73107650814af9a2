"""Notebook timing: sections and problems read from an executed notebook, the table from the files."""

from __future__ import annotations

import json

import nbformat
import pytest

from fp16lab.bench import notebook_times as nt


def _cell(kind, source, start=None, end=None, outputs=()):
    c = (nbformat.v4.new_markdown_cell(source) if kind == "markdown"
         else nbformat.v4.new_code_cell(source, outputs=list(outputs)))
    if start:
        c.metadata["execution"] = {"iopub.execute_input": start, "shell.execute_reply": end}
    return c


def test_sections_sum_cell_times_under_each_heading():
    nb = nbformat.v4.new_notebook(cells=[
        _cell("code", "a", "2026-01-01T00:00:00.000Z", "2026-01-01T00:00:02.500Z"),
        _cell("markdown", "## 1. First\ntext"),
        _cell("code", "b", "2026-01-01T00:00:03Z", "2026-01-01T00:00:13Z"),
        _cell("code", "c", "2026-01-01T00:00:13Z", "2026-01-01T00:01:13Z"),
        _cell("markdown", "### not a section\n## 2. Second"),
        _cell("code", "d"),  # never ran: no timing
    ])
    assert nt.sections(nb) == [("opening", 2.5), ("1. First", 70.0), ("2. Second", 0.0)]


def test_problems_finds_errors_warnings_and_tracebacks_only():
    out = nbformat.v4.new_output
    nb = nbformat.v4.new_notebook(cells=[
        _cell("code", "x", outputs=[out("stream", name="stdout", text="Warning in stdout is text\n")]),
        _cell("code", "y", outputs=[out("stream", name="stderr", text="a.py:3: UserWarning: careful\n")]),
        _cell("code", "z", outputs=[out("error", ename="ValueError", evalue="bad", traceback=[])]),
        _cell("code", "w", outputs=[out("stream", name="stderr", text="100%|####| 4/4\n")]),
        # how Python shows a warning: its message, then the source line that raised it
        _cell("code", "v", outputs=[out("stream", name="stderr", text=(
            "/x/torch/profiler/profiler.py:300: UserWarning: Profiler clears events\n"
            "  _warn_once(\n"))]),
    ])
    assert nt.problems(nb) == ["cell 1: a.py:3: UserWarning: careful", "cell 2: ValueError: bad",
                               "cell 4: /x/torch/profiler/profiler.py:300: UserWarning: "
                               "Profiler clears events"]


META = {"measured_at": "2026-11-30T15:00:00+00:00", "gpu_name": None, "torch": "2.13.0+cpu"}


def test_section_minutes_reads_both_files(tmp_path, monkeypatch):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    assert nt.section_minutes("03") == "No timings of this notebook in data/."  # no file at all
    row = {"notebook": "03_x", "wall_s": 90.0, "finished": True, "error": "", "problems": [],
           "sections": [{"section": "opening", "seconds": 6.0}, {"section": "1. A", "seconds": 84.0}]}
    (tmp_path / "notebook_times_cpu.json").write_text(json.dumps({"meta": META, "rows": [row]}))
    t = nt.section_minutes("03")
    assert list(t.index) == ["opening", "1. A", "whole notebook"]
    assert t["minutes on a CPU"].tolist() == [0.1, 1.4, 1.5]
    assert set(t["minutes on a GPU"]) == {"no measurement"}
    (tmp_path / "notebook_times.json").write_text(json.dumps(
        {"meta": {**META, "gpu_name": "NVIDIA H200"}, "rows": [{**row, "wall_s": 30.0}]}))
    assert nt.section_minutes("03")["minutes on NVIDIA H200"]["whole notebook"] == 0.5


def test_unknown_notebook_number_is_refused(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    with pytest.raises(SystemExit, match="2"):
        nt.main(["--only", "42"])
    assert "argument --only: must be one of '01'" in capsys.readouterr().err


def test_workshop_table_and_update_from_the_files(tmp_path, monkeypatch):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    row = {"notebook": "03_x", "wall_s": 90.0, "finished": True, "error": "", "problems": [],
           "sections": [], "load_average_1min": 11.6, "cpus": 2}
    (tmp_path / "notebook_times_cpu.json").write_text(json.dumps(
        {"meta": META, "rows": [row, {**row, "notebook": "04_y",
                                                           "finished": False}]}))
    table = nt.workshop_table()
    assert "| `03_x` | | | | 1.5 (load 12 on 2 cores) | no measurement |" in table
    assert "| `04_y` | | | | did not finish (load 12 on 2 cores) | no measurement |" in table
    (tmp_path / "notebook_times.json").write_text(json.dumps(
        {"meta": {**META, "gpu_name": "NVIDIA H200"}, "rows": [{**row, "wall_s": 30.0}]}))
    assert "| execution minutes on a CPU | execution minutes on NVIDIA H200 |" in \
        nt.workshop_table()
    assert "| `03_x` | | | | 1.5 (load 12 on 2 cores) | 0.5 |" in nt.workshop_table()
    guide = tmp_path / "WORKSHOP.md"
    start, end = nt.WORKSHOP_MARKERS
    guide.write_text(f"intro\n{start}\nold table\n{end}\nafter\n")
    nt.update_workshop(guide)
    text = guide.read_text()
    assert "old table" not in text and text.startswith("intro\n") and text.endswith(f"{end}\nafter\n")
    assert nt.workshop_table() in text
    guide.write_text("no markers")
    with pytest.raises(ValueError, match="notebook-times:start"):
        nt.update_workshop(guide)


def test_the_guide_shows_the_measured_table_and_every_exercise():
    import importlib
    import pkgutil

    import fp16lab.exercises as exercises

    guide = (nt.NOTEBOOKS_DIR / "WORKSHOP.md").read_text()
    start, end = nt.WORKSHOP_MARKERS
    assert guide.split(start, 1)[1].split(end, 1)[0].strip() == nt.workshop_table().strip(), \
        "WORKSHOP.md's table is stale: run python -m fp16lab.bench.notebook_times --workshop"
    for info in pkgutil.iter_modules(exercises.__path__):
        if not info.name.startswith("ch"):
            continue
        module = importlib.import_module(f"fp16lab.exercises.{info.name}")
        row = next((line for line in guide.splitlines() if line.startswith(f"| {info.name[2:]} |")), "")
        for q in (n for n in module.__all__ if n[0] == "q" and n[1:].isdigit()):
            assert f"{q} " in row, f"WORKSHOP.md does not list {info.name}.{q}"


@pytest.mark.notebook
def test_execute_saves_the_executed_notebook_even_when_a_cell_fails(tmp_path):
    src = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("## first"),
        nbformat.v4.new_code_cell("print(6 * 7)"),
        nbformat.v4.new_code_cell("raise ValueError('planted')"),
        nbformat.v4.new_code_cell("print('never')"),
    ])
    path = tmp_path / "99_tiny.ipynb"
    nbformat.write(src, path)
    row = nt.execute(path, timeout=120, save_to=tmp_path / "executed")
    assert not row["finished"] and row["error"].startswith("CellExecutionError")
    saved = nbformat.read(tmp_path / "executed" / "99_tiny.ipynb", as_version=4)
    assert saved.cells[1].outputs[0]["text"] == "42\n"
    assert saved.cells[2].outputs[0]["ename"] == "ValueError"
    assert saved.cells[3].get("outputs") == []
    assert any("ValueError: planted" in p for p in row["problems"])


def test_section_summary_names_only_the_long_sections(tmp_path, monkeypatch):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    assert nt.section_summary("03") == "No timings of this notebook in data/."
    row = {"notebook": "03_x", "wall_s": 150.0, "finished": True, "error": "", "problems": [],
           "sections": [{"section": "opening", "seconds": 6.0}, {"section": "1. A", "seconds": 144.0}]}
    (tmp_path / "notebook_times_cpu.json").write_text(json.dumps({"meta": META, "rows": [row]}))
    text = nt.section_summary("03")
    assert text == ("Running every cell takes about 2 min on a CPU. Sections that take a minute or "
                    "more: '1. A' (about 2 min on a CPU).")
    assert "opening" not in text


def test_learner_minutes_counts_the_words_of_the_text_and_the_exercises(tmp_path):
    nb = {"cells": [
        {"cell_type": "markdown", "source": ["# One two\n", "three, four's five."]},
        {"cell_type": "code", "source": ["words = 'not counted in code'\n", "ex.q1.check(a)"]},
        {"cell_type": "code", "source": ["ex.q1.check(b)  # the same exercise again\n"]},
        {"cell_type": "code", "source": ["ex.q3.check(c)"]},
        {"cell_type": "code", "source": ["ex.pipeline.check((A, b, c))  # a coding exercise\n",
                                         "spec.check(x)  # not an exercise of the chapter"]},
        {"cell_type": "markdown", "source": ["six"]}]}
    path = tmp_path / "01_x.ipynb"
    path.write_text(json.dumps(nb))
    got = nt.learner_minutes(path)
    assert got["words"] == 6 and got["exercises"] == 3
    assert got["minutes"] == pytest.approx(6 / nt.READING_WPM + 3 * nt.EXERCISE_MIN)

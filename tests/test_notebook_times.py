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
    ])
    assert nt.problems(nb) == ["cell 1: a.py:3: UserWarning: careful", "cell 2: ValueError: bad"]


def test_section_minutes_reads_both_files(tmp_path, monkeypatch):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    assert "not measured yet" in nt.section_minutes("03").lower() or \
        "no timings" in nt.section_minutes("03").lower()
    row = {"notebook": "03_x", "wall_s": 90.0, "finished": True, "error": "", "problems": [],
           "sections": [{"section": "opening", "seconds": 6.0}, {"section": "1. A", "seconds": 84.0}]}
    (tmp_path / "notebook_times_cpu.json").write_text(json.dumps({"meta": {}, "rows": [row]}))
    t = nt.section_minutes("03")
    assert list(t.index) == ["opening", "1. A", "whole notebook"]
    assert t["minutes on a CPU"].tolist() == [0.1, 1.4, 1.5]
    assert set(t["minutes on a GPU"]) == {"not measured yet"}
    (tmp_path / "notebook_times.json").write_text(json.dumps(
        {"meta": {"gpu_name": "NVIDIA H200"}, "rows": [{**row, "wall_s": 30.0}]}))
    assert nt.section_minutes("03")["minutes on NVIDIA H200"]["whole notebook"] == 0.5


def test_unknown_notebook_number_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    with pytest.raises(SystemExit, match="no notebook numbered 42"):
        nt.main(["--only", "42"])

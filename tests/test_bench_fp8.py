"""fp16lab.bench.fp8's result file: a run of some parts keeps the rows of the others, dated."""

from __future__ import annotations

import pytest

from fp16lab import measure
from fp16lab.bench import fp8 as bf

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_a_run_of_some_parts_keeps_the_other_parts_rows(tmp_path, monkeypatch):
    clock = iter(["2026-01-01T00:00:00+00:00", "2026-02-02T00:00:00+00:00", "2026-03-03T00:00:00+00:00"])
    monkeypatch.setattr(bf, "_utc_now", lambda: next(clock))
    assert bf.main(["--quick", "--parts", "gemm", "--out", str(tmp_path)]) == 0
    first = measure.read_result(next(tmp_path.glob("fp8_*.json")))
    gemm = [r for r in first["rows"] if r["part"] == "gemm"]
    assert gemm and {r["part"] for r in first["rows"]} == {"gemm"}
    assert first["meta"]["parts_measured_at"] == {"gemm": "2026-01-01T00:00:00+00:00"}

    assert bf.main(["--quick", "--parts", "recipes", "--out", str(tmp_path)]) == 0
    second = measure.read_result(next(tmp_path.glob("fp8_*.json")))
    assert [r for r in second["rows"] if r["part"] == "gemm"] == gemm  # kept as they were
    assert {r["precision"] for r in second["rows"] if r["part"] == "training"} == \
        {"fp32", *(f"fp8-{r}" for r in bf.fp8.RECIPES)}
    assert second["meta"]["parts_measured_at"] == {"gemm": "2026-01-01T00:00:00+00:00",
                                                   "training": "2026-02-02T00:00:00+00:00"}

    assert bf.main(["--quick", "--parts", "gemm", "--out", str(tmp_path)]) == 0  # gemm again
    third = measure.read_result(next(tmp_path.glob("fp8_*.json")))
    assert sum(r["part"] == "gemm" for r in third["rows"]) == len(gemm)  # replaced, not doubled
    assert third["meta"]["parts_measured_at"]["gemm"] == "2026-03-03T00:00:00+00:00"
    assert third["meta"]["parts_measured_at"]["training"] == "2026-02-02T00:00:00+00:00"


def test_a_full_size_run_does_not_keep_quick_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(bf, "_utc_now", lambda: "2026-01-01T00:00:00+00:00")
    assert bf.main(["--quick", "--parts", "gemm", "--out", str(tmp_path)]) == 0
    path = next(tmp_path.glob("fp8_*.json"))
    quick_name = path.name
    monkeypatch.setattr(bf, "_result_name", lambda device, quick: quick_name.removesuffix(".json"))
    monkeypatch.setattr(bf, "training_rows", lambda *a, **k: [{"part": "training", "precision": "fp32",
                                                              "mode": "eager", "error": "stub"}])
    assert bf.main(["--parts", "recipes", "--out", str(tmp_path)]) == 0
    rows = measure.read_result(path)["rows"]
    assert {r["part"] for r in rows} == {"training"}  # the quick gemm rows were not mixed in


def test_bad_parts_are_refused_before_any_work(capsys):
    with pytest.raises(SystemExit):
        bf.main(["--parts", "gemm,tensorcores"])
    assert ("argument --parts: must be one of 'gemm', 'accumulation', 'speed', 'recipes', 'blockwise'; "
            "got 'tensorcores'") in capsys.readouterr().err

"""Measured result files: the location rule, this machine's files before the committed ones, provenance."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fp16lab import measure
from fp16lab.measure import provenance


def test_result_roundtrip(tmp_path):
    rows = [{"size": 4096, "tflops": np.float32(1.5)}]
    path = measure.write_result("demo", rows, meta={"note": "x"}, data_dir=tmp_path)
    back = measure.read_result("demo", data_dir=tmp_path)
    assert back["rows"] == [{"size": 4096, "tflops": 1.5}]
    assert back["meta"]["note"] == "x" and "torch" in back["meta"]
    assert measure.read_result(path)["rows"] == back["rows"]
    assert "measured on" in measure.describe_source(back["meta"])
    # written back (a benchmark merging a file it read), the reader's note stays out of it
    assert back["meta"]["read_from"] == str(path)
    measure.write_result("demo", back["rows"], meta=back["meta"], data_dir=tmp_path)
    assert "read_from" not in json.loads(path.read_text())["meta"]


def test_result_errors(tmp_path):
    with pytest.raises(ValueError, match="plain file stem"):
        measure.write_result("../x", [], data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="no measured result"):
        measure.read_result("missing", data_dir=tmp_path)


def test_merge_keeps_other_devices_with_their_source(tmp_path):
    old_path = measure.write_result("merge", [{"device": "cpu", "x": 1}, {"device": "cuda", "x": 2}],
                                  meta={"gpu_name": "Elsewhere GPU"}, data_dir=tmp_path)
    old_meta = measure.read_result(old_path)["meta"]
    merged = measure.merge_with_previous("merge", [{"device": "cuda", "x": 3}], data_dir=tmp_path)
    assert [(r["device"], r["x"]) for r in merged] == [("cpu", 1), ("cuda", 3)]
    assert merged[0]["measured_on"] == measure.describe_source(old_meta)
    assert "Elsewhere GPU" in merged[0]["measured_on"]
    assert merged[1]["measured_on"] != merged[0]["measured_on"] or old_meta["gpu_name"] is None


def test_merge_without_previous_file(tmp_path):
    rows = measure.merge_with_previous("none", [{"device": "cpu"}], data_dir=tmp_path)
    assert len(rows) == 1 and "measured on" in rows[0]["measured_on"]


def test_an_empty_data_setting_is_refused(monkeypatch):
    monkeypatch.setenv("FP16LAB_DATA", "")
    with pytest.raises(ValueError, match="FP16LAB_DATA is set but empty"):
        measure.data_dir()
    with pytest.raises(ValueError, match="FP16LAB_DATA"):
        measure.read_result("gemm")


def test_the_data_setting_names_the_committed_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    assert measure.data_dir() == tmp_path
    assert measure.local_dir() == tmp_path / "local"


def test_without_the_setting_a_checkout_uses_its_data_folder(monkeypatch):
    monkeypatch.delenv("FP16LAB_DATA", raising=False)
    import fp16lab
    from pathlib import Path
    root = Path(fp16lab.__file__).resolve().parents[1]
    assert measure.data_dir() == root / "data"
    assert (measure.data_dir() / "gemm.json").is_file()


def test_an_installed_package_uses_the_data_it_ships(tmp_path, monkeypatch):
    # no pyproject.toml beside the package: not a checkout
    monkeypatch.delenv("FP16LAB_DATA", raising=False)
    monkeypatch.setattr(provenance, "_PACKAGE", tmp_path / "site-packages" / "fp16lab")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert measure.data_dir() == tmp_path / "site-packages" / "fp16lab" / "measured"
    assert measure.local_dir() == tmp_path / "cache" / "fp16lab"  # not inside site-packages


def test_a_benchmark_writes_locally_unless_told_to_replace(tmp_path, monkeypatch):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    committed = measure.write_result("demo", [{"x": 1}], meta={"gpu_name": "H200"}, replace=True)
    assert committed == tmp_path / "demo.json"
    r = measure.read_result("demo")
    assert r["rows"] == [{"x": 1}] and "(shipped with fp16lab)" in measure.describe_source(r["meta"])
    mine = measure.write_result("demo", [{"x": 2}])
    assert mine == tmp_path / "local" / "demo.json"
    assert json.loads(committed.read_text())["rows"] == [{"x": 1}]  # left alone
    r = measure.read_result("demo")
    assert r["rows"] == [{"x": 2}]
    assert "demo.json (measured on this machine)" in measure.describe_source(r["meta"])
    assert measure.find_result("demo") == mine


def test_a_measured_file_with_no_rows_is_refused_naming_the_file(tmp_path):
    from fp16lab import measure

    path = measure.write_result("empty_bench", [], data_dir=tmp_path)
    with pytest.raises(ValueError, match=r"empty_bench\.json: holds no measured rows"):
        measure.read_result(path)
    assert measure.read_result(path, allow_empty=True)["rows"] == []


def test_a_benchmark_reader_names_the_file_and_the_missing_field(tmp_path, monkeypatch):
    from fp16lab import measure
    from fp16lab.bench import notebook_times

    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    monkeypatch.setattr(notebook_times, "result_name", lambda gpu: "nb_times")
    measure.write_result("nb_times", [{"minutes": 1.0}], data_dir=tmp_path / "local")
    with pytest.raises(ValueError, match=r"nb_times\.json: row 0 lacks the field 'notebook'"):
        notebook_times.section_minutes("06")


def test_the_source_of_some_rows_is_said_at_their_own_time():
    meta = {"gpu_name": "NVIDIA H200", "measured_at": "T2", "torch": "2.11"}
    assert measure.describe_source(meta, with_file=False).endswith("at T2")
    kept = [{"measured_at": "T1"}, {"measured_at": "T1"}]  # merged in from an older run
    assert measure.describe_source(meta, with_file=False, rows=kept).endswith(") at T1")
    mixed = kept + [{"x": 1}]  # a row without a time is of the file's
    assert measure.describe_source(meta, with_file=False, rows=mixed).endswith("at T1 and T2")
    assert measure.describe_source(meta, with_file=False, rows=[]).endswith("at T2")

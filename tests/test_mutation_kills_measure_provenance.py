"""fp16lab.measure.provenance, beyond tests/test_measure_provenance.py: every refusal and its
message, the location rule's corners, the written file's form, and the provenance line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fp16lab.measure import provenance
from fp16lab.measure.provenance import (check_can_write, describe_source, find_result,
                                        is_read_only, local_dir, merge_with_previous,
                                        read_result, write_result)

META = {"measured_at": "2026-01-02T03:04:05+00:00", "gpu_name": "NVIDIA H200", "torch": "2.9.0"}


@pytest.fixture
def fixed_device(monkeypatch):
    """device.metadata() returns META: the written provenance is known in advance."""
    monkeypatch.setattr(provenance.device, "metadata", lambda: dict(META))


def _write_json(path: Path, payload) -> Path:
    path.write_text(json.dumps(payload))
    return path


# ------------------------------------------------------------------ the file's name


@pytest.mark.parametrize("bad", ["", "a/b", ".hidden"])
def test_write_refuses_a_name_that_is_not_a_plain_stem(tmp_path, bad):
    with pytest.raises(ValueError, match="result name must be a plain file stem"):
        write_result(bad, [{"x": 1}], data_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_write_takes_a_stem_with_a_dot_inside(tmp_path, fixed_device):
    assert write_result("gemm.v2", [{"x": 1}], data_dir=tmp_path) == tmp_path / "gemm.v2.json"


def test_find_result_takes_upper_case_names_and_suffixes(tmp_path, monkeypatch):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    assert find_result("Sweep_H200") == tmp_path / "Sweep_H200.json"
    assert find_result("trace", ".Parquet") == tmp_path / "trace.Parquet"


@pytest.mark.parametrize("bad", ["a/b", "../x", "a b", ""])
def test_find_result_refuses_a_name_outside_its_pattern_naming_the_form(tmp_path, monkeypatch,
                                                                        bad):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    with pytest.raises(ValueError) as e:
        find_result(bad)
    assert str(e.value) == f"name must be a string like 'sweep_h200', got {bad!r}"


@pytest.mark.parametrize("bad", ["json", ".", "./x", ".js on"])
def test_find_result_refuses_a_suffix_outside_its_pattern_naming_the_form(tmp_path, monkeypatch,
                                                                          bad):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    with pytest.raises(ValueError) as e:
        find_result("gemm", bad)
    assert str(e.value) == f"suffix must be a string like '.json', got {bad!r}"


# ------------------------------------------------------------------ where the files are


def test_a_checkout_writes_beside_its_committed_data(monkeypatch):
    monkeypatch.delenv("FP16LAB_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/elsewhere")
    root = Path(provenance.__file__).resolve().parents[2]
    expected = (root / "data" / "local" if os.access(root / "data", os.W_OK)
                else Path("/elsewhere/fp16lab"))  # a read-only checkout writes to the cache
    assert local_dir() == expected


@pytest.mark.parametrize("has", ["pyproject.toml", "data"])
def test_a_folder_with_only_one_of_pyproject_and_data_is_not_a_checkout(tmp_path, monkeypatch,
                                                                         has):
    monkeypatch.delenv("FP16LAB_DATA", raising=False)
    site = tmp_path / "site-packages"
    (site / "fp16lab").mkdir(parents=True)
    if has == "data":
        (site / "data").mkdir()
    else:
        (site / "pyproject.toml").write_text("")
    monkeypatch.setattr(provenance, "_PACKAGE", site / "fp16lab")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert provenance.data_dir() == site / "fp16lab" / "measured"
    assert local_dir() == tmp_path / "cache" / "fp16lab"


def test_an_installed_package_without_xdg_writes_under_home_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("FP16LAB_DATA", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(provenance, "_PACKAGE", tmp_path / "site-packages" / "fp16lab")
    assert local_dir() == tmp_path / "home" / ".cache" / "fp16lab"


def test_a_data_folder_not_made_yet_gets_its_local_folder_inside(tmp_path, monkeypatch):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path / "later"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert local_dir() == tmp_path / "later" / "local"


# ------------------------------------------------------------------ writing


def test_the_written_file_is_the_payload_one_key_per_line(tmp_path, fixed_device):
    rows = [{"shape": (2, 3), "tags": {"a"}, "file": Path("/x/y.csv"), "n": 1}]
    path = write_result("form", rows, meta={"note": "n"}, data_dir=tmp_path / "a" / "b")
    assert path == tmp_path / "a" / "b" / "form.json"  # missing folders are made
    expected = {"meta": {**META, "note": "n"},
                "rows": [{"shape": [2, 3], "tags": ["a"], "file": "/x/y.csv", "n": 1}]}
    # one-space indent, newline at the end: committed files diff line by line in git
    assert path.read_text() == json.dumps(expected, indent=1) + "\n"
    assert path.read_text().splitlines()[1] == ' "meta": {'
    assert sorted(p.name for p in path.parent.iterdir()) == ["form.json"]  # no temporary left


def test_writing_a_value_json_cannot_hold_names_its_type(tmp_path, fixed_device):
    class Gauge:
        pass

    with pytest.raises(TypeError) as e:
        write_result("bad", [{"g": Gauge()}], data_dir=tmp_path)
    assert str(e.value) == "cannot write Gauge to a result file"


# ------------------------------------------------------------------ reading: refusals


def test_a_missing_file_lists_what_the_folder_has(tmp_path):
    for stem in ("b_bench", "a_bench"):
        _write_json(tmp_path / f"{stem}.json", {})
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(FileNotFoundError) as e:
        read_result("gone", data_dir=tmp_path)
    assert str(e.value) == (f"no measured result {tmp_path / 'gone.json'}; {tmp_path} has: "
                            f"a_bench, b_bench")


def test_a_missing_file_in_an_empty_or_absent_folder_says_nothing_is_there(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        read_result("gone", data_dir=tmp_path)
    assert str(e.value) == f"no measured result {tmp_path / 'gone.json'}; {tmp_path} has: nothing"
    absent = tmp_path / "absent"
    with pytest.raises(FileNotFoundError) as e:
        read_result(absent / "gone.json")
    assert str(e.value) == f"no measured result {absent / 'gone.json'}; {absent} has: nothing"


def test_a_file_that_is_not_utf8_names_the_byte(tmp_path):
    p = tmp_path / "bin.json"
    p.write_bytes(b'{"meta": "\xff"}')
    with pytest.raises(ValueError) as e:
        read_result(p)
    assert str(e.value) == f"{p}: not a text file (byte 10 is not UTF-8)"


def test_a_truncated_file_names_where_the_json_breaks(tmp_path):
    p = tmp_path / "cut.json"
    p.write_text('{"meta": {},\n "rows": [')
    with pytest.raises(ValueError) as e:
        read_result(p)
    assert str(e.value) == (f"{p}: not valid JSON (Expecting value at line 2, column 11); "
                            f"a truncated copy? Measure it again or restore it")


@pytest.mark.parametrize("payload", [[], {"meta": META}, {"rows": [{"x": 1}]}, "text"])
def test_a_file_without_meta_and_rows_is_not_a_result_file(tmp_path, payload):
    p = _write_json(tmp_path / "other.json", payload)
    with pytest.raises(ValueError) as e:
        read_result(p)
    assert str(e.value) == f"{p} is not a fp16lab result file (needs 'meta' and 'rows' keys)"


def test_meta_that_is_not_an_object_names_its_type(tmp_path):
    p = _write_json(tmp_path / "m.json", {"meta": [1], "rows": [{"x": 1}]})
    with pytest.raises(ValueError) as e:
        read_result(p)
    assert str(e.value) == f"{p}: 'meta' must be an object, got list"


@pytest.mark.parametrize("rows", [[1, 2], {"x": 1}, [{"x": 1}, "y"]])
def test_rows_that_are_not_a_list_of_objects_are_refused(tmp_path, rows):
    p = _write_json(tmp_path / "r.json", {"meta": META, "rows": rows})
    with pytest.raises(ValueError) as e:
        read_result(p)
    assert str(e.value) == f"{p}: 'rows' must be a list of objects"


def test_missing_provenance_is_named_as_provenance(tmp_path):
    p = _write_json(tmp_path / "p.json",
                    {"meta": {"measured_at": "t", "gpu_name": None}, "rows": [{"x": 1}]})
    with pytest.raises(ValueError) as e:
        read_result(p)
    assert str(e.value) == (f"{p}: meta lacks the field 'torch', the provenance every measured "
                            f"file records (where and when it was measured)")


def test_a_loaders_dotted_field_is_looked_up_inside_meta(tmp_path):
    p = _write_json(tmp_path / "d.json",
                    {"meta": {**META, "summary": {"model": "resnet"}}, "rows": [{"x": 1}]})
    assert read_result(p, meta_needs=["summary.model"])["meta"]["summary"] == {"model": "resnet"}
    for needs, meta in [("summary.model", {**META, "summary": {}}),
                        ("summary.model", {**META, "summary": "resnet"}),  # not an object
                        ("summary.model.depth", {**META, "summary": {"model": {"d": 1}}})]:
        _write_json(p, {"meta": meta, "rows": [{"x": 1}]})
        with pytest.raises(ValueError) as e:
            read_result(p, meta_needs=[needs])
        assert str(e.value) == f"{p}: meta lacks the field {needs!r}, what this loader reads"


def test_a_row_lacking_a_field_names_the_row_and_every_field_needed(tmp_path):
    p = _write_json(tmp_path / "row.json", {"meta": META, "rows": [{"a": 1, "b": 2}, {"a": 3}]})
    with pytest.raises(ValueError) as e:
        read_result(p, rows_need=["a", "b"])
    assert str(e.value) == f"{p}: row 1 lacks the field 'b' (each row needs 'a', 'b')"


# ------------------------------------------------------------------ merging


def test_merge_keeps_where_each_row_says_it_was_measured(tmp_path, fixed_device):
    _write_json(tmp_path / "m.json", {"meta": {**META, "gpu_name": "Old GPU"}, "rows": [
        {"device": "cpu", "measured_on": "on a laptop"}, {"device": "mps"}]})
    merged = merge_with_previous("m", [{"device": "cuda", "measured_on": "on the H200 box"},
                                       {"device": "xpu"}], data_dir=tmp_path)
    here = describe_source(META)
    there = describe_source({**META, "gpu_name": "Old GPU", "read_from": str(tmp_path / "m.json")})
    assert [(r["device"], r["measured_on"]) for r in merged] == [
        ("cpu", "on a laptop"), ("mps", there), ("cuda", "on the H200 box"), ("xpu", here)]


def test_merge_with_an_earlier_file_of_no_rows_returns_this_runs_rows(tmp_path, fixed_device):
    _write_json(tmp_path / "e.json", {"meta": META, "rows": []})
    merged = merge_with_previous("e", [{"device": "cpu"}], data_dir=tmp_path)
    assert merged == [{"device": "cpu", "measured_on": describe_source(META)}]


# ------------------------------------------------------------------ the provenance line


def test_the_provenance_line_names_every_field():
    meta = {**META, "driver_version": "570.1", "cupy_version": "13.4"}
    assert describe_source(meta) == ("measured on NVIDIA H200 (driver 570.1, torch 2.9.0, "
                                     "CuPy 13.4) at 2026-01-02T03:04:05+00:00")


def test_the_provenance_line_says_what_was_not_recorded():
    assert describe_source({"gpu_name": None}) == (
        "measured on CPU (driver n/a, torch unrecorded, CuPy n/a) at an unrecorded time")
    assert describe_source({}) == ("measured on an unrecorded device (driver n/a, torch "
                                   "unrecorded, CuPy n/a) at an unrecorded time")


def test_the_provenance_line_names_the_file_and_whose_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    committed = {**META, "read_from": str(tmp_path / "gemm.json")}
    mine = {**META, "read_from": str(tmp_path / "local" / "gemm.json")}
    base = describe_source(META)
    assert describe_source(committed) == base + "; file gemm.json (shipped with fp16lab)"
    assert describe_source(mine) == base + "; file gemm.json (measured on this machine)"
    assert describe_source(mine, with_file=False) == base


# ------------------------------------------------------------------ can a file be written there


def test_is_read_only_reads_the_write_bits(tmp_path):
    f = tmp_path / "f"
    f.write_text("")
    f.chmod(0o644)
    assert is_read_only(f) is False
    f.chmod(0o444)
    assert is_read_only(f) is True
    f.chmod(0o555)  # execute bits are not write bits
    assert is_read_only(f) is True
    f.chmod(0o002)  # any write bit, even only others', marks it writable by someone
    assert is_read_only(f) is (not os.access(f, os.W_OK))
    f.chmod(0o644)


def test_is_read_only_names_a_missing_path(tmp_path):
    with pytest.raises(ValueError, match=r"^path: .*nothing does not exist$"):
        is_read_only(tmp_path / "nothing")


def test_check_can_write_passes_a_new_file_in_folders_not_made_yet(tmp_path):
    assert check_can_write(tmp_path / "a" / "b" / "c.json") is None
    f = tmp_path / "old.json"
    f.write_text("")
    assert check_can_write(f) is None
    assert check_can_write(str(f)) is None


def test_check_can_write_refuses_a_folder_under_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    target = f / "sub" / "x.json"
    with pytest.raises(ValueError) as e:
        check_can_write(target)
    assert str(e.value) == f"{target}: {f} is a file, so no folder can be made there"


def test_check_can_write_refuses_a_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        target = ro / "new" / "x.json"
        with pytest.raises(ValueError) as e:
            check_can_write(target)
        assert str(e.value) == f"{target}: the folder {ro} is read-only; write somewhere else"
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize("kind", ["read-only file", "folder"])
def test_check_can_write_does_not_replace_a_read_only_file_or_a_folder(tmp_path, kind):
    target = tmp_path / "x.json"
    if kind == "folder":
        target.mkdir()
    else:
        target.write_text("")
        target.chmod(0o444)
    with pytest.raises(ValueError) as e:
        check_can_write(target)
    assert str(e.value) == (f"{target} is read-only or not a regular file, so it is not "
                            f"replaced; write somewhere else or make it writable")

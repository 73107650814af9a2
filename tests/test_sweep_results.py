"""The sweep's results store: rows appended to parquet, a CSV copy beside it, read back by pandas."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest

from fp16lab.sweep.results import ROW_COLUMNS, append_rows, check_results_path, read_results


def _row(key: str, repeat: int, ms: float, status: str = "ok") -> dict:
    """A row with every field a reader insists on filled in."""
    return {"key": key, "model": "m", "batch": 8, "precision": "fp32", "device": "cpu",
            "repeat": repeat, "status": status, "warmup": 1, "steps": 2, "elapsed_s": 0.5,
            "finished_at": "2026-11-30T12:00:00", "step_ms_median": ms}


def test_an_absent_file_reads_as_no_rows_with_every_column(tmp_path):
    empty = read_results(tmp_path / "none.parquet")
    assert len(empty) == 0 and list(empty.columns) == list(ROW_COLUMNS)


def test_files_hold_exactly_the_row_columns_and_no_index(tmp_path):
    path = tmp_path / "r.parquet"
    append_rows(path, [_row("a", 0, 1.5), _row("a", 1, 2.5)])
    append_rows(path, [_row("b", 0, 3.5, "error")])
    # read with pyarrow and the csv module's view of the header: no index column in either
    assert pq.read_table(path).column_names == list(ROW_COLUMNS)
    header = (tmp_path / "r.csv").read_text().splitlines()[0]
    assert header == ",".join(ROW_COLUMNS)
    for df in (read_results(path), read_results(tmp_path / "r.csv")):
        assert list(df.columns) == list(ROW_COLUMNS)
        assert list(df.index) == [0, 1, 2]
        assert list(df["key"]) == ["a", "a", "b"] and list(df["repeat"]) == [0, 1, 0]
        assert list(df["step_ms_median"]) == [1.5, 2.5, 3.5]
        assert list(df["status"]) == ["ok", "ok", "error"]
    assert pd.read_parquet(path)["model"].tolist() == ["m"] * 3


def test_append_returns_what_a_reader_gets_and_takes_no_rows_too(tmp_path):
    path = tmp_path / "r.parquet"
    empty = append_rows(path, [])
    assert len(empty) == 0 and list(read_results(path).columns) == list(ROW_COLUMNS)
    append_rows(path, [_row("a", 0, 1.0)])
    both = append_rows(path, [_row("b", 0, 2.0), _row("b", 1, 3.0)])
    pd.testing.assert_frame_equal(both, read_results(path))
    assert list(both.index) == [0, 1, 2]


def test_only_parquet_files_take_rows(tmp_path):
    for name in ("r.csv", "r.CSV", "r"):
        with pytest.raises(ValueError, match=rf"^.*{name}: a results file must end in \.parquet "
                                             r"\(a \.csv copy is written beside it\)$"):
            append_rows(tmp_path / name, [_row("a", 0, 1.0)])
    append_rows(tmp_path / "deep" / "er" / "r.parquet", [_row("a", 0, 1.0)])  # folders made
    assert len(read_results(tmp_path / "deep" / "er" / "r.csv")) == 1


# ------------------------------------------------------------------------- what a reader refuses

def _refusal(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    return str(info.value)


def _csv(tmp_path, name: str, frame: pd.DataFrame):
    p = tmp_path / name
    frame.to_csv(p, index=False)
    return p


def _good(n: int = 3) -> pd.DataFrame:
    return pd.DataFrame([_row(f"k{i}", 0, 1.0 + i) for i in range(n)])


def test_damaged_files_are_refused_with_the_file_and_the_reason(tmp_path):
    p = tmp_path / "empty.csv"
    p.write_bytes(b"")
    assert _refusal(lambda: read_results(p)) == f"{p}: the file is empty"
    p = tmp_path / "binary.csv"
    p.write_bytes(b"key,model\n" + bytes(range(256)))
    assert _refusal(lambda: read_results(p)) == (
        f"{p}: not a text CSV file (byte 138 is not UTF-8)")  # 10 header bytes, then 0x80
    p = tmp_path / "cut.csv"
    p.write_text("key,model\nk0,m")
    assert _refusal(lambda: read_results(p)) == (
        f"{p}: the file ends mid-line: its last row is cut (an interrupted copy?)")
    p = tmp_path / "blank.csv"
    p.write_text("\n")
    assert _refusal(lambda: read_results(p)) == (
        f"{p}: not a readable CSV file (No columns to parse from file)")
    p = tmp_path / "junk.parquet"
    p.write_bytes(b"not parquet at all\n")
    message = _refusal(lambda: read_results(p))
    assert message.startswith(f"{p}: not a readable parquet file (ArrowInvalid: ")
    assert message.endswith(")")


def test_tables_that_are_not_sweep_results_are_refused_naming_what_is_missing(tmp_path):
    p = _csv(tmp_path, "other.csv", pd.DataFrame({"epoch": [1], "loss": [0.5]}))
    assert _refusal(lambda: read_results(p)) == (
        f"{p}: not a fp16lab sweep results file: it lacks the column(s) key, model, batch, "
        "layout, precision, device, repeat, status, error, warmup, steps, tolerance, "
        "step_ms_median, spread, elapsed_s, finished_at (it has epoch, loss)")
    eight = pd.DataFrame({f"c{i}": [i] for i in range(8)})
    p = _csv(tmp_path, "eight.csv", eight)
    assert _refusal(lambda: read_results(p)).endswith("(it has c0, c1, c2, c3, c4, c5, c6, c7)")
    nine = pd.DataFrame({f"c{i}": [i] for i in range(9)})
    p = _csv(tmp_path, "nine.csv", nine)
    assert _refusal(lambda: read_results(p)).endswith(
        "(it has c0, c1, c2, c3, c4, c5, c6, c7, ...)")


def test_rows_cut_short_or_with_wrong_values_are_refused_naming_the_first_bad_row(tmp_path):
    frame = pd.DataFrame(_good(4).reindex(columns=list(ROW_COLUMNS)))
    cut = frame.copy()
    cut.loc[1:2, "status"] = None  # rows 2 and 3 (counting from 1) lost their status
    p = _csv(tmp_path, "cut.csv", cut)
    assert _refusal(lambda: read_results(p)) == f"{p}: row 2 has no 'status' (a row cut short?)"
    words = frame.copy()
    words["batch"] = words["batch"].astype(object)
    words.loc[2, "batch"], words.loc[3, "batch"] = "eight", "nine"
    p = _csv(tmp_path, "words.csv", words)
    assert _refusal(lambda: read_results(p)) == f"{p}: row 3: 'batch' is 'eight', not a number"
    fine = frame.copy()
    fine.loc[1, "status"], fine.loc[3, "status"] = "fine", "great"
    p = _csv(tmp_path, "fine.csv", fine)
    assert _refusal(lambda: read_results(p)) == (
        f"{p}: row 2: status 'fine' is not one of ok, oom, error")


def test_an_older_file_reads_with_the_new_columns_and_keeps_its_own(tmp_path):
    from fp16lab.sweep.axes import AXIS_DEFAULTS

    old = _good(2).reindex(columns=[c for c in ROW_COLUMNS
                                    if c not in AXIS_DEFAULTS and c != "gpu_name"])
    old["note"] = ["x", "y"]  # a column a later tool added
    p = _csv(tmp_path, "old.csv", old)
    df = read_results(p)
    assert list(df.columns) == [*ROW_COLUMNS, "note"]
    for c, default in AXIS_DEFAULTS.items():
        assert list(df[c]) == [default, default], c
    assert df["gpu_name"].isna().all() and list(df["note"]) == ["x", "y"]


def test_paths_that_cannot_hold_results_are_refused_naming_them(tmp_path):
    for name, suffix in (("r.txt", "'.txt'"), ("r", "'nothing'")):
        p = tmp_path / name
        assert _refusal(lambda: read_results(p)) == (
            f"{p}: a results file ends in .parquet or .csv, not {suffix}")
    folder = tmp_path / "folder.parquet"
    folder.mkdir()
    assert _refusal(lambda: read_results(folder)) == (
        f"{folder}: is a folder; give a results file (.parquet, or its .csv copy)")
    assert _refusal(lambda: check_results_path(folder)) == (
        f"{folder}: is a folder; give a file name ending in .parquet")
    p = tmp_path / "r.csv"
    assert _refusal(lambda: check_results_path(p)) == (
        f"{p}: a results file must end in .parquet (a .csv copy is written beside it)")
    assert check_results_path(tmp_path / "new.parquet") == tmp_path / "new.parquet"
    bad_copy = tmp_path / "x.parquet"
    append_rows(bad_copy, [_row("a", 0, 1.0)])
    (tmp_path / "x.csv").write_text("epoch,loss\n1,0.5\n")  # the copy is another tool's table
    assert _refusal(lambda: check_results_path(bad_copy)).startswith(
        f"{tmp_path / 'x.csv'}: not a fp16lab sweep results file")

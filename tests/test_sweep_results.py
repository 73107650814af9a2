"""The sweep's results store: rows appended to parquet, a CSV copy beside it, read back by pandas."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest

from fp16lab.sweep.results import ROW_COLUMNS, append_rows, read_results


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

"""`fp16lab sweep` and `fp16lab report`."""

from __future__ import annotations

import pandas as pd
import pytest

from fp16lab.cli import main


def test_sweep_writes_a_file_and_report_prints_it(tmp_path, capsys):
    out = tmp_path / "cli.parquet"
    rc = main(["sweep", "--model", "small_cnn", "--batch", "4,8", "--layout", "nchw,channels_last",
               "--precision", "fp32,amp-fp16", "--device", "cpu", "--warmup", "0", "--steps", "2",
               "--repeats", "2", "--out", str(out)])
    assert rc == 0
    df = pd.read_parquet(out)
    assert len(df) == 2 * 2 * 2 * 2 and (df["status"] == "ok").all()
    assert set(df["batch"]) == {4, 8} and set(df["precision"]) == {"fp32", "amp-fp16"}
    assert (tmp_path / "cli.csv").exists()
    capsys.readouterr()

    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("small_cnn")]
    assert len(lines) == 8  # one line per point, repeats folded
    assert "samples/s" in text and "measured on" in text


def test_rerunning_the_same_command_measures_nothing_new(tmp_path, capsys):
    args = ["sweep", "--model", "mlp", "--batch", "4", "--device", "cpu", "--warmup", "0",
            "--steps", "2", "--repeats", "1", "--out", str(tmp_path / "r.parquet")]
    assert main(args) == 0
    first = pd.read_parquet(tmp_path / "r.parquet")
    assert main(args) == 0
    assert pd.read_parquet(tmp_path / "r.parquet").equals(first)


@pytest.mark.parametrize("args, words", [
    (["--model", "vgg"], ["argument --model", "got 'vgg'", "resnet50"]),
    (["--batch", "0,8"], ["argument --batch: must be >= 1, got 0"]),
    (["--batch", "eight"], ["argument --batch: must be a whole number, got 'eight'"]),
    (["--layout", "nhwc"], ["argument --layout", "got 'nhwc'", "channels_last"]),
    (["--precision", "fp64"], ["argument --precision", "got 'fp64'", "amp-bf16"]),
    (["--init-scale", "-1", "--precision", "amp-fp16"], ["argument --init-scale: must be a finite positive number"]),
    (["--backoff-factor", "2"], ["backoff_factor"]),
    (["--cudnn-benchmark", "maybe"], ["argument --cudnn-benchmark", "must be one of on, off"]),
])
def test_bad_input_is_a_clear_error_before_anything_runs(tmp_path, capsys, args, words):
    out = tmp_path / "bad.parquet"
    rc = main(["sweep", "--device", "cpu", "--out", str(out), *args])
    err = capsys.readouterr().err
    assert rc == 2
    for w in words:
        assert w in err
    assert not out.exists()


def test_report_of_a_missing_file_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope.parquet")]) == 2
    assert "nope.parquet does not exist" in capsys.readouterr().err

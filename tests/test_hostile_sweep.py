"""Hostile input to the sweep, its results file and the command line (issue 28): a full disk, a
damaged file, two sweeps on one file, settings that apply to no point, bad paths."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fp16lab import sweep
from fp16lab.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model", "small_cnn", "--batch", "4", "--device", "cpu", "--warmup", "0",
        "--steps", "1", "--no-telemetry"]


# --------------------------------------------------------------------------- a full disk

def _disk_full_after(monkeypatch, method: str, calls: int) -> None:
    """Makes DataFrame.<method> raise ENOSPC from its ``calls + 1``-th call on."""
    real = getattr(pd.DataFrame, method)
    seen = []

    def full(self, path, *a, **k):
        seen.append(path)
        if len(seen) > calls:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(self, path, *a, **k)

    monkeypatch.setattr(pd.DataFrame, method, full)


@pytest.mark.parametrize("method", ["to_parquet", "to_csv"])
def test_a_full_disk_stops_the_sweep_keeping_every_written_row(tmp_path, monkeypatch, capsys,
                                                               method):
    out = tmp_path / "r.parquet"
    _disk_full_after(monkeypatch, method, calls=1)  # the first row is written, the second is not
    rc = main(["sweep", *TINY, "--repeats", "3", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc != 0
    assert str(out) in err and "No space left on device" in err and "ENOSPC" in err
    assert "Traceback" not in err
    monkeypatch.undo()
    kept = sweep.read_results(out)
    assert len(kept) == 1 and (kept["status"] == "ok").all()
    assert len(sweep.read_results(tmp_path / "r.csv")) == 1  # the copy agrees with the parquet
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "r.parquet"]  # no temp file


# --------------------------------------------------------------------------- a damaged file

def test_report_of_a_damaged_parquet_exits_with_one_line_not_an_abort(tmp_path):
    out = tmp_path / "r.parquet"
    sweep.run_sweep(sweep.SweepSpec(models=("small_cnn",), batches=(4,), device="cpu", warmup=0,
                                    steps=1, repeats=1, telemetry=False), out)
    big = pd.concat([sweep.read_results(out)] * 3000, ignore_index=True)
    big.to_parquet(out, index=False)  # many pages: pyarrow's threads decode them in parallel
    data = bytearray(out.read_bytes())
    for at in (1000, 1001):  # two flipped bytes in a data page's header
        data[at] ^= 0xFF
    out.write_bytes(bytes(data))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(6):  # the abort was a race with pyarrow's I/O threads: about one run in two
        r = subprocess.run([sys.executable, "-m", "fp16lab.cli", "report", str(out)],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 2, r.stderr
        assert str(out) in r.stderr and "not a readable parquet file" in r.stderr
        assert "terminate called" not in r.stderr and "Traceback" not in r.stderr


# --------------------------------------------------------------------------- settings for no point

@pytest.mark.parametrize("kw, words", [
    (dict(compile_modes=("reduce-overhead",)), ["compile_modes 'reduce-overhead'",
                                                "execution 'compile'"]),
    (dict(images_dir="IMAGES"), ["images_dir", "file input"]),
    (dict(precisions=("fp8-tensorwise",), models=("mlp",),
          scalers=(sweep.ScalerSettings(init_scale=128.0),)), ["scalers", "loss scaler"]),
    (dict(scalers=(sweep.ScalerSettings(growth_interval=10),)), ["scalers", "amp-fp16"]),
    (dict(pin_memory=(False,)), ["pin_memory False", "input 'dataloader'"]),
    (dict(num_workers=(2,)), ["num_workers 2", "file input"]),
])
def test_a_setting_that_applies_to_no_point_is_refused_naming_what_it_needs(tmp_path, kw, words):
    if kw.get("images_dir") == "IMAGES":
        kw["images_dir"] = str(tmp_path)
    with pytest.raises(ValueError) as e:
        sweep.SweepSpec(device="cpu", **kw)
    for w in words:
        assert w in str(e.value)


def test_the_default_settings_still_make_a_plain_grid():
    assert len(sweep.SweepSpec(device="cpu").points()) == 2


# --------------------------------------------------------------------------- the setting to blame

@pytest.mark.parametrize("args, blamed", [
    (["--gpus", "2"], "gpus 2"),
    (["--execution", "cuda-graph"], "executions 'cuda-graph'"),
    (["--input", "dataloader"], "inputs 'dataloader'"),
    (["--layout", "channels_last", "--model", "mlp"], "layouts 'channels_last'"),
    (["--precision", "fp8-tensorwise"], "precisions 'fp8-tensorwise'"),
])
def test_a_setting_that_cannot_run_here_is_named_not_the_model(tmp_path, capsys, args, blamed):
    rc = main(["sweep", "--device", "cpu", "--out", str(tmp_path / "r.parquet"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and blamed in err and "models" not in err.split(":")[2]


def test_a_model_every_point_of_which_another_value_refuses_is_still_named(tmp_path):
    # channels_last runs with small_cnn, so mlp is the value that applies to no point
    with pytest.raises(ValueError, match="models 'mlp' applies to no point.*image models only"):
        sweep.SweepSpec(models=("small_cnn", "mlp"), layouts=("channels_last",), device="cpu")


# --------------------------------------------------------------------------- bad paths

def test_images_dir_naming_a_file_or_an_unwritable_folder_is_one_line(tmp_path, capsys):
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    cases = [(a_file, "is a file, not a folder")]
    if os.access(locked, os.W_OK) is False:  # the superuser writes anywhere: nothing to refuse
        cases.append((locked / "images", "not writable"))
    try:
        for where, words in cases:
            rc = main(["sweep", "--device", "cpu", "--input", "dataloader", "--images-dir",
                       str(where), "--out", str(tmp_path / "r.parquet")])
            err = capsys.readouterr().err
            assert rc == 2 and words in err and str(where) in err and "Traceback" not in err
    finally:
        locked.chmod(0o700)


def test_the_cli_shows_a_bug_with_its_traceback(monkeypatch, tmp_path):
    from fp16lab.sweep import cli as sweep_cli

    # report's file must be results to get past parsing: the committed reference sweep's
    shutil.copy(ROOT / "data" / "sweep_reference_h200.parquet", tmp_path / "x.parquet")
    monkeypatch.chdir(tmp_path)

    def bug(args):
        return None + 1  # a TypeError that no validation raised

    monkeypatch.setattr(sweep_cli, "_cmd_report", bug)
    with pytest.raises(TypeError):
        main(["report", "x.parquet"])


def test_the_cli_turns_a_validation_type_error_into_one_line(monkeypatch, capsys, tmp_path):
    from fp16lab import validate
    from fp16lab.sweep import cli as sweep_cli

    shutil.copy(ROOT / "data" / "sweep_reference_h200.parquet", tmp_path / "x.parquet")
    monkeypatch.chdir(tmp_path)

    monkeypatch.setattr(sweep_cli, "_cmd_report", lambda args: validate.count("--steps", "x"))
    assert main(["report", "x.parquet"]) == 2
    assert "--steps must be a whole number" in capsys.readouterr().err


# --------------------------------------------------------------------------- two sweeps, one file

def test_two_sweeps_of_one_grid_on_one_file_measure_each_repeat_once(tmp_path):
    out = tmp_path / "shared.parquet"
    cmd = [sys.executable, "-m", "fp16lab.cli", "sweep", "--model", "small_cnn", "--batch",
           "4,8", "--device", "cpu", "--warmup", "0", "--steps", "2", "--repeats", "3",
           "--no-telemetry", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    rows = sweep.read_results(out)
    assert len(rows) == 2 * 3  # 2 points x 3 repeats, none measured twice
    assert not rows.duplicated(["key", "repeat"]).any()
    assert not (tmp_path / ".shared.claims").exists()  # every claim released


def test_a_claim_of_a_dead_process_is_taken_over_and_a_live_one_is_not(tmp_path):
    from fp16lab.sweep import results

    out = tmp_path / "r.parquet"
    m = ("abc", 0, 1, 2)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    f = tmp_path / ".r.claims" / "abc.r0.w1s2"
    f.parent.mkdir()
    f.write_text(dead)
    assert results.claim(out, m)  # stale: taken over
    f.write_text(str(os.getppid()))  # a live process (this test's parent)
    assert not results.claim(out, m)
    results.release(out, m)
    assert not f.parent.exists()


def _claim_all(out, n, start, done, won):
    from fp16lab.sweep import results

    start.wait()  # every process claims at once
    won.put([i for i in range(n) if results.claim(out, (f"k{i}", 0, 1, 2))])
    done.wait()  # alive until all have claimed: a live claim is not stale


def test_sweeps_claiming_at_once_never_win_one_measurement_twice(tmp_path):
    """Six processes claim the same 40 measurements at once (none released, all alive): each
    is won by exactly one. A claim file once existed empty for an instant, and another sweep
    took it for a dead claim, deleted it and measured the point too."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    start, done, won = ctx.Barrier(6), ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_claim_all, args=(tmp_path / "r.parquet", 40, start, done, won))
             for _ in range(6)]
    for p in procs:
        p.start()
    got = [won.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
    assert sorted(i for w in got for i in w) == list(range(40))
    assert not list((tmp_path / ".r.claims").glob("*.new"))  # no working files left


def test_an_empty_claim_file_of_an_older_version_is_taken_over(tmp_path):
    from fp16lab.sweep import results

    f = tmp_path / ".r.claims" / "abc.r0.w1s2"
    f.parent.mkdir()
    f.write_text("")
    assert results.claim(tmp_path / "r.parquet", ("abc", 0, 1, 2))
    assert f.read_text() == str(os.getpid())


def test_report_counts_a_repeat_measured_twice_once_and_says_so(tmp_path):
    out = tmp_path / "r.parquet"
    spec = sweep.SweepSpec(models=("small_cnn",), batches=(4,), device="cpu", warmup=0, steps=1,
                           repeats=2, telemetry=False)
    rows = sweep.run_sweep(spec, out)
    sweep.append_rows(out, rows.to_dict("records"))  # the second sweep of the old code
    both = sweep.read_results(out)
    assert len(both) == 4
    assert sweep.summarize_results(both)["repeats"].tolist() == [2]
    assert "counted once" in sweep.format_report(both)

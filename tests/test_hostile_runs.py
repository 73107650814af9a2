"""Sweeps, claims and their files fed what a hostile (or hurried) user tries: concurrency, bad paths, damage.

The second half of ``test_hostile.py`` (issue #18, points 1-6, 8 and 10a), kept apart so that
each file stays readable. Every bad input must be refused before any work starts, with a
message naming the file and what is wrong, a non-zero exit from the command line, and no stray
file left. The oracles are independent of the code under test: pandas reading the files back,
the rows the sweep was asked for, the original bytes of a file that must not change, torch's
own autograd and allocator.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from fp16lab import measure, sweep
from fp16lab.claims.run import device_slug, get_claim
from fp16lab.cli import main
from fp16lab.device import device_info
from fp16lab.sweep import SweepSpec, engine

ROOT = Path(__file__).resolve().parent.parent


def tiny(**kw) -> SweepSpec:
    base = dict(models=("mlp",), batches=(2, 4), layouts=("nchw",), precisions=("fp32",),
                device="cpu", warmup=0, steps=1, repeats=1, telemetry=False)
    base.update(kw)
    return SweepSpec(**base)


class _Calls:
    """A fault injector that records each (point, repeat) it is called for, at step 0."""

    def __init__(self, fail: set[int] = frozenset()):
        self.seen: list[tuple[str, int]] = []
        self.fail = fail

    def __call__(self, point, repeat, step):
        if step == 0:
            self.seen.append((point.key, repeat))
            if point.batch in self.fail:
                raise ValueError(f"planted failure at batch {point.batch}")


def _stray_tmp(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


@pytest.fixture(scope="module")
def results_file(tmp_path_factory) -> Path:
    """A real two-row results file (and its CSV copy) written by a sweep."""
    out = tmp_path_factory.mktemp("real") / "real.parquet"
    sweep.run_sweep(tiny(), out)
    return out


# --------------------------------------------------------------- 1: concurrent writers, readers

_READER = """
import sys, time
from pathlib import Path
from fp16lab.sweep import read_results
out, stop = Path(sys.argv[1]), Path(sys.argv[2])
reads = 0
while not stop.exists():
    for f in (out, out.with_suffix(".csv")):
        read_results(f)  # any exception ends the reader with a traceback and exit status 1
        reads += 1
print(reads)
"""


def test_three_concurrent_sweeps_and_a_reader_lose_nothing(tmp_path):
    out, stop = tmp_path / "shared.parquet", tmp_path / "stop"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    batches = [(1, 2, 3), (4, 5, 6), (7, 8, 9)]
    repeats = 4
    reader = subprocess.Popen([sys.executable, "-c", _READER, str(out), str(stop)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writers = [subprocess.Popen(
        [sys.executable, "-m", "fp16lab.cli", "sweep", "--model", "mlp", "--device", "cpu",
         "--batch", ",".join(map(str, b)), "--warmup", "0", "--steps", "1",
         "--repeats", str(repeats), "--no-telemetry", "--out", str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for b in batches]
    results = [w.communicate(timeout=300) for w in writers]
    stop.touch()
    reads, reader_err = reader.communicate(timeout=60)
    for w, (_, err) in zip(writers, results):
        assert w.returncode == 0, err
    assert reader.returncode == 0, reader_err
    assert int(reads) > 0
    # the oracle: the rows the three commands were asked for, read back by pandas itself
    df = pd.read_parquet(out)
    asked = {(b, r) for bs in batches for b in bs for r in range(repeats)}
    assert sorted(zip(df["batch"], df["repeat"])) == sorted(asked)  # none lost, none doubled
    assert (df["status"] == "ok").all()
    assert len(pd.read_csv(out.with_suffix(".csv"))) == len(asked)
    assert not _stray_tmp(tmp_path)


# ---------------------------------------------------------- 2: claims --only merges, writes locally

def test_claims_only_merges_into_the_existing_file_in_the_local_folder(tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    monkeypatch.setenv("FP16LAB_DATA", str(data))
    slug = device_slug(device_info().gpu_name)
    earlier = json.loads((ROOT / "data" / "claims_cpu.json").read_text())
    assert [r["id"] for r in earlier["rows"]] == list(range(1, 13))
    earlier["rows"][0]["reason"] = "an earlier run's reason, to be replaced"
    local = data / "local"
    local.mkdir(parents=True)
    (local / f"claims_{slug}.json").write_text(json.dumps(earlier))

    assert main(["claims", "--only", "1", "--quick"]) == 0
    capsys.readouterr()
    assert not (data / f"claims_{slug}.json").exists()  # the committed folder is left alone
    merged = json.loads((local / f"claims_{slug}.json").read_text())
    assert [r["id"] for r in merged["rows"]] == list(range(1, 13))  # 12 rows stay 12
    # the other eleven keep what was measured, each described by the claim as it is written now
    kept = ("id", "verdict", "reason", "source", "figures")
    assert ([{k: r.get(k) for k in kept} for r in merged["rows"][1:]]
            == [{k: r.get(k) for k in kept} for r in earlier["rows"][1:]])
    for r in merged["rows"][1:]:
        c = get_claim(r["id"])
        assert (r["text"], r["rule"], r["origin"]) == (c.text, c.rule, c.origin)
    assert merged["rows"][0]["reason"] != earlier["rows"][0]["reason"]  # claim 1 re-checked
    assert merged["meta"]["checked_now"] == [1]
    md = (local / f"claims_{slug}.md").read_text()
    assert sum(line.startswith("| ") and line[2:4].strip().isdigit()
               for line in md.splitlines()) == 12


# ---------------------------------------------------------- 3: output paths, before any work

def _another_tools_parquet(p: Path) -> None:
    pd.DataFrame({"epoch": [1, 2], "loss": [0.5, 0.4]}).to_parquet(p)


def _read_only_folder(p: Path) -> None:
    p.parent.mkdir()
    p.parent.chmod(0o555)


@pytest.mark.parametrize("name, prepare, words", [
    ("dir.parquet", lambda p: p.mkdir(), ["is a folder"]),
    ("ro/r.parquet", _read_only_folder, ["read-only"]),
    ("r.csv", lambda p: None, ["must end in .parquet"]),
    ("r.json", lambda p: None, ["must end in .parquet"]),
    ("other.parquet", _another_tools_parquet, ["not a fp16lab sweep results file", "key"]),
    ("other.parquet", lambda p: p.with_suffix(".csv").write_text("epoch,loss\n1,0.5\n"),
     ["other.csv", "not a fp16lab sweep results file"]),
])
def test_sweep_out_is_checked_before_any_point_is_measured(tmp_path, monkeypatch, capsys, name,
                                                           prepare, words):
    out = tmp_path / name
    prepare(out)
    measured = []
    monkeypatch.setattr(engine, "measure_point", lambda *a, **k: measured.append(a) or {})
    rc = main(["sweep", "--model", "mlp", "--device", "cpu", "--batch", "2", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and measured == []
    for w in words:
        assert w in err
    assert not _stray_tmp(tmp_path)
    with pytest.raises(ValueError, match=words[0]):  # the public API refuses it too
        sweep.run_sweep(tiny(), out)
    assert measured == []


def test_a_read_only_results_file_is_not_replaced(tmp_path, results_file, monkeypatch, capsys):
    out = tmp_path / "kept.parquet"
    out.write_bytes(results_file.read_bytes())
    out.chmod(0o444)
    before = out.read_bytes()
    monkeypatch.setattr(engine, "measure_point", lambda *a, **k: pytest.fail("measured"))
    rc = main(["sweep", "--model", "mlp", "--device", "cpu", "--batch", "8", "--out", str(out)])
    assert rc == 2 and "read-only" in capsys.readouterr().err
    assert out.read_bytes() == before and not _stray_tmp(tmp_path)


@pytest.mark.parametrize("prepare, words", [
    (lambda p: p.write_text("a file\n"), ["is a file", "not a folder"]),
    (lambda p: (p.mkdir(), p.chmod(0o555)), ["read-only"]),
    (lambda p: (p.mkdir(), (p / f"claims_{device_slug(device_info().gpu_name)}.json")
                .write_text('{"meta": {')), ["not valid JSON"]),
])
def test_claims_out_is_refused_before_any_claim_runs(tmp_path, monkeypatch, capsys, prepare,
                                                     words):
    import fp16lab.claims.cli as claims_cli

    out = tmp_path / "out"
    prepare(out)
    monkeypatch.setattr(claims_cli, "check_all", lambda *a, **k: pytest.fail("a claim ran"))
    rc = main(["claims", "--only", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and str(out) in err
    for w in words:
        assert w in err


# ---------------------------------------------------------- 4: fp16lab report on damaged files

def _cut_mid_line(src: Path, dst: Path, newline: bool) -> None:
    lines = src.with_suffix(".csv").read_text().splitlines(keepends=True)
    last = lines[-1]
    dst.write_text("".join(lines[:-1]) + last[: len(last) // 2] + ("\n" if newline else ""))


def _flip(src: Path, dst: Path, where: slice) -> None:
    data = bytearray(src.read_bytes())
    data[where] = bytes(b ^ 0xFF for b in data[where])
    dst.write_bytes(bytes(data))


@pytest.mark.parametrize("name, make, words", [
    ("folder.parquet", lambda src, p: p.mkdir(), ["is a folder"]),
    ("folder", lambda src, p: p.mkdir(), ["a results file ends in .parquet or .csv"]),
    ("empty.csv", lambda src, p: p.write_bytes(b""), ["empty"]),
    ("half.csv", lambda src, p: p.write_text(src.with_suffix(".csv").read_text()[:40]),
     ["ends mid-line"]),
    ("binary.csv", lambda src, p: p.write_bytes(bytes(range(256)) * 4), ["not a text CSV"]),
    ("cut.csv", lambda src, p: _cut_mid_line(src, p, newline=False), ["ends mid-line"]),
    ("cut_nl.csv", lambda src, p: _cut_mid_line(src, p, newline=True), ["row 2 has no"]),
    ("other.csv", lambda src, p: p.write_text("epoch,loss\n1,0.5\n"),
     ["not a fp16lab sweep results file", "key"]),
    ("nostatus.parquet", lambda src, p: pd.read_parquet(src).drop(columns="status").to_parquet(p),
     ["lacks the column(s) status"]),
    ("flipped.parquet", lambda src, p: _flip(src, p, slice(-12, -4)), ["not a readable parquet"]),
    ("magic.parquet", lambda src, p: _flip(src, p, slice(-4, None)), ["not a readable parquet"]),
    ("badstatus.csv", lambda src, p: p.write_text(
        src.with_suffix(".csv").read_text().replace(",ok,", ",fine,", 1)),
     ["status 'fine' is not one of ok, oom, error"]),
])
def test_report_names_the_file_and_what_is_wrong(tmp_path, results_file, capsys, name, make,
                                                 words):
    p = tmp_path / name
    make(results_file, p)
    assert main(["report", str(p)]) == 2
    err = capsys.readouterr().err
    assert str(p) in err
    for w in words:
        assert w in err
    with pytest.raises(ValueError, match="|".join(map(re.escape, words))):
        sweep.read_results(p)


def test_report_reads_the_real_file_and_its_csv_copy(results_file, capsys):
    for f in (results_file, results_file.with_suffix(".csv")):
        assert main(["report", str(f)]) == 0
        assert len([ln for ln in capsys.readouterr().out.splitlines()
                    if ln.strip().startswith("mlp")]) == 2


@pytest.mark.parametrize("tol", ["-1", "0", "1.5", "nan"])
def test_report_tolerance_must_be_a_fraction(results_file, capsys, tol):
    assert main(["report", str(results_file), "--tolerance", tol]) == 2
    assert "argument --tolerance: must be a fraction in (0, 1)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="tolerance must be a fraction"):
        sweep.summarize_results(sweep.read_results(results_file), float(tol))


# ---------------------------------------------------------- 5: loaders of measured files

def _measured(tmp_path: Path, payload: dict | str, name: str = "thing") -> Path:
    p = tmp_path / f"{name}.json"
    p.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return p


GOOD_META = {"measured_at": "2026-01-01T00:00:00+00:00", "gpu_name": "NVIDIA H200",
             "torch": "2.11"}


@pytest.mark.parametrize("payload, words", [
    ('{"meta": {"gpu_name": "NVIDIA H2', ["not valid JSON", "line 1"]),
    ("", ["not valid JSON"]),
    ({"meta": [], "rows": []}, ["'meta' must be an object"]),
    ({"meta": GOOD_META, "rows": {"a": 1}}, ["'rows' must be a list of objects"]),
    ({"meta": GOOD_META, "rows": [1, 2]}, ["'rows' must be a list of objects"]),
    ({"meta": {}, "rows": []}, ["meta lacks the field 'measured_at'", "where and when"]),
    ({"meta": {k: v for k, v in GOOD_META.items() if k != "gpu_name"}, "rows": []},
     ["meta lacks the field 'gpu_name'"]),
])
def test_a_measured_file_with_a_wrong_schema_is_named_with_its_field(tmp_path, payload, words):
    p = _measured(tmp_path, payload)
    with pytest.raises(ValueError) as info:
        measure.read_result(p)
    assert str(p) in str(info.value)
    for w in words:
        assert w in str(info.value)


def test_a_loader_names_the_row_or_meta_field_it_needs(tmp_path):
    p = _measured(tmp_path, {"meta": {**GOOD_META, "summary": {"model": "x"}},
                             "rows": [{"id": 1}, {"name": "no id"}]})
    with pytest.raises(ValueError, match=r"row 1 lacks the field 'id'"):
        measure.read_result(p, rows_need=("id",))
    with pytest.raises(ValueError, match=r"meta lacks the field 'summary.bare_ms'"):
        measure.read_result(p, meta_needs=("summary.model", "summary.bare_ms"))


def test_package_loaders_name_the_file_and_field(tmp_path, monkeypatch):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    measure.write_result("sweep_engine_vs_loop", [], meta={"summary": {"model": "resnet50"}},
                       data_dir=tmp_path)
    with pytest.raises(ValueError, match="sweep_engine_vs_loop.json: meta lacks the field "
                                         "'summary.batch'"):
        sweep.engine_check()
    (tmp_path / "claims_h200.json").write_text('{"meta": {"measured_at": "2026')
    from fp16lab.claims import recorded_table

    with pytest.raises(ValueError, match="claims_h200.json: not valid JSON"):
        recorded_table()
    pd.DataFrame({"epoch": [1]}).to_parquet(tmp_path / "sweep_reference_h200.parquet")
    with pytest.raises(ValueError, match="sweep_reference_h200.parquet: not a fp16lab sweep"):
        sweep.load_reference()


def test_a_meta_without_provenance_never_reads_as_a_cpu_run():
    line = measure.describe_source({})
    assert "CPU" not in line and "?" not in line
    assert "an unrecorded device" in line and "an unrecorded time" in line
    cpu = measure.describe_source({"gpu_name": None, "measured_at": "2026-01-01", "torch": "2.13"})
    assert cpu.startswith("measured on CPU") and "2026-01-01" in cpu


def test_an_empty_data_setting_is_a_clear_error_on_the_command_line(monkeypatch, capsys):
    monkeypatch.setenv("FP16LAB_DATA", "")
    assert main(["claims", "--only", "1"]) == 2
    assert "FP16LAB_DATA is set but empty" in capsys.readouterr().err


# ---------------------------------------------------------- 6: a re-run with another protocol

def test_a_rerun_with_other_steps_measures_again_and_keeps_protocols_apart(tmp_path):
    out = tmp_path / "p.parquet"
    first = sweep.run_sweep(tiny(steps=1), out)
    calls = _Calls()
    second = sweep.run_sweep(tiny(steps=2), out, fault_injector=calls)
    assert sorted(r for _, r in calls.seen) == [0, 0]  # both points measured again
    assert list(second["steps"]) == [2, 2]  # only this protocol's rows are returned
    on_disk = pd.read_parquet(out)
    assert sorted(on_disk["steps"]) == [1, 1, 2, 2]  # the earlier rows are kept, not mixed
    s = sweep.summarize_results(on_disk)
    assert len(s) == 4 and sorted(s["steps"]) == [1, 1, 2, 2]
    assert set(zip(s["key"], s["steps"])) == set(zip(on_disk["key"], on_disk["steps"]))
    text = sweep.format_report(on_disk)
    assert "0+1" in text and "0+2" in text and "2 protocols" in text
    assert list(first["finished_at"]) == list(on_disk[on_disk["steps"] == 1]["finished_at"])


def test_a_rerun_says_which_rows_were_measured_earlier(tmp_path, capsys):
    args = ["sweep", "--model", "mlp", "--batch", "2,4", "--device", "cpu", "--warmup", "0",
            "--steps", "1", "--repeats", "1", "--no-telemetry", "--out", str(tmp_path / "r.parquet")]
    assert main(args) == 0
    assert "measured 2 rows" in capsys.readouterr().out
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "measured 0 rows" in out and "2 rows were already in" in out and "measured earlier" in out
    args[args.index("--steps") + 1] = "2"
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "measured 2 rows" in out and "already in" not in out


# ---------------------------------------------------------- #20: resume leaves failed points alone

def test_resume_does_not_measure_a_failed_point_again(tmp_path):
    out = tmp_path / "f.parquet"
    spec = tiny(batches=(2, 3, 4), repeats=2)
    failing = _Calls(fail={3})
    sweep.run_sweep(spec, out, fault_injector=failing)
    key3 = next(p.key for p in spec.points() if p.batch == 3)
    assert failing.seen.count((key3, 0)) == 1 and (key3, 1) not in failing.seen
    again = _Calls()
    df = sweep.run_sweep(spec, out, fault_injector=again)
    assert again.seen == []  # nothing left to measure: the failed point is not retried
    on_disk = pd.read_parquet(out)
    assert list(on_disk[on_disk["key"] == key3]["status"]) == ["error"]  # one row, no 'ok'
    assert len(on_disk) == len(df) == 2 + 2 + 1


# ---------------------------------------------------------- 8: the NaN locator

def _tiny_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))


def test_locator_does_not_blame_a_nan_gradient_left_by_an_earlier_step():
    from fp16lab.diagnostics import locate_first_nonfinite

    model, x = _tiny_net(), torch.randn(5, 4)
    oracle = copy.deepcopy(model)  # the same step, from clean gradients, by torch alone
    want = torch.autograd.grad(oracle(x).pow(2).mean(), list(oracle.parameters()))
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))  # what a skipped amp-fp16 step leaves behind
    assert locate_first_nonfinite(model, lambda: model(x).pow(2).mean()) is None
    for p, g in zip(model.parameters(), want):
        assert torch.equal(p.grad, g)  # this step's gradients, not the stale NaN plus them


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_locator_says_when_the_input_batch_itself_holds_nan_or_inf(bad):
    from fp16lab.diagnostics import locate_first_nonfinite

    model, x = _tiny_net(), torch.randn(5, 4)
    x[1, 2] = x[3, 0] = bad
    rep = locate_first_nonfinite(model, lambda: model(x).pow(2).mean())
    assert rep is not None and rep.phase == "input batch" and rep.module == ""
    assert (rep.n_nan, rep.n_inf) == (int(torch.isnan(x).sum()), int(torch.isinf(x).sum()))
    assert "input batch itself" in str(rep) and "no layer produced them" in str(rep)


# ---------------------------------------------------------- 10a: a host OOM

def _real_host_allocation_failure() -> RuntimeError:
    """torch's own CPU allocator refusing 1 EiB, more than any address space holds."""
    try:
        torch.empty(1 << 60, dtype=torch.uint8)
    except RuntimeError as e:
        return e
    pytest.fail("torch allocated 1 EiB")


def test_a_host_allocation_failure_is_an_oom_as_is_oom_says():
    from fp16lab.sweep import Point, is_oom, measure_point

    exc = _real_host_allocation_failure()
    assert is_oom(exc), str(exc)

    def allocate_too_much(point, repeat, step):  # what a batch of 10**9 does on the host
        torch.empty(1 << 60, dtype=torch.uint8)

    row = measure_point(Point("mlp", 2), warmup=0, steps=1, telemetry=False,
                        fault_injector=allocate_too_much)
    assert row["status"] == "oom" and "allocate" in row["error"]
    assert not is_oom(RuntimeError("shape mismatch"))  # other failures stay errors

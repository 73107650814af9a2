"""The reference-sweep script: a resumed run keeps the timings of parts it did not run."""

from __future__ import annotations

import pytest

from fp16lab import measure, sweep
from fp16lab.bench import sweep_reference


def test_a_kept_part_without_a_wall_time_is_printed_and_kept(tmp_path, monkeypatch, capsys):
    """A part measured in an earlier run that was cut short has no wall time; the next run of
    another part keeps its timing row as it was and prints it with a dash, and the earlier
    file's notes."""
    monkeypatch.setattr(measure, "local_dir", lambda: tmp_path)
    kept = {"part": "kept_part", "points": 3, "repeats": 2, "warmup": 1, "steps": 4, "wall_s": None,
            "measured": 6, "resumed": True, "ok": 3, "unstable": 0}
    measure.write_result("sweep_reference_cpu", [kept], data_dir=tmp_path,
                         meta={"host_note": "a shared host", "wall_s_this_run": 1.0})
    assert sweep_reference.main(["--quick", "--only", "mlp_fp8_cpu"]) == 0
    result = measure.read_result("sweep_reference_cpu", data_dir=tmp_path)
    rows = {r["part"]: r for r in result["rows"]}
    assert rows["kept_part"] == kept
    assert result["meta"]["host_note"] == "a shared host"  # a note written by hand is kept
    assert result["meta"]["wall_s_this_run"] != 1.0          # the run's own figures are not
    assert rows["mlp_fp8_cpu"]["measured"] == 4 and rows["mlp_fp8_cpu"]["wall_s"] > 0
    out = capsys.readouterr().out
    assert "kept_part:      - s  (3 points x 2, 0 unstable, resumed)" in out


def test_parts_names_every_part_of_both_runs(monkeypatch):
    """--only is checked against PARTS as it is parsed: it must name every part, in order."""
    monkeypatch.setattr(sweep_reference, "SweepSpec", lambda **settings: settings)  # no GPU here
    monkeypatch.setattr(sweep_reference.torch.cuda, "device_count", lambda: 2)
    names = (*sweep_reference.gpu_parts("images"), *sweep_reference.cpu_parts())
    assert names == sweep_reference.PARTS


def test_the_workload_part_sweeps_a_real_model_class(tmp_path, monkeypatch):
    """The reference grid takes a workload: tiny BERT (transformers' class) runs its points and
    its rows name the workload."""
    pytest.importorskip("transformers")
    monkeypatch.setattr(measure, "local_dir", lambda: tmp_path)
    assert sweep_reference.main(["--quick", "--only", "workload_cpu"]) == 0
    rows = sweep.read_results(tmp_path / "sweep_reference_cpu.parquet")
    assert sorted(set(rows["model"])) == ["bert-base-mlm-tiny"]
    assert sorted(set(rows["precision"])) == ["amp-bf16", "fp32"]
    assert len(rows) == 4 and (rows["status"] == "ok").all()
    assert (rows["step_ms_median"].astype(float) > 0).all()


def test_cpu_parts_builds_the_workload_only_when_asked_for(monkeypatch):
    """--only without workload_cpu builds no tiny BERT (loading transformers is slow)."""
    built = []
    monkeypatch.setattr(sweep_reference, "missing_package", lambda name: None)
    monkeypatch.setattr(sweep_reference, "load_workload", lambda *a, **k: built.append(a) or "w")
    monkeypatch.setattr(sweep_reference, "SweepSpec", lambda **settings: settings)
    assert list(sweep_reference.cpu_parts(["small_cnn_cpu"])) == ["small_cnn_cpu"] and not built
    assert list(sweep_reference.cpu_parts(["workload_cpu"])) == ["workload_cpu"]
    assert built == [("bert-base",)]
    assert list(sweep_reference.cpu_parts()) == ["small_cnn_cpu", "mlp_fp8_cpu", "workload_cpu"]


def test_without_transformers_the_workload_parts_are_left_out(monkeypatch):
    """Where transformers is missing, neither run has a workload part, and --only naming it is
    refused before anything runs."""
    monkeypatch.setattr(sweep_reference, "missing_package", lambda name: "pip install transformers")
    monkeypatch.setattr(sweep_reference, "SweepSpec", lambda **settings: settings)
    assert "workload_bert" not in sweep_reference.gpu_parts("images")
    assert "workload_cpu" not in sweep_reference.cpu_parts()
    with pytest.raises(SystemExit):
        sweep_reference.main(["--quick", "--only", "workload_cpu"])

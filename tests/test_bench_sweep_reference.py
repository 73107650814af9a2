"""The reference-sweep script: a resumed run keeps the timings of parts it did not run."""

from __future__ import annotations

from fp16lab import measure
from fp16lab.bench import sweep_reference


def test_a_kept_part_without_a_wall_time_is_printed_and_kept(tmp_path, monkeypatch, capsys):
    """A part measured in an earlier run that was cut short has no wall time; the next run of
    another part keeps its timing row as it was and prints it with a dash."""
    monkeypatch.setattr(measure, "local_dir", lambda: tmp_path)
    kept = {"part": "kept_part", "points": 3, "repeats": 2, "warmup": 1, "steps": 4, "wall_s": None,
            "measured": 6, "resumed": True, "ok": 3, "unstable": 0}
    measure.write_result("sweep_reference_cpu", [kept], data_dir=tmp_path)
    assert sweep_reference.main(["--quick", "--only", "mlp_fp8_cpu"]) == 0
    rows = {r["part"]: r for r in measure.read_result("sweep_reference_cpu", data_dir=tmp_path)["rows"]}
    assert rows["kept_part"] == kept
    assert rows["mlp_fp8_cpu"]["measured"] == 4 and rows["mlp_fp8_cpu"]["wall_s"] > 0
    out = capsys.readouterr().out
    assert "kept_part:      - s  (3 points x 2, 0 unstable, resumed)" in out


def test_parts_names_every_part_of_both_runs(monkeypatch):
    """--only is checked against PARTS as it is parsed: it must name every part, in order."""
    monkeypatch.setattr(sweep_reference, "SweepSpec", lambda **settings: settings)  # no GPU here
    monkeypatch.setattr(sweep_reference.torch.cuda, "device_count", lambda: 2)
    names = (*sweep_reference.gpu_parts("images"), *sweep_reference.cpu_parts())
    assert names == sweep_reference.PARTS

"""fp16lab.bench.workloads: its ratios by hand, and a tiny run on the CPU end to end."""

from __future__ import annotations

import json

import pytest

from fp16lab.bench import workloads as bench


def test_summary_ratios_by_hand():
    rows = [{"part": "speed", "model": "m", "precision": p, "samples_per_s": v}
            for p, v in (("fp32", 100.0), ("tf32", 200.0), ("amp-bf16", 500.0))]
    rows += [{"part": "engine", "model": "m", "variant": v, "step_ms": ms}
             for v, ms in (("bare", 10.0), ("engine", 10.2), ("bare", 12.0), ("engine", 10.4))]
    rows += [{"part": "memory", "model": "m", "precision": "fp32", "ratio": 0.97}]
    rows += [{"part": "vocab", "model": "m", "vocab": v, "step_ms": ms}
             for v, ms in (("unpadded", 22.0), ("padded", 20.0), ("unpadded", 22.0), ("padded", 20.0))]
    s = bench.summarize(rows)
    assert s["speed"]["m"]["amp-bf16"] == {"samples_per_s": 500.0, "over_fp32": 5.0, "over_tf32": 2.5}
    assert s["engine_vs_bare"]["m"] == pytest.approx(10.3 / 11.0)  # medians of two
    assert s["memory_ratio"] == {"m": {"fp32": 0.97}}
    assert s["vocab_gain"] == pytest.approx(0.1)


def test_a_tiny_run_on_the_cpu_writes_every_part(tmp_path, capsys):
    pytest.importorskip("transformers")
    assert bench.main(["--tiny", "--steps", "1", "--warmup", "0", "--repeats", "1",
                       "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "workloads_tiny.json").read_text())
    rows, meta = data["rows"], data["meta"]
    assert meta["parts_run"] == list(bench.PARTS) and meta["tiny"] is True
    speed = [r for r in rows if r["part"] == "speed"]
    assert {(r["model"], r["precision"]) for r in speed} == \
        {(m, p) for m, _, _ in bench.MODELS for p in bench.PRECISIONS}
    assert {r["variant"] for r in rows if r["part"] == "engine"} == {"bare", "engine"}
    assert all(r["predicted_bytes"] > 0 for r in rows if r["part"] == "memory")
    assert {r["vocab"] for r in rows if r["part"] == "vocab"} == {"unpadded", "padded"}
    assert meta["summary"] == json.loads(json.dumps(bench.summarize(rows)))
    assert "engine / bare loop" in capsys.readouterr().out


def test_a_spent_budget_runs_no_further_part(tmp_path, capsys):
    pytest.importorskip("transformers")
    assert bench.main(["--tiny", "--steps", "1", "--warmup", "0", "--only", "memory,vocab",
                       "--budget-s", "1e-9", "--out", str(tmp_path)]) == 0
    meta = json.loads((tmp_path / "workloads_tiny.json").read_text())["meta"]
    assert meta["parts_run"] == []  # spent before the first part: nothing starts
    out = capsys.readouterr().out
    assert "part 'memory' not run" in out and "part 'vocab' not run" in out

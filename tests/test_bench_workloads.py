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
    mem = [r for r in rows if r["part"] == "memory"]
    assert {(r["model"], r["precision"]) for r in mem} == \
        {(m, p) for m, _, _ in bench.MODELS for p in bench.MEMORY_PRECISIONS if p != "tf32"}
    # GPT-2's blocks use transformers' Conv1D, not nn.Linear, and its lm_head's vocabulary is no
    # multiple of 16: FP8 has no layer to take, and a row says so
    failed = {(r["model"], r["precision"]): r["error"] for r in mem if "error" in r}
    assert list(failed) == [("gpt2-small", "fp8-tensorwise")]
    assert "WorkloadCannotRun" in failed["gpt2-small", "fp8-tensorwise"]
    assert all(r["predicted_bytes"] > 0 for r in mem if "error" not in r)
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


# ----------------------------------------------------------------------------- the BERT recipe

def test_the_source_recipe_is_as_the_source_states_it():
    (arm, precision, scaler), *others = bench.RECIPE_ARMS
    # batch 128, AdamW (0.9, 0.999), O2 (FP16 weights, FP32 masters), scale 8192 capped at 32768
    assert (precision, scaler, bench.RECIPE_BATCH) == \
        ("fp16-o2", {"init_scale": 8192.0, "max_scale": 32768.0}, 128)
    assert bench.RECIPE_ADAMW["betas"] == (0.9, 0.999)
    assert [p for _, p, _ in others] == ["amp-fp16", "amp-bf16", "fp32"]


def test_the_recipe_arms_train_as_a_bare_adamw_loop_does():
    pytest.importorskip("transformers")
    import torch
    import torch.nn.functional as F

    from fp16lab.workload import load_workload

    w = load_workload("bert-base", tiny=True)
    rows = bench.recipe_rows(w, 4, "cpu", loss_steps=3, timed_steps=1)
    by = {r["precision"]: r for r in rows}
    torch.manual_seed(0)  # the bare loop: the same seed, model, batch and AdamW, in fp32
    model = w.build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), weight_decay=0.01)
    inputs, targets = w.batch(4, "cpu")
    bare = []
    for _ in range(3):
        logits = model(**inputs)[w.output]
        loss = F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        bare.append(float(loss))
    assert by["fp32"]["losses"] == pytest.approx(bare, rel=1e-5)
    source = by["fp16-o2"]
    assert source["scales"] == [8192.0] * 3 and source["skipped_steps"] == 0
    assert by["amp-fp16"]["scales"] == [65536.0] * 3  # GradScaler's default start
    assert by["amp-bf16"]["scales"] == [None] * 3 and by["amp-bf16"]["skipped_steps"] is None
    for r in rows:  # 16-bit recipes near fp32 over three steps, and each one timed
        assert r["losses"][-1] == pytest.approx(bare[-1], rel=0.02)
        assert r["samples_per_s"] == pytest.approx(4 / (r["step_ms"] / 1e3))


def test_the_recipe_summary_by_hand():
    rows = [{"part": "recipe", "model": "bert-base", "arm": a, "precision": p, "losses": [9.0, l],
             "scales": sc, "skipped_steps": sk, "samples_per_s": v,
             "peak_mem_allocated_mb": None}
            for a, p, l, sc, sk, v in (("src", "fp16-o2", 6.0, [8192.0, 4096.0], 1, 300.0),
                                       ("ref", "fp32", 5.0, [None, None], None, 100.0))]
    s = bench.summarize(rows)["recipe"]
    assert s["src"] == {"samples_per_s": 300.0, "peak_mem_allocated_mb": None,
                        "final_loss": 6.0, "skipped_steps": 1, "largest_scale": 8192.0,
                        "final_loss_over_fp32": 1.2, "speed_over_fp32": 3.0}
    assert s["ref"]["largest_scale"] is None and s["ref"]["final_loss_over_fp32"] == 1.0

"""fp16lab.bench.workloads, fast: the script's wiring on tiny stand-in workloads, its rows and
ratios worked out by hand, the bare loop against a step written here. (The end-to-end tiny run
with the real transformers models is tests/test_bench_workloads.py.)"""

from __future__ import annotations

import json
import statistics

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fp16lab import memory
from fp16lab.bench import workloads as bench
from fp16lab.recipes import LR, MOMENTUM
from fp16lab.workload import Workload
from fp16lab.workloads.batches import synthetic_batch

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

#: step ms a fake engine reports per precision; padded vocab at 8 ms, unpadded at 10 ms.
MS = {"fp32": 10.0, "tf32": 5.0, "amp-fp16": 2.5, "amp-bf16": 2.0}


def tiny(name="t", **kw) -> Workload:
    return Workload(name=name, build=lambda: nn.Linear(4, 3), batch=synthetic_batch((4,), 3), **kw)


@pytest.fixture()
def fake(monkeypatch):
    """Stand-ins for the real models and the engine: which calls were made, and what they got."""
    calls = {"load": [], "engine": [], "bare": [], "predict": []}

    def load(name, **settings):
        calls["load"].append((name, settings))
        w = tiny(name=name)
        w.padded = "pad_vocab_to" in settings
        return w

    def engine(point, warmup, steps):
        calls["engine"].append((point.model, point.precision, point.batch, warmup, steps,
                                getattr(point.workload, "padded", None)))
        if point.workload.padded:
            return 8.0, {}
        return MS[point.precision], {"peak_mem_allocated_mb": 7.5}

    def bare(w, batch, device, warmup, steps):
        calls["bare"].append((w.name, batch, device, warmup, steps))
        return 4.0

    monkeypatch.setattr(bench, "MODELS", (("bert-base", 64, {}), ("gpt2-small", 8, {"k": 1})))
    monkeypatch.setattr(bench, "load_workload", load)
    monkeypatch.setattr(bench, "missing_package", lambda m: None)
    monkeypatch.setattr(bench, "_engine_ms", engine)
    monkeypatch.setattr(bench, "_bare_ms", bare)
    return calls


def run(tmp_path, *args):
    assert bench.main(["--tiny", "--out", str(tmp_path), *args]) == 0
    return json.loads((tmp_path / "workloads_tiny.json").read_text())


def test_the_tiny_run_builds_tiny_models_and_writes_every_part(fake, tmp_path, capsys):
    data = run(tmp_path)
    rows, meta = data["rows"], data["meta"]
    # tiny settings for every model, its own settings too; batch 4 under --tiny
    assert fake["load"][:2] == [("bert-base", {"tiny": True}), ("gpt2-small", {"tiny": True, "k": 1})]
    assert fake["load"][2:] == [("gpt2-small", {"tiny": True, "pad_vocab_to": 64})]
    assert (meta["warmup"], meta["steps"], meta["repeats"]) == (1, 2, 2)
    assert meta["device"] == "cpu" and meta["tiny"] is True and meta["parts_run"] == list(bench.PARTS)
    speed = [r for r in rows if r["part"] == "speed"]
    assert [(r["model"], r["precision"]) for r in speed] == \
        [(m, p) for m in ("bert-base", "gpt2-small") for p in bench.PRECISIONS]
    fp16 = next(r for r in speed if r["precision"] == "amp-fp16")
    assert fp16 == {"part": "speed", "model": "bert-base", "batch": 4, "precision": "amp-fp16",
                    "step_ms": 2.5, "samples_per_s": 4 / 2.5e-3, "peak_mem_allocated_mb": 7.5}
    assert all(e[2:5] == (4, 1, 2) for e in fake["engine"])
    assert all(b[1:] == (4, "cpu", 1, 2) for b in fake["bare"])
    engine = [(r["model"], r["variant"], r["repeat"]) for r in rows if r["part"] == "engine"]
    assert engine[:4] == [("bert-base", "bare", 0), ("bert-base", "engine", 0),
                          ("bert-base", "engine", 1), ("bert-base", "bare", 1)]
    assert all(r["precision"] == "amp-bf16" and r["batch"] == 4 for r in rows if r["part"] == "engine")
    assert [r["step_ms"] for r in rows if r["part"] == "engine"][:4] == [4.0, 2.0, 2.0, 4.0]
    vocab = [(r["vocab"], r["repeat"], r["step_ms"]) for r in rows if r["part"] == "vocab"]
    assert vocab == [("unpadded", 0, 2.0), ("padded", 0, 8.0), ("padded", 1, 8.0),
                     ("unpadded", 1, 2.0)]
    assert {r["model"] for r in rows if r["part"] == "vocab"} == {"gpt2-small"}
    mem = [r for r in rows if r["part"] == "memory"]
    assert [(r["model"], r["precision"]) for r in mem] == \
        [(m, p) for m in ("bert-base", "gpt2-small") for p in ("fp32", "amp-fp16", "amp-bf16")]
    oracle = memory.predict(tiny(), "amp-fp16", 4).total  # the same stand-in model, counted
    assert mem[1]["predicted_bytes"] == oracle and mem[1]["measured_peak_bytes"] is None
    assert mem[1]["ratio"] is None and mem[1]["batch"] == 4
    assert meta["summary"] == json.loads(json.dumps(bench.summarize(rows)))
    assert meta["timing"].startswith("fp16lab.measure.step_times_ms")
    out = capsys.readouterr().out
    assert "bert-base: engine / bare loop (amp-bf16 step time) 0.5000" in out
    assert "part speed done at" in out and "wrote " in out


def test_options_reach_the_measurements(fake, tmp_path):
    assert bench.main(["--tiny", "--out", str(tmp_path), "--warmup", "0", "--steps", "3",
                       "--repeats", "1", "--only", "engine,vocab", "--name", "mine"]) == 0
    data = json.loads((tmp_path / "mine.json").read_text())
    assert data["meta"]["parts_run"] == ["engine", "vocab"]
    assert (data["meta"]["warmup"], data["meta"]["steps"], data["meta"]["repeats"]) == (0, 3, 1)
    assert all(b[3:] == (0, 3) for b in fake["bare"]) and all(e[3:5] == (0, 3) for e in fake["engine"])
    assert [r["variant"] for r in data["rows"] if r["part"] == "engine"] == ["bare", "engine"] * 2


def test_without_a_gpu_the_full_run_falls_back_to_tiny(fake, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", str(tmp_path), "--only", "speed"]) == 0
    assert "no CUDA GPU: running the --tiny CPU version" in capsys.readouterr().out
    meta = json.loads((tmp_path / "workloads_tiny.json").read_text())["meta"]
    assert meta["tiny"] is True and (meta["warmup"], meta["steps"]) == (3, 10)
    assert fake["load"][0] == ("bert-base", {"tiny": True})


def test_a_missing_package_stops_before_anything_runs(fake, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "missing_package", lambda m: f"{m} needs transformers" if m != "bert-base"
                        else None)
    assert bench.main(["--tiny", "--out", str(tmp_path)]) == 2
    assert "cannot build gpt2-small: gpt2-small needs transformers" in capsys.readouterr().err
    assert fake["load"] == [] and not (tmp_path / "workloads_tiny.json").exists()


def test_a_failing_part_is_recorded_and_the_rest_runs(fake, tmp_path, monkeypatch, capsys):
    def engine(point, warmup, steps):
        if point.model == "bert-base":
            raise RuntimeError("broke")
        return 1.0, {"peak_mem_allocated_mb": 1.0}

    monkeypatch.setattr(bench, "_engine_ms", engine)
    rows = run(tmp_path, "--only", "speed")["rows"]
    assert rows[0] == {"part": "speed", "model": "bert-base", "error": "RuntimeError: broke"}
    assert [r["model"] for r in rows[1:]] == ["gpt2-small"] * 4
    assert "part speed, bert-base: RuntimeError: broke" in capsys.readouterr().out


def test_a_budget_lets_the_first_part_start(fake, tmp_path, monkeypatch, capsys):
    clock = iter([0.0, 0.5, 100.0, 100.0, 100.0, 100.0, 100.0, 100.0])
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    meta = run(tmp_path, "--only", "engine,speed", "--budget-s", "50")["meta"]
    assert meta["parts_run"] == ["engine"]
    assert "budget of 50 s spent: part 'speed' not run" in capsys.readouterr().out


def test_the_memory_part_on_a_gpu_compares(monkeypatch):
    got = []

    def compare(w, prec, batch, count_on):
        got.append((prec, batch, count_on))
        return {"total": 300, "measured_peak": 200, "ratio": 1.5}

    monkeypatch.setattr(bench.memory, "compare", compare)
    rows = []
    bench._run_part("memory", "m", tiny(), 6, rows, device="cuda", gpu=True, warmup=0, steps=1,
                    repeats=1, settings={})
    assert got == [(p, 6, "cuda") for p in ("fp32", "amp-fp16", "amp-bf16")]
    assert rows[0] == {"part": "memory", "model": "m", "batch": 6, "precision": "fp32",
                       "predicted_bytes": 300, "measured_peak_bytes": 200, "ratio": 1.5}


def test_vocab_only_for_gpt2(fake):
    rows = []
    bench._run_part("vocab", "bert-base", tiny(), 2, rows, device="cpu", gpu=False, warmup=0,
                    steps=1, repeats=2, settings={})
    bench._run_part("other", "gpt2-small", tiny(), 2, rows, device="cpu", gpu=False, warmup=0,
                    steps=1, repeats=2, settings={})
    assert rows == [] and fake["load"] == []


# ----------------------------------------------------------------------------- the pieces

def test_the_bare_loop_is_a_hand_written_bf16_sgd_step(monkeypatch):
    def batch(size, device):
        x = torch.randn(size, 4, generator=torch.Generator().manual_seed(1))
        return {"x": x.to(device)}, torch.tensor([0, 2, 1])[:size].to(device)

    class Keyed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            return {"logits": self.lin(x)}

    w = Workload(name="k", build=Keyed, batch=batch, output="logits")
    tf32 = []
    monkeypatch.setattr(bench, "set_tf32", lambda *a: tf32.append(a))
    step = bench.bare_loop(w, 3, "cpu")
    assert tf32 == [(False,)]  # TF32 off, as amp-bf16 runs
    torch.manual_seed(0)
    lin = nn.Linear(4, 3)
    opt = torch.optim.SGD(lin.parameters(), lr=LR, momentum=MOMENTUM)
    (x,), y = batch(3, "cpu")[0].values(), batch(3, "cpu")[1]
    losses = []
    for _ in range(2):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(lin(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    assert torch.equal(step().detach(), losses[0]) and torch.equal(step().detach(), losses[1])

    # a workload's own loss, on positional (tensor) inputs
    w2 = Workload(name="k2", build=lambda: nn.Linear(4, 3), batch=synthetic_batch((4,), 3),
                  loss=lambda out, y: out.float().pow(2).sum())
    torch.manual_seed(0)
    ref = nn.Linear(4, 3)
    xx, _ = w2.batch(2, "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = ref(xx).float().pow(2).sum()
    assert torch.equal(bench.bare_loop(w2, 2, "cpu")().detach(), expected.detach())


def test_a_token_models_bare_loss_ignores_minus_100():
    class Tok(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(5, 5)

        def forward(self, input_ids):
            return self.emb(input_ids)

    ids = torch.tensor([[1, 2, 3]])
    targets = torch.tensor([[2, -100, 4]])
    w = Workload(name="tok", build=Tok, batch=lambda s, d: ({"input_ids": ids}, targets))
    loss = bench.bare_loop(w, 1, "cpu")()
    torch.manual_seed(0)
    emb = nn.Embedding(5, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = emb(ids).float()
    expected = (F.cross_entropy(logits[0, 0:1], targets[0, 0:1])
                + F.cross_entropy(logits[0, 2:3], targets[0, 2:3])) / 2
    assert torch.allclose(loss.detach(), expected.detach())


def test_engine_ms_reads_the_row_and_names_a_failing_point(monkeypatch):
    seen = []

    def measure_point(point, warmup, steps, telemetry):
        seen.append((warmup, steps, telemetry))
        return {"status": "ok", "step_ms_median": 3.5, "x": 1} if point.batch == 2 else \
            {"status": "error", "error": "ValueError: no"}

    monkeypatch.setattr(bench.sweep, "measure_point", measure_point)
    ok = bench._point("t", tiny(), 2, "amp-bf16", "cpu")
    assert (ok.model, ok.batch, ok.precision, ok.device) == ("t", 2, "amp-bf16", "cpu")
    assert ok.workload.name == "t"
    assert bench._engine_ms(ok, 1, 4) == (3.5, {"status": "ok", "step_ms_median": 3.5, "x": 1})
    assert seen == [(1, 4, False)]
    with pytest.raises(RuntimeError, match=r"^t b3 nchw fp32: ValueError: no$"):
        bench._engine_ms(bench._point("t", tiny(), 3, "fp32", "cpu"), 0, 1)


def test_bare_ms_warms_up_then_takes_the_median(monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "bare_loop", lambda w, b, d: (lambda: calls.append((b, d))))

    def times(step, steps, device):
        assert len(calls) == 2  # the warm-up ran first, untimed
        for _ in range(steps):
            step()
        return [5.0, 1.0, 2.0][:steps]

    monkeypatch.setattr(bench.measure, "step_times_ms", times)
    assert bench._bare_ms(tiny(), 7, "cpu", 2, 3) == 2.0
    assert calls == [(7, "cpu")] * 5


def test_summary_without_fp32_or_tf32_and_with_errors(capsys):
    rows = [{"part": "speed", "model": "m", "precision": "amp-bf16", "samples_per_s": 50.0},
            {"part": "memory", "model": "m", "precision": "fp32", "ratio": None},
            {"part": "memory", "model": "m", "precision": "amp-fp16", "ratio": 1.25},
            {"part": "speed", "model": "z", "error": "E: x"}]
    s = bench.summarize(rows)
    assert s["speed"] == {"m": {"amp-bf16": {"samples_per_s": 50.0, "over_fp32": None,
                                             "over_tf32": None}}}
    assert s["errors"] == ["speed z: E: x"] and s["engine_vs_bare"] == {} and s["vocab_gain"] is None
    assert list(s["memory_ratio"]["m"].items()) == [("fp32", None), ("amp-fp16", 1.25)]
    bench.print_summary(s)
    out = capsys.readouterr().out.splitlines()
    assert out == ["m: amp-bf16 50/s (x0.00 fp32, x0.00 tf32)",
                   "m: predicted / measured peak fp32 (no GPU)  amp-fp16 1.250",
                   "error: speed z: E: x"]
    bench.print_summary({"speed": {"n": {"fp32": {"samples_per_s": 10.0, "over_fp32": 1.0,
                                                  "over_tf32": 0.5}}},
                         "engine_vs_bare": {"n": 1.01234}, "memory_ratio": {}, "errors": [],
                         "vocab_gain": -0.123})
    assert capsys.readouterr().out.splitlines() == [
        "n: fp32 10/s (x1.00 fp32, x0.50 tf32)",
        "n: engine / bare loop (amp-bf16 step time) 1.0123",
        "gpt2-small: vocabulary padded to a multiple of 64, step-time gain -12.3%"]


def test_summary_medians_per_model():
    rows = [{"part": "engine", "model": "a", "variant": v, "step_ms": ms}
            for v, ms in (("bare", 1.0), ("engine", 2.0), ("bare", 3.0), ("engine", 4.0),
                          ("bare", 100.0), ("engine", 6.0))]
    rows += [{"part": "engine", "model": "b", "variant": "bare", "step_ms": 1.0},
             {"part": "engine", "model": "b", "variant": "engine", "step_ms": 1.5}]
    rows += [{"part": "vocab", "model": "g", "vocab": v, "step_ms": ms}
             for v, ms in (("unpadded", 9.0), ("padded", 6.0), ("unpadded", 15.0), ("padded", 6.0),
                           ("unpadded", 12.0), ("padded", 60.0))]
    s = bench.summarize(rows)
    assert s["engine_vs_bare"] == {"a": statistics.median([2.0, 4.0, 6.0]) / 3.0, "b": 1.5}
    assert s["vocab_gain"] == pytest.approx(12.0 / 6.0 - 1)

"""fp16lab.bench.workloads, fast: the script's wiring on tiny stand-in workloads, its rows and
ratios worked out by hand, the bare loop against a step written here. (The end-to-end tiny run
with the real transformers models is tests/test_bench_workloads.py.)"""

from __future__ import annotations

import json
import re
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


@pytest.fixture(autouse=True)
def keep_tf32(monkeypatch):
    """The bare loop turns TF32 off for the whole process: not in these tests."""
    monkeypatch.setattr(bench, "set_tf32", lambda *a: None)


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
    assert [e[0] for e in fake["engine"]] == ["bert-base"] * 4 + ["gpt2-small"] * 4 + \
        ["bert-base"] * 2 + ["gpt2-small"] * 2 + ["gpt2-small"] * 4
    vrow = next(r for r in rows if r["part"] == "vocab")
    assert vrow == {"part": "vocab", "model": "gpt2-small", "batch": 4, "precision": "amp-bf16",
                    "vocab": "unpadded", "repeat": 0, "step_ms": 2.0}
    erow = next(r for r in rows if r["part"] == "engine")
    assert erow == {"part": "engine", "model": "bert-base", "batch": 4, "precision": "amp-bf16",
                    "variant": "bare", "repeat": 0, "step_ms": 4.0}
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
    # on a CPU every memory recipe but TF32; the stand-in Linear(4, 3) has no layer FP8 can take
    assert [(r["model"], r["precision"]) for r in mem] == \
        [(m, p) for m in ("bert-base", "gpt2-small")
         for p in ("fp32", "amp-fp16", "amp-bf16", "fp16-o2", "fp8-tensorwise")]
    assert [("error" in r) for r in mem] == [False, False, False, False, True] * 2
    assert mem[4]["error"].startswith("WorkloadCannotRun: workload 'bert-base' cannot run")
    oracle = memory.predict(tiny(), "amp-fp16", 4).peak  # the same stand-in model, counted
    assert mem[1]["predicted_bytes"] == oracle and mem[1]["measured_peak_bytes"] is None
    assert mem[1]["parts_bytes"] == memory.predict(tiny(), "amp-fp16", 4).total
    assert mem[1]["ratio"] is None and mem[1]["batch"] == 4
    assert meta["summary"] == json.loads(json.dumps(bench.summarize(rows)))
    assert meta["timing"].startswith("fp16lab.measure.step_times_ms")
    out = capsys.readouterr().out
    assert "bert-base: engine / bare loop (amp-bf16 step time) 0.5000" in out
    assert "part speed done at" in out and f"wrote {tmp_path / 'workloads_tiny.json'} (" in out
    assert "no CUDA GPU" not in out


def test_options_reach_the_measurements(fake, tmp_path):
    assert bench.main(["--tiny", "--out", str(tmp_path), "--warmup", "0", "--steps", "3",
                       "--repeats", "1", "--only", "engine,vocab", "--name", "mine"]) == 0
    data = json.loads((tmp_path / "mine.json").read_text())
    assert data["meta"]["parts_run"] == ["engine", "vocab"]
    assert (data["meta"]["warmup"], data["meta"]["steps"], data["meta"]["repeats"]) == (0, 3, 1)
    assert all(b[3:] == (0, 3) for b in fake["bare"]) and all(e[3:5] == (0, 3) for e in fake["engine"])
    assert [r["variant"] for r in data["rows"] if r["part"] == "engine"] == ["bare", "engine"] * 2


def test_three_repeats_alternate_their_order(fake, tmp_path):
    rows = run(tmp_path, "--repeats", "3", "--only", "engine,vocab")["rows"]
    engine = [(r["variant"], r["repeat"]) for r in rows if r["part"] == "engine" and r["model"] == "bert-base"]
    assert engine == [("bare", 0), ("engine", 0), ("engine", 1), ("bare", 1), ("bare", 2), ("engine", 2)]
    vocab = [(r["vocab"], r["repeat"]) for r in rows if r["part"] == "vocab"]
    assert vocab == [("unpadded", 0), ("padded", 0), ("padded", 1), ("unpadded", 1),
                     ("unpadded", 2), ("padded", 2)]


def test_on_a_gpu_the_real_sizes_and_the_h200_file(fake, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(bench.memory, "compare", lambda w, prec, batch, count_on: {
        "peak": 3, "total": 2, **{f"peak_{k}": 1 for k in memory.AT_PEAK}, "measured_peak": 4,
        "ratio": 0.5})
    assert bench.main(["--out", str(tmp_path), "--only", "speed,engine,memory"]) == 0
    data = json.loads((tmp_path / "workloads_h200.json").read_text())
    meta, rows = data["meta"], data["rows"]
    assert meta["device"] == "cuda" and meta["tiny"] is False
    assert (meta["warmup"], meta["steps"]) == (3, 10)
    assert fake["load"] == [("bert-base", {}), ("gpt2-small", {"k": 1})]
    assert {r["model"]: r["batch"] for r in rows} == {"bert-base": 64, "gpt2-small": 8}
    assert fake["bare"][0] == ("bert-base", 64, "cuda", 3, 10)
    mem = [r for r in rows if r["part"] == "memory"]
    assert mem[0]["measured_peak_bytes"] == 4 and mem[0]["ratio"] == 0.5
    assert (mem[0]["predicted_bytes"], mem[0]["parts_bytes"]) == (3, 2)
    assert [mem[0][f"peak_{k}_bytes"] for k in memory.AT_PEAK] == [1, 1, 1, 1]
    assert "no CUDA GPU" not in capsys.readouterr().out


def test_tiny_on_a_gpu_machine_stays_on_the_cpu(fake, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    meta = run(tmp_path, "--only", "engine")["meta"]
    assert meta["device"] == "cpu" and fake["bare"][0][2] == "cpu"


def test_the_committed_file_with_replace(fake, monkeypatch):
    written = []
    monkeypatch.setattr(bench.measure, "write_result",
                        lambda name, rows, **kw: written.append((name, kw["replace"], kw["data_dir"])) or "p")
    assert bench.main(["--tiny", "--only", "speed", "--replace"]) == 0
    assert written and all(w == ("workloads_tiny", True, None) for w in written)
    written.clear()
    assert bench.main(["--tiny", "--only", "speed"]) == 0
    assert all(w[1] is False for w in written)


def test_progress_lines_are_flushed(fake, tmp_path, monkeypatch):
    printed = []
    monkeypatch.setattr(bench, "print", lambda *a, **k: printed.append((a, k)), raising=False)

    def engine(point, warmup, steps):
        raise RuntimeError("x")

    monkeypatch.setattr(bench, "_engine_ms", engine)
    assert bench.main(["--tiny", "--out", str(tmp_path), "--only", "speed"]) == 0
    progress = [(a[0], k) for a, k in printed if a and str(a[0]).startswith("part ")]
    assert progress and all(k.get("flush") is True for _, k in progress), progress


@pytest.mark.parametrize("args", [["--warmup", "-1"], ["--steps", "0"], ["--repeats", "0"],
                                  ["--budget-s", "0"], ["--budget-s", "-1"], ["--name", ""],
                                  ["--out", ""], ["--only", "speed,nope"]])
def test_bad_options_stop_before_anything_runs(fake, args, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--tiny", *args])
    assert fake["load"] == []


def test_a_budget_below_a_second_is_fine(fake, tmp_path):
    assert run(tmp_path, "--budget-s", "0.5", "--only", "speed")["meta"]["parts_run"] == ["speed"]


def test_help_says_what_each_option_does(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("usage: fp16lab bench workloads")
    for words in ["Real models under each precision: speed, memory predicted against measured, "
                  "the engine's cost.",
                  "--tiny tiny configurations on the CPU",
                  "untimed steps per point (default 3; 1 with --tiny)",
                  "timed steps per point (default 10; 2 with --tiny)",
                  "interleaved repeats (engine, vocab)",
                  "start no new part after this many seconds (what ran is written)",
                  "parts, comma-separated: speed,engine,memory,vocab,recipe",
                  "result file stem (default: workloads_h200 on a GPU, workloads_tiny with --tiny)",
                  "write the file shipped with fp16lab in data/ instead of data/local/",
                  "folder to write the result to (default: data/local/, or data/ with --replace)"]:
        assert re.search(rf"(^| ){re.escape(words)}( |$)", text), words


def test_each_finished_part_is_written_before_the_next_starts(fake, tmp_path, monkeypatch):
    def engine(point, warmup, steps):
        raise KeyboardInterrupt  # not caught: the run stops here

    monkeypatch.setattr(bench, "_engine_ms", engine)
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--tiny", "--out", str(tmp_path), "--only", "memory,speed"])
    data = json.loads((tmp_path / "workloads_tiny.json").read_text())
    assert data["meta"]["parts_run"] == ["memory"]  # as written after the memory part
    assert {r["part"] for r in data["rows"]} == {"memory"} and len(data["rows"]) == 10


def test_without_a_gpu_the_full_run_falls_back_to_tiny(fake, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", str(tmp_path), "--only", "speed"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "no CUDA GPU: running the --tiny CPU version"
    meta = json.loads((tmp_path / "workloads_tiny.json").read_text())["meta"]
    assert meta["tiny"] is True and (meta["warmup"], meta["steps"]) == (3, 10)
    assert fake["load"][0] == ("bert-base", {"tiny": True})


def test_a_missing_package_stops_before_anything_runs(fake, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "missing_package", lambda m: f"{m} needs transformers" if m != "bert-base"
                        else None)
    assert bench.main(["--tiny", "--out", str(tmp_path)]) == 2
    assert "cannot build gpt2-small: gpt2-small needs transformers" in capsys.readouterr().err
    monkeypatch.setattr(bench, "missing_package", lambda m: f"{m} needs transformers")
    assert bench.main(["--tiny", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "cannot build bert-base, gpt2-small: bert-base needs transformers\n"
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
    clock = iter([1000.0, 1000.5, 1001.0, 1050.0, 1050.0, 1051.0, 1051.0, 1051.0, 1051.0])
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    meta = run(tmp_path, "--only", "engine,speed,memory", "--budget-s", "50")["meta"]
    assert meta["parts_run"] == ["engine", "speed"]  # 50 s spent is not past a budget of 50
    out = capsys.readouterr().out
    assert "part engine done at 1 s" in out

    clock = iter([1000.0, 1000.5, 1001.0, 1051.0, 1051.0, 1051.0, 1051.0, 1051.0, 1051.0])
    meta = run(tmp_path, "--only", "engine,speed,memory", "--budget-s", "50")["meta"]
    assert meta["parts_run"] == ["engine"]
    out = capsys.readouterr().out
    assert "budget of 50 s spent: part 'speed' not run" in out
    assert "budget of 50 s spent: part 'memory' not run" in out
    assert "(51 s)" in out


def test_the_memory_part_on_a_gpu_compares(monkeypatch):
    got = []

    w = tiny()

    def compare(wl, prec, batch, count_on):
        assert wl is w
        got.append((prec, batch, count_on))
        return {"peak": 300, "total": 250, "peak_held": 10, "peak_activations": 20,
                "peak_gradients": 30, "peak_temporaries": 40, "measured_peak": 200, "ratio": 1.5}

    monkeypatch.setattr(bench.memory, "compare", compare)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))  # no FP8
    bench._run_part("memory", "m", w, 6, [], device="cuda", gpu=True, warmup=0, steps=1,
                    repeats=1, settings={})
    assert got == [(p, 6, "cuda") for p in ("fp32", "tf32", "amp-fp16", "amp-bf16", "fp16-o2")]
    got.clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    rows = []
    bench._run_part("memory", "m", w, 6, rows, device="cuda", gpu=True, warmup=0, steps=1,
                    repeats=1, settings={})
    assert got == [(p, 6, "cuda") for p in ("fp32", "tf32", "amp-fp16", "amp-bf16", "fp16-o2",
                                             "fp8-tensorwise")]
    assert rows[0] == {"part": "memory", "model": "m", "batch": 6, "precision": "fp32",
                       "predicted_bytes": 300, "parts_bytes": 250, "peak_held_bytes": 10,
                       "peak_activations_bytes": 20, "peak_gradients_bytes": 30,
                       "peak_temporaries_bytes": 40, "measured_peak_bytes": 200, "ratio": 1.5}


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
    for _ in range(3):  # three: the third update is the first the momentum changes
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(lin(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    assert [torch.equal(step().detach(), loss) for loss in losses] == [True] * 3

    # a workload's own loss, on positional (tensor) inputs: the output as it is, the targets too
    w2 = Workload(name="k2", build=lambda: nn.Linear(4, 3), batch=synthetic_batch((4,), 3),
                  loss=lambda out, y: out.float()[0].pow(2).sum() + y.float().sum())
    torch.manual_seed(0)
    ref = nn.Linear(4, 3)
    xx, yy = w2.batch(2, "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = ref(xx).float()[0].pow(2).sum() + yy.float().sum()
    assert torch.equal(bench.bare_loop(w2, 2, "cpu")().detach(), expected.detach())


class Recorded(nn.Linear):
    """A Linear that records where it is moved."""

    moves: list = []

    def to(self, *args, **kwargs):
        Recorded.moves.append(args)
        return super().to(*args, **kwargs)


def test_the_bare_loop_places_frees_and_autocasts_as_asked(monkeypatch):
    asked, models = [], []
    inner = synthetic_batch((4,), 3)

    def batch(size, device):
        asked.append(device)
        return inner(size, device)

    def build():
        models.append(Recorded(4, 3))
        return models[-1]

    Recorded.moves = []
    contexts = []
    real = torch.autocast

    def autocast(device, **kw):
        contexts.append((device, kw))
        return real(device, **kw)

    monkeypatch.setattr(bench.torch, "autocast", autocast)
    step = bench.bare_loop(Workload(name="r", build=build, batch=batch), 2, "cpu")
    assert Recorded.moves == [("cpu",)] and asked == ["cpu"]
    step()
    first = models[0].weight.grad
    step()
    assert contexts == [("cpu", {"dtype": torch.bfloat16})] * 2
    # the gradients are freed (set to None) before each backward, not zeroed in place
    assert models[0].weight.grad is not first


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
    assert bench._point("t", tiny(), 2, "amp-bf16", "cuda").device == "cuda"
    assert ok.workload.name == "t"
    assert bench._engine_ms(ok, 1, 4) == (3.5, {"status": "ok", "step_ms_median": 3.5, "x": 1})
    assert seen == [(1, 4, False)]
    with pytest.raises(RuntimeError, match=r"^t b3 nchw fp32: ValueError: no$"):
        bench._engine_ms(bench._point("t", tiny(), 3, "fp32", "cpu"), 0, 1)


def test_bare_ms_warms_up_then_takes_the_median(monkeypatch):
    calls = []
    built = []

    def loop(w, b, d):
        built.append(w)
        return lambda: calls.append((b, d))

    monkeypatch.setattr(bench, "bare_loop", loop)
    devices = []

    def times(step, steps, device):
        devices.append(device)
        assert len(calls) == 2  # the warm-up ran first, untimed
        for _ in range(steps):
            step()
        return [5.0, 1.0, 2.0][:steps]

    monkeypatch.setattr(bench.measure, "step_times_ms", times)
    cleared = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: cleared.append(1))
    w = tiny()
    assert bench._bare_ms(w, 7, "cpu", 2, 3) == 2.0
    assert calls == [(7, "cpu")] * 5 and built == [w] and devices == ["cpu"] and cleared == []
    calls.clear()
    assert bench._bare_ms(w, 7, "cuda", 2, 1) == 5.0
    assert devices == ["cpu", "cuda"] and cleared == [1]  # the loop's memory handed back


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
                                                  "over_tf32": 0.5},
                                         "tf32": {"samples_per_s": 20.0, "over_fp32": 2.0,
                                                  "over_tf32": 1.0}}},
                         "engine_vs_bare": {"n": 1.01234}, "memory_ratio": {}, "errors": [],
                         "vocab_gain": -0.123})
    assert capsys.readouterr().out.splitlines() == [
        "n: fp32 10/s (x1.00 fp32, x0.50 tf32)  tf32 20/s (x2.00 fp32, x1.00 tf32)",
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


def test_recipe_rows_against_the_steps_run_by_hand(monkeypatch):
    """Each arm's row: its losses and scales are those of the same step built here (AdamW with
    the source's settings, the arm's scaler), the skipped steps are the scale's drops counted
    by hand, and the rate is the batch over the median of the timed steps."""
    from fp16lab.scaling import DynamicLossScaler
    from fp16lab.workload import train_step
    w = tiny(name="tiny-recipe")
    timed = iter([[3.0, 1.0, 2.0], [8.0, 4.0, 6.0], [5.0, 5.0, 5.0], [9.0, 7.0, 8.0]])
    monkeypatch.setattr(bench.measure, "step_times_ms", lambda step, n, device: next(timed))
    rows = bench.recipe_rows(w, 6, "cpu", loss_steps=4, timed_steps=3)
    assert [r["arm"] for r in rows] == [a for a, _, _ in bench.RECIPE_ARMS]
    for row, (arm, precision, scaler), ms in zip(rows, bench.RECIPE_ARMS, (2.0, 6.0, 5.0, 8.0)):
        engine = {"optimizer": lambda ps: torch.optim.AdamW(ps, lr=1e-4, betas=(0.9, 0.999),
                                                            weight_decay=0.01)}
        if scaler is not None:
            engine["loss_scaler"] = DynamicLossScaler(**scaler)
        step = train_step(w, precision, "cpu", 6, seed=0, **engine)
        first = None if step.scaler is None else float(step.scaler.get_scale())
        losses, scales = [], []
        for _ in range(4):
            losses.append(float(step().detach()))
            scales.append(None if step.scaler is None else float(step.scaler.get_scale()))
        drops = None if first is None else sum(
            1 for a, b in zip([first] + scales, scales) if b < a)
        assert row["losses"] == losses and row["scales"] == scales, arm
        assert row["skipped_steps"] == drops, arm
        assert (row["part"], row["model"], row["batch"], row["precision"]) == (
            "recipe", "tiny-recipe", 6, precision)
        assert row["optimizer"] == "AdamW({'lr': 0.0001, 'betas': (0.9, 0.999), " \
                                   "'weight_decay': 0.01})"
        assert row["scaler"] == (scaler or ("GradScaler defaults" if precision == "amp-fp16"
                                            else None)), arm
        assert row["step_ms"] == ms and row["samples_per_s"] == pytest.approx(6 / (ms / 1e3))
        assert row["peak_mem_allocated_mb"] is None
    assert rows[0]["scaler"] == {"init_scale": 8192.0, "max_scale": 32768.0}
    assert rows[3]["skipped_steps"] is None and rows[3]["scales"] == [None] * 4


def test_recipe_rows_count_every_drop_of_the_scale(monkeypatch):
    """A scaler that halves at steps 2 and 4: two skipped steps, the steps between not counted."""
    class Halving:
        def __init__(self):
            self.scale, self.n = 1024.0, 0

        def get_scale(self):
            return self.scale

    class Step:
        def __init__(self):
            self.scaler = Halving()

        def __call__(self):
            self.scaler.n += 1
            if self.scaler.n in (2, 4):
                self.scaler.scale /= 2
            elif self.scaler.n == 5:
                self.scaler.scale *= 4  # a growth is no skip
            return torch.tensor(1.0)
    monkeypatch.setattr(bench, "RECIPE_ARMS", (("halving", "amp-fp16", None),))
    monkeypatch.setattr(bench, "train_step", lambda *a, **k: Step())
    monkeypatch.setattr(bench.measure, "step_times_ms", lambda step, n, device: [1.0])
    row, = bench.recipe_rows(tiny(), 2, "cpu", loss_steps=6, timed_steps=1)
    assert row["scales"] == [1024.0, 512.0, 512.0, 256.0, 1024.0, 1024.0]
    assert row["skipped_steps"] == 2

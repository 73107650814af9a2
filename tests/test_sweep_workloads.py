"""A user's workload through the sweep: trained as a bare loop would, by object or by name.

The oracle is a textbook training loop written here (SGD with the recipes' learning rate and
momentum, cross-entropy), not fp16lab's step: the sweep's fp32 row must end on that loop's loss.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fp16lab import sweep
from fp16lab.recipes import LR, MOMENTUM
from fp16lab.workload import Workload, train_step
from fp16lab.workloads.batches import synthetic_batch

WARMUP, STEPS = 2, 3


def mlp_workload(width: int = 32) -> Workload:
    return Workload(name="user-mlp",
                    build=lambda: nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 5)),
                    batch=synthetic_batch((16,), num_classes=5, seed=3), settings={"width": width})


def bare_loop_losses(workload: Workload, batch: int, seed: int, n: int) -> list[float]:
    torch.manual_seed(seed)
    model = workload.build()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = workload.batch(batch, "cpu")
    losses = []
    for _ in range(n):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _spec(models, **kw):
    base = dict(models=models, batches=(8,), device="cpu", warmup=WARMUP, steps=STEPS,
                repeats=1, telemetry=False)
    return sweep.SweepSpec(**{**base, **kw})


def test_a_workload_object_trains_in_the_sweep_as_a_bare_loop_does():
    w = mlp_workload()
    rows = sweep.run_sweep(_spec((w,), precisions=("fp32", "amp-bf16")))
    by = {r["precision"]: r for r in rows.to_dict("records")}
    assert set(by) == {"fp32", "amp-bf16"} and all(r["status"] == "ok" for r in by.values())
    assert by["fp32"]["model"] == "user-mlp"
    expected = bare_loop_losses(w, 8, seed=1234, n=WARMUP + STEPS)
    assert by["fp32"]["final_loss"] == pytest.approx(expected[-1], rel=1e-6)
    # bf16 autocast trains the same model to a loss near fp32's, not equal to it
    assert by["amp-bf16"]["final_loss"] == pytest.approx(expected[-1], rel=0.05)
    assert by["amp-bf16"]["final_loss"] != by["fp32"]["final_loss"]


def test_a_workload_named_module_colon_function_is_loaded_and_keyed_by_its_settings(tmp_path,
                                                                                   monkeypatch):
    (tmp_path / "my_sweep_workload.py").write_text(textwrap.dedent("""
        from torch import nn
        from fp16lab.workload import Workload
        from fp16lab.workloads.batches import synthetic_batch

        def make(width=8):
            return Workload(name="named-mlp",
                            build=lambda: nn.Sequential(nn.Linear(16, width), nn.Linear(width, 5)),
                            batch=synthetic_batch((16,), 5), settings={"width": width})
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = _spec(("my_sweep_workload:make",))
    (point,) = spec.points()
    assert point.model == "my_sweep_workload:make" and point.workload.name == "named-mlp"
    other = _spec((mlp_workload(width=64),)).points()[0]
    same_but_wider = _spec((mlp_workload(width=32),)).points()[0]
    assert other.key != same_but_wider.key  # the settings are part of what was measured
    rows = sweep.run_sweep(spec)
    assert list(rows["status"]) == ["ok"] and rows["model"][0] == "my_sweep_workload:make"
    sys.modules.pop("my_sweep_workload", None)


def test_what_a_workload_cannot_run_is_recorded_in_its_row_and_the_sweep_goes_on():
    rows = sweep.run_sweep(_spec((mlp_workload(),), layouts=("nchw", "channels_last")))
    by = {r["layout"]: r for r in rows.to_dict("records")}
    assert by["nchw"]["status"] == "ok"
    assert by["channels_last"]["status"] == "error"
    assert "WorkloadCannotRun" in by["channels_last"]["error"]
    assert "'user-mlp'" in by["channels_last"]["error"] and "channels_last" in by["channels_last"]["error"]


def test_an_fp8_recipe_converts_the_workloads_linear_layers():
    rows = sweep.run_sweep(_spec((mlp_workload(),), precisions=("fp8-tensorwise",)))
    (row,) = rows.to_dict("records")
    # Linear(16, 32) converts; Linear(32, 5) cannot (5 features, not a multiple of 16)
    assert row["status"] == "ok" and row["fp8_layers"] == 1
    assert row["fp8_emulated"]  # a CPU has no FP8 matmul: the row says so


def test_a_workload_compiles_on_a_cpu():
    pytest.importorskip("torch._inductor")
    rows = sweep.run_sweep(_spec((mlp_workload(),), executions=("compile",), steps=1, warmup=1))
    (row,) = rows.to_dict("records")
    assert row["status"] == "ok", row["error"]
    assert "torch.compile" in row["execution_notes"]


@pytest.mark.parametrize("models, words", [
    (("no_such_module_here:make",), ["no_such_module_here", "cannot be imported"]),
    (("nonsense",), ["unknown model 'nonsense'", "small_cnn", "bert-base"]),
    ((3,), ["a sweep model must be", "int"]),
])
def test_a_workload_that_does_not_load_is_refused_before_anything_runs(models, words):
    with pytest.raises((ValueError, TypeError)) as err:
        _spec(models)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("axis, value, words", [
    ("executions", ("cuda-graph",), ["cuda-graph", "needs a CUDA device"]),
    ("inputs", ("dataloader",), ["makes its own batches", "dataloader"]),
])
def test_a_setting_no_workload_point_takes_is_refused_with_the_reason(axis, value, words):
    with pytest.raises(ValueError) as err:
        _spec((mlp_workload(),), **{axis: value})
    for w in words:
        assert w in str(err.value)


def test_a_capture_that_fails_is_the_workloads_setting_error(monkeypatch):
    from types import SimpleNamespace

    from fp16lab import execution
    from fp16lab.sweep import steps
    from fp16lab.workload import WorkloadCannotRun

    ws = train_step(mlp_workload(), "fp32", "cpu", 4)
    point = SimpleNamespace(workload=mlp_workload())

    def fails(step, warmup, traceable):
        step()  # the function captured is the workload's step
        raise RuntimeError("operation not permitted when stream is capturing\nmore lines")

    monkeypatch.setattr(execution, "capture", fails)
    with pytest.raises(WorkloadCannotRun) as err:
        steps._captured(point, ws)
    for words in ["workload 'user-mlp'", "execution 'cuda-graph'",
                  "RuntimeError: operation not permitted when stream is capturing)",
                  "no host synchronisation"]:
        assert words in str(err.value)
    assert "more lines" not in str(err.value)
    seen = []

    def replays(step, warmup, traceable):
        seen.append((warmup, traceable))
        return lambda: "replayed loss"

    monkeypatch.setattr(execution, "capture", replays)
    captured = steps._captured(point, ws)
    assert captured.run() == "replayed loss" and captured() == "replayed loss"
    assert captured.model is ws.model and seen == [(execution.WARMUP_STEPS, False)]
    with pytest.raises(ValueError, match="replays the batch it captured"):
        captured(*ws.workload.batch(4, "cpu"))


# ----------------------------------------------------------------------------- the other engines

class _DictModel(nn.Module):
    """A model as transformers writes one: keyword inputs, a dict output with logits."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 50)

    def forward(self, input_ids, attention_mask=None):
        return {"logits": self.proj(self.embed(input_ids))}


def _dict_workload() -> Workload:
    from fp16lab.workloads.batches import token_batch
    return Workload(name="dict-lm", build=_DictModel, output="logits",
                    batch=token_batch(6, 50, causal=True))


def test_census_model_takes_a_workloads_dict_inputs_and_loss():
    from fp16lab.census import census_model
    from fp16lab.workload import train_step

    ws = train_step(_dict_workload(), "fp32", "cpu", 4)
    df = census_model(ws.model, ws.inputs, ws.targets, loss_fn=ws.loss)
    grads = df[df.kind == "gradient"]
    assert set(grads.layer) == {"embed", "proj"}
    assert set(df[df.kind == "activation"].layer) == {"embed", "proj"}
    # the loss census_model backpropagated is the workload's: the same gradient as by hand
    model = ws.model
    from_census = model.proj.weight.grad.clone()
    model.zero_grad()
    out = model(**ws.inputs)["logits"]
    F.cross_entropy(out.flatten(0, 1), ws.targets.flatten()).backward()
    assert torch.equal(from_census, model.proj.weight.grad)


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "fp16-o2"])
def test_forward_loss_is_the_loss_the_step_computes(precision):
    from fp16lab.workload import train_step

    ws = train_step(_dict_workload(), precision, "cpu", 4, seed=1)
    before = float(ws.forward_loss())
    assert float(ws()) == pytest.approx(before, rel=1e-6)  # the step's loss, before its update
    assert float(ws.forward_loss()) != before  # the step did update the weights


def test_the_locator_the_monitor_and_the_profiler_take_a_workloads_step():
    from fp16lab.diagnostics import GradientMonitor, locate_first_nonfinite
    from fp16lab.profile import profile_steps
    from fp16lab.workload import train_step

    ws = train_step(_dict_workload(), "fp32", "cpu", 4)
    assert locate_first_nonfinite(ws.model, ws.forward_loss) is None
    with torch.no_grad():
        ws.model.proj.weight[3, 2] = float("inf")
    report = locate_first_nonfinite(ws.model, ws.forward_loss)
    assert report is not None and report.module == "proj"
    ws = train_step(_dict_workload(), "fp32", "cpu", 4)
    monitor = GradientMonitor(ws.model)
    monitor.attach()
    for _ in range(3):
        ws()
    assert monitor.steps == 3 and set(monitor.frame().param) >= {"proj.weight", "embed.weight"}
    monitor.remove()
    prof = profile_steps(ws, steps=2, warmup=1, cuda=False)
    assert prof.steps == 2 and prof.summary.lane == "cpu" and prof.summary.busy_us > 0
    ranges = prof.events[prof.events.name == "fp16lab.step"]
    assert len(ranges) == 2  # the two profiled calls of the workload's step


@pytest.mark.gpu
def test_a_workload_point_on_the_gpu_trains_as_the_bare_loop_and_records_its_peak():
    w = mlp_workload()
    rows = sweep.run_sweep(_spec((w,), batches=(16,), device="cuda",
                                 precisions=("fp32", "amp-fp16", "fp8-tensorwise")))
    by = {r["precision"]: r for r in rows.to_dict("records")}
    assert all(r["status"] == "ok" for r in by.values()), {p: r["error"] for p, r in by.items()}
    assert all(r["peak_mem_allocated_mb"] > 0 for r in by.values())
    # fp32 on the GPU, TF32 off: the bare CPU loop's loss up to the sums' order
    expected = bare_loop_losses(w, 16, seed=1234, n=WARMUP + STEPS)
    assert by["fp32"]["final_loss"] == pytest.approx(expected[-1], rel=1e-4)
    assert by["amp-fp16"]["final_scale"] == 65536.0 and by["amp-fp16"]["skipped_steps"] == 0
    assert by["fp8-tensorwise"]["fp8_layers"] == 1


@pytest.mark.gpu
def test_a_dict_workloads_step_on_the_gpu_matches_its_forward_loss():
    from fp16lab.workload import train_step

    ws = train_step(_dict_workload(), "amp-fp16", "cuda", 8, seed=2)
    before = float(ws.forward_loss())
    assert float(ws()) == pytest.approx(before, rel=1e-3)  # autocast fp16 on both sides


def test_the_sweep_command_line_takes_a_workload_by_name(tmp_path, monkeypatch, capsys):
    from fp16lab import cli

    (tmp_path / "cli_workload_mod.py").write_text(textwrap.dedent("""
        from torch import nn
        from fp16lab.workload import Workload
        from fp16lab.workloads.batches import synthetic_batch

        def make():
            return Workload(name="cli-mlp", build=lambda: nn.Sequential(nn.Linear(16, 5)),
                            batch=synthetic_batch((16,), 5))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "rows.parquet"
    assert cli.main(["sweep", "--workload", "cli_workload_mod:make", "--batch", "4",
                     "--precision", "fp32,amp-bf16", "--warmup", "0", "--steps", "1",
                     "--repeats", "1", "--device", "cpu", "--no-telemetry", "--out", str(out)]) == 0
    rows = sweep.read_results(out)
    assert sorted(rows["precision"]) == ["amp-bf16", "fp32"] and set(rows["status"]) == {"ok"}
    assert set(rows["model"]) == {"cli_workload_mod:make"}  # the name that rebuilds it
    assert cli.main(["sweep", "--workload", "no_such_mod_here:make", "--out", str(out)]) == 2
    assert "no_such_mod_here" in capsys.readouterr().err
    sys.modules.pop("cli_workload_mod", None)


def test_a_workload_point_checks_its_own_values():
    w = mlp_workload()
    with pytest.raises(TypeError, match="cudnn_benchmark must be True or False"):
        sweep.Point(model=w.name, batch=8, workload=w, cudnn_benchmark=1)
    with pytest.raises(TypeError, match="a point's workload must be a Workload"):
        sweep.Point(model="x", batch=8, workload="bert-base")
    with pytest.raises(ValueError, match="runs fp32, not 'amp-fp16'"):
        only_fp32 = Workload(name="only-fp32", build=w.build, batch=w.batch, precisions=("fp32",))
        sweep.Point(model=only_fp32.name, batch=8, precision="amp-fp16", workload=only_fp32)
    p = sweep.Point(model=w.name, batch=8, precision="amp-fp16", workload=w)
    assert p.scaler == sweep.ScalerSettings()  # a scaled precision gets GradScaler's defaults
    assert sweep.Point(model=w.name, batch=8, workload=w).scaler is None


# ----------------------------------------------------------------------------- CUDA graphs (GPU)

@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "amp-fp16"])
def test_a_workload_captured_as_a_cuda_graph_trains_as_its_eager_step(precision):
    import functools
    from types import SimpleNamespace

    from fp16lab import execution
    from fp16lab.recipes import sgd
    from fp16lab.sweep import steps

    def built():
        return train_step(mlp_workload(), precision, "cuda", 64, autocast_cache=False,
                          unscale_first=True, optimizer=functools.partial(sgd, fused=True))

    eager = built()
    graph = steps._captured(SimpleNamespace(workload=mlp_workload()), built())
    for _ in range(execution.WARMUP_STEPS):  # the capture ran these before recording
        eager()
    for _ in range(4):
        assert float(graph()) == pytest.approx(float(eager()), rel=1e-5)
    for p, q in zip(graph.model.parameters(), eager.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_the_sweep_captures_a_workload_and_records_one_that_cannot_be():
    def syncing_loss(out, targets):
        loss = F.cross_entropy(out, targets)
        if loss.item() > 1e9:  # a host sync: capture forbids it
            raise AssertionError
        return loss

    syncing = Workload(name="syncing-mlp", build=mlp_workload().build, loss=syncing_loss,
                       batch=synthetic_batch((16,), num_classes=5, seed=3))
    rows = sweep.run_sweep(_spec((mlp_workload(), syncing), device="cuda",
                                 executions=("eager", "cuda-graph")))
    by = {(r["model"], r["execution"]): r for r in rows.to_dict("records")}
    assert by[("user-mlp", "cuda-graph")]["status"] == "ok", by[("user-mlp", "cuda-graph")]["error"]
    assert "CUDA graph" in by[("user-mlp", "cuda-graph")]["execution_notes"]
    assert by[("syncing-mlp", "eager")]["status"] == "ok"
    bad = by[("syncing-mlp", "cuda-graph")]
    assert bad["status"] == "error" and "WorkloadCannotRun" in bad["error"]
    assert "'syncing-mlp' cannot run execution 'cuda-graph'" in bad["error"]

"""sweep.steps: how a workload point's step is built for each execution, on the CPU.

``workload.train_step`` and ``execution.capture`` are replaced by recorders, so the keywords a
cuda-graph point passes (and an eager or compiled one does not), the notes each row gets, and
the FP8 columns are checked without a GPU.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fp16lab import execution, recipes
from fp16lab.sweep import steps
from fp16lab.workload import Workload, train_step
from fp16lab.workloads.batches import synthetic_batch


def mlp(optimizer=None) -> Workload:
    return Workload(name="kill-mlp", optimizer=optimizer,
                    build=lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)),
                    batch=synthetic_batch((16,), num_classes=4, seed=1))


def point(w, execution_="eager", precision="fp32", compile_mode=None):
    return SimpleNamespace(workload=w, execution=execution_, precision=precision, device="cpu",
                           batch=4, layout="nchw", scaler=None, compile_mode=compile_mode)


@pytest.fixture
def recorded(monkeypatch):
    calls = []

    def fake_train_step(w, precision, device, batch, **kw):
        calls.append(((w.name, precision, device, batch), kw))
        return train_step(w, precision, device, batch, layout=kw["layout"], seed=kw["seed"])

    monkeypatch.setattr(steps.workload, "train_step", fake_train_step)
    monkeypatch.setattr(execution, "capture", lambda fn, warmup, traceable: lambda: "replayed")
    return calls


def test_an_eager_point_passes_no_engine_keywords(recorded):
    built = steps.build_workload_step(point(mlp()), seed=5)
    (args, kw), = recorded
    assert args == ("kill-mlp", "fp32", "cpu", 4)
    assert kw == {"layout": "nchw", "scaler": None, "seed": 5, "compile_mode": None}
    assert built.columns == {} and built.scaler is built.step.scaler
    assert float(built.step()) > 0  # the workload's own step, not a replay


def test_a_compiled_point_says_so(recorded):
    built = steps.build_workload_step(point(mlp(), "compile", compile_mode="default"))
    assert recorded[0][1]["compile_mode"] == "default"
    assert built.columns == {"execution_notes": "torch.compile(model, mode='default'); loss, "
                                                "scaler, optimizer eager"}


def test_a_cuda_graph_point_asks_for_fused_sgd_and_no_autocast_cache(recorded):
    built = steps.build_workload_step(point(mlp(), "cuda-graph"))
    (_, kw), = recorded
    assert kw["autocast_cache"] is False and kw["unscale_first"] is True
    opt = kw["optimizer"]
    assert isinstance(opt, functools.partial) and opt.func is recipes.sgd
    assert opt.keywords == {"fused": True}
    assert built.step() == "replayed"
    assert built.columns == {"execution_notes": "the whole step captured as one CUDA graph; "
                                                "fused SGD; autocast cache off; static batch"}


def test_a_cuda_graph_point_keeps_the_workloads_own_optimizer(recorded):
    own = lambda ps: torch.optim.Adam(ps, capturable=True)  # noqa: E731
    built = steps.build_workload_step(point(mlp(optimizer=own), "cuda-graph"))
    (_, kw), = recorded
    assert "optimizer" not in kw and kw["autocast_cache"] is False
    assert "the workload's optimizer; " in built.columns["execution_notes"]


def test_an_fp8_point_reports_its_layers(recorded):
    built = steps.build_workload_step(point(mlp(), precision="fp8-tensorwise"))
    assert built.scaler is None
    # Linear(16, 32) converts; Linear(32, 4) cannot (4 features)
    assert built.columns == {"fp8_layers": 1, "fp8_scaled_mm": False}


@pytest.mark.parametrize("given, want", [
    # the defaults a point leaves to the pipeline: pinned, copied ahead, normalised in workers
    ({"layout": "channels_last"},
     {"pin_memory": True, "non_blocking": True, "channels_last": True, "normalize_on": "cpu"}),
    # every one of them set the other way
    ({"layout": "nchw", "pin_memory": False, "non_blocking": False, "normalize_on": "gpu"},
     {"pin_memory": False, "non_blocking": False, "channels_last": False, "normalize_on": "gpu"}),
])
def test_a_pipeline_points_input_settings(monkeypatch, tmp_path, given, want):
    """A point that reads images builds the input its axes name: the backend, batch, the
    model's crop size (ResNet-18: 224), its workers and the four dataloader switches."""
    from fp16lab.inputs import InputSettings
    from fp16lab.models import NUM_CLASSES
    made = []
    monkeypatch.setattr(steps.inputs, "make_input",
                        lambda settings, images_dir, *, device, num_classes:
                        made.append((settings, images_dir, device, num_classes)) or "feeder")
    p = SimpleNamespace(**{"model": "resnet18", "batch": 6, "input": "dataloader",
                           "num_workers": 3, "images_dir": str(tmp_path), "device": "cpu",
                           "pin_memory": None, "non_blocking": None, "normalize_on": None,
                           **given})
    assert steps._pipeline(p) == "feeder"
    assert made == [(InputSettings(backend="dataloader", batch=6, image_size=224, num_workers=3,
                                   **want), str(tmp_path), "cpu", NUM_CLASSES)]


def test_an_fp8_point_reports_only_the_fallbacks_of_its_own_steps(monkeypatch):
    """fp8.FALLBACKS holds the process's first reason per kind of GEMM; a point's row names what
    its own steps fell back on (any scale kind: a blockwise backward has plain tiles), and the
    earlier reasons are back after it."""
    from fp16lab import fp8
    monkeypatch.setattr(steps.fp8, "scaled_mm_available", lambda device: True)
    monkeypatch.setattr(fp8.linear, "FALLBACKS", {"rowwise e4m3 x e4m3": "earlier point"})
    monkeypatch.setattr(steps.fp8, "FALLBACKS", fp8.linear.FALLBACKS)
    p = SimpleNamespace(device="cuda", precision="fp8-blockwise")
    finish = steps._fp8_finish(p)
    assert fp8.FALLBACKS == {}  # set aside while the point runs
    fp8.FALLBACKS["blockwise e4m3 x e4m3, K=96"] = "emulated: K=96 is not a multiple of 128"
    fp8.FALLBACKS["tiles (1, 128) x (1, 128) e5m2 x e4m3"] = "emulated: no such scale layout"
    assert finish() == {"fp8_emulated": True, "fp8_fallbacks":
                        "blockwise e4m3 x e4m3, K=96: emulated: K=96 is not a multiple of 128; "
                        "tiles (1, 128) x (1, 128) e5m2 x e4m3: emulated: no such scale layout"}
    assert fp8.FALLBACKS["rowwise e4m3 x e4m3"] == "earlier point" and len(fp8.FALLBACKS) == 3
    # a point whose steps all ran on _scaled_mm: not emulated, nothing named
    assert steps._fp8_finish(SimpleNamespace(device="cuda", precision="fp8-rowwise"))() == {
        "fp8_emulated": False, "fp8_fallbacks": ""}
    assert len(fp8.FALLBACKS) == 3


def test_an_fp8_point_without_scaled_mm_says_why_it_was_emulated(monkeypatch):
    monkeypatch.setattr(steps.fp8, "scaled_mm_available", lambda device: False)
    finish = steps._fp8_finish(SimpleNamespace(device="cpu", precision="fp8-tensorwise"))
    assert finish() == {"fp8_emulated": True, "fp8_fallbacks":
                        "emulated: torch._scaled_mm needs a CUDA GPU of compute capability 8.9 "
                        "or newer, the device is cpu"}

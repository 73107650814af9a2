"""fp16lab.workload: a workload written in a few lines trains under every precision, by name too."""

from __future__ import annotations

import math
import os
import pickle
import textwrap

import pytest
import torch
from torch import nn

from fp16lab import models
from fp16lab.recipes import PRECISIONS, precisions
from fp16lab.workload import (Workload, WorkloadCannotRun, WorkloadNotFound, check_settings,
                              load_workload, train_step)
from fp16lab.workloads.batches import loader_batch, synthetic_batch
from fp16lab.workloads import WORKLOADS, missing_package

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def user_workload(width: int = 128) -> Workload:
    """What a user writes: a model, its batches, and a name."""
    return Workload(name="user-mlp",
                    build=lambda: nn.Sequential(nn.Linear(32, width), nn.ReLU(),
                                                nn.Linear(width, width), nn.ReLU(),
                                                nn.Linear(width, 10)),
                    batch=synthetic_batch((32,), num_classes=10), settings={"width": width})


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
def test_a_user_workload_learns_over_20_steps(precision):
    step = train_step(user_workload(), precision, "cpu", 16)
    losses = [float(step().detach()) for _ in range(20)]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_every_precision_trains_a_workload(precision):
    step = train_step(user_workload(), precision, "cpu", 8)
    before = [p.detach().float().clone() for p in step.model.parameters()]
    losses = [float(step().detach()) for _ in range(3)]
    assert all(math.isfinite(v) for v in losses), losses
    moved = [not torch.equal(b, p.detach().float()) for b, p in zip(before, step.model.parameters())]
    assert any(moved)
    if PRECISIONS[precision].fp8:
        assert step.converted  # its linear layers were swapped (the last, 10 wide, is kept)
    if PRECISIONS[precision].master_weights:
        assert next(step.model.parameters()).dtype == torch.float16


class DictModel(nn.Module):
    """A token model taking keywords and returning a dict, as transformers' models do."""

    def __init__(self, vocab: int = 50, width: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.out = nn.Linear(width, vocab)

    def forward(self, input_ids, scale):
        return {"logits": self.out(self.embed(input_ids) * scale), "other": None}


def dict_workload() -> Workload:
    def batch(size, device):
        ids = torch.randint(0, 50, (size, 6), generator=torch.Generator().manual_seed(0))
        return {"input_ids": ids.to(device), "scale": torch.ones(1, device=device)}, ids.to(device)

    return Workload(name="dict-model", build=DictModel, batch=batch, output="logits")


@pytest.mark.parametrize("precision", ["fp32", "amp-fp16", "fp16-o2"])
def test_keyword_inputs_and_a_dict_output(precision):
    step = train_step(dict_workload(), precision, "cpu", 4)
    losses = [float(step().detach()) for _ in range(5)]
    assert all(math.isfinite(v) for v in losses)
    assert step.inputs["input_ids"].dtype == torch.int64  # fp16-o2 halves only the floats
    # a token model's (N, T, V) logits: the loss is the mean cross-entropy over every position
    assert math.isclose(losses[0], math.log(50), rel_tol=0.2)


def test_a_new_batch_of_the_same_kind():
    step = train_step(user_workload(), "fp32", "cpu", 8)
    x, y = synthetic_batch((32,), 10, seed=5)(8, "cpu")
    assert math.isfinite(float(step(x, y).detach()))


def test_a_dataloader_feeds_the_step():
    data = torch.utils.data.TensorDataset(torch.randn(32, 32), torch.randint(0, 10, (32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    w = Workload(name="from-loader", build=user_workload().build, batch=loader_batch(loader))
    step = train_step(w, "fp32", "cpu", 8)
    losses = [float(step.next_batch().detach()) for _ in range(6)]  # round the loader and again
    assert all(math.isfinite(v) for v in losses)
    with pytest.raises(ValueError, match="batches of 8, not the 4"):
        train_step(w, "fp32", "cpu", 4)


def test_channels_last_where_the_model_convolves():
    w = load_workload("small_cnn")
    assert w.accepted_layouts() == ("nchw", "channels_last")
    step = train_step(w, "fp32", "cpu", 4, layout="channels_last")
    conv = step.model.features[0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last)
    assert step.inputs.is_contiguous(memory_format=torch.channels_last)
    assert math.isfinite(float(step().detach()))
    # detected: a model of linear layers only accepts nchw
    assert user_workload().accepted_layouts() == ("nchw",)


# ----------------------------------------------------------------------------- cannot run

def test_channels_last_without_a_convolution_cannot_run():
    with pytest.raises(WorkloadCannotRun, match=r"'user-mlp' cannot run layout 'channels_last'.*no "
                       "convolution"):
        train_step(user_workload(), "fp32", "cpu", 4, layout="channels_last")


def test_a_precision_the_workload_rules_out_cannot_run():
    w = Workload(name="bf16-only", build=user_workload().build, batch=user_workload().batch,
                 precisions=("amp-bf16",))
    with pytest.raises(WorkloadCannotRun, match="'bf16-only' cannot run precision 'amp-fp16': it "
                       "runs amp-bf16"):
        train_step(w, "amp-fp16", "cpu", 4)


def test_fp8_without_a_linear_layer_it_can_take_cannot_run():
    err = pytest.raises(WorkloadCannotRun, match="'small_cnn' cannot run precision "
                        "'fp8-tensorwise': it has no nn.Linear")
    with err:
        train_step(load_workload("small_cnn"), "fp8-tensorwise", "cpu", 4)
    assert issubclass(WorkloadCannotRun, ValueError)  # the engines' rows catch ValueError


def test_a_loss_that_is_not_a_scalar():
    w = Workload(name="bad-loss", build=user_workload().build, batch=user_workload().batch,
                 loss=lambda out, y: out)
    with pytest.raises(TypeError, match="'bad-loss': loss must return a scalar tensor"):
        train_step(w, "fp32", "cpu", 4)()


def test_an_unknown_precision_or_layout_is_a_plain_error():
    with pytest.raises(ValueError, match="unknown precision 'fp12'"):
        train_step(user_workload(), "fp12", "cpu", 4)
    with pytest.raises(ValueError, match="layout must be one of"):
        train_step(user_workload(), "fp32", "cpu", 4, layout="nhwc")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        train_step(user_workload(), "fp32", "cpu", 0)


# ----------------------------------------------------------------------------- by name

MODULE = '''
from torch import nn
from fp16lab.workload import Workload
from fp16lab.workloads.batches import synthetic_batch

def make(width=8):
    return Workload(name="tmp-mlp", build=lambda: nn.Sequential(nn.Linear(4, width), nn.ReLU(),
                    nn.Linear(width, 3)), batch=synthetic_batch((4,), 3), settings={"width": width})

def broken(width=8):
    raise KeyError("no such table")

def not_a_workload():
    return nn.Linear(2, 2)

NOT_CALLABLE = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_workloads.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_workloads"


def test_a_workload_by_module_and_function(user_module):
    w = load_workload(f"{user_module}:make", width=16)
    assert (w.name, w.reference, w.settings) == ("tmp-mlp", "my_workloads:make", {"width": 16})
    assert w.arguments == {"width": 16}  # what the factory was called with
    assert w.build()[0].out_features == 16
    again = pickle.loads(pickle.dumps(w))  # what a rank receives: the name and the settings
    assert (again.reference, again.settings, again.build()[0].out_features) == \
        ("my_workloads:make", {"width": 16}, 16)
    assert math.isfinite(float(train_step(again, "amp-bf16", "cpu", 4)().detach()))


def test_a_module_that_does_not_import(user_module):
    with pytest.raises(WorkloadNotFound, match="module 'no_such_module' cannot be imported"):
        load_workload("no_such_module:make")


def test_a_module_without_the_factory(user_module):
    with pytest.raises(WorkloadNotFound, match="module 'my_workloads' has no 'nothing'"):
        load_workload("my_workloads:nothing")
    with pytest.raises(TypeError, match="is a int, not a function"):
        load_workload("my_workloads:NOT_CALLABLE")


def test_a_factory_that_raises_names_the_workload(user_module):
    with pytest.raises(RuntimeError, match=r"workload 'my_workloads:broken'.*broken\(width=3\) "
                       "raised KeyError") as info:
        load_workload("my_workloads:broken", width=3)
    assert isinstance(info.value.__cause__, KeyError)


def test_a_factory_that_returns_something_else(user_module):
    with pytest.raises(TypeError, match="returned a Linear, not a fp16lab.workload.Workload"):
        load_workload("my_workloads:not_a_workload")


@pytest.mark.parametrize("name", ["nothing", "a:b:c", "1mod:fn", "mod:", ":fn", "mod:f-n"])
def test_a_malformed_name(name):
    with pytest.raises(ValueError, match="neither a built-in one"):
        load_workload(name)


def test_settings_are_plain_values():
    assert check_settings({"a": 1, "b": [1.5, "x"], "c": {"d": None}}) == \
        {"a": 1, "b": [1.5, "x"], "c": {"d": None}}
    with pytest.raises(TypeError, match="plain value"):
        check_settings({"model": nn.Linear(1, 1)})
    with pytest.raises(ValueError, match="must be finite"):
        check_settings({"lr": float("nan")})
    with pytest.raises(ValueError, match="Python name"):
        check_settings({"not a name": 1})
    with pytest.raises(ValueError, match="workload name"):
        Workload(name="", build=nn.Identity, batch=user_workload().batch)


def test_a_workload_without_a_name_to_import_does_not_pickle():
    with pytest.raises(TypeError, match="'user-mlp' was not made by load_workload"):
        pickle.dumps(user_workload())


# ----------------------------------------------------------------------------- built-in

@pytest.mark.parametrize("name", list(models.MODELS))
def test_the_builtin_models_are_workloads(name):
    reason = missing_package(name)
    if reason:
        pytest.skip(reason)
    w = load_workload(name)
    assert WORKLOADS[name] == w.reference
    built, reference = w.build(), models.build_model(name)
    assert [p.shape for p in built.parameters()] == [p.shape for p in reference.parameters()]
    x, y = w.batch(2, "cpu")
    assert tuple(x.shape) == models.input_shape(name, 2) and y.max() < models.NUM_CLASSES
    assert ("channels_last" in w.accepted_layouts()) == models.is_image_model(name)


def test_the_registry_names_importable_factories():
    for name, reference in WORKLOADS.items():
        module, _, attr = reference.partition(":")
        assert callable(getattr(__import__(module, fromlist=[attr]), attr)), name


# ----------------------------------------------------------------------------- two ranks

WORKER = '''
"""Two gloo ranks train a workload named in job.json: the gradients averaged after backward."""
import argparse, json, os
import torch
import torch.distributed as dist
from fp16lab.workload import load_workload, train_step

args = argparse.ArgumentParser()
args.add_argument("--workdir")
work = args.parse_args().workdir
job = json.load(open(os.path.join(work, "job.json")))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
for i, item in enumerate(job["items"]):
    workload = load_workload(item["workload"], **item["settings"])
    held = {}

    def average():
        for p in held["step"].model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world

    b = item["batch"]
    held["step"] = step = train_step(workload, item["precision"], "cpu", b,
                                     after_backward=average)
    x, y = workload.batch(b * world, "cpu")  # the global batch; this rank trains its slice
    losses = [float(step(x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]).detach())
              for _ in range(3)]
    flat = torch.cat([p.detach().flatten() for p in step.model.parameters()])
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "weights": flat.tolist(), "losses": losses,
                                      "name": workload.name})
    if rank == 0:
        with open(os.path.join(work, f"row_{i}.json"), "w") as f:
            json.dump({"status": "ok", "per_rank": gathered}, f)
dist.destroy_process_group()
'''


@pytest.mark.slow
def test_two_gloo_ranks_build_a_workload_by_name(tmp_path, user_module):
    from fp16lab.distributed import run_ranks

    (tmp_path / "rank_worker.py").write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path),
                                                         os.environ.get("PYTHONPATH", "")])}
    item = {"workload": "my_workloads:make", "settings": {"width": 16}, "precision": "fp32",
            "batch": 4}
    launch = run_ranks(2, [str(tmp_path / "rank_worker.py")], [item], timeout_s=120, env=env,
                       workdir=tmp_path / "launch")
    row = launch.rows[0]
    assert row["status"] == "ok", (row.get("error"), launch.log_tail)
    ranks = row["per_rank"]
    assert [r["name"] for r in ranks] == ["tmp-mlp", "tmp-mlp"]
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank trained its own half
    # the oracle: one process training the whole batch of 8 (the mean loss's gradient is the
    # mean of the halves'), from the same seed
    alone = train_step(load_workload("my_workloads:make", width=16), "fp32", "cpu", 8)
    for _ in range(3):
        alone()
    expected = torch.cat([p.detach().flatten() for p in alone.model.parameters()])
    for r in ranks:
        assert torch.allclose(torch.tensor(r["weights"]), expected, rtol=1e-5, atol=1e-6)

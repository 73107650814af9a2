"""fp16lab.workload, checked where the mutation run found it unchecked: settings, names, errors,
the step's pieces. Each value is worked out by hand or by a bare PyTorch route."""

from __future__ import annotations

import pickle
import sys
import textwrap

import pytest
import torch
from torch import nn

from fp16lab import workload as wl
from fp16lab.recipes import LR
from fp16lab.workload import (Workload, WorkloadCannotRun, WorkloadNotFound, check_settings,
                              load_workload, step_of, train_step, workload_name)
from fp16lab.scaling import ScalerSettings
from fp16lab.workloads import WORKLOADS, WorkloadNeedsPackage
from fp16lab.workloads.batches import synthetic_batch

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def tiny(**kw) -> Workload:
    """A 4 -> 3 linear classifier (one nn.Linear, no convolution)."""
    kw.setdefault("name", "tiny")
    return Workload(build=lambda: nn.Linear(4, 3), batch=synthetic_batch((4,), 3), **kw)


# ----------------------------------------------------------------------------- settings

def test_plain_settings_keep_their_types_and_name_the_bad_entry():
    out = check_settings({"t": (1, 2.5), "l": [True, None], "d": {"k": "v"}, "b": False})
    assert out == {"t": (1, 2.5), "l": [True, None], "d": {"k": "v"}, "b": False}
    assert type(out["t"]) is tuple and type(out["l"]) is list and out["l"][0] is True
    with pytest.raises(ValueError, match=r"setting 'xs'\[1\] must be finite"):
        check_settings({"xs": [1.0, float("inf")]})
    with pytest.raises(ValueError, match=r"setting 'd'\['k'\] must be finite"):
        check_settings({"d": {"k": float("nan")}})
    with pytest.raises(TypeError, match="setting 'd' keys must be strings, got 1"):
        check_settings({"d": {1: 2}})
    with pytest.raises(TypeError, match="setting 'm' must be a plain value .* got Linear"):
        check_settings({"m": nn.Linear(1, 1)})
    with pytest.raises(TypeError, match="settings must be a dict, got list"):
        check_settings([("a", 1)])
    with pytest.raises(ValueError, match="Python name, got 3"):
        check_settings({3: 1})


@pytest.mark.parametrize("name, ok", [("a", True), ("9x", True), ("a_b.c+d-e", True),
                                      ("a" * 100, True), ("a" * 101, False), ("-a", False),
                                      ("_a", False), ("a b", False), ("a/b", False), ("", False)])
def test_workload_names(name, ok):
    if ok:
        assert tiny(name=name).name == name
    else:
        with pytest.raises(ValueError, match=r"^a workload name must be 1-100 letters, digits or "
                           r"_\.\+- \(starting with a letter or digit\), got "):
            tiny(name=name)
    with pytest.raises(ValueError, match="workload name"):
        tiny(name=5)


def test_what_a_workload_checks_when_made():
    with pytest.raises(TypeError, match="'w': build must be callable"):
        Workload(name="w", build=nn.Linear(1, 1).weight, batch=synthetic_batch((1,), 2))
    with pytest.raises(TypeError, match="'w': batch must be callable"):
        Workload(name="w", build=nn.Identity, batch=3)
    with pytest.raises(TypeError, match="'w': loss must be callable or None"):
        tiny(name="w", loss="mse")
    with pytest.raises(TypeError, match="'w': optimizer must be callable or None"):
        tiny(name="w", optimizer=1.0)
    with pytest.raises(TypeError, match="'w': output must be a key, a function or None"):
        tiny(name="w", output=3)
    with pytest.raises(ValueError, match="layout must be one of"):
        tiny(layouts=["nhwc"])
    with pytest.raises(ValueError, match="unknown precision"):
        tiny(precisions=["fp12"])
    w = tiny(layouts=["channels_last"], precisions=["fp32"], settings={"k": 1})
    assert w.layouts == ("channels_last",) and w.precisions == ("fp32",) and w.settings == {"k": 1}
    with pytest.raises(ValueError, match="must be finite"):
        tiny(settings={"k": float("nan")})
    assert tiny().loss is None and tiny().optimizer is None and tiny().settings == {}


def test_logits_take_a_key_an_attribute_or_a_function():
    class Out:
        logits = "attr"

    assert tiny().logits(7) == 7
    assert tiny(output="logits").logits({"logits": "key"}) == "key"
    assert tiny(output="logits").logits(Out()) == "attr"
    assert tiny(output=lambda o: o * 2).logits(3) == 6


def test_layouts_listed_or_detected():
    built = []

    def build():
        built.append(1)
        return nn.Sequential(nn.Conv2d(1, 1, 1))

    w = Workload(name="c", build=build, batch=synthetic_batch((1, 2, 2), 2))
    assert w.accepted_layouts() == ("nchw", "channels_last") and len(built) == 1
    assert w.accepted_layouts(nn.Linear(1, 1)) == ("nchw",) and len(built) == 1
    assert tiny(layouts=("channels_last",)).accepted_layouts() == ("channels_last",)
    with pytest.raises(WorkloadCannotRun, match="'tiny' cannot run layout 'nchw': it accepts "
                       "channels_last$"):
        tiny(layouts=("channels_last",)).check_can_run("fp32", "nchw")
    with pytest.raises(WorkloadCannotRun, match="it accepts nchw, nchw$"):
        tiny(layouts=("nchw", "nchw")).check_can_run("fp32", "channels_last")
    with pytest.raises(WorkloadCannotRun, match="^workload 'tiny' cannot run layout 'channels_last': "
                       "it has no convolution for channels_last to speed up$"):
        tiny().check_can_run("fp32", "channels_last")
    tiny(layouts=("channels_last",)).check_can_run("fp32", "channels_last")
    tiny(precisions=("fp32", "amp-bf16")).check_can_run("amp-bf16")
    with pytest.raises(WorkloadCannotRun, match="it runs fp32, amp-bf16$"):
        tiny(precisions=("fp32", "amp-bf16")).check_can_run("amp-fp16")
    with pytest.raises(ValueError, match="layout must be one of"):
        tiny().check_can_run("fp32", "nhwc")


# ----------------------------------------------------------------------------- by name

USER = '''
from torch import nn
from fp16lab.workload import Workload
from fp16lab.scaling import ScalerSettings
from fp16lab.workloads import WORKLOADS, WorkloadNeedsPackage
from fp16lab.workloads.batches import synthetic_batch

NOT_A_FUNCTION = 3

def make(width=2, extra=None):
    return Workload(name="kills-user", build=lambda: nn.Linear(4, width),
                    batch=synthetic_batch((4,), width), settings={"width": width, "own": 1})

def needs():
    raise WorkloadNeedsPackage("needs a package")

def broken(**kw):
    raise KeyError("boom")
'''


@pytest.fixture()
def user(tmp_path, monkeypatch):
    (tmp_path / "kills_user_mod.py").write_text(textwrap.dedent(USER))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "kills_user_mod"
    sys.modules.pop("kills_user_mod", None)


def test_load_records_the_reference_and_settings_and_pickles(user):
    w = load_workload(f"{user}:make", width=3)
    assert w.reference == f"{user}:make" and w.arguments == {"width": 3}
    assert w.settings == {"width": 3, "own": 1}
    back = pickle.loads(pickle.dumps(w))
    assert back.reference == w.reference and back.arguments == {"width": 3}
    assert back.build().out_features == 3
    assert load_workload(f"{user}:make").arguments == {}


def test_load_errors(user):
    with pytest.raises(TypeError, match="workload name must be a str, got int"):
        load_workload(5)
    with pytest.raises(WorkloadNotFound, match=f"module '{user}' has no 'missing'"):
        load_workload(f"{user}:missing")
    with pytest.raises(WorkloadNotFound, match="module 'no_such_mod_xyz' cannot be imported"):
        load_workload("no_such_mod_xyz:f")
    with pytest.raises(TypeError, match=f"{user}:NOT_A_FUNCTION is a int, not a function "
                       "returning a Workload$"):
        load_workload(f"{user}:NOT_A_FUNCTION")
    with pytest.raises(WorkloadNeedsPackage, match="needs a package"):
        load_workload(f"{user}:needs")
    with pytest.raises(RuntimeError, match=rf"{user}:broken\(width=2, tag='x'\) raised KeyError: 'boom'"):
        load_workload(f"{user}:broken", width=2, tag="x")
    first, second = list(WORKLOADS)[:2]
    with pytest.raises(ValueError, match=rf"'pkg\.:f' is neither a built-in one \({first}, {second}, "
                       r".*\) nor 'package\.module:function'$"):
        load_workload("pkg.:f")
    with pytest.raises(ValueError, match="must be finite"):
        load_workload(f"{user}:make", width=float("nan"))


def test_workload_name_checks_what_a_command_line_gives(user):
    assert workload_name("--workload", f"{user}:make") == f"{user}:make"
    for bad, words in [(f"{user}:broken", "--workload: workload .* raised KeyError"),
                       (f"{user}:missing", "--workload: workload .* has no 'missing'"),
                       (f"{user}:NOT_A_FUNCTION", "--workload: workload .* not a function")]:
        with pytest.raises(ValueError, match=words):
            workload_name("--workload", bad)
    with pytest.raises(ValueError, match="--workload must be a non-empty string"):
        workload_name("--workload", "")


# ----------------------------------------------------------------------------- the step

def test_the_seed_sets_the_initial_weights():
    def weights(seed):
        return train_step(tiny(), "fp32", "cpu", 2, seed=seed).model.weight.detach().clone()

    torch.manual_seed(7)
    reference = nn.Linear(4, 3).weight.detach()
    torch.manual_seed(0)
    zero = nn.Linear(4, 3).weight.detach()
    assert torch.equal(weights(7), reference) and torch.equal(weights(0), zero)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        train_step(tiny(), "fp32", "cpu", 2, seed=-1)


def test_one_fp32_step_is_a_bare_sgd_step():
    step = train_step(tiny(), "fp32", "cpu", 5, seed=3)
    torch.manual_seed(3)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    x, y = synthetic_batch((4,), 3)(5, "cpu")
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    assert torch.allclose(step().detach(), loss.detach())
    assert torch.allclose(step.model.weight, model.weight)
    assert len(step.targets) == 5 and step.precision == "fp32" and step.layout == "nchw"
    assert torch.equal(step.inputs, x)
    assert step.converted == [] and step.scaler is None


def test_the_optimizer_an_engine_gives_wins_over_the_workloads():
    def adam(params):
        return torch.optim.Adam(params, lr=0.1)

    w = tiny(optimizer=adam)
    step = train_step(w, "fp32", "cpu", 2)
    assert isinstance(step.optimizer, torch.optim.Adam)
    model = nn.Linear(4, 3)
    x, y = w.batch(2, "cpu")
    other = step_of(w, "fp32", model, x, y, device="cpu",
                    optimizer=lambda p: torch.optim.SGD(p, lr=0.5))
    assert isinstance(other.optimizer, torch.optim.SGD) and other.optimizer.defaults["lr"] == 0.5
    assert other.converted == [] and other.layout == "nchw"
    converted = step_of(w, "fp32", model, x, y, device="cpu", converted=["a"], layout="nchw")
    assert converted.converted == ["a"]


def test_forward_loss_under_fp16_o2_and_fp8_is_the_plain_loss():
    """fp16-o2 halves the float inputs and the model; the loss is the fp32 cross-entropy of the
    fp16 model's logits. fp8 on a CPU runs the converted model under bf16 autocast."""
    w = Workload(name="mlp", build=lambda: nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32)),
                 batch=synthetic_batch((32,), 32))
    step = train_step(w, "fp16-o2", "cpu", 16)
    x, y = step.inputs, step.targets
    expected = nn.functional.cross_entropy(step.model(x.half()).float(), y)
    assert torch.allclose(step.forward_loss().detach(), expected.detach(), rtol=1e-3)
    assert step.inputs_device == torch.device("cpu")


def test_a_loss_of_a_non_tensor_or_a_vector_is_refused():
    for bad, got in [(lambda o, y: 1.0, "got float"), (lambda o, y: o.sum(1), "got Tensor")]:
        with pytest.raises(TypeError, match=f"'tiny': loss must return a scalar tensor, {got}"):
            train_step(tiny(loss=bad), "fp32", "cpu", 2)()
    one = train_step(tiny(loss=lambda o, y: o.sum().reshape(1, 1)), "fp32", "cpu", 2)
    assert one().numel() == 1


def test_a_step_on_a_new_batch_in_channels_last():
    w = Workload(name="conv", build=lambda: nn.Sequential(nn.Conv2d(3, 4, 1), nn.Flatten(),
                                                          nn.Linear(4 * 2 * 2, 3)),
                 batch=synthetic_batch((3, 2, 2), 3))
    step = train_step(w, "fp32", "cpu", 2, layout="channels_last")
    seen = []
    step.model.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    x, y = synthetic_batch((3, 2, 2), 3, seed=4)(2, "cpu")
    step(x, y)
    assert seen[-1].is_contiguous(memory_format=torch.channels_last)
    assert not x.is_contiguous(memory_format=torch.channels_last)
    step.next_batch()
    assert len(seen[-1]) == 2


def test_next_batch_asks_for_the_steps_batch_size():
    sizes = []
    inner = synthetic_batch((4,), 3)

    def batch(size, device):
        sizes.append(size)
        return inner(size, device)

    step = train_step(Workload(name="n", build=lambda: nn.Linear(4, 3), batch=batch), "fp32", "cpu", 6)
    step.next_batch()
    assert sizes == [6, 6]


def test_build_failures_name_the_workload():
    def boom():
        raise OSError("disk")

    with pytest.raises(RuntimeError, match="'b': build\\(\\) raised OSError: disk"):
        train_step(Workload(name="b", build=boom, batch=synthetic_batch((1,), 2)), "fp32", "cpu", 1)
    with pytest.raises(TypeError, match="'b': build\\(\\) returned a int, not a torch.nn.Module"):
        wl.build_model(Workload(name="b", build=lambda: 3, batch=synthetic_batch((1,), 2)))


def test_float_logits_cast_floats_only():
    out = wl._FloatLogits({"a": torch.ones(2, dtype=torch.float16), "i": torch.ones(2, dtype=torch.int64)})
    cast = out.float().value
    assert cast["a"].dtype == torch.float32 and cast["i"].dtype == torch.int64


def test_an_unloaded_workload_says_how_to_make_it_travel():
    with pytest.raises(TypeError, match="cannot travel to another process: give it a "
                       "'package.module:factory' name$"):
        pickle.dumps(tiny())


def test_the_model_is_built_once_and_its_layouts_read_from_it():
    built = []

    def build():
        built.append(1)
        return nn.Sequential(nn.Conv2d(3, 2, 1), nn.Flatten(), nn.Linear(2 * 2 * 2, 3))

    w = Workload(name="c", build=build, batch=synthetic_batch((3, 2, 2), 3))
    train_step(w, "fp32", "cpu", 2, layout="channels_last")
    assert len(built) == 1
    w.check_can_run("fp32", "channels_last", nn.Conv2d(1, 1, 1))
    assert len(built) == 1
    with pytest.raises(WorkloadCannotRun, match="no convolution"):
        w.check_can_run("fp32", "channels_last", nn.Linear(1, 1))


def test_the_default_seed_is_zero():
    torch.manual_seed(0)
    zero = nn.Linear(4, 3).weight.detach()
    assert torch.equal(train_step(tiny(), "fp32", "cpu", 2).model.weight.detach(), zero)


def test_the_scaler_settings_reach_the_step():
    step = train_step(tiny(), "amp-fp16", "cpu", 2, scaler=ScalerSettings(init_scale=1024.0))
    assert isinstance(step.scaler, torch.amp.GradScaler) and step.scaler.get_scale() == 1024.0
    step()
    assert step.scaler.get_scale() == 1024.0  # one finite step: no growth before the interval
    x, y = step.inputs, step.targets
    other = step_of(tiny(), "amp-fp16", nn.Linear(4, 3), x, y, device="cpu",
                    scaler=ScalerSettings(init_scale=64.0))
    assert other.scaler.get_scale() == 64.0
    assert train_step(tiny(), "amp-fp16", "cpu", 2).scaler.get_scale() == ScalerSettings().init_scale


class Placed(nn.Linear):
    """A Linear that records where it is moved."""

    moves: list = []

    def to(self, *args, **kwargs):
        Placed.moves.append((args, kwargs))
        return super().to(*args, **kwargs)


def test_the_model_and_the_batch_go_to_the_device():
    asked = []
    inner = synthetic_batch((4,), 3)

    def batch(size, device):
        asked.append(device)
        return inner(size, device)

    Placed.moves = []
    step = train_step(Workload(name="p", build=lambda: Placed(4, 3), batch=batch), "fp32", "cpu", 3)
    assert Placed.moves[0] == ((torch.device("cpu"),), {}) and asked == [torch.device("cpu")]
    step.next_batch()
    assert asked[-1] == torch.device("cpu")


def test_an_engines_forward_runs_the_step_and_its_forward_loss():
    seen = []
    model = nn.Linear(4, 3)

    def forward(x):
        seen.append(x.shape)
        return model(x)

    w = tiny()
    x, y = w.batch(2, "cpu")
    step = step_of(w, "fp32", model, x, y, device="cpu", forward=forward)
    step()
    assert seen == [(2, 4)]
    step.forward_loss()
    assert seen == [(2, 4), (2, 4)]
    # built without an engine's forward, forward_loss runs the model itself
    import dataclasses
    bare = dataclasses.replace(step, forward=None)
    expected = nn.functional.cross_entropy(model(x), y)
    assert torch.allclose(bare.forward_loss().detach(), expected.detach()) and len(seen) == 2


def test_compile_mode_reaches_torch_compile(monkeypatch):
    compiled = []

    def fake_compile(model, mode=None):
        compiled.append(mode)
        return model

    monkeypatch.setattr(wl.torch, "compile", fake_compile)
    for mode, given in [("default", None), ("reduce-overhead", "reduce-overhead"),
                        ("max-autotune", "max-autotune")]:
        step = train_step(tiny(), "fp32", "cpu", 2, compile_mode=mode)
        assert compiled[-1] == given and step.forward is not None
        assert torch.isfinite(step())
    assert train_step(tiny(), "fp32", "cpu", 2).forward is not None and len(compiled) == 3
    with pytest.raises(ValueError, match="^compile_mode must be a non-empty string"):
        train_step(tiny(), "fp32", "cpu", 2, compile_mode="")


def test_a_new_batch_is_the_one_trained_on():
    step = train_step(tiny(), "fp32", "cpu", 3, seed=2)
    x, y = synthetic_batch((4,), 3, seed=9)(3, "cpu")
    expected = nn.functional.cross_entropy(step.model(x), y)
    assert torch.allclose(step(x, y).detach(), expected.detach())
    calls = []

    def batch(size, device):
        calls.append(1)
        return synthetic_batch((4,), 3, seed=len(calls))(size, device)

    step = train_step(Workload(name="n", build=lambda: nn.Linear(4, 3), batch=batch), "fp32", "cpu", 3)
    x2, y2 = synthetic_batch((4,), 3, seed=2)(3, "cpu")
    expected = nn.functional.cross_entropy(step.model(x2), y2)
    assert torch.allclose(step.next_batch().detach(), expected.detach())


@pytest.mark.parametrize("precision, dtype", [("fp16-o2", torch.float32),
                                               ("amp-bf16", torch.bfloat16),
                                               ("fp8-tensorwise", torch.bfloat16)])
def test_forward_loss_sees_what_the_step_sees(precision, dtype):
    seen = []

    def loss(out, y):
        seen.append(out.dtype)
        return nn.functional.cross_entropy(out.float(), y)

    w = Workload(name="mlp", build=lambda: nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32)),
                 batch=synthetic_batch((32,), 32), loss=loss)
    step = train_step(w, precision, "cpu", 16)
    before = float(step.forward_loss())
    assert float(step()) == pytest.approx(before, rel=1e-6)
    assert seen == [dtype, dtype]


def test_fp8_without_a_linear_it_can_take_says_which_layers_it_takes():
    w = Workload(name="narrow", build=lambda: nn.Linear(4, 3), batch=synthetic_batch((4,), 3))
    with pytest.raises(WorkloadCannotRun, match=r"^workload 'narrow' cannot run precision "
                       r"'fp8-rowwise': it has no nn\.Linear FP8 can take \(features multiples of "
                       r"16, or 128 for blockwise; the output layer named 'head' is kept\)$"):
        train_step(w, "fp8-rowwise", "cpu", 2)

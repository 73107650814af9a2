"""The training step per precision, checked against plain torch steps and torch's GradScaler."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fp16lab import recipes
from fp16lab.models import build_model, input_shape
from fp16lab.scaling import ScalerSettings


def _batch(n: int = 8):
    torch.manual_seed(0)
    return torch.randn(input_shape("small_cnn", n)), torch.randint(0, 10, (n,))


def test_unknown_precision_is_refused_with_the_names():
    with pytest.raises(ValueError, match="fp16.*allowed: fp32, tf32, amp-fp16, amp-bf16, fp16-o2"):
        recipes.check_precision("fp16")
    with pytest.raises(ValueError, match="allowed"):
        recipes.make_train_step("half", None, None, None, device="cpu")


@pytest.mark.parametrize("precision, enabled", [("fp32", False), ("tf32", False),
                                                ("amp-fp16", True), ("amp-bf16", False),
                                                ("fp16-o2", True)])
def test_grad_scaler_is_enabled_only_where_the_loss_is_scaled(precision, enabled):
    s = ScalerSettings(init_scale=8.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=7)
    gs = recipes.grad_scaler(precision, "cpu", s)
    assert isinstance(gs, torch.amp.GradScaler)
    assert gs.is_enabled() == enabled
    if enabled:  # the settings reach torch's scaler unchanged
        assert (gs.get_scale(), gs.get_growth_factor(), gs.get_backoff_factor(),
                gs.get_growth_interval()) == (8.0, 3.0, 0.25, 7)


def test_scaler_defaults_are_torchs():
    ref = torch.amp.GradScaler("cpu")
    gs = recipes.grad_scaler("amp-fp16", "cpu")
    assert (gs.get_scale(), gs.get_growth_factor(), gs.get_backoff_factor(),
            gs.get_growth_interval()) == (ref.get_scale(), ref.get_growth_factor(),
                                          ref.get_backoff_factor(), ref.get_growth_interval())


@pytest.mark.parametrize("precision, dtype", [("amp-fp16", torch.float16),
                                              ("amp-bf16", torch.bfloat16),
                                              ("fp32", torch.float32), ("tf32", torch.float32)])
def test_autocast_runs_a_linear_in_the_recipes_dtype(precision, dtype):
    lin = torch.nn.Linear(4, 4)
    with recipes.autocast(precision, "cpu"):
        out = lin(torch.ones(2, 4))
    assert out.dtype == dtype


def test_math_flags_set_tf32_only_for_tf32_and_restore():
    b = torch.backends
    before = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark)
    with recipes.math_flags("tf32", cudnn_benchmark=True):
        assert b.cuda.matmul.allow_tf32 and b.cudnn.allow_tf32 and b.cudnn.benchmark
    with recipes.math_flags("fp32"):
        assert not b.cuda.matmul.allow_tf32 and not b.cudnn.allow_tf32
    assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark) == before


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_fp32_step_is_one_plain_sgd_step(precision):
    x, y = _batch()
    torch.manual_seed(1)
    ref = build_model("small_cnn")
    model = build_model("small_cnn")
    model.load_state_dict(ref.state_dict())
    step, scaler = recipes.make_train_step(precision, model, x, y, device="cpu")
    assert scaler is None
    loss = step()
    opt = torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9)  # the oracle
    ref_loss = torch.nn.functional.cross_entropy(ref(x), y)
    ref_loss.backward()
    opt.step()
    assert float(loss.detach()) == pytest.approx(float(ref_loss.detach()), rel=1e-6)
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, r, msg=name)


def test_amp_fp16_step_scales_and_backs_off_like_gradscaler():
    # With a scale of 2**60 the fp16 gradients overflow: GradScaler skips the step and backs off.
    x, y = _batch()
    model = build_model("small_cnn")
    before = [p.detach().clone() for p in model.parameters()]
    s = ScalerSettings(init_scale=2.0**60, backoff_factor=0.25)
    step, scaler = recipes.make_train_step("amp-fp16", model, x, y, device="cpu", scaler=s)
    step()
    assert scaler.get_scale() == 2.0**60 * 0.25
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach(), b)  # the step was skipped


def test_fp16_o2_keeps_fp32_master_weights_and_matches_an_fp32_step():
    torch.manual_seed(0)
    ref = build_model("small_cnn")
    model = build_model("small_cnn")
    model.load_state_dict(ref.state_dict())
    x = torch.randn(input_shape("small_cnn", 8))
    y = torch.randint(0, 10, (8,))
    step, scaler = recipes.make_train_step("fp16-o2", model, x, y, device="cpu",
                                           scaler=ScalerSettings(init_scale=256.0))
    step()
    # the oracle: one plain fp32 SGD step of the same model on the same batch
    opt = torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9)
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    opt.step()
    bn = {id(p) for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)
          for p in m.parameters()}
    assert bn
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.dtype == (torch.float32 if id(p) in bn else torch.float16), name
        np.testing.assert_allclose(p.float().detach().numpy(), r.detach().numpy(),
                                   rtol=2e-2, atol=2e-3, err_msg=name)
    master = [p for g in step.optimizer.param_groups for p in g["params"]]
    assert all(m.dtype == torch.float32 for m in master)
    for m, p in zip(master, model.parameters()):  # the model holds the master weights, rounded
        assert torch.equal(m.to(p.dtype), p.detach())


def test_fp16_o2_step_moves_the_master_weights_by_the_fp32_update():
    """The update itself, not the weights, is compared: one SGD step changes a weight by
    lr * grad (1e-4 here), far below a tolerance on the weights, so an optimizer that never
    steps would pass a weight check. The oracle: a plain fp32 step from the same (fp16) start."""
    torch.manual_seed(0)
    model = build_model("small_cnn")
    x = torch.randn(input_shape("small_cnn", 8))
    y = torch.randint(0, 10, (8,))
    step, scaler = recipes.make_train_step("fp16-o2", model, x, y, device="cpu",
                                           scaler=ScalerSettings(init_scale=256.0))
    master = [p for g in step.optimizer.param_groups for p in g["params"]]
    start = [m.detach().clone() for m in master]
    ref = build_model("small_cnn")
    with torch.no_grad():
        for r, s0 in zip(ref.parameters(), start):
            r.copy_(s0)  # the fp16-rounded weights the fp16-o2 step starts from
    step()
    assert scaler.get_scale() == 256.0  # no overflow: the step was taken, not skipped
    opt = torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9)
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    opt.step()
    for (name, r), m, s0 in zip(ref.named_parameters(), master, start):
        want = r.detach() - s0
        got = m.detach() - s0
        assert float(want.norm()) > 0, name
        # fp16 forward and backward: the update agrees to a few per cent, not to 100%
        rel = float((got - want).norm() / want.norm())
        assert rel < 0.05, f"{name}: the master weights moved {rel:.0%} off the fp32 update"



def test_unknown_precision_message_in_full():
    with pytest.raises(ValueError) as info:
        recipes.check_precision("fp16")
    assert str(info.value) == ("unknown precision 'fp16'; allowed: fp32, tf32, amp-fp16, "
                               "amp-bf16, fp16-o2")
    assert recipes.check_precision("amp-bf16") == "amp-bf16"
    with pytest.raises(ValueError, match="unknown precision 'half'"):
        recipes.autocast("half", "cpu")
    with pytest.raises(ValueError, match="unknown precision 'half'"):
        recipes.grad_scaler("half", "cpu")
    with pytest.raises(ValueError, match="unknown precision 'half'"):
        with recipes.math_flags("half"):
            pass


def _new_tf32_api():
    b = torch.backends
    return (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision)


def _set_new_tf32_api(values):
    b = torch.backends
    b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision = values


@pytest.fixture
def tf32_flags_put_back():
    """Puts torch's TF32 and benchmark flags back as they were, through both APIs (legacy
    first: torch keeps the legacy flags readable only when the per-backend ones follow them)."""
    b = torch.backends
    legacy = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark)
    new = _new_tf32_api()
    yield
    b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark = legacy
    _set_new_tf32_api(new)
    assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark) == legacy


def test_math_flags_restore_settings_made_with_torchs_per_backend_tf32_api(tf32_flags_put_back):
    # Once the per-backend API is used, reading the legacy allow_tf32 flags raises in torch;
    # math_flags must still work and put the per-backend values back.
    b = torch.backends
    _set_new_tf32_api(("tf32", "ieee", "ieee"))
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        b.cuda.matmul.allow_tf32  # noqa: B018 (torch's behaviour this test is about)
    b.cudnn.benchmark = True
    with recipes.math_flags("fp32"):
        assert not b.cuda.matmul.allow_tf32 and not b.cudnn.allow_tf32
        assert b.cudnn.benchmark  # not given: left alone
    assert _new_tf32_api() == ("tf32", "ieee", "ieee")
    assert b.cudnn.benchmark
    with recipes.math_flags("tf32", cudnn_benchmark=False):
        assert b.cuda.matmul.allow_tf32 and b.cudnn.allow_tf32 and not b.cudnn.benchmark
    assert _new_tf32_api() == ("tf32", "ieee", "ieee") and b.cudnn.benchmark


def test_math_flags_restore_the_legacy_flags_each_to_its_own_value(tf32_flags_put_back):
    b = torch.backends
    benchmark = b.cudnn.benchmark
    b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = True, False
    with recipes.math_flags("fp32", cudnn_benchmark=True):
        assert b.cudnn.benchmark
    assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark) == (
        True, False, benchmark)
    with pytest.raises(KeyError):  # the flags come back even when the step raises
        with recipes.math_flags("tf32"):
            raise KeyError("inside")
    assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32) == (True, False)


def test_sgd_is_lr_001_with_momentum_09_over_two_steps():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = recipes.sgd([w])
    grads = [torch.tensor([0.5, 1.0]), torch.tensor([-1.0, 2.0])]
    want = w.detach().clone()
    buf = torch.zeros(2)
    for g in grads:  # the oracle: SGD with momentum, written out
        buf = 0.9 * buf + g if buf.any() else g.clone()
        want = want - 0.01 * buf
        w.grad = g.clone()
        opt.step()
    torch.testing.assert_close(w.detach(), want, rtol=0, atol=1e-7)
    lr5 = recipes.sgd([w], lr=0.5, momentum=0.0)
    w.grad = torch.ones(2)
    before = w.detach().clone()
    lr5.step()
    torch.testing.assert_close(w.detach(), before - 0.5, rtol=0, atol=0)


def _reference_loss(precision, model, x, y, loss_fn=torch.nn.functional.cross_entropy):
    """The loss the step must report: the model's forward in the recipe's precision."""
    with torch.no_grad():
        if precision == "fp16-o2":
            return loss_fn(model(x.half()).float(), y)
        dtype = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}.get(precision)
        with torch.autocast("cpu", dtype=dtype or torch.float16, enabled=dtype is not None):
            return loss_fn(model(x), y)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "amp-fp16", "amp-bf16", "fp16-o2"])
def test_a_step_trains_on_the_batch_it_is_given_with_the_loss_given(precision):
    import copy

    torch.manual_seed(1)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    x2, y2 = torch.randn(8, 4), torch.randint(0, 3, (8,))
    calls = []

    def loss_fn(logits, labels):
        calls.append(labels)
        return torch.nn.functional.cross_entropy(logits, labels) * 3.0

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    step, _ = recipes.make_train_step(precision, model, x, y, device="cpu", loss_fn=loss_fn)
    ref = copy.deepcopy(model)  # after make_train_step: fp16-o2 made it fp16 already
    want = _reference_loss(precision, ref, x2, y2, loss_fn)
    got = step(x2, y2)
    assert torch.equal(calls[-1], y2)
    assert float(got.detach()) == float(want)
    want_default = _reference_loss(precision, ref, x, y, loss_fn)
    assert float(want_default) != float(want)
    got_default = step()  # (x, y) again, after one update: close to, not equal to, the start
    assert torch.equal(calls[-1], y)
    assert float(got_default.detach()) == pytest.approx(float(want_default), rel=0.05)


def test_fp16_o2_steps_only_trainable_parameters_and_skips_those_without_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(4, 3))
    frozen = model[0].bias
    frozen.requires_grad_(False)
    unused = model[1]  # never in the forward: its parameters get no gradient

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.seq = model

        def forward(self, x):
            return self.seq[0](x)

    net = Net()
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    step, scaler = recipes.make_train_step("fp16-o2", net, x, y, device="cpu",
                                           scaler=ScalerSettings(init_scale=256.0))
    master = [p for g in step.optimizer.param_groups for p in g["params"]]
    assert len(master) == 3  # weight of [0], weight and bias of [1]; not the frozen bias
    unused_before = [p.detach().clone() for p in unused.parameters()]
    w0 = model[0].weight.detach().clone()
    step()
    assert scaler.get_scale() == 256.0
    assert not torch.equal(model[0].weight.detach(), w0)  # stepped
    for p, b in zip(unused.parameters(), unused_before):
        assert torch.equal(p.detach(), b)  # no gradient: left as it was
    assert master[1].grad is None and master[2].grad is None


def test_the_scaler_is_made_for_the_device_it_is_given():
    # torch's GradScaler("cuda") switches itself off, with a warning, where CUDA is missing;
    # built for no device it would stay on. The recipes hand their device on.
    import warnings

    x, y = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        scalers = [recipes.grad_scaler("amp-fp16", "cuda")]
        for precision in ("amp-fp16", "fp16-o2"):
            _, gs = recipes.make_train_step(precision, build_model("small_cnn"), x, y,
                                            device="cuda")
            scalers.append(gs)
    assert [gs.is_enabled() for gs in scalers] == [torch.cuda.is_available()] * 3


class _Gated(torch.nn.Module):
    """Uses `extra` only for batches of more than 4: a parameter the second step leaves out."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 3)
        self.extra = torch.nn.Linear(4, 3)

    def forward(self, x):
        out = self.a(x)
        return out + self.extra(x) if x.shape[0] > 4 else out


@pytest.mark.parametrize("precision", ["fp32", "amp-fp16", "fp16-o2"])
def test_a_parameter_without_a_gradient_this_step_is_not_moved(precision):
    # torch's SGD skips a parameter whose .grad is None; a zeroed (not None) gradient would let
    # the momentum of the step before move it. Each step clears the gradients to None.
    torch.manual_seed(0)
    model = _Gated()
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    x4, y4 = torch.randn(4, 4), torch.randint(0, 3, (4,))
    step, _ = recipes.make_train_step(precision, model, x, y, device="cpu",
                                      scaler=ScalerSettings(init_scale=256.0))
    stepped = [p for g in step.optimizer.param_groups for p in g["params"]]
    if precision == "fp16-o2":
        assert [p.dtype for p in stepped] == [torch.float32] * 4  # the master copies
    else:
        assert [id(p) for p in stepped] == [id(p) for p in model.parameters()]
    step()  # a batch of 8: `extra` gets a gradient and a momentum buffer
    before = [p.detach().clone() for p in model.extra.parameters()]
    a_before = model.a.weight.detach().clone()
    step(x4, y4)  # a batch of 4: no gradient for `extra`
    assert not torch.equal(model.a.weight.detach(), a_before)
    for p, b in zip(model.extra.parameters(), before):
        assert torch.equal(p.detach(), b)

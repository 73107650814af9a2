"""The training step per precision, checked against plain torch steps and torch's GradScaler."""

from __future__ import annotations

import contextlib

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


def _tf32_on():
    """(matmul, convolutions) on TF32, read with torch's getters: the per-backend ones where this
    torch has them (>= 2.9 refuses the legacy ones once the new ones are used), else allow_tf32."""
    b = torch.backends
    if hasattr(b.cuda.matmul, "fp32_precision"):
        return (b.cuda.matmul.fp32_precision == "tf32", b.cudnn.conv.fp32_precision == "tf32",
                b.cudnn.rnn.fp32_precision == "tf32")
    return b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.allow_tf32


def test_math_flags_set_tf32_only_for_tf32_and_restore():
    b = torch.backends
    before = (_tf32_on(), b.cudnn.benchmark)
    with recipes.math_flags("tf32", cudnn_benchmark=True):
        assert _tf32_on() == (True, True, True) and b.cudnn.benchmark
    with recipes.math_flags("fp32"):
        assert _tf32_on() == (False, False, False)
    assert (_tf32_on(), b.cudnn.benchmark) == before


def test_tf32_context_sets_matmul_and_conv_separately_and_restores():
    before = _tf32_on()
    with recipes.tf32(True, conv=False):
        assert _tf32_on() == (True, False, False)
        assert recipes.tf32_state() == {"matmul": True, "conv": False}
        with recipes.tf32(False):
            assert _tf32_on() == (False, False, False)
        assert _tf32_on() == (True, False, False)
    assert _tf32_on() == before
    restore = recipes.set_tf32(True)
    assert _tf32_on() == (True, True, True)
    restore()
    assert _tf32_on() == before


def test_tf32_never_touches_the_legacy_flags_where_torch_has_the_new_ones(monkeypatch):
    b = torch.backends
    if not hasattr(b.cuda.matmul, "fp32_precision"):
        pytest.skip("this torch has only the legacy allow_tf32 flags")
    touched = []
    for name in ("_get_cublas_allow_tf32", "_set_cublas_allow_tf32"):  # looked up per access
        real = getattr(torch._C, name)
        monkeypatch.setattr(torch._C, name, lambda *a, _n=name, _r=real: touched.append(_n) or _r(*a))
    monkeypatch.setattr(type(b.cudnn), "allow_tf32", property(  # bound when torch was imported
        lambda self: touched.append("get cudnn") or torch._C._get_cudnn_allow_tf32(),
        lambda self, v: touched.append("set cudnn") or torch._C._set_cudnn_allow_tf32(v)))
    with recipes.math_flags("tf32"):
        recipes.tf32_state()
    assert touched == []  # torch >= 2.9 warns on (and may refuse) every legacy access


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



# ----------------------------------------------------------------------------- fused SGD

def _fused_sgd_or_skip(device: str) -> None:
    """Skips, with torch's reason, where torch has no fused SGD kernel for ``device``."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here")
    p = torch.nn.Parameter(torch.ones(2, device=device))
    p.grad = torch.ones(2, device=device)
    try:
        torch.optim.SGD([p], lr=0.1, momentum=0.9, fused=True).step()
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch {torch.__version__} has no fused SGD on {device}: {e}")


def test_optimizer_names_build_torchs_sgd_fused_or_as_torch_picks():
    with pytest.raises(ValueError, match="adam.*allowed: sgd, sgd-fused"):
        recipes.optimizer_factory("adam")
    params = [torch.nn.Parameter(torch.ones(3))]
    plain, fused = (recipes.optimizer_factory(n)(params) for n in ("sgd", "sgd-fused"))
    # unset, not False: an explicit fused=False would make torch pick its per-tensor loop
    assert (plain.defaults["fused"], plain.defaults["foreach"]) == (None, None)
    assert fused.defaults["fused"] is True and fused._step_supports_amp_scaling
    for opt in (plain, fused):
        assert (opt.defaults["lr"], opt.defaults["momentum"]) == (recipes.LR, recipes.MOMENTUM)


def _torch_amp_run(model, batches, y, optimizer, device: str, init_scale: float):
    """The oracle (``optimizer=None``: the AMP loop written with torch alone, foreach SGD) or the
    subject (the recipe's amp-fp16 step with the named optimizer). Returns the weights and scale after each step."""
    out = []
    if optimizer is None:
        opt = torch.optim.SGD(model.parameters(), lr=recipes.LR, momentum=recipes.MOMENTUM, foreach=True)
        gs = torch.amp.GradScaler(device, init_scale=init_scale)
        for xb in batches:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device, dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(xb), y)
            gs.scale(loss).backward()
            gs.step(opt)
            gs.update()
            out.append(([p.detach().clone() for p in model.parameters()], gs.get_scale()))
        return out
    step, gs = recipes.make_train_step("amp-fp16", model, batches[0], y, device=device,
                                       scaler=ScalerSettings(init_scale=init_scale),
                                       optimizer=recipes.optimizer_factory(optimizer))
    for xb in batches:
        step(xb, y)
        out.append(([p.detach().clone() for p in model.parameters()], gs.get_scale()))
    return out


@pytest.mark.parametrize("device, rtol", [("cpu", 1e-5), pytest.param("cuda", 1e-3, marks=pytest.mark.gpu)])
def test_fused_sgd_skips_inf_steps_and_moves_like_torchs_foreach_sgd(device, rtol, monkeypatch):
    """An inf in the first and the fourth batch: GradScaler must skip exactly those steps (each
    run's weights bit for bit unchanged, the same scales) and every other step must move the
    weights as torch's foreach SGD under the same GradScaler does, each run against its own
    previous weights. Tolerance on each update (norm of the difference over the norm): 1e-5 on
    a CPU, where the two kernels agree to the last bit here; 1e-3 on a GPU, where they round
    differently and fp16 autocast turns a last-bit weight difference into a few fp16 ulps of
    gradient. A wrong momentum (unset buffers, none at all) or a step taken on an inf batch is
    off by order one."""
    _fused_sgd_or_skip(device)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)  # the same gradients twice
    torch.manual_seed(0)
    x = torch.randn(input_shape("small_cnn", 8), device=device)
    y = torch.randint(0, 10, (8,), device=device)
    bad = x.clone()
    bad[0, 0, 0, 0] = float("inf")
    batches = [bad, x, x, bad, x, x]
    torch.manual_seed(1)
    start = build_model("small_cnn").to(device)
    runs = {}
    for optimizer in (None, "sgd-fused"):
        model = build_model("small_cnn").to(device)
        model.load_state_dict(start.state_dict())
        first = [p.detach().clone() for p in model.parameters()]
        runs[optimizer] = [(first, None)] + _torch_amp_run(model, batches, y, optimizer, device, init_scale=2.0**10)
    for i, batch in enumerate(batches, start=1):
        (w0, _), (w1, want_scale) = runs[None][i - 1], runs[None][i]
        (g0, _), (g1, got_scale) = runs["sgd-fused"][i - 1], runs["sgd-fused"][i]
        assert got_scale == want_scale, f"step {i}: scale {got_scale} != torch's {want_scale}"
        for a, b, c, d in zip(w0, w1, g0, g1):
            if batch is bad:
                assert torch.equal(a, b) and torch.equal(c, d), f"step {i} (inf batch) moved the weights"
            else:
                want, got = b - a, d - c
                assert float(want.norm()) > 0
                assert float((got - want).norm() / want.norm()) < rtol, f"step {i}"
    assert runs[None][-1][1] == 2.0**10 * 0.5 ** 2  # two skips, no growth within 2000 steps


def test_fused_sgd_through_the_recipe_matches_foreach_in_fp32():
    """Five fp32 steps, no scaler: the recipe's sgd-fused against torch's foreach SGD."""
    _fused_sgd_or_skip("cpu")
    x, y = _batch()
    torch.manual_seed(1)
    ref = build_model("small_cnn")
    model = build_model("small_cnn")
    model.load_state_dict(ref.state_dict())
    start = [p.detach().clone() for p in ref.parameters()]
    step, _ = recipes.make_train_step("fp32", model, x, y, device="cpu",
                                      optimizer=recipes.optimizer_factory("sgd-fused"))
    opt = torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9, foreach=True)  # the oracle
    for _ in range(5):
        step()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        opt.step()
    for (name, p), r, s in zip(model.named_parameters(), ref.parameters(), start):
        want = r.detach() - s
        assert float(want.norm()) > 0, name
        assert float((p.detach() - s - want).norm() / want.norm()) < 1e-5, name


def test_fused_sgd_step_never_reads_found_inf_on_the_host(monkeypatch):
    """The point of the fused optimizer under GradScaler: no .item() (a host sync on a GPU) in the
    step, where the foreach optimizer reads found-inf once per step."""
    _fused_sgd_or_skip("cpu")
    x, y = _batch()
    calls = []
    item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda self: calls.append(1) or item(self))
    for name, want in (("sgd", 3), ("sgd-fused", 0)):
        calls.clear()
        step, _ = recipes.make_train_step("amp-fp16", build_model("small_cnn"), x, y, device="cpu",
                                          optimizer=recipes.optimizer_factory(name))
        for _ in range(3):
            step()
        assert len(calls) == want, name


def test_unknown_precision_message_in_full():
    with pytest.raises(ValueError) as info:
        recipes.check_precision("fp16")
    assert str(info.value) == ("unknown precision 'fp16'; allowed: fp32, tf32, amp-fp16, "
                               "amp-bf16, fp16-o2, fp8-tensorwise, fp8-rowwise, fp8-blockwise, "
                               "fp8-delayed")
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
    # math_flags must still work, through the per-backend API, and put its values back.
    b = torch.backends
    if not hasattr(b.cuda.matmul, "fp32_precision"):
        pytest.skip("this torch has only the legacy allow_tf32 flags")
    _set_new_tf32_api(("tf32", "ieee", "ieee"))
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        b.cuda.matmul.allow_tf32  # noqa: B018 (torch's behaviour this test is about)
    b.cudnn.benchmark = True
    with recipes.math_flags("fp32"):
        assert _tf32_on() == (False, False, False)
        assert b.cudnn.benchmark  # not given: left alone
    assert _new_tf32_api() == ("tf32", "ieee", "ieee")
    assert b.cudnn.benchmark
    with recipes.math_flags("tf32", cudnn_benchmark=False):
        assert _tf32_on() == (True, True, True) and not b.cudnn.benchmark
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


def test_per_backend_api_needs_both_matmul_and_cudnn_settings():
    from types import SimpleNamespace as NS

    both = NS(cuda=NS(matmul=NS(fp32_precision="ieee")), cudnn=NS(conv=NS()))
    matmul_only = NS(cuda=NS(matmul=NS(fp32_precision="ieee")), cudnn=NS())
    cudnn_only = NS(cuda=NS(matmul=NS()), cudnn=NS(conv=NS()))
    assert recipes._per_backend_api(both)
    assert not recipes._per_backend_api(matmul_only)
    assert not recipes._per_backend_api(cudnn_only)


@pytest.mark.parametrize("matmul, conv", [(True, False), (False, True), (True, True), (False, False)])
def test_tf32_state_reads_matmul_and_conv_each_on_its_own(matmul, conv, tf32_flags_put_back):
    with recipes.tf32(matmul, conv=conv):
        assert recipes.tf32_state() == {"matmul": matmul, "conv": conv}
        assert _tf32_on() == (matmul, conv, conv)


@pytest.mark.parametrize("matmul, conv", [(True, False), (False, True)])
def test_set_tf32_on_a_torch_with_only_the_legacy_flags(matmul, conv, monkeypatch,
                                                        tf32_flags_put_back):
    b = torch.backends
    b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = not matmul, not conv  # legacy setters: consistent
    monkeypatch.setattr(recipes, "_per_backend_api", lambda _: False)  # as torch < 2.9
    restore = recipes.set_tf32(matmul, conv)
    assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32) == (matmul, conv)
    assert recipes.tf32_state() == {"matmul": matmul, "conv": conv}
    restore()
    assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32) == (not matmul, not conv)


def test_sgd_is_torchs_default_sgd_unless_fused_is_asked_for():
    p = torch.nn.Parameter(torch.ones(3))
    plain = recipes.sgd([p])
    assert plain.defaults["fused"] is None and plain.defaults["foreach"] is None
    assert plain.state_dict()["state"] == torch.optim.SGD([p], lr=0.1).state_dict()["state"] == {}


# ----------------------------------------------------------------------------- one list

def test_each_engine_offers_the_precisions_it_offered_before_the_one_list():
    """The subsets, derived from the properties, against the lists the engines wrote by hand."""
    from fp16lab.fp8.training import CURVE_PRECISIONS

    fp8 = ("fp8-tensorwise", "fp8-rowwise", "fp8-blockwise", "fp8-delayed")
    assert tuple(recipes.PRECISIONS) == ("fp32", "tf32", "amp-fp16", "amp-bf16", "fp16-o2", *fp8)
    assert recipes.RECIPE_PRECISIONS == ("fp32", "tf32", "amp-fp16", "amp-bf16", "fp16-o2")
    assert recipes.precisions(converts_model=False) == ("fp32", "tf32", "amp-fp16", "amp-bf16")
    assert recipes.precisions(autocast_recipe=True) == ("fp32", "amp-fp16", "amp-bf16")
    assert recipes.SCALED_PRECISIONS == ("amp-fp16", "fp16-o2")
    assert set(CURVE_PRECISIONS) == {"amp-bf16", "fp32", *fp8}
    assert str(recipes.PRECISIONS["amp-fp16"]) == "autocast to fp16 with a GradScaler"
    assert recipes.autocast_dtype("fp8-rowwise") is torch.bfloat16  # the rest as amp-bf16
    assert recipes.autocast_dtype("fp16-o2") is None
    with pytest.raises(ValueError, match="a Precision has no property 'fast'"):
        recipes.precisions(fast=True)


def test_a_known_precision_an_engine_refuses_says_so_and_what_it_allows():
    with pytest.raises(ValueError) as info:
        recipes.check_precision("tf32", ("fp32", "amp-bf16"), where="across GPUs")
    assert str(info.value) == "precision 'tf32' is not offered across GPUs; allowed: fp32, amp-bf16"
    with pytest.raises(ValueError, match="not offered by recipes.make_train_step"):
        recipes.make_train_step("fp8-tensorwise", None, None, None, device="cpu")
    with pytest.raises(ValueError, match="unknown precision 5"):
        recipes.check_precision(5)


def test_the_step_marks_its_phases_and_calls_back_once_the_gradients_are_in():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    seen = []

    @contextlib.contextmanager
    def region(name):
        seen.append(name)
        yield

    def after_backward():
        seen.append(("grads in", model.weight.grad is not None))

    step, gs = recipes.make_train_step("amp-fp16", model, x, y, device="cpu", region=region,
                                       after_backward=after_backward, unscale_first=True)
    step()
    assert seen == ["zero_grad", "forward", "backward", ("grads in", True), "unscale",
                    "optimizer_step", "scaler_update"]


def test_a_loss_scaler_given_replaces_the_recipes_and_none_trains_without():
    """A StaticLossScaler given for amp-fp16 scales the loss (its history says so); None gives
    the plain autocast step, equal to an unscaled fp32 update on a model whose grads fit fp16."""
    from fp16lab.scaling import StaticLossScaler

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    static = StaticLossScaler(8.0)
    step, gs = recipes.make_train_step("amp-fp16", model, x, y, device="cpu", loss_scaler=static)
    step()
    assert gs is static and [e.scale for e in static.history] == [8.0]
    _, none = recipes.make_train_step("amp-fp16", torch.nn.Linear(4, 3), x, y, device="cpu",
                                      loss_scaler=None)
    assert none is None
    with pytest.raises(ValueError, match="loss_scaler must be 'recipe', None or a scaler"):
        recipes.make_train_step("amp-fp16", model, x, y, device="cpu", loss_scaler="dynamic")

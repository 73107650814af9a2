"""Execution modes against hand-written PyTorch training loops (the oracle) and each other."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fp16lab import execution as E
from fp16lab import profile as P
from fp16lab.models import build_model
from fp16lab.recipes import LR, MOMENTUM


def _batch(model_name="mlp", batch=16, device="cpu", seed=0):
    from fp16lab.models import NUM_CLASSES, input_shape
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(input_shape(model_name, batch), generator=g).to(device)
    y = torch.randint(0, NUM_CLASSES, (batch,), generator=g).to(device)
    return x, y


def _reference_losses(model, x, y, precision, steps):
    """The textbook loop, written out: autocast, GradScaler where fp16, plain SGD with momentum."""
    # fp32 means TF32 off for convolutions too (cuDNN's default is on)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    dev = x.device.type
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    scaler = torch.amp.GradScaler(dev) if precision == "amp-fp16" else None
    dtype = torch.bfloat16 if precision == "amp-bf16" else torch.float16
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast(dev, dtype=dtype, enabled=precision.startswith("amp")):
            loss = F.cross_entropy(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        losses.append(float(loss.detach()))
    return losses, scaler


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "amp-fp16"])
def test_eager_step_trains_like_the_textbook_loop(precision):
    torch.manual_seed(0)
    model = build_model("mlp")
    ref_model = copy.deepcopy(model)
    x, y = _batch()
    step = E.make_step(model, x, y, precision=precision)
    got = [float(step()) for _ in range(6)]
    want, ref_scaler = _reference_losses(ref_model, x, y, precision, 6)
    assert got == pytest.approx(want, rel=1e-6)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    if precision == "amp-fp16":
        assert step.scaler.get_scale() == ref_scaler.get_scale()


@pytest.mark.parametrize("precision", ["fp32", "amp-fp16"])
def test_fused_sgd_trains_like_the_textbook_loop(precision):
    torch.manual_seed(0)
    model = build_model("mlp")
    ref_model = copy.deepcopy(model)
    x, y = _batch()
    step = E.make_step(model, x, y, precision=precision, fused_optimizer=True)
    assert step.fused_optimizer and step.optimizer.defaults["fused"]
    got = [float(step()) for _ in range(6)]
    want, _ = _reference_losses(ref_model, x, y, precision, 6)
    assert got == pytest.approx(want, rel=1e-5)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_fused_sgd_after_a_skipped_first_step_trains_like_the_textbook_loop():
    # ResNet-50's first AMP steps overflow at the default scale; the fused optimizer must then
    # behave like GradScaler + plain SGD, which skips the step and keeps no momentum from it
    torch.manual_seed(0)
    model = build_model("mlp")
    ref_model = copy.deepcopy(model)
    x, y = _batch()
    bad = x.clone()
    bad[0, 0] = float("inf")
    step = E.make_step(model, bad.clone(), y, precision="amp-fp16", fused_optimizer=True)
    step()  # overflows: skipped, scale halved
    step.load(x, y)
    got = [float(step()) for _ in range(4)]
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=LR, momentum=MOMENTUM)
    ref_scaler = torch.amp.GradScaler("cpu")
    want = []
    for batch in [bad] + [x] * 4:
        ref_opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(ref_model(batch), y)
        ref_scaler.scale(loss).backward()
        ref_scaler.step(ref_opt)
        ref_scaler.update()
        want.append(float(loss.detach()))
    assert step.scaler.get_scale() == ref_scaler.get_scale() == 2.0 ** 15
    assert got == pytest.approx(want[1:], rel=1e-5)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_compile_gives_the_eager_loss_trajectory_on_cpu():
    eager = E.build_step("mlp", 16, precision="fp32", execution="eager", device="cpu", seed=3)
    compiled = E.build_step("mlp", 16, precision="fp32", execution="compile", device="cpu", seed=3)
    a = [float(eager()) for _ in range(5)]
    b = [float(compiled()) for _ in range(5)]
    assert a[-1] < a[0]  # it trains
    assert b == pytest.approx(a, rel=1e-4)
    for p, q in zip(eager.model.parameters(), compiled.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_the_step_marks_its_phases_in_order():
    step = E.build_step("mlp", 8, precision="amp-fp16", execution="eager", device="cpu")
    prof = P.profile_steps(step, steps=1, warmup=1, cuda=False)
    ev = prof.events
    names = [n for n in ev[ev["kind"] == "annotation"].sort_values("start_us")["name"]
             if n in P.PHASES]
    assert names == list(P.PHASES)


def test_bf16_has_no_unscale_phase():
    step = E.build_step("mlp", 8, precision="amp-bf16", device="cpu")
    prof = P.profile_steps(step, steps=1, warmup=0, cuda=False)
    assert "unscale" not in set(prof.events["name"]) and "forward" in set(prof.events["name"])


def test_load_replaces_the_batch_in_place():
    step = E.build_step("mlp", 8, precision="fp32", device="cpu")
    x0 = step.x
    x, y = _batch(batch=8, seed=5)
    step.load(x, y)
    assert step.x is x0 and torch.equal(step.x, x) and torch.equal(step.y, y)
    with pytest.raises(ValueError, match="keep its shapes"):
        step.load(x[:4], y[:4])


@pytest.mark.parametrize("kwargs, match", [
    (dict(execution="graph"), "execution must be one of 'eager', 'cuda-graph', 'compile'; got 'graph'"),
    (dict(execution="cuda-graph", device="cpu"), "needs a CUDA device"),
    (dict(execution="compile", compile_mode="fast", device="cpu"), "compile_mode must be one of"),
    (dict(execution="compile", compile_mode="reduce-overhead", device="cpu"), "needs a CUDA"),
    (dict(precision="fp16-o2"), "fp16-o2"),
    (dict(precision="fp8"), "allowed: fp32, tf32, amp-fp16, amp-bf16"),
    (dict(device="tpu"), "device must be a device name"),
    (dict(device="cuda:1"), "device must be one of 'cpu', 'cuda'"),
    (dict(execution="cuda-graph", fused_optimizer=False), "needs fused_optimizer=True"),
    (dict(layout="channels_last"), "image models only"),
    (dict(layout="nhwc"), "layout must be one of 'nchw', 'channels_last'"),
])
def test_bad_arguments_are_refused_before_any_work(kwargs, match):
    args = dict(precision="fp32", execution="eager", device="cpu")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        E.build_step("mlp", 8, **args)


def test_unknown_model_and_batch_are_refused():
    with pytest.raises(ValueError, match="model_name must be one of 'small_cnn'"):
        E.build_step("vgg", 8, precision="fp32", device="cpu")
    with pytest.raises(ValueError, match="batch must be >= 1"):
        E.build_step("mlp", 0, precision="fp32", device="cpu")


# ---------------------------------------------------------------- GPU: capture and compile


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["amp-fp16", "amp-bf16", "fp32"])
def test_cuda_graph_step_trains_like_the_textbook_loop(precision):
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(0)
    model = build_model("small_cnn").cuda()
    ref_model = copy.deepcopy(model)
    x, y = _batch("small_cnn", 32, "cuda")
    step = E.make_step(model, x, y, precision=precision, execution="cuda-graph", warmup=3)
    got = [float(step()) for _ in range(5)]
    # building the graph step ran the 3 warm-up steps; capture records a step without running
    # it (torch.cuda.graph only records kernels), so the first replay is the textbook's step 4
    want, ref_scaler = _reference_losses(ref_model, x, y, precision, 3 + 5)
    assert got == pytest.approx(want[3:], rel=2e-3)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=2e-3, atol=2e-4)
    if precision == "amp-fp16":
        assert step.scaler.get_scale() == ref_scaler.get_scale()


@pytest.mark.gpu
def test_cuda_graph_skips_an_overflowing_step_and_backs_off_like_gradscaler():
    torch.manual_seed(0)
    model = build_model("small_cnn").cuda()
    ref_model = copy.deepcopy(model)
    x, y = _batch("small_cnn", 16, "cuda")
    step = E.make_step(model, x, y, precision="amp-fp16", execution="cuda-graph", warmup=2)
    step()  # the first replay: the textbook's step 3 (capture itself ran nothing)
    _, ref_scaler = _reference_losses(ref_model, x, y, "amp-fp16", 3)
    before = [p.detach().clone() for p in model.parameters()]
    scale = step.scaler.get_scale()
    assert scale == ref_scaler.get_scale()
    bad = x.clone()
    bad[0, 0, 0, 0] = float("inf")
    step.load(bad, y)
    step()
    torch.cuda.synchronize()
    # oracle: torch's GradScaler, eager, on the same overflowing batch
    _reference_losses_on(ref_model, ref_scaler, bad, y)
    assert step.scaler.get_scale() == ref_scaler.get_scale() == scale * 0.5
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p, q), "a step with inf gradients must leave the weights alone"


def _reference_losses_on(model, scaler, x, y):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


@pytest.mark.gpu
def test_a_replayed_step_is_one_graph_launch_with_all_its_kernels():
    step = E.build_step("small_cnn", 32, precision="amp-fp16", execution="cuda-graph")
    prof = P.profile_steps(step, steps=2, warmup=1)
    ev = prof.events
    assert prof.graph_launches == 2
    eager = P.profile_steps(E.build_step("small_cnn", 32, precision="amp-fp16"), steps=2, warmup=1)

    def kernel_launches(events):
        return int(events[events["kind"] == "launch"]["name"].str.contains("LaunchKernel").sum())
    # replay may launch a fill or two of its own (RNG offsets), nothing like eager's hundreds
    assert kernel_launches(ev) <= 0.1 * kernel_launches(eager.events), (
        kernel_launches(ev), kernel_launches(eager.events))
    n_graph = (ev["lane"] == "gpu").sum()
    n_eager = (eager.events["lane"] == "gpu").sum()
    # the profiler sees every kernel of the replayed graph (same work as eager, give or take the
    # optimizer's fused kernel and GradScaler's host copy)
    assert n_graph > 0 and abs(n_graph - n_eager) <= 0.2 * n_eager, (n_graph, n_eager)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["reduce-overhead"])  # 'default' is tested on the CPU
def test_compile_on_gpu_gives_the_eager_loss_trajectory(mode):
    eager = E.build_step("small_cnn", 32, precision="amp-bf16", seed=1)
    compiled = E.build_step("small_cnn", 32, precision="amp-bf16", execution="compile",
                            compile_mode=mode, seed=1)
    a = [float(eager()) for _ in range(5)]
    b = [float(compiled()) for _ in range(5)]
    assert b == pytest.approx(a, rel=2e-2)

"""Weights and optimizer state in 16 bits, against counted and float64 oracles and torch's AdamW."""

from __future__ import annotations

import math

import pytest
import torch

from fp16lab.state16 import (AdamW16, bytes_per_parameter, state_bytes, stochastic_round_bf16,
                             vanished_share)


def _neighbours(x: float) -> tuple[float, float]:
    """The bf16 values just below and above x (x > 0, not a bf16 value), by truncating bits."""
    t = torch.tensor([x], dtype=torch.float32)
    low = (t.view(torch.int32) & -65536).view(torch.float32)
    high = (low.view(torch.int32) + 65536).view(torch.float32)
    return float(low), float(high)


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75, 1 / 3, 0.01])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_stochastic_rounding_goes_up_with_the_distance_as_probability(fraction, sign):
    low, high = _neighbours(1.7)
    x = sign * (low + fraction * (high - low))
    n = 200_000
    g = torch.Generator().manual_seed(1)
    out = stochastic_round_bf16(torch.full((n,), x, dtype=torch.float32), g).float()
    assert set(out.unique().tolist()) <= {sign * low, sign * high}
    up = float((out.abs() == high).float().mean())
    frac = (abs(x) - low) / (high - low)  # the float32 x's own fraction, counted exactly
    sigma = math.sqrt(frac * (1 - frac) / n)
    assert abs(up - frac) < 5 * sigma + 1e-6
    assert float(out.double().mean()) == pytest.approx(x, rel=1e-4)  # unbiased


def test_stochastic_rounding_keeps_bf16_values_and_non_finite_ones():
    x = torch.tensor([1.0, -2.5, 0.0, float("inf"), -float("inf"), 3.0e38], dtype=torch.float32)
    x = torch.cat([x, torch.tensor([float("nan")])])
    out = stochastic_round_bf16(x, torch.Generator().manual_seed(0)).float()
    assert out[:5].tolist() == [1.0, -2.5, 0.0, float("inf"), -float("inf")]
    assert math.isnan(out[6])
    with pytest.raises(TypeError, match="float32"):
        stochastic_round_bf16(torch.ones(2, dtype=torch.float64))


def test_vanished_share_by_hand():
    w = torch.ones(4, dtype=torch.bfloat16)  # bf16 spacing above 1 is 2^-7, below 2^-8
    u = torch.tensor([2.0**-10, 2.0**-6, 0.0, -2.0**-10])
    assert vanished_share(w, u) == pytest.approx(2 / 3)
    assert vanished_share(w, torch.zeros(4)) == 0.0
    with pytest.raises(TypeError):
        vanished_share(torch.ones(2), u[:2])


def _constant_gradient_run(rounding: str, dtype: torch.dtype, steps: int = 1000, lr: float = 1e-4):
    p = torch.nn.Parameter(torch.ones(64, dtype=dtype))
    opt = AdamW16([p], lr=lr, weight_decay=0.0, rounding=rounding,
                  generator=torch.Generator().manual_seed(0))
    shares = []
    for _ in range(steps):
        p.grad = torch.ones_like(p)
        opt.step()
        shares.append(opt.vanished)
    return p.detach().double(), shares


def test_nearest_bf16_swamps_kahan_and_stochastic_follow_float64():
    # each step moves w by lr * g / (|g| + eps): float64 says 1 - 1000 * 1e-4 = 0.9
    ref = 1.0 - 1000 * 1e-4 / (1 + 1e-8)
    nearest, shares = _constant_gradient_run("nearest", torch.bfloat16)
    assert torch.all(nearest == 1.0) and min(shares) == 1.0  # every update rounded away
    kahan, _ = _constant_gradient_run("kahan", torch.bfloat16)
    assert torch.all((kahan - ref).abs() <= 2.0**-8)  # within one bf16 spacing at 0.9
    sr, sr_shares = _constant_gradient_run("stochastic", torch.bfloat16)
    assert abs(float(sr.mean()) - ref) < 2.0**-8
    assert 0.9 < sum(sr_shares) / len(sr_shares) < 1.0  # most steps round down, some up
    fp32, shares32 = _constant_gradient_run("nearest", torch.float32)
    assert torch.allclose(fp32, torch.full_like(fp32, ref), atol=1e-5) and max(shares32) == 0.0


def test_adamw16_on_fp32_weights_is_torch_adamw():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(33, 7))
    b = torch.nn.Parameter(a.detach().clone())
    ours = AdamW16([a], lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)
    theirs = torch.optim.AdamW([b], lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05,
                               foreach=False)
    for _ in range(25):
        g = torch.randn_like(a)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    assert torch.equal(a, b)  # the same operations in the same order: bit for bit


def test_one_group_of_mixed_tensors_steps_each_as_torch_adamw_would():
    """One group holding FP32 and BF16 weights of several shapes, one of them skipping a step:
    each FP32 weight is torch's AdamW bit for bit; each BF16 weight is bf16(w + u), u being the
    step torch's AdamW takes from w's FP32 value with the same moments; Kahan's buffer holds
    what that rounding lost."""
    torch.manual_seed(0)
    shapes = [(5, 3), (7,), (2, 2, 4)]
    for rounding in ("nearest", "kahan"):
        fp32 = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
        bf16 = [torch.nn.Parameter(torch.randn(s).to(torch.bfloat16)) for s in shapes]
        mirror32 = [torch.nn.Parameter(p.detach().clone()) for p in fp32]
        mirror16 = [torch.nn.Parameter(p.detach().float()) for p in bf16]
        settings = dict(lr=0.05, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)
        ours = AdamW16([fp32[0], bf16[0], fp32[1], bf16[1], fp32[2], bf16[2]], rounding=rounding,
                       **settings)
        theirs = torch.optim.AdamW(mirror32 + mirror16, foreach=False, **settings)
        buffers = [torch.zeros(s, dtype=torch.bfloat16) for s in shapes]
        for step in range(6):
            for i, (a, b, c, d) in enumerate(zip(fp32, mirror32, bf16, mirror16)):
                skip = i == 1 and step == 2  # this pair has no gradient this step
                g32, g16 = torch.randn(a.shape), torch.randn(c.shape)
                a.grad, b.grad = (None, None) if skip else (g32, g32.clone())
                c.grad = None if skip else g16.to(torch.bfloat16)
                d.grad = None if skip else c.grad.float()
                d.data.copy_(c.detach().float())  # AdamW's step from w's FP32 value
            before = [c.detach().float() for c in bf16]
            ours.step()
            theirs.step()
            for a, b in zip(fp32, mirror32):
                assert torch.equal(a, b)
            for i, (c, d, w) in enumerate(zip(bf16, mirror16, before)):
                if i == 1 and step == 2:
                    assert torch.equal(c.detach().float(), w)  # no gradient: left alone
                    continue
                y = d.detach() - w  # torch's update u, plus (Kahan) what the last rounding lost
                if rounding == "kahan":
                    y = y + buffers[i].float()
                expected = (w + y).to(torch.bfloat16)
                assert torch.equal(c.detach(), expected)
                if rounding == "kahan":
                    buffers[i] = (y - (expected.float() - w)).to(torch.bfloat16)
                    assert torch.equal(ours.state[c]["c"], buffers[i])
        assert ours.state[bf16[1]]["step"] == 5 and ours.state[bf16[0]]["step"] == 6


def test_bytes_per_parameter_and_counted_state():
    assert [bytes_per_parameter(m) for m in ("fp32-master", "bf16-nearest", "bf16-stochastic",
                                             "bf16-kahan", "bf16-8bit-state")] == [16, 12, 12, 14, 6]
    assert bytes_per_parameter("fp32-master", gradient=False) == 12
    p = torch.nn.Parameter(torch.ones(100, dtype=torch.bfloat16))
    opt = AdamW16([p], rounding="kahan")
    p.grad = torch.ones_like(p)
    opt.step()
    assert state_bytes(opt) == 100 * (4 + 4 + 2)
    opt16 = AdamW16([p], rounding="nearest", state_dtype=torch.bfloat16)
    opt16.step()
    assert state_bytes(opt16) == 100 * (2 + 2)
    with pytest.raises(ValueError, match="method"):
        bytes_per_parameter("fp64")


@pytest.mark.parametrize("kwargs, words", [({"lr": -1.0}, "lr"), ({"eps": 0.0}, "eps"),
                                           ({"betas": (1.0, 0.9)}, "betas"),
                                           ({"rounding": "up"}, "rounding"),
                                           ({"state_dtype": torch.float16}, "state_dtype")])
def test_adamw16_refuses_bad_settings(kwargs, words):
    with pytest.raises((TypeError, ValueError), match=words):
        AdamW16([torch.nn.Parameter(torch.ones(2))], **kwargs)


# ---------------------------------------------------------------- the field's packages as oracles

def _trajectory(make, dtype=torch.bfloat16, steps=200, n=4096):
    """Returns the weights after ``steps`` AdamW steps on fixed gradients from fixed weights."""
    torch.manual_seed(0)
    w0 = torch.randn(n) * 0.5
    grads = [torch.randn(n) for _ in range(steps)]
    p = torch.nn.Parameter(w0.to(torch.bfloat16).to(dtype))
    opt = make([p])
    for g in grads:
        p.grad = g.to(dtype)
        opt.step()
    return p.detach().double()


def _rms_from_float64(make):
    ref = _trajectory(lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.0), torch.float64)
    return (_trajectory(make) - ref).pow(2).mean().sqrt().item()


def test_kahan_tracks_float64_as_torch_optimi_does():
    """Over 200 steps whose updates (1e-4) nearest rounding mostly swallows, the teaching Kahan
    ends as far from a float64 AdamW as torch-optimi's Kahan-summed AdamW does, and both end
    about half as far as nearest rounding."""
    pytest.importorskip("optimi")
    from fp16lab.state16 import field_optimizer
    ours = _rms_from_float64(lambda ps: AdamW16(ps, lr=1e-4, weight_decay=0.0, rounding="kahan"))
    field = _rms_from_float64(lambda ps: field_optimizer("bf16-kahan", ps, 1e-4))
    nearest = _rms_from_float64(lambda ps: AdamW16(ps, lr=1e-4, weight_decay=0.0))
    assert ours == pytest.approx(field, rel=0.02)
    assert nearest > 1.6 * field


def test_stochastic_rounding_tracks_float64_as_torchao_does():
    """The same with stochastic rounding: the teaching version's random walk around the float64
    trajectory has the spread of torchao's bf16_stochastic_round AdamW."""
    pytest.importorskip("torchao")
    from fp16lab.state16 import field_optimizer
    ours = _rms_from_float64(lambda ps: AdamW16(ps, lr=1e-4, weight_decay=0.0,
                                                rounding="stochastic",
                                                generator=torch.Generator().manual_seed(1)))
    field = _rms_from_float64(lambda ps: field_optimizer("bf16-stochastic", ps, 1e-4))
    assert ours == pytest.approx(field, rel=0.1)


def test_state_bytes_counts_a_quantized_states_codes_and_scales():
    """torchao's 8-bit state is a tensor subclass: its bytes are its codes (one byte each), one
    fp32 scale per block of 256 and a 256-entry fp32 code map, not numel x bf16's 2 bytes."""
    pytest.importorskip("torchao")
    from torchao.optim.subclass_8bit import OptimState8bit

    class Holder(torch.optim.Optimizer):
        def step(self, closure=None):
            return None

    p = torch.nn.Parameter(torch.zeros(4096))
    opt = Holder([p], {})
    opt.state[p] = {"exp_avg": OptimState8bit.zeros((4096,), signed=True, block_size=256),
                    "exp_avg_sq": OptimState8bit.zeros((4096,), signed=False, block_size=256),
                    "step": torch.tensor(0.0)}
    one = 4096 + 4096 // 256 * 4
    qmaps = {opt.state[p][k].qmap.untyped_storage().data_ptr() for k in ("exp_avg", "exp_avg_sq")}
    assert state_bytes(opt) == 2 * one + len(qmaps) * 256 * 4 + 4


def test_field_optimizer_says_which_package_is_missing(monkeypatch):
    import builtins

    from fp16lab import state16
    real = builtins.__import__

    def no_optimi(name, *args, **kwargs):
        if name == "optimi":
            raise ImportError("No module named 'optimi'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_optimi)
    assert "pip install torch-optimi" in state16.field_unavailable("bf16-kahan")
    with pytest.raises(ValueError, match="torch-optimi"):
        state16.field_optimizer("bf16-kahan", [torch.nn.Parameter(torch.zeros(2))], 1e-3)
    assert state16.field_unavailable("fp32-master") is None
    with pytest.raises(ValueError, match="method"):
        state16.field_unavailable("bf16-fast")
    with pytest.raises(ValueError, match="lr"):
        state16.field_optimizer("fp32-master", [torch.nn.Parameter(torch.zeros(2))], float("nan"))
    # the same checks as AdamW16's: betas in [0, 1), eps > 0
    for bad, words in (({"betas": (0.9, 1.0)}, "betas"), ({"betas": 0.9}, "two numbers"),
                       ({"eps": 0.0}, "eps")):
        with pytest.raises(ValueError, match=words):
            state16.field_optimizer("fp32-master", [torch.nn.Parameter(torch.zeros(2))], 1e-3,
                                    **bad)


@pytest.mark.parametrize("lr, share", [(1e-4, 1.0), (0.1, 0.0)])
def test_vanished_counts_only_the_updates_that_are_not_zero(lr, share):
    """Half the weights get a zero gradient (with no weight decay their update is exactly 0):
    they are neither moved nor vanished. 1e-4 is below half of BF16's spacing at 1 (2^-8),
    0.1 is not."""
    p = torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16))
    opt = AdamW16([p], lr=lr, weight_decay=0.0)
    p.grad = torch.tensor([1.0] * 4 + [0.0] * 4, dtype=torch.bfloat16)
    opt.step()
    assert opt.vanished == share
    assert torch.equal(p.detach()[4:], torch.ones(4, dtype=torch.bfloat16))


def test_stochastic_rounding_draws_from_the_optimizers_generator():
    """Two optimizers given generators of one seed round the same way; another seed does not
    (the global generator, drawn from between the two runs, would make the first pair differ)."""
    def run(seed):
        p = torch.nn.Parameter(torch.ones(256, dtype=torch.bfloat16))
        opt = AdamW16([p], lr=1e-3, weight_decay=0.0, rounding="stochastic",
                      generator=torch.Generator().manual_seed(seed))
        for _ in range(3):
            p.grad = torch.ones_like(p)
            opt.step()
            torch.rand(1)  # draws from the global generator between steps
        return p.detach().clone()
    assert torch.equal(run(5), run(5))
    assert not torch.equal(run(5), run(6))


def test_bf16_moments_follow_torch_adamw_within_their_rounding():
    """state_dtype=bfloat16 keeps the moments in BF16 (8 significant bits): each step's update
    (lr x m / sqrt(v), about lr) is off by about 2^-8 of itself, so over 20 steps of lr 1e-2 the
    weights stay within 20 x 1e-2 x 2^-7 = 1.6e-3 of torch's AdamW, whose random gradients move
    them ~1e-2 x sqrt(20) = 0.045 on average."""
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(512))
    b = torch.nn.Parameter(a.detach().clone())
    ours = AdamW16([a], lr=1e-2, weight_decay=0.0, state_dtype=torch.bfloat16)
    theirs = torch.optim.AdamW([b], lr=1e-2, weight_decay=0.0)
    start = a.detach().clone()
    for _ in range(20):
        g = torch.randn_like(a)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    assert ours.state[a]["m"].dtype == ours.state[a]["v"].dtype == torch.bfloat16
    assert (b.detach() - start).abs().mean() > 0.02  # torch's AdamW moved the weights
    assert (a - b).abs().max().item() < 1.6e-3
    assert not torch.equal(a, b)  # BF16 moments do round: not bit for bit


def test_adamw16_refuses_float16_weights():
    with pytest.raises(TypeError, match="float32 or bfloat16.*float16"):
        AdamW16([torch.nn.Parameter(torch.ones(3, dtype=torch.float16))])
    opt = AdamW16([torch.nn.Parameter(torch.ones(3))])
    with pytest.raises(TypeError, match="float32 or bfloat16.*float16"):  # a group added later
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2, dtype=torch.float16))]})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": torch.nn.Parameter(torch.tensor(1.0))})  # a lone 0-d tensor
    assert len(opt.param_groups) == 2


# ------------------------------------------------------------------------------- on the GPU

@pytest.mark.gpu
def test_adamw16_on_the_gpu_follows_torch_adamw():
    """FP32 weights of several shapes on the GPU: AdamW16's multi-tensor pass against torch's
    own foreach AdamW on the same device (CUDA kernels may contract a multiply-add where the
    CPU's do not, so within FP32's rounding, not bit for bit)."""
    torch.manual_seed(0)
    ours_p = [torch.nn.Parameter(torch.randn(s, device="cuda")) for s in [(64, 48), (48,), (3, 5, 7)]]
    theirs_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    start = [p.detach().clone() for p in ours_p]
    ours = AdamW16(ours_p, lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)
    theirs = torch.optim.AdamW(theirs_p, lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05,
                               foreach=True)
    for _ in range(25):
        for a, b in zip(ours_p, theirs_p):
            g = torch.randn_like(a)
            a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    for a, b in zip(ours_p, theirs_p):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert all((a - s).abs().min() > 0 for a, s in zip(ours_p, start))  # every weight moved


@pytest.mark.gpu
def test_stochastic_rounding_on_the_gpu_goes_up_with_the_distance_as_probability():
    """A value a quarter of the way from its lower BF16 neighbour to its upper one rounds up a
    quarter of the time, drawn from a CUDA generator (the same count as the CPU test)."""
    low, high = _neighbours(1.0 + 2 ** -9)
    x = torch.full((200_000,), low + 0.25 * (high - low), device="cuda")
    out = stochastic_round_bf16(x, torch.Generator("cuda").manual_seed(3))
    assert out.dtype == torch.bfloat16 and out.device.type == "cuda"
    values = set(out.float().unique().tolist())
    assert values == {low, high}
    up = float((out.float() == high).float().mean())
    assert abs(up - 0.25) < 5 * math.sqrt(0.25 * 0.75 / x.numel())


@pytest.mark.gpu
@pytest.mark.parametrize("source", ["ours", "field"])
@pytest.mark.parametrize("method", ["fp32-master", "bf16-nearest", "bf16-stochastic", "bf16-kahan"])
def test_a_short_gpu_run_learns_and_counts_its_bytes(method, source):
    """Thirty steps of the benchmark's training loop on the GPU at the tiny size, with AdamW16
    and with the field's package for the way: the loss falls, the counted bytes per parameter
    are the predicted ones (the packages' at most those), and the peak covers them."""
    from fp16lab.bench import state16 as bench
    from fp16lab.state16 import field_unavailable

    if source == "field" and field_unavailable(method):
        pytest.skip(field_unavailable(method))

    _, _, _, vocab, seq, batch = bench.SIZES["tiny"]
    data = bench.language(vocab, seq, batch, steps=30)
    row = bench.train(method, source, data, "tiny", seed=0, device="cuda", lr=3e-3)
    assert row["losses"][-1] < row["losses"][0] - 0.5
    if source == "ours":
        assert row["counted_bytes_per_parameter"] == bytes_per_parameter(method)
    else:  # the packages may keep the moments in BF16, never more than AdamW16's FP32, and
        # a step counter per tensor (torch's is a 4-byte tensor, allow 8)
        steps = 8 * len(list(bench.build("tiny").parameters())) / row["parameters"]
        assert 2 * row["weight_bytes"] / row["parameters"] < row["counted_bytes_per_parameter"]
        assert row["counted_bytes_per_parameter"] <= bytes_per_parameter(method) + steps
    assert row["peak_bytes"] >= 2 * row["weight_bytes"] + row["state_bytes"]
    if method == "bf16-nearest":
        assert max(row["unchanged"]) > 0.0  # some updates round away even at this rate

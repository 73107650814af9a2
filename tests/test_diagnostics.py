"""Diagnostics: FP16 fates against a numpy cast, hook statistics against numpy thresholds,
the first-non-finite locator against planted faults, and the measured demonstrations."""

from __future__ import annotations

import importlib.util
import math

import ml_dtypes  # noqa: F401  (numpy float16 is IEEE binary16 already; imported as a check)
import numpy as np
import pytest
import torch
from torch import nn

from fp16lab import diagnostics as d
from fp16lab.diagnostics import histogram


def _numpy_fates(x32: np.ndarray, scale: float) -> dict[str, float]:
    """Oracle: scale in float64 (exact for power-of-two scales) and let numpy round to float16."""
    y = x32.astype(np.float64) * scale
    with np.errstate(over="ignore"):
        h = y.astype(np.float16)
    fin = np.isfinite(y)
    ah = np.abs(h.astype(np.float64))
    return {
        "zero": np.mean(y == 0),
        "underflow": np.mean(fin & (y != 0) & (h == 0)),
        "subnormal": np.mean(fin & (ah > 0) & (ah < 2.0**-14)),
        "normal": np.mean(fin & np.isfinite(h) & (ah >= 2.0**-14)),
        "overflow": np.mean(fin & ~np.isfinite(h)),
        "nonfinite": np.mean(~fin),
    }


@pytest.mark.parametrize("scale", [1.0, 2.0**8, 2.0**16, 2.0**-3])
def test_fp16_fate_matches_numpy_cast(scale):
    rng = np.random.default_rng(1)
    e = rng.uniform(-40, 20, 20000)
    x = (np.sign(rng.standard_normal(e.size)) * 2.0**e).astype(np.float32)
    # edge cases: exact thresholds and their float32 neighbours, specials
    edges = np.array([2.0**-25, 2.0**-24, 2.0**-14, 2.0**-14 - 2.0**-25, 65504, 65520, 65519.99,
                      0.0, -0.0, np.inf, -np.inf, np.nan], dtype=np.float32)
    with np.errstate(over="ignore"):
        edges = np.concatenate([edges, np.nextafter(edges, np.float32(np.inf)),
                                np.nextafter(edges, np.float32(-np.inf))]) / np.float32(scale)
    x = np.concatenate([x, edges.astype(np.float32)])
    got = d.fp16_fate(torch.from_numpy(x), scale)
    want = _numpy_fates(x, scale)
    for k in d.FATES:
        assert got[k] == pytest.approx(want[k], abs=1e-12), k
    assert sum(got.values()) == pytest.approx(1.0)


def test_fp16_fate_rejects_bad_scale():
    with pytest.raises(ValueError, match="finite positive"):
        d.fp16_fate(torch.ones(3), 0.0)
    with pytest.raises(TypeError, match="torch.Tensor"):
        d.fp16_fate([1.0, 2.0])


def test_gradient_fate_table_lost_and_kept():
    g = torch.tensor([1e-9, 1e-9, 1.0, 0.0])  # 1e-9 < 2**-25 ~ 3e-8
    t = d.gradient_fate_table([("w", g)], scales=(1.0, 2.0**10))
    one = t[t.scale == 1.0].iloc[0]
    big = t[t.scale == 1024.0].iloc[0]
    assert one.lost == 0.5 and one.kept == 0.25
    assert big.lost == 0.0 and big.kept == 0.75


def _oracle_stats(g: np.ndarray) -> dict[str, float]:
    a = np.abs(g.astype(np.float64))
    n = a.size
    return {
        "max_abs": np.nan if np.isnan(a).any() else a.max(),
        "zero_frac": np.sum(a == 0) / n,
        "fp16_underflow_frac": np.sum((a > 0) & (a < 2.0**-25)) / n,
        "fp16_subnormal_frac": np.sum((a >= 2.0**-25) & (a < 2.0**-14)) / n,
        "fp16_overflow_frac": np.sum(a >= 2.0**16) / n,   # includes inf
        "n_inf": int(np.isinf(a).sum()), "n_nan": int(np.isnan(a).sum()),
    }


class _Planted(nn.Module):
    """Parameters whose gradient we set by hand."""

    def __init__(self, shapes, dtype=torch.float32):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.zeros(s, dtype=dtype)) for s in shapes])

    def forward(self):
        return sum((p * p.detach()).sum() for p in self.ps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_monitor_statistics_match_numpy(dtype):
    rng = np.random.default_rng(0)
    shapes = [(50, 7), (13,), (3, 3, 4)]
    model = _Planted(shapes, dtype)
    mon = d.GradientMonitor(model)
    want = []
    for step in range(3):
        grads = []
        for s in shapes:
            lo, hi = (-30, 17) if dtype == torch.float16 else (-149, 40)
            v = np.sign(rng.standard_normal(s)) * 2.0 ** rng.uniform(lo, hi, s)
            v = v.astype(np.float32)
            flat = v.reshape(-1)
            flat[:3] = [0.0, 2.0**-25, 2.0**-14]  # exact edges
            if step == 1:
                flat[3:5] = [np.inf, np.nan]
            with np.errstate(over="ignore"):  # FP16 gradients may overflow to inf: intended
                v = v.astype(np.float16 if dtype == torch.float16 else np.float32)
            grads.append(v)
        # the "model" multiplies each parameter by a constant whose value is the wanted grad
        for p, g in zip(model.ps, grads):
            p.data = torch.from_numpy(g.copy())
        model.zero_grad()
        model().backward()
        want.append([_oracle_stats(g) for g in grads])
    frame = mon.frame()
    assert mon.steps == 3 and len(frame) == 3 * len(shapes)
    for row in frame.itertuples():
        w = want[row.step][int(row.param.split(".")[-1])]
        for k, v in w.items():
            got = getattr(row, k)
            if isinstance(v, float) and math.isnan(v):
                assert math.isnan(got), (row, k)
            else:
                assert got == pytest.approx(v, rel=1e-6, abs=1e-12), (row.step, row.param, k)
    mon.remove()
    model.zero_grad()
    model().backward()
    assert mon.steps == 3  # hooks gone


def test_monitor_histogram_counts_every_element():
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 3))
    with d.GradientMonitor(model) as mon:
        model(torch.randn(4, 10)).sum().backward()
        h = mon.histograms()
    assert h.shape == (1, 4, d.N_BINS)
    assert h.sum(dim=2)[0].tolist() == [p.numel() for p in model.parameters()]
    # the largest non-empty exponent bin is floor(log2(max|g|)) by numpy's own frexp
    g = model[2].bias.grad.abs().max().item()
    top = int(np.nonzero(h[0, 3, 2:d.N_BINS - 2].numpy())[0].max()) + 2
    assert d.exponent_of_bin(top) == math.floor(math.log2(g))


def test_monitor_gradient_accumulation_records_each_backward():
    model = nn.Linear(4, 2)
    mon = d.GradientMonitor(model, keep_history=False)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
    assert mon.steps == 1
    assert mon.frame().numel.tolist() == [8, 2]


class _Blowup(nn.Module):
    def forward(self, x):
        return x * 1e30 if x.dtype == torch.float32 else x * 60000.0


class _GradBlowupFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return (g.half() * 60000.0 * 60000.0).to(g.dtype)


class _GradBlowup(nn.Module):
    def forward(self, x):
        return _GradBlowupFn.apply(x)


def test_locator_names_forward_culprit_in_fp16():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), _Blowup(), _Blowup(), nn.Linear(8, 2))
    model.half()
    x = torch.randn(4, 8).half() + 3.0
    rep = d.locate_first_nonfinite(model, lambda: model(x).float().sum(), backward=False)
    assert rep is not None
    # oracle: where does a plain step-by-step run first go non-finite?
    h = x
    for i, m in enumerate(model):
        h = m(h)
        if not torch.isfinite(h).all():
            first = str(i)
            break
    assert rep.module == first and rep.phase == "forward"
    assert rep.n_inf > 0 and rep.dtype == "float16"
    assert "forward" in str(rep)


def test_locator_names_backward_culprit():
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), _GradBlowup(),
                          nn.Linear(8, 2))
    x = torch.randn(4, 8)
    rep = d.locate_first_nonfinite(model, lambda: model(x).pow(2).mean())
    assert rep is not None and rep.module == "3" and rep.phase == "backward"
    assert rep.n_inf > 0


def test_locator_reports_overflowing_parameter_gradient():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    x = torch.randn(4, 8)
    # scale big enough that float32 weight gradients overflow, inputs' grads too
    rep = d.locate_first_nonfinite(model, lambda: model(x).sum(), loss_scale=1e38)
    assert rep is not None and rep.phase in {"backward", "parameter gradient"}
    assert rep.module == "1"


def test_locator_returns_none_for_a_healthy_step():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    assert d.locate_first_nonfinite(model, lambda: model(torch.randn(3, 8)).sum()) is None


def test_fp32_island_demo_measures_dtypes_and_overflow():
    t = d.fp32_island_demo().set_index("variant")
    assert t.loc["no island (FP16 matmul)", "output_dtype"] == "float16"
    assert t.loc["no island (FP16 matmul)", "n_inf"] > 0
    wrong = t.loc["autocast off, inputs still FP16"]
    assert wrong.output_dtype == "float16" and wrong.n_inf > 0
    right = t.loc["FP32 island (off + cast to FP32)"]
    assert right.output_dtype == "float32" and right.n_inf == 0 and right.rel_error < 1e-3


def test_clipping_demo_effective_norm():
    t = d.clipping_demo(max_norm=1.0, init_scale=2.0**12).set_index("recipe")
    right, wrong = t.loc["unscale_ then clip"], t.loc["clip scaled grads"]
    assert right.true_grad_norm > 1.0  # so the clip acts
    assert right.applied_grad_norm == pytest.approx(1.0, rel=1e-4)
    assert right.update_norm_over_lr == pytest.approx(1.0, rel=1e-3)
    assert wrong.norm_seen_by_clip == pytest.approx(right.true_grad_norm * 2**12, rel=1e-2)
    assert wrong.applied_grad_norm == pytest.approx(2.0**-12, rel=1e-3)


def test_scheduler_warning_demo():
    r = d.scheduler_warning_demo(steps=30)
    warm, broken = r["warm-up"], r["broken"]
    assert warm["scheduler_warning"] and "optimizer.step()" in warm["scheduler_warning"]
    assert warm["verdict"] == "warm-up only"
    assert warm["skipped"] == list(range(len(warm["skipped"])))  # consecutive from step 0
    assert 1 <= len(warm["skipped"]) <= 12 and warm["collapse_warning"] is None
    assert broken["verdict"] == "problem" and broken["collapse_warning"]
    assert len(broken["skipped"]) == 30


@pytest.mark.gpu
def test_monitor_on_cuda_matches_cpu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    x = torch.randn(32, 64)
    cpu = d.GradientMonitor(model)
    (model(x).sum() * 1e-6).backward()
    cpu.remove()
    grads = [p.grad.clone() for p in model.parameters()]
    cuda_model = model.cuda()
    cuda_model.zero_grad()
    mon = d.GradientMonitor(cuda_model)
    for p, g in zip(cuda_model.parameters(), grads):
        p.grad = None
    # same gradients on the GPU: feed them through the statistics directly
    hist, maxabs = mon.statistics([g.cuda() for g in grads])
    hist_cpu, maxabs_cpu = cpu.statistics(grads)
    assert torch.equal(hist.cpu(), hist_cpu)
    assert torch.equal(maxabs.cpu(), maxabs_cpu)
    # many parameters (several histc chunks), wide exponent range, specials: CUDA histc binning
    # agrees with CPU bincount element for element
    rng = np.random.default_rng(7)
    many = [torch.from_numpy((rng.standard_normal(int(rng.integers(1, 5000)))
                              * 2.0 ** rng.uniform(-140, 120)).astype(np.float32))
            for _ in range(200)]
    many[5][0], many[150][0] = math.inf, math.nan
    h_gpu, _ = mon.statistics([g.cuda() for g in many])
    h_cpu, _ = cpu.statistics(many)
    assert torch.equal(h_gpu.cpu(), h_cpu)
    # and the hooks fire under CUDA autocast with a real GradScaler
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = cuda_model(x.cuda()).float().pow(2).mean()
    scaler.scale(loss).backward()
    f = mon.frame()
    assert mon.steps == 1 and len(f) == 4 and (f.n_nan == 0).all()


@pytest.mark.gpu
def test_demos_on_cuda():
    assert d.fp32_island_demo("cuda").n_inf.tolist()[2] == 0
    t = d.clipping_demo("cuda").set_index("recipe")
    assert t.loc["unscale_ then clip", "applied_grad_norm"] == pytest.approx(1.0, rel=1e-4)
    assert d.scheduler_warning_demo("cuda")["warm-up"]["verdict"] == "warm-up only"


def test_census_lost_kept_agrees_with_independent_fp16_fate():
    rng = np.random.default_rng(2)
    g = torch.from_numpy((rng.standard_normal(5000) * 2.0 ** rng.uniform(-40, 0, 5000))
                         .astype(np.float32))
    t = d.census_lost_kept([("w", g)], scale=2.0**12).iloc[0]
    one, big = d.fp16_fate(g, 1.0), d.fp16_fate(g, 2.0**12)
    assert t.lost_at_1 == pytest.approx(one["underflow"])
    assert t.kept_at_S == pytest.approx(big["subnormal"] + big["normal"])
    assert t.lost_at_S == pytest.approx(big["underflow"]) and t.lost_at_S < t.lost_at_1


def test_locator_finds_the_overflowing_layer_of_the_demo_model():
    model, x = d.overflow_demo_model()

    def step():
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        return out.float().mean()

    rep = d.locate_first_nonfinite(model, step)
    assert rep.module == "scores" and rep.phase == "forward" and rep.n_inf > 0
    model.scores = d.FP32Island(model.scores)
    assert d.locate_first_nonfinite(model, step) is None


def test_overhead_summary_reads_rows():
    rows = [{"device": "cpu", "device_name": "x86", "model": "m", "batch": 2, "amp": False,
             "variant": v, "median_ms": ms, "overhead_pct": pct, "torch": "2"}
            for v, ms, pct in (("hooks off", 10.0, 0.0), ("hooks on", 10.5, 5.0))]
    t = d.overhead_summary({"meta": {}, "rows": rows}).iloc[0]
    assert (t.off_ms, t.on_ms, t.overhead_pct) == (10.0, 10.5, 5.0)
    # one row per backend where several were timed against the same "hooks off" blocks
    rows = [{"device": "cuda", "device_name": "H", "model": "m", "batch": 2, "amp": True,
             "variant": v, "median_ms": ms, "overhead_pct": pct, "torch": "2",
             "monitor_backend": b}
            for v, ms, pct, b in (("hooks off", 10.0, 0.0, None),
                                  ("hooks on (cupy)", 10.1, 1.0, "cupy"),
                                  ("hooks on (histc)", 10.7, 7.0, "histc"))]
    t = d.overhead_summary({"meta": {}, "rows": rows}).set_index("backend")
    assert t.loc["cupy", "on_ms"] == 10.1 and t.loc["histc", "overhead_pct"] == 7.0
    assert (t.off_ms == 10.0).all()


def test_monitor_detach_and_reattach():
    model = nn.Linear(3, 2)
    mon = d.GradientMonitor(model)
    model(torch.randn(2, 3)).sum().backward()
    mon.remove()
    model(torch.randn(2, 3)).sum().backward()
    assert mon.steps == 1
    mon.attach()
    mon.attach()  # idempotent: one set of hooks
    model(torch.randn(2, 3)).sum().backward()
    assert mon.steps == 2 and len(mon._handles) == 2
    with pytest.raises(ValueError, match="no parameters that require grad"):
        d.GradientMonitor(nn.ReLU())


def test_monitor_histc_and_bincount_backends_agree():
    rng = np.random.default_rng(5)
    # more parameters than one histc chunk holds, to exercise the chunking
    grads = [torch.from_numpy((rng.standard_normal(int(rng.integers(1, 300)))
                               * 2.0 ** rng.uniform(-60, 20)).astype(np.float32))
             for _ in range(100)]
    grads[3][0] = math.inf
    grads[70][1] = math.nan
    model = nn.Linear(1, 1)
    mon = d.GradientMonitor(model)
    h1, m1 = mon.statistics(grads, backend="bincount")
    h2, m2 = mon.statistics(grads, backend="histc")
    assert torch.equal(h1, h2)
    np.testing.assert_array_equal(m1.numpy(), m2.numpy())  # NaN where a NaN is
    assert h1.sum(dim=1).tolist() == [g.numel() for g in grads]
    assert h1[3, -2] == 1 and h1[70, -1] == 1
    with pytest.raises(ValueError, match="backend must be"):
        mon.statistics(grads, backend="numpy")


def test_monitor_counts_channels_last_gradients():
    conv = nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    mon = d.GradientMonitor(conv)
    conv(x).pow(2).sum().backward()
    assert conv.weight.grad.is_contiguous(memory_format=torch.channels_last)
    row = mon.frame().set_index("param").loc["weight"]
    g = conv.weight.grad.abs()
    assert row.numel == g.numel() and row.max_abs == g.max().item()


def test_monitor_every_nth_backward():
    model = nn.Linear(3, 2)
    mon = d.GradientMonitor(model, every=3)
    for _ in range(7):
        model.zero_grad()
        model(torch.randn(2, 3)).sum().backward()
    assert mon.backward_passes == 7 and mon.steps == 3
    assert sorted(mon.frame().step.unique()) == [0, 3, 6]
    with pytest.raises(ValueError, match="every must be an integer >= 1"):
        d.GradientMonitor(model, every=0)


def _numpy_bins(x32: np.ndarray) -> np.ndarray:
    """Oracle for the monitor's bins: numpy's frexp of |x| in float64 (exact for float32)."""
    a = np.abs(x32.astype(np.float64))
    with np.errstate(invalid="ignore"):
        _, e = np.frexp(a)  # a = m * 2**e, 0.5 <= m < 1: floor(log2 a) = e - 1
    out = (e - 1) - d.EXP_MIN + 2
    out = np.where(a < 2.0**-126, 1, out)
    out = np.where(a == 0, 0, out)
    out = np.where(np.isinf(a), d.N_BINS - 2, out)
    return np.where(np.isnan(a), d.N_BINS - 1, out)


def _numpy_bins_hist(x32: np.ndarray) -> list[float]:
    return np.bincount(_numpy_bins(x32), minlength=d.N_BINS).astype(float).tolist()


@pytest.mark.parametrize("method", ["ops", "search"])
def test_bin_codes_match_numpy_frexp(method):
    rng = np.random.default_rng(11)
    with np.errstate(over="ignore"):  # the top of the range overflows to inf: intended
        x = (rng.standard_normal(5000) * 2.0 ** rng.uniform(-150, 128, 5000)).astype(np.float32)
    powers = np.float32(2.0) ** np.arange(-149, 128).astype(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan,
                         np.finfo(np.float32).max, np.finfo(np.float32).tiny], dtype=np.float32)
    edges = np.concatenate([powers, np.nextafter(powers, np.float32(0)),
                            np.nextafter(powers, np.float32(np.inf)), -powers, specials])
    # NaNs with the smallest and largest payloads, both signs
    nans = np.array([0x7F800001, 0x7FFFFFFF, 0xFF800001], dtype=np.uint32).view(np.float32)
    x = np.concatenate([x, edges.astype(np.float32), nans])
    flat = torch.from_numpy(x.copy())
    with torch.device("meta"):  # another default device: the search boundaries follow the data
        got = histogram._bin_codes(flat, method=method)
    assert got.dtype == torch.int32
    np.testing.assert_array_equal(got.numpy(), _numpy_bins(x))
    with pytest.raises(ValueError, match="1-D float32"):
        histogram._bin_codes(torch.zeros(3, dtype=torch.float64), method=method)
    with pytest.raises(ValueError, match="method must be"):
        histogram._bin_codes(torch.zeros(3), method="frexp")


def test_bin_codes_default_to_ops_and_exponent_bins_end_where_inf_begins():
    x = np.array([0.0, 1e-40, 2.0**-126, 1.5, 3e38, np.inf, np.nan], dtype=np.float32)
    np.testing.assert_array_equal(histogram._bin_codes(torch.from_numpy(x.copy())).numpy(),
                                  _numpy_bins(x))
    # the search boundaries are made on the data's device ('meta' stands in for a GPU here)
    on_meta = histogram._bin_codes(torch.zeros(4, device="meta"), method="search")
    assert (on_meta.device.type, on_meta.dtype, tuple(on_meta.shape)) == ("meta", torch.int32, (4,))
    assert d.exponent_of_bin(2) == -126 and d.exponent_of_bin(d.N_BINS - 3) == 127
    for b in (1, d.N_BINS - 2):
        with pytest.raises(ValueError) as info:
            d.exponent_of_bin(b)
        assert str(info.value) == (f"bin {b} is not an exponent bin; those are 2..255 "
                                   f"(0 zero, 1 float32 subnormals, 256 inf, 257 NaN)")


def test_monitor_histc_path_orders_rows_like_the_parameters():
    # sizes out of order and ties: the histc path sorts by size internally and must put every
    # row back; each gradient holds a single distinct power of two, so its row has one bin
    sizes = [5, 300, 5, 1, 4000, 30, 300] * 5
    grads = [torch.full((n,), 2.0 ** (i - 20)) for i, n in enumerate(sizes)]
    mon = d.GradientMonitor(nn.Linear(1, 1))
    hist, maxabs = mon.statistics(grads, backend="histc")
    for i, n in enumerate(sizes):
        b = (i - 20) - d.EXP_MIN + 2
        assert hist[i, b] == n and hist[i].sum() == n, i
    assert maxabs.tolist() == [2.0 ** (i - 20) for i in range(len(sizes))]


@pytest.mark.gpu
def test_monitor_cuda_histc_float64_keys_and_half_grads_match_cpu():
    rng = np.random.default_rng(3)
    # one gradient with more than 2**24 elements: float64 keys and counts on the histc path
    big = torch.from_numpy((rng.standard_normal(2**24 + 3) * 1e-3).astype(np.float32))
    grads = [big, torch.from_numpy(rng.standard_normal(700).astype(np.float32)),
             torch.tensor([0.0, math.inf, math.nan, 2.0**-130])]
    mon = d.GradientMonitor(nn.Linear(1, 1))
    halves = [torch.from_numpy((rng.standard_normal(n) * 2.0 ** rng.uniform(-30, 15, n))
                               .astype(np.float16)) for n in (50, 3000, 7)]
    backends = ["histc"] + (["cupy"] if importlib.util.find_spec("cupy") else [])
    for backend in backends:
        h_gpu, m_gpu = mon.statistics([g.cuda() for g in grads], backend=backend)
        h_cpu, m_cpu = mon.statistics(grads)
        assert torch.equal(h_gpu.cpu(), h_cpu) and h_cpu[0].sum() == big.numel(), backend
        assert h_cpu[2].tolist() == _numpy_bins_hist(grads[2].numpy())
        np.testing.assert_array_equal(m_gpu[:2].cpu().numpy(), m_cpu[:2].numpy())  # NaN-free
        # float16 gradients (a model in .half()) widen exactly
        h_gpu, m_gpu = mon.statistics([g.cuda() for g in halves], backend=backend)
        h_cpu, m_cpu = mon.statistics(halves)
        assert torch.equal(h_gpu.cpu(), h_cpu), backend
        np.testing.assert_array_equal(m_gpu.cpu().numpy(), m_cpu.numpy())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_monitor_cupy_kernel_matches_cpu_bincount(dtype):
    pytest.importorskip("cupy")
    rng = np.random.default_rng(13)
    lo = -40 if dtype == torch.float16 else -140
    hi = 15 if dtype == torch.float16 else 120
    # sizes around the kernel's chunk (16384) and its unrolled trip (2048), views that start at
    # odd offsets, specials of both signs, and a channels_last gradient
    sizes = [1, 7, 2047, 2048, 2049, 16383, 16384, 16385, 3 * 16384 + 5, 100_003]
    grads = []
    for n in sizes:
        v = rng.standard_normal(n) * 2.0 ** rng.uniform(lo, hi, n)
        grads.append(torch.from_numpy(v.astype(np.float32)).to(dtype))
    grads[2][:6] = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan])
    cuda = [g.cuda() for g in grads]
    full = torch.from_numpy(rng.standard_normal(5000).astype(np.float32)).to(dtype)
    grads.append(full[3:])
    cuda.append(full.cuda()[3:])  # a view 3 elements into its storage
    cl = torch.randn(4, 6, 5, 5).to(dtype).contiguous(memory_format=torch.channels_last)
    grads.append(cl)
    cuda.append(cl.cuda())  # .cuda() keeps the memory format
    assert cuda[-1].is_contiguous(memory_format=torch.channels_last) and cuda[-2].storage_offset()
    mon = d.GradientMonitor(nn.Linear(1, 1))
    want_h, want_m = mon.statistics(grads, backend="bincount")
    got_h, got_m = mon.statistics(cuda, backend="cupy")
    assert got_h.dtype == torch.int64 and torch.equal(got_h.cpu(), want_h)
    np.testing.assert_array_equal(got_m.cpu().numpy(), want_m.numpy())  # NaN rows too
    assert got_h.sum(dim=1).tolist() == [g.numel() for g in grads]
    # on a side stream, twice (the second call reuses the uploaded addresses)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            h2, m2 = mon.statistics(cuda, backend="cupy")
    s.synchronize()
    assert torch.equal(h2.cpu(), want_h)
    with pytest.raises(ValueError, match="float32, float16 and bfloat16"):
        mon.statistics([torch.zeros(3, dtype=torch.float64, device="cuda")], backend="cupy")

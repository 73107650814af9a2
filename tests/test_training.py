"""Side-by-side training helper: same start for every run, and FP16 without scaling loses
gradients that FP32 keeps (checked against torch's own gradients)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from fp16lab import training as T
from fp16lab.scaling import simulate_dynamic


def test_task_is_deterministic_and_balanced_enough():
    x1, y1 = T.make_task(512, seed=3)
    x2, y2 = T.make_task(512, seed=3)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == (512, 32) and y1.min() >= 0 and y1.max() < 10
    assert len(torch.unique(y1)) >= 5


@pytest.mark.parametrize("kwargs, words", [
    (dict(precision="fp8"), "unknown precision 'fp8'; allowed: fp32, amp-fp16, amp-bf16"),
    (dict(scaling="sometimes"), "scaling must be"),
    (dict(precision="amp-bf16", scaling="static"), "loss scaling is for amp-fp16"),
    (dict(precision="fp16"), "amp-fp16"),
    (dict(scaling="dynamic", precision="amp-fp16", growth_interval=0), "growth_interval"),
    (dict(scaling="static", precision="amp-fp16", static_scale=0.0), "static_scale must be > 0"),
    (dict(static_scale=float("nan")), "static_scale must be finite"),
])
def test_run_config_rejects_bad_input(kwargs, words):
    with pytest.raises(ValueError, match=words):
        T.RunConfig("x", **kwargs)


def _first_step_grads(autocast_dtype, scale=1.0):
    """Oracle: one hand-written step with plain torch; returns the weight gradients."""
    torch.manual_seed(0)
    model = T.deep_tanh_mlp()
    x, y = T.make_task(seed=0)
    order = torch.Generator().manual_seed(1)
    idx = torch.randint(0, x.shape[0], (256,), generator=order)
    with torch.autocast("cpu", dtype=autocast_dtype or torch.float16,
                        enabled=autocast_dtype is not None):
        logits = model(x[idx])
    (F.cross_entropy(logits.float(), y[idx]) * scale).backward()
    return [p.grad for n, p in model.named_parameters() if n.endswith("weight")]


def test_first_step_zero_fraction_matches_plain_torch():
    runs = [T.RunConfig("fp32"), T.RunConfig("fp16", "amp-fp16"),
            T.RunConfig("static", "amp-fp16", "static", static_scale=2.0**12)]
    steps, stats, _ = T.run_side_by_side(runs, steps=2, device="cpu")
    for cfg, dtype, scale in [(runs[0], None, 1.0), (runs[1], torch.float16, 1.0),
                              (runs[2], torch.float16, 2.0**12)]:
        grads = _first_step_grads(dtype, scale)
        want = sum(int((g == 0).sum()) for g in grads) / sum(g.numel() for g in grads)
        got = steps[(steps.run == cfg.name) & (steps.step == 0)].zero_frac.item()
        assert got == pytest.approx(want, abs=1e-12), cfg.name
    z = steps[steps.step == 0].set_index("run").zero_frac
    assert z["fp32"] == 0.0
    assert z["fp16"] > 0.2          # a large share of the gradient is lost at scale 1 ...
    assert z["static"] < 0.01       # ... and kept at scale 2**12
    # same seed, same data: every run starts from the same loss
    losses = steps[steps.step == 0].loss.to_numpy()
    assert np.ptp(losses) < 1e-4


def test_no_scaling_run_freezes_the_first_layers():
    steps, stats, _ = T.run_side_by_side([T.RunConfig("fp16", "amp-fp16"), T.RunConfig("fp32")],
                                         steps=6, device="cpu")
    lost = T.lost_gradient_by_layer(stats, "fp16", last=5)
    assert lost.iloc[0] > 0.9 and lost.index[0] == "0.weight"
    assert (T.lost_gradient_by_layer(stats, "fp32", last=5) == 0).all()
    with pytest.raises(ValueError, match="no gradient statistics for run"):
        T.lost_gradient_by_layer(stats, "fp64")


def test_dynamic_run_follows_torch_rule():
    cfg = T.RunConfig("dyn", "amp-fp16", "dynamic", init_scale=2.0**30, growth_interval=3)
    r = T.train_run(cfg, steps=12, device="cpu")
    skipped = [row["skipped"] for row in r.steps]
    scales = [row["scale"] for row in r.steps]
    assert skipped[0]  # 2**30 overflows at first
    ours = simulate_dynamic(skipped, init_scale=2.0**30, growth_interval=3)
    assert scales == [e.scale for e in ours]


@pytest.mark.gpu
def test_side_by_side_on_cuda():
    steps, stats, _ = T.run_side_by_side(steps=20, device="cuda")
    z = steps[steps.step == 0].set_index("run").zero_frac
    assert z["fp32"] == 0.0 and z["fp16, no scaling"] > 0.2
    assert z["fp16, dynamic (GradScaler)"] < 0.01


def test_reference_gradients_are_the_first_step_fp32_gradients():
    ref = dict(T.reference_gradients())
    grads = _first_step_grads(None)
    assert list(ref) == [f"{2 * i}.weight" for i in range(len(grads))]
    for g, (name, r) in zip(grads, ref.items()):
        assert torch.equal(g, r), name


def test_plots_draw_the_measured_data():
    import matplotlib
    matplotlib.use("Agg")
    steps, stats, _ = T.run_side_by_side(T.DEFAULT_RUNS[:2], steps=3, device="cpu")
    fig = T.plot_runs(steps)
    line = fig.axes[1].lines[1]
    np.testing.assert_allclose(line.get_ydata(), 100 * steps[steps.run == T.DEFAULT_RUNS[1].name]
                               .zero_frac.to_numpy())
    fig2 = T.plot_lost_by_layer(stats, [r.name for r in T.DEFAULT_RUNS[:2]], last=3)
    heights = [p.get_height() for p in fig2.axes[0].patches]
    assert max(heights) > 90 and len(heights) == 2 * 29


def test_adam_steps_follow_adams_formula():
    """Oracle: Adam's update written out in float64 (Kingma and Ba, with torch's defaults)."""
    grads = [1e-9, 1e-9, 0.0, 0.0, 0.0, 1e-3, 0.0]
    b1, b2, eps = 0.9, 0.999, 1e-8
    m = v = 0.0
    want = []
    for t, g in enumerate(grads, start=1):
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        want.append(abs((m / (1 - b1**t)) / (math.sqrt(v / (1 - b2**t)) + eps)))
    got = T.adam_steps(grads)
    assert got == pytest.approx(want, rel=1e-9)
    assert got[0] == pytest.approx(1e-9 / (1e-9 + 1e-8), rel=1e-9)  # about 0.09, not 1
    assert 0 < got[4] < got[2] < got[1]  # after zeros, momentum keeps moving the weight, fading


def test_progress_bar_counts_every_step(monkeypatch):
    import tqdm.auto

    seen = []

    class Bar:
        def __init__(self, iterable, **kwargs):
            self.items, self.kwargs = list(iterable), kwargs
            seen.append(self)

        def __iter__(self):
            return iter(self.items)

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    r = T.train_run(T.DEFAULT_RUNS[0], steps=3, batch=8, depth=2, progress=True)
    assert len(r.steps) == 3 and len(seen) == 1
    assert seen[0].items == [0, 1, 2] and seen[0].kwargs["desc"] == "fp32"
    T.train_run(T.DEFAULT_RUNS[0], steps=2, batch=8, depth=2)
    assert len(seen) == 1  # no bar unless asked


def test_regression_task_is_linear_and_fp32_fits_it():
    x, y = T.regression_task(n=256, seed=4)
    # oracle: float64 least squares recovers the teacher with zero residual
    w, *_ = np.linalg.lstsq(x.double().numpy(), y.double().numpy(), rcond=None)
    assert np.abs(x.double().numpy() @ w - y.double().numpy()).max() < 1e-5
    run = T.train_converging(T.CONVERGING_RUNS[0], seed=0)
    assert run.loss.iloc[0] > 0.5 and run.loss.iloc[-1] < 1e-12
    assert (run.zero_frac == 0).all() and (run.scale == 1).all()


def test_fp16_without_a_scale_stalls_where_a_dynamic_scale_does_not():
    runs = {c.name: T.train_converging(c, seed=1) for c in T.CONVERGING_RUNS[1::2]}
    none, dyn = runs["fp16, no scaling"], runs["fp16, dynamic (GradScaler)"]
    assert none.zero_frac.iloc[0] < 0.01 and none.zero_frac.iloc[-1] > 0.5
    assert dyn.zero_frac.iloc[-1] == 0 and dyn.scale.iloc[-1] > dyn.scale.iloc[0]
    assert none.loss.tail(5).mean() > 3 * dyn.loss.tail(5).mean()


def test_train_converging_rejects_bad_sizes():
    with pytest.raises(ValueError, match="steps must be >= 1"):
        T.train_converging(T.CONVERGING_RUNS[0], steps=0)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        T.train_run(T.DEFAULT_RUNS[0], batch=0)
    with pytest.raises(TypeError, match="seed must be a whole number"):
        T.reference_gradients(seed=True)
    with pytest.raises(ValueError, match="lr must be > 0"):
        T.train_converging(T.CONVERGING_RUNS[0], lr=-1.0)


def test_plot_converging_draws_each_run_and_seed():
    import matplotlib
    matplotlib.use("Agg")
    frame = T.train_converging(T.CONVERGING_RUNS[0], steps=5, seed=0)
    frame2 = frame.assign(seed=1, loss=frame.loss * 2)
    fig = T.plot_converging(pd.concat([frame, frame2]))
    lines = fig.axes[0].get_lines()
    assert len(lines) == 2 and np.array_equal(lines[1].get_ydata(), frame2.loss.to_numpy())


def test_scale_history_ticks_are_whole_steps_and_exponents():
    import matplotlib
    matplotlib.use("Agg")
    import pandas as pd
    from fp16lab.training import plot_scale_history
    history = pd.DataFrame({"step": range(20), "scale": [2.0**16] * 20, "skipped": [False] * 20})
    ax = plot_scale_history(history)
    for ticks in (ax.get_xticks(), ax.get_yticks()):
        assert len(ticks) and all(float(t).is_integer() for t in ticks)

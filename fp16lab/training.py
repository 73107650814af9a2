"""Side-by-side training runs in five precisions, for notebook 02's underflow story.

The model is :func:`deep_tanh_mlp`: 28 tanh layers of width 32 with PyTorch's default ``Linear``
initialisation and no normalisation, trained with Adam (lr 1e-3) on cross-entropy averaged over
a batch of 256 (:func:`make_task`: labels from a fixed random "teacher" network). Nothing is
rigged: the default init multiplies a gradient by about ``1/sqrt(3)`` per layer on its way back
(weights ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, tanh' <= 1), so after a few dozen layers the
first layers' gradients fall below FP16's ``2**-24``. FP32 and BF16 hold them (and Adam rescales
them into full-size updates); FP16 without a loss scale flushes them to zero, and those layers
stop learning. This is the textbook deep-and-unnormalised setting where loss scaling matters.

Precisions, as a :class:`RunConfig` each (:data:`DEFAULT_RUNS`), named as in
:mod:`fp16lab.recipes`:

* ``fp32``: no autocast;
* ``amp-fp16``: ``torch.autocast(device, torch.float16)`` (FP32 weights, FP16 matmuls, FP16
  activation gradients), here also without a scaler or with a static scale
  (:class:`~fp16lab.scaling.StaticLossScaler`) to show why the recipe's ``torch.amp.GradScaler``
  (wrapped in :class:`~fp16lab.scaling.GradScalerRecorder`) is there;
* ``amp-bf16``: ``torch.autocast(device, torch.bfloat16)`` with no scaler.

The same autocast code runs on CPU (torch >= 2.4 autocasts to FP16 on CPU) and on CUDA.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import recipes, validate
from .diagnostics import GradientMonitor
from .scaling import (DEFAULT_INIT_SCALE, GradScalerRecorder, ScaleCollapseWarning, ScalerSettings,
                      StaticLossScaler)


def deep_tanh_mlp(depth: int = 28, width: int = 32, in_features: int = 32,
                  num_classes: int = 10) -> nn.Sequential:
    """Returns a plain deep MLP (Linear-Tanh x depth, then Linear) with PyTorch's default init."""
    depth, width = validate.count("depth", depth), validate.count("width", width)
    in_features = validate.count("in_features", in_features)
    num_classes = validate.count("num_classes", num_classes)
    layers: list[nn.Module] = []
    d = in_features
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.Tanh()]
        d = width
    layers.append(nn.Linear(d, num_classes))
    return nn.Sequential(*layers)


def make_task(n: int = 8192, in_features: int = 32, num_classes: int = 10, seed: int = 0
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (inputs, labels): Gaussian inputs labelled by a fixed random teacher network."""
    n, in_features = validate.count("n", n), validate.count("in_features", in_features)
    num_classes = validate.count("num_classes", num_classes)
    g = torch.Generator().manual_seed(validate.count("seed", seed, low=0))
    x = torch.randn(n, in_features, generator=g)
    w1 = torch.randn(in_features, 64, generator=g) / in_features**0.5
    w2 = torch.randn(64, num_classes, generator=g) / 8.0
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return x, y


@dataclass(frozen=True)
class RunConfig:
    """One training run: precision and loss scaling."""

    name: str
    precision: str = "fp32"          # "fp32", "amp-fp16" or "amp-bf16" (fp16lab.recipes)
    scaling: str = "none"            # "none", "static" or "dynamic"
    static_scale: float = 2.0**12
    init_scale: float = DEFAULT_INIT_SCALE
    growth_interval: int = 50        # short, so a short run shows growth (torch's default: 2000)

    def __post_init__(self):
        # fp32 changed only by autocast: what the runs compare (fp32, amp-fp16, amp-bf16)
        recipes.check_precision(self.precision, recipes.precisions(autocast_recipe=True),
                                where="in notebook 02's runs")
        validate.choice("scaling", self.scaling, ("none", "static", "dynamic"))
        validate.number("static_scale", self.static_scale, low=0, low_open=True)
        if self.scaling != "none" and self.precision != "amp-fp16":
            raise ValueError(f"loss scaling is for amp-fp16 runs; {self.name!r} is {self.precision}")
        self.scaler_settings()  # the dynamic scaler's settings are checked now

    def scaler_settings(self) -> ScalerSettings:
        """Returns the GradScaler settings of a dynamic run (torch's defaults but these two)."""
        return ScalerSettings(init_scale=self.init_scale, growth_interval=self.growth_interval)


DEFAULT_RUNS = (
    RunConfig("fp32"),
    RunConfig("fp16, no scaling", "amp-fp16"),
    RunConfig("fp16, static 2^12", "amp-fp16", "static"),
    RunConfig("fp16, dynamic (GradScaler)", "amp-fp16", "dynamic"),
    RunConfig("bf16 autocast, no scaler", "amp-bf16"),
)


@dataclass
class RunResult:
    """What one run measured: per-step losses, scales and per-parameter gradient statistics."""

    config: RunConfig
    device: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    grad_stats: Any = None            # GradientMonitor.frame() for this run
    seconds: float = 0.0


def train_run(config: RunConfig, *, steps: int = 150, batch: int = 256, seed: int = 0,
              device: str = "cpu", lr: float = 1e-3, depth: int = 28, width: int = 32,
              progress: bool = False) -> RunResult:
    """Returns the measurements of one training run of :func:`deep_tanh_mlp` on :func:`make_task`.

    Every run with the same ``seed`` starts from the same weights and sees the same batches.
    Gradient statistics come from a :class:`~fp16lab.diagnostics.GradientMonitor` (the gradients
    as they are after backward: scaled where a scaler is used, exact zeros where FP16 flushed).
    ``progress`` shows a tqdm bar over the steps.
    """
    steps, batch, seed = _sizes(steps, batch, seed)
    device, progress = validate.device("device", device), validate.boolean("progress", progress)
    validate.number("lr", lr, low=0, low_open=True)
    torch.manual_seed(seed)
    model = deep_tanh_mlp(depth, width).to(device)
    x_all, y_all = make_task(seed=seed)
    x_all, y_all = x_all.to(device), y_all.to(device)
    order = torch.Generator().manual_seed(seed + 1)
    scaler = _make_scaler(config, device)
    train, _ = recipes.make_train_step(
        config.precision, model, None, None, device=device, loss_scaler=scaler,
        optimizer=lambda params: torch.optim.Adam(params, lr=lr),
        loss_fn=lambda logits, labels: F.cross_entropy(logits.float(), labels))
    result = RunResult(config, device)
    monitor = GradientMonitor(model)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScaleCollapseWarning)
        for step in _steps(steps, progress, config.name):
            idx = torch.randint(0, x_all.shape[0], (batch,), generator=order).to(device)
            loss = train(x_all[idx], y_all[idx])
            row = {"run": config.name, "step": step, "loss": float(loss.detach())}
            row.update(_scale_used(scaler))
            result.steps.append(row)
    result.seconds = time.perf_counter() - t0
    monitor.remove()
    stats = monitor.frame()
    stats.insert(0, "run", config.name)
    result.grad_stats = stats
    return result


def _sizes(steps: Any, batch: Any, seed: Any) -> tuple[int, int, int]:
    """Returns (steps, batch, seed) checked: counts >= 1, a seed >= 0."""
    return (validate.count("steps", steps), validate.count("batch", batch),
            validate.count("seed", seed, low=0))


def _make_scaler(config: RunConfig, device: str):
    """Returns the run's loss scaler: None, a StaticLossScaler or a recorded GradScaler."""
    if config.scaling == "static":
        return StaticLossScaler(config.static_scale)
    if config.scaling == "dynamic":
        return GradScalerRecorder(recipes.grad_scaler(config.precision, device,
                                                      config.scaler_settings()))
    return None


def _scale_used(scaler) -> dict[str, Any]:
    """Returns the scale the step just taken used and whether it was skipped (1.0 and False
    without a scaler)."""
    if scaler is None:
        return {"scale": 1.0, "skipped": False}
    ev = scaler.history[-1]
    return {"scale": ev.scale, "skipped": ev.skipped}


def _steps(n: int, progress: bool, desc: str):
    """Returns range(n), wrapped in a tqdm bar when ``progress``."""
    if not progress:
        return range(n)
    from tqdm.auto import tqdm

    return tqdm(range(n), desc=desc, unit="step", leave=False)


def reference_gradients(*, batch: int = 256, seed: int = 0, device: str = "cpu",
                        depth: int = 28, width: int = 32) -> list[tuple[str, torch.Tensor]]:
    """Returns [(name, FP32 gradient on the CPU)] of every weight at the first step of
    :func:`train_run` (same initial weights and first batch), computed in FP32 without autocast
    on ``device``."""
    _, batch, seed = _sizes(1, batch, seed)
    device = validate.device("device", device)
    torch.manual_seed(seed)
    model = deep_tanh_mlp(depth, width).to(device)
    x_all, y_all = make_task(seed=seed)
    order = torch.Generator().manual_seed(seed + 1)
    idx = torch.randint(0, x_all.shape[0], (batch,), generator=order)
    F.cross_entropy(model(x_all[idx].to(device)), y_all[idx].to(device)).backward()
    return [(n, p.grad.detach().cpu()) for n, p in model.named_parameters()
            if n.endswith("weight")]


def run_side_by_side(configs=DEFAULT_RUNS, *, steps: int = 150, batch: int = 256, seed: int = 0,
                     device: str | None = None, **kwargs: Any):
    """Returns (steps DataFrame, gradient-statistics DataFrame, seconds per run) for the runs.

    ``device`` defaults to CUDA when available; ``progress=True`` shows a bar per run. The steps
    frame has run, step, loss, scale, skipped and ``zero_frac`` (fraction of all weight-gradient
    elements that are exactly zero).
    """
    import pandas as pd

    device = "cuda" if device is None and torch.cuda.is_available() else \
        "cpu" if device is None else validate.device("device", device)
    step_frames, stat_frames, seconds = [], [], {}
    for cfg in configs:
        r = train_run(cfg, steps=steps, batch=batch, seed=seed, device=device, **kwargs)
        st = pd.DataFrame(r.steps)
        g = r.grad_stats
        w = g[g.param.str.endswith("weight")]
        zeros = (w.zero_frac * w.numel).groupby(w.step).sum() / w.numel.groupby(w.step).sum()
        st["zero_frac"] = st.step.map(zeros)
        step_frames.append(st)
        stat_frames.append(g)
        seconds[cfg.name] = r.seconds
    return pd.concat(step_frames, ignore_index=True), pd.concat(stat_frames, ignore_index=True), \
        seconds


def lost_gradient_by_layer(grad_stats, run: str, last: int = 20):
    """Returns, per weight, the mean fraction of gradient elements that were exactly zero over
    the run's last ``last`` steps (a Series indexed by parameter name, in model order)."""
    g = grad_stats[(grad_stats.run == run) & grad_stats.param.str.endswith("weight")]
    if g.empty:
        raise ValueError(f"no gradient statistics for run {run!r}; runs: "
                         f"{sorted(grad_stats.run.unique())}")
    g = g[g.step >= g.step.max() - last + 1]
    order = list(dict.fromkeys(g.param))
    return g.groupby("param", sort=False).zero_frac.mean().reindex(order)


def config_table(configs=DEFAULT_RUNS):
    """Returns the run configurations as a DataFrame."""
    import pandas as pd

    return pd.DataFrame([asdict(c) for c in configs])


def plot_runs(steps, window: int = 10):
    """Returns a matplotlib Figure: loss (rolling mean over ``window`` steps) and the fraction of
    weight-gradient elements that are exactly zero, per run, over the steps."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    for i, (run, d) in enumerate(steps.groupby("run", sort=False)):
        style = dict(color=f"C{i}", lw=1.6, ls="--" if run.startswith("bf16") else "-")
        a.plot(d.step, d.loss.rolling(window, min_periods=1).mean(), label=run, **style)
        b.plot(d.step, 100 * d.zero_frac, label=run, **style)
    a.set(xlabel="step", ylabel=f"training loss ({window}-step mean)", title="loss")
    b.set(xlabel="step", ylabel="% of weight-gradient elements exactly zero",
          title="gradient lost to zeros")
    a.legend(fontsize=8)
    b.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_lost_by_layer(grad_stats, runs, last: int = 20):
    """Returns a matplotlib Figure: per weight (input side first), the % of gradient elements that
    were exactly zero over the last ``last`` steps, one bar group per run."""
    import matplotlib.pyplot as plt
    import pandas as pd

    table = pd.DataFrame({r: 100 * lost_gradient_by_layer(grad_stats, r, last) for r in runs})
    fig, ax = plt.subplots(figsize=(12, 3.5))
    table.index = [n.rsplit(".", 1)[0] for n in table.index]
    table.plot.bar(ax=ax, width=0.8)
    ax.set(xlabel="layer (Sequential index of the Linear)", ylabel="% of gradient zero",
           title=f"lost gradient per layer, last {last} steps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_scale_history(history, ax=None, title: str = "dynamic loss scale"):
    """Returns Axes with log2(scale) over steps and the skipped steps marked (a scaler's
    ``history_frame()`` or any frame with step, scale and skipped columns)."""
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3))
    ax.step(history.step, np.log2(history.scale), where="post", label="log2 scale used")
    sk = history[history.skipped.astype(bool)]
    ax.scatter(sk.step, np.log2(sk.scale), color="C3", s=14, zorder=3,
               label=f"skipped step ({len(sk)})")
    ax.set(xlabel="step", ylabel="log2 scale", title=title)
    # steps and the scale's exponents are whole numbers: no 2.5th step, no 2^15.25
    ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(plt.MaxNLocator(integer=True, min_n_ticks=1))
    ax.legend(fontsize=8)
    return ax


def adam_steps(grads, *, lr: float = 1e-3, eps: float = 1e-8) -> list[float]:
    """Returns the size of each update ``|w_after - w_before| / lr`` that ``torch.optim.Adam``
    takes on one float64 weight fed the gradients ``grads`` in turn (a zero is a gradient lost to
    underflow)."""
    w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([w], lr=lr, eps=eps)
    sizes = []
    for g in grads:
        before = w.detach().clone()
        w.grad = torch.full_like(w, float(g))
        opt.step()
        sizes.append(float((w.detach() - before).abs()) / lr)
    return sizes


# -- a model that converges: the loss falls, and the gradients with it ------------------------

#: The runs of the converging demo: the static scale is one that no gradient needs at step 0.
CONVERGING_RUNS = (
    RunConfig("fp32"),
    RunConfig("fp16, no scaling", "amp-fp16"),
    RunConfig("fp16, static 2^2", "amp-fp16", "static", static_scale=4.0),
    RunConfig("fp16, dynamic (GradScaler)", "amp-fp16", "dynamic", growth_interval=10),
)


def regression_task(n: int = 16384, in_features: int = 16, out_features: int = 256,
                    seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (inputs, targets): Gaussian inputs and a linear teacher's outputs (no noise)."""
    n, in_features = validate.count("n", n), validate.count("in_features", in_features)
    out_features = validate.count("out_features", out_features)
    g = torch.Generator().manual_seed(validate.count("seed", seed, low=0))
    x = torch.randn(n, in_features, generator=g)
    w = torch.randn(in_features, out_features, generator=g) / in_features**0.5
    return x, x @ w


def train_converging(config: RunConfig, *, steps: int = 30, batch: int = 1024, seed: int = 0,
                     lr: float | None = None, device: str = "cpu", progress: bool = False):
    """Returns a DataFrame (run, seed, step, loss, scale, skipped, zero_frac) of one run fitting
    :func:`regression_task` with a ``Linear`` layer, SGD and the mean squared error.

    The teacher is linear, so the loss falls towards 0, and every output gradient,
    ``2 (y_hat - y) / (batch * out_features)``, falls with it: the mean over that many elements puts
    it near FP16's underflow as the fit gets good (2^18 elements by default). ``lr`` defaults to ``out_features / 4``,
    which halves the error at each step (the mean over outputs divides the gradient by them).
    ``zero_frac`` is the share of the weight gradient that is exactly zero after backward.
    """
    import pandas as pd

    steps, batch, seed = _sizes(steps, batch, seed)
    device, progress = validate.device("device", device), validate.boolean("progress", progress)
    if lr is not None:
        validate.number("lr", lr, low=0, low_open=True)
    torch.manual_seed(seed)
    x_all, y_all = (t.to(device) for t in regression_task(seed=seed))
    model = nn.Linear(x_all.shape[1], y_all.shape[1]).to(device)
    order = torch.Generator().manual_seed(seed + 1)
    scaler = _make_scaler(config, device)
    zero_frac: list[float] = []

    def count_zeros() -> None:  # the gradient as backward left it (scaled where a scaler is)
        zero_frac.append(float((model.weight.grad == 0).double().mean()))

    train, _ = recipes.make_train_step(
        config.precision, model, None, None, device=device, loss_scaler=scaler,
        optimizer=lambda params: torch.optim.SGD(params, lr=lr or y_all.shape[1] / 4),
        loss_fn=lambda out, target: F.mse_loss(out.float(), target), after_backward=count_zeros)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScaleCollapseWarning)
        for step in _steps(steps, progress, f"{config.name}, seed {seed}"):
            idx = torch.randint(0, x_all.shape[0], (batch,), generator=order).to(device)
            loss = train(x_all[idx], y_all[idx])
            rows.append({"run": config.name, "seed": seed, "step": step,
                         "loss": float(loss.detach()), "zero_frac": zero_frac[-1],
                         **_scale_used(scaler)})
    return pd.DataFrame(rows)


def converging_runs(configs=CONVERGING_RUNS, *, seeds=(0, 1, 2), steps: int = 30,
                    device: str | None = None, progress: bool = False, **kwargs: Any):
    """Returns the steps of :func:`train_converging` for every run and seed, in one DataFrame."""
    import pandas as pd

    device = "cuda" if device is None and torch.cuda.is_available() else \
        "cpu" if device is None else validate.device("device", device)
    return pd.concat([train_converging(c, steps=steps, seed=s, device=device, progress=progress,
                                       **kwargs) for s in seeds for c in configs],
                     ignore_index=True)


def plot_converging(steps):
    """Returns a matplotlib Figure of :func:`converging_runs`: the loss (log scale) and the share
    of the weight gradient that is exactly zero, per run (one line per seed)."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    for i, (run, d) in enumerate(steps.groupby("run", sort=False)):
        for j, (_, s) in enumerate(d.groupby("seed")):
            label = run if j == 0 else None
            a.semilogy(s.step, s.loss, color=f"C{i}", lw=1.2, alpha=0.8, label=label)
            b.plot(s.step, 100 * s.zero_frac, color=f"C{i}", lw=1.2, alpha=0.8, label=label)
    a.set(xlabel="step", ylabel="training loss (MSE)", title="loss, one line per seed")
    b.set(xlabel="step", ylabel="% of weight gradient exactly zero", title="gradient lost to zeros")
    a.legend(fontsize=8)
    b.legend(fontsize=8)
    fig.tight_layout()
    return fig

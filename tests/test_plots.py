"""Plots draw what the oracles say: bar heights from numpy's frexp, shaded spans from finfo."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from fp16lab import plots  # noqa: E402
from fp16lab.census import census, census_model  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_plot_census_bars_and_shading():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(50_000) * 1e-3).astype(np.float32)
    x[:100] = 0
    ax = plots.plot_census(torch.from_numpy(x), formats=("fp16", "bf16"))
    bars = [p for p in ax.patches if type(p).__name__ == "Rectangle" and p.get_width() == 1.0]
    e = np.frexp(np.abs(x[x != 0]).astype(np.float64))[1] - 1
    want = {int(k): v / x.size for k, v in zip(*np.unique(e, return_counts=True))}
    got = {int(b.get_x()): b.get_height() for b in bars}
    assert got.keys() == want.keys()
    assert all(math.isclose(got[k], want[k]) for k in want)
    # shaded spans: fp16 subnormal range starts at log2 of its smallest subnormal
    fi = np.finfo(np.float16)
    spans = [p for p in ax.patches if type(p).__name__ == "Rectangle" and p not in bars]
    starts = sorted(round(p.get_x(), 6) for p in spans)
    assert math.log2(float(fi.smallest_subnormal)) in starts
    assert math.log2(float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_normal)) in starts
    assert "0.2% zeros" in " ".join(t.get_text() for t in ax.texts)


def test_plot_census_overlay_scale_and_result():
    g = np.full(1000, 2.0**-30, dtype=np.float32)
    ax = plots.plot_census({"raw": g, "scaled": census(g * 2**10)}, formats=("fp16",))
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "raw" in labels and "scaled" in labels
    ax2 = plots.plot_census(g, scale=2.0**10, ax=plt.figure().gca())
    xs = [p.get_x() for p in ax2.patches if p.get_width() == 1.0]
    assert xs == [-20.0]


def test_plot_ulp_matches_numpy_spacing():
    ax = plots.plot_ulp(("fp16",), points=500)
    line = ax.get_lines()[0]
    x, y = line.get_xdata(), line.get_ydata()
    binade = np.float16(2.0 ** np.floor(np.log2(x)))  # the power of two at or below x
    assert np.array_equal(y, np.spacing(binade).astype(np.float64))
    rel = plots.plot_ulp(("fp16",), relative=True, ax=plt.figure().gca()).get_lines()[0]
    normal = rel.get_xdata() > 2**-14
    assert np.all(rel.get_ydata()[normal] <= 2**-10) and np.all(rel.get_ydata()[normal] > 2**-11)


def _bn_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    with torch.no_grad():
        model[0].bias.zero_()  # 4 zeros beside 12 non-zero weights
    return model


def test_census_table_splits_weight_and_bias_and_weights_layers_by_count():
    model = _bn_model()
    df = census_model(model, torch.randn(8, 3), kinds="weight")
    split = plots.census_table(df, "zero", kinds=("weight",))
    # oracle: count exact zeros of each parameter with numpy
    for name, p in model.named_parameters():
        want = float(np.mean(p.detach().numpy() == 0))
        assert split.loc[name, "weight"] == want, name
    assert split.loc["1.weight", "weight"] == 0.0 and split.loc["1.bias", "weight"] == 1.0
    merged = plots.census_table(df, "zero", kinds=("weight",), split_tensors=False)
    for layer in ("0", "1"):
        values = np.concatenate([p.detach().numpy().ravel() for n, p in model.named_parameters()
                                 if n.startswith(layer + ".")])
        assert merged.loc[layer, "weight"] == float(np.mean(values == 0))
    assert merged.loc["0", "weight"] == 4 / 16  # not the unweighted (0 + 1) / 2


def test_plot_census_table_draws_the_table_and_needs_counts():
    model = _bn_model()
    df = census_model(model, torch.randn(8, 3))
    ax = plots.plot_census_table(df, "zero")
    table = plots.census_table(df, "zero")
    heights = [p.get_height() for p in ax.patches]
    want = table.to_numpy().T.ravel()  # pandas draws one kind (column) after another
    assert np.allclose(np.nan_to_num(heights), np.nan_to_num(want))
    with pytest.raises(ValueError, match=r"missing \['n'\]"):
        plots.plot_census_table(df.drop(columns="n"), "zero")


def test_plot_waves_draws_rate_and_efficiency_with_the_legend_below():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fp16lab.plots import plot_waves
    rows = [{"batch": b, "tflops": 100.0 + b / 10, "efficiency": min(1.0, b / 1024)}
            for b in range(64, 1025, 64)] + [{"batch": 1088, "tflops": 90.0, "efficiency": None}]
    ax = plot_waves(rows)
    measured = ax.get_lines()[0]
    assert list(measured.get_xdata()) == [r["batch"] for r in rows]
    twin = [a for a in ax.figure.axes if a is not ax][0]
    assert list(twin.get_lines()[0].get_xdata()) == [r["batch"] for r in rows[:-1]]
    ax.figure.canvas.draw()
    assert ax.get_legend().get_window_extent().y1 <= ax.get_window_extent().y0
    plt.close("all")

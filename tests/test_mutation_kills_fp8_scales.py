"""fp16lab.fp8.scales, beyond tests/test_fp8.py: scales against a float64 reference, the formats'
maxima against torch.finfo, delayed scaling against a plain-Python history, defaults asserted."""

from __future__ import annotations

import pytest
import torch

from fp16lab.fp8 import scales


def test_the_maxima_are_torchs():
    assert scales.fp8_max("e4m3") == torch.finfo(torch.float8_e4m3fn).max == 448.0
    assert scales.fp8_max("e5m2") == torch.finfo(torch.float8_e5m2).max == 57344.0


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_scale_from_amax_against_float64(fmt):
    top = torch.finfo(scales.DTYPES[fmt]).max
    amax = torch.tensor([3.0, 0.1, 1e-20, 0.0, 7e4])
    want = [float(torch.tensor(top / max(a, 1e-12), dtype=torch.float64).float())
            for a in amax.double().tolist()]
    assert scales.scale_from_amax(amax, fmt).tolist() == want  # default margin: none
    assert scales.scale_from_amax(amax, fmt, margin=3).tolist() == [
        float(torch.tensor(top / max(a, 1e-12) / 8, dtype=torch.float64).float())
        for a in amax.double().tolist()]
    assert scales.scale_from_amax(amax, fmt).dtype == torch.float32
    assert scales.EPS == 1e-12


def test_scale_from_amax_refuses_what_is_not_an_absolute_maximum():
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="amax must be >= 0"):
            scales.scale_from_amax(torch.tensor([1.0, bad]), "e4m3")
    with pytest.raises(ValueError):
        scales.scale_from_amax(torch.tensor(1.0), "e4m3", margin=-1)


def test_current_scaling_puts_the_largest_magnitude_on_the_maximum():
    torch.manual_seed(0)
    x = torch.randn(8, 256, dtype=torch.float32) * 3
    q = scales.quantize(x, "e4m3")
    assert q.scale.shape == (1, 1)
    assert float(q.scale) == pytest.approx(448.0 / float(x.abs().max()), rel=1e-6)
    i = int(x.abs().argmax())
    assert abs(float(q.data.flatten()[i].float())) == 448.0
    back = scales.dequantize(q).double()
    # e4m3 keeps 3 mantissa bits: each value within half an ulp, 2^-4 relative (normal range)
    big = x.abs() > float(x.abs().max()) / 64
    assert ((back - x.double()).abs()[big] <= x.double().abs()[big] * 2.0 ** -4).all()


def test_rowwise_gives_one_scale_per_row_and_the_other_operand_its_transpose():
    x = torch.tensor([[1.0, -2.0, 0.5, 0.0], [10.0, 3.0, -40.0, 1.0]])
    q = scales.quantize(x, "e4m3", "rowwise")
    assert q.scale.flatten().tolist() == pytest.approx([448 / 2.0, 448 / 40.0])
    qt = scales.quantize(x, "e4m3", "rowwise", contraction_dim=0)
    assert qt.scale.flatten().tolist() == pytest.approx([448 / 10, 448 / 3, 448 / 40, 448 / 1])


def test_a_given_scale_saturates_by_default_instead_of_giving_nan():
    x = torch.tensor([[1.0, 1000.0]])
    q = scales.quantize(x, "e4m3", scale=torch.ones(1, 1))
    assert q.data.float().tolist() == [[1.0, 448.0]]
    raw = scales.quantize(x * 4, "e4m3", scale=torch.full((1, 1), 0.5), saturate=False)
    # unclamped: what torch's own cast gives for x * 4 * 0.5, whatever it does beyond 448
    assert torch.equal(raw.data.view(torch.uint8), (x * 2).to(torch.float8_e4m3fn).view(torch.uint8))
    for bad in (0.0, float("inf"), float("nan"), -1.0):
        with pytest.raises(ValueError, match="scale must be finite and > 0"):
            scales.quantize(x, "e4m3", scale=torch.full((1, 1), bad))


def test_delayed_scaling_against_a_plain_history():
    d = scales.DelayedScaling()
    assert (d.fmt, d.history_len, d.margin, float(d.scale), d.steps) == ("e4m3", 16, 0, 1.0, 0)
    amaxes = [2.0, 0.5, 8.0] + [1.0] * 20
    history: list[float] = []
    for k, a in enumerate(amaxes):
        history = ([a] + history)[:16]
        got = float(d.update(a))
        assert got == pytest.approx(448.0 / max(history), rel=1e-6), k
    assert d.steps == len(amaxes)
    assert float(d.scale) == pytest.approx(448.0)  # the 8.0 left the 16-step window
    m = scales.DelayedScaling("e5m2", history_len=2, margin=1)
    assert float(m.update(4.0)) == pytest.approx(57344 / 4 / 2)


def test_delayed_scaling_keeps_its_scale_when_the_history_says_nothing():
    d = scales.DelayedScaling(history_len=2)
    assert float(d.update(0.0)) == 1.0  # nothing recorded yet: the scale stays 1
    assert float(d.update(4.0)) == pytest.approx(112.0)
    assert float(d.update(float("inf"))) == pytest.approx(112.0)  # an inf in the history: kept
    for bad in dict(history_len=0), dict(margin=-1), dict(history_len=1.5):
        with pytest.raises(ValueError):
            scales.DelayedScaling(**bad)
    assert repr(scales.DelayedScaling()) == "DelayedScaling(e4m3, history_len=16, margin=0, scale=1, steps=0)"


def test_a_given_scale_is_checked_as_the_float32_it_is_used_as():
    x = torch.ones(1, 2)
    # positive and finite in float64, but 0 and inf once float32, the dtype the cast uses
    for bad in (1e-50, 1e39):
        with pytest.raises(ValueError, match="scale must be finite and > 0"):
            scales.quantize(x, "e4m3", scale=torch.full((1, 1), bad, dtype=torch.float64))
    q = scales.quantize(x, "e4m3", scale=torch.full((1, 1), 2.0, dtype=torch.float64))
    assert q.data.float().tolist() == [[2.0, 2.0]] and q.scale.dtype == torch.float32


def test_a_whole_dimension_tile_of_an_empty_dimension_is_one_long():
    assert scales.tile_shape("tensorwise", (0, 4)) == (1, 4)
    assert scales.tile_shape("rowwise", (3, 0)) == (1, 1)
    assert scales.tile_shape("rowwise", (0, 256), contraction_dim=0) == (1, 1)
    q = scales.quantize(torch.empty(0, 4), "e4m3")
    assert q.data.shape == (0, 4) and q.tile == (1, 4) and q.scale.shape == (0, 1)

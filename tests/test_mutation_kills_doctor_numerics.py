"""fp16lab.doctor.numerics, piece by piece: the helpers under module_numerics against hand
computations and torch's own casts (what the mutation run found untested)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fp16lab.doctor import numerics as N
from fp16lab.workload import Workload
from fp16lab.workloads.batches import synthetic_batch


def test_row_names_every_figure():
    m = N.ModuleNumerics("blk.fc", "Linear", act_max=3.0, act_overflow=0.25, act_count=8,
                         grad_max=0.5, local_error=0.01, grad_error=0.02)
    assert m.row() == {"module": "blk.fc", "kind": "Linear", "act_max": 3.0,
                       "act_overflow": 0.25, "grad_max": 0.5, "local_error": 0.01,
                       "grad_error": 0.02}


def test_first_tensor_finds_the_first_tensor_in_nested_outputs():
    a, b = torch.ones(1), torch.zeros(2)
    assert N._first_tensor(a) is a
    assert N._first_tensor((None, 3, [None, b], a)) is b
    assert N._first_tensor([]) is None and N._first_tensor("text") is None
    assert N._first_tensor({"logits": None, "loss": a, "x": b}) is a

    class Output:  # transformers' ModelOutput: a mapping with .values()
        def values(self):
            return [None, b]
    assert N._first_tensor(Output()) is b

    class Broken:
        def values(self):
            raise TypeError("not a mapping")
    assert N._first_tensor(Broken()) is None


def test_exp_hist_counts_frexp_exponents_of_finite_non_zero_values():
    x = torch.tensor([0.75, -0.5, 1.0, 3.0, 0.0, math.inf, math.nan])
    h = N._exp_hist(x)
    assert h.shape == (N.EXP_HIGH - N.EXP_LOW + 1,) and int(h.sum()) == 4
    # frexp: 0.75 = 0.75 * 2^0, 0.5 = 0.5 * 2^0, 1.0 = 0.5 * 2^1, 3.0 = 0.75 * 2^2
    assert int(h[0 - N.EXP_LOW]) == 2 and int(h[1 - N.EXP_LOW]) == 1
    assert int(h[2 - N.EXP_LOW]) == 1


def test_underflow_share_matches_the_cast_value_by_value():
    """Values away from FP16's rounding ties, one per binade around the line: the share the
    histogram gives is the share torch's float16 cast flushes, at each scale."""
    x = torch.tensor([1.25 * 2.0**-28, 1.25 * 2.0**-27, 1.25 * 2.0**-26, 1.25 * 2.0**-25,
                      1.25 * 2.0**-24, 1.0])
    h = N._exp_hist(x)
    for k in range(0, 6):
        flushed = float(((x * 2.0**k).to(torch.float16) == 0).float().mean())
        assert N.underflow_share(h, 2.0**k) == pytest.approx(flushed), k
    assert N.underflow_share(h, 1.0) == pytest.approx(3 / 6)
    assert N.underflow_share(h, 2.0**-200) == 1.0  # the cut past the histogram's end
    assert N.underflow_share(None, 1.0) == 0.0
    assert N.underflow_share(torch.zeros(5, dtype=torch.long), 1.0) == 0.0
    with pytest.raises(ValueError, match="scale"):
        N.underflow_share(h, 0.0)


def test_reached_scale_halves_until_the_largest_gradient_fits():
    assert N.reached_scale(65504 / 2.0**16) == 2.0**16          # exactly at FP16's max: fits
    assert N.reached_scale(65504 / 2.0**16 * 1.001) == 2.0**15
    assert N.reached_scale(1.0, init_scale=2.0**20) == 2.0**15
    assert N.reached_scale(math.inf) == 2.0**16 and N.reached_scale(-1.0, 8.0) == 8.0
    assert N.reached_scale(1e30) == 2.0**-24                     # stops at its floor
    assert N.fitting_scale(65504 / 2) == 1.0 and N.fitting_scale(0.0) == 2.0**16


def test_relative_error_and_its_degenerate_cases():
    ref = torch.tensor([3.0, 4.0])
    assert N._relative(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.5 / 5)
    assert N._relative(torch.tensor([math.inf, 0.0]), ref) == math.inf
    assert N._relative(torch.tensor([3.0, 4.0]), torch.zeros(2)) == 5.0


def test_as_dtype_copies_and_leaves_non_tensors():
    x = torch.ones(3)
    y = N._as_dtype(x, torch.float32)
    assert y is not x and torch.equal(y, x)
    y.add_(1)
    assert torch.equal(x, torch.ones(3))  # the model's tensor is untouched
    assert N._as_dtype(x, torch.float16).dtype == torch.float16
    assert N._as_dtype(x, None) is x and N._as_dtype(5, torch.float16) == 5


def test_replay_casts_keeps_extra_arguments_and_leaves_the_random_state():
    drop = nn.Dropout(0.5)
    x = torch.ones(1000)
    state = N._rng_state(torch.device("cpu"))
    assert state[1] is None and torch.equal(state[0], torch.get_rng_state())
    assert not N._drew_random(state, torch.device("cpu")) and not N._drew_random(None, "cpu")
    drop(x)
    assert N._drew_random(state, torch.device("cpu"))     # the dropout drew its mask
    after = torch.get_rng_state()
    again = N._replay(drop, (x,), {}, (torch.bfloat16,), "amp-bf16", torch.device("cpu"), True)
    assert again.dtype == torch.bfloat16 and torch.equal(again, x.bfloat16())  # eval: identity
    assert drop.training                                  # its training mode put back
    assert torch.equal(torch.get_rng_state(), after)      # and the state it found
    drew = N._replay(drop, (x,), {}, (torch.float32,), "amp-bf16", torch.device("cpu"), False)
    assert 300 < int((drew == 0).sum()) < 700             # in training mode it draws a mask
    assert torch.equal(torch.get_rng_state(), after)
    assert N._dtypes_of((x, x.half(), torch.ones(2, dtype=torch.long), 3)) == \
        (torch.float32, torch.float16, None, None)

    def add(a, b, scale=1.0):
        return (a + b) * scale
    mod = type("Add", (nn.Module,), {"forward": lambda self, a, b, scale=1.0: add(a, b, scale)})()
    out = N._replay(mod, (torch.ones(2), torch.ones(2)), {"scale": 3.0}, (torch.float16,),
                    "amp-bf16", torch.device("cpu"))
    assert torch.equal(out, torch.full((2,), 6.0))        # b passed through, scale kept

    class Fails(nn.Module):
        def forward(self, a):
            raise RuntimeError("once only")
    assert N._replay(Fails(), (x,), {}, (None,), "amp-bf16", torch.device("cpu")) is None


def test_input_dtypes_are_what_autocast_hands_each_leaf():
    w = Workload(name="two", build=lambda: nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8),
                                                         nn.Linear(8, 4)),
                 batch=synthetic_batch((8,), 4))
    numerics = {m.name: m for m in N.module_numerics(w, "cpu", 4, low="amp-bf16")}
    assert list(numerics) == ["0", "1", "2"] and numerics["0"].kind == "Linear"
    assert all(m.act_count == 4 * (8 if m.name != "2" else 4) for m in numerics.values())
    # under bf16 autocast each Linear's output is bf16 (the LayerNorm's input: 2^-8 rounding)
    assert 0 < numerics["0"].local_error < 2.0**-6
    assert numerics["2"].grad_error is not None and numerics["2"].grad_error < 2.0**-5
    assert N.dtype_scaled("amp-fp16") and not N.dtype_scaled("amp-bf16")

"""Notebook 09's exercises with right and wrong answers; the right ones computed here with ml_dtypes."""

import ml_dtypes
import torch

from fp16lab import fp8
from fp16lab.exercises import ch09

E4M3 = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
E5M2 = float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max)


def test_q1_tensorwise_scale():
    assert ch09.q1.check(E4M3 / 3.5) and ch09.q1.check(str(E4M3 / 3.5))
    assert "e5m2" in ch09.q1.check(E5M2 / 3.5).message
    assert "inverse" in ch09.q1.check(3.5 / E4M3).message
    assert not ch09.q1.check(100) and "give a number" in ch09.q1.check("lots").message
    assert not ch09.q1.check(float("inf"))


def test_q3_delayed_scale_after_a_history():
    s = fp8.DelayedScaling("e4m3", history_len=3)
    for a in (2.0, 8.0, 1.0, 1.0, 0.5):
        s.update(a)
    assert s.scale.item() == E4M3 / 1.0
    assert ch09.q3.check(s.scale.item())
    assert "current scaling" in ch09.q3.check(E4M3 / 0.5).message
    assert "has left it" in ch09.q3.check(E4M3 / 8.0).message
    assert not ch09.q3.check(1.0)


def test_q4_current_scale_function():
    assert ch09.q4.check(lambda x: E4M3 / x.abs().max())
    assert ch09.q4.check(lambda x: fp8.quantize(x, "e4m3").scale)
    assert "inverse" in ch09.q4.check(lambda x: x.abs().max() / E4M3).message
    assert "mean" in ch09.q4.check(lambda x: E4M3 / x.abs().mean()).message
    assert "negative" in ch09.q4.check(lambda x: E4M3 / x.max()).message
    assert not ch09.q4.check(lambda x: E5M2 / x.abs().max())
    assert "give a function" in ch09.q4.check(448).message


def test_q2_gradient_format_per_granularity():
    assert ch09.q2.check(("e5m2", "e4m3")) and ch09.q2.check([" E5M2 ", "e4m3"])
    per_tensor_e4m3 = ch09.q2.check(("e4m3", "e4m3"))
    assert not per_tensor_e4m3 and "binades" in per_tensor_e4m3.message
    assert "one scale per tensor" in per_tensor_e4m3.message
    per_row_e5m2 = ch09.q2.check(("e5m2", "e5m2"))
    assert not per_row_e5m2 and "mantissa bit" in per_row_e5m2.message
    assert not ch09.q2.check(("e4m3", "e5m2"))
    assert "pair of formats" in ch09.q2.check("e5m2").message
    assert "'e4m3' or 'e5m2'" in ch09.q2.check(("fp16", "e4m3")).message


def test_every_exercise_has_hint_and_solution():
    for q in (ch09.q1, ch09.q3, ch09.q4, ch09.q2):
        assert q.hint().message and q.solution().message
        assert q.check().kind == "missing"


# -- delayed: the learner's delayed-scaling update -------------------------------------------------
def test_delayed_matches_the_package_and_says_what_is_wrong():
    import numpy as np
    import torch

    from fp16lab import fp8
    from fp16lab.exercises import ch09 as c9

    for amaxes, n, margin, _ in c9.DELAYED_CASES:  # the reference against fp8.DelayedScaling
        s, want = fp8.DelayedScaling("e4m3", history_len=n, margin=margin), []
        for a in amaxes:
            want.append(float(s.scale))
            s.update(torch.tensor(a))
        assert np.allclose(c9.reference_delayed_scales(amaxes, n, margin), want)
    assert c9.delayed.check(c9.reference_delayed_scales)

    def own_amax(amaxes, n, margin=0):
        return [448 / max(amaxes[max(0, t + 1 - n):t + 1]) / 2 ** margin for t in range(len(amaxes))]

    def whole_history(amaxes, n, margin=0):
        return c9.reference_delayed_scales(amaxes, len(amaxes), margin)

    def no_margin(amaxes, n, margin=0):
        return c9.reference_delayed_scales(amaxes, n, 0)

    def no_guard(amaxes, n, margin=0):
        out, scale = [], 1.0
        for t in range(len(amaxes)):
            out.append(scale)
            top = max(amaxes[max(0, t + 1 - n):t + 1])
            scale = 448 / top / 2 ** margin if top else float("inf")
        return out

    for fn, words in ((own_amax, "its own amax"), (whole_history, "only the last"),
                      (no_margin, "2**margin"), (no_guard, "keep the previous scale"),
                      (lambda a, n, m: a[:-1], "one scale per step"),
                      (lambda a, n, m: None, "returns nothing yet")):
        result = c9.delayed.check(fn)
        assert not result and words in result.message, (fn, result.message)

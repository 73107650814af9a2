"""Notebook 04's checks with answers rounded the way a learner writes them (two or three
figures), and q1's wrong point named when two recorded points lie close together."""

import itertools

from fp16lab.exercises import ch04 as ex


def _message(q, answer) -> str:
    fb = q.check(answer)
    assert not fb
    return fb.message


def _ratios():
    rows = ex._reference()
    sps = lambda b, lay, p: ex._samples_per_s(rows, "resnet50", b, lay, p)  # noqa: E731
    right = sps(256, "channels_last", "amp-fp16") / sps(256, "channels_last", "fp32")
    tf32 = sps(256, "channels_last", "amp-fp16") / sps(256, "channels_last", "tf32")
    others = []
    for b, lay, p in ex._q1_neighbours():
        try:
            others.append((sps(b, lay, p) / sps(b, lay, "fp32"), b, lay, p))
        except ex.Wrong:  # a point the reference sweep did not run
            continue
    return right, tf32, others


def test_q1_rounded_inverse_and_tf32_ratios_are_recognised():
    right, tf32, _ = _ratios()
    inverse = round(1 / right, 2)
    assert abs(inverse * right - 1) > 1e-3  # rounding moved it: only the tolerance matches
    assert _message(ex.q1, inverse) == (f"{inverse:.2f} is fp32 over AMP; a speed-up is AMP's "
                                        "samples/s over fp32's.")
    over_tf32 = round(tf32, 1)
    assert _message(ex.q1, over_tf32) == (f"{over_tf32:.2f} is AMP over tf32; the question's "
                                          "baseline is fp32 (TF32 off).")


def test_q1_between_two_close_points_the_nearer_is_named():
    _, _, others = _ratios()
    (a, *pa), (b, *pb) = min(itertools.combinations(sorted(others), 2),
                             key=lambda pair: pair[1][0] - pair[0][0])
    assert b - a < 0.01 * a  # two recorded points within 1% of each other
    value = b - 0.1 * (b - a)  # nearer the larger one, within 1% of both
    batch, layout, precision = pb
    assert _message(ex.q1, value) == (f"{value:.2f} is {precision} over fp32 at batch {batch}, "
                                      f"{layout}; the question asks for amp-fp16 at batch 256, "
                                      "channels_last.")


def test_q3_rounded_answers_get_their_verdicts():
    xs = sorted(ex.Q3_REPEAT_MS)
    right = (xs[-1] - xs[0]) / xs[1]
    assert ex.q3.check(round(right, 4)) and round(right, 4) != right
    percent = round(100 * right, 2)
    assert _message(ex.q3, percent) == f"{percent:g} is a percentage; give a fraction."
    mean = round((xs[-1] - xs[0]) / (sum(xs) / 3), 4)
    assert _message(ex.q3, mean) == (f"{mean:.4f} divides by the mean; the sweep divides by the "
                                     "median repeat.")
    assert _message(ex.q3, "a lot") == "give the spread as a fraction such as 0.02, not 'a lot'."


def test_q1_a_batch_64_point_is_named_too():
    _, _, others = _ratios()
    ratio, batch, layout, precision = min(o for o in others if o[1] == 64)
    near = [o for o in others if abs(o[0] / ratio - 1) < 0.01]
    assert len(near) == 1  # no other recorded point within 1%
    assert _message(ex.q1, ratio) == (f"{ratio:.2f} is {precision} over fp32 at batch 64, "
                                      f"{layout}; the question asks for amp-fp16 at batch 256, "
                                      "channels_last.")

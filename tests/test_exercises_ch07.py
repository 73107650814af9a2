"""Notebook 07's exercises, each with right and wrong answers."""

import math

import numpy as np

from fp16lab.exercises import ch07


def test_q1_training_rate_function():
    assert ch07.q1.check(lambda loader, model: min(loader, model))
    assert ch07.q1.check(lambda a, b: float(np.minimum(a, b)))
    added = ch07.q1.check(lambda a, b: 1 / (1 / a + 1 / b))
    assert not added and "overlap" in added.message
    faster = ch07.q1.check(lambda a, b: max(a, b))
    assert not faster and "slower one sets the pace" in faster.message
    only_loader = ch07.q1.check(lambda a, b: a)  # right for some pairs only
    assert not only_loader and "faster side" in only_loader.message
    mean = ch07.q1.check(lambda a, b: (a + b) / 2)
    assert not mean and "Which side waits" in mean.message
    summed = ch07.q1.check(lambda a, b: a + b)
    assert not summed and "added the two rates" in summed.message
    assert "ceiling" in ch07.q1.check(lambda a, b: min(a, b)).message
    assert "without calling it" in ch07.q1.check(800.0).message
    assert "two arguments" in ch07.q1.check(lambda a: a).message
    assert "return a number" in ch07.q1.check(lambda a, b: "fast").message
    assert "replace the ..." in ch07.q1.check(lambda a, b: ...).message


def test_q2_speed_up_on_real_input():
    right = min(800, 3000) / min(800, 600)
    assert ch07.q2.check(right) and ch07.q2.check(f"{right:.3f}")
    model_only = ch07.q2.check(3000 / 600)
    assert not model_only and "model's own speed-up" in model_only.message
    both_at_pipeline = ch07.q2.check(1.0)
    assert not both_at_pipeline and "slower side" in both_at_pipeline.message
    inverse = ch07.q2.check(600 / 800)
    assert not inverse and "fp32's rate over AMP's" in inverse.message
    against_pipeline = ch07.q2.check(3000 / 800)
    assert not against_pipeline and "Compare the two training loops" in against_pipeline.message
    other = ch07.q2.check(800 / 600 * 1.1)
    assert not other and "training_rate (q1)" in other.message
    assert "give a number" in ch07.q2.check("fast").message


def test_q3_workers_needed():
    right = math.ceil(3000 / 210)
    assert ch07.q3.check(right)
    short = ch07.q3.check(right - 1)
    assert not short and "the GPU would wait" in short.message
    assert "fewer" in ch07.q3.check(right + 3).message
    assert not ch07.q3.check(float(right)) and not ch07.q3.check(True)


def test_q4_batch_bytes():
    elements = 256 * 3 * 224 * 224
    assert ch07.q4.check((elements * 4 / 1e6, elements / 1e6))
    assert ch07.q4.check([154.1, 38.5])
    mib = ch07.q4.check((elements * 4 / 2**20, elements / 2**20))
    assert not mib and "MiB" in mib.message
    assert not ch07.q4.check((elements * 2 / 1e6, elements / 1e6))  # fp16 size, not float32
    assert not ch07.q4.check((elements * 4 / 1e6, elements * 4 / 1e6))
    assert "two numbers" in ch07.q4.check(154.1).message
    assert "must be numbers" in ch07.q4.check(("a", "b")).message


def test_solutions_and_hints_are_given_on_request():
    for q in (ch07.q1, ch07.q2, ch07.q3, ch07.q4):
        assert q.hint().kind == "hint" and q.hint().message
        assert q.solution().kind == "solution" and q.solution().message
    assert "min(" in ch07.q1.solution().code

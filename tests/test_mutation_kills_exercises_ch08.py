"""Notebook 08's number checks with the slips written a little off, as a learner rounds them:
each gets the same message as the exact slip (the numbers in it aside)."""

import math
import re

import pytest

from fp16lab.exercises import ch08 as ex

EFF = ex.Q3_TWO / (2 * ex.Q3_ONE)
RING_MS = (ex.Q4_PARAMS * 4 * 2 * (ex.Q4_RANKS - 1) / ex.Q4_RANKS) / (ex.Q4_BUS_GBS * 1e9) * 1e3


def _words(message: str) -> str:
    return re.sub(r"-?\d[\d.,e+-]*", "#", message)


@pytest.mark.parametrize("q, slip, off", [
    (ex.q3, ex.Q3_TWO / ex.Q3_ONE, 1.0015),       # the speed-up, within 0.2%
    (ex.q3, EFF * 100, 1.0015),                    # a percentage
    (ex.q3, 1 - EFF, 1.0015),                      # the share that goes missing
    (ex.q3, 1 / EFF, 1.0015),                      # upside down
    (ex.q3, (ex.Q3_TWO - ex.Q3_ONE) / ex.Q3_ONE, 1.0015),  # what the second GPU added
    (ex.q4, ex.Q4_PARAMS * 4 / (ex.Q4_BUS_GBS * 1e9) * 1e3, 1.008),  # one pass over the buffer
    (ex.q4, RING_MS / 2, 1.008),                   # 2-byte gradients
    (ex.q4, RING_MS / 1e3, 1.008),                 # seconds
])
def test_a_slip_a_little_off_gets_the_slips_message(q, slip, off):
    exact, rounded = q.check(slip), q.check(slip * off)
    assert not exact and not rounded
    assert _words(rounded.message) == _words(exact.message)


def test_q4_within_one_percent_is_right():
    assert math.isclose(RING_MS, 5.25, rel_tol=1e-9)
    assert ex.q4.check(RING_MS * 1.009) and not ex.q4.check(RING_MS * 1.011)


def test_q1_inf_as_a_word_and_a_value_near_the_fp32_mean():
    assert ex.q1.check("inf") and ex.q1.check(" +Inf ") and ex.q1.check(float("inf"))
    assert not ex.q1.check(float("-inf"))
    mean = sum(ex.Q1_GRADS) / 2
    assert _words(ex.q1.check(mean * 1.0005).message) == _words(ex.q1.check(mean).message)

"""Exercises of notebook 08: right answers pass, each typical wrong answer gets its own message."""

from __future__ import annotations

import torch

from fp16lab.exercises import ch08


def test_q1_scaling_efficiency():
    assert ch08.q1.check(ch08.Q1_TWO / (2 * ch08.Q1_ONE))
    assert ch08.q1.check(round(ch08.Q1_TWO / (2 * ch08.Q1_ONE), 3))
    assert "speed-up" in ch08.q1.check(ch08.Q1_TWO / ch08.Q1_ONE).message
    assert "percentage" in ch08.q1.check(100 * ch08.Q1_TWO / (2 * ch08.Q1_ONE)).message
    right = ch08.Q1_TWO / (2 * ch08.Q1_ONE)
    f = ch08.q1.check(1 - right)
    assert not f and "missing" in f.message
    f = ch08.q1.check(1 / right)
    assert not f and "upside down" in f.message
    f = ch08.q1.check((ch08.Q1_TWO - ch08.Q1_ONE) / ch08.Q1_ONE)
    assert not f and "second GPU added" in f.message
    f = ch08.q1.check(0.5)
    assert not f and "twice the 1-GPU rate" in f.message
    assert "give a number" in ch08.q1.check("fast").message
    assert ch08.q1.check().kind == "missing"


def test_q2_ring_allreduce_time():
    nbytes = 300e6 * 4
    right_ms = 2 * 7 / 8 * nbytes / 400e9 * 1e3  # 5.25 ms, by hand
    assert ch08.q2.check(right_ms)
    assert ch08.q2.check(5.25)
    assert "2 (n-1)/n" in ch08.q2.check(nbytes / 400e9 * 1e3).message
    assert "2-byte" in ch08.q2.check(right_ms / 2).message
    assert "milliseconds" in ch08.q2.check(right_ms / 1e3).message
    assert not ch08.q2.check(1.0)


def test_q3_fp16_hook_overflows_before_dividing():
    # torch's own casts as the oracle: fp16(70000) is inf, so the hook's average is inf
    wire = torch.tensor(ch08.Q3_GRADS, dtype=torch.float32).to(torch.float16).div_(2)
    expected = float(wire.sum())
    assert expected == float("inf")
    assert ch08.q3.check(expected)
    assert ch08.q3.check("inf")
    assert "fp32 average" in ch08.q3.check(60000.0).message
    assert not ch08.q3.check(65504.0)


def test_q4_every_rank_skips():
    assert ch08.q4.check({0, 1})
    assert ch08.q4.check([1, 0])
    assert "all-reduced" in ch08.q4.check({1}).message
    assert "someone must skip" in ch08.q4.check(set()).message
    assert not ch08.q4.check({0})
    assert "set of integers" in ch08.q4.check(1).message


def test_hints_and_solutions_are_there():
    for q in (ch08.q1, ch08.q2, ch08.q3, ch08.q4):
        assert q.hint().message and q.solution().message

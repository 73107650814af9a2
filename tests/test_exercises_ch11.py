"""Notebook 11's exercises: which BF16 weights swallow an update, and stochastic rounding."""

from __future__ import annotations

import torch

from fp16lab.exercises import ch11
from fp16lab.state16 import stochastic_round_bf16


def test_q1_right_answer_is_what_bf16_does():
    w = torch.tensor(ch11.Q1_WEIGHTS, dtype=torch.bfloat16)
    stuck = {i for i, (a, b) in enumerate(zip(w.float(), (w.float() + ch11.Q1_UPDATE).to(torch.bfloat16)))
             if a == b.float()}
    assert stuck == {0, 2, 3, 5}
    assert ch11.q1.check(stuck)
    assert ch11.q1.check([5, 3, 2, 0])


def test_q1_wrong_answers_say_which_weight_and_why():
    missing = ch11.q1.check({0, 2, 3}).message  # forgot 3.0
    assert not ch11.q1.check({0, 2, 3}) and "left out index 5 (3)" in missing
    assert "2^-6 apart" in missing and "vanishes" in missing
    extra = ch11.q1.check({0, 1, 2, 3, 5}).message  # 0.01 moves
    assert "included index 1 (0.01)" in extra and "2^-14 apart" in extra and "moves it" in extra
    assert "index 9" in ch11.q1.check({0, 2, 3, 5, 9}).message
    assert "index 7 is not one" in ch11.q1.check({7}).message
    assert "whole numbers" in ch11.q1.check("abc").message


def _reference(x):
    return stochastic_round_bf16(x)


def test_q2_takes_stochastic_rounding():
    assert ch11.q2.check(_reference)


def test_q2_refuses_nearest_truncation_and_the_wrong_dtype():
    nearest = ch11.q2.check(lambda x: x.to(torch.bfloat16)).message
    assert "probability 0.125" in nearest and "0.000" in nearest
    truncated = ch11.q2.check(
        lambda x: (x.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)).message
    assert "probability" in truncated
    assert "bfloat16 tensor" in ch11.q2.check(lambda x: x).message
    always_up = ch11.q2.check(lambda x: ((x.view(torch.int32) + 65535) & -65536)
                              .view(torch.float32).to(torch.bfloat16))
    assert not always_up
    assert "function" in ch11.q2.check(3).message


def test_q3_memory_table():
    from fp16lab.state16 import bytes_per_parameter
    assert bytes_per_parameter("fp32-master") == 16 and bytes_per_parameter("bf16-kahan") == 14
    assert ch11.q3.check((112, 14))
    assert ch11.q3.check([112.0, 14.0])
    gib = ch11.q3.check((112e9 / 2**30, 14))
    assert not gib and "GiB" in gib.message
    no_grad = ch11.q3.check((84, 14))
    assert not no_grad and "gradients" in no_grad.message
    buffer = ch11.q3.check((112, 28))
    assert not buffer and "Kahan buffer" in buffer.message
    assert "is right" in ch11.q3.check((112, 20)).message
    assert not ch11.q3.check((100, 14)) and not ch11.q3.check("112 GB")
    assert "112 GB" in ch11.q3.solution().message

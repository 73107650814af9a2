"""ch11's checkers, every message and threshold pinned: a near-miss answer for each bound."""

from __future__ import annotations

import torch

from fp16lab.exercises import ch11


def test_q1_messages_word_for_word():
    assert ch11.q1.check({0, 2, 3, 5}).message == (
        "right: [0, 2, 3, 5]. An update vanishes where it is below half the weight's spacing, "
        "2^(exponent - 8): the larger the weight, the larger the update it needs.")
    assert ch11.q1.check({0, 2, 3}).message == (
        "you left out index 5 (3): its BF16 neighbours are 2^-6 apart, so an update of 0.001 "
        "is below half that (2^-7) and vanishes.")
    assert ch11.q1.check({0, 1, 2, 3, 5}).message == (
        "you included index 1 (0.01), but its BF16 neighbours are 2^-14 apart: an update of "
        "0.001 reaches half that (2^-15) and moves it.")
    assert ch11.q1.check({6}).message == "index 6 is not one of the weights (0 to 5)."
    assert ch11.q1.check({-1}).message == "index -1 is not one of the weights (0 to 5)."
    assert "not float" in ch11.q1.check(3.5).message


def _biased(bias_above_half: float):
    """Rounds each column up in exactly round(n * (fraction + bias)) of its rows, the bias
    only for values whose fraction is above one half: a deterministic near miss."""
    def f(x: torch.Tensor) -> torch.Tensor:
        bits = x.view(torch.int32)
        low = (bits & -65536).view(torch.float32)
        high = ((bits & -65536) + 65536).view(torch.float32)
        frac = (bits & 0xFFFF).double() / 65536
        out = low.clone()
        n = x.shape[0]
        for j in range(x.shape[1]):
            fj = float(frac[0, j])
            k = round(n * (fj + (bias_above_half if fj > 0.5 else 0.0)))
            out[:k, j] = high[:k, j]
        return out.to(torch.bfloat16)
    return f


def test_q2_rejects_a_bias_just_above_six_sigma_and_takes_the_exact_rates():
    exact = ch11.q2.check(_biased(0.0))
    assert exact and exact.message == (
        "right: each value went to one of its two BF16 neighbours, away from zero with "
        "probability equal to its distance from the nearer-to-zero one over their spacing, so "
        "on average the rounding adds nothing.")
    # x = 0.1 has fraction 0.8: six sigma over 20,000 draws is 0.0170; 0.018 is caught
    near = ch11.q2.check(_biased(0.018))
    assert not near and "x = 0.1 went to the neighbour away from zero in 0.818" in near.message
    assert "probability 0.800" in near.message


def test_q2_names_what_came_back_and_what_is_not_a_neighbour():
    assert ch11.q2.check(lambda x: x).message.endswith("it returned torch.float32.")
    assert ch11.q2.check(lambda x: [1.0]).message.endswith("it returned list.")
    zeros = ch11.q2.check(lambda x: torch.zeros_like(x, dtype=torch.bfloat16)).message
    assert zeros == "x = 1 should round only to its two BF16 neighbours [1]; got [0]."
    assert ch11.q2.check(3).message == ("give a function f(x) that returns x rounded to "
                                        "bfloat16, not int.")


def test_q2_checks_subnormals():
    def flush(x: torch.Tensor) -> torch.Tensor:  # right, except that subnormals become zero
        good = stochastic_round(x)
        return torch.where(x.abs() < 2.0**-126, torch.zeros_like(good), good)
    assert "should round only to its two BF16 neighbours" in ch11.q2.check(flush).message


def test_q2_checks_negative_values_too():
    def wrong_for_negatives(x: torch.Tensor) -> torch.Tensor:  # truncates them toward zero
        good = stochastic_round(x)
        cut = (x.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)
        return torch.where(x < 0, cut, good)
    msg = ch11.q2.check(wrong_for_negatives).message
    assert msg.startswith("x = -3.01953 went to the neighbour away from zero in 0.000")


def stochastic_round(x):
    from fp16lab.state16 import stochastic_round_bf16
    return stochastic_round_bf16(x)


# ------------------------------------------------------------------ q3: every message, every bound

def test_q3_right_answer_says_where_every_byte_goes():
    assert ch11.q3.check((112, 14)).message == (
        "right: 112 GB and 14 GB. fp32-master holds 16 bytes per parameter (weight 4, gradient 4, "
        "two FP32 moments 8); bf16-kahan 14 (weight 2, gradient 2, moments 8, the Kahan buffer "
        "2). Most of what is left is the moments: 8-bit moments (bf16-8bit-state) are where the "
        "next saving is.")


def test_q3_takes_answers_within_two_percent_and_names_each_slip_near_it():
    assert ch11.q3.check((112 * 1.015, 14 * 0.985))  # rounded answers are right
    assert not ch11.q3.check((112 * 1.03, 14))
    gib = 112e9 / 2 ** 30
    assert "GiB" in ch11.q3.check((gib * 1.01, 14)).message
    assert ch11.q3.check((84 * 1.01, 14)).message == (
        f"{84 * 1.01:g} GB leaves out the gradients: a step holds one per parameter, as many "
        "bytes as the weight.")
    assert ch11.q3.check((112, 28 * 1.01)).message == (
        f"{28 * 1.01:g} GB forgets the Kahan buffer: bf16-kahan keeps 2 more bytes per parameter "
        "than plain BF16 weights.")
    assert ch11.q3.check((112 * 1.01, 20)).message == (
        f"{112 * 1.01:g} GB is right, 20 GB is not: subtract bf16-kahan's bytes per parameter "
        "from fp32-master's, then multiply.")
    assert ch11.q3.check((200, 14)).message == (
        "200 GB is not what fp32-master holds: add up its bytes per parameter (weight, gradient, "
        "each moment) from the table, then multiply.")
    assert ch11.q3.check("112 GB").message == (
        "give two numbers, (gigabytes under fp32-master, gigabytes bf16-kahan saves), not "
        "'112 GB'.")

"""Notebook 09's checks: delayed_scales wrong in one way each (built from the reference), and
the formats' ranges the q2 feedback quotes, against their definition."""

import math

from fp16lab.exercises import ch09 as ex


def _message(q, answer) -> str:
    fb = q.check(answer)
    assert not fb
    return fb.message


def _from_reference(change):
    def delayed_scales(amaxes, history_len, margin):
        return change(ex.reference_delayed_scales(amaxes, history_len, margin), amaxes,
                      history_len, margin)
    return delayed_scales


def test_binades_are_log2_of_largest_over_smallest_subnormal():
    # e4m3fn: 448 down to 2^-9; e5m2: 57344 down to 2^-16
    assert math.isclose(ex._binades(ex.ml_dtypes.float8_e4m3fn), math.log2(448) + 9)
    assert math.isclose(ex._binades(ex.ml_dtypes.float8_e5m2), math.log2(57344) + 16)


def test_delayed_answers_that_are_not_a_list_of_numbers():
    assert _message(ex.delayed, [1.0, 2.0]) == ("give the function itself: "
                                                "delayed.check(delayed_scales), without calling it.")
    assert _message(ex.delayed, lambda a, n, m: ["a"] * len(a)) == (
        "delayed_scales returned ['a', 'a', 'a', 'a', 'a', 'a']; return a list of numbers.")

    def broken(amaxes, history_len, margin):
        return [amaxes[10]]
    assert _message(ex.delayed, broken) == (
        "on q3's amaxes, one step further ([2.0, 8.0, 1.0, 1.0, 0.5, 0.5], history 3, margin 0) "
        "delayed_scales raised IndexError: list index out of range")


def test_delayed_first_scale_must_be_one():
    first = _from_reference(lambda s, a, n, m: [2.0] + list(s[1:]))
    assert _message(ex.delayed, first).endswith(
        "the first step has no amax recorded yet: its scale is 1.")


def test_delayed_a_margin_applied_twice_is_not_called_ignored():
    twice = _from_reference(lambda s, a, n, m: [v / 2 ** m if i else v for i, v in enumerate(s)])
    message = _message(ex.delayed, twice)
    assert message.startswith("on a margin of 1, amaxes [0.5, 0.25, 0.125, 4.0], history 2, "
                               "margin 1: you gave [1, 224, 224, 448]; ")
    assert message.endswith("the scales are [1, 448, 448, 896].")

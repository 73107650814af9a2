"""Notebook 06's idle_gaps check on implementations wrong in one way each (built from the
reference, so each fails exactly one rule), and q1's idle fraction at its edges."""

import pytest

from fp16lab.exercises import ch06 as ex


def _message(q, answer) -> str:
    fb = q.check(answer)
    assert not fb
    return fb.message


def _from_reference(change):
    def idle_gaps(kernels, window):
        return change([tuple(g) for g in ex.reference_idle_gaps(kernels, window)], kernels, window)
    return idle_gaps


def test_gaps_missing_the_first_gap_of_a_window_that_starts_idle():
    drop = _from_reference(lambda g, k, w: g[1:] if g and g[0][0] == w[0] else g)
    assert _message(ex.gaps, drop) == (
        "on kernels listed out of order, kernels [(90, 20), (10, 30), (50, 10)] in window (0, 120), "
        "you gave [(40.0, 50.0), (60.0, 90.0), (110.0, 120.0)]; the gap before the first kernel is "
        "missing: the window starts idle.")


def test_gaps_outside_the_window():
    early = _from_reference(lambda g, k, w: ([(w[0] - 5, w[0])] + g
                                             if any(s < w[0] for s, _ in k) else g))
    assert _message(ex.gaps, early).endswith(
        "you gave [(-5.0, 0.0), (20.0, 90.0)]; a gap reaches outside the window: clip each kernel "
        "to the window.")


def test_gaps_wrong_inside_the_window_gets_the_right_ones():
    def one_off(g, k, w):
        return [(a, b + 1) if (a, b) == (40, 50) and w == (0, 120) else (a, b) for a, b in g]
    assert _message(ex.gaps, _from_reference(one_off)) == (
        "on kernels listed out of order, kernels [(90, 20), (10, 30), (50, 10)] in window (0, 120), "
        "you gave [(0.0, 10.0), (40.0, 51.0), (60.0, 90.0), (110.0, 120.0)]; the idle gaps are "
        "[(0.0, 10.0), (40.0, 50.0), (60.0, 90.0), (110.0, 120.0)].")


def test_gaps_zero_length_gap_with_another_mistake_is_not_called_only_that():
    def both(g, k, w):
        return (g[1:] + [(w[1], w[1])]) if w == (0, 200) else g
    message = _message(ex.gaps, _from_reference(both))
    assert "drop gaps of zero length" not in message
    assert message.endswith("the idle gaps are [(40.0, 50.0), (100.0, 120.0), (135.0, 160.0), "
                            "(190.0, 200.0)].")


def test_gaps_an_exception_is_reported_with_the_case():
    def broken(kernels, window):
        return [kernels[0][5]]
    assert _message(ex.gaps, broken) == (
        "on q1's timeline ([(0, 40), (50, 30), (75, 25), (120, 10), (125, 10), (160, 30)], window "
        "(0, 200)) idle_gaps raised IndexError: tuple index out of range")


@pytest.mark.parametrize("answer, start", [
    (50, "50 is not a fraction between 0 and 1"),
    (1.5, "1.5 is not a fraction between 0 and 1."),
    (0, "merge the kernels that overlap"),
    (1, "merge the kernels that overlap"),
    (0.68, "0.68 is the share of the window the GPU is busy"),
    (0.72, "0.72 is the summed kernel durations over the window"),
    (0.28, "0.28 treats overlapping kernels"),
])
def test_q1_edges_and_rounded_slips(answer, start):
    assert start in _message(ex.q1, answer)


def test_q1_within_one_percent_is_right():
    right = ex._idle_fraction_by_bitmap(ex.Q1_KERNELS, ex.Q1_WINDOW)
    assert ex.q1.check(right * 1.009)
    assert not ex.q1.check(right * 1.011)


def test_the_checks_own_oracles_on_a_window_that_does_not_start_at_zero():
    """The bitmap oracle and the reference gaps away from 0, and with the last kernel ending
    exactly where the window ends (no zero-length gap there)."""
    kernels, window = ((10, 5), (18, 7)), (5, 25)
    assert ex._idle_fraction_by_bitmap(kernels, window) == pytest.approx(1 - 12 / 20)
    assert ex.reference_idle_gaps(kernels, window) == [(5, 10), (15, 18)]
    assert ex._last_end(kernels, window) == [(5, 10), (15, 18)]
    assert ex._unsorted(kernels, window) == [(5, 10), (15, 18)]


def test_q4_a_rate_off_by_a_few_millionths_is_wrong_and_microseconds_per_sample_named():
    assert _message(ex.q4, lambda batch, ms: batch / ms * 1e3 * (1 + 5e-6)).startswith(
        "ceiling(64, 10.0) returned 6400.03")
    assert _message(ex.q4, lambda batch, ms: 1e3 * ms / batch) == (
        "that is time per sample; the question asks for samples per second.")


@pytest.mark.parametrize("answer", ["abcdef", ["zz"], ["a", "b"]])
def test_q3_letters_written_together_or_apart(answer):
    assert not ex.q3.check(answer)

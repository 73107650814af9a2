"""Notebook 06's exercises: right answers pass, typical wrong ones get a message saying why."""

from __future__ import annotations

import pytest

from fp16lab.exercises import ch06 as ex


def test_q1_idle_fraction():
    # oracle by hand: covered [0,40) [50,100) [120,135) [160,190) = 135 of 200 µs
    assert ex.q1.check(0.325)
    assert ex.q1.check("0.325")
    f = ex.q1.check(1 - 145 / 200)  # durations summed, overlap counted twice
    assert not f and "overlapping" in f.message
    f = ex.q1.check(32.5)
    assert not f and "percentage" in f.message
    f = ex.q1.check(0.5)
    assert not f and "merge the kernels that overlap" in f.message
    f = ex.q1.check(0.675)                   # the busy share, given for the idle one
    assert not f and "busy" in f.message and "idle" in f.message
    f = ex.q1.check(145 / 200)                # summed durations as a busy share
    assert not f and "twice" in f.message
    assert not ex.q1.check("lots")
    assert ex.q1.check().kind == "missing"


def test_q1_solution_code_gives_the_right_answer():
    from fp16lab.profile import busy_us
    starts = [s for s, d in ex.Q1_KERNELS]
    ends = [s + d for s, d in ex.Q1_KERNELS]
    assert 1 - busy_us(starts, ends, ex.Q1_WINDOW) / 200 == pytest.approx(0.325)


def test_q4_ceiling_function():
    assert ex.q4.check(lambda batch, kernel_ms: batch / (kernel_ms / 1e3))
    assert ex.q4.check(lambda b, k: 1000.0 * b / k)
    f = ex.q4.check(lambda b, k: b / k)
    assert not f and "per millisecond" in f.message
    f = ex.q4.check(lambda b, k: k / b)
    assert not f and "time per sample" in f.message
    assert not ex.q4.check(lambda b, k: b / (k / 1e3) * 0.9)
    f = ex.q4.check(64 / 0.01)
    assert not f and "function itself" in f.message
    f = ex.q4.check(lambda b, k: "fast")
    assert not f and "return a number" in f.message


def test_q2_kernel_kinds():
    assert ex.q2.check(["gemm-conv", "elementwise", "reduction", "copy"])
    f = ex.q2.check(["elementwise", "elementwise", "reduction", "copy"])
    assert not f and "name 0" in f.message and "convolution" in f.message
    f = ex.q2.check(["gemm-conv", "elementwise", "elementwise", "copy"])
    assert not f and "name 2" in f.message
    assert not ex.q2.check("gemm-conv")
    assert not ex.q2.check(["gemm-conv"])


def test_q3_capture_blockers():
    assert ex.q3.check({"a", "b", "e"})
    assert ex.q3.check("a, b, e")
    assert ex.q3.check(["E", "a", "B"])
    f = ex.q3.check({"a", "b"})
    assert not f and "missed e" in f.message
    f = ex.q3.check({"a", "b", "e", "f"})
    assert not f and "fused" in f.message
    f = ex.q3.check({"a", "b", "c", "e"})
    assert not f and "zero_grad" in f.message
    assert ex.q3.check("abe") and ex.q3.check("ABE")   # the letters written together
    f = ex.q3.check("abef")
    assert not f and "fused" in f.message
    f = ex.q3.check("ab")
    assert not f and "missed e" in f.message
    f = ex.q3.check({"a", "z"})
    assert not f and "not among" in f.message


def test_every_exercise_has_a_hint_and_a_solution():
    for q in (ex.q1, ex.q4, ex.q2, ex.q3):
        assert q.hint().message and q.solution().message
        assert q.solution().kind == "solution"


# -- gaps: the learner's idle_gaps ------------------------------------------------------------------
def test_gaps_right_and_wrong_answers():
    ch06 = ex
    assert ch06.gaps.check(ch06.reference_idle_gaps)

    def no_merge(kernels, window):  # gaps between neighbours by start, overlaps not merged
        ks = sorted(kernels)
        out = [(window[0], ks[0][0])] if ks and ks[0][0] > window[0] else ([] if ks else [window])
        for (s0, d0), (s1, _) in zip(ks, ks[1:]):
            if s1 != s0 + d0:
                out.append((s0 + d0, s1))
        if ks and ks[-1][0] + ks[-1][1] < window[1]:
            out.append((ks[-1][0] + ks[-1][1], window[1]))
        return out

    def no_ends(kernels, window):
        return [g for g in ch06.reference_idle_gaps(kernels, window) if window[0] < g[0] and g[1] < window[1]]

    def with_zero(kernels, window):
        out = ch06.reference_idle_gaps(kernels, window)
        return out + [(30, 30)] if (10, 20) in list(kernels) else out

    cases = ((no_merge, "ends before it starts"), (ch06._last_end, "latest end seen so far"),
             (ch06._unsorted, "sort them by start"), (no_ends, "after the last kernel is missing"),
             (with_zero, "zero length"), (lambda k, w: None, "returns nothing yet"),
             (lambda k, w: 3, "list of (start, end) pairs"))
    for fn, words in cases:
        result = ch06.gaps.check(fn)
        assert not result and words in result.message, (words, result.message)
    assert "without calling it" in ch06.gaps.check([]).message

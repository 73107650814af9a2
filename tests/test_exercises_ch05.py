"""Notebook 05's exercises: right answers pass, typical wrong ones get a message saying why."""

from __future__ import annotations

import json

import pytest

from fp16lab.measure import data_dir
from fp16lab.exercises import ch05 as ex


@pytest.fixture(scope="module")
def figures():
    path = data_dir() / "claims_h200.json"
    if not path.exists():
        pytest.skip("no recorded GPU claims run in data/")
    return {r["id"]: r["figures"] for r in json.loads(path.read_text())["rows"]}


def test_q3_claim_11_verdict(figures):
    ratio = figures[11]["fp16_tflops"] / figures[11]["fp32_tflops"]
    right = "holds" if 6 <= ratio <= 10 else "does not hold"
    wrong = "holds" if right != "holds" else "does not hold"
    assert ex.q3.check(right)
    assert ex.q3.check(right.upper())
    f = ex.q3.check(wrong)
    assert not f and "fp16_tflops / fp32_tflops" in f.message and "6" in f.message
    assert f"{ratio:.1f}" not in f.message        # a wrong verdict is not handed the ratio
    f = ex.q3.check("holds in part")
    assert not f and "no middle verdict" in f.message
    f = ex.q3.check("true")
    assert not f and "one of" in f.message
    assert "V100" in ex.q3.check(right).message and "16x" in ex.q3.check(right).message


def test_q1_claim_2_verdict(figures):
    amp, fp32 = figures[2]["speedup_amp"], figures[2]["speedup_fp32"]
    if amp >= 1.15 and fp32 >= 1.15:
        right = "holds"
    elif max(amp, fp32) >= 1.05:
        right = "holds in part"
    else:
        right = "does not hold"
    assert ex.q1.check(right)
    for wrong in sorted({"holds", "holds in part", "does not hold"} - {right}):
        assert not ex.q1.check(wrong)
    if right != "holds":
        assert "fp32" in ex.q1.check("holds").message


def test_q2_clipping_before_unscale():
    assert ex.q2.check(1.0 / 65536)
    assert ex.q2.check(1.53e-5)
    assert ex.q2.check(1.5e-5)  # two significant figures
    assert not ex.q2.check(1.45e-5)  # 5% off
    f = ex.q2.check(0.5)
    assert not f and "after unscale_" in f.message
    f = ex.q2.check(1.0)
    assert not f and "divides them by the scale" in f.message
    f = ex.q2.check(0.5 / 65536)  # the true norm unscaled, as if nothing had been clipped
    assert not f and "divides the true norm" in f.message and "cut them to 1" in f.message
    assert not ex.q2.check("small")


def test_q2_prompt_states_its_numbers_not_internal_names():
    # the learner reads the prompt: it gives the scale, the true norm and the threshold as numbers
    assert "Q2_" not in ex.q2.question
    for number in ("65536", "norm 0.5", "clip_grad_norm_(params, 1.0)"):
        assert number in ex.q2.question


def test_solutions_only_on_request():
    for q in (ex.q3, ex.q1, ex.q2):
        assert q.solution().kind == "solution" and q.check().kind == "missing"

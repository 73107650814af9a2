"""Notebook 05's verdicts at their rules' edges, on stand-in recorded figures (the shipped run
has one set of figures per claim, so it cannot show an edge)."""

import pytest

from fp16lab.exercises import ch05 as ex

META = {"measured_at": "2026-01-01T00:00:00+00:00", "gpu_name": "Stand-in GPU", "torch": "2.x",
        "driver_version": "1", "cupy_version": None}


def _recorded(monkeypatch, claim_id, figures):
    rows = [{"id": claim_id, "figures": figures}] if figures is not None else []
    monkeypatch.setattr(ex, "recorded_gpu_result", lambda: {"meta": META, "rows": rows})


@pytest.mark.parametrize("amp, fp32, right", [
    (1.15, 1.15, "holds"),              # both at the claim's 1.15x exactly
    (1.15, 1.14, "holds in part"),
    (1.05, 1.00, "holds in part"),      # a gain of exactly 1.05x is a gain
    (1.04, 1.00, "does not hold"),
])
def test_q1_claim_2_at_the_edges(monkeypatch, amp, fp32, right):
    _recorded(monkeypatch, 2, {"speedup_amp": amp, "speedup_fp32": fp32})
    assert ex.q1.check(right).message.startswith(f"{right}: channels_last over NCHW: AMP fp16 "
                                                 f"{amp:.2f}x, fp32 {fp32:.2f}x (measured on ")
    for wrong in sorted({"holds", "holds in part", "does not hold"} - {right}):
        assert not ex.q1.check(wrong)


@pytest.mark.parametrize("fp16, right", [(60.0, "holds"), (100.0, "holds"), (59.0, "does not hold"),
                                         (101.0, "does not hold"), (80.0, "holds")])
def test_q3_claim_11_band_is_6_to_10_inclusive(monkeypatch, fp16, right):
    _recorded(monkeypatch, 11, {"fp16_tflops": fp16, "fp32_tflops": 10.0, "tf32_tflops": 20.0})
    assert ex.q3.check(right)
    wrong = "does not hold" if right == "holds" else "holds"
    fb = ex.q3.check(wrong)
    assert not fb and fb.message == (
        "'does not hold' means fp16_tflops / fp32_tflops falls outside 6 to 10. Divide the two "
        "recorded figures (fp32, not tf32) and check the ratio against both bounds."
        if wrong == "does not hold" else
        "'holds' needs fp16_tflops / fp32_tflops between 6 and 10 (8 +- 25%). Divide the two "
        "recorded figures (fp32, not tf32) and see which side of that band the ratio lands on.")


def test_missing_recorded_figures_are_said_plainly(monkeypatch):
    monkeypatch.setattr(ex, "recorded_gpu_result", lambda: None)
    assert ex.q1.check("holds").message == ("there is no recorded GPU claims run in data/ on this "
                                            "machine to judge from.")
    _recorded(monkeypatch, 2, None)
    assert ex.q1.check("holds").message == "the recorded run has no figures for claim 2."
    _recorded(monkeypatch, 2, {})
    assert ex.q1.check("holds").message == "the recorded run has no figures for claim 2."


def test_the_claims_own_date_is_shown(monkeypatch):
    monkeypatch.setattr(ex, "recorded_gpu_result", lambda: {"meta": META, "rows": [
        {"id": 2, "figures": {"speedup_amp": 2.0, "speedup_fp32": 2.0},
         "measured_at": "2026-05-05T05:05:05+00:00"}]})
    assert "at 2026-05-05T05:05:05+00:00" in ex.q1.check("holds").message
    monkeypatch.setattr(ex, "recorded_gpu_result", lambda: {"meta": META, "rows": [
        {"id": 2, "figures": {"speedup_amp": 2.0, "speedup_fp32": 2.0}}]})
    assert "at 2026-01-01T00:00:00+00:00" in ex.q1.check("holds").message

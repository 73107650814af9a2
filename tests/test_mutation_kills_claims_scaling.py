"""Claims 6 and 9 as a reader gets them: each judge's sentence pinned word for word, at the
boundaries of its rule, and the two-run comparison of claim 9 (written to kill the survivors
`make mutation` listed in fp16lab.claims.scaling's judges and clipping_runs)."""

from __future__ import annotations

from dataclasses import replace

from fp16lab.claims import FAILS, HOLDS, PARTLY
from fp16lab.claims.scaling import (BETTER, CLAIM_9, NO_HARM, _rule_name, clipping_runs,
                                    judge_clipping, judge_gradscaler)


def gradscaler(**over):
    f = {"planted_steps": [2, 10, 11, 12], "nonfinite_detected_at": [2, 10, 11, 12],
         "nonfinite_before_first_backoff": 1, "clean_steps_before_growth": 4,
         "growth_interval": 4, "gradscaler_parameters": ["init_scale", "growth_interval"]}
    return {**f, **over}


def test_gradscaler_sentences():
    facts = ("with growth_interval 4, the scale first fell after 1 non-finite step (a single NaN "
             "at step 2); non-finite steps planted at [2, 10, 11, 12], caught and skipped at "
             "[2, 10, 11, 12]; the scale grew after 4 clean steps; GradScaler's parameters are "
             "init_scale, growth_interval (none sets a number of NaNs in a row)")
    assert judge_gradscaler(gradscaler()) == (
        FAILS, "growth_interval counts clean steps before the scale grows; every step is "
               "checked. " + facts)
    # three in a row before the first backoff, and not every step caught: the claim's reading
    v, why = judge_gradscaler(gradscaler(nonfinite_detected_at=[12],
                                         nonfinite_before_first_backoff=3,
                                         gradscaler_parameters=["init_scale", "hysteresis"]))
    assert v == HOLDS and why == (
        "with growth_interval 4, the scale first fell after 3 non-finite steps (a single NaN at "
        "step 2); non-finite steps planted at [2, 10, 11, 12], caught and skipped at [12]; the "
        "scale grew after 4 clean steps; GradScaler's parameters are init_scale, hysteresis "
        "(hysteresis may set a patience)")
    # each of the three tests failing alone gives "in part"
    for over in ({"clean_steps_before_growth": 5}, {"nonfinite_before_first_backoff": 2},
                 {"nonfinite_detected_at": [2, 10]}):
        assert judge_gradscaler(gradscaler(**over))[0] == PARTLY, over
    # the patience words are matched whole, between underscores
    assert "consecutive_nans may set a patience" in judge_gradscaler(
        gradscaler(gradscaler_parameters=["consecutive_nans"]))[1]
    assert "(none sets" in judge_gradscaler(gradscaler(gradscaler_parameters=["rowing"]))[1]


def clipping(**over):
    f = {"loss_none": 1.0, "loss_clip1": 1.0, "loss_mean_abs": 0.9, "clip1_share": 0.25,
         "median_grad_norm": 1.5, "mean_abs_threshold_last": 0.0123, "mean_abs_share": 0.5,
         "loss_clip1_before_unscale": 2.0, "epochs": 4, "steps": 24, "mean_abs_factor": 3.0}
    return {**f, **over}


def test_clipping_sentences_at_the_rule_boundaries():
    def facts(one, mean_abs):
        return (f"final loss: no clip 1.000, clip 1.0 {one:.3f} (clipped 25% of steps; median "
                f"unscaled norm 1.50), per-epoch 3 x mean-|g| rule {mean_abs:.3f} (last threshold "
                f"0.012, clipped 50%), clip 1.0 before unscale_ 2.000 (threshold effectively "
                f"1/scale); a heuristic: this model and data only")
    at_no_harm = NO_HARM * 1.0  # clip 1.0 exactly at the bar still does no harm
    assert judge_clipping(clipping(loss_clip1=at_no_harm, loss_mean_abs=0.9)) == (
        HOLDS, facts(at_no_harm, 0.9))
    # mean-|g| exactly at BETTER x clip 1.0 is not better (strictly below counts)
    v, why = judge_clipping(clipping(loss_mean_abs=BETTER))
    assert v == PARTLY and why == ("1.0 on unscaled gradients does no harm here; the 3 x "
                                   "mean-|g| rule is not better. " + facts(1.0, BETTER))
    v, why = judge_clipping(clipping(loss_clip1=1.2, loss_mean_abs=1.0))
    assert v == PARTLY and why == "only the 3 x mean-|g| part. " + facts(1.2, 1.0)
    assert judge_clipping(clipping(loss_clip1=1.2, loss_mean_abs=1.2)) == (FAILS, facts(1.2, 1.2))


def test_rule_name_says_which_threshold_a_run_used():
    assert _rule_name({"mean_abs_factor": 3.0}) == "3 x mean-|g| rule"
    assert _rule_name({}) == ("mean-|g| rule (threshold = mean |g|, without the source's x3: "
                              "an older run)")


def test_clipping_runs_lines_and_why_two_verdicts_differ():
    here = replace(CLAIM_9, verdict=HOLDS, figures=clipping(loss_clip1=NO_HARM))
    there = replace(CLAIM_9, verdict=PARTLY, figures=clipping(
        loss_clip1=1.2, loss_mean_abs=BETTER * 1.2, clip1_share=0.75, median_grad_norm=2.25,
        steps=8, epochs=2, mean_abs_factor=1.0))
    skipped = replace(CLAIM_9, verdict=None, figures={})
    text = clipping_runs({"H200": here, "CPU": there, "none": skipped})
    assert text.split("\n") == [
        "H200: holds. 4 epochs (24 steps); clip 1.0 clipped 25% of steps (median unscaled norm "
        "1.50) and ended +5% against no clipping (within the rule's 5%); the 3 x mean-|g| rule "
        "ended -14% against clip 1.0 (better by the rule's 5%).",
        "CPU: holds in part. 2 epochs (8 steps); clip 1.0 clipped 75% of steps (median unscaled "
        "norm 2.25) and ended +20% against no clipping (outside the rule's 5%); the mean-|g| rule "
        "(threshold = mean |g|, without the source's x3: an older run) ended -5% against clip "
        "1.0 (not better by the rule's 5%).",
        "The verdicts differ because the clip-1.0 part held in the run on H200 only and the "
        "mean-|g| part held in the run on H200 only; the two runs differ in their length, not "
        "only in their machine. Clip 1.0 clipped 25% of steps on H200 (median norm 1.50, 24 "
        "steps) and 75% on CPU (median norm 2.25, 8 steps)."]
    # one part differing names that part alone, and the run where it held
    other = replace(there, verdict=HOLDS,
                    figures={**there.figures, "loss_clip1": 1.0, "loss_mean_abs": 0.5})
    text = clipping_runs({"a": replace(here, verdict=PARTLY,
                                       figures={**here.figures, "loss_mean_abs": 1.0}),
                          "b": other})
    assert "because the mean-|g| part held in the run on b only;" in text
    same = clipping_runs({"a": here, "b": replace(here, figures={**here.figures})})
    assert same.endswith("\nBoth runs give the same verdict: holds.")
    assert clipping_runs({"a": here}).count("\n") == 0

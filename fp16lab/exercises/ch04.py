"""Exercises of notebook 04 (sweeps): reading the reference sweep, repeat spread, skipped steps."""

from __future__ import annotations

import math

from ..scaling import ScalerSettings
from ..sweep import load_reference
from .core import Exercise, Wrong, expect_close

__all__ = ["q1", "q2", "q3", "q4", "Q2_MODELS", "Q3_REPEAT_MS", "Q3_TOLERANCE", "Q4_INIT_SCALE",
           "Q4_OVERFLOW_ABOVE"]


def _reference():

    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # the loader's provenance line is the notebook's
        rows = load_reference()
    if rows is None:
        raise Wrong("the reference sweep is not in data/ on this machine, so this cannot be checked.")
    return rows


def _samples_per_s(rows, model: str, batch: int, layout: str, precision: str) -> float:
    """Returns batch / median step time over the ok repeats of one point (default scaler)."""
    sel = rows[(rows["model"] == model) & (rows["batch"] == batch) & (rows["layout"] == layout)
               & (rows["precision"] == precision) & (rows["status"] == "ok")
               & (rows["init_scale"].isna() | (rows["init_scale"] == 65536.0))]
    if not len(sel):
        raise Wrong(f"the reference file has no {model} b{batch} {layout} {precision} rows.")
    return batch / (float(sel["step_ms_median"].astype(float).median()) / 1e3)


# ------------------------------------------------------------------------ q1: AMP speed-up


def _q1_neighbours():
    """The points a learner may read by mistake instead of q1's (another batch, layout, precision)."""
    for batch in (64, 128, 256):
        for layout in ("nchw", "channels_last"):
            for precision in ("amp-fp16", "amp-bf16", "fp16-o2"):
                if (batch, layout, precision) != (256, "channels_last", "amp-fp16"):
                    yield batch, layout, precision


def _check_q1(answer: object) -> str:
    rows = _reference()
    sps = {p: _samples_per_s(rows, "resnet50", 256, "channels_last", p)
           for p in ("fp32", "tf32", "amp-fp16")}
    right = sps["amp-fp16"] / sps["fp32"]
    try:
        value = float(answer)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise Wrong(f"give the speed-up as a number such as 1.5, not {answer!r}.") from None
    if math.isclose(value, 1 / right, rel_tol=0.03):
        raise Wrong(f"{value:.2f} is fp32 over AMP; a speed-up is AMP's samples/s over fp32's.")
    if math.isclose(value, sps["amp-fp16"] / sps["tf32"], rel_tol=0.03):
        raise Wrong(f"{value:.2f} is AMP over tf32; the question's baseline is fp32 (TF32 off).")
    # rel 0.01: the ratio to two decimals; fp16-o2's ratio at the same point lies 2% away
    if not math.isclose(value, right, rel_tol=0.01):
        near = []
        for batch, layout, precision in _q1_neighbours():
            try:
                other = (_samples_per_s(rows, "resnet50", batch, layout, precision)
                         / _samples_per_s(rows, "resnet50", batch, layout, "fp32"))
            except Wrong:
                continue
            if math.isclose(value, other, rel_tol=0.01):
                near.append((abs(value - other), batch, layout, precision))
        if near:
            _, batch, layout, precision = min(near)
            raise Wrong(f"{value:.2f} is {precision} over fp32 at batch {batch}, {layout}; the "
                        "question asks for amp-fp16 at batch 256, channels_last.")
        raise Wrong(f"{value:g} is not amp-fp16's samples/s over fp32's for ResNet-50 at batch 256, "
                    "channels_last: take both rows of that point from the reference (the ratio "
                    "table of this section has it) and divide.")
    return (f"{right:.2f}x: {sps['amp-fp16']:.0f} against {sps['fp32']:.0f} samples/s. True fp32 "
            f"runs on CUDA cores; against tf32 ({sps['tf32']:.0f} samples/s) AMP gains "
            f"{sps['amp-fp16'] / sps['tf32']:.2f}x.")


q1 = Exercise(
    "q1", "Read the reference sweep's samples/s table: how many times fp32's samples/s does "
          "amp-fp16 reach for resnet50 at batch 256, channels_last? A number.", _check_q1,
    hint="sweep.ratio_table(ref, model='resnet50', by='precision', baseline='fp32') has it, or "
         "divide two entries of sweep.throughput_table(ref, model='resnet50').",
    solution="The channels_last / 'amp-fp16 / fp32' entry at batch 256 of the ratio table.",
    solution_code="sweep.ratio_table(ref, model='resnet50')[('channels_last', 'amp-fp16 / fp32')][256]")


# ----------------------------------------------------------------------- q2: who gets slower

#: The models q2 asks about.
Q2_MODELS = ("resnet18", "small_cnn", "transformer_block")


def _check_q2(answer: object) -> str:
    rows = _reference()
    if isinstance(answer, str):
        answer = answer.replace(",", " ").split()
    if not isinstance(answer, (set, list, tuple, frozenset)):
        raise Wrong("give the model names as a set of strings, e.g. {'resnet18'}, or set() for none.")
    given = {str(a).strip() for a in answer}
    unknown = given - set(Q2_MODELS)
    if unknown:
        raise Wrong(f"{sorted(unknown)} are not among {', '.join(Q2_MODELS)}.")
    ratio = {m: _samples_per_s(rows, m, 256, "nchw", "amp-fp16")
             / _samples_per_s(rows, m, 256, "nchw", "fp32") for m in Q2_MODELS}
    slower = {m for m, r in ratio.items() if r < 1}
    if given == slower:
        told = ", ".join(f"{m} {r:.2f}x" for m, r in ratio.items())
        bf16 = {m: _samples_per_s(rows, m, 256, "nchw", "amp-bf16")
                / _samples_per_s(rows, m, 256, "nchw", "fp32") for m in sorted(slower)}
        return (f"{sorted(slower)}: amp-fp16 over fp32 at batch 256 is {told}. amp-bf16, the same "
                f"casts without a loss scaler, gives {', '.join(f'{m} {r:.2f}x' for m, r in bf16.items())}: "
                "the gap between the two holds GradScaler's work per step (scaling, unscaling, the "
                "inf check and its host sync) and the other 16-bit type; the sweep never ran "
                "amp-fp16 without a scaler, so it does not measure the scaler's share alone.")
    if given - slower:
        raise Wrong(f"{sorted(given - slower)} got faster under amp-fp16 in the reference run: its "
                    "'amp-fp16 / fp32' ratio at batch 256, nchw, is above 1.")
    raise Wrong(f"you missed {len(slower - given)} model(s) whose 'amp-fp16 / fp32' ratio at batch "
                "256, nchw, is below 1: check every name in Q2_MODELS, not only the smallest.")


q2 = Exercise(
    "q2", f"Which of Q2_MODELS ({', '.join(Q2_MODELS)}) run slower under amp-fp16 than in fp32 "
          "at batch 256, nchw, in the reference sweep? A set of names.", _check_q2,
    hint="sweep.ratio_table(ref, model=name) for each name; below 1 is slower.",
    solution="The models whose 'amp-fp16 / fp32' ratio at batch 256 (nchw) is below 1.",
    solution_code="{m for m in ex.Q2_MODELS\n"
                  " if sweep.ratio_table(ref, model=m)[('nchw', 'amp-fp16 / fp32')][256] < 1}")


# ------------------------------------------------------------------------ q3: repeat spread

#: One point's three repeat medians (ms) and the sweep's tolerance.
Q3_REPEAT_MS, Q3_TOLERANCE = (40.4, 42.2, 40.0), 0.03


def _check_q3(answer: object) -> str:
    xs = sorted(Q3_REPEAT_MS)
    median = xs[len(xs) // 2]
    right = (xs[-1] - xs[0]) / median
    flag = None
    if isinstance(answer, (tuple, list)):
        if len(answer) != 2 or not isinstance(answer[1], bool):
            raise Wrong("give the spread, or the pair (spread, flagged), e.g. (0.02, False).")
        answer, flag = answer
    try:
        value = float(answer)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise Wrong(f"give the spread as a fraction such as 0.02, not {answer!r}.") from None
    if math.isclose(value, right, rel_tol=0.002):
        unstable = right > Q3_TOLERANCE
        if flag is not None and flag != unstable:
            raise Wrong(f"the spread is right, but {value:.4f} is {'above' if unstable else 'below'} "
                        f"the {Q3_TOLERANCE:.0%} tolerance: the point is "
                        f"{'flagged UNSTABLE (True)' if unstable else 'stable (False)'}.")
        verdict = "flagged UNSTABLE" if unstable else "stable"
        return (f"{right:.4f}: ({xs[-1]} - {xs[0]}) / {median}, against a tolerance of "
                f"{Q3_TOLERANCE:.0%}: {verdict}. Trust no difference between points smaller than "
                "their repeat spread.")
    if math.isclose(value, 100 * right, rel_tol=0.005):
        raise Wrong(f"{value:g} is a percentage; give a fraction.")
    for other, what in (((xs[-1] - xs[0]) / xs[0], "the fastest repeat"),
                        ((xs[-1] - xs[0]) / (sum(xs) / len(xs)), "the mean")):
        if math.isclose(value, other, rel_tol=0.002) and not math.isclose(other, right, rel_tol=0.002):
            raise Wrong(f"{value:.4f} divides by {what}; the sweep divides by the median repeat.")
    raise Wrong(f"{value:g} is not (slowest - fastest) / median of {Q3_REPEAT_MS}: sort the three "
                "repeats; the median is the middle one, not the first listed.")


q3 = Exercise(
    "q3", "A point's three repeats had median step times Q3_REPEAT_MS. What is its repeat spread, "
          "(slowest - fastest) / median, as a fraction, and is it flagged UNSTABLE at 3%? Answer "
          "with the pair (spread, flagged), e.g. (0.02, False).", _check_q3,
    hint="Sort the three; the median is the middle one.",
    solution="(42.2 - 40.0) / 40.4 = 0.0545, above 0.03: UNSTABLE.",
    solution_code="xs = sorted(ex.Q3_REPEAT_MS); (xs[-1] - xs[0]) / xs[1]")


# -------------------------------------------------------------------- q4: skipped steps

#: q4's scaler: starts at 2**40; gradients overflow fp16 whenever the scale exceeds 2**16.
Q4_INIT_SCALE, Q4_OVERFLOW_ABOVE = 2.0**40, 2.0**16


def _check_q4(answer: object) -> str:

    backoff = ScalerSettings().backoff_factor
    scale, skipped = Q4_INIT_SCALE, 0
    while scale > Q4_OVERFLOW_ABOVE:
        scale *= backoff
        skipped += 1
    try:
        value = int(answer)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise Wrong(f"give the number of skipped steps as an integer, not {answer!r}.") from None
    if value == skipped:
        return (f"{skipped}: each overflow skips the step and multiplies the scale by {backoff}; "
                f"from 2^40 it takes {skipped} halvings to reach 2^16. The steps cost their time "
                "and update nothing, which is why a huge initial scale shows up as skipped steps, "
                "not as a slower step.")
    if value == skipped + 1:
        raise Wrong(f"{value} counts one too many: at 2^16 the gradients no longer overflow, so "
                    "that step updates the weights.")
    raise Wrong(f"{value} is not it: how many times must 2^40 be halved to get down to 2^16?")


q4 = Exercise(
    "q4", "GradScaler starts at init_scale 2**40 with the default backoff_factor; this model's "
          "gradients overflow fp16 whenever the scale is above 2**16. How many steps are skipped "
          "before the first step that updates the weights?",
    _check_q4,
    hint="Every skipped step multiplies the scale by backoff_factor (0.5 by default).",
    solution="24: 2^40 -> 2^16 takes 24 halvings; each is a skipped step.",
    solution_code="import math; int(math.log2(2**40 / 2**16))")

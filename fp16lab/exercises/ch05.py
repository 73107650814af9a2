"""Exercises of notebook 05 (claims): judge a claim from its recorded figures, clip after unscale_."""

from __future__ import annotations

import math

from ..claims import recorded_gpu_result
from ..measure import describe_source
from .core import Exercise, Wrong, expect_close

__all__ = ["q1", "q2", "q3", "Q2_GRAD_NORM", "Q2_SCALE", "Q2_MAX_NORM"]

_VERDICTS = ("holds", "holds in part", "does not hold")


def _recorded_figures(claim_id: int) -> tuple[dict, str]:

    payload = recorded_gpu_result()
    if payload is None:
        raise Wrong("there is no recorded GPU claims run in data/ on this machine to judge from.")
    row = next((r for r in payload["rows"] if r["id"] == claim_id), None)
    if row is None or not row.get("figures"):
        raise Wrong(f"the recorded run has no figures for claim {claim_id}.")
    # each claim's row carries when it was measured; the file's own date is its newest claim's
    meta = {**payload["meta"], "measured_at": row.get("measured_at") or payload["meta"].get("measured_at")}
    return row["figures"], describe_source(meta, with_file=False)


def _verdict(answer: object) -> str:
    text = str(answer).strip().lower()
    if text not in _VERDICTS:
        raise Wrong(f"answer with one of {', '.join(map(repr, _VERDICTS))}, not {answer!r}.")
    return text


# ------------------------------------------------------------------ q1: claim 2, channels_last


def _check_q1(answer: object) -> str:
    given = _verdict(answer)
    f, where = _recorded_figures(2)
    amp, fp32 = f["speedup_amp"], f["speedup_fp32"]
    claimed, any_gain = 1.15, 1.05
    if amp >= claimed and fp32 >= claimed:
        right = "holds"
    elif max(amp, fp32) >= any_gain:
        right = "holds in part"
    else:
        right = "does not hold"
    facts = f"channels_last over NCHW: AMP fp16 {amp:.2f}x, fp32 {fp32:.2f}x ({where})"
    if given == right:
        return f"{right}: {facts}. Tensor-core convolutions want NHWC; fp32's CUDA-core ones do not care."
    if given == "holds":
        raise Wrong(f"the rule wants at least {claimed}x under both precisions; look at fp32's ratio.")
    raise Wrong(f"look again at speedup_amp and speedup_fp32 against {claimed}x and {any_gain}x.")


q1 = Exercise(
    "q1", "Claim 2 says channels_last speeds convolution up by 20-30%. Its rule: >=1.15x under "
          "both AMP fp16 and fp32 holds; under one, or 1.05-1.15x, holds in part; below 1.05x "
          "does not hold. From the recorded GPU run's figures, what is the verdict?", _check_q1,
    hint="The recorded claim 2 has figures speedup_amp and speedup_fp32.",
    solution="Compare speedup_amp and speedup_fp32 with 1.15 and 1.05, as the rule says.",
    solution_code="c2 = next(c for c in claims.recorded_claims() if c.id == 2)\n"
                  "c2.figures['speedup_amp'], c2.figures['speedup_fp32']")


# --------------------------------------------------------- q2: clipping before unscale_ (claim 9)

#: q2: a gradient of true norm Q2_GRAD_NORM, loss scale Q2_SCALE, clip threshold Q2_MAX_NORM.
Q2_GRAD_NORM, Q2_SCALE, Q2_MAX_NORM = 0.5, 65536.0, 1.0


def _norm_after_clipping_scaled_grads() -> float:
    import torch

    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.full((4,), Q2_GRAD_NORM / 2) * Q2_SCALE  # true norm 0.5, as backward leaves it
    torch.nn.utils.clip_grad_norm_([p], Q2_MAX_NORM)  # the bug: before unscale_
    p.grad /= Q2_SCALE  # what unscale_ then does
    return float(p.grad.norm())


def _check_q2(answer: object) -> str:
    right = _norm_after_clipping_scaled_grads()
    try:
        value = float(answer)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise Wrong(f"give the norm as a number, not {answer!r}.") from None
    if abs(value - Q2_GRAD_NORM) < 1e-9:
        raise Wrong("that is the norm had clipping come after unscale_ (0.5 is under the "
                    "threshold, so nothing would be clipped). Here clipping saw the scaled norm.")
    if abs(value - Q2_MAX_NORM) < 1e-9:
        raise Wrong("1.0 is the threshold the scaled gradients were clipped to; unscale_ then "
                    "divides them by the scale.")
    if math.isclose(value, Q2_GRAD_NORM / Q2_SCALE, rel_tol=0.03):
        raise Wrong(f"{value:.3g} divides the true norm, {Q2_GRAD_NORM:g}, by the scale; but clipping "
                    f"saw the scaled gradients, of norm {Q2_GRAD_NORM:g} x {Q2_SCALE:g}, and cut "
                    f"them to {Q2_MAX_NORM:g} first. Then unscale_ divides what is left.")
    # rel 0.03: the answer written to two significant figures, 1.5e-5, is right too
    expect_close(value, right, "the gradient norm the optimizer sees", rel=0.03)
    return (f"{right:.3g}: clipping saw {Q2_GRAD_NORM * Q2_SCALE:g}, cut it to {Q2_MAX_NORM}, and "
            f"unscale_ divided by {Q2_SCALE:g}: an update {Q2_GRAD_NORM / right:,.0f}x too small. "
            "Call scaler.unscale_(optimizer) before clip_grad_norm_.")


q2 = Exercise(
    "q2", f"Under a GradScaler whose loss scale is {Q2_SCALE:g}, gradients of true norm "
          f"{Q2_GRAD_NORM:g} are clipped with clip_grad_norm_(params, {Q2_MAX_NORM}) BEFORE "
          "scaler.unscale_. What norm does the optimizer then see? A number.", _check_q2,
    hint="Before unscale_, the gradients are the true ones times the scale. Clip that norm to "
         "1.0, then divide by the scale.",
    solution="1.0 / 65536 = 1.53e-05: the scaled norm 32768 is cut to 1.0, then divided by 65536.",
    solution_code="1.0 / 65536")


# ------------------------------------------------------------------------ q3: claim 11, 8x


def _check_q3(answer: object) -> str:
    given = _verdict(answer)
    f, where = _recorded_figures(11)
    ratio = f["fp16_tflops"] / f["fp32_tflops"]
    right = "holds" if abs(ratio / 8 - 1) <= 0.25 else "does not hold"
    if given == right:
        return (f"{right}: {f['fp16_tflops']:.0f} / {f['fp32_tflops']:.0f} TFLOP/s = {ratio:.1f}x "
                f"({where}); the rule wants 6 to 10. 8x is the V100's ratio (125 TFLOPS of FP16 "
                "tensor-core math against 15.7 of FP32 in NVIDIA's V100 datasheet); the A100's is "
                "16x (312 against 19.5, NVIDIA's A100 datasheet). Against TF32 this run's ratio is "
                f"{f['fp16_tflops'] / f['tf32_tflops']:.1f}x.")
    if given == "holds in part":
        raise Wrong("this rule has no middle verdict: the ratio lies within 6 to 10 ('holds') or "
                    "outside it ('does not hold').")
    if given == "holds":
        raise Wrong("'holds' needs fp16_tflops / fp32_tflops between 6 and 10 (8 +- 25%). Divide the "
                    "two recorded figures (fp32, not tf32) and see which side of that band the ratio "
                    "lands on.")
    raise Wrong("'does not hold' means fp16_tflops / fp32_tflops falls outside 6 to 10. Divide the "
                "two recorded figures (fp32, not tf32) and check the ratio against both bounds.")


q3 = Exercise(
    "q3", "Claim 11 says FP16 tensor cores are 8x FP32. From the recorded GPU run's figures, and "
          "the rule 'fp16/fp32 within 25% of 8 holds', what is the verdict? 'holds' or "
          "'does not hold'.", _check_q3,
    hint="claims.recorded_claims() returns the recorded run's claims; the 11th has figures "
         "fp16_tflops and fp32_tflops.",
    solution="Divide fp16_tflops by fp32_tflops and see whether it lies between 6 and 10.",
    solution_code="c11 = next(c for c in claims.recorded_claims() if c.id == 11)\n"
                  "c11.figures['fp16_tflops'] / c11.figures['fp32_tflops']")

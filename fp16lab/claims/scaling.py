"""Claims about loss scaling and clipping: GradScaler's growth_interval (claim 6), clip thresholds (claim 9)."""

from __future__ import annotations

import inspect
import math
from typing import Any

from .. import validate
from ..models import build_model
from ..scaling import GradScalerRecorder
from .core import (FAILS, HOLDS, PARTLY, Claim, Figures, Judgement, _autocast_dtype, _device,
                   _sizes, _torch)


# --------------------------------------------------------------------------------------------
# Claim 6: growth_interval is the NaN-check interval; halve after three NaNs in a row
# --------------------------------------------------------------------------------------------

def experiment_gradscaler(quick: bool = True) -> Figures:
    """Returns torch's GradScaler trace with a planted NaN and a run of three infs.

    The scaler runs on this machine's device with ``growth_interval=4``; step 2 has a NaN
    gradient (not a multiple of the interval), steps 10-12 have inf gradients.
    """
    validate.boolean("quick", quick)
    torch = _torch()
    dev = _device()
    interval, init, n_steps = 4, 2.0**10, 16
    planted = {2: math.nan, 10: math.inf, 11: math.inf, 12: math.inf}
    scaler = GradScalerRecorder(torch.amp.GradScaler(dev, init_scale=init,
                                                     growth_interval=interval))
    p = torch.nn.Parameter(torch.ones(4, device=dev))
    opt = torch.optim.SGD([p], lr=0.125)
    trace = []
    for i in range(n_steps):
        opt.zero_grad()
        w = p.detach().clone()
        loss = (p * planted.get(i, 1.0)).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        event = scaler.update()
        trace.append({"step": i, "nonfinite": i in planted, "found_inf": event.found_inf,
                      "scale_before": event.scale, "scale_after": event.next_scale,
                      "skipped": bool(torch.equal(p.detach(), w))})
    first = min(planted)
    bad = [s for s in trace if s["nonfinite"]]
    halved_after = next((k + 1 for k, s in enumerate(bad)
                         if s["scale_after"] < s["scale_before"]), None)
    clean = 0
    grew_after = None
    for s in trace[first + 1:]:
        if s["nonfinite"]:
            break
        clean += 1
        if s["scale_after"] > s["scale_before"]:
            grew_after = clean
            break
    return {"device": dev, "init_scale": init, "growth_interval": interval,
            "backoff_factor": scaler.scaler.get_backoff_factor(),
            "planted_steps": sorted(planted), "trace": trace,
            "nonfinite_detected_at": [s["step"] for s in trace
                                      if s["skipped"] and s["scale_after"] < s["scale_before"]],
            "nonfinite_before_first_backoff": halved_after,
            "clean_steps_before_growth": grew_after,
            "gradscaler_parameters": [n for n in inspect.signature(torch.amp.GradScaler).parameters]}


def judge_gradscaler(f: Figures) -> Judgement:
    """Rules on claim 6 from when the scale fell and grew around planted non-finite steps."""
    every_step = f["nonfinite_detected_at"] == f["planted_steps"]
    first = f["nonfinite_before_first_backoff"] == 1
    growth = f["clean_steps_before_growth"] == f["growth_interval"]
    n = f["nonfinite_before_first_backoff"]
    params = f["gradscaler_parameters"]
    patience = [p for p in params
                if {"consecutive", "patience", "hysteresis", "row"} & set(p.split("_"))]
    facts = (f"with growth_interval {f['growth_interval']}, the scale first fell after "
             f"{n} non-finite step{'s' if n != 1 else ''} (a single NaN at step "
             f"{f['planted_steps'][0]}); non-finite steps planted at {f['planted_steps']}, caught "
             f"and skipped at {f['nonfinite_detected_at']}; the scale grew after "
             f"{f['clean_steps_before_growth']} clean steps; GradScaler's parameters are "
             f"{', '.join(params)} ("
             + (f"{', '.join(patience)} may set a patience" if patience
                else "none sets a number of NaNs in a row") + ")")
    if every_step and first and growth:
        return FAILS, ("growth_interval counts clean steps before the scale grows; every step is "
                       "checked. " + facts)
    if not every_step and not first:
        return HOLDS, facts
    return PARTLY, facts


# --------------------------------------------------------------------------------------------
# Claim 9: clip at 1.0 to start; a per-epoch threshold of 3 x mean |g| is better
# --------------------------------------------------------------------------------------------

#: Final-loss factors: clipping at 1.0 "does no harm" within NO_HARM of no clipping, and the
#: mean-|g| rule "works better" when it beats clip-1.0 by BETTER.
NO_HARM, BETTER = 1.05, 0.95
LR = 0.1
#: The source's rule: at each epoch's end the new threshold is the gradients' mean absolute
#: value times 3.0 (``all_grads.abs().mean() * 3.0``).
MEAN_ABS_FACTOR = 3.0


def experiment_clipping(quick: bool = True) -> Figures:
    """Returns final losses of a short fp16 training with no clipping, clip 1.0 (after unscale_),
    clip 1.0 before unscale_, and the per-epoch threshold of 3 x mean |g|, plus gradient-norm figures."""
    validate.boolean("quick", quick)
    torch = _torch()
    dev = _device()
    dtype = _autocast_dtype(dev)
    epochs, batches, batch = _sizes(quick, (12, 16, 128), (4, 6, 32), (2, 2, 8))
    g = torch.Generator().manual_seed(0)
    teacher = torch.nn.Linear(64, 10)
    with torch.no_grad():
        teacher.weight.copy_(torch.randn(10, 64, generator=g))
        xs = torch.randn(batches, batch, 64, generator=g)
        ys = teacher(xs).argmax(-1)
    xs, ys = xs.to(dev), ys.to(dev)
    torch.manual_seed(0)
    init = build_model("mlp").state_dict()

    def train(mode: str) -> dict[str, Any]:
        model = build_model("mlp").to(dev)
        model.load_state_dict(init)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        scaler = torch.amp.GradScaler(dev, init_scale=2.0**12)
        norms, means, clipped, thresholds = [], [], 0, []
        threshold = 1.0
        for _ in range(epochs):
            epoch_means = []
            for i in range(batches):
                opt.zero_grad()
                with torch.autocast(dev, dtype=dtype):
                    loss = torch.nn.functional.cross_entropy(model(xs[i]), ys[i])
                scaler.scale(loss).backward()
                if mode == "clip1_before_unscale":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.unscale_(opt)
                grads = [p.grad for p in model.parameters()]
                norm = float(torch.linalg.vector_norm(torch.cat([q.flatten() for q in grads])))
                mean_abs = float(torch.cat([q.abs().flatten() for q in grads]).mean())
                if math.isfinite(norm):
                    norms.append(norm)
                    epoch_means.append(mean_abs)
                limit = {"clip1": 1.0, "mean_abs": threshold}.get(mode)
                if limit is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), limit)
                    clipped += norm > limit
                scaler.step(opt)
                scaler.update()
            if epoch_means:
                threshold = MEAN_ABS_FACTOR * sum(epoch_means) / len(epoch_means)
                thresholds.append(threshold)
        with torch.no_grad():
            final = float(torch.nn.functional.cross_entropy(
                model(xs.flatten(0, 1)).float(), ys.flatten()))
        return {"final_loss": final, "median_grad_norm": sorted(norms)[len(norms) // 2],
                "clipped_share": clipped / (epochs * batches), "thresholds": thresholds,
                "scale": scaler.get_scale()}

    runs = {m: train(m) for m in ("none", "clip1", "clip1_before_unscale", "mean_abs")}
    return {"device": dev, "autocast_dtype": str(dtype), "epochs": epochs, "steps": epochs * batches,
            "mean_abs_factor": MEAN_ABS_FACTOR,
            **{f"loss_{m}": r["final_loss"] for m, r in runs.items()},
            "median_grad_norm": runs["none"]["median_grad_norm"],
            "clip1_share": runs["clip1"]["clipped_share"],
            "mean_abs_threshold_last": (runs["mean_abs"]["thresholds"] or [math.nan])[-1],
            "mean_abs_share": runs["mean_abs"]["clipped_share"],
            "scale": runs["none"]["scale"]}


def judge_clipping(f: Figures) -> Judgement:
    """Rules on claim 9 from final losses with no clipping, clip 1.0 and the 3 x mean-|g| threshold."""
    none, one, mean_abs = f["loss_none"], f["loss_clip1"], f["loss_mean_abs"]
    no_harm = one <= none * NO_HARM
    better = mean_abs < one * BETTER
    facts = (f"final loss: no clip {none:.3f}, clip 1.0 {one:.3f} (clipped "
             f"{100 * f['clip1_share']:.0f}% of steps; median unscaled norm "
             f"{f['median_grad_norm']:.2f}), per-epoch 3 x mean-|g| rule {mean_abs:.3f} (last threshold "
             f"{f['mean_abs_threshold_last']:.2g}, clipped {100 * f['mean_abs_share']:.0f}%), "
             f"clip 1.0 before unscale_ {f['loss_clip1_before_unscale']:.3f} (threshold "
             f"effectively 1/scale); a heuristic: this model and data only")
    if no_harm and better:
        return HOLDS, facts
    if no_harm:
        return PARTLY, f"1.0 on unscaled gradients does no harm here; the 3 x mean-|g| rule is not better. {facts}"
    if better:
        return PARTLY, f"only the 3 x mean-|g| part. {facts}"
    return FAILS, facts


def _rule_name(f: Figures) -> str:
    """Names the per-epoch threshold a run used: runs recorded before the source's x3 was tested
    have no ``mean_abs_factor`` and clipped at mean |g| itself."""
    factor = f.get("mean_abs_factor", 1.0)
    return (f"{factor:g} x mean-|g| rule" if factor != 1 else
            "mean-|g| rule (threshold = mean |g|, without the source's x3: an older run)")


def clipping_runs(runs: dict[str, Claim]) -> str:
    """Returns, for claim-9 runs (label -> checked claim), one line each on the two parts of the
    rule, and where two runs' verdicts differ, which part differs and the figures that moved."""
    lines, parts = [], {}
    for label, c in runs.items():
        f = c.figures
        if "loss_clip1" not in f:
            continue
        no_harm = f["loss_clip1"] <= f["loss_none"] * NO_HARM
        better = f["loss_mean_abs"] < f["loss_clip1"] * BETTER
        parts[label] = (c.verdict, no_harm, better, f)
        lines.append(
            f"{label}: {c.verdict}. {f['epochs']} epochs ({f['steps']} steps); clip 1.0 clipped "
            f"{f['clip1_share']:.0%} of steps (median unscaled norm {f['median_grad_norm']:.2f}) "
            f"and ended {f['loss_clip1'] / f['loss_none'] - 1:+.0%} against no clipping "
            f"({'within' if no_harm else 'outside'} the rule's {NO_HARM - 1:.0%}); the {_rule_name(f)} "
            f"ended {f['loss_mean_abs'] / f['loss_clip1'] - 1:+.0%} against clip 1.0 "
            f"({'better' if better else 'not better'} by the rule's {1 - BETTER:.0%}).")
    if len(parts) == 2:
        (a, (va, ha, ba, fa)), (b, (vb, hb, bb, fb)) = parts.items()
        if va != vb:
            which = [f"{name} held in the run on {a if x else b} only"
                     for name, x, y in (("the clip-1.0 part", ha, hb),
                                        ("the mean-|g| part", ba, bb)) if x != y]
            lines.append(
                f"The verdicts differ because {' and '.join(which)}; the two runs differ in "
                f"their length, not only in their machine. Clip 1.0 clipped "
                f"{fa['clip1_share']:.0%} of steps on {a} (median norm {fa['median_grad_norm']:.2f}, "
                f"{fa['steps']} steps) and {fb['clip1_share']:.0%} on {b} (median norm "
                f"{fb['median_grad_norm']:.2f}, {fb['steps']} steps).")
        else:
            lines.append(f"Both runs give the same verdict: {va}.")
    return "\n".join(lines)


CLAIM_6 = Claim(
    6, "growth_interval = NaN check",
    "GradScaler's growth_interval is the interval at which NaNs are checked; the scale "
    "should be halved only after three NaNs in a row.",
    "torch GradScaler with planted NaN/inf steps: each caught at its step, one halves the "
    "scale, growth after growth_interval clean steps: does not hold; checks only every "
    "interval and needs three: holds; else holds in part.",
    experiment_gradscaler, judge_gradscaler,
    origin=("an RTX 3090 FP16 tuning recipe that explains GradScaler's settings this way"))


CLAIM_9 = Claim(
    9, "clip 1.0; 3 x mean-|g| better",
    "In FP16 training a gradient-clipping threshold of 1.0 is a good start, and a "
    "threshold set each epoch to three times the mean absolute gradient works better.",
    "Short fp16+GradScaler training: clip 1.0 (after unscale_) ends within 5% of no "
    "clipping and the threshold 3 x mean |g| (the epoch's mean over its steps) beats it by >=5%: holds; one of the two: holds in part; neither: "
    "does not hold.",
    experiment_clipping, judge_clipping,
    origin=("an RTX 3090 tuning recipe (clip at 1.0 before scaler.step()) and a write-up of "
            "AMP on two large GPUs (each epoch, the new threshold is the gradients' mean absolute "
            "value times 3)"))

"""The doctor's checks: each measures one lever and returns its findings. Here: the precision
recipes, FP16's range and the precision-sensitive modules; :mod:`.speed` has the others, and
:data:`CHECKS` lists them all in the order they run.

Every check takes a :class:`Visit` (the workload's :class:`~fp16lab.doctor.probe.Probe`, the
starting configuration, the device) and returns a list of
:class:`~fp16lab.doctor.report.Finding`; a check that cannot run here raises
:class:`Unchecked` with the reason. Changes are measured by the probe's one protocol, so each
gain is a ratio of two runs of the same kind.
"""

from __future__ import annotations

import math
import statistics

import torch

from ..fp8.linear import scaled_mm_available
from ..recipes import PRECISIONS
from . import visit as V
from .numerics import ModuleNumerics, fitting_scale, reached_scale, underflow_share
from .probe import is_scaled
from .report import Finding
from .speed import (check_batch, check_input, check_layout, check_multi_gpu, check_shapes,
                    check_time)
from .visit import Unchecked, Visit


def _candidates(visit: Visit) -> list[str]:
    """The precisions the check measures: on a GPU fp32, tf32, amp-fp16, amp-bf16 and (from
    compute capability 8.9) fp8-tensorwise; on a CPU fp32 and amp-bf16, and the start's (a
    CPU has no fast FP16 kernels for most operations: a convolution's step under amp-fp16 can
    take 50 times fp32's)."""
    if not visit.cuda:
        return list(dict.fromkeys(["fp32", "amp-bf16", visit.start.precision]))
    names = ["fp32", "tf32", "amp-fp16", "amp-bf16"]
    if scaled_mm_available(visit.probe.device):
        names.append("fp8-tensorwise")
    return names


def check_precision(visit: Visit) -> list[Finding]:
    """Measures each precision recipe; the fastest whose loss stays within tolerance of fp32."""
    rows, fine = [], []
    for name in _candidates(visit):
        m = visit.probe.measure(visit.start.but(precision=name, init_scale=None))
        ok, distance = visit.probe.loss_within_tolerance(m) if m.ran else (False, math.nan)
        rows.append({"precision": name, "samples_per_s": m.samples_per_s,
                     "peak_GiB": m.peak_bytes / 2**30 if m.peak_bytes else None,
                     "last_loss": m.losses[-1] if m.losses else None,
                     "loss_distance": distance, "within_tolerance": ok, "error": m.error})
        if ok:
            fine.append(m)
    visit.notes["precision_rows"] = rows
    start_m = visit.probe.measure(visit.start)
    start_ok, _ = visit.probe.loss_within_tolerance(start_m)
    if not fine:
        return [Finding("precision", "no precision keeps the loss within tolerance of fp32",
                        "breaks", table=rows)]
    top = sorted(fine, key=lambda m: -m.samples_per_s)[:3]
    visit.probe.race([visit.start] + [m.config for m in top])
    for row in rows:  # the raced figures
        m = visit.probe.measure(visit.start.but(precision=row["precision"], init_scale=None))
        row["samples_per_s"], row["raced"] = m.samples_per_s, m.raced
    best = max(fine, key=lambda m: m.samples_per_s)
    visit.notes["fine_precisions"] = [m.config.precision for m in  # within 2x of the best
                                      sorted(fine, key=lambda m: -m.samples_per_s)
                                      if 2 * m.samples_per_s >= best.samples_per_s]
    visit.best = visit.start.but(precision=best.config.precision,
                                 init_scale=None if not is_scaled(best.config.precision)
                                 else visit.start.init_scale)
    if not start_ok:
        visit.notes["start_broken"] = True
        return [Finding("precision", f"{visit.start.precision} does not keep the loss within "
                        f"tolerance of fp32; {best.config.precision} does", "breaks",
                        change={"precision": best.config.precision}, verified=True,
                        gain=visit.gain(best, start_m), table=rows)]
    gain = visit.gain(best, start_m)
    if best.config.precision == visit.start.precision or gain is None or gain < 1 + V.NOISE:
        visit.best = visit.start
        return []
    memory = (f"; peak memory {best.peak_bytes / start_m.peak_bytes:.2f}x"
              if best.peak_bytes and start_m.peak_bytes else "")
    return [Finding("precision", f"train in {best.config.precision}: {gain:.2f}x the samples/s "
                    f"of {visit.start.precision}{memory}", "keeps",
                    change={"precision": best.config.precision}, gain=gain, verified=True,
                    advice=str(PRECISIONS[best.config.precision]), table=rows)]


def check_range(visit: Visit) -> list[Finding]:
    """FP16's range: activations above its max, gradients below its smallest subnormal."""
    numerics = visit.module_numerics()
    out: list[Finding] = []
    start_ok, _ = visit.probe.loss_within_tolerance(visit.baseline())
    broken = is_scaled(visit.start.precision) and not start_ok
    over = [n for n in numerics if n.act_overflow > 0]
    if over:
        worst = max(over, key=lambda n: n.act_max)
        bf16 = visit.probe.measure(visit.start.but(precision="amp-bf16", init_scale=None))
        ok, distance = visit.probe.loss_within_tolerance(bf16)
        fp16 = visit.probe.measure(visit.start.but(precision="amp-fp16"))
        out.append(Finding(
            "range", f"activations overflow FP16 in {len(over)} module(s), worst "
            f"{_named(worst)} (largest {worst.act_max:.3g}, FP16 holds 65504)",
            "breaks" if broken else "note",
            evidence={"largest activation": worst.act_max,
                      "share above FP16's range": worst.act_overflow,
                      "amp-fp16 losses finite": fp16.finite,
                      "amp-bf16 within loss tolerance": ok},
            change={"precision": "amp-bf16"}, verified=ok, gain=visit.gain(bf16),
            advice="BF16 has FP32's exponent range, so these activations fit; an FP32 island "
                   "does not help here, since the next module casts its input back to FP16.",
            table=[n.row() for n in over[:12]]))
    grad_max = max((n.grad_max for n in numerics), default=0.0)
    init = visit.start.init_scale or 2.0**16
    reached = reached_scale(grad_max, init)
    hist = _total_hist(numerics)
    share = underflow_share(hist, reached)
    visit.notes["underflow"] = {"grad_max": grad_max, "reached_scale": reached, "share": share}
    if share > V.UNDERFLOW_SHARE and not over:
        fit = fitting_scale(grad_max)
        evidence = {"largest gradient": grad_max, "scale GradScaler reaches": reached,
                    "share flushed to zero there": share}
        if fit > reached:
            scaled = visit.probe.measure(visit.start.but(precision="amp-fp16", init_scale=fit))
            ok, distance = visit.probe.loss_within_tolerance(scaled)
            evidence.update({"fitting scale": fit,
                             "share flushed at the fitting scale": underflow_share(hist, fit),
                             "loss within tolerance with it": ok})
            out.append(Finding(
                "range", f"{share:.1%} of the gradients underflow FP16 at GradScaler's scale "
                f"2^{round(math.log2(reached))}; start at 2^{round(math.log2(fit))}",
                "breaks" if broken else "keeps" if ok else "note", evidence=evidence,
                change={"precision": "amp-fp16", "init_scale": fit}, verified=ok,
                gain=visit.gain(scaled),
                advice="GradScaler grows its scale only after growth_interval (2000) finite "
                       "steps, so a small start costs thousands of steps of lost gradients; "
                       "ScalerSettings(init_scale=...) starts where they fit."))
        else:
            out.append(Finding(
                "range", f"{share:.1%} of the gradients underflow FP16 and the largest leaves "
                "no room to scale them up: train in BF16", "breaks" if broken else "note",
                evidence=evidence,
                change={"precision": "amp-bf16"}))
    return out


def _named(n: ModuleNumerics) -> str:
    return f"the module '{n.name}' ({n.kind})" if n.name else f"the model ({n.kind})"


def _total_hist(numerics: list[ModuleNumerics]) -> torch.Tensor | None:
    hists = [n.grad_hist for n in numerics if n.grad_hist is not None]
    return torch.stack(hists).sum(0) if hists else None


def check_sensitive(visit: Visit) -> list[Finding]:
    """Modules whose own output moves most under autocast: candidates for an FP32 island."""
    numerics = visit.module_numerics()
    errors = [n.local_error for n in numerics if math.isfinite(n.local_error)
              and n.local_error > 0]
    typical = statistics.median(errors) if errors else 0.0
    flagged = [n for n in numerics if n.act_overflow == 0 and (
        not math.isfinite(n.local_error)
        or n.local_error > max(V.SENSITIVE_ERROR, 10 * typical))]
    visit.notes["local_error_median"] = typical
    if not flagged:
        return []
    names = tuple(n.name for n in flagged if n.name)
    low = visit.low_precision()
    before = visit.probe.measure(visit.start.but(precision=low))
    after = visit.probe.measure(visit.start.but(precision=low, fp32_modules=names))
    ok_before, _ = visit.probe.loss_within_tolerance(before)
    ok_after, distance = visit.probe.loss_within_tolerance(after)
    cost = visit.gain(after, before)
    worst = max(flagged, key=lambda n: n.local_error)
    return [Finding(
        "sensitive", f"keep {', '.join(_named(n) for n in flagged)} in FP32: under {low} its "
        f"output is {'not finite' if not math.isfinite(worst.local_error) else f'{worst.local_error:.0%} off'}"
        f" (a typical module's: {typical:.2%})",
        "breaks" if not ok_before or not worst.local_error < V.BROKEN_ERROR else "keeps",
        evidence={"modules": ", ".join(f"'{n}'" for n in names),
                  "loss within tolerance before": ok_before,
                  "with the FP32 island": ok_after, "speed with the island": cost},
        change={"fp32_modules": list(names)}, verified=ok_after, gain=cost,
        advice="An FP32 island (fp16lab.diagnostics.FP32Island) turns autocast off and casts "
               "the module's inputs to FP32.", table=[n.row() for n in flagged[:12]])]


#: The checks, in the order they run (precision first: the others start from its best).
CHECKS = {"precision": check_precision, "range": check_range, "sensitive": check_sensitive,
          "layout": check_layout, "shapes": check_shapes, "time": check_time,
          "input": check_input, "batch": check_batch, "multi-gpu": check_multi_gpu}


def describe_checks() -> dict[str, str]:
    return {k: (fn.__doc__ or "").strip().splitlines()[0] for k, fn in CHECKS.items()}


__all__ = ["CHECKS", "Unchecked", "Visit", "describe_checks"]

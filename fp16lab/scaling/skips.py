"""Reading a run's skipped steps: harmless warm-up, occasional, or a problem."""

from __future__ import annotations

from typing import Any

from .events import ScaleEvent


def classify_skips(history: list[ScaleEvent], warmup_steps: int | None = None) -> dict[str, Any]:
    """Returns whether a run's skipped steps look like harmless warm-up or a real problem.

    Warm-up skips are the scale calibrating down from a too-large ``init_scale``: a run of
    consecutive skips from step 0, after which skips are rare (about one per growth interval, when
    the scale grows one step too far). A problem looks different: no step ever succeeds, skips
    keep coming after the warm-up or come in runs, or the scale falls below 1.

    Args:
        history: the scaler's events.
        warmup_steps: how many leading skips count as warm-up (default: the leading run).

    Returns:
        dict with ``warmup_skips``, ``later_skips``, ``later_skip_rate``, ``longest_later_run``,
        ``min_scale``, and ``verdict`` ("no skips", "warm-up only", "occasional" or "problem").
    """
    skipped = [e.skipped for e in history]
    lead = 0
    while lead < len(skipped) and skipped[lead]:
        lead += 1
    if warmup_steps is not None:
        lead = min(lead, warmup_steps)
    later = skipped[lead:]
    longest = run = 0
    for s in later:
        run = run + 1 if s else 0
        longest = max(longest, run)
    n_later = sum(later)
    rate = n_later / len(later) if later else 0.0
    min_scale = min((e.next_scale for e in history), default=float("nan"))
    if not any(skipped):
        verdict = "no skips"
    elif lead == len(skipped) or min_scale < 1.0:
        verdict = "problem"  # never a clean step, or a scale too small to be a calibration
    elif n_later == 0:
        verdict = "warm-up only"
    elif longest <= 2 and rate <= 0.01 and min_scale >= 1.0:
        verdict = "occasional"
    else:
        verdict = "problem"
    return {"warmup_skips": lead, "later_skips": n_later, "later_skip_rate": rate,
            "longest_later_run": longest, "min_scale": min_scale, "verdict": verdict}

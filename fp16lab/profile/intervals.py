"""Time intervals (µs) as a profile has them: checked to pair up, and their union's length."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import validate


def _times(name: str, values: Any) -> np.ndarray:
    """Returns values as a 1-d float64 array of finite times (µs), or raises naming a bad one."""
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iuf"):
        raise TypeError(f"{name} must be a sequence of numbers (µs), got "
                        f"{type(values).__name__} of {arr.dtype} with shape {arr.shape}")
    arr = arr.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(f"{name} must be finite numbers (µs): {name}[{bad[0]}] is {arr[bad[0]]}"
                         + (f" ({bad.size} are not finite)" if bad.size > 1 else ""))
    return arr


def intervals(starts: Any, ends: Any) -> tuple[np.ndarray, np.ndarray]:
    """Returns (starts, ends) as float64 arrays if they pair up into intervals: as many ends as
    starts, every one finite, and no interval ending before it starts.

    Raises:
        TypeError: starts or ends is not a flat sequence of numbers.
        ValueError: lengths differ, a time is NaN or infinite, or an end precedes its start.
    """
    s, e = _times("starts", starts), _times("ends", ends)
    if s.size != e.size:
        raise ValueError(f"need one end per start, got {s.size} starts and {e.size} ends")
    back = np.flatnonzero(e < s)
    if back.size:
        i = back[0]
        raise ValueError(f"interval {i} ends before it starts ({s[i]:g} to {e[i]:g} µs)"
                         + (f"; {back.size} intervals do" if back.size > 1 else ""))
    return s, e


def window_of(window: Any) -> tuple[float, float]:
    """Returns a window (start_us, end_us) as two floats if both are finite and end > start."""
    try:
        lo, hi = window
    except (TypeError, ValueError):
        raise TypeError(f"window must be (start_us, end_us), got {window!r}") from None
    lo, hi = validate.number("window start", lo), validate.number("window end", hi)
    if not hi > lo:
        raise ValueError(f"window must have end > start, got {window}")
    return float(lo), float(hi)


def busy_us(starts: Any, ends: Any, window: tuple[float, float] | None = None) -> float:
    """Returns the time (µs) covered by at least one of the intervals, clipped to the window.

    Raises:
        TypeError, ValueError: the intervals do not pair up (see :func:`intervals`) or the window
            is not two finite times with end > start.
    """
    s_arr, e_arr = intervals(starts, ends)
    spans = sorted(zip(s_arr.tolist(), e_arr.tolist()))
    if window is not None:
        lo, hi = window_of(window)
        spans = [(max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi]
    total, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total

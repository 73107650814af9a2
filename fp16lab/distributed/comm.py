"""The arithmetic of communication: how much of a step the collectives take and hide, ring
all-reduce time and bus bandwidth, and scaling efficiency."""

from __future__ import annotations

from typing import Any, Sequence

from .. import validate


def comm_overlap(kernels: Sequence[tuple[str, float, float]], *, steps: int = 1,
                 comm_marker: str = "nccl") -> dict[str, float]:
    """Returns how much of a step communication takes, and how much of it nothing hides.

    Args:
        kernels: ``(name, start_us, end_us)`` of every GPU kernel in ``steps`` steps (from
            torch.profiler); a kernel is communication when its name contains ``comm_marker``.
        steps: how many steps the kernels cover (the results are per step).

    Returns ``span_us`` (first start to last end), ``compute_us`` and ``comm_us`` (busy time:
    the union of each kind's intervals), ``exposed_comm_us`` (communication while no compute
    kernel runs), ``overlapped_comm_us``, ``idle_us`` (no kernel of either kind running: the
    GPU waits for the host) and the shares ``comm_share``, ``exposed_comm_share`` and
    ``idle_share`` of the span.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    marker = comm_marker.lower()
    comm = _union([(s, e) for n, s, e in kernels if marker in n.lower()])
    compute = _union([(s, e) for n, s, e in kernels if marker not in n.lower()])
    busy_comm = sum(e - s for s, e in comm)
    exposed = busy_comm - _intersection(comm, compute)
    busy = sum(e - s for s, e in _union(comm + compute))
    span = (max(e for _, _, e in kernels) - min(s for _, s, _ in kernels)) if kernels else 0.0
    per = {"span_us": span, "compute_us": sum(e - s for s, e in compute), "comm_us": busy_comm,
           "exposed_comm_us": exposed, "overlapped_comm_us": busy_comm - exposed, "idle_us": span - busy}
    per = {k: v / steps for k, v in per.items()}
    share = (lambda x: x / per["span_us"]) if per["span_us"] > 0 else (lambda x: 0.0)
    return {**per, "comm_share": share(per["comm_us"]), "exposed_comm_share": share(per["exposed_comm_us"]),
            "idle_share": share(per["idle_us"])}


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Returns the length covered by both of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _check(needs: str, *values: tuple[str, Any, dict[str, Any]]) -> None:
    """Raises ValueError saying what the helper needs, and (from :mod:`fp16lab.validate`) which
    value was wrong: NaN, infinities, booleans and fractional counts included."""
    try:
        for name, value, bounds in values:
            validate.number(name, value, **bounds)
    except (TypeError, ValueError) as e:
        raise ValueError(f"need {needs}; {e}") from None


def allreduce_seconds(nbytes: float, ranks: int, bus_gbs: float) -> float:
    """Returns the time of a ring all-reduce of ``nbytes`` over ``ranks`` at ``bus_gbs`` GB/s.

    Each rank sends and receives ``2 (ranks - 1) / ranks`` times the buffer (a reduce-scatter
    then an all-gather); ``bus_gbs`` is the per-rank link rate NCCL reports as bus bandwidth.
    """
    _check("nbytes >= 0, an integer ranks >= 1 and bus_gbs > 0", ("nbytes", nbytes, dict(low=0)),
           ("ranks", ranks, dict(low=1, integer=True)),
           ("bus_gbs", bus_gbs, dict(low=0, low_open=True)))
    return 2 * (ranks - 1) / ranks * nbytes / (bus_gbs * 1e9)


def bus_bandwidth_gbs(nbytes: float, ranks: int, seconds: float) -> float:
    """Returns the bus bandwidth (GB/s) of an all-reduce of ``nbytes`` on ``ranks`` that took ``seconds``.

    NCCL's convention (nccl-tests): ``busbw = 2 (ranks - 1) / ranks * nbytes / seconds``, the
    rate each rank's link carried in a ring all-reduce, comparable across rank counts and with
    the link's own rate; the inverse of :func:`allreduce_seconds`.
    """
    _check("nbytes >= 0, an integer ranks >= 1 and seconds > 0", ("nbytes", nbytes, dict(low=0)),
           ("ranks", ranks, dict(low=1, integer=True)),
           ("seconds", seconds, dict(low=0, low_open=True)))
    return 2 * (ranks - 1) / ranks * nbytes / seconds / 1e9


def scaling_efficiency(rate_n: float, rate_1: float, n: int) -> float:
    """Returns rate on ``n`` GPUs over ``n`` times the rate on one (1.0 is perfect scaling)."""
    _check("positive rates and an integer n >= 1", ("rate_n", rate_n, dict(low=0, low_open=True)),
           ("rate_1", rate_1, dict(low=0, low_open=True)), ("n", n, dict(low=1, integer=True)))
    return rate_n / (n * rate_1)

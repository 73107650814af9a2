"""Exercises of notebook 09 (FP8 with per-tensor scaling), each checked against ml_dtypes and numpy."""

from __future__ import annotations

import inspect

import ml_dtypes
import numpy as np

from .core import Exercise, Wrong, shown

__all__ = ["delayed", "q1", "q2", "q3", "q4"]

E4M3_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
E5M2_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max)


def _number(answer: object) -> float:
    try:
        value = float(answer)
    except (TypeError, ValueError):
        raise Wrong(f"give a number, not {type(answer).__name__} {answer!r}.") from None
    if not np.isfinite(value):
        raise Wrong(f"{value} is not a finite number.")
    return value


Q1_AMAX = 3.5


def _check_q1(answer: object) -> str:
    value = _number(answer)
    right = E4M3_MAX / Q1_AMAX
    if np.isclose(value, right, rtol=1e-6):
        return (f"{right:g}: the largest activation, {Q1_AMAX}, times {right:g} lands exactly on "
                f"e4m3's largest value, {E4M3_MAX:g}.")
    if np.isclose(value, E5M2_MAX / Q1_AMAX, rtol=1e-6):
        raise Wrong("that is the scale for e5m2 (largest value 57344); activations go to e4m3.")
    if np.isclose(value, Q1_AMAX / E4M3_MAX, rtol=1e-6):
        raise Wrong("that is the inverse: the scale multiplies the tensor before the cast, so it "
                    "must map the amax up onto the format's largest value.")
    raise Wrong(f"{value:g} times the amax {Q1_AMAX} is {value * Q1_AMAX:g}, not e4m3's largest "
                "value.")


q1 = Exercise(
    "q1", f"A tensor's largest magnitude is {Q1_AMAX}. What tensorwise scale does current scaling "
    "give it before the cast to e4m3? Answer with a number.", _check_q1,
    hint="The scale maps the amax onto the largest finite e4m3 value (fp8.fp8_max('e4m3')).",
    solution=f"{E4M3_MAX:g} / {Q1_AMAX} = {E4M3_MAX / Q1_AMAX:g}.",
    solution_code="from fp16lab import fp8\nfp8.fp8_max('e4m3') / 3.5")


def _binades(dtype) -> float:
    """Returns log2(largest finite / smallest subnormal) of an ml_dtypes format."""
    info = ml_dtypes.finfo(dtype)
    return float(np.log2(float(info.max) / float(info.smallest_subnormal)))


_SPANS = {"e4m3": _binades(ml_dtypes.float8_e4m3fn), "e5m2": _binades(ml_dtypes.float8_e5m2)}


Q2_ROWS_BINADES = 20          # the rows of the made-up tensor of notebook 09 run from 2^-10 to 2^10
_FORMATS = ("e4m3", "e5m2")


def _q2_pair(answer: object) -> tuple[str, str]:
    if isinstance(answer, str) or not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise Wrong("answer with a pair of formats, (one scale per tensor, one scale per row), "
                    "e.g. ('e4m3', 'e4m3').")
    pair = tuple(str(a).strip().lower() for a in answer)
    if any(a not in _FORMATS for a in pair):
        raise Wrong(f"each format is 'e4m3' or 'e5m2'; got {answer!r}.")
    return pair


def _check_q2(answer: object) -> str:
    per_tensor, per_row = _q2_pair(answer)
    spans = _SPANS
    if per_tensor == "e4m3":
        raise Wrong(f"with one scale per tensor the whole tensor must fit one range: its rows span "
                    f"{Q2_ROWS_BINADES} binades (factors of two) of size and the values inside a row more, while e4m3 "
                    f"spans {spans['e4m3']:.1f} from its smallest subnormal to its largest value "
                    f"(e5m2: {spans['e5m2']:.1f}). Section 2's table of `spread_rows` (tensorwise) shows what e4m3 loses to zero.")
    if per_row == "e5m2":
        raise Wrong("with one scale per tensor, yes: e5m2's range keeps the small rows. But with one "
                    "scale per row each row only needs its own range, which e4m3 holds (the "
                    "rowwise row of section 2's `spread_rows` table), and e4m3 keeps one more mantissa bit: the extra range of e5m2 buys "
                    "nothing there and costs precision.")
    return (f"('e5m2', 'e4m3'): one scale for the whole tensor needs e5m2's {spans['e5m2']:.1f} binades "
            f"(factors of two) of range (e4m3 has {spans['e4m3']:.1f}); once every row has its own scale, e4m3's range "
            "suffices and its extra mantissa bit wins. That is why the FP8 paper's recipe with one "
            "scale per tensor casts gradients to e5m2 (Micikevicius et al. 2022, arXiv 2209.05433), "
            "while DeepSeek-V3, with 1x128 and 128x128 scales, keeps every tensor, gradients "
            "included, in e4m3 (arXiv 2412.19437, section 3.3).")


q2 = Exercise(
    "q2", "Take a gradient whose rows differ in size as much as section 2's made-up tensor "
          "`spread_rows` (2^-10 to 2^10). Which FP8 format would you cast it to with one scale per tensor, and "
          "which with one scale per row? Fewest values lost to zero first, then the most precision. "
          "Answer with a pair, e.g. ('e4m3', 'e4m3').",
    _check_q2,
    hint="In section 2's table of `spread_rows`, compare the e4m3 and e5m2 underflow columns, "
         "scaling by scaling. Then recall which format has the extra mantissa bit.",
    solution="('e5m2', 'e4m3'): per tensor e4m3's range is too short for rows 20 binades apart; per "
             "row it is long enough, and e4m3 has one more mantissa bit.",
    solution_code="from fp16lab.fp8 import ranges\n"
                  "ranges.granularity_census({'rows': spread_rows}, 'e5m2')")


Q3_AMAXES = (2.0, 8.0, 1.0, 1.0, 0.5)
Q3_HISTORY = 3


def _delayed_scale_for_next_step(amaxes, history_len, top=E4M3_MAX) -> float:
    """The scale after the last amax is recorded, by the rule in words: top / max(last N)."""
    return top / max(amaxes[-history_len:])


def _check_q3(answer: object) -> str:
    value = _number(answer)
    right = _delayed_scale_for_next_step(Q3_AMAXES, Q3_HISTORY)
    if np.isclose(value, right, rtol=1e-6):
        window = Q3_AMAXES[-Q3_HISTORY:]
        return (f"{right:g}: the history holds the last {Q3_HISTORY} amaxes {window}, their "
                f"maximum is {max(window):g}, and {E4M3_MAX:g} / {max(window):g} = {right:g}.")
    if np.isclose(value, E4M3_MAX / Q3_AMAXES[-1], rtol=1e-6):
        raise Wrong("that is current scaling (the newest amax only); delayed scaling takes the "
                    f"maximum over the last {Q3_HISTORY} steps.")
    if np.isclose(value, E4M3_MAX / max(Q3_AMAXES), rtol=1e-6):
        raise Wrong(f"the history holds only the last {Q3_HISTORY} amaxes: the 8.0 has left it.")
    raise Wrong(f"{value:g} is not {E4M3_MAX:g} divided by the largest of the last "
                f"{Q3_HISTORY} amaxes.")


q3 = Exercise(
    "q3", f"Delayed scaling with a history of {Q3_HISTORY} steps has recorded the amaxes "
    f"{Q3_AMAXES} (oldest first), with no margin. What e4m3 scale will the next step use? Answer "
    "with a number.",
    _check_q3,
    hint="Only the newest few amaxes are kept; the scale divides e4m3's largest value by their maximum.",
    solution=f"The last {Q3_HISTORY} amaxes are {Q3_AMAXES[-Q3_HISTORY:]}; 448 / "
             f"{max(Q3_AMAXES[-Q3_HISTORY:]):g} = {_delayed_scale_for_next_step(Q3_AMAXES, Q3_HISTORY):g}.",
    solution_code="from fp16lab import fp8\ns = fp8.DelayedScaling('e4m3', history_len=3)\n"
                  "for a in (2.0, 8.0, 1.0, 1.0, 0.5):\n    s.update(a)\ns.scale")


def _check_q4(answer: object) -> str:
    if not callable(answer):
        raise Wrong("give a function: def current_scale(x): return ... (x is a torch tensor).")
    import torch

    rng = np.random.default_rng(9)
    for amax_target in (0.003, 1.0, 700.0):
        x64 = rng.standard_normal((8, 16)) * amax_target
        got = answer(torch.from_numpy(x64.astype(np.float32)))
        value = _number(got.item() if hasattr(got, "item") else got)
        amax = float(np.abs(x64.astype(np.float32)).max())
        right = E4M3_MAX / amax
        if np.isclose(value, right, rtol=1e-5):
            continue
        if np.isclose(value, amax / E4M3_MAX, rtol=1e-5):
            raise Wrong("your function returns amax / 448, the inverse of the scale.")
        if np.isclose(value, E4M3_MAX / float(np.abs(x64.astype(np.float32)).mean()), rtol=1e-5):
            raise Wrong("use the absolute maximum (x.abs().max()), not the mean: the largest value "
                        "must still fit.")
        if np.isclose(value, E4M3_MAX / float(x64.astype(np.float32).max()), rtol=1e-5):
            raise Wrong("take the maximum of |x|: a large negative value needs room too.")
        raise Wrong(f"for a tensor with amax {amax:.4g} your function gave {value:.6g}; the scale "
                    f"that maps it onto 448 is {right:.6g}.")
    return "right on three tensors whose amax spans 0.003 to 700: 448 / x.abs().max()."


q4 = Exercise(
    "q4", "Write current_scale(x): the tensorwise e4m3 scale of a torch tensor x (current scaling).",
    _check_q4,
    hint="Two steps: the absolute maximum of x, then e4m3's largest value divided by it.",
    solution="448 / |x|max; fp8.quantize computes the same (and clamps an all-zero tensor's amax).",
    solution_code="def current_scale(x):\n    return 448.0 / x.abs().max()")


# -- delayed: the delayed-scaling update, from an amax history ----------------------------------
def reference_delayed_scales(amaxes, history_len, margin=0):
    """Returns the e4m3 scale each step uses under delayed scaling, one per amax (oldest first)."""
    scales, scale = [], 1.0                   # no amax recorded yet: the scale starts at 1
    for t in range(len(amaxes)):
        scales.append(scale)                  # fixed before step t's tensor is seen
        top = max(amaxes[max(0, t + 1 - history_len):t + 1])
        if 0 < top < float("inf"):            # a history of zeros or an inf keeps the old scale
            scale = E4M3_MAX / top / 2 ** margin
    return scales


#: Histories the check runs: (amaxes, history_len, margin, what each one tests).
DELAYED_CASES = (
    ((2.0, 8.0, 1.0, 1.0, 0.5, 0.5), 3, 0, "q3's amaxes, one step further"),
    ((1.0, 1.1, 1.2, 60.0, 1.3, 1.4, 1.5, 1.6), 4, 0, "a spike at step 3"),
    ((0.5, 0.25, 0.125, 4.0), 2, 1, "a margin of 1"),
    ((0.0, 0.0, 3.0, float("inf"), 2.0), 2, 0, "zeros first, then an inf"),
)


def _close(a, b) -> bool:
    return len(a) == len(b) and all(np.isclose(x, y, rtol=1e-6) for x, y in zip(a, b))


def _check_delayed(answer: object) -> str:
    if not callable(answer):
        raise Wrong("give the function itself: delayed.check(delayed_scales), without calling it.")
    for amaxes, n, margin, what in DELAYED_CASES:
        try:
            got = answer(list(amaxes), n, margin)
        except Exception as exc:
            raise Wrong(f"on {what} ({list(amaxes)}, history {n}, margin {margin}) delayed_scales "
                        f"raised {type(exc).__name__}: {exc}") from None
        if got is None or got is Ellipsis:
            raise Wrong("delayed_scales returns nothing yet: return one scale per step.")
        try:
            got = [float(g) for g in got]
        except (TypeError, ValueError):
            raise Wrong(f"delayed_scales returned {got!r}; return a list of numbers.") from None
        right = reference_delayed_scales(amaxes, n, margin)
        if _close(got, right):
            continue
        case = f"on {what}, amaxes {list(amaxes)}, history {n}, margin {margin}: you gave {shown(got)}; "
        if len(got) != len(right):
            raise Wrong(case + f"return one scale per step ({len(right)} here), the one that step uses.")
        with np.errstate(divide="ignore"):
            own = [float(np.float64(E4M3_MAX) / max(amaxes[max(0, t + 1 - n):t + 1]) / 2 ** margin)
                   for t in range(len(amaxes))]
        if _close(got, own) or (got and got[0] != 1.0 and np.isclose(got[0], own[0])):
            raise Wrong(case + "each step used its own amax: delayed scaling fixes a step's scale "
                        "before its tensor is seen, from the steps before it (current scaling is "
                        "the one that looks first).")
        if not np.isclose(got[0], 1.0):
            raise Wrong(case + "the first step has no amax recorded yet: its scale is 1.")
        if _close(got, reference_delayed_scales(amaxes, len(amaxes), margin)):
            raise Wrong(case + f"the history holds only the last {n} amaxes: older ones, like a "
                        "past spike, leave it.")
        if margin and _close(got, reference_delayed_scales(amaxes, n, 0)):
            raise Wrong(case + "the margin is ignored: divide the scale by 2**margin.")
        if any(not np.isfinite(g) or g == 0 for g in got):
            raise Wrong(case + "a scale became 0 or inf: when the history's maximum is 0 or not "
                        "finite, keep the previous scale.")
        raise Wrong(case + f"the scales are {shown(right)}.")
    return ("right on four histories: the scale lags one step behind the amaxes, a spike lowers it "
            "for history_len steps and then leaves, and a history of zeros or an inf changes nothing.")


delayed = Exercise(
    "delayed", "Write delayed_scales(amaxes, history_len, margin): the e4m3 scale each step uses "
               "under delayed scaling, given each step's amax (oldest first).", _check_delayed,
    hint="Walk the steps: append the current scale first (it was fixed before this step), then "
         "take the max of the last history_len amaxes up to this one and compute the next scale. "
         "The first scale is 1.",
    solution="One way: a loop that records the scale, then updates it.",
    solution_code=inspect.getsource(reference_delayed_scales).replace(
        "reference_delayed_scales", "delayed_scales"))

"""Exercises of notebook 06 (where the time goes), each answer computed here with numpy or torch."""

from __future__ import annotations

import inspect

import numpy as np

from ..profile import classify
from .core import Exercise, Wrong, expect_close

__all__ = ["gaps", "q1", "q2", "q3", "q4", "Q1_KERNELS", "Q1_WINDOW", "Q2_NAMES"]

#: q1's kernels on one GPU (two streams), as (start_us, duration_us), and the step's window.
Q1_KERNELS = ((0, 40), (50, 30), (75, 25), (120, 10), (125, 10), (160, 30))
Q1_WINDOW = (0, 200)


def _idle_fraction_by_bitmap(kernels, window) -> float:
    lo, hi = window
    busy = np.zeros(hi - lo, dtype=bool)
    for start, dur in kernels:
        busy[max(start, lo) - lo:min(start + dur, hi) - lo] = True
    return 1.0 - busy.sum() / (hi - lo)


def _near(value: float, target: float) -> bool:
    """True when ``value`` is ``target`` written to two decimals (or closer): a learner's slip."""
    return abs(value - target) <= 0.005 + 1e-12


def _check_q1(answer: object) -> str:
    right = _idle_fraction_by_bitmap(Q1_KERNELS, Q1_WINDOW)
    span = Q1_WINDOW[1] - Q1_WINDOW[0]
    summed = 1.0 - sum(d for _, d in Q1_KERNELS) / span
    try:
        value = float(answer)
    except (TypeError, ValueError):
        raise Wrong(f"give the idle fraction as a number between 0 and 1, not {answer!r}.") from None
    if 1 < value <= 100 and _near(value / 100, right):
        raise Wrong(f"{value:g} looks like a percentage; give a fraction between 0 and 1.")
    if _near(value, summed) and not _near(summed, right):
        raise Wrong(f"{value:g} treats overlapping kernels (two streams) as if they ran one after "
                    "the other: time covered by two kernels at once counts once.")
    if _near(value, 1 - right):
        raise Wrong(f"{value:g} is the share of the window the GPU is busy; the question asks for "
                    "the idle share, the time covered by no kernel.")
    if _near(value, 1 - summed):
        raise Wrong(f"{value:g} is the summed kernel durations over the window, a busy share that "
                    "also counts the overlaps twice; merge overlapping kernels, then take the rest.")
    if not 0 <= value <= 1:
        raise Wrong(f"{value:g} is not a fraction between 0 and 1.")
    expect_close(value, right, "merge the kernels that overlap into one interval each (two pairs "
                 "here), add up what they cover, and the idle share is the rest of the window", rel=0.01)
    return (f"{right:.3g}: the kernels cover {(1 - right) * span:.0f} of the {span} µs, so the GPU "
            f"waits {100 * right:.3g}% of the step. Summing durations ({1 - summed:.0%} busy) would "
            "double-count the overlap.")


q1 = Exercise(
    "q1", "Q1_KERNELS lists kernels as (start_us, duration_us); what fraction of Q1_WINDOW is the "
          "GPU idle (covered by no kernel)? Answer with a number between 0 and 1.", _check_q1,
    hint="Merge overlapping intervals first (sort by start; extend the current one while the next "
         "starts before it ends), then idle = 1 - covered / window length.",
    solution="0.325: covered are [0,40), [50,100), [120,135) and [160,190), 135 of 200 µs.",
    solution_code="from fp16lab.profile import busy_us\n"
                  "starts = [s for s, d in ex.Q1_KERNELS]; ends = [s + d for s, d in ex.Q1_KERNELS]\n"
                  "1 - busy_us(starts, ends, ex.Q1_WINDOW) / (ex.Q1_WINDOW[1] - ex.Q1_WINDOW[0])")


#: q2's kernel names, as torch.profiler reports them on a GPU.
Q2_NAMES = (
    "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::Half>>",
    "void at::native::batch_norm_collect_statistics_channels_last_kernel<float>",
    "Memcpy DtoD (Device -> Device)",
)


def _check_q2(answer: object) -> str:
    if not isinstance(answer, (list, tuple)) or len(answer) != len(Q2_NAMES):
        raise Wrong(f"give a list of {len(Q2_NAMES)} kinds, one per name in Q2_NAMES, e.g. "
                    "['gemm-conv', 'elementwise', 'reduction', 'copy'] in the right order.")
    right = [classify(n, "gpu_memcpy" if n.startswith("Memcpy") else "kernel") for n in Q2_NAMES]
    wrong = [(i, a, r) for i, (a, r) in enumerate(zip(answer, right)) if str(a).strip() != r]
    if wrong:
        i, a, r = wrong[0]
        why = {"gemm-conv": "an implicit GEMM is how cuDNN runs a convolution on tensor cores",
               "elementwise": "one output element per input element, nothing summed",
               "reduction": "batch-norm statistics sum over the batch: a reduction",
               "copy": "a device-to-device memory copy"}[r]
        raise Wrong(f"{len(wrong)} of {len(Q2_NAMES)} wrong; the first is name {i} ({a!r}): {why}.")
    return "All four right: " + ", ".join(right) + "."


q2 = Exercise(
    "q2", "Sort each kernel of Q2_NAMES into a kind: 'gemm-conv', 'elementwise', 'reduction', "
          "'copy', 'nccl' or 'other'. Answer with a list in the same order.", _check_q2,
    hint="Look for gemm / xmma / conv, for elementwise, for statistics or reduce, and for Memcpy.",
    solution="['gemm-conv', 'elementwise', 'reduction', 'copy']",
    solution_code="from fp16lab.profile import classify\n[classify(n) for n in ex.Q2_NAMES]")

#: q3's lines of a training step; the ones that stop torch.cuda.graph capture are asked for.
Q3_LINES = {
    "a": "print(f'loss {loss.item():.3f}')",
    "b": "scaler.step(opt)  # opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)",
    "c": "opt.zero_grad(set_to_none=True)",
    "d": "with torch.autocast('cuda', dtype=torch.float16, cache_enabled=False):",
    "e": "if torch.isfinite(loss): opt.step()",
    "f": "scaler.step(opt)  # opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, fused=True)",
}
#: Which of them read a GPU value on the host (a synchronisation, forbidden while capturing).
_SYNCS = {"a": True, "b": True, "c": False, "d": False, "e": True, "f": False}


def _check_q3(answer: object) -> str:
    if isinstance(answer, str):
        answer = [c for c in answer.replace(",", " ").split()]
        if len(answer) == 1 and len(answer[0]) > 1 and set(answer[0].lower()) <= set(Q3_LINES):
            answer = list(answer[0])          # 'abe': the letters written together
    try:
        given = {str(a).strip().lower() for a in answer}
    except TypeError:
        raise Wrong("give the letters, e.g. {'a', 'c'} or 'a c'.") from None
    unknown = given - set(Q3_LINES)
    if unknown:
        raise Wrong(f"{sorted(unknown)} are not among the lines a-f.")
    right = {k for k, v in _SYNCS.items() if v}
    if "f" in given:
        raise Wrong("f is capturable: a fused SGD takes GradScaler's found_inf as a GPU tensor "
                    "and skips the update on the GPU, with no question asked of the host.")
    if "c" in given or "d" in given:
        raise Wrong("zero_grad(set_to_none=True) and autocast without its cache launch nothing "
                    "that reads the GPU from the host; both are fine inside a capture.")
    missing = right - given
    if missing:
        line = sorted(missing)[0]
        raise Wrong(f"you missed {line}: {Q3_LINES[line]!r} needs a value from the GPU on the host.")
    return ("a, b and e: each makes the host wait for a GPU value (.item(), GradScaler's "
            "found_inf check before a non-fused step, a tensor used as a Python bool).")


q3 = Exercise(
    "q3", "Which lines of Q3_LINES stop torch.cuda.graph from capturing the step? Answer with "
          "their letters.", _check_q3,
    hint="Capture records GPU work without running it; anything that needs a GPU result on the "
         "host (a Python number or bool from a tensor) cannot be recorded.",
    solution="a, b, e. (f is the fix for b: a fused optimizer skips inf steps on the GPU.)")


def _check_q4(answer: object) -> str:
    if not callable(answer):
        raise Wrong("pass your function itself, e.g. q4.check(ceiling), not its result.")
    rng = np.random.default_rng()
    for batch, kernel_ms in [(64, 10.0), (256, 40.5), *zip(rng.integers(1, 1024, 5).tolist(),
                                                           rng.uniform(0.05, 80, 5).tolist())]:
        right = batch / (kernel_ms / 1e3)
        got = answer(batch, kernel_ms)
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise Wrong(f"ceiling({batch}, {kernel_ms}) returned {got!r}; return a number "
                        "(samples per second).") from None
        if np.isclose(got, batch / kernel_ms, rtol=1e-6):
            raise Wrong(f"ceiling({batch}, {kernel_ms}) = {got:g} is samples per millisecond; "
                        "kernel time is in ms, so convert to seconds.")
        if np.isclose(got, kernel_ms / batch, rtol=1e-6) or np.isclose(got, 1e3 * kernel_ms / batch,
                                                                       rtol=1e-6):
            raise Wrong("that is time per sample; the question asks for samples per second.")
        if not np.isclose(got, right, rtol=1e-6):
            raise Wrong(f"ceiling({batch}, {kernel_ms}) returned {got:g}; not the rate the kernels "
                        "alone allow.")
    return ("Right: with no gap between kernels a step lasts exactly its summed kernel time, so "
            "batch / kernel seconds is the most any execution mode can reach.")


q4 = Exercise(
    "q4", "Write ceiling(batch, kernel_ms): the samples/s of a step that lasts exactly its summed "
          "kernel time kernel_ms (in milliseconds). Check it with q4.check(ceiling).", _check_q4,
    hint="A step of batch samples that takes kernel_ms milliseconds processes batch samples per "
         "kernel_ms / 1000 seconds.",
    solution="def ceiling(batch, kernel_ms):\n    return batch / (kernel_ms / 1e3)",
    solution_code="def ceiling(batch, kernel_ms):\n    return batch / (kernel_ms / 1e3)")


# -- gaps: the idle gaps of a timeline --------------------------------------------------------------
def reference_idle_gaps(kernels, window):
    """Returns the (start, end) stretches of ``window`` that no kernel covers, in order."""
    lo, hi = window
    gaps, covered_to = [], lo
    for start, duration in sorted(kernels):
        start, end = max(start, lo), min(start + duration, hi)
        if start > covered_to:
            gaps.append((covered_to, start))
        covered_to = max(covered_to, end)
    if covered_to < hi:
        gaps.append((covered_to, hi))
    return gaps


def _unsorted(kernels, window):  # the reference without sorting by start
    lo, hi = window
    gaps, covered_to = [], lo
    for start, duration in kernels:
        if start > covered_to:
            gaps.append((covered_to, start))
        covered_to = max(covered_to, start + duration)
    return gaps + ([(covered_to, hi)] if covered_to < hi else [])


def _last_end(kernels, window):  # covered_to = the last kernel's end, not the latest end so far
    lo, hi = window
    gaps, covered_to = [], lo
    for start, duration in sorted(kernels):
        if start > covered_to:
            gaps.append((covered_to, start))
        covered_to = start + duration
    return gaps + ([(covered_to, hi)] if covered_to < hi else [])


#: Timelines the check runs: (kernels, window, what each one tests).
GAP_CASES = (
    (Q1_KERNELS, Q1_WINDOW, "q1's timeline"),
    (((90, 20), (10, 30), (50, 10)), (0, 120), "kernels listed out of order"),
    (((0, 100), (20, 10), (110, 10)), (0, 150), "a short kernel inside a long one"),
    (((10, 20), (30, 20), (70, 10)), (0, 100), "two kernels that touch"),
    (((-20, 40), (90, 30)), (0, 100), "kernels that start before the window or end after it"),
    ((), (0, 50), "no kernel at all"),
)


def _as_gaps(value: object) -> list[tuple[float, float]]:
    try:
        return [(float(a), float(b)) for a, b in value]
    except (TypeError, ValueError):
        raise Wrong(f"idle_gaps returned {value!r}; return a list of (start, end) pairs.") from None


def _check_gaps(answer: object) -> str:
    if not callable(answer):
        raise Wrong("give the function itself: gaps.check(idle_gaps), without calling it.")
    for kernels, window, what in GAP_CASES:
        try:
            value = answer(list(kernels), window)
        except Exception as exc:
            raise Wrong(f"on {what} ({list(kernels)}, window {window}) idle_gaps raised "
                        f"{type(exc).__name__}: {exc}") from None
        if value is None or value is Ellipsis:
            raise Wrong("idle_gaps returns nothing yet: return the list of (start, end) gaps.")
        got, right = _as_gaps(value), [(float(a), float(b)) for a, b in reference_idle_gaps(kernels, window)]
        if got == right:
            continue
        case = f"on {what}, kernels {list(kernels)} in window {window}, you gave {got}; "
        if any(b < a for a, b in got):
            raise Wrong(case + "a gap ends before it starts: two kernels overlap there. Merge "
                        "overlapping kernels: a gap starts only where every kernel so far has ended.")
        if any(b == a for a, b in got) and [g for g in got if g[1] > g[0]] == right:
            raise Wrong(case + "drop gaps of zero length: kernels that touch leave no idle time.")
        if got == [(float(a), float(b)) for a, b in _last_end(kernels, window)]:
            raise Wrong(case + "a short kernel inside a longer one ended the covered stretch early: "
                        "keep the latest end seen so far, not the last kernel's end.")
        if got == [(float(a), float(b)) for a, b in _unsorted(kernels, window)]:
            raise Wrong(case + "the kernels are not in start order: sort them by start first.")
        if right and got == right[1:] and right[0][0] == window[0]:
            raise Wrong(case + "the gap before the first kernel is missing: the window starts idle.")
        if right and got == right[:-1] and right[-1][1] == window[1]:
            raise Wrong(case + "the gap after the last kernel is missing: the window ends idle.")
        if any(a < window[0] or b > window[1] for a, b in got):
            raise Wrong(case + "a gap reaches outside the window: clip each kernel to the window.")
        raise Wrong(case + f"the idle gaps are {right}.")
    return ("right on all six timelines: out of order, nested, touching, clipped and empty. Their "
            "lengths summed over the window is the idle fraction of q1; the longest gaps are where "
            "to look first on a real timeline.")


gaps = Exercise(
    "gaps", "Write idle_gaps(kernels, window): the (start, end) stretches of the window that no "
            "kernel covers, in order; kernels are (start_us, duration_us) and may overlap.",
    _check_gaps,
    hint="Sort by start and walk along, remembering how far the kernels so far cover; a gap "
         "opens where the next kernel starts beyond that. Clip to the window; mind the two ends.",
    solution="One way: a sweep over the kernels sorted by start.",
    solution_code=inspect.getsource(reference_idle_gaps).replace("reference_idle_gaps", "idle_gaps"))

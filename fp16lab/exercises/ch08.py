"""Exercises of notebook 08 (beyond one GPU), each answer computed here with numpy and ml_dtypes."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from .core import Exercise, Wrong

__all__ = ["q1", "q2", "q3", "q4"]

# q1: a scenario, not a measurement
Q1_ONE, Q1_TWO = 5200.0, 9800.0


def _number(answer: object) -> float:
    try:
        value = float(answer)
    except (TypeError, ValueError):
        raise Wrong(f"give a number, not {type(answer).__name__} {answer!r}.") from None
    return value


def _check_q1(answer: object) -> str:
    value = _number(answer)
    right = Q1_TWO / (2 * Q1_ONE)
    if math.isclose(value, right, rel_tol=2e-3):
        return (f"{right:.3f}: two GPUs give {Q1_TWO:g} img/s where two perfectly independent ones "
                f"would give {2 * Q1_ONE:g}; the {1 - right:.1%} missing is what communication costs.")
    if math.isclose(value, Q1_TWO / Q1_ONE, rel_tol=2e-3):
        raise Wrong(f"{value:.3f} is the speed-up. Efficiency divides it by the number of GPUs.")
    if math.isclose(value, right * 100, rel_tol=2e-3):
        raise Wrong("give it as a fraction (0.9), not a percentage (90).")
    if math.isclose(value, 1 - right, rel_tol=2e-3):
        raise Wrong(f"{value:.3f} is the share that goes missing; the efficiency is the share that "
                    "remains: the 2-GPU rate over twice the 1-GPU rate.")
    if math.isclose(value, 1 / right, rel_tol=2e-3):
        raise Wrong(f"{value:.3f} is the ideal rate over the measured one, upside down: divide the "
                    "2-GPU rate by twice the 1-GPU rate.")
    if math.isclose(value, (Q1_TWO - Q1_ONE) / Q1_ONE, rel_tol=2e-3):
        raise Wrong(f"{value:.3f} is what the second GPU added, over one GPU's rate. Efficiency "
                    "compares the whole 2-GPU rate with two perfectly independent GPUs.")
    raise Wrong(f"{value:g} is not the 2-GPU rate ({Q1_TWO:g}) over twice the 1-GPU rate "
                f"(2 x {Q1_ONE:g}).")


q1 = Exercise(
    "q1", f"One GPU trains {Q1_ONE:g} img/s, two train {Q1_TWO:g} img/s together. What is the "
          "scaling efficiency (a fraction)?", _check_q1,
    hint="Perfect scaling would double the rate. Compare the 2-GPU rate with that.",
    solution=f"{Q1_TWO:g} / (2 x {Q1_ONE:g}) = {Q1_TWO / (2 * Q1_ONE):.4f}",
    solution_code=f"{Q1_TWO} / (2 * {Q1_ONE})")

# q2: ring all-reduce of fp32 gradients
Q2_PARAMS, Q2_RANKS, Q2_BUS_GBS = 300e6, 8, 400.0


def _ring_ms(nbytes: float, ranks: int, bus_gbs: float) -> float:
    return 2 * (ranks - 1) / ranks * nbytes / (bus_gbs * 1e9) * 1e3


def _check_q2(answer: object) -> str:
    value = _number(answer)
    right = _ring_ms(Q2_PARAMS * 4, Q2_RANKS, Q2_BUS_GBS)
    if math.isclose(value, right, rel_tol=0.01):
        return (f"{right:.2f} ms: 1.2 GB of fp32 gradients, and each rank sends (and receives) "
                f"2 x 7/8 of it in a ring (reduce-scatter, then all-gather).")
    if math.isclose(value, Q2_PARAMS * 4 / (Q2_BUS_GBS * 1e9) * 1e3, rel_tol=0.01):
        raise Wrong("that is one pass over the buffer. A ring all-reduce is a reduce-scatter plus an "
                    "all-gather: each rank moves 2 (n-1)/n times the buffer.")
    if math.isclose(value, _ring_ms(Q2_PARAMS * 2, Q2_RANKS, Q2_BUS_GBS), rel_tol=0.01):
        raise Wrong("that is the time for 2-byte gradients (a fp16 or bf16 hook). The question is "
                    "about fp32 gradients, 4 bytes each.")
    if math.isclose(value, right / 1e3, rel_tol=0.01):
        raise Wrong("answer in milliseconds, not seconds.")
    raise Wrong(f"{value:g} ms is not it: bytes x 2 (n-1)/n / bandwidth.")


q2 = Exercise(
    "q2", f"{Q2_PARAMS / 1e6:g} million fp32 gradients are all-reduced across {Q2_RANKS} GPUs with a "
          f"ring at {Q2_BUS_GBS:g} GB/s bus bandwidth. How many milliseconds does it take?",
    _check_q2,
    hint="Bytes first (4 per fp32 value). A ring moves 2 (n-1)/n times the buffer per rank.",
    solution=f"300e6 x 4 bytes x 2 x 7/8 / 400e9 B/s = {_ring_ms(Q2_PARAMS * 4, Q2_RANKS, Q2_BUS_GBS):.2f} ms",
    solution_code="from fp16lab.distributed import allreduce_seconds\n"
                  "allreduce_seconds(300e6 * 4, 8, 400) * 1e3")

# q3: what fp16_compress_hook does to a scaled gradient
Q3_GRADS = (70000.0, 50000.0)


def _fp16_hook(values: tuple[float, ...]) -> float:
    with np.errstate(over="ignore"):
        parts = [np.float16(np.float32(v)) / np.float16(len(values)) for v in values]
        return float(np.float16(sum(parts, np.float16(0))))


def _check_q3(answer: object) -> str:
    value = float(answer) if isinstance(answer, str) and answer.strip().lower() in ("inf", "+inf") \
        else _number(answer)
    right = _fp16_hook(Q3_GRADS)
    if value == right or (math.isinf(right) and math.isinf(value) and value > 0):
        return ("inf: the hook casts each bucket to fp16 *before* dividing by the number of ranks, and "
                f"{Q3_GRADS[0]:g} is past fp16's largest value, 65504. GradScaler then sees inf, skips "
                "the step on every rank and halves the scale: the hook's range, not the model's, set it.")
    mean = sum(Q3_GRADS) / len(Q3_GRADS)
    if math.isclose(value, mean, rel_tol=1e-3):
        raise Wrong(f"{mean:g} is the fp32 average (or what dividing before the cast would give). "
                    "Follow the hook's order: cast to fp16, then divide, then sum.")
    raise Wrong(f"{value:g} is not what the averaged gradient becomes.")


q3 = Exercise(
    "q3", f"GradScaler has scaled the loss; one weight's gradient is {Q3_GRADS[0]:g} on rank 0 and "
          f"{Q3_GRADS[1]:g} on rank 1. DDP averages it with fp16_compress_hook. What value does the "
          "weight's .grad hold afterwards? (a number, or 'inf')", _check_q3,
    hint="Read the hook: buffer.to(torch.float16).div_(world_size), then all_reduce(sum). "
         "What is the largest fp16 value?",
    solution="inf: fp16(70000) is already inf before the division.",
    solution_code="import numpy as np\nnp.float16(70000.0)")


# q4: found-inf agreement
def _ranks_that_skip(grads_finite: tuple[bool, ...]) -> set[int]:
    # the all-reduce sums the gradients: one inf makes every rank's averaged gradient inf
    summed = np.sum([0.0 if ok else np.inf for ok in grads_finite])
    return set(range(len(grads_finite))) if not np.isfinite(summed) else set()


def _check_q4(answer: object) -> str:
    try:
        given = {int(r) for r in answer}
    except (TypeError, ValueError):
        raise Wrong("give the ranks as a set of integers, e.g. {0} or {0, 1} or set().") from None
    right = _ranks_that_skip((True, False))
    if given == right:
        return ("{0, 1}: the all-reduce adds rank 1's inf into rank 0's gradient too, so both "
                "GradScalers find it, both skip and both halve the scale. The ranks stay identical.")
    if given == {1}:
        raise Wrong("rank 1 skips, but it does not decide alone: its gradient is all-reduced with "
                    "rank 0's before GradScaler looks. What is x + inf?")
    if not given:
        raise Wrong("an inf in any rank's gradient makes the step unusable; someone must skip.")
    raise Wrong(f"{sorted(given)} is not it.")


q4 = Exercise(
    "q4", "Two ranks train with DDP and GradScaler. Rank 1's scaled gradients overflow to inf, rank "
          "0's are finite. Which ranks skip the optimizer step? (a set of ranks)", _check_q4,
    hint="GradScaler looks at the gradients after DDP has all-reduced them.",
    solution="{0, 1}: after the all-reduce every rank holds the inf.")

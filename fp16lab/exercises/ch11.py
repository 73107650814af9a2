"""Exercises of notebook 11 (weights in 16 bits): which updates a BF16 weight swallows,
stochastic rounding of an FP32 tensor to BF16 written by the learner, checked by counting, and
the memory a way of holding the weights takes for a large model."""

from __future__ import annotations

import math

import torch

from ..state16 import bytes_per_parameter, vanished_share
from .core import Exercise, Wrong, shown

__all__ = ["Q1_WEIGHTS", "Q1_UPDATE", "Q3_PARAMETERS", "q1", "q2", "q3"]

#: q1's BF16 weights and the one update added to each.
Q1_WEIGHTS = (1.0, 0.01, 256.0, 0.5, 0.0625, 3.0)
Q1_UPDATE = 1e-3


def _vanishing() -> set[int]:
    w = torch.tensor(Q1_WEIGHTS, dtype=torch.bfloat16)
    u = torch.full((len(Q1_WEIGHTS),), Q1_UPDATE)
    return {i for i in range(len(Q1_WEIGHTS))
            if vanished_share(w[i:i + 1], u[i:i + 1]) == 1.0}


def _check_q1(answer: object) -> str:
    try:
        given = {int(i) for i in answer}
    except (TypeError, ValueError):
        raise Wrong(f"give the indices as a set or list of whole numbers, not "
                    f"{type(answer).__name__}.") from None
    right = _vanishing()
    outside = sorted(i for i in given if not 0 <= i < len(Q1_WEIGHTS))
    if outside:
        raise Wrong(f"index {outside[0]} is not one of the weights (0 to {len(Q1_WEIGHTS) - 1}).")
    for i in sorted(given ^ right):
        w = Q1_WEIGHTS[i]
        e = math.floor(math.log2(w))
        if i in right:
            raise Wrong(f"you left out index {i} ({w:g}): its BF16 neighbours are 2^{e - 7} apart, "
                        f"so an update of {Q1_UPDATE:g} is below half that (2^{e - 8}) and vanishes.")
        raise Wrong(f"you included index {i} ({w:g}), but its BF16 neighbours are 2^{e - 7} apart: "
                    f"an update of {Q1_UPDATE:g} reaches half that (2^{e - 8}) and moves it.")
    return (f"right: {sorted(right)}. An update vanishes where it is below half the weight's "
            f"spacing, 2^(exponent - 8): the larger the weight, the larger the update it needs.")


q1 = Exercise(
    "q1", f"Each BF16 weight of {list(Q1_WEIGHTS)} gets the update {Q1_UPDATE:g}. Which indices "
    "keep their weight unchanged when the update is added (w + update, rounded to nearest)? "
    "Give a set of indices.", _check_q1,
    hint="BF16 keeps 8 significant bits: between 2^e and 2^(e+1) its values are 2^(e-7) apart. "
         "An update below half that spacing rounds away.",
    solution="Compare the update with half the spacing, 2^(e-8), e the exponent of the weight: "
             "1.0 (half spacing 2^-8 = 0.0039), 256 (1), 0.5 (0.00195) and 3.0 (0.0078) swallow "
             "it; 0.01 (2^-15) and 0.0625 (2^-12 = 0.00024) move.",
    solution_code="{0, 2, 3, 5}")


def _check_q2(answer: object) -> str:
    if not callable(answer):
        raise Wrong(f"give a function f(x) that returns x rounded to bfloat16, not "
                    f"{type(answer).__name__}.")
    torch.manual_seed(0)
    # a BF16 value first (it must stay), then fractions 1/8, 1/4 (negative), 0.8 and 1/8 of a
    # subnormal
    x = torch.tensor([1.0, 1 + 2.0**-10, -(3 + 5 * 2.0**-8), 0.1, 2.0**-130 * (1 + 2.0**-6)],
                     dtype=torch.float32)
    xs = x.repeat(20000, 1)
    out = answer(xs.clone())
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or out.shape != xs.shape:
        what = out.dtype if isinstance(out, torch.Tensor) else type(out).__name__
        raise Wrong(f"f(x) should return a bfloat16 tensor of x's shape, it returned {what}.")
    lows = (x.view(torch.int32) & -65536).view(torch.float32)
    highs = torch.where(lows == x, lows, (lows.view(torch.int32) + 65536).view(torch.float32))
    got = out.float()
    for j in range(len(x)):
        col = got[:, j]
        allowed = {float(lows[j]), float(highs[j])}
        if not set(col.unique().tolist()) <= allowed:
            raise Wrong(f"x = {float(x[j]):.6g} should round only to its two BF16 neighbours "
                        f"{shown(sorted(allowed))}; got "
                        f"{shown(sorted(set(col.unique().tolist()) - allowed)[:3])}.")
        if lows[j] == highs[j]:
            continue
        want = float((x[j].abs() - lows[j].abs()) / (highs[j].abs() - lows[j].abs()))
        up = float((col == highs[j]).float().mean())
        sigma = math.sqrt(want * (1 - want) / len(col))
        if abs(up - want) > 6 * sigma + 1e-4:
            raise Wrong(f"x = {float(x[j]):.6g} went to the neighbour away from zero in {up:.3f} "
                        f"of the draws; stochastic rounding goes there with probability "
                        f"{want:.3f} (its distance from the neighbour nearer zero, over their spacing).")
    return ("right: each value went to one of its two BF16 neighbours, away from zero with "
            "probability equal to its distance from the nearer-to-zero one over their spacing, "
            "so on average the rounding adds nothing.")


q2 = Exercise(
    "q2", "Write f(x): a float32 tensor rounded to bfloat16 stochastically (up with probability "
    "given by the distance), as fp16lab.state16.stochastic_round_bf16 does. Pass the function.",
    _check_q2,
    hint="BF16 is float32 with its low 16 bits dropped. Think of what adding a random number to "
         "those 16 bits, before dropping them, does to the bit above (x.view(torch.int32) gives "
         "the bits).",
    solution="Adding a uniform 16-bit random number to the bits carries into bit 16 exactly when "
             "the dropped part plus the random number reaches 2^16: with probability dropped / 2^16.",
    solution_code="def f(x):\n"
                  "    r = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32)\n"
                  "    return ((x.view(torch.int32) + r) & -65536).view(torch.float32).to(torch.bfloat16)",
    time_limit_s=60.0)


# --------------------------------------------------------------------------- q3: the memory table

#: q3's model: a 7-billion-parameter model trained with AdamW.
Q3_PARAMETERS = 7e9
#: A gigabyte, as q3 asks for it (not a GiB, 2^30).
GB = 1e9


def _check_q3(answer: object) -> str:
    try:
        total, saved = (float(v) for v in answer)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise Wrong("give two numbers, (gigabytes under fp32-master, gigabytes bf16-kahan saves), "
                    f"not {answer!r}.") from None
    full, kahan = bytes_per_parameter("fp32-master"), bytes_per_parameter("bf16-kahan")
    right = (Q3_PARAMETERS * full / GB, Q3_PARAMETERS * (full - kahan) / GB)
    if all(math.isclose(a, r, rel_tol=0.02) for a, r in zip((total, saved), right)):
        return (f"right: {right[0]:.0f} GB and {right[1]:.0f} GB. fp32-master holds {full} bytes "
                f"per parameter (weight 4, gradient 4, two FP32 moments 8); bf16-kahan {kahan} "
                "(weight 2, gradient 2, moments 8, the Kahan buffer 2). Most of what is left is "
                "the moments: 8-bit moments (bf16-8bit-state) are where the next saving is.")
    if math.isclose(total, right[0] / 2 ** 30 * GB, rel_tol=0.02):
        raise Wrong(f"{total:g} is in GiB (2^30 bytes); give gigabytes, 10^9 bytes.")
    no_grad = Q3_PARAMETERS * bytes_per_parameter("fp32-master", gradient=False) / GB
    if math.isclose(total, no_grad, rel_tol=0.02):
        raise Wrong(f"{total:g} GB leaves out the gradients: a step holds one per parameter, as "
                    "many bytes as the weight.")
    if not math.isclose(total, right[0], rel_tol=0.02):
        raise Wrong(f"{total:g} GB is not what fp32-master holds: add up its bytes per parameter "
                    "(weight, gradient, each moment) from the table, then multiply.")
    if math.isclose(saved, Q3_PARAMETERS * (full - kahan + 2) / GB, rel_tol=0.02):
        raise Wrong(f"{saved:g} GB forgets the Kahan buffer: bf16-kahan keeps 2 more bytes per "
                    "parameter than plain BF16 weights.")
    raise Wrong(f"{total:g} GB is right, {saved:g} GB is not: subtract bf16-kahan's bytes per "
                "parameter from fp32-master's, then multiply.")


q3 = Exercise(
    "q3", "A model of 7 billion parameters (Q3_PARAMETERS) trains with AdamW. From the table of "
          "bytes per parameter, how many gigabytes (10^9 bytes) do its weights, gradients and "
          "optimizer state take under fp32-master, and how many does bf16-kahan save? Answer "
          "with two numbers.", _check_q3,
    hint="Bytes per parameter times the number of parameters; the predicted column already "
         "counts the gradient.",
    solution="fp32-master: 16 bytes x 7e9 = 112 GB; bf16-kahan: 14 bytes, so it saves "
             "2 x 7e9 = 14 GB.")

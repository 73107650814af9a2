"""Exercises of notebook 01 (FP16, bit by bit), each checked against numpy and ml_dtypes."""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np

from .core import Exercise, Wrong, expect_power_of_two, shown

__all__ = ["q1", "q2", "q3", "q4", "q5"]

#: The values q3 asks about.
Q3_VALUES = (1e-5, 1e-7, 3e-8, 2.98e-8, 1e-8)


def _fp16_hex(x: float) -> str:
    return f"0x{int(np.array(x, dtype=np.float16).view(np.uint16)):04x}"


def _bf16_hex(x: float) -> str:
    return f"0x{int(np.array(x, dtype=ml_dtypes.bfloat16).view(np.uint16)):04x}"


def _check_q1(answer: object) -> str:
    if not isinstance(answer, str) or not re.fullmatch(r"\s*0[xX][0-9a-fA-F]{1,4}\s*", answer):
        raise Wrong("give the code as a hex string such as '0x3c00' (that one is 1.0).")
    given = f"0x{int(answer, 16):04x}"
    right = _fp16_hex(0.1)
    if given == right:
        value = float(np.array(int(right, 16), dtype=np.uint16).view(np.float16))
        return (f"{right}: exponent field 01011 (2^-4), mantissa 1001100110. It decodes to "
                f"{value!r}, the FP16 value nearest to 0.1.")
    if given == _bf16_hex(0.1):
        raise Wrong(f"{given} is 0.1 in bf16 (8 exponent bits). FP16 has 5 exponent bits, bias 15.")
    below = f"0x{int(right, 16) - 1:04x}"
    if given == below:
        raise Wrong(f"{given} is one code too low: it is what truncating (rounding toward zero) "
                    "gives. Round to the nearest code.")
    raise Wrong(f"{given} decodes to {float(np.array(int(given, 16), dtype=np.uint16).view(np.float16))!r}, "
                "not the FP16 value nearest to 0.1.")


q1 = Exercise(
    "q1", "What is the FP16 code of 0.1? Answer with a hex string, e.g. '0x3c00'.", _check_q1,
    hint="0.1 = 1.6 x 2^-4: the exponent field is 15 - 4 = 11, and the mantissa is 0.6 x 1024, "
         "rounded to the nearest integer.",
    solution="0x2e66: sign 0, exponent 01011, mantissa round(0.6 x 1024) = 614 = 1001100110.",
    solution_code="from fp16lab.bits import explain\nexplain(0.1, 'fp16')")


def _check_q2(answer: object) -> str:
    spacing = {name: float(np.spacing(np.array(0.1, dtype=dt)))
               for name, dt in (("fp16", np.float16), ("bf16", ml_dtypes.bfloat16))}
    ratio = spacing["bf16"] / spacing["fp16"]
    try:
        value = float(answer)
    except (TypeError, ValueError):
        raise Wrong(f"give a number, not {answer!r}.") from None
    if value == ratio:
        return (f"{ratio:g}x: near 0.1 the gap between neighbours is {spacing['fp16']:.3g} in FP16 "
                f"and {spacing['bf16']:.3g} in bf16; 3 more fraction bits give 2^3 = 8 times finer.")
    if value == 3:
        raise Wrong("3 is the number of extra fraction bits; each bit halves the spacing.")
    raise Wrong(f"{value:g} is not the ratio of the two spacings near 0.1 (np.spacing tells you).")


q2 = Exercise(
    "q2", "How many times finer is FP16's spacing than bf16's near 0.1? Answer with a number.",
    _check_q2,
    hint="FP16 has 10 fraction bits, bf16 has 7; near 0.1 both have the same exponent.",
    solution="8: each extra fraction bit halves the spacing, and 2^(10-7) = 8.",
    solution_code="import numpy as np, ml_dtypes\n"
                  "np.spacing(np.float16(0.1)) , np.spacing(ml_dtypes.bfloat16(0.1))")


def _check_q3(answer: object) -> str:
    if isinstance(answer, (int, float)) or not hasattr(answer, "__iter__") or isinstance(answer, str):
        raise Wrong("give a list of the values that become zero, e.g. [1e-8] (an empty list [] "
                    "if none does).")
    try:
        given = {float(v) for v in answer}
    except (TypeError, ValueError):
        raise Wrong(f"give a list of numbers taken from {list(Q3_VALUES)}.") from None
    strangers = given - set(Q3_VALUES)
    if strangers:
        raise Wrong(f"{sorted(strangers)} is not among the values asked about: {list(Q3_VALUES)}.")
    zero = {v for v in Q3_VALUES if float(np.float16(v)) == 0.0}
    if given == zero:
        return (f"{sorted(zero)} round to 0: FP16's smallest subnormal is 2^-24 ~ 5.96e-8, and "
                "anything at or below half of it (2^-25 ~ 2.98e-8) rounds to zero. 3e-8 is just "
                "above that half-way point, so it rounds up to 2^-24.")
    if given - zero:
        kept = sorted(given - zero)
        raise Wrong(f"{kept} do not become zero: in FP16 they are "
                    f"{shown(np.float16(v) for v in kept)}. Subnormals reach down to 2^-24.")
    raise Wrong(f"{sorted(zero - given)} also become zero: a value rounds to 0 when it is at or "
                "below half the smallest subnormal.")


q3 = Exercise(
    "q3", f"Which of {list(Q3_VALUES)} become exactly 0 when stored in FP16? Answer with a list.",
    _check_q3,
    hint="The smallest FP16 subnormal is 2^-24 ~ 5.96e-8. Round to nearest: where is the half-way "
         "point between 0 and it, and which way does a tie go?",
    solution="2.98e-8 and 1e-8: half of 2^-24 is 2^-25 ~ 2.980232e-8, and 2.98e-8 lies just below "
             "it; 3e-8 lies above and rounds up to 2^-24.",
    solution_code="[v for v in [1e-5, 1e-7, 3e-8, 2.98e-8, 1e-8] if np.float16(v) == 0]")


def _check_q4(answer: object) -> str:
    value = expect_power_of_two(answer, "the update")
    one = np.float16(1.0)
    changes = [k for k in range(1, 30) if np.float16(1.0 + 2.0**-k) != one]
    right = 2.0 ** -max(changes)
    if value == right:
        return (f"2^{math.log2(right):.0f}: the FP16 spacing just above 1.0 is 2^-10. Adding 2^-11 "
                "lands exactly half-way and ties round to the even code, 1.0; anything smaller is "
                "lost too. An increase lr*g of 2^-11 or less leaves an FP16 weight of 1.0 where it "
                "was: the reason for FP32 master weights.")
    if value == right / 2:
        raise Wrong("2^-11 is exactly half the spacing at 1.0: 1 + 2^-11 is a tie, and a tie "
                    "rounds to the even code, which is 1.0. The weight does not change.")
    if value < right:
        raise Wrong(f"1 + 2^{math.log2(value):.0f} rounds back to 1.0 in FP16: the update is lost.")
    raise Wrong(f"2^{math.log2(value):.0f} changes the weight, but a smaller power of two does too.")


q4 = Exercise(
    "q4", "An FP16 weight is 1.0. What is the smallest power of two that, added to it and stored "
          "in FP16, changes it? Answer like 2**-12.", _check_q4,
    hint="The gap between 1.0 and the next FP16 number is 2^-10. Where does round-to-nearest-even "
         "send a value exactly half-way?",
    solution="2**-10: 2**-11 is the half-way tie and rounds back to 1.0 (even).",
    solution_code="[k for k in range(1, 16) if np.float16(1.0 + 2.0**-k) != 1.0][-1]  # 10")

#: q5 runs the learner's update this many times with these values.
Q5_STEPS, Q5_LR, Q5_GRAD, Q5_W0 = 1000, 1e-3, 0.05, 1.0


def _check_q5(answer: object) -> str:
    if not callable(answer):
        raise Wrong("give the function itself: q5.check(sgd_update), without calling it.")
    master = np.float32(Q5_W0)
    for _ in range(Q5_STEPS):
        out = answer(master, Q5_GRAD, Q5_LR)
        if out is None:
            raise Wrong("sgd_update returned None: write its body in place of the ... and "
                        "return (new_master, new_fp16_weight).")
        if out is Ellipsis or not isinstance(out, tuple) or len(out) != 2:
            raise Wrong("sgd_update must return two values: (new_master, new_fp16_weight).")
        master, weight = out
        if np.asarray(weight).dtype != np.float16 or np.asarray(master).dtype != np.float32:
            raise Wrong(f"return the master weight as np.float32 and the model's copy as "
                        f"np.float16; you returned {np.asarray(master).dtype} and "
                        f"{np.asarray(weight).dtype}.")
    exact = Q5_W0 - Q5_STEPS * Q5_LR * Q5_GRAD  # float64 reference
    want = np.float16(exact)
    if float(weight) == float(np.float16(Q5_W0)):
        raise Wrong(f"after {Q5_STEPS} updates of lr*g = {Q5_LR * Q5_GRAD:g} the FP16 weight is "
                    f"still {float(weight):g}: each update was added to an FP16 number and lost. "
                    "Add it to the FP32 master, then cast the master to FP16.")
    if abs(float(weight) - float(want)) > float(np.spacing(want)):
        raise Wrong(f"after {Q5_STEPS} steps the FP16 weight is {float(weight):g}; plain SGD "
                    f"(w - lr*g) in exact arithmetic gives {exact:g} ({float(want):g} in FP16).")
    return (f"the master moved from {Q5_W0:g} to {float(master):.6g} (exact: {exact:g}) and the "
            f"FP16 copy follows it ({float(weight):g}). Each update of {Q5_LR * Q5_GRAD:g} is "
            "below half the FP16 spacing at 1.0, so without the master it would be lost.")


q5 = Exercise(
    "q5", "Write sgd_update(master, grad, lr) returning (new_master, new_fp16_weight): one SGD "
          "step kept in an FP32 master weight, with the FP16 copy the model computes with.",
    _check_q5,
    hint="Update the np.float32 master with master - lr * grad (kept in np.float32), then the "
         "model's copy is that master cast to np.float16.",
    solution="Update in FP32, cast to FP16 afterwards; never add the update to the FP16 copy.",
    solution_code="def sgd_update(master, grad, lr):\n"
                  "    master = np.float32(master - np.float32(lr * grad))\n"
                  "    return master, np.float16(master)")

"""Exercises of notebook 01 (FP16, bit by bit), each checked against numpy and ml_dtypes."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np

from .core import Exercise, Wrong

__all__ = ["q1", "q2"]


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

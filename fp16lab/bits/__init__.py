"""Codes to values and back, by integer bit arithmetic: decode, encode, round, explain.

One concept per module, as graphcore's gfloat splits it:

* :mod:`~fp16lab.bits.decode` - codes to values (``decode``);
* :mod:`~fp16lab.bits.encode` - values to codes in three rounding modes (``encode``, ``ROUNDINGS``);
* :mod:`~fp16lab.bits.round` - values to values (``quantize``, ``ulp``, ``accumulate``);
* :mod:`~fp16lab.bits.codes` - one code as hex or bits and back, its neighbours (``to_hex``,
  ``to_bits``, ``parse_code``, ``next_up``, ``next_down``);
* :mod:`~fp16lab.bits.printing` - ``explain`` and ``explain_table``, as text and HTML;
* :mod:`~fp16lab.bits.patterns` - a format's class thresholds as bit patterns (the census's);
* :mod:`~fp16lab.bits.arrays` and :mod:`~fp16lab.bits.checks` - the numpy/torch operations and
  the input checks the others share.

Everything works on numpy arrays (int64 / float64 arithmetic) and on torch tensors, which get
the same integer arithmetic in torch, so CUDA tensors stay on the GPU. The public API is
re-exported here: ``from fp16lab.bits import decode`` is the function (the module of the same
name is reached as ``from fp16lab.bits.decode import ...``).
"""

from .codes import next_down, next_up, parse_code, to_bits, to_hex
from .decode import decode
from .encode import ROUNDINGS, encode
from .printing import Explanation, explain, explain_table
from .round import accumulate, quantize, ulp

__all__ = ["ROUNDINGS", "Explanation", "accumulate", "decode", "encode", "explain", "explain_table",
           "next_down", "next_up", "parse_code", "quantize", "to_bits", "to_hex", "ulp"]

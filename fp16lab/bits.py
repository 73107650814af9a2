"""Codes to values and back, by integer bit arithmetic: decode, encode, explain.

``decode(codes, fmt)`` splits each code into sign, exponent and mantissa fields and builds the
value ``(-1)^s * 2^(E - bias) * (1 + M / 2^m)`` (or the subnormal / special case).

``encode(values, fmt)`` goes the other way without calling any library cast. Each value is
taken as a float64 ``|x| = S * 2^(E - 52)`` with an integer significand ``S < 2^53``. The
format's spacing ("quantum") at that magnitude is ``2^(max(E, emin) - m)``, so the value in
quanta is ``S`` shifted right by ``k = 52 - m + max(0, emin - E)`` bits. The bits shifted off,
``r``, decide the rounding:

* nearest-even: up when ``r > 2^(k-1)``, or ``r == 2^(k-1)`` and the kept part is odd;
* toward-zero: never up;
* stochastic: up with probability ``r / 2^k``, so the rounding is unbiased on average.

The code is then ``((max(E, emin) + bias - 1) << m) + q``: a mantissa carry into the
exponent and the subnormal-to-normal step both fall out of the integer addition. Codes above
the largest finite one overflow to infinity (fp16, bf16, e5m2, fp32, tf32) or to NaN
(e4m3fn, as ml_dtypes does), or to the largest finite value with ``saturate=True``.

Both work on numpy arrays (int64 / float64 arithmetic) and on torch tensors, which are
handled with the same integer arithmetic in torch, so CUDA tensors stay on the GPU.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np

from .formats import FormatInfo, format_info

ROUNDINGS = ("nearest", "toward_zero", "stochastic")
_ROUNDING_ALIASES = {"nearest_even": "nearest", "rne": "nearest", "rtz": "toward_zero",
                     "truncate": "toward_zero", "sr": "stochastic"}


# ---------------------------------------------------------------------------------------------
# numpy / torch dispatch
# ---------------------------------------------------------------------------------------------
def _is_torch(x: Any) -> bool:
    mod = type(x).__module__
    return mod.startswith("torch") and type(x).__name__ in ("Tensor", "Parameter")


class _NumpyOps:
    """The handful of array operations encode/decode need, for numpy."""

    where = staticmethod(np.where)
    maximum = staticmethod(np.maximum)
    minimum = staticmethod(np.minimum)

    @staticmethod
    def f64_bits(x):
        return np.asarray(x, dtype=np.float64).view(np.int64)

    @staticmethod
    def to_f64(x):
        return x.astype(np.float64)

    @staticmethod
    def exp2i(values, exps):
        return np.ldexp(values, exps.astype(np.int32))

    @staticmethod
    def full_like_int(x, v):
        return np.full(np.shape(x), v, dtype=np.int64)


class _TorchOps:
    """The same operations for torch tensors (any device)."""

    def __init__(self):
        import torch

        self.torch = torch
        self.where = torch.where

    # the bounds are always Python ints (exponent limits, shift caps)
    def maximum(self, a, b: int):
        return a.clamp(min=b)

    def minimum(self, a, b: int):
        return a.clamp(max=b)

    def f64_bits(self, x):
        return x.to(self.torch.float64).contiguous().view(self.torch.int64)

    def to_f64(self, x):
        return x.to(self.torch.float64)

    def exp2i(self, values, exps):
        # values * 2^exps, exactly: build each power of two from its bit pattern (exp2 and pow
        # on a GPU are not guaranteed exact), in two halves so |exps| up to 2044 stays normal
        t = self.torch
        e = exps.to(t.int64)
        h1 = t.div(e, 2, rounding_mode="floor")
        h2 = e - h1

        def pow2(h):
            return ((h + 1023) << 52).view(t.float64)

        return values * pow2(h1) * pow2(h2)

    def full_like_int(self, x, v):
        return self.torch.full(x.shape, v, dtype=self.torch.int64, device=x.device)


def _ops(x: Any):
    return _TorchOps() if _is_torch(x) else _NumpyOps


# ---------------------------------------------------------------------------------------------
# decode
# ---------------------------------------------------------------------------------------------
def _check_codes(codes: Any, f: FormatInfo):
    """Returns codes as an int64 array/tensor after checking they are codes of the format."""
    hi = (1 << f.bits) - 1
    if _is_torch(codes):
        import torch

        if codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
            raise ValueError(f"decode expects integer codes for {f.name} (0..{hi:#x}), "
                             f"got a tensor of dtype {codes.dtype}")
        c = codes.to(torch.int64)
        if c.numel():
            lo_v, hi_v = int(c.min()), int(c.max())
            if lo_v < 0 or hi_v > hi:
                bad = lo_v if lo_v < 0 else hi_v
                raise ValueError(f"code {bad} is out of range for {f.name}: codes are "
                                 f"{f.bits}-bit integers {_code_range(f)}")
        return c
    if isinstance(codes, str):
        raise ValueError(f"decode expects integer codes, got the string {codes!r}; "
                         f"use parse_code() for hex ('0x3c00') or bit strings")
    try:
        arr = np.asarray(codes)
    except ValueError:  # ragged nested lists
        raise ValueError(f"decode expects integer codes for {f.name} in a rectangular array, "
                         f"got {codes!r}") from None
    if arr.dtype.kind == "O":
        for index, v in np.ndenumerate(arr):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                at = f" at index {index}" if arr.ndim else ""
                raise ValueError(f"decode expects integer codes for {f.name} "
                                 f"({_code_range(f)}), got {type(v).__name__} {v!r}{at}")
    elif arr.dtype.kind not in "iu":
        raise ValueError(f"decode expects integer codes for {f.name} ({_code_range(f)}), "
                         f"got {arr.dtype} values like {arr.ravel()[:3].tolist()!r}")
    if arr.size:
        lo_v, hi_v = int(arr.min()), int(arr.max())
        if lo_v < 0 or hi_v > hi:
            bad = lo_v if lo_v < 0 else hi_v
            raise ValueError(f"code {bad} is out of range for {f.name}: codes are "
                             f"{f.bits}-bit integers {_code_range(f)}")
    return arr.astype(np.int64)


def _code_range(f: FormatInfo) -> str:
    """Returns the allowed codes of a format as text: '0..65535 (0x0000..0xffff)' for fp16."""
    hi = (1 << f.bits) - 1
    return f"0..{hi} (0x{0:0{f.hex_digits}x}..0x{hi:0{f.hex_digits}x})"


def _one_code(code: Any, f: FormatInfo, func: str) -> int:
    """Returns one code of the format as an int, or raises ValueError naming the allowed range."""
    if _is_torch(code) or isinstance(code, np.ndarray):
        size = code.numel() if _is_torch(code) else code.size
        if size != 1:
            raise ValueError(f"{func}() takes one code, got an array of shape "
                             f"{tuple(code.shape)}")
        code = code.item()
    if isinstance(code, (bool, np.bool_)) or not isinstance(code, (int, np.integer)):
        hint = ("; read a hex or bit string with parse_code()" if isinstance(code, str) else
                "; encode() turns a number into its code" if isinstance(code, float) else "")
        raise ValueError(f"{func}() takes an integer code of {f.name}, {_code_range(f)}, got "
                         f"{type(code).__name__} {code!r}{hint}")
    code = int(code)
    if not 0 <= code < (1 << f.bits):
        raise ValueError(f"{func}(): code {code} is out of range for {f.name}: codes are "
                         f"{f.bits}-bit integers {_code_range(f)}")
    return code


def decode(codes: Any, fmt: str | FormatInfo = "fp16"):
    """Returns the float64 values of integer codes of a format (array or tensor, same shape).

    Args:
        codes: integers in ``0 .. 2^bits - 1`` (numpy array, list, int or torch tensor; for a
            tensor the result is a float64 tensor on the same device).
        fmt: format name or :class:`~fp16lab.formats.FormatInfo`.

    Raises:
        ValueError: for non-integer codes or codes out of range for the format.
    """
    f = format_info(fmt)
    scalar = np.isscalar(codes) or (isinstance(codes, int))
    c = _check_codes(codes, f)
    ops = _ops(c)
    m = f.mantissa_bits
    sign = (c >> (f.bits - 1)) & 1
    e_field = (c >> m) & f.exponent_field_max
    mant = c & f.mantissa_field_max
    normal = e_field > 0
    signif = ops.to_f64(mant + ops.where(normal, 1 << m, 0))
    exp = ops.maximum(e_field, 1) - f.bias - m
    mag = ops.exp2i(signif, exp)
    inf = math.inf
    if f.specials == "ieee":
        special = e_field == f.exponent_field_max
        mag = ops.where(special & (mant == 0), inf, mag)
        mag = ops.where(special & (mant != 0), math.nan, mag)
    else:
        mag = ops.where((e_field == f.exponent_field_max) & (mant == f.mantissa_field_max),
                        math.nan, mag)
    out = ops.where(sign == 1, -mag, mag)
    if scalar and not _is_torch(out):
        return float(out)
    return out


# ---------------------------------------------------------------------------------------------
# encode
# ---------------------------------------------------------------------------------------------
_ALLOWED_VALUES = ("int, float, bool, lists of them, numpy arrays of dtype bool/int/uint/float, "
                   "real torch tensors")


def _check_values(values: Any, func: str = "encode"):
    """Returns values as a real numpy array or torch tensor, or raises ValueError saying why.

    Only real numbers pass: None, strings, complex numbers, dates and durations (datetime64,
    timedelta64) and other objects are refused rather than cast, since numpy would turn None
    into NaN and a date into a day count without a word.
    """
    if _is_torch(values):
        if values.dtype.is_complex:
            raise ValueError(f"{func} expects real numbers, got a complex tensor "
                             f"({values.dtype}); allowed: {_ALLOWED_VALUES}")
        return values
    if values is None:
        raise ValueError(f"{func} expects real numbers, got None; allowed: {_ALLOWED_VALUES}")
    if isinstance(values, (str, bytes)):
        raise ValueError(f"{func} expects numbers, got the string {values!r}; use explain() or "
                         f"parse_code() to read hex ('0x3c00') or bit strings, or float() to "
                         f"read a number")
    try:
        arr = np.asarray(values)
    except ValueError:  # ragged nested lists
        raise ValueError(f"{func} expects real numbers in a rectangular array, got "
                         f"{values!r}") from None
    kind = arr.dtype.kind
    if kind in "biuf":
        return arr
    if kind == "O":
        return _object_values(arr, func)
    what = {"c": "complex numbers", "M": "dates (datetime64), not numbers",
            "m": "durations (timedelta64), not numbers", "U": "strings", "S": "bytes",
            "V": "raw records"}.get(kind, "values that are not real numbers")
    raise ValueError(f"{func} expects real numbers, got a {arr.dtype} array of {what}, like "
                     f"{arr.ravel()[:3].tolist()!r}; allowed: {_ALLOWED_VALUES}")


def _object_values(arr: np.ndarray, func: str) -> np.ndarray:
    """Returns an object array of real numbers (ints, floats, Fractions, Decimals) as float64."""
    out = np.empty(arr.shape, dtype=np.float64)
    for index, v in np.ndenumerate(arr):
        if isinstance(v, (str, bytes)) or not isinstance(v, (numbers.Real, Decimal)):
            at = f" at index {index}" if arr.ndim else ""
            raise ValueError(f"{func} expects real numbers, got {type(v).__name__} {v!r}{at}; "
                             f"allowed: {_ALLOWED_VALUES}")
        try:
            out[index] = float(v)
        except OverflowError:
            raise ValueError(f"{func}: {v!r} is too large for float64 (|x| < 1.8e308), the "
                             f"precision every value passes through") from None
    return out


def _rounding(rounding: str) -> str:
    r = _ROUNDING_ALIASES.get(rounding, rounding)
    if r not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; allowed: {', '.join(ROUNDINGS)}")
    return r


def encode(values: Any, fmt: str | FormatInfo = "fp16", *, rounding: str = "nearest",
           saturate: bool = False, seed: int | None = None, generator: Any = None):
    """Returns the int64 codes of values rounded into a format (array or tensor, same shape).

    Args:
        values: real numbers (scalar, list, numpy array or torch tensor on any device).
        fmt: format name or FormatInfo.
        rounding: ``"nearest"`` (ties to even, the IEEE default), ``"toward_zero"`` or
            ``"stochastic"`` (up with probability equal to the distance from the lower
            neighbour in units of the spacing).
        saturate: clamp overflow to the largest finite value instead of inf (or NaN for
            e4m3fn, which has no inf). Toward-zero rounding always saturates finite values.
        seed: seed for stochastic rounding of numpy input.
        generator: a ``numpy.random.Generator`` or ``torch.Generator`` for stochastic rounding.

    Raises:
        ValueError: for anything but real numbers (None, strings, complex, datetime64 and
            timedelta64 values are refused, not cast), or an unknown rounding mode.
    """
    f = format_info(fmt)
    mode = _rounding(rounding)
    scalar = np.isscalar(values) or isinstance(values, (int, float))
    v = _check_values(values)
    ops = _ops(v)
    bits = ops.f64_bits(v)
    m = f.mantissa_bits
    sign = (bits >> 63) & 1
    a = bits & 0x7FFF_FFFF_FFFF_FFFF
    e_field = a >> 52
    frac = a & ((1 << 52) - 1)
    is_nan = a > 0x7FF0_0000_0000_0000
    is_inf = a == 0x7FF0_0000_0000_0000
    # |x| = S * 2^(E - 52) with S < 2^53 (float64 subnormals: no implicit bit, E = -1022)
    signif = frac + ops.where(e_field > 0, 1 << 52, 0)
    e = ops.maximum(e_field, 1) - 1023
    e_eff = ops.maximum(e, f.emin)
    shift = 52 - m + (e_eff - e)
    k = ops.minimum(shift, 54)  # beyond 54 bits everything is shifted off anyway
    q = signif >> k
    r = signif & ((1 << k) - 1)
    if mode == "nearest":
        half = 1 << (k - 1)
        up = (r > half) | ((r == half) & ((q & 1) == 1))
    elif mode == "toward_zero":
        up = r < 0  # all False, same shape and type
    else:
        # probability r / 2^shift, computed exactly in float64 (r < 2^53)
        p = ops.exp2i(ops.to_f64(r), -shift)
        up = _uniform_like(p, seed, generator) < p
    q = q + ops.where(up, 1, 0)
    mag = ((e_eff + f.bias - 1) << m) + q
    over = mag > f.max_finite_code
    if mode == "toward_zero" or saturate:
        over_code = f.max_finite_code
    else:
        over_code = f.inf_code if f.has_infs else f.nan_code
    mag = ops.where(over, over_code, mag)
    if f.has_infs:
        inf_code = f.max_finite_code if saturate else f.inf_code
    else:
        inf_code = f.max_finite_code if saturate else f.nan_code
    mag = ops.where(is_inf, inf_code, mag)
    mag = ops.where(is_nan, f.nan_code, mag)
    code = mag | (sign << (f.bits - 1))
    if scalar and not _is_torch(code):
        return int(code)
    return code


def _uniform_like(p, seed, generator):
    if _is_torch(p):
        import torch

        return torch.rand(p.shape, dtype=torch.float64, device=p.device, generator=generator)
    rng = generator if generator is not None else np.random.default_rng(seed)
    return rng.random(np.shape(p))


def quantize(values: Any, fmt: str | FormatInfo = "fp16", **kwargs):
    """Returns values rounded to the nearest number of a format, as float64 (``decode(encode(x))``).

    Keyword arguments go to :func:`encode` (``rounding``, ``saturate``, ``seed``).
    """
    return decode(encode(values, fmt, **kwargs), fmt)


def ulp(values: Any, fmt: str | FormatInfo = "fp16"):
    """Returns the spacing of the format at each value: ``2^(max(floor(log2|x|), emin) - m)``.

    The spacing is that of the binade the value falls in (for 1.0 in fp16, 2^-10); zero and
    subnormals get the subnormal spacing; inf and NaN give NaN.
    """
    f = format_info(fmt)
    v = _check_values(values, "ulp")
    ops = _ops(v)
    bits = ops.f64_bits(v)
    a = bits & 0x7FFF_FFFF_FFFF_FFFF
    e_field = a >> 52
    e = ops.maximum(e_field, 1) - 1023
    e_eff = ops.maximum(e, f.emin)
    out = ops.exp2i(ops.to_f64(ops.full_like_int(e, 1)), e_eff - f.mantissa_bits)
    out = ops.where(e_field == 0x7FF, math.nan, out)
    if np.isscalar(values) or isinstance(values, (int, float)):
        return float(out)
    return out


# ---------------------------------------------------------------------------------------------
# reading and printing single codes
# ---------------------------------------------------------------------------------------------
_HEX_RE = re.compile(r"^[+]?0[xX][0-9a-fA-F_]*[0-9a-fA-F][0-9a-fA-F_]*$")
_BIN_RE = re.compile(r"^0[bB][01 _]*[01][01 _]*$")  # 0b prefix: always a bit string
_BITS_RE = re.compile(r"^[01][01 _]*$")


def to_hex(code: int, fmt: str | FormatInfo = "fp16") -> str:
    """Returns a code as zero-padded lowercase hex, as ``printf("%04x", __half_as_ushort(x))``
    prints an fp16 (e.g. ``"0x3c00"`` for 1.0)."""
    f = format_info(fmt)
    return f"0x{_one_code(code, f, 'to_hex'):0{f.hex_digits}x}"


def to_bits(code: int, fmt: str | FormatInfo = "fp16", sep: str = " ") -> str:
    """Returns a code as a bit string split into sign, exponent and mantissa fields
    (``"0 01111 0000000000"`` for fp16 1.0)."""
    f = format_info(fmt)
    if not isinstance(sep, str):
        raise ValueError(f"to_bits(sep=...) takes a string (' ', '_', ''), got {sep!r}")
    s = f"{_one_code(code, f, 'to_bits'):0{f.bits}b}"
    e = f.exponent_bits
    return sep.join((s[0], s[1:1 + e], s[1 + e:]))


def parse_code(text: str, fmt: str | FormatInfo = "fp16") -> int:
    """Returns the integer code written as hex (``"0x3c00"``) or bits (``"0 01111 0000000000"``,
    ``"0b0011110000000000"``).

    Spaces and underscores in bit strings are ignored; a bit string must have exactly as many
    bits as the format. (Unlike :func:`explain`, which also reads numbers, parse_code reads
    only codes, so a bare ``"0011110000000000"`` is bits here.)

    Raises:
        ValueError: for anything else, saying what was given and what is allowed.
    """
    f = format_info(fmt)
    hi = (1 << f.bits) - 1
    if not isinstance(text, str):
        raise ValueError(f"parse_code() reads a string (hex like {to_hex(encode(1.0, f), f)!r} "
                         f"or {f.bits} bits), got {type(text).__name__} {text!r}; an integer "
                         f"code goes to decode() or to_hex() as it is")
    s = text.strip()
    if _BIN_RE.match(s):
        s = s[2:].strip(" _")
    if _HEX_RE.match(s):
        code = int(s.replace("_", ""), 16)
        if code > hi:
            raise ValueError(f"hex code {text!r} is out of range for {f.name}: allowed 0x0.."
                             f"{hi:#0{f.hex_digits + 2}x} ({f.bits} bits)")
        return code
    if _BITS_RE.match(s):
        digits = s.replace(" ", "").replace("_", "")
        if len(digits) != f.bits:
            raise ValueError(f"bit string {text!r} has {len(digits)} bits; {f.name} codes have "
                             f"{f.bits} (1 sign, {f.exponent_bits} exponent, {f.mantissa_bits} "
                             f"mantissa), e.g. {to_bits(encode(1.0, f), f)!r}")
        return int(digits, 2)
    raise ValueError(f"cannot read {text!r} as a {f.name} code: allowed are hex like "
                     f"{to_hex(encode(1.0, f), f)!r} or {f.bits} bits like "
                     f"{to_bits(encode(1.0, f), f)!r} (spaces and underscores allowed, "
                     f"0b prefix optional)")


def _allowed_strings(f: FormatInfo) -> str:
    one = encode(1.0, f)
    return (f"a number ('1.5', '1e15', '-inf', 'nan'), hex like {to_hex(one, f)!r}, or "
            f"{f.bits} bits with a 0b prefix ('0b{to_bits(one, f, '')}') or with spaces or "
            f"underscores between the fields ({to_bits(one, f)!r})")


def _parse_input(x: Any, f: FormatInfo) -> tuple[float | None, int | None]:
    """Returns (value, None) for a number or (None, code) for a hex / bit string.

    How a string is read: ``0x...`` is a hex code; ``0b...`` is bits; zeros and ones with a
    space or underscore in them are bits; any other number Python's ``float()`` reads is a
    number. Zeros and ones alone are refused when they could be either: as many digits as
    the format has bits (``"1000000000000000"``: 1e15 or fp16's -0?), or a leading 0.
    """
    if isinstance(x, str):
        s = x.strip()
        if _HEX_RE.match(s) or _BIN_RE.match(s):
            return None, parse_code(s, f)
        if _BITS_RE.match(s) and any(c in s for c in " _"):
            try:
                return None, parse_code(s, f)
            except ValueError as e:
                raise ValueError(f"{e}; zeros and ones with spaces or underscores are read as "
                                 f"bits, so write a number without them") from None
        if _BITS_RE.match(s) and (len(s) == f.bits or (len(s) > 1 and s[0] == "0")):
            raise ValueError(f"{x!r} is ambiguous: the number {float(s):g}, or the bits of a "
                             f"{f.name} code? Write bits as '0b{s}' or with spaces between the "
                             f"fields, a number as '{s}.0' or '{float(s):g}'; allowed: "
                             f"{_allowed_strings(f)}")
        try:
            return float(s), None
        except ValueError:
            raise ValueError(f"cannot read {x!r}: allowed are {_allowed_strings(f)}") from None
    if _is_torch(x):
        if x.numel() != 1:
            raise ValueError(f"explain() takes one value, got a tensor of shape {tuple(x.shape)}")
        import torch

        if x.dtype.is_complex or x.dtype == torch.bool:
            raise ValueError(f"explain() takes a real number, got a tensor of dtype {x.dtype}")
        return float(x.item()), None
    if isinstance(x, np.ndarray):
        if x.size != 1:
            raise ValueError(f"explain() takes one value, got an array of shape {x.shape}")
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise ValueError(f"explain() takes a number, hex string or bit string; got "
                         f"{type(x).__name__} {x!r}")
    try:
        return float(x), None
    except OverflowError:
        raise ValueError(f"explain(): {x!r} is too large for float64 (|x| < 1.8e308), the "
                         f"precision every value passes through") from None


def _classify(code: int, f: FormatInfo) -> str:
    mag = code & (f.sign_mask - 1)
    e_field = mag >> f.mantissa_bits
    mant = mag & f.mantissa_field_max
    if f.specials == "ieee" and e_field == f.exponent_field_max:
        return "inf" if mant == 0 else "nan"
    if f.specials == "fn" and mag == f.nan_code:
        return "nan"
    if e_field == 0:
        return "zero" if mant == 0 else "subnormal"
    return "normal"


def next_up(code: int, fmt: str | FormatInfo = "fp16") -> int:
    """Returns the code of the next larger number of the format (inf stays inf; NaN stays NaN;
    the largest finite of a format without infinities stays put)."""
    f = format_info(fmt)
    code = _one_code(code, f, "next_up")
    cls = _classify(code, f)
    neg = bool(code & f.sign_mask)
    mag = code & (f.sign_mask - 1)
    if cls == "nan":
        return code
    if not neg:
        if cls == "inf" or mag == f.max_finite_code and not f.has_infs:
            return code
        return code + 1
    if mag == 0:  # -0 -> smallest positive subnormal
        return 1
    if cls == "inf":
        return f.sign_mask | f.max_finite_code
    return code - 1 if mag > 1 else f.sign_mask  # -min_subnormal -> -0


def next_down(code: int, fmt: str | FormatInfo = "fp16") -> int:
    """Returns the code of the next smaller number of the format (mirror of :func:`next_up`)."""
    f = format_info(fmt)
    code = _one_code(code, f, "next_down")
    return next_up(code ^ f.sign_mask, f) ^ f.sign_mask if _classify(code, f) != "nan" else code


@dataclass(frozen=True)
class Explanation:
    """Everything about one number stored in one format (see :func:`explain`)."""

    fmt: str
    given: float
    code: int
    hex: str
    bits: str
    sign: int
    exponent_field: int
    exponent: int | None
    mantissa_field: int
    kind: str
    value: float
    exact: str
    next_up: float
    next_down: float
    ulp: float
    error: float
    relative_error: float

    def rows(self) -> list[tuple[str, str]]:
        """Returns (label, text) pairs for printing."""
        exp = "n/a" if self.exponent is None else str(self.exponent)
        return [
            ("format", self.fmt),
            ("given", repr(self.given)),
            ("bits (s|e|m)", self.bits),
            ("hex", self.hex),
            ("sign", f"{self.sign} ({'-' if self.sign else '+'})"),
            ("exponent", f"field {self.exponent_field}, unbiased {exp}"),
            ("mantissa", f"field {self.mantissa_field}"),
            ("class", self.kind),
            ("value", repr(self.value)),
            ("exact value", self.exact),
            ("neighbours", f"{self.next_down!r} < value < {self.next_up!r}"),
            ("ULP", repr(self.ulp)),
            ("rounding error", f"{self.error!r} (relative {self.relative_error:.3g})"),
        ]

    def __str__(self) -> str:
        width = max(len(k) for k, _ in self.rows())
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self.rows())

    def _repr_html_(self) -> str:
        import html

        cells = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                        f"<td style='text-align:left'><code>{html.escape(v)}</code></td></tr>"
                        for k, v in self.rows())
        return f"<table class='fp16lab-explain'>{cells}</table>"


def explain(x: Any, fmt: str | FormatInfo = "fp16", *, rounding: str = "nearest",
            saturate: bool = False) -> Explanation:
    """Returns an :class:`Explanation` of how ``x`` is stored in a format.

    Args:
        x: a number (int, float, numpy or torch scalar, or a string like "0.1"), a hex code
            ("0x3c00") or a bit string with a ``0b`` prefix or separated fields
            ("0b0011110000000000", "0 01111 0000000000", "0_01111_0000000000"). Zeros and ones
            alone are refused where they could be a number too: as many digits as the format
            has bits, or a leading zero ("1000000000000000" is 1e15 or fp16's -0).
        fmt: the format.
        rounding, saturate: how a number is rounded into the format (see :func:`encode`).

    Raises:
        ValueError: for malformed strings, codes out of range or non-numeric input.
    """
    f = format_info(fmt)
    value, code = _parse_input(x, f)
    if code is None:
        code = encode(value, f, rounding=rounding, saturate=saturate)
    stored = decode(code, f)
    given = stored if value is None else value
    kind = _classify(code, f)
    mag = code & (f.sign_mask - 1)
    e_field = mag >> f.mantissa_bits
    exponent = None if kind in ("inf", "nan", "zero") else max(e_field, 1) - f.bias
    finite = math.isfinite(stored)
    # inf - inf is nan: a stored infinity that was given as infinity has no error
    err = 0.0 if stored == given else stored - given
    rel = abs(err) / abs(given) if given != 0 and math.isfinite(given) else (
        0.0 if err == 0 else math.nan)
    return Explanation(
        fmt=f.name, given=given, code=code, hex=to_hex(code, f), bits=to_bits(code, f),
        sign=code >> (f.bits - 1), exponent_field=e_field, exponent=exponent,
        mantissa_field=mag & f.mantissa_field_max, kind=kind, value=stored,
        exact=str(Decimal(stored)) if finite else str(stored),
        next_up=decode(next_up(code, f), f), next_down=decode(next_down(code, f), f),
        ulp=ulp(stored, f) if finite else math.nan, error=err, relative_error=rel,
    )


def explain_table(values: Any, fmt: str | FormatInfo = "fp16", **kwargs):
    """Returns a pandas DataFrame with one :func:`explain` per value (numbers, hex or bits),
    columns: given, hex, bits, class, value, next down, next up, ULP, error, relative error."""
    import pandas as pd

    if values is None:
        raise ValueError("explain_table() takes a list of values (numbers, hex or bit strings), "
                         "got None")
    if isinstance(values, (str, bytes, numbers.Number)) or getattr(values, "ndim", 1) == 0:
        values = [values]  # one value is a table of one row, never a string's characters
    rows = []
    for x in values:
        e = explain(x, fmt, **kwargs)
        given = x if isinstance(x, str) else repr(float(x))
        rows.append({"given": given, "hex": e.hex, "bits": e.bits, "class": e.kind,
                     "value": e.value, "next down": e.next_down, "next up": e.next_up,
                     "ULP": e.ulp, "error": e.error, "relative error": e.relative_error})
    columns = ["given", "hex", "bits", "class", "value", "next down", "next up", "ULP", "error",
               "relative error"]
    return pd.DataFrame(rows, columns=columns).set_index("given")


def accumulate(values: Any, fmt: str | FormatInfo = "fp16", *, rounding: str = "nearest",
               seed: int | None = None) -> np.ndarray:
    """Returns the running sums of values when the accumulator is stored in a format, rounding
    after every addition (as a kernel that keeps its sum in fp16 registers would).

    The addition itself is exact (float64 holds the sum of two fp16 / bf16 / fp8 numbers), so
    the only error is the rounding of each partial sum back into the format.
    """
    f = format_info(fmt)
    mode = _rounding(rounding)
    v = _check_values(values, "accumulate")
    if _is_torch(v):
        v = v.detach().cpu().numpy()
    xs = quantize(np.asarray(v, dtype=np.float64).ravel(), f)
    rng = np.random.default_rng(seed)
    out = np.empty_like(xs)
    acc = 0.0
    for i, x in enumerate(xs):
        acc = decode(encode(acc + x, f, rounding=mode, generator=rng), f)
        out[i] = acc
    return out

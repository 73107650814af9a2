"""What decode and encode accept: codes of a format and real numbers, with messages that say
what was given and what is allowed."""

from __future__ import annotations

import numbers
from decimal import Decimal
from typing import Any

import numpy as np

from ..formats import FormatInfo
from .arrays import is_torch


def check_codes(codes: Any, f: FormatInfo):
    """Returns codes as an int64 array/tensor after checking they are codes of the format."""
    hi = (1 << f.bits) - 1
    if is_torch(codes):
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
                                 f"{f.bits}-bit integers {code_range(f)}")
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
                                 f"({code_range(f)}), got {type(v).__name__} {v!r}{at}")
    elif arr.dtype.kind not in "iu":
        raise ValueError(f"decode expects integer codes for {f.name} ({code_range(f)}), "
                         f"got {arr.dtype} values like {arr.ravel()[:3].tolist()!r}")
    if arr.size:
        lo_v, hi_v = int(arr.min()), int(arr.max())
        if lo_v < 0 or hi_v > hi:
            bad = lo_v if lo_v < 0 else hi_v
            raise ValueError(f"code {bad} is out of range for {f.name}: codes are "
                             f"{f.bits}-bit integers {code_range(f)}")
    return arr.astype(np.int64)


def code_range(f: FormatInfo) -> str:
    """Returns the allowed codes of a format as text: '0..65535 (0x0000..0xffff)' for fp16."""
    hi = (1 << f.bits) - 1
    return f"0..{hi} (0x{0:0{f.hex_digits}x}..0x{hi:0{f.hex_digits}x})"


def one_code(code: Any, f: FormatInfo, func: str) -> int:
    """Returns one code of the format as an int, or raises ValueError naming the allowed range."""
    if is_torch(code) or isinstance(code, np.ndarray):
        size = code.numel() if is_torch(code) else code.size
        if size != 1:
            raise ValueError(f"{func}() takes one code, got an array of shape "
                             f"{tuple(code.shape)}")
        code = code.item()
    if isinstance(code, (bool, np.bool_)) or not isinstance(code, (int, np.integer)):
        hint = ("; read a hex or bit string with parse_code()" if isinstance(code, str) else
                "; encode() turns a number into its code" if isinstance(code, float) else "")
        raise ValueError(f"{func}() takes an integer code of {f.name}, {code_range(f)}, got "
                         f"{type(code).__name__} {code!r}{hint}")
    code = int(code)
    if not 0 <= code < (1 << f.bits):
        raise ValueError(f"{func}(): code {code} is out of range for {f.name}: codes are "
                         f"{f.bits}-bit integers {code_range(f)}")
    return code



ALLOWED_VALUES = ("int, float, bool, lists of them, numpy arrays of dtype bool/int/uint/float, "
                   "real torch tensors")


def check_values(values: Any, func: str = "encode"):
    """Returns values as a real numpy array or torch tensor, or raises ValueError saying why.

    Only real numbers pass: None, strings, complex numbers, dates and durations (datetime64,
    timedelta64) and other objects are refused rather than cast, since numpy would turn None
    into NaN and a date into a day count without a word.
    """
    if is_torch(values):
        if values.dtype.is_complex:
            raise ValueError(f"{func} expects real numbers, got a complex tensor "
                             f"({values.dtype}); allowed: {ALLOWED_VALUES}")
        return values
    if values is None:
        raise ValueError(f"{func} expects real numbers, got None; allowed: {ALLOWED_VALUES}")
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
                     f"{arr.ravel()[:3].tolist()!r}; allowed: {ALLOWED_VALUES}")


def _object_values(arr: np.ndarray, func: str) -> np.ndarray:
    """Returns an object array of real numbers (ints, floats, Fractions, Decimals) as float64."""
    out = np.empty(arr.shape, dtype=np.float64)
    for index, v in np.ndenumerate(arr):
        if isinstance(v, (str, bytes)) or not isinstance(v, (numbers.Real, Decimal)):
            at = f" at index {index}" if arr.ndim else ""
            raise ValueError(f"{func} expects real numbers, got {type(v).__name__} {v!r}{at}; "
                             f"allowed: {ALLOWED_VALUES}")
        try:
            out[index] = float(v)
        except OverflowError:
            raise ValueError(f"{func}: {v!r} is too large for float64 (|x| < 1.8e308), the "
                             f"precision every value passes through") from None
    return out

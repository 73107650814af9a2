"""How one number is stored in a format, explained: :func:`explain`, rendered as text and HTML,
and :func:`explain_table` for several."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np

from ..formats import FormatInfo, format_info
from .arrays import is_torch
from .codes import (BIN_RE, BITS_RE, HEX_RE, classify, next_down, next_up, parse_code, to_bits,
                    to_hex)
from .decode import decode
from .encode import encode
from .round import ulp


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
        if HEX_RE.match(s) or BIN_RE.match(s):
            return None, parse_code(s, f)
        if BITS_RE.match(s) and any(c in s for c in " _"):
            try:
                return None, parse_code(s, f)
            except ValueError as e:
                raise ValueError(f"{e}; zeros and ones with spaces or underscores are read as "
                                 f"bits, so write a number without them") from None
        if BITS_RE.match(s) and (len(s) == f.bits or (len(s) > 1 and s[0] == "0")):
            raise ValueError(f"{x!r} is ambiguous: the number {float(s):g}, or the bits of a "
                             f"{f.name} code? Write bits as '0b{s}' or with spaces between the "
                             f"fields, a number as '{s}.0' or '{float(s):g}'; allowed: "
                             f"{_allowed_strings(f)}")
        try:
            return float(s), None
        except ValueError:
            raise ValueError(f"cannot read {x!r}: allowed are {_allowed_strings(f)}") from None
    if is_torch(x):
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

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # IPython's plain-text display (a console, a notebook's text output): the table, not the
        # dataclass's field dump
        printer.text(str(self))

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
    kind = classify(code, f)
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
        # seven significant digits: enough to tell the table's values apart, short enough to read
        given = x if isinstance(x, str) else format(float(x), ".7g")
        rows.append({"given": given, "hex": e.hex, "bits": e.bits, "class": e.kind,
                     "value": e.value, "next down": e.next_down, "next up": e.next_up,
                     "ULP": e.ulp, "error": e.error, "relative error": e.relative_error})
    columns = ["given", "hex", "bits", "class", "value", "next down", "next up", "ULP", "error",
               "relative error"]
    return pd.DataFrame(rows, columns=columns).set_index("given")

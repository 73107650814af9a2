"""One code of a format: written as hex or bits, read back from them, its class and its
neighbours."""

from __future__ import annotations

import re

from ..formats import FormatInfo, format_info
from .checks import one_code
from .encode import encode

HEX_RE = re.compile(r"^[+]?0[xX][0-9a-fA-F_]*[0-9a-fA-F][0-9a-fA-F_]*$")
BIN_RE = re.compile(r"^0[bB][01 _]*[01][01 _]*$")  # 0b prefix: always a bit string
BITS_RE = re.compile(r"^[01][01 _]*$")


def to_hex(code: int, fmt: str | FormatInfo = "fp16") -> str:
    """Returns a code as zero-padded lowercase hex, as ``printf("%04x", __half_as_ushort(x))``
    prints an fp16 (e.g. ``"0x3c00"`` for 1.0)."""
    f = format_info(fmt)
    return f"0x{one_code(code, f, 'to_hex'):0{f.hex_digits}x}"


def to_bits(code: int, fmt: str | FormatInfo = "fp16", sep: str = " ") -> str:
    """Returns a code as a bit string split into sign, exponent and mantissa fields
    (``"0 01111 0000000000"`` for fp16 1.0)."""
    f = format_info(fmt)
    if not isinstance(sep, str):
        raise ValueError(f"to_bits(sep=...) takes a string (' ', '_', ''), got {sep!r}")
    s = f"{one_code(code, f, 'to_bits'):0{f.bits}b}"
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
    if BIN_RE.match(s):
        s = s[2:].strip(" _")
    if HEX_RE.match(s):
        code = int(s.replace("_", ""), 16)
        if code > hi:
            raise ValueError(f"hex code {text!r} is out of range for {f.name}: allowed 0x0.."
                             f"{hi:#0{f.hex_digits + 2}x} ({f.bits} bits)")
        return code
    if BITS_RE.match(s):
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



def classify(code: int, f: FormatInfo) -> str:
    """Returns the class of a code: "zero", "subnormal", "normal", "inf" or "nan"."""
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
    code = one_code(code, f, "next_up")
    cls = classify(code, f)
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
    code = one_code(code, f, "next_down")
    return next_up(code ^ f.sign_mask, f) ^ f.sign_mask if classify(code, f) != "nan" else code

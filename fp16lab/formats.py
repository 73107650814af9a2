"""The floating-point formats of mixed-precision training, described by one dataclass.

A binary floating-point format with ``e`` exponent bits, ``m`` mantissa bits and bias ``b``
stores a code ``s | E | M`` (sign, biased exponent, mantissa fields) whose value is

* ``(-1)^s * 2^(E - b) * (1 + M / 2^m)`` when ``E > 0`` (a *normal* number),
* ``(-1)^s * 2^(1 - b) * (M / 2^m)`` when ``E == 0`` (zero or a *subnormal* number),

except for the codes each format reserves for infinities and NaNs:

* ``"ieee"`` (fp32, tf32, fp16, bf16, fp8 e5m2): the all-ones exponent field is special;
  mantissa 0 is infinity, any other mantissa is NaN.
* ``"fn"`` (fp8 e4m3fn, the OCP "finite" variant): no infinities; only the all-ones exponent
  *and* all-ones mantissa is NaN, so the all-ones exponent holds ordinary numbers and the
  largest finite value is ``2^8 * 1.75 = 448``.

Everything else (largest finite, smallest normal and subnormal, epsilon, decimal digits)
follows from these fields; :func:`range_table` lays them side by side. This module imports
neither torch nor numpy at import time so that ``import fp16lab.formats`` is instant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FormatInfo:
    """A binary floating-point format: its fields and how it encodes infinities and NaNs.

    Attributes:
        name: canonical short name ("fp16", "bf16", ...).
        exponent_bits: width of the biased exponent field.
        mantissa_bits: width of the stored mantissa (fraction) field, without the implicit 1.
        bias: exponent bias, so the unbiased exponent of a normal number is ``E - bias``.
        specials: ``"ieee"`` (all-ones exponent = inf / NaN) or ``"fn"`` (no infinities,
            only the all-ones code is NaN).
        description: one line for tables.
        ml_dtypes_name / torch_name: the same format in ml_dtypes / torch, where it exists.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    specials: str
    description: str = ""
    ml_dtypes_name: str | None = None
    torch_name: str | None = None

    def __post_init__(self) -> None:
        if self.specials not in ("ieee", "fn"):
            raise ValueError(f"specials must be 'ieee' or 'fn', got {self.specials!r}")
        if self.exponent_bits < 2 or self.mantissa_bits < 1 or self.bits > 32:
            raise ValueError(f"unsupported field widths e={self.exponent_bits}, "
                             f"m={self.mantissa_bits}")

    # -- field layout -------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        """Returns the total width of a code: 1 sign + exponent + mantissa bits."""
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def has_infs(self) -> bool:
        """Returns True when the format can store +-infinity."""
        return self.specials == "ieee"

    @property
    def hex_digits(self) -> int:
        """Returns the number of hex digits that print one code (4 for fp16)."""
        return (self.bits + 3) // 4

    @property
    def sign_mask(self) -> int:
        """Returns the code with only the sign bit set (0x8000 for fp16)."""
        return 1 << (self.bits - 1)

    @property
    def exponent_field_max(self) -> int:
        """Returns the all-ones exponent field value, ``2^e - 1``."""
        return (1 << self.exponent_bits) - 1

    @property
    def mantissa_field_max(self) -> int:
        """Returns the all-ones mantissa field value, ``2^m - 1``."""
        return (1 << self.mantissa_bits) - 1

    # -- derived limits -----------------------------------------------------------------------
    @property
    def emax(self) -> int:
        """Returns the unbiased exponent of the largest finite number."""
        top = self.exponent_field_max - (1 if self.specials == "ieee" else 0)
        return top - self.bias

    @property
    def emin(self) -> int:
        """Returns the unbiased exponent of the smallest normal number, ``1 - bias``."""
        return 1 - self.bias

    @property
    def max_finite_code(self) -> int:
        """Returns the positive code of the largest finite number."""
        if self.specials == "ieee":
            return (self.exponent_field_max << self.mantissa_bits) - 1
        return (self.exponent_field_max << self.mantissa_bits) | (self.mantissa_field_max - 1)

    @property
    def max_finite(self) -> float:
        """Returns the largest finite value: 65504 for fp16, 448 for e4m3fn."""
        frac = self.max_finite_code & self.mantissa_field_max
        return math.ldexp(1 + frac / 2**self.mantissa_bits, self.emax)

    @property
    def smallest_normal(self) -> float:
        """Returns the smallest positive normal number, ``2^emin``."""
        return math.ldexp(1.0, self.emin)

    @property
    def smallest_subnormal(self) -> float:
        """Returns the smallest positive (subnormal) number, ``2^(emin - m)``."""
        return math.ldexp(1.0, self.emin - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """Returns machine epsilon: the gap between 1 and the next larger number, ``2^-m``."""
        return math.ldexp(1.0, -self.mantissa_bits)

    @property
    def decimal_digits(self) -> float:
        """Returns the precision in decimal digits, ``(m + 1) * log10(2)``."""
        return (self.mantissa_bits + 1) * math.log10(2)

    @property
    def inf_code(self) -> int | None:
        """Returns the code of +infinity, or None where the format has none."""
        return (self.exponent_field_max << self.mantissa_bits) if self.has_infs else None

    @property
    def nan_code(self) -> int:
        """Returns the canonical positive quiet NaN code (0x7e00 for fp16, 0x7f for e4m3fn)."""
        if self.specials == "ieee":
            return (self.exponent_field_max << self.mantissa_bits) | (1 << (self.mantissa_bits - 1))
        return (self.exponent_field_max << self.mantissa_bits) | self.mantissa_field_max

    def limits(self) -> dict[str, Any]:
        """Returns the format's fields and derived limits as a flat dict (one table row)."""
        return {
            "format": self.name, "bits": self.bits, "exponent bits": self.exponent_bits,
            "mantissa bits": self.mantissa_bits, "bias": self.bias,
            "infinities": self.has_infs, "largest finite": self.max_finite,
            "smallest normal": self.smallest_normal,
            "smallest subnormal": self.smallest_subnormal, "epsilon": self.eps,
            "decimal digits": round(self.decimal_digits, 2),
        }

    def __str__(self) -> str:
        return self.name


#: The six formats, by canonical name.
FORMATS: dict[str, FormatInfo] = {
    f.name: f for f in (
        FormatInfo("fp32", 8, 23, 127, "ieee", "IEEE 754 binary32", "float32", "float32"),
        FormatInfo("tf32", 8, 10, 127, "ieee",
                   "NVIDIA TensorFloat-32: fp32 range, fp16 precision (tensor-core input)"),
        FormatInfo("fp16", 5, 10, 15, "ieee", "IEEE 754 binary16 (half)", "float16", "float16"),
        FormatInfo("bf16", 8, 7, 127, "ieee", "bfloat16: fp32 range, 8 bits of precision",
                   "bfloat16", "bfloat16"),
        FormatInfo("fp8_e4m3", 4, 3, 7, "fn", "OCP fp8 E4M3FN: no infinities, max 448",
                   "float8_e4m3fn", "float8_e4m3fn"),
        FormatInfo("fp8_e5m2", 5, 2, 15, "ieee", "OCP fp8 E5M2: fp16 range, 3 bits of precision",
                   "float8_e5m2", "float8_e5m2"),
    )
}

_ALIASES = {
    "float32": "fp32", "single": "fp32", "float": "fp32", "binary32": "fp32",
    "tensorfloat32": "tf32", "tensorfloat-32": "tf32",
    "float16": "fp16", "half": "fp16", "binary16": "fp16",
    "bfloat16": "bf16",
    "e4m3": "fp8_e4m3", "e4m3fn": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3", "fp8e4m3": "fp8_e4m3",
    "fp8_e4m3fn": "fp8_e4m3",
    "e5m2": "fp8_e5m2", "float8_e5m2": "fp8_e5m2", "fp8e5m2": "fp8_e5m2",
}


def format_info(fmt: str | FormatInfo) -> FormatInfo:
    """Returns the :class:`FormatInfo` for a name or alias ("fp16", "half", "e4m3", ...).

    Also accepts a FormatInfo (returned as is), a numpy / ml_dtypes dtype or scalar type
    (``np.float16``) or a torch dtype of one of the six formats.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if isinstance(fmt, FormatInfo):
        return fmt
    key = fmt
    if not isinstance(fmt, str):
        # numpy dtypes have .name, scalar types (np.float16) __name__, torch dtypes only str()
        key = getattr(fmt, "name", None) or getattr(fmt, "__name__", None) or str(fmt)
        if not isinstance(key, str):
            raise ValueError(f"format must be a name like 'fp16', got {type(fmt).__name__}")
        key = key.replace("torch.", "")
    norm = key.strip().lower()
    norm = _ALIASES.get(norm, norm)
    if norm not in FORMATS:
        known = ", ".join(FORMATS)
        aliases = ", ".join(sorted(_ALIASES))
        raise ValueError(f"unknown format {fmt!r}; known formats: {known} "
                         f"(aliases: {aliases})")
    return FORMATS[norm]


def range_table(names: tuple[str, ...] | None = None):
    """Returns a pandas DataFrame of the formats' fields and limits, one row per format."""
    import pandas as pd

    rows = [format_info(n).limits() for n in (names or tuple(FORMATS))]
    return pd.DataFrame(rows).set_index("format")

"""FormatInfo limits against numpy / ml_dtypes / torch finfo, and name handling."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import torch

from fp16lab.formats import FORMATS, FormatInfo, format_info, range_table

# the oracle dtypes: numpy for fp32/fp16, ml_dtypes for bf16 and fp8
ORACLE = {
    "fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16,
    "fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2,
}


def test_six_formats():
    assert set(FORMATS) == {"fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"}


@pytest.mark.parametrize("name", sorted(ORACLE))
def test_limits_match_finfo(name):
    f = format_info(name)
    fi = ml_dtypes.finfo(ORACLE[name])
    assert f.max_finite == float(fi.max)
    assert f.smallest_normal == float(fi.smallest_normal)
    assert f.smallest_subnormal == float(fi.smallest_subnormal)
    assert f.eps == float(fi.eps)
    assert f.bits == fi.bits
    assert f.mantissa_bits == fi.nmant
    assert f.emax + 1 == fi.maxexp
    assert f.emin == fi.minexp


@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
def test_limits_match_torch_finfo(name):
    f = format_info(name)
    fi = torch.finfo(getattr(torch, f.torch_name))
    assert (f.max_finite, f.smallest_normal, f.eps) == (fi.max, fi.smallest_normal, fi.eps)


def test_named_limits():
    # values printed in the OCP fp8 spec and IEEE 754 / NVIDIA docs
    assert format_info("e4m3").max_finite == 448
    assert format_info("e5m2").max_finite == 57344
    assert format_info("fp16").max_finite == 65504
    tf32 = format_info("tf32")
    assert tf32.bits == 19 and tf32.eps == 2.0**-10
    assert tf32.max_finite == float(np.float32(2**127 * (2 - 2**-10)))
    assert tf32.smallest_subnormal == 2.0**-136
    assert not format_info("e4m3").has_infs and format_info("e5m2").has_infs


@pytest.mark.parametrize("alias,name", [
    ("float16", "fp16"), ("half", "fp16"), ("FP16", "fp16"), ("bfloat16", "bf16"),
    ("e4m3", "fp8_e4m3"), ("float8_e4m3fn", "fp8_e4m3"), ("e5m2", "fp8_e5m2"),
    ("float8_e5m2", "fp8_e5m2"), ("float32", "fp32"), ("tf32", "tf32"),
])
def test_aliases(alias, name):
    assert format_info(alias).name == name


def test_dtypes_are_accepted():
    assert format_info(np.dtype(np.float16)).name == "fp16"
    assert format_info(np.dtype(ml_dtypes.bfloat16)).name == "bf16"
    assert format_info(torch.bfloat16).name == "bf16"
    assert format_info(torch.float8_e4m3fn).name == "fp8_e4m3"
    assert format_info(np.float16).name == "fp16"  # scalar types, as numpy users write them
    assert format_info(ml_dtypes.float8_e5m2).name == "fp8_e5m2"
    f = format_info("fp16")
    assert format_info(f) is f


def test_unknown_name_lists_known():
    with pytest.raises(ValueError) as info:
        format_info("fp12")
    assert str(info.value) == (
        "unknown format 'fp12'; known formats: fp32, tf32, fp16, bf16, fp8_e4m3, fp8_e5m2 "
        "(aliases: bfloat16, binary16, binary32, e4m3, e4m3fn, e5m2, float, float16, float32, "
        "float8_e4m3fn, float8_e5m2, fp8_e4m3fn, fp8e4m3, fp8e5m2, half, single, tensorfloat-32, "
        "tensorfloat32)")


def test_a_name_that_is_not_text_is_refused():
    class Odd:
        name = 16

    with pytest.raises(ValueError, match="^format must be a name like 'fp16', got Odd$"):
        format_info(Odd())


def test_bad_definition():
    for specials in ("weird", "IEEE", "FN"):
        with pytest.raises(ValueError, match=f"^specials must be 'ieee' or 'fn', got '{specials}'$"):
            FormatInfo("x", 5, 10, 15, specials)
    # the narrowest and widest layouts allowed: 2 exponent bits, 1 mantissa bit, 32 bits in all
    assert FormatInfo("tiny", 2, 1, 1, "ieee").bits == 4
    assert FormatInfo("tiny_fn", 2, 1, 1, "fn").max_finite == 2.0**(3 - 1)  # 0 11 0: 11 1 is NaN
    assert FormatInfo("wide", 8, 23, 127, "ieee").bits == 32
    for e, m in [(1, 4), (4, 0), (8, 24), (9, 23)]:
        with pytest.raises(ValueError, match=f"^unsupported field widths e={e}, m={m}$"):
            FormatInfo("x", e, m, 7, "ieee")


@pytest.mark.parametrize("name", sorted(ORACLE))
def test_limits_row_is_finfo(name):
    fi = ml_dtypes.finfo(ORACLE[name])
    assert format_info(name).limits() == {
        "format": name, "bits": fi.bits, "exponent bits": fi.bits - fi.nmant - 1,
        "mantissa bits": fi.nmant, "bias": 1 - fi.minexp,
        "infinities": bool(np.isinf(np.array(np.inf, ORACLE[name]))),
        "largest finite": float(fi.max), "smallest normal": float(fi.smallest_normal),
        "smallest subnormal": float(fi.smallest_subnormal), "epsilon": float(fi.eps),
        "decimal digits": round(float(fi.nmant + 1) * np.log10(2), 2)}


def test_range_table():
    t = range_table()
    assert list(t.index) == list(FORMATS)
    assert t.loc["fp16", "largest finite"] == float(np.finfo(np.float16).max)
    assert t.loc["bf16", "smallest normal"] == float(ml_dtypes.finfo(ml_dtypes.bfloat16).tiny)


def test_import_is_quick_and_torch_free():
    code = ("import sys, fp16lab.formats, fp16lab.bits; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

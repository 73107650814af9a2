"""decode / encode / explain against independent oracles: numpy, ml_dtypes, torch, exact fractions.

A finding worth knowing: ml_dtypes and torch cast float64 -> bfloat16 (and fp8) through float32,
so a float64 value can be rounded twice and land one ULP off the nearest bfloat16. The oracles
below therefore use float32 inputs for ml_dtypes / torch, and an exact-fraction oracle for
float64 inputs.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fp16lab import bits
from fp16lab.bits.checks import ALLOWED_VALUES
from fp16lab.bits.encode import _uniform_like
from fp16lab.formats import format_info

# numpy warns on casts that overflow or make NaN: that is what these tests exercise
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

NARROW = {  # format -> (numpy/ml_dtypes dtype, unsigned view dtype, torch dtype)
    "fp16": (np.float16, np.uint16, torch.float16),
    "bf16": (ml_dtypes.bfloat16, np.uint16, torch.bfloat16),
    "fp8_e4m3": (ml_dtypes.float8_e4m3fn, np.uint8, torch.float8_e4m3fn),
    "fp8_e5m2": (ml_dtypes.float8_e5m2, np.uint8, torch.float8_e5m2),
}


def oracle_codes(x, name: str) -> np.ndarray:
    """Codes by numpy / ml_dtypes casts (from float32 unless fp16, which numpy rounds directly)."""
    dt, udt, _ = NARROW[name]
    src = np.asarray(x, dtype=np.float64 if name == "fp16" else np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        return src.astype(dt).view(udt).astype(np.int64)


def same_codes(got, want, name):
    """Codes equal, except that any NaN code matches any NaN code."""
    got, want = np.asarray(got), np.asarray(want)
    gnan, wnan = np.isnan(bits.decode(got, name)), np.isnan(bits.decode(want, name))
    return np.array_equal(gnan, wnan) and np.array_equal(got[~gnan], want[~wnan])


# --------------------------------------------------------------------------------- decode
@pytest.mark.parametrize("name", sorted(NARROW))
def test_decode_every_code_numpy_ml_dtypes(name):
    dt, udt, _ = NARROW[name]
    codes = np.arange(2 ** (8 * np.dtype(udt).itemsize))
    want = codes.astype(udt).view(dt).astype(np.float64)
    got = bits.decode(codes, name)
    assert got.dtype == np.float64
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)]))


@pytest.mark.parametrize("name", sorted(NARROW))
def test_decode_every_code_torch(name):
    _, udt, tdt = NARROW[name]
    n = 2 ** (8 * np.dtype(udt).itemsize)
    codes = torch.arange(n, dtype=torch.int64)
    raw = np.arange(n).astype(udt).view(np.int16 if n == 65536 else np.uint8)
    want = torch.from_numpy(raw).view(tdt).to(torch.float64)
    got = bits.decode(codes, name)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.equal(got[ok], want[ok])
    assert torch.equal(torch.signbit(got[ok]), torch.signbit(want[ok]))


def test_decode_fp32_and_tf32():
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 2**32, 200_000, dtype=np.int64)
    codes[:6] = [0, 0x80000000, 1, 0x7F800000, 0xFF800000, 0x7FC00000]
    want = codes.astype(np.uint32).view(np.float32).astype(np.float64)
    assert np.array_equal(bits.decode(codes, "fp32"), want, equal_nan=True)
    # a tf32 code is the top 19 bits of an fp32 code
    tcodes = codes >> 13
    assert np.array_equal(bits.decode(tcodes, "tf32"),
                          (tcodes << 13).astype(np.uint32).view(np.float32).astype(np.float64),
                          equal_nan=True)


def test_decode_scalar_and_shape():
    assert bits.decode(0x3C00, "fp16") == 1.0
    assert bits.decode(np.uint16(0xC000)) == -2.0
    assert bits.decode([[0x3C00, 0x7C00]]).shape == (1, 2)


@pytest.mark.parametrize("bad,match", [
    (0x10000, r"code 65536 is out of range for fp16.*0xffff"),
    (-1, r"code -1 is out of range"),
    ([1.5], r"integer codes.*float64"),
    ("0x3c00", r"string '0x3c00'.*parse_code"),
])
def test_decode_bad_codes(bad, match):
    with pytest.raises(ValueError, match=match):
        bits.decode(bad, "fp16")


def test_decode_bad_codes_fp8_and_tensor():
    with pytest.raises(ValueError, match=r"code 256 is out of range for fp8_e4m3.*0\.\.255"):
        bits.decode([0, 256], "e4m3")
    with pytest.raises(ValueError, match="dtype torch.float32"):
        bits.decode(torch.ones(3), "fp16")


# --------------------------------------------------------------------------------- encode
EDGES = [0.0, -0.0, 1.0, -1.0, 2048.0, 2049.0, 2050.0, 2051.0, 65504.0, 65519.99, 65520.0,
         65536.0, 1e6, -1e6, 448.0, 464.0, 464.1, 480.0, 57344.0, 61440.0, 1e-8, 2.0**-24,
         2.0**-25, 2.0**-25 * 1.0001, 3 * 2.0**-26, 2.0**-14, 2.0**-14 - 2.0**-25, 2.0**-133,
         2.0**-134, 3 * 2.0**-134, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-11,
         1.0 + 3 * 2.0**-11, 0.1, 1 / 3, 3.0e38, 3.4e38, 1e39, -1e39, 2.0**-6, 2.0**-9,
         2.0**-10, 2.0**-17, 2.0**-16, np.inf, -np.inf, np.nan, -np.nan]


@pytest.mark.parametrize("name", sorted(NARROW))
def test_encode_edges_match_casts(name):
    x = np.array(EDGES, dtype=np.float32).astype(np.float64)
    assert same_codes(bits.encode(x, name), oracle_codes(x, name), name)


@pytest.mark.parametrize("name", sorted(NARROW))
def test_encode_every_value_and_midpoint(name):
    """Every finite value encodes to itself; every midpoint between neighbours ties to even."""
    _, udt, _ = NARROW[name]
    vals = bits.decode(np.arange(2 ** (8 * np.dtype(udt).itemsize)), name)
    vals = np.unique(vals[np.isfinite(vals) & (vals >= 0)])
    mids = (vals[1:] + vals[:-1]) / 2  # exact in float64 and in float32
    x = np.concatenate([vals, -vals, mids, -mids, np.nextafter(mids.astype(np.float32), 0),
                        np.nextafter(mids.astype(np.float32), np.inf)]).astype(np.float64)
    assert same_codes(bits.encode(x, name), oracle_codes(x, name), name)


@pytest.mark.parametrize("name", sorted(NARROW))
def test_encode_matches_torch_casts(name):
    _, udt, tdt = NARROW[name]
    g = torch.Generator().manual_seed(7)
    x = torch.randn(100_000, generator=g) * torch.exp2(torch.randint(-30, 20, (100_000,),
                                                                      generator=g).float())
    x = torch.cat([x, torch.tensor(EDGES, dtype=torch.float32)])
    if name == "fp8_e4m3":
        x = x[x.abs() <= 464]  # torch's e4m3fn overflow behaviour is not the OCP/ml_dtypes one
    want = x.to(tdt).view(torch.int16 if udt == np.uint16 else torch.uint8).to(torch.int64)
    want = want & (0xFFFF if udt == np.uint16 else 0xFF)
    got = bits.encode(x, name)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64
    assert same_codes(got.numpy(), want.numpy(), name)


@settings(max_examples=60, deadline=None)
@given(arrays(np.float32, st.integers(1, 300), elements=st.floats(width=32, allow_nan=True,
                                                                   allow_infinity=True)))
def test_encode_random_float32_hypothesis(x):
    for name in NARROW:
        assert same_codes(bits.encode(x, name), oracle_codes(x, name), name), name


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.integers(1, 200), elements=st.floats(-7e4, 7e4)))
def test_encode_random_float64_fp16_numpy(x):
    assert same_codes(bits.encode(x, "fp16"), oracle_codes(x, "fp16"), "fp16")


def _nearest_even_exact(x: float, name: str) -> int:
    """Code of the nearest finite value by exact fractions (ties to the even code)."""
    f = format_info(name)
    codes = np.arange(f.max_finite_code + 1)
    vals = bits.decode(codes, name)
    mag = Fraction(abs(x))
    dist = [abs(Fraction(float(v)) - mag) for v in vals]
    best = min(dist)
    cands = [int(c) for c, d in zip(codes, dist) if d == best]
    code = cands[0] if len(cands) == 1 else [c for c in cands if c % 2 == 0][0]
    return code | (f.sign_mask if np.signbit(x) else 0)


def _nearest_even_bisect(x: float, name: str) -> int:
    """Same oracle for 16-bit formats: the two neighbours by bisection, then exact fractions."""
    f = format_info(name)
    vals = bits.decode(np.arange(f.max_finite_code + 1), name)  # increasing with the code
    i = int(np.searchsorted(vals, abs(x)))
    cands = [c for c in (i - 1, i) if 0 <= c <= f.max_finite_code]
    dist = {c: abs(Fraction(float(vals[c])) - Fraction(abs(x))) for c in cands}
    best = min(dist.values())
    ties = [c for c in cands if dist[c] == best]
    code = ties[0] if len(ties) == 1 else [c for c in ties if c % 2 == 0][0]
    return code | (f.sign_mask if np.signbit(x) else 0)


@settings(max_examples=200, deadline=None)
@given(st.floats(-3.3e38, 3.3e38))
def test_encode_float64_exact_oracle_bf16(x):
    # ml_dtypes and torch round float64 -> bf16 through float32; this oracle rounds once
    assert bits.encode(x, "bf16") == _nearest_even_bisect(x, "bf16")


@settings(max_examples=200, deadline=None)
@given(st.floats(-65504, 65504))
def test_encode_float64_exact_oracle_fp16(x):
    assert bits.encode(x, "fp16") == _nearest_even_bisect(x, "fp16")


@settings(max_examples=40, deadline=None)
@given(st.floats(-440, 440))
def test_encode_float64_exact_oracle_fp8(x):
    # direct rounding of float64 (the casts go through float32 and may round twice)
    assert bits.encode(x, "e4m3") == _nearest_even_exact(x, "fp8_e4m3")
    assert bits.encode(x, "e5m2") == _nearest_even_exact(x, "fp8_e5m2")


def test_bf16_double_rounding_is_avoided():
    # just above the midpoint between two bf16 values, by less than a float32 ULP
    lo, hi = 1.0, 1.0 + 2**-7
    x = (lo + hi) / 2 + 2.0**-30
    assert bits.decode(bits.encode(x, "bf16"), "bf16") == hi
    # the cast via float32 lands on the tie and rounds to even: one ULP off
    assert float(np.float64(x).astype(np.float32).astype(ml_dtypes.bfloat16)) == lo


def test_negative_zero_and_ties():
    assert bits.encode(-0.0, "fp16") == 0x8000
    assert bits.encode(2049.0, "fp16") == np.float16(2048).view(np.uint16)  # tie to even
    assert bits.encode(2051.0, "fp16") == np.float16(2052).view(np.uint16)
    assert bits.encode(-2.0**-26, "fp16") == 0x8000  # underflow keeps the sign


def test_overflow_rules():
    assert bits.encode(65520.0, "fp16") == 0x7C00  # tie above max rounds to inf
    assert bits.encode(65519.0, "fp16") == 0x7BFF
    assert bits.encode(1e6, "fp16", saturate=True) == 0x7BFF
    assert bits.encode(-np.inf, "fp16", saturate=True) == 0xFBFF
    assert bits.encode(464.0, "e4m3") == 0x7E  # tie rounds to even 448
    assert bits.encode(465.0, "e4m3") == 0x7F  # NaN, as ml_dtypes
    assert bits.encode(np.inf, "e4m3") == 0x7F
    assert bits.encode(1e9, "e4m3", saturate=True) == 0x7E
    assert bits.encode(-1e9, "e4m3", saturate=True) == 0xFE
    assert bits.encode(1e6, "e5m2") == 0x7C
    assert bits.encode(1e6, "fp16", rounding="toward_zero") == 0x7BFF


def test_encode_fp32_matches_numpy():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(100_000) * np.exp2(rng.integers(-160, 130, 100_000))
    x = np.concatenate([x, [0.0, -0.0, 2.0**-150, 2.0**-149 * 1.5, 3.5e38, np.inf]])
    with np.errstate(over="ignore"):
        want = x.astype(np.float32).view(np.uint32).astype(np.int64)
    assert np.array_equal(bits.encode(x, "fp32"), want)


def test_tf32_is_fp32_with_low_13_bits_rounded_off():
    rng = np.random.default_rng(4)
    x = rng.standard_normal(200_000) * np.exp2(rng.integers(-130, 120, 200_000))
    x = x.astype(np.float32)
    b = x.view(np.uint32).astype(np.int64)
    b[:3] = [0x3F801000, 0x3F803000, 0x3F801001]  # ties (to even, both ways) and just above
    x = b.astype(np.uint32).view(np.float32)
    # the definition: round the 13 dropped bits to nearest even, on the integer bit pattern
    rounded = (b + 0xFFF + ((b >> 13) & 1)) >> 13
    assert np.array_equal(bits.encode(x, "tf32"), rounded)
    assert bits.encode(np.float32(1.0 + 2**-11), "tf32") == 0x3F800000 >> 13


def test_toward_zero_matches_float64_truncation():
    rng = np.random.default_rng(5)
    x = rng.uniform(-60000, 60000, 20_000)
    got = bits.decode(bits.encode(x, "fp16", rounding="toward_zero"), "fp16")
    near = np.float16(x).astype(np.float64)
    # the truncated value is the neighbour not farther from zero than x
    lower_mag = np.where(np.abs(near) <= np.abs(x), near,
                         np.nextafter(np.float16(near), np.float16(0)).astype(np.float64))
    assert np.array_equal(got, lower_mag)


def _stochastic_fp16(xs: np.ndarray, as_torch: bool, seed: int) -> np.ndarray:
    """Returns the fp16 codes of xs rounded stochastically, through numpy or through torch."""
    if as_torch:
        return bits.encode(torch.from_numpy(xs), "fp16", rounding="stochastic",
                           generator=torch.Generator().manual_seed(seed)).numpy()
    return bits.encode(xs, "fp16", rounding="stochastic", seed=seed)


@pytest.mark.parametrize("as_torch", [False, True])
def test_stochastic_rounding_unbiased(as_torch):
    x = np.array([1.0 + 2.0**-12, 1000.3, -3.7e-6, 2.0**-26])  # last one: below half min subnormal
    n = 20_000
    xs = np.repeat(x, n)
    vals = bits.decode(_stochastic_fp16(xs, as_torch, seed=0), "fp16").reshape(len(x), n)
    for xi, row in zip(x, vals):
        lo = np.float16(xi)
        lo = lo if abs(float(lo)) <= abs(xi) else np.nextafter(lo, np.float16(0))
        hi = np.nextafter(lo, np.float16(np.inf) if xi > 0 else np.float16(-np.inf))
        assert set(np.unique(row)) <= {float(lo), float(hi)}
        p = abs(xi - float(lo)) / abs(float(hi) - float(lo))
        # mean of n Bernoulli(p) draws: within 5 standard errors of x
        se = abs(float(hi) - float(lo)) * np.sqrt(p * (1 - p) / n) + 1e-300
        assert abs(row.mean() - xi) < 5 * se + 1e-12 * abs(xi), (xi, row.mean())


def test_exact_values_never_move_under_any_rounding():
    v = bits.decode(np.arange(0x7C00), "fp16")
    for mode in ("toward_zero", "stochastic"):
        assert np.array_equal(bits.decode(bits.encode(v, "fp16", rounding=mode), "fp16"), v)


@pytest.mark.parametrize("bad,match", [
    ("abc", r"string 'abc'"), (["a", "b"], r"real numbers.*\['a', 'b'\]"),
    (1 + 2j, "complex"),
])
def test_encode_bad_values(bad, match):
    with pytest.raises(ValueError, match=match):
        bits.encode(bad, "fp16")


def test_encode_bad_rounding():
    with pytest.raises(ValueError, match=r"unknown rounding 'up'.*nearest, toward_zero"):
        bits.encode(1.0, "fp16", rounding="up")


def test_quantize_and_ulp():
    assert bits.quantize(2048.0 + 1.0, "fp16") == 2048.0
    x = np.array([1.0, 3.0, 1000.0, 60000.0, 1e-6, 2.0**-20])
    assert np.array_equal(bits.ulp(x, "fp16"), np.spacing(np.float16(x)).astype(np.float64))


# --------------------------------------------------------------------------------- codes, explain
def test_hex_and_bits_strings():
    assert bits.to_hex(0x3C00, "fp16") == "0x3c00"
    assert bits.to_hex(0x7F, "e4m3") == "0x7f"
    assert bits.to_bits(0x3C00, "fp16") == "0 01111 0000000000"
    assert bits.parse_code("0x3C00", "fp16") == 0x3C00
    assert bits.parse_code("0_01111_0000000000", "fp16") == 0x3C00
    assert bits.parse_code("0 0111 000", "e4m3") == 0x38


@pytest.mark.parametrize("text,match", [
    ("0x1ffff", r"'0x1ffff' is out of range for fp16.*0xffff"),
    ("0 01111 000000000", r"has 15 bits; fp16 codes have 16"),
    ("0xzz", r"cannot read '0xzz'.*hex like '0x3c00'.*16 bits like '0 01111 0000000000'"),
    ("12", r"cannot read '12'"),
])
def test_parse_code_errors(text, match):
    with pytest.raises(ValueError, match=match):
        bits.parse_code(text, "fp16")


@pytest.mark.parametrize("x", [1.0, 0.1, -3.14159, 65504.0, 6e-8, 1e-5, 2049.0, -0.0])
def test_explain_against_numpy_float16(x):
    h = np.float16(x)
    e = bits.explain(x, "fp16")
    assert e.code == int(h.view(np.uint16))
    assert e.hex == f"0x{int(h.view(np.uint16)):04x}"
    assert e.value == float(h)
    assert e.next_up == float(np.nextafter(h, np.float16(np.inf)))
    assert e.next_down == float(np.nextafter(h, np.float16(-np.inf)))
    spacing = float(np.spacing(abs(h)))  # numpy says inf at the largest finite
    assert e.ulp == (spacing if np.isfinite(spacing) else 32.0)
    assert e.error == float(h) - x
    assert Fraction(e.exact) == Fraction(float(h))


def test_explain_fields_and_classes():
    e = bits.explain("0 00000 0000000001", "fp16")
    assert (e.kind, e.value, e.exponent, e.mantissa_field) == ("subnormal", 2.0**-24, -14, 1)
    e = bits.explain("0x3c00", "half")
    assert (e.sign, e.exponent_field, e.exponent, e.kind) == (0, 15, 0, "normal")
    assert bits.explain(-0.0).kind == "zero" and bits.explain(-0.0).sign == 1
    assert bits.explain(1e6).kind == "inf"
    assert bits.explain(1e6, "e4m3").kind == "nan"
    assert bits.explain(1e6, "e4m3", saturate=True).value == 448
    assert bits.explain("nan", "bf16").kind == "nan"
    assert bits.explain(torch.tensor(0.5), "bf16").value == 0.5
    assert "0x3c00" in str(bits.explain(1.0)) and "<table" in bits.explain(1.0)._repr_html_()


@pytest.mark.parametrize("bad,match", [
    ("hello", r"cannot read 'hello'.*number.*hex like '0x3c00'"),
    (None, r"takes a number.*NoneType"),
    ([1.0, 2.0], r"takes a number.*list"),
    (np.ones(3), r"one value.*\(3,\)"),
])
def test_explain_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        bits.explain(bad, "fp16")


# --------------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(NARROW) + ["tf32", "fp32"])
def test_cuda_matches_numpy(name):
    f = format_info(name)
    codes = torch.randint(0, 2**f.bits, (300_000,), dtype=torch.int64)
    cpu = bits.decode(codes, name)
    gpu = bits.decode(codes.cuda(), name)
    assert gpu.is_cuda and torch.equal(torch.isnan(gpu.cpu()), torch.isnan(cpu))
    ok = ~torch.isnan(cpu)
    assert torch.equal(gpu.cpu()[ok], cpu[ok])
    x = torch.randn(300_000) * torch.exp2(torch.randint(-40, 40, (300_000,)).float())
    enc = bits.encode(x.cuda(), name)
    assert enc.is_cuda and torch.equal(enc.cpu(), torch.from_numpy(bits.encode(x.numpy(), name)))
    sr = bits.encode(x.cuda(), name, rounding="stochastic")
    lo = bits.encode(x, name, rounding="toward_zero").numpy()
    assert np.all((sr.cpu().numpy() == lo) | (sr.cpu().numpy() == lo + 1)
                  | ~np.isfinite(bits.decode(lo, name)) | (np.abs(x.numpy()) > f.max_finite))


# --------------------------------------------------------------------------------- helpers
def test_explain_table_against_numpy():
    xs = [0.0, 1.0, 65504.0, 1e5, 2.0**-24, 0.1]
    t = bits.explain_table(xs, "fp16")
    h = np.array(xs).astype(np.float16)
    assert list(t["hex"]) == [f"0x{int(c):04x}" for c in h.view(np.uint16)]
    assert list(t["value"]) == [float(v) for v in h]
    assert list(t.index) == ["0", "1", "65504", "100000", "5.960464e-08", "0.1"]


def _numpy_neighbours(h):
    return (float(np.nextafter(h, np.float16(-np.inf))), float(np.nextafter(h, np.float16(np.inf))))


@pytest.mark.parametrize("x", [0.1, -2.0**-24, 65504.0])
def test_explanation_text_reads_numpys_fields(x):
    """The printed explanation, line by line, from numpy's float16 and Python's Decimal."""
    h = np.float16(x)
    code = int(h.view(np.uint16))
    sign, e_field, m_field = code >> 15, (code >> 10) & 0x1F, code & 0x3FF
    down, up = _numpy_neighbours(h)
    err = float(h) - x
    expected = [
        ("format", "fp16"), ("given", repr(x)),
        ("bits (s|e|m)", f"{sign} {e_field:05b} {m_field:010b}"), ("hex", f"0x{code:04x}"),
        ("sign", f"{sign} ({'-' if sign else '+'})"),
        ("exponent", f"field {e_field}, unbiased {max(e_field, 1) - 15}"),
        ("mantissa", f"field {m_field}"),
        ("class", "subnormal" if e_field == 0 else "normal"), ("value", repr(float(h))),
        ("exact value", str(Decimal(float(h)))), ("neighbours", f"{down!r} < value < {up!r}"),
        ("ULP", repr(float(np.spacing(np.float16(abs(h)))) if abs(h) < 65504 else 32.0)),
        ("rounding error", f"{err!r} (relative {abs(err) / abs(x):.3g})"),
    ]
    e = bits.explain(x, "fp16")
    assert e.rows() == expected
    width = max(len(k) for k, _ in expected)
    assert str(e) == "\n".join(f"{k:<{width}}  {v}" for k, v in expected)
    html = e._repr_html_()
    assert html.startswith("<table class='fp16lab-explain'>") and html.endswith("</table>")
    assert html.count("<tr>") == len(expected)
    assert (f"<tr><th style='text-align:left'>bits (s|e|m)</th><td style='text-align:left'>"
            f"<code>{expected[2][1]}</code></td></tr>") in html
    assert "&lt; value &lt;" in html  # the neighbours' '<' escaped


def test_explanation_of_specials_and_codes():
    inf = bits.explain(np.inf, "fp16")
    assert dict(inf.rows())["exponent"] == "field 31, unbiased n/a"
    assert (inf.error, inf.relative_error, inf.exact) == (0.0, 0.0, "inf")
    assert math.isnan(inf.ulp) and inf.next_down == 65504.0
    zero = bits.explain(0.0, "bf16")
    assert (zero.exponent, zero.relative_error, zero.error) == (None, 0.0, 0.0)
    assert dict(zero.rows())["sign"] == "0 (+)"
    neg_zero = bits.explain(-0.0, "fp16")
    assert dict(neg_zero.rows())["sign"] == "1 (-)" and neg_zero.code == 0x8000
    over = bits.explain(1e6, "fp16")  # rounds to inf: an infinite error
    assert over.error == math.inf == over.relative_error
    nan = bits.explain(float("nan"), "fp16")  # NaN is not equal to itself: error unknown
    assert math.isnan(nan.error) and math.isnan(nan.relative_error)
    coded = bits.explain("0x3555", "fp16")  # a code: the stored value is what was given
    assert (coded.given, coded.error, coded.relative_error) == (float(np.float16(1 / 3)), 0.0, 0.0)
    for x in (0.1, 0.3, -0.7):  # toward zero: the neighbour not farther from zero than x
        h = np.float16(x)
        lower = h if abs(float(h)) <= abs(x) else np.nextafter(h, np.float16(0))
        assert bits.explain(x, "fp16", rounding="toward_zero").value == float(lower)
    assert bits.explain(1e6, "fp16", saturate=True).value == 65504.0


def test_explain_table_columns_against_numpy():
    xs = [0.1, -3.0, 2.0**-24, 1e5, float("nan")]
    t = bits.explain_table(xs, "fp16")
    assert list(t.columns) == ["hex", "bits", "class", "value", "next down", "next up", "ULP",
                               "error", "relative error"]
    assert t.index.name == "given" and list(t.index) == [format(x, ".7g") for x in xs]
    for x, (_, row) in zip(xs, t.iterrows()):
        e = bits.explain(x, "fp16")
        assert (row["hex"], row["bits"], row["class"]) == (e.hex, e.bits, e.kind)
        got = [row[c] for c in ("value", "next down", "next up", "ULP", "error", "relative error")]
        want = [e.value, e.next_down, e.next_up, e.ulp, e.error, e.relative_error]
        np.testing.assert_array_equal(got, want)
    h = np.float16(0.1)
    assert (t.iloc[0]["next down"], t.iloc[0]["next up"]) == _numpy_neighbours(h)
    assert t.iloc[0]["error"] == float(h) - 0.1
    assert list(t["class"]) == ["normal", "normal", "subnormal", "inf", "nan"]
    # strings stay as given; keyword arguments reach explain
    t = bits.explain_table(["0x3c00", 1e6], "fp16", saturate=True)
    assert list(t.index) == ["0x3c00", "1000000"] and list(t["value"]) == [1.0, 65504.0]
    assert len(bits.explain_table(np.float32(0.5), "bf16")) == 1  # a 0-d value is one row


def test_accumulate_matches_float16_loop():
    rng = np.random.default_rng(8)
    xs = np.concatenate([np.ones(3000), rng.uniform(0, 4, 500)]).astype(np.float16)
    acc, want = np.float16(0), []
    for x in xs:  # fp16 + fp16 is exact in float32 here, so numpy rounds once
        acc = np.float16(np.float32(acc) + np.float32(x))
        want.append(float(acc))
    got = bits.accumulate(xs, "fp16")
    assert np.array_equal(got, want)
    assert got[2999] == 2048.0  # 2048 + 1 rounds back to 2048
    sr = bits.accumulate(np.ones(3000), "fp16", rounding="stochastic", seed=1)
    assert abs(sr[-1] - 3000) < 200  # unbiased on average, so it keeps growing


def test_e4m3_saturate_matches_torch_cast():
    # torch's float8_e4m3fn cast saturates out-of-range values (inf too) to +-448, where
    # ml_dtypes gives NaN: saturate=True is torch's behaviour
    x = torch.tensor([464.0, 465.0, 500.0, 1e6, float("inf"), -1e6, float("-inf"), 100.0])
    want = x.to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int64)
    assert torch.equal(bits.encode(x, "e4m3", saturate=True), want)


# ------------------------------------------------------------------ neighbours and tiny values
def _ordered_values(name: str) -> np.ndarray:
    """Every finite value of a format, from its numpy / ml_dtypes dtype, sorted (one zero)."""
    dt, udt, _ = NARROW[name]
    codes = np.arange(1 << (8 * np.dtype(udt).itemsize), dtype=np.int64)
    values = codes.astype(udt).view(dt).astype(np.float64)
    return np.unique(values[np.isfinite(values)])


def _neighbour_cases(name: str) -> list[int]:
    """Codes worth checking: the specials, both zeros, every code next to an exponent change, and a sample."""
    f = format_info(name)
    top = f.sign_mask - 1
    cases = {0, 1, 2, top, top - 1, f.max_finite_code, f.max_finite_code - 1}
    cases |= {e << f.mantissa_bits | m for e in range(f.exponent_field_max + 1)
              for m in (0, 1, f.mantissa_field_max) if e << f.mantissa_bits | m <= top}
    cases |= set(np.random.default_rng(0).integers(0, top + 1, 300).tolist())
    return sorted(cases | {c | f.sign_mask for c in cases})


@pytest.mark.parametrize("name", sorted(NARROW))
def test_next_up_and_down_are_the_adjacent_values_of_ml_dtypes(name):
    """IEEE nextUp / nextDown: the least value above (greatest below); -inf steps to -max."""
    f = format_info(name)
    ordered = _ordered_values(name)
    for code in _neighbour_cases(name):
        x = float(bits.decode(code, f))
        if np.isnan(x):
            assert bits.next_up(code, f) == code and bits.next_down(code, f) == code
            continue
        for step, towards, edge in ((bits.next_up, np.inf, ordered[-1]),
                                    (bits.next_down, -np.inf, ordered[0])):
            got = float(bits.decode(step(code, f), f))
            if x == towards or (x == edge and not f.has_infs):  # inf, or fn's largest, stays put
                expected = x
            elif x == edge:
                expected = towards
            elif x == -towards:  # -inf -> -max finite for next_up, +inf -> +max for next_down
                expected = ordered[0] if towards > 0 else ordered[-1]
            else:
                i = np.searchsorted(ordered, x, side="right" if towards > 0 else "left")
                expected = ordered[i] if towards > 0 else ordered[i - 1]
            assert got == expected, (name, hex(code), step.__name__, got, expected)


def test_next_up_from_minus_infinity_is_minus_the_largest_finite():
    for name, (dt, udt, _) in NARROW.items():
        f = format_info(name)
        if not f.has_infs:
            continue
        minus_inf = int(np.array(-np.inf, dt).view(udt))
        minus_max = int(np.nextafter(np.array(-np.inf, dt), np.array(0, dt)).view(udt)) \
            if dt is np.float16 else int(np.array(-float(ml_dtypes.finfo(dt).max), dt).view(udt))
        assert bits.next_up(minus_inf, f) == minus_max, name
        assert bits.next_down(minus_inf ^ f.sign_mask, f) == minus_max ^ f.sign_mask, name


@pytest.mark.parametrize("as_torch", [False, True])
def test_stochastic_rounding_far_below_the_smallest_subnormal(as_torch):
    """Values 2^-10 .. 2^-40 of fp16's smallest subnormal round up with probability x / 2^-24.

    Their codes shift more than 54 bits, so the probability must come from the real shift:
    taken from the shift clamped at 54, 1e-10 would round up 256 times too often."""
    tiny = 2.0**-24
    n = 200_000
    for x in (1e-10, -3e-12, 2.0**-34):
        xs = np.full(n, x)
        vals = bits.decode(_stochastic_fp16(xs, as_torch, seed=1), "fp16")
        assert set(np.unique(np.abs(vals))) <= {0.0, tiny}
        p = float(Fraction(abs(x)) / Fraction(tiny))  # exact
        ups = int((vals != 0).sum())
        # binomial(n, p): within 5 standard deviations, plus one for tiny n p
        assert abs(ups - n * p) <= 5 * np.sqrt(n * p * (1 - p)) + 1, (x, ups, n * p)


# ------------------------------------------------------------------ defaults, types, edges
def test_fp16_is_the_default_format():
    assert bits.decode(0x3C00) == 1.0 and bits.encode(1.0) == 0x3C00
    assert bits.quantize(0.1) == float(np.float16(0.1))
    assert bits.ulp(1.0) == float(np.spacing(np.float16(1.0)))
    assert bits.to_hex(0x3C00) == "0x3c00" and bits.to_bits(0x3C00) == "0 01111 0000000000"
    assert bits.parse_code("0x3c01") == 0x3C01 and bits.next_up(0x3C00) == 0x3C01
    assert bits.next_down(0x3C00) == 0x3BFF and bits.explain(1.0).fmt == "fp16"
    assert list(bits.accumulate([2048.0, 1.0])) == [2048.0, 2048.0]


def test_scalars_give_python_numbers_arrays_give_arrays():
    assert type(bits.decode(np.uint16(0x3C00), "fp16")) is float
    assert type(bits.encode(np.float32(1.0), "fp16")) is int
    assert type(bits.encode(1, "fp16")) is int
    assert type(bits.ulp(np.float32(1.0), "fp16")) is float
    assert bits.encode(np.array([1.0]), "fp16").shape == (1,)
    t = bits.ulp(torch.tensor([1.0, 3e-5, 1e5]), "fp16")
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64
    np.testing.assert_array_equal(t.numpy(), bits.ulp(np.array([1.0, 3e-5, 1e5]), "fp16"))


def test_ulp_of_inf_and_nan_is_nan():
    got = bits.ulp(np.array([np.inf, -np.inf, np.nan, 65504.0]), "fp16")
    assert np.isnan(got[:3]).all() and got[3] == 32.0
    assert np.isnan(bits.ulp(torch.tensor([np.inf]), "bf16")).all()


def test_encode_one_float64_ulp_from_a_tie():
    # 1 + 2^-11 is halfway between fp16 1.0 and 1 + 2^-10; one float64 ulp decides
    for base in (1 + 2.0**-11, 1 + 3 * 2.0**-11, 2.0**-14 + 2.0**-25):
        for x in (np.nextafter(base, 0), base, np.nextafter(base, 2)):
            assert bits.encode(x, "fp16") == int(np.float16(x).view(np.uint16)), x
            assert bits.encode(-x, "fp16") == int(np.float16(-x).view(np.uint16)), -x


def test_every_nan_payload_encodes_to_nan():
    payloads = np.array([0x7FF0_0000_0000_0001, 0x7FF8_0000_0000_0000, 0xFFF0_0000_0000_0001],
                        dtype=np.uint64).view(np.float64)
    for name in ("fp16", "fp8_e4m3", "bf16"):
        f = format_info(name)
        codes = bits.encode(payloads, name) & (f.sign_mask - 1)
        assert (codes == f.nan_code).all(), name


def test_toward_zero_keeps_infinities_and_saturates_finite_values():
    # IEEE 754 round toward zero: an overflowing finite value becomes the largest finite
    # number, an infinity stays infinite
    got = bits.encode(np.array([np.inf, -np.inf, 1e6, -1e6]), "fp16", rounding="toward_zero")
    assert list(got) == [0x7C00, 0xFC00, 0x7BFF, 0xFBFF]


def test_accumulate_takes_tensors_formats_and_seeds():
    xs = np.full(300, 0.1)
    np.testing.assert_array_equal(bits.accumulate(torch.tensor(xs, requires_grad=True), "bf16"),
                                  bits.accumulate(xs, "bf16"))  # a tensor that needs grad too
    acc, want = ml_dtypes.bfloat16(0), []
    for x in xs.astype(ml_dtypes.bfloat16):
        acc = ml_dtypes.bfloat16(np.float32(acc) + np.float32(x))
        want.append(float(acc))
    np.testing.assert_array_equal(bits.accumulate(xs, "bf16"), want)
    a = bits.accumulate(np.full(500, 0.3), "fp16", rounding="stochastic", seed=3)
    b = bits.accumulate(np.full(500, 0.3), "fp16", rounding="stochastic", seed=3)
    c = bits.accumulate(np.full(500, 0.3), "fp16", rounding="stochastic", seed=4)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    with pytest.raises(ValueError, match="^accumulate expects numbers, got the string 'abc'"):
        bits.accumulate("abc")
    with pytest.raises(ValueError, match="^ulp expects numbers, got the string 'abc'"):
        bits.ulp("abc")


def test_stochastic_rounding_follows_the_seed_or_generator():
    xs = np.full(2000, 1 + 2.0**-12)
    by_seed = bits.encode(xs, "fp16", rounding="stochastic", seed=5)
    assert np.array_equal(by_seed, bits.encode(xs, "fp16", rounding="stochastic",
                                               generator=np.random.default_rng(5)))
    assert not np.array_equal(by_seed, bits.encode(xs, "fp16", rounding="stochastic", seed=6))
    t = torch.from_numpy(xs)
    first = bits.encode(t, "fp16", rounding="stochastic", generator=torch.Generator().manual_seed(2))
    again = bits.encode(t, "fp16", rounding="stochastic", generator=torch.Generator().manual_seed(2))
    assert torch.equal(first, again)
    # the uniforms are float64, so probabilities finer than float32's 2^-24 steps still count
    # (on the tensor's device: 'meta' stands in for a GPU here)
    u = _uniform_like(torch.zeros(4, dtype=torch.float64, device="meta"), None, None)
    assert u.dtype == torch.float64 and u.device.type == "meta" and tuple(u.shape) == (4,)


def test_quantize_passes_rounding_on():
    x = np.array([0.1, 0.3, -0.7])
    lower = np.array([h if abs(float(h)) <= abs(v) else np.nextafter(h, np.float16(0))
                      for v, h in zip(x, x.astype(np.float16))]).astype(np.float64)
    np.testing.assert_array_equal(bits.quantize(x, "fp16", rounding="toward_zero"), lower)


def test_code_helpers_name_themselves_and_take_one_element_arrays():
    assert bits.to_bits(0x8001, "fp16") == "1 00000 0000000001"
    assert bits.to_bits(0x3C00, "fp16", sep="") == "0011110000000000"
    assert bits.to_hex(torch.tensor(0x3C00), "fp16") == "0x3c00"
    assert bits.to_hex(np.array([0x7F]), "e4m3") == "0x7f"
    for func in ("to_hex", "to_bits", "next_up", "next_down"):
        with pytest.raises(ValueError, match=rf"^{func}\(\): code 65536 is out of range for fp16: "
                                             r"codes are 16-bit integers 0\.\.65535 \(0x0000\.\.0xffff\)$"):
            getattr(bits, func)(65536, "fp16")
    with pytest.raises(ValueError, match=r"^to_hex\(\) takes an integer code of fp16, .* got float "
                                         r"1\.5; encode\(\) turns a number into its code$"):
        bits.to_hex(1.5, "fp16")
    with pytest.raises(ValueError, match=r"got str '0x3c00'; read a hex or bit string with "
                                         r"parse_code\(\)$"):
        bits.to_hex("0x3c00", "fp16")
    with pytest.raises(ValueError, match=r"got NoneType None$"):
        bits.to_hex(None, "fp16")
    with pytest.raises(ValueError, match=r"^to_bits\(\) takes one code, got an array of shape \(2,\)$"):
        bits.to_bits(torch.tensor([1, 2]), "fp16")
    with pytest.raises(ValueError, match=r"^to_bits\(sep=\.\.\.\) takes a string \(' ', '_', ''\), "
                                         r"got 0$"):
        bits.to_bits(1, "fp16", sep=0)


def _message(func, *args) -> str:
    """Returns the message of the ValueError that func(*args) must raise."""
    with pytest.raises(ValueError) as info:
        func(*args)
    return str(info.value)


def test_parse_code_messages_show_the_formats_own_examples():
    assert _message(bits.parse_code, 15360, "bf16") == (
        "parse_code() reads a string (hex like '0x3f80' or 16 bits), got int 15360; an integer "
        "code goes to decode() or to_hex() as it is")
    assert _message(bits.parse_code, "0x1ff", "e4m3") == (
        "hex code '0x1ff' is out of range for fp8_e4m3: allowed 0x0..0xff (8 bits)")
    assert bits.parse_code("0xff", "e4m3") == 0xFF  # the top code itself is allowed
    assert bits.parse_code("0x3c_00", "fp16") == 0x3C00
    assert bits.parse_code("0b_0011_1000_", "e4m3") == 0x38
    assert _message(bits.parse_code, "0 111 000", "e4m3") == (
        "bit string '0 111 000' has 7 bits; fp8_e4m3 codes have 8 (1 sign, 4 exponent, "
        "3 mantissa), e.g. '0 0111 000'")
    assert _message(bits.parse_code, "one", "bf16") == (
        "cannot read 'one' as a bf16 code: allowed are hex like '0x3f80' or 16 bits like "
        "'0 01111111 0000000' (spaces and underscores allowed, 0b prefix optional)")


def test_explain_messages_and_single_digits():
    assert bits.explain("0", "fp16").value == 0.0 and bits.explain("1", "fp16").value == 1.0
    assert bits.explain(np.array([0.5]), "fp16").value == 0.5
    with pytest.raises(ValueError, match=r"^explain\(\) takes one value, got an array of shape \(2,\)$"):
        bits.explain(np.array([1.0, 2.0]), "fp16")
    with pytest.raises(ValueError, match=r"^explain\(\) takes one value, got a tensor of shape \(2, 1\)$"):
        bits.explain(torch.ones(2, 1), "fp16")
    assert _message(bits.explain, "zz", "e5m2") == (
        "cannot read 'zz': allowed are a number ('1.5', '1e15', '-inf', 'nan'), hex like "
        "'0x3c', or 8 bits with a 0b prefix ('0b00111100') or with spaces or underscores "
        "between the fields ('0 01111 00')")


def test_decode_refuses_codes_out_of_range_naming_the_bad_one():
    for codes, bad in (([-3, 5], -3), ([4, 70000], 70000), ([-1, 70000], -1)):
        for as_torch in (False, True):
            arg = torch.tensor(codes) if as_torch else np.array(codes)
            with pytest.raises(ValueError, match=rf"^code {bad} is out of range for fp16: codes "
                                                 r"are 16-bit integers 0\.\.65535"):
                bits.decode(arg, "fp16")
    assert bits.decode(torch.tensor([0, 65535], dtype=torch.int32), "fp16").dtype == torch.float64
    with pytest.raises(ValueError, match=r"^decode expects integer codes for fp16 \(0\.\.65535 "
                                         r"\(0x0000\.\.0xffff\)\), got float64 values like "
                                         r"\[1\.0, 2\.0, 3\.0\]$"):
        bits.decode(np.arange(1.0, 6.0), "fp16")
    with pytest.raises(ValueError, match="got a tensor of dtype torch.bool"):
        bits.decode(torch.tensor([True]), "fp16")
    with pytest.raises(ValueError, match="got a tensor of dtype torch.complex64"):
        bits.decode(torch.tensor([1j]), "fp16")
    with pytest.raises(ValueError, match=r"^decode expects integer codes for fp16 in a rectangular "
                                         r"array, got \[\[1, 2\], \[3\]\]$"):
        bits.decode([[1, 2], [3]], "fp16")
    with pytest.raises(ValueError, match=r"got float 1\.5$"):  # 0-d: no index to name
        bits.decode(np.array(1.5, dtype=object), "fp16")
    with pytest.raises(ValueError, match=r"got str 'a'; allowed"):  # 0-d: no index to name
        bits.encode(np.array("a", dtype=object), "fp16")


def test_value_messages_say_what_kind_of_array_was_given():
    allowed = ALLOWED_VALUES
    dates = np.array(["2020-01-01", "2020-01-02"], dtype="datetime64[D]")
    assert _message(bits.encode, dates) == (
        "encode expects real numbers, got a datetime64[D] array of dates (datetime64), not "
        f"numbers, like {dates.tolist()!r}; allowed: {allowed}")
    spans = np.array([1, 2, 3, 4], dtype="timedelta64[s]")
    assert _message(bits.quantize, spans, "fp16") == (
        "encode expects real numbers, got a timedelta64[s] array of durations (timedelta64), not "
        f"numbers, like {spans[:3].tolist()!r}; allowed: {allowed}")
    raw = np.zeros(2, dtype="V4")
    assert "got a |V4 array of raw records, like" in _message(bits.encode, raw)
    assert _message(bits.encode, torch.ones(2, dtype=torch.complex64)) == (
        f"encode expects real numbers, got a complex tensor (torch.complex64); allowed: {allowed}")


def test_rounding_aliases_and_toward_zero_on_tensors():
    x = np.array([0.1, -0.3, 1000.7])
    lower = bits.encode(x, "fp16", rounding="toward_zero")
    assert np.array_equal(bits.encode(x, "fp16", rounding="truncate"), lower)
    assert torch.equal(bits.encode(torch.from_numpy(x), "fp16", rounding="toward_zero"),
                       torch.from_numpy(lower))
    sr = bits.encode(np.full(100, 0.1), "fp16", rounding="sr", seed=0)
    assert set(np.unique(sr)) <= {int(lower[0]), int(lower[0]) + 1}
    # meta tensors stand in for a GPU: every helper stays on the tensor's device
    assert bits.ulp(torch.zeros(3, device="meta"), "fp16").device.type == "meta"


def test_explain_details_in_other_formats():
    assert bits.explain(float("nan"), "fp16").exponent is None
    e = bits.explain(0.1, "bf16")
    assert e.ulp == float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps) * 2.0**-4  # 0.1 is in [2^-4, 2^-3)
    html = bits.explain(1.0, "fp16")._repr_html_()
    rows = bits.explain(1.0, "fp16").rows()
    assert html == ("<table class='fp16lab-explain'>" + "".join(
        f"<tr><th style='text-align:left'>{k}</th><td style='text-align:left'><code>"
        f"{v.replace('<', '&lt;')}</code></td></tr>" for k, v in rows) + "</table>")


def test_explain_table_defaults_and_odd_inputs():
    assert list(bits.explain_table([1.0])["hex"]) == ["0x3c00"]  # fp16 by default
    assert list(bits.explain_table([0.1], "bf16")["hex"]) == [
        f"0x{int(np.array(0.1, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)):04x}"]
    assert len(bits.explain_table(np.array(0.5), "fp16")) == 1  # a 0-d array is one value
    assert _message(bits.explain_table, None) == (
        "explain_table() takes a list of values (numbers, hex or bit strings), got None")


def test_remaining_mutants_out_of_range_zero_torch_sizes_underscores_and_other_formats():
    # a zero low end does not hide the bad high code
    for as_torch in (False, True):
        arg = torch.tensor([0, 70000]) if as_torch else np.array([0, 70000])
        with pytest.raises(ValueError, match=r"^code 70000 is out of range for fp16"):
            bits.decode(arg, "fp16")
    # torch.Size is a tuple of ints, not a tensor
    assert bits.encode(torch.Size([1, 2]), "fp16").tolist() == [0x3C00, 0x4000]
    # underscores anywhere among the hex digits, as the message promises
    for s in ("0x3c__00", "0x_3c00", "0x3c00_"):
        assert bits.parse_code(s) == 0x3C00, s
    # messages show 1.0 in the format asked for, with its width (fp8 e4m3: 0x38, not 0x0038)
    for fmt, one in (("bf16", "0x3f80"), ("fp8_e4m3", "0x38")):
        with pytest.raises(ValueError, match=rf"hex like '{one}' or "):
            bits.parse_code("zz", fmt)
        with pytest.raises(ValueError, match=rf"^parse_code\(\) reads a string \(hex like '{one}' "):
            bits.parse_code(1.5, fmt)
    # the values are rounded into the accumulator's format, not fp16's (1e5 overflows fp16)
    want = float(np.float32(1e5).astype(ml_dtypes.bfloat16))
    assert bits.accumulate([1e5], "bf16").tolist() == [want] and want == 99840.0


def test_arrays_of_a_kind_without_its_own_word_are_still_refused_as_not_numbers():
    if not hasattr(getattr(np, "dtypes", None), "StringDType"):
        pytest.skip("numpy < 2 has no StringDType")
    strings = np.array(["a", "b"], dtype=np.dtypes.StringDType())  # numpy 2's kind 'T'
    with pytest.raises(ValueError) as info:
        bits.encode(strings, "fp16")
    assert str(info.value).startswith(
        "encode expects real numbers, got a StringDType() array of values that are not real "
        "numbers, like ['a', 'b']; allowed: ")


def test_decode_reads_uint8_tensors_of_fp8_codes_like_ml_dtypes():
    # the codes are widened before any arithmetic: uint8 would wrap e_field - bias below zero
    codes = np.array([0x38, 0x08, 0x01, 0xB8, 0x7E], dtype=np.uint8)
    for name, dt in (("fp8_e4m3", ml_dtypes.float8_e4m3fn), ("fp8_e5m2", ml_dtypes.float8_e5m2)):
        want = codes.view(dt).astype(np.float64)
        got = bits.decode(torch.from_numpy(codes), name)
        np.testing.assert_array_equal(got.numpy(), want)


def test_an_explanation_shows_its_text_in_a_notebook_not_its_fields():
    from IPython.lib.pretty import pretty

    from fp16lab.bits import explain

    e = explain(1.0, "fp16")
    assert pretty(e) == str(e)
    assert "Explanation(" not in pretty(e)

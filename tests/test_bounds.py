"""fp16lab.testing.bounds: correct fp32-accumulated products pass, a tile 0.5% off fails."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

from fp16lab.kernels.emulate import fragment_mma_fp16_acc
from fp16lab.testing.bounds import (assert_gemm_close, error_ratio, gamma, gemm_error_bound,
                                    gemm_violations, unit_roundoff)


def _inputs(m, n, k, seed=0, dtype=np.float16):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype))


def _fp32_in_order(a, b, order):
    """Sums the exact fp32 products one k at a time in the given order, rounding each sum to fp32."""
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for kk in order:
        acc = acc + np.outer(a32[:, kk], b32[kk, :])  # float32 + float32: rounded to fp32
    return acc


def test_unit_roundoffs_are_numpys_and_ml_dtypes():
    assert unit_roundoff("fp32") == float(np.finfo(np.float32).eps) / 2 == 2.0**-24
    assert unit_roundoff("fp16") == float(np.finfo(np.float16).eps) / 2
    assert unit_roundoff("bf16") == float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps) / 2


def test_gamma_is_n_u_over_one_minus_n_u():
    for n, u in [(0, 2.0**-24), (1, 2.0**-24), (15, 2.0**-23), (1023, 2.0**-11)]:
        exact = Fraction(n) * Fraction(u) / (1 - Fraction(n) * Fraction(u))
        assert gamma(n, u) == pytest.approx(float(exact), rel=1e-15)
    with pytest.raises(ValueError, match=r"n \* u = 1 >= 1"):
        gamma(2048, 2.0**-11)
    with pytest.raises(ValueError, match="count of roundings"):
        gamma(-1, 2.0**-24)


@pytest.mark.parametrize("shape", [(1, 1, 1), (16, 16, 16), (17, 33, 9), (32, 48, 1024)])
def test_correct_fp32_accumulations_pass(shape):
    m, n, k = shape
    a, b = _inputs(m, n, k, seed=k)
    rng = np.random.default_rng(1)
    for got in (a.astype(np.float32) @ b.astype(np.float32),                 # BLAS, blocked
                (torch.from_numpy(a).float() @ torch.from_numpy(b).float()).numpy(),
                _fp32_in_order(a, b, range(k)),                             # k = 0, 1, ...
                _fp32_in_order(a, b, rng.permutation(k))):                  # any other order
        # rounding to nearest: within the bound even without the tensor cores' truncation slack
        assert gemm_violations(got, a, b, truncating=False) is None
        assert_gemm_close(got, a, b)


def test_bf16_inputs_pass_too():
    a, b = _inputs(16, 24, 40, dtype=ml_dtypes.bfloat16)
    assert_gemm_close(_fp32_in_order(a, b, range(40)), a, b, truncating=False)


def test_a_tile_half_a_percent_off_fails_though_the_matrix_norm_passes():
    a, b = _inputs(1024, 1024, 64)
    got = a.astype(np.float32) @ b.astype(np.float32)
    got[16:32, 32:48] *= np.float32(1.005)  # tile (1, 2)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    # the old whole-matrix check: 0.005 * 16 / 1024 is below its 1e-4 tolerance
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-4
    message = gemm_violations(got, a, b)
    assert message is not None and "(1 16x16 tiles)" in message and "in tile (1, 2)" in message
    with pytest.raises(AssertionError, match=r"in tile \(1, 2\).*\(K = 64\)"):
        assert_gemm_close(got, a, b)


def test_one_wrong_element_and_a_nan_fail():
    a, b = _inputs(40, 40, 16)
    good = a.astype(np.float32) @ b.astype(np.float32)
    for i, j, value in [(3, 37, np.nan), (39, 0, np.inf)]:
        got = good.copy()
        got[i, j] = value
        assert f"worst is [{i}, {j}]" in gemm_violations(got, a, b)
    got = good.copy()
    got[5, 6] = np.nextafter(np.nextafter(good[5, 6], np.inf), np.inf) + abs(good[5, 6]) * 1e-4
    assert "1 of 1600 elements" in gemm_violations(got, a, b)


def test_bound_is_per_element_and_tight():
    a, b = _inputs(16, 16, 16)
    _, bound = gemm_error_bound(a, b, truncating=False)
    magnitude = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    expected = (15 * 2.0**-24 / (1 - 15 * 2.0**-24) + 16 * 2.0**-53 / (1 - 16 * 2.0**-53)) * magnitude
    np.testing.assert_allclose(bound, expected, rtol=1e-15)
    _, slack = gemm_error_bound(a, b)  # truncating: twice the unit roundoff per addition
    np.testing.assert_allclose(slack, (gamma(15, 2.0**-23) + gamma(16, 2.0**-53)) * magnitude,
                               rtol=1e-15)


def test_fp16_output_adds_one_rounding():
    a, b = _inputs(48, 32, 256)
    exact32 = a.astype(np.float32) @ b.astype(np.float32)
    assert_gemm_close(exact32.astype(np.float16), a, b)  # out_dtype read from got's dtype
    # the same fp16 values fail the fp32 output's bound: the output rounding is real
    assert gemm_violations(exact32.astype(np.float16).astype(np.float32), a, b) is not None


def test_fp16_accumulation_fails_the_fp32_bound():
    a, b = _inputs(16, 16, 16, seed=3)
    got = fragment_mma_fp16_acc(a, b).astype(np.float32)
    assert gemm_violations(got, a, b) is not None


def test_error_ratio_is_the_worst_error_over_its_bound():
    a, b = _inputs(64, 64, 128)
    good = a.astype(np.float32) @ b.astype(np.float32)
    ref, bound = gemm_error_bound(a, b)
    expected = float((np.abs(good.astype(np.float64) - ref) / bound).max())
    assert error_ratio(good, a, b) == expected <= 1.0
    off = good.copy()
    off[:16, :16] *= np.float32(1.005)
    assert error_ratio(off, a, b) > 10
    off[0, 0] = np.nan
    assert error_ratio(off, a, b) == np.inf
    a[3] = 0  # row 3 of a @ b is an exact sum of zeros: its bound is 0, any error is too much
    zero_row = a.astype(np.float32) @ b.astype(np.float32)
    assert error_ratio(zero_row, a, b) <= 1.0
    zero_row[3, 9] = np.float32(1e-30)
    assert error_ratio(zero_row, a, b) == np.inf
    assert error_ratio(np.zeros((0, 4), np.float32), a[:0], b[:, :4]) == 0.0


def test_bad_arguments_say_what_is_allowed():
    a, b = _inputs(4, 5, 6)
    with pytest.raises(ValueError, match=r"must multiply, got shapes \(4, 6\) and \(4, 6\)"):
        gemm_error_bound(a, a)
    with pytest.raises(ValueError, match="a has dtype float32.*float16 or bfloat16"):
        gemm_error_bound(a.astype(np.float32), b)
    with pytest.raises(ValueError, match="out_dtype must be one of float32, float16, got 'float64'"):
        gemm_error_bound(a, b, out_dtype="float64")
    with pytest.raises(ValueError, match=r"got has shape \(4, 4\); a @ b has \(4, 5\)"):
        gemm_violations(np.zeros((4, 4), np.float32), a, b)


@pytest.mark.gpu
def test_cupy_arrays_are_checked_on_the_gpu():
    cupy = pytest.importorskip("cupy")
    a, b = (cupy.asarray(x) for x in _inputs(256, 256, 512))
    got = a.astype(cupy.float32) @ b.astype(cupy.float32)
    assert_gemm_close(got, a, b)
    got[240:256, 0:16] *= cupy.float32(0.995)
    with pytest.raises(AssertionError, match=r"in tile \(15, 0\)"):
        assert_gemm_close(got, a, b)

"""Tests for fp16lab.kernels: every GEMM kernel against a float64 reference (GPU), errors (CPU)."""

from __future__ import annotations

import numpy as np
import pytest

from fp16lab.kernels import KERNELS, KernelUnavailable, find_cuda_include, gemm
from fp16lab.kernels import compiler
from fp16lab.kernels.emulate import fragment_mma

SHAPES = [(1, 1, 1), (16, 16, 16), (17, 33, 9), (128, 256, 32), (129, 257, 40), (255, 130, 64),
          (1000, 1001, 1003), (512, 512, 8), (1024, 1024, 1024)]


# ---------------------------------------------------------------------------------------------
# CPU: errors and the include-directory search
# ---------------------------------------------------------------------------------------------
def test_kernels_listed_in_ladder_order():
    steps = [s.step for s in KERNELS.values()]
    assert steps == sorted(steps) and set(steps) == {1, 2, 3, 4, 5}
    for spec in KERNELS.values():
        assert compiler.source_path(spec.source).is_file()


def test_unknown_kernel_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown kernel 'nope'.*wmma_naive"):
        gemm(None, None, kernel="nope")


def test_no_cupy_or_gpu_says_what_is_missing(monkeypatch):
    try:
        import cupy  # noqa: F401
        has_cupy = True
    except ImportError:
        has_cupy = False
    if has_cupy:
        pytest.skip("CuPy is installed here; the no-CuPy message is checked on CPU machines")
    with pytest.raises(KernelUnavailable, match="CuPy, which is not installed"):
        gemm(np.zeros((2, 2), np.float16), np.zeros((2, 2), np.float16))


def test_include_search_names_the_missing_header(tmp_path):
    incomplete = tmp_path / "wheel" / "include"
    incomplete.mkdir(parents=True)
    (incomplete / "cuda_fp16.h").write_text("")
    (incomplete / "mma.h").write_text("")
    with pytest.raises(KernelUnavailable, match=r"(?s)missing crt/mma\.h.*CUDA_PATH"):
        find_cuda_include([incomplete, tmp_path / "absent"])
    complete = tmp_path / "toolkit" / "include"
    (complete / "crt").mkdir(parents=True)
    for h in ("cuda_fp16.h", "mma.h", "crt/mma.h"):
        (complete / h).write_text("")
    assert find_cuda_include([incomplete, complete]) == complete


def test_include_search_honours_cuda_path(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_PATH", str(tmp_path))
    assert compiler.candidate_include_dirs()[0] == tmp_path / "include"


def test_fragment_emulation_matches_float64():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 16)).astype(np.float16)
    c = rng.standard_normal((16, 16)).astype(np.float32)
    got = fragment_mma(a, b, c)
    assert got.dtype == np.float32
    ref = a.astype(np.float64) @ b.astype(np.float64) + c.astype(np.float64)
    err = np.abs(got - ref).max()
    # 16 fp32 additions: each rounding at most 2^-24 of a partial sum
    assert err <= 16 * 2.0**-24 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
                                   + np.abs(c)).max()
    assert err > 0 or np.array_equal(got, ref.astype(np.float32))


def test_fragment_emulation_rejects_wrong_shapes():
    with pytest.raises(ValueError, match="16x16"):
        fragment_mma(np.zeros((8, 16), np.float16), np.zeros((16, 16), np.float16))


# ---------------------------------------------------------------------------------------------
# GPU: correctness of every kernel against float64
# ---------------------------------------------------------------------------------------------
def _rel_err(cupy, out, a, b):
    ref = a.astype(cupy.float64) @ b.astype(cupy.float64)
    num = float(cupy.linalg.norm(out.astype(cupy.float64) - ref))
    den = float(cupy.linalg.norm(ref))
    return num / den if den > 0 else num


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", ["float32", "float16"])
def test_kernel_matches_float64(kernel, shape, out_dtype):
    cupy = pytest.importorskip("cupy")
    m, n, k = shape
    rng = cupy.random.default_rng()  # fresh inputs every run
    a = rng.standard_normal((m, k), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((k, n), dtype=cupy.float32).astype(cupy.float16)
    out = cupy.full((m, n), cupy.nan, dtype=out_dtype)  # poisoned: unwritten elements fail
    res = gemm(a, b, kernel=kernel, out_dtype=out_dtype, out=out)
    assert res is out
    assert not bool(cupy.isnan(out).any()), "some outputs were never written"
    err = _rel_err(cupy, out, a, b)
    tol = 1e-4 if out_dtype == "float32" else 1e-3  # fp16 output adds one rounding (2^-11)
    assert err < tol, f"{kernel} {shape} {out_dtype}: relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_kernel_large_square(kernel):
    cupy = pytest.importorskip("cupy")
    n = 4096
    rng = cupy.random.default_rng()
    a = rng.standard_normal((n, n), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((n, n), dtype=cupy.float32).astype(cupy.float16)
    out = cupy.full((n, n), cupy.nan, dtype=cupy.float32)
    gemm(a, b, kernel=kernel, out=out)
    assert not bool(cupy.isnan(out).any())
    assert _rel_err(cupy, out, a, b) < 1e-4


@pytest.mark.gpu
def test_repeat_runs_agree_bitwise():
    # a race shows up as results that move between identical runs
    cupy = pytest.importorskip("cupy")
    rng = cupy.random.default_rng()
    a = rng.standard_normal((1000, 1003), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((1003, 1001), dtype=cupy.float32).astype(cupy.float16)
    for kernel in KERNELS:
        first = gemm(a, b, kernel=kernel)
        for _ in range(3):
            assert bool((gemm(a, b, kernel=kernel) == first).all()), kernel


@pytest.mark.gpu
def test_bad_inputs_raise_clear_errors():
    cupy = pytest.importorskip("cupy")
    a = cupy.ones((64, 32), dtype=cupy.float16)
    b = cupy.ones((32, 48), dtype=cupy.float16)
    with pytest.raises(TypeError, match="dtype float32.*float16"):
        gemm(a.astype(cupy.float32), b)
    with pytest.raises(ValueError, match="not C-contiguous"):
        gemm(cupy.ones((32, 64), dtype=cupy.float16).T, b)
    with pytest.raises(ValueError, match=r"shapes do not match.*\(64, 32\).*\(48, 32\)"):
        gemm(a, b.T.copy())
    with pytest.raises(TypeError, match="cupy.ndarray"):
        gemm(np.ones((64, 32), np.float16), b)
    with pytest.raises(ValueError, match="2-D"):
        gemm(cupy.ones((2, 64, 32), dtype=cupy.float16), b)
    with pytest.raises(ValueError, match="out_dtype"):
        gemm(a, b, out_dtype="float64")
    with pytest.raises(ValueError, match="out must be"):
        gemm(a, b, out=cupy.empty((64, 47), dtype=cupy.float32))


@pytest.mark.gpu
def test_offset_views_and_empty_shapes():
    cupy = pytest.importorskip("cupy")
    rng = cupy.random.default_rng()
    big = rng.standard_normal((65, 40), dtype=cupy.float32).astype(cupy.float16)
    a = big[1:]  # C-contiguous, but its data pointer is 80 bytes past an aligned one
    b = rng.standard_normal((40, 24), dtype=cupy.float32).astype(cupy.float16)
    for kernel in KERNELS:
        assert _rel_err(cupy, gemm(a, b, kernel=kernel), a, b) < 1e-4, kernel
    assert gemm(cupy.ones((0, 8), cupy.float16), cupy.ones((8, 4), cupy.float16)).shape == (0, 4)
    z = gemm(cupy.ones((3, 0), cupy.float16), cupy.ones((0, 5), cupy.float16))
    assert z.shape == (3, 5) and not bool(z.any())


@pytest.mark.gpu
def test_device_printf_prints_the_fp16_bits():
    cupy = pytest.importorskip("cupy")
    from fp16lab.kernels import print_fp16_bits
    vals = np.array([1.0, -2.0, 65504.0, 6.1e-5, 0.0, -0.0, np.inf, 0.1], dtype=np.float16)
    text = print_fp16_bits(cupy.asarray(vals))
    expected = [f"fp16[{i}] = 0x{int(c):04x}" for i, c in enumerate(vals.view(np.uint16))]
    assert text.splitlines() == expected


@pytest.mark.gpu
def test_mma_sync_peak_is_measured():
    pytest.importorskip("cupy")
    from fp16lab.kernels.peak import mma_sync_peak
    rows = mma_sync_peak(warps_per_sm=(8,), iters=2000, repeat=3)
    assert rows[0]["finite"]
    # between a tenth of and twice the datasheet's dense fp16 tensor rate (989 TFLOP/s)
    assert 100 < rows[0]["tflops"] < 2000

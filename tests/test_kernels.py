"""Tests for fp16lab.kernels: every GEMM kernel against a float64 reference (GPU), errors (CPU)."""

from __future__ import annotations

import numpy as np
import pytest

from fp16lab.kernels import KERNELS, LADDER, VARIANTS, KernelUnavailable, find_cuda_include, gemm
from fp16lab.kernels import compiler
from fp16lab.kernels import report
from fp16lab.kernels.emulate import fragment_error, fragment_mma, fragment_mma_fp16_acc

SHAPES = [(1, 1, 1), (16, 16, 16), (17, 33, 9), (128, 256, 32), (129, 257, 40), (255, 130, 64),
          (1000, 1001, 1003), (512, 512, 8), (1024, 1024, 1024)]


# ---------------------------------------------------------------------------------------------
# CPU: errors and the include-directory search
# ---------------------------------------------------------------------------------------------
def test_ladder_is_one_kernel_per_step():
    assert [s.step for s in LADDER.values()] == [1, 2, 3, 4, 5, 6]
    assert {s.step for s in VARIANTS.values()} <= {4, 5, 6}
    for spec in KERNELS.values():
        assert compiler.source_path(spec.source).is_file()
    # each variant shares its step's source and entry point: only the -D flags differ
    for v in VARIANTS.values():
        step = next(s for s in LADDER.values() if s.step == v.step)
        assert (v.source, v.function) == (step.source, step.function) and v.defines != step.defines


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


def test_fragment_emulation_rounds_every_partial_sum_to_fp32():
    # 4096 * 4096 = 2^24, then fifteen products of 1: in fp32 each 2^24 + 1 is a tie that rounds
    # to even, back to 2^24; a float64 sum would keep 2^24 + 15 (rounded once: 2^24 + 16)
    a = np.zeros((16, 16), np.float16)
    b = np.zeros((16, 16), np.float16)
    a[0, 0] = b[0, 0] = 4096
    a[0, 1:] = b[1:, 0] = 1
    a[1, :] = b[:, 1] = 2.0**-12  # row 1 x col 1: sixteen 2^-24, exact in either
    c = np.zeros((16, 16), np.float32)
    c[2, 2] = 1.0
    a[2, 0] = b[0, 2] = 2.0**-12  # 1 + 2^-24: another tie, stays 1
    got = fragment_mma(a, b, c)
    assert got[0, 0] == 2.0**24
    assert got[1, 1] == 2.0**-20
    assert got[2, 2] == 1.0
    # on random tiles: the same as summing with numpy float32 scalars in k order, bit for bit
    rng = np.random.default_rng(7)
    for _ in range(3):
        a = (rng.standard_normal((16, 16)) * 2.0 ** rng.integers(-8, 8, (16, 16))).astype(np.float16)
        b = rng.standard_normal((16, 16)).astype(np.float16)
        c = rng.standard_normal((16, 16)).astype(np.float32)
        expected = c.copy()
        for i in range(16):
            for j in range(16):
                for kk in range(16):
                    expected[i, j] = np.float32(expected[i, j]
                                                + np.float32(a[i, kk]) * np.float32(b[kk, j]))
        np.testing.assert_array_equal(fragment_mma(a, b, c), expected)


def test_fragment_emulation_rejects_wrong_shapes():
    with pytest.raises(ValueError, match="16x16"):
        fragment_mma(np.zeros((8, 16), np.float16), np.zeros((16, 16), np.float16))


def test_fp16_accumulation_is_worse_and_within_its_bound():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 16)).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    d16 = fragment_mma_fp16_acc(a, b)
    assert d16.dtype == np.float16
    bound = 16 * 2.0**-11 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    assert (np.abs(d16 - ref) <= bound).all()
    e = fragment_error(seed=3)
    assert e["rel_error_fp32_accumulate"] < 4 * e["fp32_unit_roundoff"]
    assert e["rel_error_fp16_accumulate"] > 100 * e["rel_error_fp32_accumulate"]


def _row(impl, kind, step, shape, tflops, pct):
    m, n, k = map(int, shape.split("x"))
    return {"shape": shape, "m": m, "n": n, "k": k, "impl": impl, "kind": kind, "step": step,
            "tflops": tflops, "pct_cublas": pct, "rel_err": 2e-4, "median_ms": 1.0}


def _payload():
    s = "8192x8192x8192"
    rows = [_row("cupy.matmul", "cublas", 0, s, 800.0, 100.0),
            _row("wmma_naive", "kernel", 1, s, 20.0, 2.5),
            _row("wmma_pipeline", "kernel", 4, s, 300.0, 37.5),
            _row("wmma_pipeline_256", "kernel", 4, s, 420.0, 52.5),
            # faster in TFLOP/s but timed while cuBLAS ran faster too: a lower ratio
            _row("wmma_pipeline_k64", "kernel", 4, s, 430.0, 50.0),
            {**_row("mma_sync", "kernel", 5, s, 560.0, 70.0), "pct_cublas_sustained": 66.0},
            _row("not_a_kernel_any_more", "kernel", 5, s, 900.0, 112.5),
            _row("wgmma", "kernel", 6, s, 700.0, 87.5),
            {**_row("wgmma_persistent", "kernel", 6, s, 740.0, 92.5), "pct_cublas_sustained": 91.0},
            _row("mma_sync", "kernel", 5, "4096x4096x4096", 500.0, 66.0)]
    return {"meta": {"mma_sync_peak": [{"warps_per_sm": 8, "tflops": 700.0}], "copy_gbs": 4000.0},
            "rows": rows}


def test_ladder_summary_takes_the_best_kernel_of_each_step():
    p = _payload()
    assert report.best_per_step(p) == {1: "wmma_naive", 4: "wmma_pipeline_256", 5: "mma_sync",
                                       6: "wgmma_persistent"}
    t = report.ladder_summary(p)
    assert t.loc[5, "kernel"] == "mma_sync"
    assert t.loc[5, "% of mma.sync peak"] == pytest.approx(100 * 560 / 700)
    assert t.loc[4, "x previous step"] == pytest.approx(420 / 20)
    assert t.loc[5, "x previous step"] == pytest.approx(560 / 420)
    assert t.loc["cuBLAS (cupy.matmul)", "TFLOP/s"] == 800.0
    assert t.loc[6, "x previous step"] == pytest.approx(740 / 560)
    targets = report.targets(p)
    assert targets["met"].tolist() == [True, True, True]  # 52.5% >= 50%, 70% >= 70%, 92.5% >= 90%
    assert targets["kernel"].tolist() == ["wmma_pipeline_256", "mma_sync", "wgmma_persistent"]
    sustained = targets["% of cuBLAS, sustained"].tolist()
    assert np.isnan(sustained[0]) and sustained[1:] == [66.0, 91.0]
    p["rows"] = [r for r in p["rows"] if r["impl"] != "wgmma_persistent"]
    assert not report.targets(p).loc["best wgmma kernel (step 6) >= 90% of cuBLAS", "met"]
    sizes = report.sizes_table(p, ["mma_sync"])
    assert sizes.loc["mma_sync", "4096x4096x4096"] == 500.0


def test_ceiling_table_reads_the_ceiling_benchmark():
    rows = [{"what": "cuBLAS (cupy.matmul)", "instruction": "wgmma", "tflops": 750.0,
             "pct_cublas": 100.0, "sustained_tflops": 650.0, "sm_clock_mhz": 1500.0,
             "power_w": 690.0, "gemm": True},
            {"what": "Triton GEMM, forced to mma.sync", "instruction": "mma.sync", "tflops": 380.0,
             "pct_cublas": 50.7, "config": "256x128x64, 4 stages, 8 warps", "rel_err": 2e-4}]
    t = report.ceiling_table({"meta": {}, "rows": rows})
    assert list(t.index) == ["cuBLAS (cupy.matmul)", "Triton GEMM, forced to mma.sync"]
    assert t.loc["cuBLAS (cupy.matmul)", "SM clock (MHz)"] == 1500.0
    assert t.loc["Triton GEMM, forced to mma.sync", "config"].startswith("256x128")
    assert np.isnan(t.loc["Triton GEMM, forced to mma.sync", "sustained TFLOP/s"])


def test_alignment_classes_group_by_divisibility():
    rows = []
    for d in range(17):
        n = 4096 + d
        name = ("nvjet_sm90_hsh_x" if n % 8 == 0 else
                "void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_f16_128x256_64x3_nn_align2>"
                if n % 2 == 0 else "void cutlass::Kernel2<cutlass_75_tensorop_f16_s1688gemm_f16_nn_align1>")
        tf = 700.0 if n % 8 == 0 else 200.0 if n % 2 == 0 else 100.0
        rows.append({"mode": "square", "d": d, "n": n, "tflops": tf, "kernels": ["Memset (Device)", name],
                     "mult8": n % 8 == 0, "mult16": n % 16 == 0, "tensor_core_by_name": False})
    c = report.alignment_classes({"meta": {}, "rows": rows})
    assert list(c.index) == ["multiple of 16", "multiple of 8, not 16", "even, not a multiple of 8", "odd"]
    assert c.loc["odd", "vs multiples of 16"] == pytest.approx(100 / 700)
    assert c["Tensor Core kernel"].all()  # re-classified from the names, Memset dropped
    assert "align1" in c.loc["odd", "kernels"]
    assert "multiples of 8 run at 100%" in report.alignment_finding({"meta": {}, "rows": rows})


def test_tensor_core_names():
    assert report.uses_tensor_cores("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT")
    assert report.uses_tensor_cores("ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_32x3_nn")
    assert not report.uses_tensor_cores("volta_sgemm_128x64_nn")
    assert report.gemm_kernel_names(["Memset (Device)", "k"]) == ["k"]


def test_bits_table_matches_numpy_codes():
    vals = np.array([1.0, -2.0, 0.1, 65504.0, 6e-8, -0.0, np.inf], dtype=np.float16)
    printed = "\n".join(f"fp16[{i}] = 0x{int(c):04x}" for i, c in enumerate(vals.view(np.uint16)))
    t = report.bits_table(vals, printed)
    assert (t["device printf"] == t["numpy code"]).all()
    np.testing.assert_array_equal(t["decoded (fp16lab.bits)"].to_numpy(), vals.astype(np.float64))
    assert (report.bits_table(vals)["device printf"] == "not run").all()


def test_source_diff_shows_the_step():
    d = report.source_diff("wmma_smem.cu", "wmma_padded.cu")
    assert "+#define PAD 8" in d and "uint4" in d
    assert report.source_diff("wmma_smem.cu", "wmma_padded.cu", max_lines=5).endswith("shows all)")


def test_source_function_cuts_out_one_function():
    text = report.source_function("wgmma.cu", "consume_tile")
    lines = text.splitlines()
    assert lines[0].startswith("// Consumer warpgroup") and lines[-1] == "}"
    assert "wgmma_commit();" in text and "produce_tile" not in text
    assert text.count("{") == text.count("}")
    with pytest.raises(ValueError, match="no function 'nope' defined in wgmma.cu"):
        report.source_function("wgmma.cu", "nope")


def test_kernels_table_shows_the_ladder_unless_asked():
    assert list(report.kernels_table().index) == list(LADDER)
    assert list(report.kernels_table(variants=True).index) == list(KERNELS)


def test_plots_draw_from_a_payload():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    p = _payload()
    assert len(report.plot_ladder(p).lines) >= 4
    assert len(report.plot_roofline(p).lines) >= 3
    plt.close("all")


# ---------------------------------------------------------------------------------------------
# GPU: correctness of every kernel against float64
# ---------------------------------------------------------------------------------------------
def _needs(kernel):
    # step 6 runs on Hopper only (and needs nvcc and cuda-bindings): elsewhere it skips, saying why
    if KERNELS[kernel].builder == "nvcc":
        from fp16lab.kernels import wgmma
        problems = wgmma.missing()
        if problems:
            pytest.skip(f"{kernel} cannot run here: " + "; ".join(problems))


def _runnable():
    from fp16lab.kernels.measure import runnable
    return runnable(list(KERNELS))


def _rel_err(cupy, out, a, b):
    """Fails unless every element is within its own bound (from K and the unit roundoffs of the
    accumulator and the output), then returns the whole-matrix relative error."""
    from fp16lab.testing.bounds import assert_gemm_close

    assert_gemm_close(out, a, b)
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
    _needs(kernel)
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
    _needs(kernel)
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
    for kernel in _runnable():
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
    for kernel in _runnable():
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
    for operands in ("constant", "random"):
        rows = mma_sync_peak(warps_per_sm=(8,), iters=2000, repeat=3, operands=operands)
        assert rows[0]["finite"] and rows[0]["operands"] == operands
        # between a tenth of and twice the datasheet's dense fp16 tensor rate (989 TFLOP/s)
        assert 100 < rows[0]["tflops"] < 2000


def test_mma_sync_peak_rejects_unknown_operands():
    from fp16lab.kernels.peak import mma_sync_peak
    with pytest.raises(ValueError, match="'constant' or 'random'"):
        mma_sync_peak(operands="zeros")


@pytest.mark.gpu
def test_ceiling_ablation_switches():
    # fp16lab.bench.gemm_ceiling times mma_sync.cu compiled with its main-loop copies or ldmatrix
    # loads switched off: with both on it must be the ladder's kernel, bit for bit
    cupy = pytest.importorskip("cupy")
    from fp16lab.bench import gemm_ceiling as ceiling
    spec = KERNELS["mma_sync_256x128s4"]
    n = 1024
    rng = cupy.random.default_rng()
    a = rng.standard_normal((n, n), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((n, n), dtype=cupy.float32).astype(cupy.float16)
    ladder = gemm(a, b, kernel=spec.name, out_dtype="float16")
    grid = (-(-n // spec.bn) * -(-n // spec.bm),)
    outs = {}
    for copies, ldsm in ((True, True), (False, True), (True, False)):
        out = cupy.full((n, n), cupy.nan, dtype=cupy.float16)
        fn = ceiling._ablated(spec, copies, ldsm)
        fn(grid, (spec.threads,), (a, b, out, np.int32(n), np.int32(n), np.int32(n)),
           shared_mem=spec.dynamic_smem)
        outs[copies, ldsm] = out
    assert bool((outs[True, True] == ladder).all())
    assert not bool((outs[False, True] == ladder).all())  # the switches do switch something off
    assert not bool((outs[True, False] == ladder).all())


@pytest.mark.gpu
def test_notebook_helpers_check_and_benchmark():
    pytest.importorskip("cupy")
    from fp16lab.kernels import measure
    errors = measure.check_all((65, 33, 17), kernels=["wmma_naive", "mma_sync"])
    assert set(errors) == {"wmma_naive", "mma_sync"} and max(errors.values()) < 1e-4
    res = measure.run_benchmark((1024,), kernels=["wmma_naive", "mma_sync"])
    impls = {r["impl"] for r in res["rows"]}
    assert {"cupy.matmul", "wmma_naive", "mma_sync"} <= impls
    assert all(r["rel_err"] < 1e-3 for r in res["rows"])
    assert report.ladder_summary(res).loc[5, "kernel"] == "mma_sync"


def test_a_kernel_has_the_same_colour_in_the_ladder_and_the_roofline():
    import matplotlib
    matplotlib.use("Agg")
    from fp16lab import measure
    g = measure.read_result("gemm")
    colours = []
    for plot in (report.plot_ladder, report.plot_roofline):
        ax = plot(g)
        colours.append({line.get_label().split(". ")[-1]: matplotlib.colors.to_hex(line.get_color())
                        for line in ax.lines if not line.get_label().startswith("_")})
        legend = ax.get_legend().get_window_extent()
        assert not legend.overlaps(ax.get_window_extent()) or legend.x0 >= ax.get_window_extent().x1 - 1
    shared = set(colours[0]) & set(colours[1])
    kernels = [k for k in shared if k in report.best_per_step(g).values()]
    assert len(kernels) >= 5
    for k in kernels:
        assert colours[0][k] == colours[1][k], k
    assert len({colours[0][k] for k in kernels}) == len(kernels)  # one colour each


def test_build_arguments_are_checked_before_any_compiler_runs(tmp_path):
    from fp16lab.kernels import compiler, cubin, launch

    assert cubin.nvcc_flags("sm_100a")[0] == "-gencode=arch=compute_100a,code=sm_100a"
    for bad, error in (("", ValueError), ("90a", ValueError), ("sm_90a;rm", ValueError),
                       (7, TypeError)):
        with pytest.raises(error, match="arch must be a string like 'sm_90a'"):
            cubin.nvcc_flags(bad)
    assert compiler.compile_options(tmp_path) == ("-std=c++17", f"-I{tmp_path}")
    with pytest.raises(FileNotFoundError, match="include_dir"):
        compiler.compile_options(tmp_path / "nope")
    assert len(launch.ParamBlock(3).values) == 3
    with pytest.raises(ValueError, match="n must be >= 1"):
        launch.ParamBlock(0)

"""Tests for step 6's plumbing: the nvcc cubin cache (fp16lab.kernels.cubin) and the wgmma launcher's
checks and arithmetic (fp16lab.kernels.wgmma) on the CPU; its products against float64 on a Hopper GPU."""

from __future__ import annotations

import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from fp16lab.kernels import KERNELS, LADDER, KernelUnavailable, gemm
from fp16lab.kernels import cubin
from fp16lab.kernels import wgmma as launcher

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None,
                                reason="nvcc is not on PATH: the cubin cache needs it to build")
WGMMA = dict(LADDER["wgmma"].defines)


# ---------------------------------------------------------------------------------------------
# CPU: where the cache lives, what its key covers, when nvcc runs
# ---------------------------------------------------------------------------------------------
def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("FP16LAB_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cubin.cache_dir() == tmp_path / "xdg" / "fp16lab" / "cubin"
    monkeypatch.setenv("FP16LAB_CACHE_DIR", str(tmp_path / "mine"))
    assert cubin.cache_dir() == tmp_path / "mine"


def test_flags_target_sm_90a_and_carry_the_defines():
    flags = cubin.nvcc_flags("sm_90a", {"BN": 128, "BM": 128})
    assert "-gencode=arch=compute_90a,code=sm_90a" in flags and "-cubin" in flags
    assert flags[-2:] == ["-DBM=128", "-DBN=128"]  # sorted: the same set gives the same key


@needs_nvcc
def test_cache_key_changes_with_defines_and_source(monkeypatch, tmp_path):
    base = cubin.cubin_path("wgmma.cu", WGMMA)
    assert base == cubin.cubin_path("wgmma.cu", dict(reversed(list(WGMMA.items()))))
    assert base != cubin.cubin_path("wgmma.cu", {**WGMMA, "STAGES": 3})
    edited = tmp_path / "wgmma.cu"
    header = tmp_path / "hopper.cuh"
    header.write_text(cubin.source_path("hopper.cuh").read_text())
    edited.write_text(cubin.source_path("wgmma.cu").read_text())
    monkeypatch.setattr(cubin, "source_path", lambda name: tmp_path / name)
    assert cubin.cubin_path("wgmma.cu", WGMMA) == base  # the same texts, the same key
    edited.write_text(edited.read_text() + "\n// edited\n")
    assert cubin.cubin_path("wgmma.cu", WGMMA) != base
    edited.write_text(cubin.source_path("wgmma.cu").read_text().replace("\n// edited\n", ""))
    assert cubin.cubin_path("wgmma.cu", WGMMA) == base
    header.write_text(header.read_text() + "\n// edited\n")  # the header it includes
    assert cubin.cubin_path("wgmma.cu", WGMMA) != base
    assert cubin.local_includes(edited) == [header]


@needs_nvcc
def test_build_compiles_once_then_reuses_the_file(monkeypatch, tmp_path):
    monkeypatch.setenv("FP16LAB_CACHE_DIR", str(tmp_path))
    calls = []
    real_run = subprocess.run

    def counting_run(cmd, *args, **kwargs):
        calls.append(cmd)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(cubin.subprocess, "run", counting_run)
    path = cubin.build("wgmma.cu", WGMMA)
    compiles = [c for c in calls if "-cubin" in c]
    assert len(compiles) == 1 and path.parent == tmp_path
    assert path.read_bytes()[:4] == b"\x7fELF"  # a cubin is an ELF file
    stamp = path.stat().st_mtime_ns
    assert cubin.build("wgmma.cu", WGMMA) == path
    assert len([c for c in calls if "-cubin" in c]) == 1 and path.stat().st_mtime_ns == stamp
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


@needs_nvcc
def test_build_failure_shows_the_compiler_error(monkeypatch, tmp_path):
    monkeypatch.setenv("FP16LAB_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"(?s)nvcc failed.*wgmma N of 128 or 256"):
        cubin.build("wgmma.cu", {**WGMMA, "BN": 96})
    assert list(tmp_path.iterdir()) == []


def test_no_nvcc_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(cubin, "find_nvcc", lambda: None)
    with pytest.raises(KernelUnavailable, match=r"(?s)no nvcc was found.*CUDA_PATH"):
        cubin.build("wgmma.cu", WGMMA)


# ---------------------------------------------------------------------------------------------
# CPU: what gemm(kernel="wgmma") says where it cannot run
# ---------------------------------------------------------------------------------------------
def _fake_cupy(compute_capability: str, name: str):
    device = types.SimpleNamespace(compute_capability=compute_capability, id=0)
    runtime = types.SimpleNamespace(getDeviceProperties=lambda i: {"name": name.encode()})
    return types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda: device, runtime=runtime))


def test_wgmma_names_every_missing_piece(monkeypatch):
    def no_cupy():
        raise KernelUnavailable("CuPy, which is not installed here")

    monkeypatch.setattr(launcher, "require_cupy", no_cupy)
    monkeypatch.setattr(launcher, "find_nvcc", lambda: None)
    # import cuda.bindings fails, even where it is already imported (torch's CUDA build
    # imports cuda.bindings.driver): the import looks up the full name first, so hide them all
    for name in ["cuda", *[m for m in sys.modules if m.startswith("cuda.")]]:
        monkeypatch.setitem(sys.modules, name, None)
    for name in [k for k, s in KERNELS.items() if s.builder == "nvcc"]:
        with pytest.raises(KernelUnavailable) as e:
            gemm(np.zeros((8, 8), np.float16), np.zeros((8, 8), np.float16), kernel=name)
        msg = str(e.value)
        assert "steps 6 and 7" in msg and "CuPy" in msg and "nvcc" in msg and "cuda-bindings" in msg


def test_wgmma_needs_a_hopper_gpu(monkeypatch):
    monkeypatch.setattr(launcher, "require_cupy", lambda: _fake_cupy("80", "NVIDIA A100-SXM4-80GB"))
    problems = launcher.missing()
    hopper = [p for p in problems if "Hopper" in p]
    assert len(hopper) == 1 and "A100" in hopper[0] and "compute capability 8.0" in hopper[0]
    monkeypatch.setattr(launcher, "require_cupy", lambda: _fake_cupy("90", "NVIDIA H200"))
    assert not [p for p in launcher.missing() if "Hopper" in p]


def test_steps_1_to_5_do_not_need_nvcc(monkeypatch):
    # the older kernels compile with NVRTC: a missing nvcc must not stop them
    monkeypatch.setattr(launcher, "find_nvcc", lambda: None)
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed: this checks the message on machines without it")
    except ImportError:
        pass
    with pytest.raises(KernelUnavailable) as e:
        gemm(np.zeros((8, 8), np.float16), np.zeros((8, 8), np.float16), kernel="mma_sync")
    assert "nvcc" not in str(e.value)


@pytest.mark.parametrize("m, n, cluster, persistent", [
    (1, 1, 1, 0), (128, 256, 1, 0), (129, 257, 1, 0), (8192, 8192, 1, 0),
    (129, 256, 2, 0), (128, 256, 2, 0), (8192, 8192, 1, 132), (100, 100, 1, 132)])
def test_grid_counts_the_tiles(m, n, cluster, persistent):
    rows = -(-m // 128)
    rows += rows % cluster  # whole clusters
    tiles = rows * -(-n // 256)
    want = min(tiles, persistent) if persistent else tiles
    assert launcher.grid(m, n, 128, 256, cluster, persistent) == want


def test_shared_memory_fits_one_block_per_sm():
    # 227 KB is the most one block may have on Hopper
    for spec in (s for s in KERNELS.values() if s.builder == "nvcc"):
        d = dict(spec.defines)
        stages = d["STAGES"] * (d["BM"] * d["BK"] + d["BK"] * d["BN"]) * 2
        assert spec.dynamic_smem == stages + 1024 <= 227 * 1024, spec.name


# ---------------------------------------------------------------------------------------------
# GPU (Hopper): every element against float64, within a bound from K and the unit roundoffs
# ---------------------------------------------------------------------------------------------
def _hopper():
    cupy = pytest.importorskip("cupy")
    problems = launcher.missing()
    if problems:
        pytest.skip("the wgmma kernels cannot run here: " + "; ".join(problems))
    return cupy


def elementwise_ratio(cupy, out, a, b, out_dtype: str) -> float:
    """Returns max |out - ref| / bound, each element's bound from K and the unit roundoffs of the
    accumulator and the output (fp16lab.testing.bounds)."""
    from fp16lab.testing.bounds import error_ratio

    return error_ratio(out, a, b, out_dtype=out_dtype)


STEP6 = [k for k, s in KERNELS.items() if s.step == 6]
SHAPES = [(1, 1, 1), (64, 8, 8), (128, 256, 64), (129, 257, 65), (255, 130, 1000), (1000, 1001, 1003),
          (2048, 768, 4096), (3000, 2900, 136)]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", STEP6)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", ["float32", "float16"])
def test_wgmma_matches_float64_per_element(kernel, shape, out_dtype):
    cupy = _hopper()
    m, n, k = shape
    rng = cupy.random.default_rng()
    a = rng.standard_normal((m, k), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((k, n), dtype=cupy.float32).astype(cupy.float16)
    out = cupy.full((m, n), cupy.nan, dtype=out_dtype)
    gemm(a, b, kernel=kernel, out_dtype=out_dtype, out=out)
    r = elementwise_ratio(cupy, out, a, b, out_dtype)
    assert r <= 1.0, f"{kernel} {shape} {out_dtype}: worst error is {r:.2f} times its bound"


@pytest.mark.gpu
def test_notebook_check_catches_a_wrong_product():
    cupy = _hopper()
    from fp16lab.kernels import measure
    assert measure.check_elementwise("wgmma", (300, 200, 100), "float16") <= 1.0
    rng = cupy.random.default_rng()
    a = rng.standard_normal((64, 128), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((128, 64), dtype=cupy.float32).astype(cupy.float16)
    out = gemm(a, b, kernel="wgmma")
    assert measure.worst_error_ratio(out, a, b) <= 1.0
    out[5, 7] += 0.1  # one element off by ~100 times its bound (K = 128: bound ~ 1e-3)
    assert measure.worst_error_ratio(out, a, b) > 1.0
    out[5, 7] = cupy.nan
    assert measure.worst_error_ratio(out, a, b) == float("inf")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", STEP6)
def test_wgmma_large_and_repeatable(kernel):
    cupy = _hopper()
    rng = cupy.random.default_rng()
    a = rng.standard_normal((4096, 4096), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((4096, 4096), dtype=cupy.float32).astype(cupy.float16)
    first = gemm(a, b, kernel=kernel)
    assert elementwise_ratio(cupy, first, a, b, "float32") <= 1.0
    for _ in range(3):  # a race shows as results that move between identical runs
        assert bool((gemm(a, b, kernel=kernel) == first).all())


@pytest.mark.gpu
@pytest.mark.parametrize("switches", [{"CLUSTER_MULTICAST": 0, "CLUSTER_LOCKSTEP": 0},
                                      {"CLUSTER_MULTICAST": 0}, {"CLUSTER_ARRIVE_SCOPE": 0},
                                      {"CLUSTER_MULTICAST": 0, "CLUSTER_ARRIVE_SCOPE": 0}],
                         ids=["clusters-only", "lock-step", "cta-scope", "lock-step-cta-scope"])
def test_cluster_diagnostic_builds_are_right(switches):
    # fp16lab.bench.wgmma_cluster times these builds: their products must be right too
    cupy = _hopper()
    rng = cupy.random.default_rng()
    a = rng.standard_normal((300, 200), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((200, 520), dtype=cupy.float32).astype(cupy.float16)
    out = cupy.full((300, 520), cupy.nan, dtype=cupy.float32)
    launcher.launch(a, b, out, defines={**dict(KERNELS["wgmma_cluster2"].defines), **switches},
                    function="wgmma_f32")
    assert elementwise_ratio(cupy, out, a, b, "float32") <= 1.0

"""Compile-checks every .cu file of fp16lab.kernels (GEMM ladder, census, gradient monitor) with nvcc
for sm_80 and sm_90 (no GPU needed)."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile

import pytest

from fp16lab.kernels import KERNELS
from fp16lab.kernels.compiler import SOURCE_DIR

SOURCES = sorted(p.name for p in SOURCE_DIR.glob("*.cu"))
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: install the CUDA "
                                "toolkit to compile-check the kernels")


@functools.lru_cache(maxsize=None)
def _compile(src: str, arch: str) -> subprocess.CompletedProcess:
    # cached: the spill check reads the same compilation as the compile check
    with tempfile.TemporaryDirectory() as tmp:
        return subprocess.run(
            [NVCC, f"-arch={arch}", "-cubin", "-std=c++17", "-Xptxas", "-v", "-o",
             f"{tmp}/{src}.{arch}.cubin", str(SOURCE_DIR / src)],
            capture_output=True, text=True, timeout=600)


#: The kernels that are not GEMM ladder steps, with the entry points their launchers use.
OTHER_KERNELS = {"debug_bits.cu": (), "mma_peak.cu": (),
                 "census.cu": ("census_f32", "census_f16", "census_bf16"),
                 "grad_stats.cu": ("grad_stats",)}


def test_every_kernel_source_is_checked():
    assert {s.source for s in KERNELS.values()} | set(OTHER_KERNELS) == set(SOURCES)


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("src", SOURCES)
def test_cu_file_compiles(src, arch):
    res = _compile(src, arch)
    assert res.returncode == 0, f"nvcc -arch={arch} {src} failed:\n{res.stderr}"
    # every extern "C" entry point the launcher uses is in the compiled file
    for spec in KERNELS.values():
        if spec.source == src:
            for suffix in ("_f32", "_f16"):
                assert f"'{spec.function}{suffix}'" in res.stderr
    for entry in OTHER_KERNELS.get(src, ()):
        assert f"Compiling entry function '{entry}'" in res.stderr


@needs_nvcc
@pytest.mark.parametrize("src", ["wmma_pipeline.cu", "mma_sync.cu", "census.cu", "grad_stats.cu"])
def test_fast_kernels_do_not_spill(src):
    res = _compile(src, "sm_90")
    assert res.returncode == 0, res.stderr
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", res.stderr)]
    frames = [int(x) for x in re.findall(r"(\d+) bytes stack frame", res.stderr)]
    assert spills and not any(spills), f"{src} spills registers:\n{res.stderr}"
    assert frames and not any(frames), f"{src} uses a stack frame:\n{res.stderr}"

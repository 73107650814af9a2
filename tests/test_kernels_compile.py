"""Compile-checks every .cu file of fp16lab.kernels (GEMM ladder, census, gradient monitor) with nvcc
(no GPU needed): sm_80 and sm_90, and sm_90a for steps 6 and 7 (wgmma and setmaxnreg exist only
there); the fast kernels, the ladder's built with their own -D flags, must not spill."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile

import pytest

from fp16lab.kernels import KERNELS, LADDER, VARIANTS
from fp16lab.kernels.compiler import SOURCE_DIR
from fp16lab.kernels.wgmma import FP8_DIAGNOSTICS, FP8_SCHEDULES

pytestmark = pytest.mark.nvcc

SOURCES = sorted(p.name for p in SOURCE_DIR.glob("*.cu"))
HOPPER_ONLY = {"wgmma.cu", "wgmma_fp8.cu"}
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: install the CUDA "
                                "toolkit to compile-check the kernels")


@functools.lru_cache(maxsize=None)
def _compile(src: str, arch: str, defines: tuple[tuple[str, int], ...] = ()) -> subprocess.CompletedProcess:
    # cached: the spill check reads the same compilation as the compile check
    with tempfile.TemporaryDirectory() as tmp:
        return subprocess.run(
            [NVCC, f"-arch={arch}", "-cubin", "-std=c++17", "-Xptxas", "-v",
             *[f"-D{k}={v}" for k, v in defines], "-o", f"{tmp}/{src}.{arch}.cubin",
             str(SOURCE_DIR / src)],
            capture_output=True, text=True, timeout=600)


def _arch_cases():
    for src in SOURCES:
        for arch in (["sm_90a"] if src in HOPPER_ONLY else ["sm_80", "sm_90"]):
            yield pytest.param(src, arch, id=f"{src}-{arch}")


#: The kernels that are not GEMM ladder steps, with the entry points their launchers use.
OTHER_KERNELS = {"debug_bits.cu": (), "mma_peak.cu": (),
                 "wgmma_fp8.cu": ("wgmma_fp8_f32", "wgmma_fp8_bf16"),  # step 7: FP8 operands
                 "census.cu": ("census_f32", "census_f16", "census_bf16"),
                 "grad_stats.cu": ("grad_stats",)}


def test_every_kernel_source_is_checked():
    assert {s.source for s in KERNELS.values()} | set(OTHER_KERNELS) == set(SOURCES)


def test_ladder_and_variants_are_apart():
    assert not set(LADDER) & set(VARIANTS)
    assert list(KERNELS) == list(LADDER) + list(VARIANTS)


@needs_nvcc
@pytest.mark.parametrize("src, arch", list(_arch_cases()))
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
@pytest.mark.parametrize("src", sorted(HOPPER_ONLY))
def test_wgmma_needs_the_hopper_specific_target(src):
    # plain sm_90 has no wgmma: the error is the reason the cubin is built for sm_90a
    res = _compile(src, "sm_90")
    assert res.returncode != 0
    assert re.search(r"'wgmma\.mma_async.*' not supported on \.target 'sm_90'", res.stderr), res.stderr


def _fast_kernels():
    # the ladder's steps 4-6 and the step-6 variants, each with its own tile sizes; the census
    # and gradient-monitor kernels
    specs = [s for s in LADDER.values() if s.step >= 4] + [s for s in VARIANTS.values() if s.step == 6]
    for s in specs:
        yield pytest.param(s.name, s.source, s.defines, id=s.name)
    for src in ("census.cu", "grad_stats.cu", "wgmma_fp8.cu"):
        yield pytest.param(src, src, (), id=src)
    for schedule, defines in [*list(FP8_SCHEDULES.items())[1:], *FP8_DIAGNOSTICS.items()]:
        # step 7's other schedules and its diagnostic builds
        yield pytest.param(schedule, "wgmma_fp8.cu", tuple(sorted(defines.items())),
                           id=f"wgmma_fp8.cu, {schedule}")
    yield pytest.param("no overlap", "wgmma_fp8.cu", (("OVERLAP", 0),), id="wgmma_fp8.cu, OVERLAP 0")


@needs_nvcc
@pytest.mark.parametrize("name, source, defines", list(_fast_kernels()))
def test_fast_kernels_do_not_spill(name, source, defines):
    arch = "sm_90a" if source in HOPPER_ONLY else "sm_90"
    res = _compile(source, arch, defines)
    assert res.returncode == 0, res.stderr
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", res.stderr)]
    frames = [int(x) for x in re.findall(r"(\d+) bytes stack frame", res.stderr)]
    assert spills and not any(spills), f"{name} spills registers:\n{res.stderr}"
    assert frames and not any(frames), f"{name} uses a stack frame:\n{res.stderr}"
    # setmaxnreg is honoured only with a register cap at entry; ptxas says when it ignores it
    assert "C7508" not in res.stderr, res.stderr
    # nor may ptxas serialise the asynchronous multiplies (accumulators read while in flight)
    assert "C7514" not in res.stderr, res.stderr

"""Running the ladder on the local GPU from a notebook: correctness checks and a short benchmark.

:func:`check_all` multiplies fresh random matrices with every kernel and compares with a
float64 product (:func:`check_elementwise` does so element by element, against a bound from K and
the unit roundoffs); :func:`run_benchmark` runs ``fp16lab.bench.gemm`` (the benchmark that produced
``data/gemm.json``) in a subprocess on a few sizes and returns its result file, so a notebook
times the kernels with exactly the code that measured the recorded results.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..measure import read_result
from ..testing.bounds import error_ratio
from . import KERNELS, LADDER, gemm
from . import wgmma as _step6
from .compiler import require_cupy

def relative_error(out: Any, a: Any, b: Any) -> float:
    """Returns ||out - a@b|| / ||a@b|| with the product taken in float64 on the GPU."""
    cupy = require_cupy()
    ref = a.astype(cupy.float64) @ b.astype(cupy.float64)
    den = float(cupy.linalg.norm(ref))
    num = float(cupy.linalg.norm(out.astype(cupy.float64) - ref))
    return num / den if den else num


def runnable(kernels: list[str] | None = None) -> list[str]:
    """Returns the kernels (default: the ladder) that can run on this machine: the wgmma ones
    only where :func:`fp16lab.kernels.wgmma.missing` finds nothing missing (a Hopper GPU, nvcc,
    cuda-bindings)."""
    names = list(LADDER) if kernels is None else list(kernels)
    step6_ok = not _step6.missing()
    return [k for k in names if KERNELS[k].builder != "nvcc" or step6_ok]


def worst_error_ratio(out: Any, a: Any, b: Any, out_dtype: str = "float32") -> float:
    """Returns max over the elements of |out - a@b| / bound, the product taken in float64.

    The bound (``fp16lab.testing.bounds``): fp32 sums of K exact products err by at most
    gamma_(K-1)(2^-23) of sum |a||b| (one unit in the last place per addition, as tensor cores
    truncate); an fp16 output adds one rounding, 2^-11 of |a@b|. A result of at most 1 is as
    right as fp32 accumulation allows; a NaN anywhere gives infinity.
    """
    return error_ratio(out, a, b, out_dtype=out_dtype)


def check_elementwise(kernel: str, shape: tuple[int, int, int] = (1000, 1001, 1003),
                      out_dtype: str = "float32") -> float:
    """Returns :func:`worst_error_ratio` of one kernel on fresh random inputs of shape (M, N, K),
    its output poisoned with NaN first."""
    cupy = require_cupy()
    m, n, k = shape
    rng = cupy.random.default_rng()
    a = rng.standard_normal((m, k), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((k, n), dtype=cupy.float32).astype(cupy.float16)
    out = cupy.full((m, n), cupy.nan, dtype=out_dtype)
    gemm(a, b, kernel=kernel, out_dtype=out_dtype, out=out)
    return worst_error_ratio(out, a, b, out_dtype)


def check_all(shape: tuple[int, int, int] = (1000, 1001, 1003), kernels: list[str] | None = None,
              out_dtype: str = "float32") -> dict[str, float]:
    """Returns {kernel: relative error against float64} on fresh random inputs of shape (M, N, K).

    ``kernels`` defaults to the ladder kernels that run here (:func:`runnable`). Each output is poisoned with NaN first, so
    an element a kernel forgot to write shows as NaN.
    """
    cupy = require_cupy()
    m, n, k = shape
    rng = cupy.random.default_rng()
    a = rng.standard_normal((m, k), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((k, n), dtype=cupy.float32).astype(cupy.float16)
    errors = {}
    for name in kernels or runnable():
        out = cupy.full((m, n), cupy.nan, dtype=out_dtype)
        gemm(a, b, kernel=name, out_dtype=out_dtype, out=out)
        errors[name] = relative_error(out, a, b)
    return errors


def run_benchmark(sizes: tuple[int, ...] = (2048, 4096), kernels: list[str] | None = None,
                  timeout: int = 900) -> dict[str, Any]:
    """Returns the result of ``fp16lab.bench.gemm`` run here on square sizes (no odd shapes, no
    sustained runs: a few seconds, not a minute); ``kernels`` defaults to the ladder kernels that
    run here (:func:`runnable`)."""
    require_cupy()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "fp16lab.bench.gemm", "--no-odd", "--name", "gemm_local", "--data-dir", tmp,
               "--sustained", "0", "--sizes", *map(str, sizes)]
        cmd += ["--kernels", *(kernels or runnable())]
        # the child imports the same fp16lab as this process, installed or from a checkout
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if res.returncode != 0:
            raise RuntimeError(f"fp16lab.bench.gemm failed ({res.returncode}):\n{res.stderr[-3000:]}")
        return read_result(Path(tmp) / "gemm_local.json")

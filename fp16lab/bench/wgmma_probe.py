"""Checks each step-6 (wgmma + TMA) kernel on a few shapes, element by element, and says which failed.

A first look on a new machine or after a change to wgmma.cu, before the tests and the benchmark:
each kernel runs on shapes from one block to a few hundred, every output element is compared with
a float64 product against a bound from K and the unit roundoffs, and the worst ratio to the bound
is printed. Run it under `timeout`: a pipeline that waits on a barrier nothing will arrive at
hangs instead of failing.

    timeout 120 python -m fp16lab.bench.wgmma_probe [--ok-file FILE]
"""

from __future__ import annotations

import argparse
import sys
import time

from fp16lab import validate
from fp16lab.kernels import KERNELS, gemm
from fp16lab.kernels import wgmma as launcher
from fp16lab.kernels.compiler import KernelUnavailable, require_cupy
from fp16lab.kernels.measure import worst_error_ratio

SHAPES = ((128, 256, 64), (256, 512, 256), (129, 264, 72), (1000, 1001, 1003), (2048, 2048, 2048))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ok-file", type=validate.argument(validate.output_file),
                   help="append the name of each kernel that passed here")
    args = p.parse_args(argv)
    try:
        cupy = require_cupy()
        launcher.require()
    except KernelUnavailable as e:
        print(f"fp16lab.bench.wgmma_probe needs a Hopper GPU with CuPy, nvcc and cuda-bindings: {e}", file=sys.stderr)
        return 2
    rng = cupy.random.default_rng()
    failed = []
    for name in [k for k, s in KERNELS.items() if s.layout == "tma"]:
        before = len(failed)
        for m, n, k in SHAPES:
            a = rng.standard_normal((m, k), dtype=cupy.float32).astype(cupy.float16)
            b = rng.standard_normal((k, n), dtype=cupy.float32).astype(cupy.float16)
            for out_dtype in ("float32", "float16"):
                out = cupy.full((m, n), cupy.nan, dtype=out_dtype)
                t = time.perf_counter()
                gemm(a, b, kernel=name, out_dtype=out_dtype, out=out)
                cupy.cuda.runtime.deviceSynchronize()
                r = worst_error_ratio(out, a, b, out_dtype)
                ok = r <= 1.0
                print(f"{name:22s} {m}x{n}x{k:<6d} {out_dtype}: worst error / bound {r:.3g} "
                      f"{'ok' if ok else 'FAIL'} ({time.perf_counter() - t:.2f} s)", flush=True)
                if not ok:
                    failed.append((name, (m, n, k), out_dtype))
        if args.ok_file and len(failed) == before:
            with open(args.ok_file, "a") as f:
                f.write(name + "\n")
    print(f"\n{len(failed)} failures" + (f": {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

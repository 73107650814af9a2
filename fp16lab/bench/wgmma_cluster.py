"""Times step 6 with thread-block clusters taken apart, to find what makes the cluster variant slow.

`wgmma_cluster2` (two blocks per cluster, B fetched once and multicast to both) computes the right
product but runs at about half the speed of `wgmma`. This script builds the cluster kernel with
its cooperation switched off piece by piece (wgmma.cu's CLUSTER_MULTICAST and CLUSTER_LOCKSTEP)
and times each alongside cupy.matmul at 4096^3 and 8192^3, in alternating blocks:

- `wgmma`: no clusters (the ladder's step 6);
- `clusters only`: launched in clusters of 2, every block loads all of its own A and B and frees
  only its own stages: the cost of cluster scheduling alone;
- `lock-step`: as above, but each consumer warp also frees the stage in the other block, so both
  blocks wait for each other at every stage, as multicast needs;
- `multicast`: `wgmma_cluster2`, each block fetching half of B for both;
- the last two again, with the consumers' arrivals on the other block's barrier made with the
  default `.release.cta` semantics instead of `.release.cluster` (the hypothesis after the first
  run of this script: lock-step alone cost 40% there, and a cluster-scope release may wait for the
  warp's `wgmma` still in flight).

Each is first checked element by element against float64. Results go to data/wgmma_cluster.json.

    python -m fp16lab.bench.wgmma_cluster [--sizes 4096 8192]
"""

from __future__ import annotations

import sys

from fp16lab import measure, validate
from fp16lab.bench import argument_parser
from fp16lab.kernels import KERNELS, gemm_flops
from fp16lab.kernels import wgmma as launcher
from fp16lab.kernels.compiler import KernelUnavailable, require_cupy
from fp16lab.kernels.measure import worst_error_ratio

CASES = {
    "wgmma": dict(KERNELS["wgmma"].defines),
    "clusters only": {**dict(KERNELS["wgmma_cluster2"].defines), "CLUSTER_MULTICAST": 0,
                      "CLUSTER_LOCKSTEP": 0},
    "lock-step": {**dict(KERNELS["wgmma_cluster2"].defines), "CLUSTER_MULTICAST": 0},
    "multicast": dict(KERNELS["wgmma_cluster2"].defines),
    "lock-step, cta-scope arrive": {**dict(KERNELS["wgmma_cluster2"].defines), "CLUSTER_MULTICAST": 0,
                                    "CLUSTER_ARRIVE_SCOPE": 0},
    "multicast, cta-scope arrive": {**dict(KERNELS["wgmma_cluster2"].defines), "CLUSTER_ARRIVE_SCOPE": 0},
}


def main(argv: list[str] | None = None) -> int:
    p = argument_parser("wgmma_cluster", __doc__.splitlines()[0])
    p.add_argument("--sizes", type=validate.argument(validate.count), nargs="*",
                   default=[4096, 8192])
    p.add_argument("--data-dir", type=validate.argument(validate.output_dir), default=None,
                   help="default: data/local/ (data/ with --replace)")
    p.add_argument("--replace", action="store_true", help="write the committed file in data/")
    args = p.parse_args(argv)
    try:
        cupy = require_cupy()
        launcher.require()
    except KernelUnavailable as e:
        print(f"fp16lab.bench.wgmma_cluster needs a Hopper GPU with CuPy, nvcc and cuda-bindings: {e}", file=sys.stderr)
        return 2
    rng = cupy.random.default_rng()
    rows = []
    for n in args.sizes:
        a = rng.standard_normal((n, n), dtype=cupy.float32).astype(cupy.float16)
        b = rng.standard_normal((n, n), dtype=cupy.float32).astype(cupy.float16)
        c = cupy.empty((n, n), dtype=cupy.float16)
        fns = {"cuBLAS (cupy.matmul)": lambda: cupy.matmul(a, b, out=c)}
        errors = {}
        for label, defines in CASES.items():
            out = cupy.full((n, n), cupy.nan, dtype=cupy.float16)
            call = (lambda out=out, defines=defines:
                    launcher.launch(a, b, out, defines=defines, function="wgmma_f16"))
            call()
            cupy.cuda.runtime.deviceSynchronize()
            errors[label] = worst_error_ratio(out, a, b, "float16") if n <= 4096 else None
            fns[label] = call
        ts = measure.time_cuda_interleaved(fns, rounds=4, warmup=3, repeat=10, backend="cupy")
        base = ts["cuBLAS (cupy.matmul)"].median_ms
        for label, t in ts.items():
            rows.append({"size": n, "what": label, "median_ms": t.median_ms, "spread": t.spread,
                         "tflops": gemm_flops(n, n, n) / (t.median_ms * 1e-3) / 1e12,
                         "pct_cublas": 100.0 * base / t.median_ms,
                         "worst_error_over_bound": errors.get(label)})
        del a, b, c
        cupy.get_default_memory_pool().free_all_blocks()
    path = measure.write_result("wgmma_cluster", rows, meta={"benchmark": "fp16lab.bench.wgmma_cluster",
                                                          "timing": "interleaved with cupy.matmul",
                                                          "rounds": 4, "repeat": 10, "warmup": 3},
                              data_dir=args.data_dir, replace=args.replace)
    print(f"wrote {path}\n")
    print(f"{'size':>6s} {'what':22s} {'TFLOP/s':>8s} {'% cuBLAS':>9s} {'err/bound':>10s}")
    for r in rows:
        e = r["worst_error_over_bound"]
        print(f"{r['size']:6d} {r['what']:22s} {r['tflops']:8.1f} {r['pct_cublas']:8.1f}% "
              f"{'' if e is None else f'{e:.3f}':>10s}")
    bad = [r for r in rows if r["worst_error_over_bound"] is not None and not r["worst_error_over_bound"] <= 1]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

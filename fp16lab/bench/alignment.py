"""Does cuBLAS need dimensions that are multiples of 8 or 16 for Tensor Cores? Measures N = 4096 + d.

For d = 0..16: an fp16 torch.matmul of (4096+d)^3 ("square": every dimension moves) and of
4096 x (4096+d) x 4096 ("n_only"), CUDA-event medians after a warm-up, TFLOP/s, and the names of
the GPU kernels that torch.profiler records for one call. Results go to data/<name>.json.

    python -m fp16lab.bench.alignment            # d = 0..16, both modes
    python -m fp16lab.bench.alignment --quick    # base 1024, d in 0, 1, 8
"""

from __future__ import annotations

import sys

from fp16lab import validate
from fp16lab.measure import cuda_kernels, cuda_missing, time_cuda, write_result
from fp16lab.alignment import gemm_kernel_names, uses_tensor_cores
from fp16lab.bench import argument_parser


def kernel_names(fn) -> list[str]:
    """Returns the distinct names of the CUDA kernels one call of ``fn`` launches, in order."""
    names: list[str] = []
    for name, _ in cuda_kernels(fn):
        if name not in names:
            names.append(name)
    return names


def measure(base: int, ds: list[int], modes: list[str], warmup: int, repeat: int) -> list[dict]:
    """Returns one row per (mode, d)."""
    import torch

    rows = []
    for mode in modes:
        for d in ds:
            n = base + d
            m, k = (n, n) if mode == "square" else (base, base)
            a = torch.randn(m, k, device="cuda", dtype=torch.float16)
            b = torch.randn(k, n, device="cuda", dtype=torch.float16)
            fn = lambda: torch.matmul(a, b)  # noqa: E731
            t = time_cuda(fn, warmup=warmup, repeat=repeat)
            names = gemm_kernel_names(kernel_names(fn))
            tc = [uses_tensor_cores(x) for x in names]
            timing = t.as_dict()
            timing["repeats"] = timing.pop("n")  # not to be confused with the matrix size n
            rows.append({**timing, "mode": mode, "d": d, "m": m, "n": n, "k": k,
                         "tflops": 2 * m * n * k / (t.median_ms * 1e-3) / 1e12,
                         "kernels": names, "tensor_core_by_name": any(tc),
                         "mult8": n % 8 == 0, "mult16": n % 16 == 0})
            r = rows[-1]
            print(f"{mode:7s} d={d:2d} {m}x{n}x{k} {r['tflops']:6.1f} TFLOP/s "
                  f"tc={r['tensor_core_by_name']!s:5s} {'; '.join(names)[:150]}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argument_parser("alignment", __doc__.splitlines()[0])
    p.add_argument("--base", type=validate.argument(validate.count), default=4096)
    p.add_argument("--max-d", type=validate.argument(validate.count, low=0), default=16)
    p.add_argument("--modes", nargs="*", default=["square", "n_only"], choices=["square", "n_only"])
    p.add_argument("--warmup", type=validate.argument(validate.count, low=0), default=5)
    p.add_argument("--repeat", type=validate.argument(validate.count), default=30)
    p.add_argument("--name", type=validate.argument(validate.text), default="alignment")
    p.add_argument("--data-dir", type=validate.argument(validate.output_dir), default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--replace", action="store_true",
                   help="write the committed file in data/ instead of data/local/")
    args = p.parse_args(argv)
    why = cuda_missing("fp16lab.bench.alignment")
    if why:
        print(why, file=sys.stderr)
        return 2
    ds = list(range(args.max_d + 1))
    if args.quick:
        args.base, ds, args.repeat = 1024, [0, 1, 8], 5
    rows = measure(args.base, ds, args.modes, args.warmup, args.repeat)
    path = write_result(args.name, rows, meta={"benchmark": "fp16lab.bench.alignment",
                                                     "base": args.base, "repeat": args.repeat},
                              data_dir=args.data_dir, replace=args.replace)
    print(f"\nwrote {path}\n\n{'mode':7s} {'d':>3s} {'TFLOP/s':>8s} tensor-core kernel")
    for r in rows:
        print(f"{r['mode']:7s} {r['d']:3d} {r['tflops']:8.1f} {r['tensor_core_by_name']}  "
              f"{r['kernels'][0][:90] if r['kernels'] else '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

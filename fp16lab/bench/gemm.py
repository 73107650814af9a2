"""Times every GEMM kernel of fp16lab.kernels against cuBLAS (cupy.matmul, torch.matmul) in one run.

For each shape: fresh random fp16 inputs (several sets, rotated, when they would fit in L2), each
result checked against a float64 reference, CUDA-event medians after a warm-up, TFLOP/s and the
ratio to cupy.matmul's cuBLAS taken in the same run. Each implementation is timed in alternating
blocks with cuBLAS (``measure.time_cuda_interleaved``): the H200's clock drifts by 10% within
seconds as it meets its power limit, so a ratio of two timings taken seconds apart would measure
the drift as much as the kernels. The device-to-device copy rate is measured too, for the
roofline. Results go to data/<name>.json with device, driver and versions. Step 6 (the wgmma
kernels) is timed only where it can run (a Hopper GPU, nvcc, cuda-bindings); elsewhere the script
says what is missing and times the rest.

    python -m fp16lab.bench.gemm                      # full: 1024..8192 cubed + odd shapes
    python -m fp16lab.bench.gemm --quick              # 1024 and one odd shape
    python -m fp16lab.bench.gemm --sizes 4096 8192 --kernels mma_sync wmma_pipeline
"""

from __future__ import annotations

import math
import sys

from fp16lab import measure, validate
from fp16lab.bench import argument_parser
from fp16lab.kernels import KERNELS, KernelUnavailable, gemm, gemm_flops
from fp16lab.kernels import wgmma as launcher
from fp16lab.kernels.compiler import require_cupy
from fp16lab.kernels.measure import runnable
from fp16lab.kernels.peak import mma_sync_peak

SIZES = (1024, 2048, 4096, 8192)
ODD_SHAPES = ((1000, 1001, 1003), (4097, 4097, 4097), (8191, 8191, 8191))
L2_BYTES = 60 * 2**20


def _rel_err(cupy, out, ref) -> float:
    return float(cupy.linalg.norm(out.astype(cupy.float64) - ref) / cupy.linalg.norm(ref))


def bench_shape(m: int, n: int, k: int, kernels: list[str], *, warmup: int, repeat: int,
                rounds: int, out_dtype: str, with_torch: bool) -> list[dict]:
    """Returns one row per implementation for an M x N x K product.

    ``pct_cublas`` is the row's TFLOP/s over cupy.matmul's timed in alternating blocks with it
    (``rounds`` rounds of ``repeat`` calls each); ``pct_cublas_first`` is over the shape's own
    cupy.matmul row.
    """
    cupy = require_cupy()
    set_bytes = 2 * (m * k + k * n)
    n_sets = max(1, min(8, math.ceil(3 * L2_BYTES / set_bytes)))
    rng = cupy.random.default_rng()
    sets = [(rng.standard_normal((m, k), dtype=cupy.float32).astype(cupy.float16),
             rng.standard_normal((k, n), dtype=cupy.float32).astype(cupy.float16))
            for _ in range(n_sets)]
    ref = sets[0][0].astype(cupy.float64) @ sets[0][1].astype(cupy.float64)
    flops = gemm_flops(m, n, k)
    rows = []

    c_out = cupy.empty((m, n), dtype=cupy.float16)

    def cycled(fn):
        it = iter(range(10**9))
        return lambda: fn(*sets[next(it) % n_sets])

    cublas = cycled(lambda a, b: cupy.matmul(a, b, out=c_out))

    def record(impl, kind, step, fn, out):
        out.fill(cupy.nan) if hasattr(out, "fill") else out.fill_(float("nan"))
        fn(*sets[0])  # correctness on set 0, then timing against cuBLAS in alternating blocks
        cupy.cuda.runtime.deviceSynchronize()
        err = _rel_err(cupy, cupy.asarray(out), ref)
        fns = {"impl": cycled(fn)} if impl == "cupy.matmul" else {"impl": cycled(fn), "cublas": cublas}
        ts = measure.time_cuda_interleaved(fns, rounds=rounds, warmup=warmup, repeat=repeat,
                                         backend="cupy")  # CuPy's events see torch's work too
        t = ts["impl"]
        timing = t.as_dict()
        timing["repeats"] = timing.pop("n")  # not to be confused with the matrix size n
        row = {**timing, "shape": f"{m}x{n}x{k}", "m": m, "n": n, "k": k, "impl": impl,
               "kind": kind, "step": step, "out_dtype": out_dtype, "rel_err": err,
               "tflops": flops / (t.median_ms * 1e-3) / 1e12, "n_input_sets": n_sets}
        paired = ts.get("cublas", t)
        row["cublas_paired_tflops"] = flops / (paired.median_ms * 1e-3) / 1e12
        row["pct_cublas"] = 100.0 * paired.median_ms / t.median_ms
        rows.append(row)
        print(f"  {impl:26s} {row['tflops']:7.1f} TFLOP/s  {row['pct_cublas']:5.1f}% of cuBLAS "
              f"({row['cublas_paired_tflops']:.0f} alongside)  {t.median_ms:8.3f} ms  "
              f"spread {t.spread:.2f}  rel_err {err:.1e}", flush=True)

    record("cupy.matmul", "cublas", 0, lambda a, b: cupy.matmul(a, b, out=c_out), c_out)
    if with_torch:
        import torch
        # one stream for both libraries, so that CuPy's events time torch's launches as well
        assert torch.cuda.current_stream().cuda_stream == cupy.cuda.get_current_stream().ptr
        tsets = {id(a): (torch.from_dlpack(a), torch.from_dlpack(b)) for a, b in sets}
        t_out = torch.empty((m, n), dtype=torch.float16, device="cuda")
        record("torch.matmul", "cublas", 0,
               lambda a, b: torch.matmul(*tsets[id(a)], out=t_out), t_out)
    for name in kernels:
        out = cupy.empty((m, n), dtype=out_dtype)
        record(name, "kernel", KERNELS[name].step,
               lambda a, b, name=name, out=out: gemm(a, b, kernel=name, out_dtype=out_dtype, out=out),
               out)
    base = next(r["tflops"] for r in rows if r["impl"] == "cupy.matmul")
    for r in rows:  # against the shape's own cuBLAS row, timed first: the drift included
        r["pct_cublas_first"] = 100.0 * r["tflops"] / base
    del sets, ref
    cupy.get_default_memory_pool().free_all_blocks()
    return rows


def sustained_best(size: int, rows: list[dict], *, seconds: float, out_dtype: str) -> None:
    """Adds sustained figures to the rows of the best kernel of each step at size^3.

    Each such kernel and cupy.matmul run back to back for about ``seconds`` each, one right after
    the other, while nvidia-smi samples the SM clock and the power: the rates a training loop
    would see once the card sits at its power limit. Rows gain ``sustained_tflops``,
    ``sustained_cublas_tflops``, ``pct_cublas_sustained`` and both clocks and powers.
    """
    cupy = require_cupy()
    shape = f"{size}x{size}x{size}"
    best: dict[int, dict] = {}
    for r in rows:
        if r["shape"] == shape and r["kind"] == "kernel":
            if r["step"] not in best or r["pct_cublas"] > best[r["step"]]["pct_cublas"]:
                best[r["step"]] = r
    if not best:
        return
    rng = cupy.random.default_rng()
    a = rng.standard_normal((size, size), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((size, size), dtype=cupy.float32).astype(cupy.float16)
    c = cupy.empty((size, size), dtype=cupy.float16)
    out = cupy.empty((size, size), dtype=out_dtype)
    flops = gemm_flops(size, size, size)
    print(f"\nsustained, {shape}, about {seconds} s each (kernel right after cuBLAS):", flush=True)
    for step, r in sorted(best.items()):
        cb = measure.time_cuda_sustained(lambda: cupy.matmul(a, b, out=c), seconds=seconds)
        k = measure.time_cuda_sustained(
            lambda: gemm(a, b, kernel=r["impl"], out_dtype=out_dtype, out=out), seconds=seconds)
        r.update({"sustained_tflops": flops / (k["ms_per_call"] * 1e-3) / 1e12,
                  "sustained_cublas_tflops": flops / (cb["ms_per_call"] * 1e-3) / 1e12,
                  "pct_cublas_sustained": 100.0 * cb["ms_per_call"] / k["ms_per_call"],
                  "sm_clock_mhz": k["sm_clock_mhz"], "power_w": k["power_w"],
                  "cublas_sm_clock_mhz": cb["sm_clock_mhz"], "cublas_power_w": cb["power_w"]})
        print(f"  step {step} {r['impl']:26s} {r['sustained_tflops']:7.1f} TFLOP/s at "
              f"{k['sm_clock_mhz']} MHz, {k['power_w']} W; cuBLAS {r['sustained_cublas_tflops']:.1f} "
              f"at {cb['sm_clock_mhz']} MHz, {cb['power_w']} W: {r['pct_cublas_sustained']:.1f}%",
              flush=True)
    del a, b, c, out
    cupy.get_default_memory_pool().free_all_blocks()


def versions(cupy) -> dict:
    """Returns the CUDA runtime/driver versions CuPy sees and the kernel specs."""
    rt = cupy.cuda.runtime.runtimeGetVersion()
    dr = cupy.cuda.runtime.driverGetVersion()
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    return {"cupy_cuda_runtime": f"{rt // 1000}.{rt % 1000 // 10}",
            "cupy_cuda_driver": f"{dr // 1000}.{dr % 1000 // 10}",
            "sm_count": props["multiProcessorCount"], "l2_bytes": props["l2CacheSize"],
            "kernels": {k: {"step": s.step, "title": s.title, "source": s.source,
                            "block": [s.bm, s.bn], "threads": s.threads,
                            "dynamic_smem": s.dynamic_smem} for k, s in KERNELS.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argument_parser("gemm", __doc__.splitlines()[0])
    p.add_argument("--sizes", type=validate.argument(validate.count), nargs="*",
                   default=list(SIZES), help="square sizes")
    p.add_argument("--no-odd", action="store_true", help="skip the odd shapes")
    p.add_argument("--kernels", nargs="*", default=list(KERNELS), choices=list(KERNELS))
    p.add_argument("--warmup", type=validate.argument(validate.count, low=0), default=3,
                   help="untimed calls before each block")
    p.add_argument("--repeat", type=validate.argument(validate.count), default=10,
                   help="timed calls per block")
    p.add_argument("--rounds", type=validate.argument(validate.count), default=4,
                   help="alternating blocks of each implementation and cuBLAS")
    p.add_argument("--sustained", type=validate.argument(validate.number, low=0), default=1.0,
                   metavar="SECONDS",
                   help="seconds of back-to-back calls for the best kernel of each step and cuBLAS "
                        "at the largest square size (0: skip)")
    p.add_argument("--out-dtype", default="float16", choices=["float16", "float32"],
                   help="output dtype of our kernels (cuBLAS writes fp16)")
    p.add_argument("--name", type=validate.argument(validate.text), default="gemm",
                   help="result file stem under the data directory")
    p.add_argument("--data-dir", type=validate.argument(validate.output_dir), default=None,
                   help="default: data/local/ (data/ with --replace)")
    p.add_argument("--quick", action="store_true", help="1024 cubed and one odd shape, 5 repeats")
    p.add_argument("--replace", action="store_true",
                   help="write the committed file in data/ instead of data/local/")
    args = p.parse_args(argv)
    try:
        cupy = require_cupy()
    except KernelUnavailable as e:
        print(f"fp16lab.bench.gemm needs a CUDA GPU with CuPy: {e}", file=sys.stderr)
        return 2
    try:
        import torch
        with_torch = torch.cuda.is_available()
    except ImportError:
        with_torch = False
    skipped = [k for k in args.kernels if k not in runnable(args.kernels)]
    if skipped:  # step 6 needs a Hopper GPU, nvcc and cuda-bindings
        print(f"not timed here ({'; '.join(launcher.missing())}): {', '.join(skipped)}", flush=True)
        args.kernels = [k for k in args.kernels if k not in skipped]
    shapes = [(s, s, s) for s in args.sizes] + ([] if args.no_odd else list(ODD_SHAPES))
    if args.quick:
        shapes, args.repeat, args.rounds, args.sustained = [(1024, 1024, 1024), (1000, 1001, 1003)], 5, 2, 0
    copy_gbs = measure.copy_bandwidth_gbs() if with_torch else None
    print(f"device-to-device copy: {copy_gbs and round(copy_gbs)} GB/s", flush=True)
    peak = mma_sync_peak(repeat=5 if args.quick else 10)
    for p_ in peak:
        print(f"mma.sync peak, {p_['warps_per_sm']:2d} warps/SM: {p_['tflops']:.0f} TFLOP/s", flush=True)
    rows = []
    for m, n, k in shapes:
        print(f"{m}x{n}x{k}:", flush=True)
        rows += bench_shape(m, n, k, args.kernels, warmup=args.warmup, repeat=args.repeat,
                            rounds=args.rounds, out_dtype=args.out_dtype, with_torch=with_torch)
    squares = [s for s, n_, k_ in shapes if s == n_ == k_]
    if args.sustained > 0 and squares:
        sustained_best(max(squares), rows, seconds=args.sustained, out_dtype=args.out_dtype)
    meta = {"benchmark": "fp16lab.bench.gemm", "sustained_seconds": args.sustained, "copy_gbs": copy_gbs, "mma_sync_peak": peak,
            "repeat": args.repeat, "rounds": args.rounds, "timing": "interleaved with cupy.matmul",
            "warmup": args.warmup, "out_dtype": args.out_dtype, **versions(cupy)}
    path = measure.write_result(args.name, rows, meta=meta, data_dir=args.data_dir, replace=args.replace)
    print(f"\nwrote {path}\n")
    print("mma.sync peak: " + ", ".join(f"{p_['tflops']:.0f} TFLOP/s at {p_['warps_per_sm']} warps/SM"
                                        for p_ in peak))
    print(f"{'shape':>16s} {'implementation':26s} {'TFLOP/s':>8s} {'% cuBLAS':>9s} "
          f"{'(first)':>8s} {'rel err':>8s}")
    for r in rows:
        print(f"{r['shape']:>16s} {r['impl']:26s} {r['tflops']:8.1f} {r['pct_cublas']:8.1f}% "
              f"{r['pct_cublas_first']:7.1f}% {r['rel_err']:8.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

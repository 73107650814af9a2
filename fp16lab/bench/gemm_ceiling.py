"""Where step 5 of the GEMM ladder stops, and why: the ceilings around the mma.sync kernels, in one run.

Every row is an M = N = K = SIZE product in fp16 with fp32 accumulation, or a rate-only kernel:

- ``cuBLAS``: cupy.matmul, which runs wgmma kernels on Hopper (the reference of the ladder);
- ``mma.sync peak``: register-only mma.sync (``mma_peak.cu``, 8 warps per SM), with constant
  operands and with operands that change on every instruction, as in a GEMM;
- the best mma.sync kernel of the ladder, and the same kernel compiled without the main loop's
  global->shared copies, without its ldmatrix loads, and without both (``LOOP_COPIES`` and
  ``LOOP_LDMATRIX`` in ``mma_sync.cu``; the products are then wrong, only the timing counts):
  what the loop would reach if feeding the tensor cores were free;
- Triton's own GEMM forced to mma.sync (``DISABLE_MMA_V3=1``) and left to use wgmma, best of a
  few tile configurations each: what a mature compiler gets out of each instruction here.

Two measurements per row. *Burst*: CUDA events over alternating blocks of every row and cuBLAS
(``measure.time_cuda_interleaved``), as in ``fp16lab.bench.gemm``. *Sustained*: about a second of
back-to-back calls while nvidia-smi samples the SM clock and the board power every 50 ms; the
card holds its top clock only while under its power limit. Triton rows have burst figures only
(they run in a subprocess, paired with torch.matmul there).

    python -m fp16lab.bench.gemm_ceiling            # 8192^3, writes data/gemm_ceiling.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from fp16lab import measure, validate
from fp16lab.bench import argument_parser
from fp16lab.kernels import KERNELS, KernelUnavailable, gemm_flops
from fp16lab.kernels.compiler import find_cuda_include, get_function, require_cupy
from fp16lab.kernels.peak import peak_launch

#: Triton tile configurations tried per instruction: (BM, BN, BK, stages, warps).
TRITON_CONFIGS = ((128, 256, 64, 3, 8), (256, 128, 64, 4, 8), (128, 256, 64, 4, 8),
                  (128, 128, 32, 5, 4), (128, 128, 64, 4, 4), (256, 128, 32, 4, 8))
PEAK_ITERS = 20000


def _ablated(spec, copies: bool, ldmatrix: bool):
    """Returns the kernel of ``spec`` compiled with its main-loop copies / ldmatrix on or off."""
    return get_function(spec.source, spec.function + "_f16", spec.dynamic_smem,
                        defines={**dict(spec.defines), "LOOP_COPIES": int(copies),
                                 "LOOP_LDMATRIX": int(ldmatrix)})


def _sustained(fn, flops_per_call: float, seconds: float) -> dict:
    """Returns TFLOP/s, median SM clock (MHz) and board power (W) over ~``seconds`` of calls."""
    r = measure.time_cuda_sustained(fn, seconds=seconds)
    return {"sustained_tflops": flops_per_call / (r["ms_per_call"] * 1e-3) / 1e12,
            "sustained_ms": r["seconds"] * 1e3, "sm_clock_mhz": r["sm_clock_mhz"],
            "power_w": r["power_w"]}


def triton_worker(size: int) -> list[dict]:
    """Runs in a subprocess (DISABLE_MMA_V3 is read when Triton compiles): Triton's GEMM rows."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def mm(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid = tl.program_id(0)
        grid_n = tl.cdiv(N, BN)
        width = 8 * grid_n  # groups of 8 block-rows share tiles in L2, as in the ladder
        first = (pid // width) * 8
        rows_in_group = min(tl.cdiv(M, BM) - first, 8)
        pm = first + (pid % width) % rows_in_group
        pn = (pid % width) // rows_in_group
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        a = a_ptr + rm[:, None] * K + rk[None, :]
        b = b_ptr + rk[:, None] * N + rn[None, :]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for _ in range(0, K // BK):  # the sizes here are multiples of every BK
            acc = tl.dot(tl.load(a), tl.load(b), acc)
            a += BK
            b += BK * N
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16))

    forced = os.environ.get("DISABLE_MMA_V3") == "1"
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(size, size, device="cuda", dtype=torch.float16, generator=gen)
    b = torch.randn(size, size, device="cuda", dtype=torch.float16, generator=gen)
    c = torch.empty(size, size, device="cuda", dtype=torch.float16)
    ref = a.float() @ b.float()
    rows = []
    for bm, bn, bk, stages, warps in TRITON_CONFIGS:
        grid = (triton.cdiv(size, bm) * triton.cdiv(size, bn),)

        def run(bm=bm, bn=bn, bk=bk, stages=stages, warps=warps, grid=grid):
            return mm[grid](a, b, c, size, size, size, BM=bm, BN=bn, BK=bk,
                            num_stages=stages, num_warps=warps)
        try:
            compiled = run()
        except Exception as e:  # a configuration that does not fit (shared memory, registers)
            print(f"  triton {bm}x{bn}x{bk} s{stages} w{warps}: {type(e).__name__}", file=sys.stderr)
            continue
        torch.cuda.synchronize()
        ptx = compiled.asm.get("ptx", "")
        instr = "wgmma" if "wgmma" in ptx else "mma.sync" if "mma.sync" in ptx else "unknown"
        ts = measure.time_cuda_interleaved({"impl": run, "cublas": lambda: torch.matmul(a, b, out=c)},
                                         rounds=4, repeat=10, backend="torch")
        flops = gemm_flops(size, size, size)
        rows.append({"what": f"Triton GEMM, {'forced to mma.sync' if forced else 'free (wgmma)'}",
                     "config": f"{bm}x{bn}x{bk}, {stages} stages, {warps} warps",
                     "instruction": instr, "rel_err": float((c.float() - ref).norm() / ref.norm()),
                     "tflops": flops / (ts["impl"].median_ms * 1e-3) / 1e12,
                     "cublas_paired_tflops": flops / (ts["cublas"].median_ms * 1e-3) / 1e12,
                     "pct_cublas": 100.0 * ts["cublas"].median_ms / ts["impl"].median_ms,
                     "registers": getattr(compiled, "n_regs", None)})
    return rows


def _triton_rows(size: int) -> list[dict]:
    rows = []
    for forced in (True, False):
        env = {**os.environ, "DISABLE_MMA_V3": "1" if forced else "0"}
        res = subprocess.run([sys.executable, "-m", "fp16lab.bench.gemm_ceiling", "--triton-worker", "--size", str(size)],
                             capture_output=True, text=True, env=env, timeout=600)
        if res.returncode != 0:
            print(f"Triton ({'mma.sync' if forced else 'wgmma'}) skipped: {res.stderr.strip()[-400:]}")
            continue
        found = json.loads(res.stdout.strip().splitlines()[-1])
        for r in found:
            print(f"  {r['what']:36s} {r['config']:28s} [{r['instruction']}] {r['tflops']:6.1f} "
                  f"TFLOP/s, {r['pct_cublas']:5.1f}% of cuBLAS")
        if found:
            best = max(found, key=lambda r: r["pct_cublas"])
            rows.append({**best, "tried": len(found)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argument_parser("gemm_ceiling", __doc__.splitlines()[0])
    p.add_argument("--size", type=validate.argument(validate.count), default=8192)
    p.add_argument("--kernel", default="mma_sync_256x128s4",
                   choices=[k for k, s in KERNELS.items() if s.uses_mma_ptx])
    p.add_argument("--seconds", type=validate.argument(validate.number, low=0, low_open=True),
                   default=1.0, help="length of each sustained run")
    p.add_argument("--no-triton", action="store_true")
    p.add_argument("--quick", action="store_true", help="2048^3, 0.3 s sustained runs, no Triton")
    p.add_argument("--triton-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--name", type=validate.argument(validate.text), default="gemm_ceiling")
    p.add_argument("--data-dir", type=validate.argument(validate.output_dir), default=None)
    p.add_argument("--replace", action="store_true",
                   help="write the committed file in data/ instead of data/local/")
    args = p.parse_args(argv)
    if args.triton_worker:
        print(json.dumps(triton_worker(args.size)))
        return 0
    if args.quick:
        args.size, args.seconds, args.no_triton = 2048, 0.3, True
    try:
        cupy = require_cupy()
        find_cuda_include()
    except KernelUnavailable as e:
        print(f"fp16lab.bench.gemm_ceiling needs a CUDA GPU with CuPy: {e}", file=sys.stderr)
        return 2
    import numpy as np

    n = args.size
    spec = KERNELS[args.kernel]
    rng = cupy.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((n, n), dtype=cupy.float32).astype(cupy.float16)
    c = cupy.empty((n, n), dtype=cupy.float16)
    dims = (a, b, c, np.int32(n), np.int32(n), np.int32(n))
    grid = (-(-n // spec.bn) * -(-n // spec.bm),)
    gf = gemm_flops(n, n, n)

    peak_c, _, peak_flops = peak_launch("constant", 8, PEAK_ITERS)
    peak_r, _, _ = peak_launch("random", 8, PEAK_ITERS)
    calls = {"cuBLAS (cupy.matmul)": ("wgmma", lambda: cupy.matmul(a, b, out=c), gf),
             "mma.sync peak, constant operands": ("mma.sync", peak_c, peak_flops),
             "mma.sync peak, changing operands": ("mma.sync", peak_r, peak_flops)}
    for label, copies, ldsm in ((f"{args.kernel}", True, True),
                                (f"{args.kernel}, no copies in the loop", False, True),
                                (f"{args.kernel}, no ldmatrix in the loop", True, False),
                                (f"{args.kernel}, neither", False, False)):
        fn = _ablated(spec, copies, ldsm)
        calls[label] = ("mma.sync", lambda fn=fn: fn(grid, (spec.threads,), dims,
                                                      shared_mem=spec.dynamic_smem), gf)

    # the full kernel compiled here is the ladder's: check its product before trusting its time
    calls[args.kernel][1]()
    ref = a[:512].astype(cupy.float64) @ b.astype(cupy.float64)
    err = float(cupy.linalg.norm(c[:512].astype(cupy.float64) - ref) / cupy.linalg.norm(ref))
    if not err < 1e-3:
        raise RuntimeError(f"{args.kernel} compiled for the ablations gives relative error {err:.1e}")

    print(f"{n}^3: burst timings, interleaved with cuBLAS", flush=True)
    ts = measure.time_cuda_interleaved({k: v[1] for k, v in calls.items()}, rounds=4, repeat=10,
                                     backend="cupy")
    base = ts["cuBLAS (cupy.matmul)"].median_ms
    rows = []
    for label, (instr, fn, flops) in calls.items():
        t = ts[label]
        tflops, cublas = flops / (t.median_ms * 1e-3) / 1e12, gf / (base * 1e-3) / 1e12
        row = {"what": label, "instruction": instr, "tflops": tflops, "cublas_paired_tflops": cublas,
               "pct_cublas": 100.0 * tflops / cublas, "gemm": label.startswith(("cuBLAS", args.kernel))}
        row.update(_sustained(fn, flops, args.seconds))
        rows.append(row)
        print(f"  {label:44s} {row['tflops']:6.1f} TFLOP/s ({row['pct_cublas']:5.1f}% of cuBLAS); "
              f"sustained {row['sustained_tflops']:6.1f} at {row['sm_clock_mhz']} MHz, "
              f"{row['power_w']} W", flush=True)
    if not args.no_triton:
        rows += _triton_rows(n)
    meta = {"benchmark": "fp16lab.bench.gemm_ceiling", "size": n, "kernel": args.kernel,
            "relative_error_of_kernel": err, "sustained_seconds": args.seconds,
            "timing": "burst: 4 interleaved rounds of 10 calls; sustained: one run of about "
                      f"{args.seconds} s with nvidia-smi sampled every 50 ms"}
    path = measure.write_result(args.name, rows, meta=meta, data_dir=args.data_dir, replace=args.replace)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""FP8 on this GPU: GEMM speed against fp16 / bf16 cuBLAS, and a short transformer training run per recipe.

Part 1, GEMM, for each square size N (1024 .. 8192): fp16 and bf16 ``torch.matmul``, the FP8 e4m3
GEMM through ``fp16lab.fp8.fp8_mm`` (``torch._scaled_mm``, tensorwise scales, fast accumulation,
operands already cast) and the same including the cast of both operands (what a layer pays each
step). All variants of one size are timed interleaved with CUDA events (``bench.time_cuda_interleaved``:
``ROUNDS`` rounds of ``REPEAT`` calls after ``WARMUP``), so the ratios come from one run.

Part 2, training: ``fp16lab.fp8.training.TinyGPT`` at d_model 2048 (4 blocks, 16 heads, 1024 tokens
per sequence, batch 8), the same seed and batches for ``amp-bf16`` and each FP8 recipe. Reported
per recipe: the median step time after the warm-up steps (host clock, synchronized), the step
rate against amp-bf16, and the final loss (mean of the last 10 steps) against amp-bf16's.
Blockwise, and any case ``torch._scaled_mm`` rejects, runs emulated (fp32 matmuls): its speed is
not an FP8 speed, and the ``backend`` column says so. Last, on a GPU, tensorwise once more with
the casts fused by torch.compile (``fp8.compile_casts``; ``casts`` column "compiled"), since the
eager casts make three passes over each tensor. The result file is rewritten after each part, so
a run cut short keeps what it measured.

    python -m fp16lab.bench.fp8            # full run on a GPU -> data/fp8_h200.json
    python -m fp16lab.bench.fp8 --quick    # a smoke run (CPU or GPU), small sizes
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import torch

from fp16lab import bench
from fp16lab import fp8
from fp16lab.fp8.training import GPTConfig, train_curve

SIZES = (1024, 2048, 4096, 8192)
QUICK_SIZES = (256, 512)
WARMUP, REPEAT, ROUNDS = 5, 20, 4
GPU_MODEL = GPTConfig(d_model=2048, n_layers=4, n_heads=16, seq_len=1024, vocab=256, batch=8)
CPU_MODEL = GPTConfig()
STEPS, QUICK_STEPS, WARMUP_STEPS = 50, 8, 10
GPU_LR = 3e-4
LAST = 10  # the final loss is the mean of the last LAST steps


def gemm_rows(sizes: tuple[int, ...], device: str) -> list[dict[str, Any]]:
    """Returns one row per (size, variant): median ms, TFLOP/s and the ratio to fp16 of the same run."""
    rows = []
    for n in sizes:
        torch.manual_seed(n)
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        a16, b16 = a.half(), b.half()
        abf, bbf = a.bfloat16(), b.bfloat16()
        qa = fp8.quantize(a, "e4m3")
        qb = fp8.quantize(b.t().contiguous().t(), "e4m3", contraction_dim=0)  # column-major codes
        backend = "scaled_mm" if fp8.scaled_mm_available(device) else "emulate"
        fns = {
            "fp16 matmul": lambda: a16 @ b16,
            "bf16 matmul": lambda: abf @ bbf,
            "fp8 e4m3 gemm": lambda: fp8.fp8_mm(qa, qb, out_dtype=torch.bfloat16,
                                                backend=backend, fast_accum=True),
            "fp8 e4m3 incl. casts": lambda: fp8.fp8_mm(
                fp8.quantize(abf, "e4m3", saturate=False),
                fp8.quantize(bbf.t().contiguous().t(), "e4m3", contraction_dim=0, saturate=False),
                out_dtype=torch.bfloat16, backend=backend, fast_accum=True),
        }
        if device == "cuda":
            timings = bench.time_cuda_interleaved(fns, rounds=ROUNDS, warmup=WARMUP, repeat=REPEAT)
        else:
            timings = {k: bench.time_cpu(f, warmup=1, repeat=3) for k, f in fns.items()}
        base = timings["fp16 matmul"].median_ms
        for name, t in timings.items():
            rows.append({"part": "gemm", "n": n, "variant": name, "backend": backend,
                         "median_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms,
                         "tflops": 2 * n ** 3 / (t.median_ms * 1e-3) / 1e12,
                         "speedup_vs_fp16": base / t.median_ms})
    return rows


def training_rows(cfg: GPTConfig, steps: int, device: str, lr: float,
                  runs: tuple[tuple[str, str], ...] | None = None) -> list[dict[str, Any]]:
    """Returns one row per (precision, casts): losses, median step ms, rate and loss against the baseline.

    ``runs`` lists (precision, "eager" or "compiled"); the first is the baseline. A compiled run
    that raises is reported with its error instead of numbers.
    """
    baseline = "amp-bf16" if device == "cuda" else "fp32"
    runs = runs or tuple((p, "eager") for p in (baseline, *(f"fp8-{r}" for r in fp8.RECIPES)))
    baseline = runs[0][0]
    rows = []
    for precision, casts in runs:
        fp8.FALLBACKS.clear()
        fp8.compile_casts(casts == "compiled")
        try:
            r = train_curve(precision, cfg, steps=steps, device=device, lr=lr,
                            warmup=min(WARMUP_STEPS, steps // 2))
        except Exception as exc:  # noqa: BLE001 - only the compiled casts may fail; say how
            if casts != "compiled":
                raise
            rows.append({"part": "training", "precision": precision, "casts": casts,
                         "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})
            continue
        finally:
            fp8.compile_casts(False)
        emulated = sorted(set(fp8.FALLBACKS.values()))
        backend = ("-" if precision == baseline else
                   "emulate" if device != "cuda" or precision == "fp8-blockwise" else
                   "scaled_mm" if not emulated else "scaled_mm, partly emulated")
        rows.append({"part": "training", "precision": precision, "casts": casts, "backend": backend,
                     "fallbacks": emulated, "step_ms": r["step_ms"], "losses": r["losses"],
                     "final_loss": sum(r["losses"][-LAST:]) / len(r["losses"][-LAST:]),
                     "steps": steps, "lr": lr, "config": r["config"],
                     "converted_layers": len(r["converted"])})
        del r
        if device == "cuda":
            torch.cuda.empty_cache()
    base = rows[0]
    for row in rows:
        if "error" in row:
            continue
        row["baseline"], row["baseline_step_ms"] = base["precision"], base["step_ms"]
        row["rate_vs_baseline"] = base["step_ms"] / row["step_ms"]
        row["loss_vs_baseline"] = row["final_loss"] / base["final_loss"] - 1
    return rows


def _result_name(device: str, quick: bool) -> str:
    if device == "cuda":
        gpu = re.sub(r"[^a-z0-9]+", "", torch.cuda.get_device_name().lower().split()[-1])
        name = f"fp8_{gpu or 'gpu'}"
    else:
        name = "fp8_cpu"
    return name + ("_quick" if quick else "")


def main(argv: list[str] | None = None) -> int:
    """Runs both parts, writes data/fp8_<gpu>.json and prints a table; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and a few steps")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for the JSON (default: data/local/, or data/ with --replace)")
    parser.add_argument("--replace", action="store_true", help="write the committed file in data/")
    parser.add_argument("--skip-training", action="store_true", help="GEMM part only")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled-casts run")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = QUICK_SIZES if args.quick or device == "cpu" else SIZES
    name = _result_name(device, args.quick)
    rows = gemm_rows(sizes, device)
    path = _write(name, rows, args)
    if not args.skip_training:
        cfg = GPU_MODEL if device == "cuda" and not args.quick else CPU_MODEL
        steps = QUICK_STEPS if args.quick else STEPS
        lr = GPU_LR if cfg is GPU_MODEL else 3e-3
        train = training_rows(cfg, steps, device, lr)
        path = _write(name, rows + train, args)
        if device == "cuda" and not args.no_compile:
            # its rate is against an amp-bf16 run measured just before it (baseline_step_ms)
            train += training_rows(cfg, steps, device, lr, runs=(
                ("amp-bf16", "eager"), ("fp8-tensorwise", "compiled")))[1:]
            path = _write(name, rows + train, args)
        rows += train
    print(f"device: {bench.describe_source(bench.read_result(path)['meta'])}")
    print(f"{'GEMM N':>7} {'variant':<22} {'TFLOP/s':>9} {'x fp16':>7}")
    for r in rows:
        if r["part"] == "gemm":
            print(f"{r['n']:>7} {r['variant']:<22} {r['tflops']:>9.1f} {r['speedup_vs_fp16']:>7.2f}")
    print(f"{'precision':<16} {'casts':<9} {'backend':<26} {'step ms':>8} {'rate x':>7} "
          f"{'final loss':>10} {'vs base':>8}")
    for r in rows:
        if r["part"] == "training" and "error" in r:
            print(f"{r['precision']:<16} {r['casts']:<9} failed: {r['error'][:80]}")
        elif r["part"] == "training":
            print(f"{r['precision']:<16} {r['casts']:<9} {r['backend']:<26} {r['step_ms']:>8.1f} "
                  f"{r['rate_vs_baseline']:>7.2f} {r['final_loss']:>10.4f} "
                  f"{100 * r['loss_vs_baseline']:>+7.2f}%")
    print(f"wrote {path}")
    return 0


def _write(name: str, rows: list[dict[str, Any]], args: argparse.Namespace) -> Path:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    meta = {"benchmark": "fp8", "protocol": f"GEMM: time_cuda_interleaved rounds={ROUNDS} "
            f"warmup={WARMUP} repeat={REPEAT}; training: median host-clock step after "
            f"{WARMUP_STEPS} warm-up steps, synchronized", "quick": args.quick,
            "scaled_mm": fp8.scaled_mm_available(device)}
    return bench.write_result(name, rows, meta=meta, data_dir=args.out, replace=args.replace)


if __name__ == "__main__":
    raise SystemExit(main())

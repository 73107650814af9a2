"""FP8 on this GPU: GEMM speed against fp16 / bf16 cuBLAS, and a short transformer training run per recipe.

Part 1, GEMM, for each square size N (1024 .. 8192): fp16 and bf16 ``torch.matmul``, the FP8 e4m3
GEMM through ``fp16lab.fp8.fp8_mm`` (``torch._scaled_mm``, tensorwise scales, fast accumulation,
operands already cast) and the same including the cast of both operands (what a layer pays each
step). All variants of one size are timed interleaved with CUDA events (``measure.time_cuda_interleaved``:
``ROUNDS`` rounds of ``REPEAT`` calls after ``WARMUP``), so the ratios come from one run.

Part 2, accumulation (GPU only): the relative error of the FP8 GEMM (tensorwise, random operands)
against a float64 product of the same FP8 values, for several K, with and without fast
accumulation. Hopper's FP8 tensor cores keep 13 mantissa bits while accumulating; without fast
accumulation cuBLAS promotes the partial sums to fp32 every few MMAs, so the error should stay
flat in K (1.28e-4 at K = 512 and 2048 in the first H200 run), and grow with K without it.

Part 3, speed (GPU only): the model at d_model 4096 (4 blocks, 32 heads) and 8192 (2 blocks, 64
heads), 64 x 128 tokens per step for 200 steps at a learning rate of 1e-3 x 2048 / d_model (so
the runs learn, and one run gives both the speed and the loss), where the matmuls are most of
the step (torchao's float8 docs report end-to-end speedups up to 1.25x for Llama3-8B, d_model
4096, on 8 GPUs, and 1.5x for the 405B model, d_model 16384): ``amp-bf16`` and
``fp8-tensorwise``, each eager and with its blocks compiled (``train_curve(compile=True)``:
amax, scale and cast fuse into the neighbouring kernels). Each rate is against amp-bf16 run the
same way (eager or compiled). The result file is rewritten after each part, so a run cut short
keeps what it measured.

Part 4, recipes: ``fp16lab.fp8.training.TinyGPT`` at d_model 2048 (4 blocks, 16 heads, 128 tokens
per sequence, batch 64: sequences short enough for the rule to be learned), the same seed and
batches for ``amp-bf16`` and each FP8 recipe, eager.
Reported per recipe: the median step time after the warm-up steps (host clock, synchronized), the
step rate against amp-bf16, and the final loss (mean of the last 10 steps) against amp-bf16's.
Any product ``torch._scaled_mm`` rejects (blockwise's weight gradient, whose operands both carry
1x128 scales; blockwise everywhere where :func:`fp8.blockwise_support` says no) runs emulated
(fp32 matmuls): that part's speed is not an FP8 speed, and the ``backend`` column says so.

    python -m fp16lab.bench.fp8            # full run on a GPU -> data/local/fp8_h200.json
    python -m fp16lab.bench.fp8 --quick    # a smoke run (CPU or GPU), small sizes
    python -m fp16lab.bench.fp8 --parts accumulation,speed   # some parts only
"""

from __future__ import annotations

import argparse
import functools
import re
from pathlib import Path
from typing import Any

import torch

from fp16lab import fp8
from fp16lab import measure, validate
from fp16lab.bench import argument_parser
from fp16lab.fp8.linear import launch_step7, step7_operands
from fp16lab.fp8.training import GPTConfig, train_curve
from fp16lab.kernels.wgmma import FP8_DIAGNOSTICS, FP8_SCHEDULES

SIZES = (1024, 2048, 4096, 8192)
QUICK_SIZES = (256, 512)
WARMUP, REPEAT, ROUNDS = 5, 20, 4
# The blockwise part's FP8 kernels run at the H200's power limit, where the clock a function
# starts at is the one its predecessor in the interleaved order left: with 5 warm-up calls the
# same kernel read 0.76x and 0.93x of _scaled_mm in one run, after different predecessors. About
# 150 warm-up calls (some 0.2 s) let the clock settle at each function's own level first.
BLOCKWISE_WARMUP, BLOCKWISE_REPEAT = 150, 100
GPU_MODEL = GPTConfig(d_model=2048, n_layers=4, n_heads=16, seq_len=128, vocab=256, batch=64)
# The same 64 x 128 tokens a step as the recipes' run, so the speed runs learn the rule too and
# one run shows both the step rate and the loss against bf16 (at 8 x 1024 tokens and 30 steps
# the H200 runs of 2026-11-30 stayed above ln 256); a wider model gives the matmuls a larger
# share of the step. Adam's learning rate shrinks as 1 / width from the recipes' 1e-3 at d_model
# 2048 (muP's rule for hidden layers), so the wider models' updates stay the same size.
SPEED_MODELS = (GPTConfig(d_model=4096, n_layers=4, n_heads=32, seq_len=128, vocab=256, batch=64),
                GPTConfig(d_model=8192, n_layers=2, n_heads=64, seq_len=128, vocab=256, batch=64))
SPEED_STEPS = 200


def speed_lr(cfg: GPTConfig) -> float:
    """Returns the speed runs' learning rate: the recipes' run's, scaled by 2048 / d_model."""
    return GPU_RECIPE_LR * GPU_MODEL.d_model / cfg.d_model


ACCUMULATION_K = (512, 2048, 8192)
CPU_MODEL = GPTConfig()
STEPS, QUICK_STEPS, WARMUP_STEPS = 50, 8, 10
# The recipes' run on a GPU must learn the rule for its loss comparison to mean anything: at 50
# steps and 3e-4 the H200 runs of 2026-11-30 ended at 5.56, above ln 256 = 5.545 (a uniform
# guess), and so did 200 steps at 1e-3. The rule needs each position to find the one before it
# through learned position embeddings: with 1024 positions and 8 sequences a step, each position
# sees too few examples. On a CPU, d_model 128 at 1e-3 for 200 steps stayed at 5.55 with 8 x 1024
# tokens a step and fell from 5.67 to 1.02 with 64 x 128 (the same tokens): the GPU run uses 64 x 128.
GPU_RECIPE_STEPS, GPU_RECIPE_LR = 200, 1e-3
PARTS = ("gemm", "accumulation", "speed", "recipes", "blockwise")
#: (M, N, K) of the blockwise part: DeepSeek-style scales at the issue's two shapes.
BLOCKWISE_SHAPES = ((8192, 8192, 8192), (16384, 12288, 4096))
QUICK_BLOCKWISE_SHAPES = ((256, 256, 512),)
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
            timings = measure.time_cuda_interleaved(fns, rounds=ROUNDS, warmup=WARMUP, repeat=REPEAT)
        else:
            timings = {k: measure.time_cpu(f, warmup=1, repeat=3) for k, f in fns.items()}
        base = timings["fp16 matmul"].median_ms
        for name, t in timings.items():
            rows.append({"part": "gemm", "n": n, "variant": name, "backend": backend,
                         "median_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms,
                         "tflops": 2 * n ** 3 / (t.median_ms * 1e-3) / 1e12,
                         "speedup_vs_fp16": base / t.median_ms})
    return rows


def blockwise_rows(shapes: tuple[tuple[int, int, int], ...]) -> list[dict[str, Any]]:
    """Returns, per (M, N, K), the blockwise GEMM (1 x 128 scales on A, 128 x 128 on B, e4m3, bf16
    out) through step 7 of the kernel ladder (``fp8.wgmma_blockwise_mm``) and through
    ``torch._scaled_mm`` where :func:`fp8.blockwise_support` finds it right, beside tensorwise
    ``_scaled_mm`` and bf16 cuBLAS on the same values, timed interleaved: median ms, TFLOP/s,
    the rate against ``_scaled_mm``'s blockwise one, and each FP8 result's normwise error
    against the float64 product of the same FP8 values."""
    rows = []
    ok, why = fp8.blockwise_support("cuda")
    for m, n, k in shapes:
        torch.manual_seed(m + n + k)
        a = torch.randn(m, k, device="cuda") * torch.logspace(-2, 2, m, device="cuda")[:, None]
        b = torch.randn(k, n, device="cuda")
        qa = fp8.quantize(a, "e4m3", "1x128")
        qb = fp8.quantize(b.t().contiguous().t(), "e4m3", "128x128", contraction_dim=0)
        ta = fp8.quantize(a, "e4m3")
        tb = fp8.quantize(b.t().contiguous().t(), "e4m3", contraction_dim=0)
        abf, bbf = a.bfloat16(), b.bfloat16()
        fns = {"bf16 matmul": lambda: abf @ bbf,
               "scaled_mm tensorwise": lambda: fp8.fp8_mm(ta, tb, out_dtype=torch.bfloat16,
                                                          backend="scaled_mm"),
               "step 7 (wgmma_fp8)": lambda: fp8.wgmma_blockwise_mm(qa, qb),
               "step 7, promotion not overlapped": lambda: fp8.wgmma_blockwise_mm(
                   qa, qb, overlap=False)}
        for schedule in list(FP8_SCHEDULES)[1:]:  # step 7's other schedules
            fns[f"step 7, {schedule}"] = functools.partial(fp8.wgmma_blockwise_mm, qa, qb,
                                                           schedule=schedule)
        # the kernel alone on operands laid out once, and its diagnostic builds beside it
        kernel = functools.partial(launch_step7, *step7_operands(qa, qb, torch.bfloat16))
        fns["step 7 kernel alone"] = kernel
        for diagnostic in FP8_DIAGNOSTICS:
            fns[f"step 7 kernel, diagnostic: {diagnostic}"] = functools.partial(
                kernel, diagnostic=diagnostic)
        if ok and not k % fp8.BLOCKWISE_K:
            fns["scaled_mm blockwise"] = lambda: fp8.fp8_mm(qa, qb, out_dtype=torch.bfloat16,
                                                            backend="scaled_mm")
        timings = measure.time_cuda_interleaved(fns, rounds=ROUNDS, warmup=BLOCKWISE_WARMUP,
                                                repeat=BLOCKWISE_REPEAT)
        exact = fp8.dequantize(qa).double() @ fp8.dequantize(qb).double()
        base = timings.get("scaled_mm blockwise")
        for name, t in timings.items():
            row = {"part": "blockwise", "m": m, "n": n, "k": k, "variant": name,
                   "median_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms,
                   "tflops": 2 * m * n * k / (t.median_ms * 1e-3) / 1e12,
                   "vs_scaled_mm_blockwise": base.median_ms / t.median_ms if base else None}
            if "diagnostic" in name:
                row["note"] = "a diagnostic build: its product is wrong by design"
            elif "blockwise" in name or "step 7" in name:
                got = fns[name]().double()
                row["relative_error"] = ((got - exact).norm() / exact.norm()).item()
            rows.append(row)
        del exact
        if base is None:
            rows[-1]["note"] = ("torch._scaled_mm's blockwise GEMM not timed: "
                                + (why or f"K={k} is not a multiple of {fp8.BLOCKWISE_K}"))
    return rows


def accumulation_rows(ks: tuple[int, ...] = ACCUMULATION_K, mn: int = 512) -> list[dict[str, Any]]:
    """Returns the FP8 GEMM's normwise relative error against float64, per K and fast_accum."""
    rows = []
    for k in ks:
        torch.manual_seed(k)
        a, b = torch.randn(mn, k, device="cuda"), torch.randn(k, mn, device="cuda")
        qa, qb = fp8.quantize(a, "e4m3"), fp8.quantize(b, "e4m3", contraction_dim=0)
        exact = fp8.dequantize(qa).double() @ fp8.dequantize(qb).double()
        for fast in (False, True):
            got = fp8.fp8_mm(qa, qb, backend="scaled_mm", fast_accum=fast).double()
            rows.append({"part": "accumulation", "k": k, "m": mn, "n": mn, "fast_accum": fast,
                         "relative_error": ((got - exact).norm() / exact.norm()).item()})
    return rows


def training_rows(cfg: GPTConfig, steps: int, device: str, lr: float,
                  runs: tuple[tuple[str, str], ...] | None = None,
                  part: str = "training") -> list[dict[str, Any]]:
    """Returns one row per (precision, mode): losses, median step ms, rate and loss against the baseline.

    ``runs`` lists (precision, "eager" or "compiled"); the baseline of a row is the first run of
    the same mode. A compiled run that raises is reported with its error instead of numbers.
    """
    baseline = "amp-bf16" if device == "cuda" else "fp32"
    runs = runs or tuple((p, "eager") for p in (baseline, *(f"fp8-{r}" for r in fp8.RECIPES)))
    rows = []
    for precision, mode in runs:
        fp8.FALLBACKS.clear()
        try:
            r = train_curve(precision, cfg, steps=steps, device=device, lr=lr,
                            warmup=min(WARMUP_STEPS, steps // 2), compile=mode == "compiled")
        except Exception as exc:  # noqa: BLE001 - only a compiled run may fail; say how
            if mode != "compiled":
                raise
            rows.append({"part": part, "precision": precision, "mode": mode,
                         "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})
            continue
        print(f"{part}: {precision} {mode}, median step {r['step_ms']:.1f} ms", flush=True)
        emulated = sorted(set(fp8.FALLBACKS.values()))
        backend = ("-" if not precision.startswith("fp8") else
                   "emulate" if device != "cuda" or (precision == "fp8-blockwise"
                                                     and not fp8.blockwise_support(device)[0]) else
                   "scaled_mm" if not emulated else "scaled_mm, partly emulated")
        rows.append({"part": part, "precision": precision, "mode": mode, "backend": backend,
                     "fallbacks": emulated, "step_ms": r["step_ms"], "losses": r["losses"],
                     "final_loss": sum(r["losses"][-LAST:]) / len(r["losses"][-LAST:]),
                     "steps": steps, "lr": lr, "config": r["config"],
                     "converted_layers": len(r["converted"])})
        del r
        if device == "cuda":
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    for row in rows:
        base = next((b for b in rows if b["mode"] == row["mode"] and "error" not in b), None)
        if "error" in row or base is None:
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
    """Runs the chosen parts, writes data/fp8_<gpu>.json and prints a table; returns the exit status."""
    parser = argument_parser("fp8", __doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and a few steps")
    parser.add_argument("--out", type=validate.argument(validate.output_dir), default=None,
                        help="directory for the JSON (default: data/local/, or data/ with --replace)")
    parser.add_argument("--replace", action="store_true", help="write the committed file in data/")
    parser.add_argument("--parts", default=",".join(PARTS),
                        type=validate.argument(validate.choice, PARTS, many=True),
                        help=f"comma-separated parts to run, of: {', '.join(PARTS)}")
    args = parser.parse_args(argv)
    args.started_at = _utc_now()
    parts = args.parts
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = QUICK_SIZES if args.quick or device == "cpu" else SIZES
    name = _result_name(device, args.quick)
    rows, path = [], None
    if "gemm" in parts:
        rows += gemm_rows(sizes, device)
        path = _write(name, rows, args)
    if "accumulation" in parts and device == "cuda" and fp8.scaled_mm_available(device):
        rows += accumulation_rows()
        path = _write(name, rows, args)
    if "speed" in parts and device == "cuda" and not args.quick:
        for model in SPEED_MODELS:
            for mode in ("eager", "compiled"):  # compiled second: its compile takes a while
                rows += training_rows(model, SPEED_STEPS, device, speed_lr(model), part="speed",
                                      runs=(("amp-bf16", mode), ("fp8-tensorwise", mode)))
                path = _write(name, rows, args)
    if "blockwise" in parts and device == "cuda" and fp8.scaled_mm_available(device):
        rows += blockwise_rows(QUICK_BLOCKWISE_SHAPES if args.quick else BLOCKWISE_SHAPES)
        path = _write(name, rows, args)
    if "recipes" in parts:
        cfg = GPU_MODEL if device == "cuda" and not args.quick else CPU_MODEL
        steps = QUICK_STEPS if args.quick else GPU_RECIPE_STEPS if cfg is GPU_MODEL else STEPS
        lr = GPU_RECIPE_LR if cfg is GPU_MODEL else 3e-3
        rows += training_rows(cfg, steps, device, lr)
        path = _write(name, rows, args)
    if path is None:
        print("nothing to run on this device for --parts", ",".join(args.parts))
        return 1
    print(f"device: {measure.describe_source(measure.read_result(path)['meta'])}")
    print(f"{'GEMM N':>7} {'variant':<22} {'TFLOP/s':>9} {'x fp16':>7}")
    for r in rows:
        if r["part"] == "gemm":
            print(f"{r['n']:>7} {r['variant']:<22} {r['tflops']:>9.1f} {r['speedup_vs_fp16']:>7.2f}")
    for r in rows:
        if r["part"] == "blockwise":
            ratio = r["vs_scaled_mm_blockwise"]
            print(f"blockwise {r['m']}x{r['n']}x{r['k']} {r['variant']:<33} {r['tflops']:>7.0f} "
                  f"TFLOP/s" + (f"  {ratio:.2f}x _scaled_mm blockwise" if ratio else "")
                  + (f"  error {r['relative_error']:.2e}" if "relative_error" in r else "")
                  + (f"  ({r['note']})" if "note" in r else ""))
    for r in rows:
        if r["part"] == "accumulation":
            print(f"accumulation K={r['k']:>5} fast_accum={r['fast_accum']!s:<5} "
                  f"relative error {r['relative_error']:.2e}")
    print(f"{'part':<8} {'d':>4} {'precision':<16} {'mode':<9} {'backend':<26} {'step ms':>8} "
          f"{'rate x':>7} {'final loss':>10} {'vs base':>8}")
    for r in rows:
        if r["part"] in ("training", "speed") and "error" in r:
            print(f"{r['part']:<8} {'':>4} {r['precision']:<16} {r['mode']:<9} failed: {r['error'][:80]}")
        elif r["part"] in ("training", "speed"):
            print(f"{r['part']:<8} {r['config']['d_model']:>4} {r['precision']:<16} {r['mode']:<9} "
                  f"{r['backend']:<26} {r['step_ms']:>8.1f} "
                  f"{r['rate_vs_baseline']:>7.2f} {r['final_loss']:>10.4f} "
                  f"{100 * r['loss_vs_baseline']:>+7.2f}%")
    print(f"wrote {path}")
    return 0


def _part_of(row: dict[str, Any]) -> str:
    """The --parts name a row belongs to (the recipes part writes rows of part 'training')."""
    return "recipes" if row.get("part") == "training" else row.get("part", "")


def _utc_now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _write(name: str, rows: list[dict[str, Any]], args: argparse.Namespace) -> Path:
    """Writes this run's rows, keeping the rows of the parts this run does not measure from the
    file already there (as ``--parts speed`` next to an earlier full run); ``meta.parts_measured_at``
    says when each part was measured."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = Path(args.out) if args.out is not None else (measure.data_dir() if args.replace else measure.local_dir())
    now = getattr(args, "started_at", None) or _utc_now()
    run_parts = set(args.parts)
    kept, when = [], {}
    try:
        earlier = measure.read_result(folder / f"{name}.json")
    except (FileNotFoundError, ValueError):
        earlier = None
    if earlier is not None and bool(earlier["meta"].get("quick")) == bool(args.quick):
        kept = [r for r in earlier["rows"] if _part_of(r) not in run_parts]
        old = earlier["meta"].get("parts_measured_at") or {}
        when = {r["part"]: old.get(r["part"], earlier["meta"].get("measured_at")) for r in kept}
    when.update({r["part"]: now for r in rows})
    meta = {"benchmark": "fp8", "protocol": f"GEMM: time_cuda_interleaved rounds={ROUNDS} "
            f"warmup={WARMUP} repeat={REPEAT} (blockwise: warmup={BLOCKWISE_WARMUP} "
            f"repeat={BLOCKWISE_REPEAT}, so each kernel's power-limited clock settles before it "
            f"is timed); training: median host-clock step after "
            f"{WARMUP_STEPS} warm-up steps (compile included there), synchronized; accumulation: "
            f"normwise error against float64", "quick": args.quick,
            "scaled_mm": fp8.scaled_mm_available(device), "parts_measured_at": when}
    return measure.write_result(name, kept + rows, meta=meta, data_dir=folder)


if __name__ == "__main__":
    raise SystemExit(main())

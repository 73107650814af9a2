"""Real models under each precision: speed, memory predicted against measured, the engine's cost.

For BERT-base (sequence 128, masked LM), GPT-2 small (sequence 1024, vocabulary 50257) and
ViT-B/16 (224 x 224), built offline from their configurations with random weights
(:mod:`fp16lab.workloads`), in this order of parts (``--budget-s`` stops starting new ones):

1. ``speed``: samples/s and peak memory per precision (fp32, tf32, amp-fp16, amp-bf16) through
   :func:`fp16lab.sweep.measure_point`, with the ratios over fp32 and over tf32;
2. ``engine``: the amp-bf16 step through the sweep engine against a bare loop written here
   (autocast, cross-entropy, SGD: no fp16lab code in it), repeats interleaved;
3. ``memory``: :func:`fp16lab.memory.compare`, the predicted peak (the step's timeline of live
   tensors, counted on the GPU) over the measured peak, per precision, with the sum of the
   parts and what the peak held (recipes: :data:`MEMORY_PRECISIONS`);
4. ``vocab``: GPT-2 small's vocabulary padded to a multiple of 64 (50304) against 50257;
5. ``recipe``: a BERT training recipe from the source material (batch 128, AdamW with betas
   0.9 and 0.999, "O2" mixed precision: FP16 weights with FP32 masters, loss scale starting
   at 8192 and capped at 32768) on BERT-base, beside amp-fp16 with GradScaler's defaults,
   amp-bf16 and fp32 with the same AdamW (:data:`RECIPE_ARMS`): the loss over
   ``RECIPE_LOSS_STEPS`` steps on one batch, the scale after each, the skipped steps, the
   median step time and the peak memory.

One timing protocol everywhere: :func:`fp16lab.measure.step_times_ms` (a CUDA event pair per
step after the warm-up) and the median step. ``--tiny``: the tiny configurations on the CPU,
a smoke test of the script (CI runs it).

    python -m fp16lab.bench.workloads            # GPU, about 3 minutes on an H200
    python -m fp16lab.bench.workloads --tiny     # CPU smoke test
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Mapping
from typing import Any, Callable

import torch
import torch.nn.functional as F

from fp16lab import measure, memory, sweep, validate
from fp16lab.bench import add_output_arguments, argument_parser
from fp16lab.fp8.linear import scaled_mm_available
from fp16lab.recipes import LR, MOMENTUM, set_tf32
from fp16lab.scaling import DynamicLossScaler
from fp16lab.workload import Workload, load_workload, train_step
from fp16lab.workloads import missing_package

#: (workload, batch per step, settings) of the real models.
MODELS = (("bert-base", 64, {}), ("gpt2-small", 8, {}), ("vit-b16", 64, {}))
PRECISIONS = ("fp32", "tf32", "amp-fp16", "amp-bf16")
#: The recipes whose peak the memory part predicts and, on a GPU, measures (TF32 on a GPU only,
#: FP8 where the GPU has FP8 tensor cores).
MEMORY_PRECISIONS = ("fp32", "tf32", "amp-fp16", "amp-bf16", "fp16-o2", "fp8-tensorwise")
PARTS = ("speed", "engine", "memory", "vocab", "recipe")

#: The source's BERT recipe and what it is set beside: (arm, precision, its loss scaler's
#: settings: None for the precision's own). The source gives no learning rate: AdamW takes
#: BERT's pre-training one (Devlin et al. 2019: 1e-4, weight decay 0.01) in every arm.
RECIPE_ARMS = (("source: fp16-o2, scale 8192 capped at 32768", "fp16-o2",
                {"init_scale": 8192.0, "max_scale": 32768.0}),
               ("amp-fp16, GradScaler's defaults", "amp-fp16", None),
               ("amp-bf16", "amp-bf16", None),
               ("fp32", "fp32", None))
RECIPE_BATCH, RECIPE_LOSS_STEPS = 128, 30
RECIPE_ADAMW = {"lr": 1e-4, "betas": (0.9, 0.999), "weight_decay": 0.01}


def bare_loop(w: Workload, batch: int, device: str) -> Callable[[], torch.Tensor]:
    """Returns one amp-bf16 training step of ``w``'s model written out by hand (TF32 off)."""
    set_tf32(False)
    torch.manual_seed(0)
    model = w.build().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    inputs, targets = w.batch(batch, device)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            out = model(**inputs) if isinstance(inputs, Mapping) else model(inputs)
            logits = out[w.output] if isinstance(w.output, str) else out
            loss = w.loss(logits, targets) if w.loss else \
                F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), ignore_index=-100)
        loss.backward()
        opt.step()
        return loss

    return step


def _point(name: str, w: Workload, batch: int, precision: str, device: str) -> sweep.Point:
    return sweep.Point(model=name, batch=batch, precision=precision, device=device, workload=w)


def _engine_ms(point: sweep.Point, warmup: int, steps: int) -> tuple[float, dict[str, Any]]:
    row = sweep.measure_point(point, warmup=warmup, steps=steps, telemetry=False)
    if row["status"] != "ok":
        raise RuntimeError(f"{point.label()}: {row['error']}")
    return row["step_ms_median"], row


def _bare_ms(w: Workload, batch: int, device: str, warmup: int, steps: int) -> float:
    step = bare_loop(w, batch, device)
    for _ in range(warmup):
        step()
    ms = statistics.median(measure.step_times_ms(step, steps, device))
    del step
    if device == "cuda":
        torch.cuda.empty_cache()
    return ms


def main(argv: list[str] | None = None) -> int:
    ap = argument_parser("workloads", __doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny configurations on the CPU")
    ap.add_argument("--warmup", type=validate.argument(validate.count, low=0), default=None,
                    help="untimed steps per point (default 3; 1 with --tiny)")
    ap.add_argument("--steps", type=validate.argument(validate.count), default=None,
                    help="timed steps per point (default 10; 2 with --tiny)")
    ap.add_argument("--repeats", type=validate.argument(validate.count), default=2,
                    help="interleaved repeats (engine, vocab)")
    ap.add_argument("--budget-s", type=validate.argument(validate.number, low=0, low_open=True),
                    default=None, help="start no new part after this many seconds (what ran is written)")
    ap.add_argument("--only", default=list(PARTS), type=validate.argument(validate.choice, PARTS, many=True),
                    help=f"parts, comma-separated: {','.join(PARTS)}")
    add_output_arguments(ap, "workloads_h200 on a GPU, workloads_tiny with --tiny")
    args = ap.parse_args(argv)
    parts = list(args.only)
    warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
    steps = args.steps if args.steps is not None else (2 if args.tiny else 10)
    repeats, budget = args.repeats, args.budget_s
    gpu = torch.cuda.is_available() and not args.tiny
    if not gpu and not args.tiny:
        print("no CUDA GPU: running the --tiny CPU version")
        args.tiny = True
    device = "cuda" if gpu else "cpu"
    missing = [m for m, _, _ in MODELS if missing_package(m)]
    if missing:
        print(f"cannot build {', '.join(missing)}: {missing_package(missing[0])}", file=sys.stderr)
        return 2
    name = args.name or ("workloads_h200" if gpu else "workloads_tiny")
    settings = {"tiny": True} if args.tiny else {}
    built = {m: (load_workload(m, **settings, **extra), b if not args.tiny else 4)
             for m, b, extra in MODELS}
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    ran: list[str] = []

    def write() -> Any:
        return measure.write_result(name, rows, replace=args.replace, data_dir=args.out, meta={
            "summary": summarize(rows), "parts_run": ran, "warmup": warmup, "steps": steps,
            "repeats": repeats, "device": device, "tiny": args.tiny,
            "timing": "fp16lab.measure.step_times_ms, median step; engine = sweep.measure_point"})

    def out_of_time() -> bool:
        return budget is not None and time.perf_counter() - t0 > budget

    for part in parts:
        if out_of_time():
            print(f"budget of {budget:g} s spent: part {part!r} not run")
            continue
        ran.append(part)
        for m, (w, batch) in built.items():
            try:
                _run_part(part, m, w, batch, rows, device=device, gpu=gpu, warmup=warmup,
                          steps=steps, repeats=repeats, settings=settings)
            except Exception as e:  # recorded; the other models and parts still run
                rows.append({"part": part, "model": m, "error": f"{type(e).__name__}: {e}"})
                print(f"part {part}, {m}: {type(e).__name__}: {e}", flush=True)
        print(f"part {part} done at {time.perf_counter() - t0:.0f} s", flush=True)
        path = write()  # after every part: a run stopped later keeps what it measured
    path = write()
    print_summary(summarize(rows))
    print(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    return 0


def _run_part(part: str, m: str, w: Workload, batch: int, rows: list[dict[str, Any]], *,
              device: str, gpu: bool, warmup: int, steps: int, repeats: int,
              settings: dict[str, Any]) -> None:
    """Measures one part for one model, appending its rows."""
    if part == "speed":
        for prec in PRECISIONS:
            ms, row = _engine_ms(_point(m, w, batch, prec, device), warmup, steps)
            rows.append({"part": part, "model": m, "batch": batch, "precision": prec,
                         "step_ms": ms, "samples_per_s": batch / (ms / 1e3),
                         "peak_mem_allocated_mb": row["peak_mem_allocated_mb"]})
    elif part == "engine":
        point = _point(m, w, batch, "amp-bf16", device)
        for r in range(repeats):  # interleaved: bare, engine, then engine, bare
            order = ("bare", "engine") if r % 2 == 0 else ("engine", "bare")
            for variant in order:
                ms = _bare_ms(w, batch, device, warmup, steps) if variant == "bare" \
                    else _engine_ms(point, warmup, steps)[0]
                rows.append({"part": part, "model": m, "batch": batch,
                             "precision": "amp-bf16", "variant": variant, "repeat": r,
                             "step_ms": ms})
    elif part == "memory":
        for prec in MEMORY_PRECISIONS:
            if prec == "tf32" and not gpu:
                continue  # TF32 is a CUDA matmul setting: on a CPU it is fp32
            if prec.startswith("fp8-") and gpu and not scaled_mm_available(device):
                continue  # no FP8 tensor cores
            try:
                # no peak counter for host memory: on a CPU the prediction alone
                c = memory.compare(w, prec, batch, count_on="cuda") if gpu else \
                    memory.predict(w, prec, batch).as_dict()
            except Exception as e:  # one recipe's failure is its row; the others still run
                rows.append({"part": part, "model": m, "batch": batch, "precision": prec,
                             "error": f"{type(e).__name__}: {e}"})
                print(f"part memory, {m}, {prec}: {type(e).__name__}: {e}", flush=True)
                continue
            rows.append({"part": part, "model": m, "batch": batch, "precision": prec,
                         "predicted_bytes": c["peak"], "parts_bytes": c["total"],
                         **{f"peak_{k}_bytes": c[f"peak_{k}"] for k in memory.AT_PEAK},
                         "measured_peak_bytes": c.get("measured_peak"),
                         "ratio": c.get("ratio")})
    elif part == "recipe" and m == "bert-base":
        rows += recipe_rows(w, RECIPE_BATCH if gpu else batch, device,
                            RECIPE_LOSS_STEPS if gpu else 3, steps)
    elif part == "vocab" and m == "gpt2-small":
        padded = load_workload(m, **settings, pad_vocab_to=64)
        for r in range(repeats):
            for label, wl in (("unpadded", w), ("padded", padded))[:: 1 if r % 2 == 0 else -1]:
                ms, _ = _engine_ms(_point(m, wl, batch, "amp-bf16", device), warmup, steps)
                rows.append({"part": part, "model": m, "batch": batch,
                             "precision": "amp-bf16", "vocab": label, "repeat": r,
                             "step_ms": ms})


def recipe_rows(w: Workload, batch: int, device: str, loss_steps: int,
                timed_steps: int) -> list[dict[str, Any]]:
    """Returns a row per arm of :data:`RECIPE_ARMS` on ``w``: ``loss_steps`` steps on one batch
    (their losses and the scale after each, read on the host between steps), then
    ``timed_steps`` more timed with :func:`fp16lab.measure.step_times_ms`."""
    rows = []
    for arm, precision, scaler in RECIPE_ARMS:
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        engine: dict[str, Any] = {"optimizer": lambda ps: torch.optim.AdamW(ps, **RECIPE_ADAMW)}
        if scaler is not None:
            engine["loss_scaler"] = DynamicLossScaler(**scaler)
        step = train_step(w, precision, device, batch, seed=0, **engine)
        first = float(step.scaler.get_scale()) if step.scaler is not None else None
        losses, scales = [], []
        for _ in range(loss_steps):
            losses.append(float(step().detach()))
            scales.append(float(step.scaler.get_scale()) if step.scaler is not None else None)
        times = measure.step_times_ms(step, timed_steps, device)
        ms = statistics.median(times)
        seq = [first] + scales
        rows.append({
            "part": "recipe", "model": w.name, "batch": batch, "arm": arm,
            "precision": precision, "optimizer": f"AdamW({RECIPE_ADAMW})",
            "scaler": scaler or ("GradScaler defaults" if step.scaler is not None else None),
            "losses": losses, "scales": scales,
            "skipped_steps": None if first is None else
            sum(b < a for a, b in zip(seq, seq[1:])),
            "step_ms": ms, "samples_per_s": batch / (ms / 1e3),
            "peak_mem_allocated_mb": torch.cuda.max_memory_allocated() / 2**20
            if device == "cuda" else None})
        del step
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Returns the ratios the rows give: AMP over fp32 and tf32, engine over bare, memory, vocab."""
    out: dict[str, Any] = {"speed": {}, "engine_vs_bare": {}, "memory_ratio": {}, "vocab_gain": None,
                           "errors": [f"{r['part']} {r['model']}: {r['error']}" for r in rows
                                      if "error" in r]}
    rows = [r for r in rows if "error" not in r]
    for m in dict.fromkeys(r["model"] for r in rows):
        sp = {r["precision"]: r["samples_per_s"] for r in rows if r["part"] == "speed" and r["model"] == m}
        if sp:
            out["speed"][m] = {p: {"samples_per_s": v,
                                   "over_fp32": v / sp["fp32"] if "fp32" in sp else None,
                                   "over_tf32": v / sp["tf32"] if "tf32" in sp else None}
                               for p, v in sp.items()}
        eng = [r for r in rows if r["part"] == "engine" and r["model"] == m]
        if eng:
            med = {v: statistics.median(r["step_ms"] for r in eng if r["variant"] == v)
                   for v in ("bare", "engine")}
            out["engine_vs_bare"][m] = med["engine"] / med["bare"]
        mem = {r["precision"]: r["ratio"] for r in rows
               if r["part"] == "memory" and r["model"] == m and "error" not in r}
        if mem:
            out["memory_ratio"][m] = mem
    voc = [r for r in rows if r["part"] == "vocab"]
    if voc:
        med = {v: statistics.median(r["step_ms"] for r in voc if r["vocab"] == v)
               for v in ("unpadded", "padded")}
        out["vocab_gain"] = med["unpadded"] / med["padded"] - 1
    rec = [r for r in rows if r["part"] == "recipe"]
    fp32 = next((r for r in rec if r["precision"] == "fp32"), None)
    out["recipe"] = {r["arm"]: {
        "samples_per_s": r["samples_per_s"], "peak_mem_allocated_mb": r["peak_mem_allocated_mb"],
        "final_loss": r["losses"][-1], "skipped_steps": r["skipped_steps"],
        "largest_scale": max((s for s in r["scales"] if s is not None), default=None),
        "final_loss_over_fp32": r["losses"][-1] / fp32["losses"][-1] if fp32 else None,
        "speed_over_fp32": r["samples_per_s"] / fp32["samples_per_s"] if fp32 else None}
        for r in rec}
    return out


def print_summary(s: dict[str, Any]) -> None:
    for m, by in s["speed"].items():
        print(f"{m}: " + "  ".join(f"{p} {v['samples_per_s']:.0f}/s (x{v['over_fp32'] or 0:.2f} "
                                   f"fp32, x{v['over_tf32'] or 0:.2f} tf32)" for p, v in by.items()))
    for m, ratio in s["engine_vs_bare"].items():
        print(f"{m}: engine / bare loop (amp-bf16 step time) {ratio:.4f}")
    for m, by in s["memory_ratio"].items():
        print(f"{m}: predicted / measured peak " + "  ".join(
            f"{p} {r:.3f}" if r is not None else f"{p} (no GPU)" for p, r in by.items()))
    for e in s["errors"]:
        print(f"error: {e}")
    for arm, r in s.get("recipe", {}).items():
        print(f"bert-base recipe, {arm}: final loss {r['final_loss']:.4f} "
              f"(x{r['final_loss_over_fp32'] or 0:.3f} fp32's), {r['samples_per_s']:.0f}/s, "
              f"skipped steps {r['skipped_steps']}, largest scale {r['largest_scale']}")
    if s["vocab_gain"] is not None:
        print(f"gpt2-small: vocabulary padded to a multiple of 64, step-time gain "
              f"{100 * s['vocab_gain']:+.1f}%")


if __name__ == "__main__":
    sys.exit(main())

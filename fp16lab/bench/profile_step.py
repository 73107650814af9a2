"""Where a training step's time goes, per execution mode: eager, cuda-graph, compile.

For each point (model, batch, layout, precision, execution) one script run measures:

- samples/s: ``--repeats`` blocks of ``--steps`` back-to-back steps, each block timed with CUDA
  events (perf_counter on a CPU) after the warm-up; the median block gives the rate, and the
  spread is (p90 - p10) / median of the blocks (``fp16lab.measure.summarize``);
- from a torch.profiler trace of ``--profile-steps`` more steps: the GPU idle fraction of the
  window (first step's start to last kernel's end), the summed kernel time per step and where
  it goes by kind (fp16lab.profile); the window's idle splits into the lead-in (first step's
  start to its first kernel: the GPU starts the window empty) and the gaps between kernels;
- the GPU idle fraction of the *timed* window: 1 - (GPU busy time per step, from the trace) /
  (step time, from the CUDA events of the unprofiled blocks). The profiled window's figure is
  higher for a replayed graph: CUPTI's per-kernel records widen the gaps between the graph's
  kernels (on the first H200 run 1.1 us each under the profiler, 0.8 ms per ResNet-50 batch-64
  step, against 0.4 ms of non-kernel time per step unprofiled);
- the profiler's overhead: wall time of the profiled steps / wall time of as many unprofiled
  steps - 1 (both ending in a synchronize);
- NVML telemetry during the timed blocks, with the GPM metrics (SM, occupancy, tensor-core,
  DRAM bandwidth utilisation) where the GPU has them.

Protocol (the sweep's): cudnn.benchmark off unless ``--cudnn-benchmark``, 3 warm-up steps
(a CUDA graph is captured after them; torch.compile compiles during them), synthetic fixed
batch, SGD with momentum, AMP = autocast fp16 + GradScaler. Ratios (batch 64 against batch 256,
AMP against fp32) come from this one run.

Points on a GPU: ResNet-50 channels_last amp-fp16 at batch 64 (eager, cuda-graph, compile) and
256 (eager, cuda-graph); small_cnn and transformer_block at batch 64, fp32 and amp-fp16, each
execution. Compile points run last and are skipped, saying so, once ``--budget-s`` is spent.
On a CPU, small_cnn stands in for ResNet-50 at small batches (a ResNet-50 step takes seconds there).

    python -m fp16lab.bench.profile_step                 # full, writes data/
    python -m fp16lab.bench.profile_step --quick         # smoke run
    python -m fp16lab.bench.profile_step --trace-dir $OUT/traces

Results: data/where_time_goes_<device>.json (rows) and ..._timelines.json (one step's events of
the ResNet-50 batch-64 points, for notebook 06 to draw).
"""

from __future__ import annotations

import argparse
import gc
import re
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from fp16lab import execution as E, validate
from fp16lab.measure import summarize, write_result
from fp16lab import profile as P
from fp16lab.bench import add_output_arguments, argument_parser
from fp16lab.telemetry import TelemetrySampler

#: Columns of the one-step timelines stored for the notebook.
TIMELINE_COLUMNS = ("lane", "kind", "start_us", "dur_us", "name")


def points(cuda: bool, quick: bool) -> list[dict[str, Any]]:
    """Returns the points to measure, eager and cuda-graph first, compile last.

    On a GPU, eager also runs with the fused SGD that cuda-graph needs ("eager + fused SGD"),
    which tells the gain of dropping GradScaler's host sync apart from the gain of the graph.
    """
    fused = dict(execution="eager", fused_optimizer=True)
    if cuda:
        r50 = dict(model="resnet50", layout="channels_last", precision="amp-fp16")
        big = [dict(r50, batch=b, execution=ex, role=f"resnet50 b{b}")
               for b, exs in ((64, ("eager", "cuda-graph")), (256, ("eager", "cuda-graph")))
               for ex in exs]
        big.insert(2, dict(r50, batch=64, role="resnet50 b64", **fused))
        small_batch = 64
        models = ("small_cnn", "transformer_block")
    else:  # ResNet-50 takes seconds per step on a CPU: small_cnn plays its part
        big = [dict(model="small_cnn", batch=b, layout="channels_last", precision="fp32",
                    execution="eager", role=f"resnet50 stand-in b{b}") for b in (8, 32)]
        small_batch = 16
        models = ("mlp",) if quick else ("mlp", "transformer_block")
    precisions = ("fp32", "amp-fp16") if cuda else ("fp32", "amp-bf16")
    small = [dict(model=m, batch=small_batch, layout="nchw", precision=p, execution=ex,
                  role="amp vs fp32")
             for m in models for p in precisions
             for ex in (("eager", "cuda-graph") if cuda else ("eager",))]
    if cuda:
        small += [dict(p, **fused) for p in small if p["execution"] == "eager"]
    compiled = []
    if not quick or cuda:
        compiled = [dict(p, execution="compile") for p in small
                    if p["execution"] == "eager" and not p.get("fused_optimizer")]
        compiled.append(dict(big[0], execution="compile"))
    if quick:
        big, small, compiled = big[:2], small[:2], compiled[:1] if cuda else []
    for p in big + small + compiled:
        p["mode"] = p["execution"] + (" + fused SGD" if p.get("fused_optimizer") else "")
    return big + small + compiled


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def time_blocks(step, *, cuda: bool, steps: int, repeats: int) -> list[float]:
    """Returns the mean ms per step of each of ``repeats`` blocks of ``steps`` steps."""
    out = []
    for _ in range(repeats):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(steps):
                step()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / steps)
        else:
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            out.append((time.perf_counter() - t0) * 1e3 / steps)
    return out


def wall_ms(step, n: int, cuda: bool) -> float:
    """Returns the wall time (ms) of n unprofiled steps, ending in a synchronize."""
    _sync(cuda)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    _sync(cuda)
    return (time.perf_counter() - t0) * 1e3


def one_step_timeline(prof: P.StepProfile) -> list[list[Any]]:
    """Returns the events of the last profiled step (its CPU range to its last kernel)."""
    ev = prof.events
    marks = ev[ev["name"] == P.STEP_MARK].sort_values("start_us")
    lo = float(marks["start_us"].iloc[-1])
    hi = prof.window[1] if len(marks) == 1 else max(float(marks["end_us"].iloc[-1]), prof.window[1])
    keep = ev[(ev["end_us"] > lo) & (ev["start_us"] < hi)
              & ((ev["lane"] == "gpu") | ev["top_level"].astype(bool)
                 | ev["kind"].isin(["launch", "sync"]))]
    # short names and 0.1 µs keep a ResNet-50 step (some 2,000 events) near 100 kB
    return [[r.lane, r.kind, round(r.start_us - lo, 1), round(r.dur_us, 1),
             "" if r.kind in ("launch", "sync") else r.name[:48 if r.lane == "gpu" else 32]]
            for r in keep.itertuples()]


def _is_timeline_point(point: dict[str, Any]) -> bool:
    """True for the small-batch ResNet-50 points (or their CPU stand-in): the notebook draws them."""
    return point["role"] in ("resnet50 b64", "resnet50 stand-in b8")


def measure(point: dict[str, Any], args: argparse.Namespace, cuda: bool,
            trace_dir: Path | None) -> tuple[dict[str, Any], list | None]:
    """Returns (the row of one point, its one-step timeline or None)."""
    device = "cuda" if cuda else "cpu"
    row: dict[str, Any] = {k: v for k, v in point.items()}
    row.update(device=device, status="ok", error="", cudnn_benchmark=args.cudnn_benchmark)
    t0 = time.perf_counter()
    step = None
    try:
        def build(traceable: bool = True) -> E.TrainingStep:
            return E.build_step(point["model"], point["batch"], precision=point["precision"],
                                execution=point["execution"], device=device,
                                layout=point["layout"], fused_optimizer=point.get("fused_optimizer"),
                                traceable=traceable)
        try:
            step = build()
        except Exception as e:  # a capture inside a profiler session failed: capture without it
            if point["execution"] != "cuda-graph":
                raise
            row["capture_note"] = (f"capture inside a profiler session failed ({type(e).__name__}: "
                                   f"{str(e).strip()[:200]}); captured without one")
            gc.collect()
            step = build(traceable=False)
        if point["execution"] != "cuda-graph":
            for _ in range(E.WARMUP_STEPS):
                step()
        _sync(cuda)
        row["setup_s"] = time.perf_counter() - t0
        sampler = TelemetrySampler(enabled=cuda, interval_s=0.05)
        with sampler:
            blocks = time_blocks(step, cuda=cuda, steps=args.steps, repeats=args.repeats)
        t = summarize(blocks)
        row.update(step_ms=t.median_ms, step_ms_p10=t.p10_ms, step_ms_p90=t.p90_ms,
                   spread=t.spread, repeats=args.repeats, steps=args.steps,
                   samples_per_s=point["batch"] / (t.median_ms / 1e3),
                   block_ms=blocks, **sampler.summary.as_dict())
        plain = wall_ms(step, args.profile_steps, cuda)
        path = (trace_dir / f"{point['model']}_b{point['batch']}_{point['precision']}_"
                f"{point['mode'].replace(' + ', '_').replace(' ', '_')}.json") if trace_dir else None
        prof = P.profile_steps(step, steps=args.profile_steps, warmup=1, trace_path=path, cuda=cuda)
        s = prof.summary
        row.update(profile_lane=prof.lane, idle_fraction=s.idle_fraction,
                   window_ms_per_step=s.window_us / 1e3 / prof.steps,
                   kernel_ms_per_step=s.kernel_us / 1e3 / prof.steps,
                   busy_ms_per_step=s.busy_us / 1e3 / prof.steps,
                   n_kernels_per_step=int((prof.events["lane"] == prof.lane).sum()) / prof.steps
                   if prof.lane == "gpu" else None,
                   profiler_overhead=prof.wall_ms / plain - 1, trace_file=str(path) if path else "",
                   **{f"{k}_ms_per_step": float(v) / 1e3 / prof.steps
                      for k, v in s.by_kind["total_us"].items()})
        gpu_ev = prof.events[prof.events["lane"] == "gpu"]
        if cuda and not gpu_ev.empty:
            lead_us = float(gpu_ev["start_us"].min()) - prof.window[0]
            row["lead_in_ms"] = lead_us / 1e3
            row["gap_ms_per_step"] = (s.window_us - s.busy_us - lead_us) / 1e3 / prof.steps
            # the timed blocks have no profiler and no host sync inside; their step time against
            # the GPU's busy time per step is the idle share of the timed window
            row["timed_idle_fraction"] = max(0.0, 1.0 - row["busy_ms_per_step"] / row["step_ms"])
        row["notes"] = "; ".join(step.notes)
        row["optimizer"] = "SGD fused" if step.fused_optimizer else "SGD foreach"
        row["graph_launches_per_step"] = prof.graph_launches / prof.steps
        # the share of the timed step the trace's device events cover: far below 1 for a replayed
        # graph means the trace missed the graph's kernels (CUPTI saw only the whole graph)
        row["trace_coverage"] = row["busy_ms_per_step"] / row["step_ms"] if cuda else None
        if cuda and prof.graph_launches and row["trace_coverage"] < 0.5:
            row["timed_idle_fraction"] = None  # the busy time it would need is not in the trace
            row["trace_note"] = (f"the trace covers {row['trace_coverage']:.0%} of the timed step: "
                                 "it lacks kernels of the replayed graph, so its idle fraction "
                                 "and kernel time are not the step's")
        timeline = one_step_timeline(prof) if _is_timeline_point(point) else None
        if path is not None and timeline is None:  # keep only the traces the notebook tells of
            path.unlink(missing_ok=True)
            row["trace_file"] = ""
        return row, timeline
    except Exception as e:  # recorded, and the run goes on: one GPU run has to tell all
        row.update(status="error", error=f"{type(e).__name__}: {str(e).strip()[:400]}",
                   traceback=traceback.format_exc()[-2000:])
        return row, None
    finally:
        row["elapsed_s"] = time.perf_counter() - t0
        del step
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def default_name(gpu: str | None) -> str:
    """Returns the result file's stem: where_time_goes_h200 on an H200, ..._cpu without a GPU."""
    if not gpu:
        return "where_time_goes_cpu"
    m = re.search(r"\b([A-Z]\d{2,4}[A-Za-z]*)\b", gpu)
    return f"where_time_goes_{(m.group(1) if m else re.sub(r'[^a-z0-9]+', '_', gpu.lower())).lower()}"


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Returns the figures issue-style checks need, computed from this run's rows."""
    ok = {(r["model"], r["batch"], r["precision"], r.get("mode", r["execution"])): r
          for r in rows if r["status"] == "ok"}
    out: dict[str, Any] = {}
    big = [r for r in rows if r["role"].startswith("resnet50") and r["status"] == "ok"]
    if big:
        b_small = min(r["batch"] for r in big)
        b_large = max(r["batch"] for r in big)
        small = [r for r in big if r["batch"] == b_small]
        best = max(small, key=lambda r: r["samples_per_s"])
        ref = next((r for r in big if r["batch"] == b_large
                    and r.get("mode", r["execution"]) == "eager"), None)
        out["small_batch_best"] = {k: best.get(k) for k in (
            "model", "batch", "execution", "mode", "samples_per_s", "idle_fraction",
            "timed_idle_fraction", "lead_in_ms", "gap_ms_per_step", "spread",
            "kernel_ms_per_step", "step_ms")}
        if ref is not None:
            out["large_batch_eager_samples_per_s"] = ref["samples_per_s"]
            out["small_best_over_large_eager"] = best["samples_per_s"] / ref["samples_per_s"]
            # the ceiling a launch-free step could reach: batch / summed kernel time, read from
            # the eager + fused SGD trace (the same kernels) where the graph's trace missed some
            kernels = best
            if best.get("trace_note"):
                kernels = next((r for r in small if r.get("mode") == "eager + fused SGD"), best)
            ceiling = b_small / (kernels["kernel_ms_per_step"] / 1e3)
            out["small_kernel_time_from"] = kernels.get("mode", kernels["execution"])
            out["small_kernel_time_ceiling_samples_per_s"] = ceiling
            out["small_best_over_ceiling"] = best["samples_per_s"] / ceiling
    amp = {}
    for (m, b, p, ex), r in ok.items():
        if p.startswith("amp") and (m, b, "fp32", ex) in ok:
            amp.setdefault(m, {})[ex] = r["samples_per_s"] / ok[(m, b, "fp32", ex)]["samples_per_s"]
    out["amp_over_fp32_by_execution"] = amp
    best_amp = {}
    for m in amp:
        rates = {p: max((r["samples_per_s"] for (mm, _, pp, _), r in ok.items()
                         if mm == m and pp == p), default=None) for p in ("fp32", "amp-fp16",
                                                                         "amp-bf16")}
        a = rates.get("amp-fp16") or rates.get("amp-bf16")
        if a and rates["fp32"]:
            best_amp[m] = a / rates["fp32"]
    out["best_amp_over_best_fp32"] = best_amp
    return out


def save(args: argparse.Namespace, cuda: bool, rows: list[dict[str, Any]],
         timelines: dict[str, Any], start: float) -> tuple[Path, Path]:
    """Writes the rows and timelines measured so far; returns the two paths."""
    name = args.name or default_name(torch.cuda.get_device_name(0) if cuda else None)
    meta = {"benchmark": "profile_step", "quick": args.quick, "steps": args.steps,
            "repeats": args.repeats, "profile_steps": args.profile_steps,
            "warmup_steps": E.WARMUP_STEPS, "cudnn_benchmark": args.cudnn_benchmark,
            "summary": targets(rows), "total_s": time.perf_counter() - start,
            "protocol": "blocks of back-to-back steps timed with CUDA events after the warm-up, "
                        "no host sync inside a block; idle fraction and kernel time from a "
                        "torch.profiler trace of further steps; timed idle = 1 - trace busy "
                        "time per step / timed step time"}
    path = write_result(name, rows, meta=meta, data_dir=args.out, replace=args.replace)
    tl_path = write_result(f"{name}_timelines", [
        {"point": k, **v} for k, v in timelines.items()], meta={"benchmark": "profile_step"},
        data_dir=args.out, replace=args.replace)
    return path, tl_path


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argument_parser("profile_step", __doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short smoke run (few points, steps)")
    add_output_arguments(ap, "by device")
    ap.add_argument("--steps", type=validate.argument(validate.count), default=None,
                    help="steps per timed block")
    ap.add_argument("--repeats", type=validate.argument(validate.count), default=None,
                    help="timed blocks per point")
    ap.add_argument("--profile-steps", type=validate.argument(validate.count), default=None,
                    help="steps in the profiled window")
    ap.add_argument("--budget-s", type=validate.argument(validate.number, low=0, low_open=True),
                    default=170.0,
                    help="compile points are skipped once this many seconds have passed")
    ap.add_argument("--trace-dir", type=validate.argument(validate.output_dir), default=None,
                    help="keep the Chrome traces here (default: not kept)")
    ap.add_argument("--cudnn-benchmark", action="store_true", help="turn cudnn.benchmark on")
    ap.add_argument("--cpu", action="store_true", help="measure on the CPU even with a GPU")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu
    args.steps = args.steps or (5 if args.quick else (20 if cuda else 5))
    args.repeats = args.repeats or (2 if args.quick else (5 if cuda else 3))
    args.profile_steps = args.profile_steps or (2 if args.quick else 3)
    if args.trace_dir:
        args.trace_dir.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    start = time.perf_counter()
    rows, timelines = [], {}
    for point in points(cuda, args.quick):
        if point["execution"] == "compile" and time.perf_counter() - start > args.budget_s:
            rows.append({**point, "device": "cuda" if cuda else "cpu", "status": "skipped",
                         "error": f"time budget of {args.budget_s:.0f} s spent before this "
                                  "compile point"})
            continue
        row, timeline = measure(point, args, cuda, args.trace_dir)
        rows.append(row)
        print(f"{row['model']:>17} b{row['batch']:<4} {row['precision']:>8} "
              f"{row['mode']:>20}: {row['status']} "
              f"{row.get('samples_per_s', float('nan')):10.0f} samples/s "
              f"{row['elapsed_s']:.1f} s {row['error'][:120]}", flush=True)
        if timeline is not None:
            timelines[f"{row['model']} b{row['batch']} {row['precision']} {row['mode']}"] = {
                "columns": list(TIMELINE_COLUMNS), "events": timeline,
                "step_ms": row["step_ms"], "idle_fraction": row["idle_fraction"],
                "trace_note": row.get("trace_note", "")}
        path, tl_path = save(args, cuda, rows, timelines, start)  # after every point: a run
        # cut short by a timeout still leaves what it measured
    print(f"\nwrote {path} and {tl_path}\n")
    summary = targets(rows)
    print(f"{'model':>17} {'batch':>5} {'precision':>9} {'mode':>20} {'samples/s':>10} "
          f"{'spread':>7} {'idle':>6} {'t.idle':>6} {'lead ms':>7} {'kernel ms':>9} "
          f"{'prof ovh':>8}")
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['model']:>17} {r['batch']:>5} {r['precision']:>9} {r['mode']:>20}  "
                  f"{r['status']}: {r['error'][:60]}")
            continue
        print(f"{r['model']:>17} {r['batch']:>5} {r['precision']:>9} {r['mode']:>20} "
              f"{r['samples_per_s']:10.0f} {r['spread']:7.1%} {r['idle_fraction']:6.1%} "
              f"{_pct(r.get('timed_idle_fraction')):>6} {_num(r.get('lead_in_ms')):>7} "
              f"{r['kernel_ms_per_step']:9.2f} {r['profiler_overhead']:8.1%}")
    for k, v in summary.items():
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

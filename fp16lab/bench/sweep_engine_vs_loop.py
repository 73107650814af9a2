"""Does the sweep engine report what a bare training loop gets? And what does telemetry cost?

Times, in one process and interleaved (in balanced orders, :func:`fp16lab.measure.round_orders`):

- ``bare``: a hand-written training loop (forward, loss, scaled backward, scaler step,
  optimizer step) timed with two CUDA events around ``steps`` steps, mean per step;
- ``engine``: :func:`fp16lab.sweep.measure_point` for the same point, telemetry on (what a
  sweep reports), median per step;
- ``engine_no_telemetry``: the same with the NVML sampler off.

GPU default: ResNet-50, AMP fp16, channels_last, batch 256 (goals on the H200: engine within 5%
of the bare loop, repeat spread at most 3%, telemetry overhead under 1%).
``--quick``: small_cnn on the CPU (perf_counter instead of events), a smoke test of the script.

    python -m fp16lab.bench.sweep_engine_vs_loop            # GPU, about 2 minutes
    python -m fp16lab.bench.sweep_engine_vs_loop --quick    # CPU smoke test
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F

from fp16lab import measure, sweep, validate
from fp16lab.bench import argument_parser
from fp16lab.models import NUM_CLASSES, build_model, input_shape
from fp16lab.recipes import set_tf32


def bare_loop_ms(model_name: str, batch: int, layout: str, warmup: int, steps: int,
                 device: str) -> float:
    """Returns the mean step time (ms) of a plain AMP-fp16 training loop, nothing else in it."""
    torch.manual_seed(0)
    # same maths settings the engine uses for an amp-fp16 point
    set_tf32(False)
    torch.backends.cudnn.benchmark = False
    model = build_model(model_name).to(device)
    x = torch.randn(input_shape(model_name, batch), device=device)
    y = torch.randint(0, NUM_CLASSES, (batch,), device=device)
    if layout == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=sweep.LR, momentum=sweep.MOMENTUM)
    scaler = torch.amp.GradScaler(device)
    dtype = torch.float16

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=dtype):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(warmup):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            step()
        stop.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(stop) / steps
    else:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        ms = (time.perf_counter() - t0) * 1e3 / steps
    del model, opt, x, y, scaler
    if device == "cuda":
        torch.cuda.empty_cache()
    return ms


def main(argv: list[str] | None = None) -> int:
    ap = argument_parser("sweep_engine_vs_loop", __doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small_cnn on the CPU, few steps")
    ap.add_argument("--repeats", type=validate.argument(validate.count), default=None)
    ap.add_argument("--warmup", type=validate.argument(validate.count, low=0), default=None)
    ap.add_argument("--steps", type=validate.argument(validate.count), default=None)
    ap.add_argument("--name", type=validate.argument(validate.text), default=None,
                    help="result file stem under data/")
    ap.add_argument("--replace", action="store_true",
                   help="write the committed file in data/ instead of data/local/")
    args = ap.parse_args(argv)

    gpu = torch.cuda.is_available() and not args.quick
    if not gpu and not args.quick:
        print("no CUDA GPU: running the --quick CPU version")
        args.quick = True
    device = "cuda" if gpu else "cpu"
    if gpu:
        model, batch, layout = "resnet50", 256, "channels_last"
        warmup, steps, repeats = 10, 30, 5
    else:
        model, batch, layout = "small_cnn", 16, "channels_last"
        warmup, steps, repeats = 1, 5, 3
    # a flag given wins, --warmup 0 too
    warmup = warmup if args.warmup is None else args.warmup
    steps = steps if args.steps is None else args.steps
    repeats = repeats if args.repeats is None else args.repeats
    name = args.name or ("sweep_engine_vs_loop" if gpu else "sweep_engine_vs_loop_quick")
    point = sweep.Point(model, batch, layout, "amp-fp16", sweep.ScalerSettings(), device=device)
    print(f"{point.label()} on {device}: warmup {warmup}, {steps} timed steps, {repeats} "
          f"interleaved repeats")

    def engine(telemetry: bool) -> tuple[float, int]:
        row = sweep.measure_point(point, warmup=warmup, steps=steps, telemetry=telemetry)
        if row["status"] != "ok":
            raise RuntimeError(f"engine point failed: {row['error']}")
        return row["step_ms_median"], int(row["telemetry_samples"] or 0)

    variants = {
        "bare": lambda: (bare_loop_ms(model, batch, layout, warmup, steps, device), 0),
        "engine": lambda: engine(True),
        "engine_no_telemetry": lambda: engine(False),
    }
    rows = []
    t0 = time.perf_counter()
    for r, order in enumerate(measure.round_orders(variants, repeats)):
        for name_v in order:
            ms, n_tel = variants[name_v]()
            rows.append({"variant": name_v, "repeat": r, "step_ms": ms,
                         "samples_per_s": batch / (ms / 1e3), "telemetry_samples": n_tel})
            print(f"  repeat {r} {name_v:>20}: {ms:8.2f} ms/step  {batch / (ms / 1e3):9.1f} samples/s")
    wall = time.perf_counter() - t0

    def med(v: str) -> float:
        return statistics.median(x["step_ms"] for x in rows if x["variant"] == v)

    def spread(v: str) -> float:
        xs = [x["step_ms"] for x in rows if x["variant"] == v]
        return (max(xs) - min(xs)) / statistics.median(xs)

    summary = {
        "model": model, "batch": batch, "layout": layout, "precision": "amp-fp16",
        "device": device, "warmup": warmup, "steps": steps, "repeats": repeats,
        "bare_ms": med("bare"), "engine_ms": med("engine"),
        "engine_no_telemetry_ms": med("engine_no_telemetry"),
        "engine_vs_bare": med("engine") / med("bare"),
        "engine_no_telemetry_vs_bare": med("engine_no_telemetry") / med("bare"),
        "telemetry_overhead": med("engine") / med("engine_no_telemetry") - 1,
        "repeat_spread": {v: spread(v) for v in variants},
        "wall_s": wall,
        "goals": {"engine_vs_bare_within": 0.05, "repeat_spread_at_most": 0.03,
                  "telemetry_overhead_under": 0.01},
    }
    path = measure.write_result(name, rows, meta={"summary": summary}, replace=args.replace)
    print()
    print(f"wrote {path} ({wall:.0f} s)")
    print(f"{'variant':>22} {'ms/step':>9} {'samples/s':>10} {'repeat spread':>14}")
    for v in variants:
        print(f"{v:>22} {med(v):9.2f} {batch / (med(v) / 1e3):10.1f} {100 * spread(v):13.2f}%")
    ok = lambda c: "meets goal" if c else "MISSES goal"  # noqa: E731
    ratio = summary["engine_vs_bare"]
    print(f"engine / bare loop: {ratio:.4f} ({ok(abs(ratio - 1) <= 0.05)}: within 5%)")
    worst = max(summary["repeat_spread"].values())
    print(f"worst repeat spread: {100 * worst:.2f}% ({ok(worst <= 0.03)}: at most 3%)")
    tel = summary["telemetry_overhead"]
    print(f"telemetry overhead: {100 * tel:+.2f}% ({ok(tel < 0.01)}: under 1%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

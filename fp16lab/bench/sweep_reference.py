"""The reference sweeps whose results ship in data/, so readers without a GPU see real numbers.

On a GPU (about 5-6 minutes on an H200):

- ResNet-50: batch 64, 128, 256 x nchw, channels_last x fp32, tf32, amp-fp16, amp-bf16;
- ResNet-50 loss-scaler settings at batch 128, channels_last, amp-fp16 (init_scale 2**16, 2**24,
  2**40; growth_interval 2000 and 1) and pure fp16 (fp32 master weights) at batch 256;
- small_cnn, ResNet-18 (batch 64, 256 x both layouts x 4 precisions) and transformer_block
  (batch 64, 256 x 4 precisions).

Rows go to ``data/sweep_reference_<gpu>.parquet`` (and .csv) as each point finishes, so a run cut
short resumes where it stopped when started again; how long each part took goes to
``data/sweep_reference_<gpu>.json``. ``--quick`` runs a tiny CPU grid into
``data/sweep_reference_cpu.parquet`` instead.

    python -m fp16lab.bench.sweep_reference            # GPU
    python -m fp16lab.bench.sweep_reference --quick    # CPU smoke test
"""

from __future__ import annotations

import argparse
import re
import sys
import time


import torch

from fp16lab import bench, sweep
from fp16lab.device import device_info
from fp16lab.sweep import ScalerSettings, SweepSpec

ALL4 = ("fp32", "tf32", "amp-fp16", "amp-bf16")
BOTH = ("nchw", "channels_last")


def gpu_parts() -> dict[str, SweepSpec]:
    """Returns the named sweeps of the GPU reference run, in the order they run."""
    common = dict(device="cuda", repeats=3)
    return {
        "resnet50_grid": SweepSpec(models=("resnet50",), batches=(64, 128, 256), layouts=BOTH,
                                   precisions=ALL4, warmup=4, steps=12, **common),
        "resnet50_scaler": SweepSpec(
            models=("resnet50",), batches=(128,), layouts=("channels_last",),
            precisions=("amp-fp16",), warmup=4, steps=12,
            scalers=(ScalerSettings(), ScalerSettings(init_scale=2.0**24),
                     ScalerSettings(init_scale=2.0**40), ScalerSettings(growth_interval=1)),
            **common),
        "resnet50_pure_fp16": SweepSpec(models=("resnet50",), batches=(256,),
                                        layouts=("channels_last",), precisions=("fp16-o2", "amp-fp16"),
                                        warmup=4, steps=12, **common),
        "small_models": SweepSpec(models=("small_cnn", "resnet18"), batches=(64, 256), layouts=BOTH,
                                  precisions=ALL4, warmup=5, steps=20, **common),
        "transformer": SweepSpec(models=("transformer_block",), batches=(64, 256),
                                 precisions=ALL4, warmup=5, steps=20, **common),
    }


def cpu_parts() -> dict[str, SweepSpec]:
    """Returns a tiny CPU grid (a smoke test of this script, not a reference)."""
    return {"small_cnn_cpu": SweepSpec(models=("small_cnn",), batches=(8, 32), layouts=BOTH,
                                       precisions=("fp32", "amp-bf16"), device="cpu", warmup=1,
                                       steps=4, repeats=2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny CPU grid")
    ap.add_argument("--only", default=None, help="comma-separated part names to run")
    ap.add_argument("--replace", action="store_true",
                   help="write the committed file in data/ instead of data/local/")
    args = ap.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.quick
    parts = gpu_parts() if gpu else cpu_parts()
    if args.only:
        unknown = set(args.only.split(",")) - set(parts)
        if unknown:
            raise SystemExit(f"unknown part(s) {sorted(unknown)}; parts: {', '.join(parts)}")
        parts = {k: v for k, v in parts.items() if k in args.only.split(",")}
    if gpu:
        name = device_info().gpu_name or "gpu"
        slug = "h200" if "H200" in name else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    else:
        slug = "cpu"
    stem = f"sweep_reference_{slug}"
    out = (bench.data_dir() if args.replace else bench.local_dir()) / f"{stem}.parquet"
    total_points = sum(len(s.points()) * s.repeats for s in parts.values())
    print(f"{len(parts)} sweeps, {total_points} measurements, results to {out}")
    # a resumed run keeps the timings of parts it had nothing left to measure
    try:
        timings = {t["part"]: t for t in bench.read_result(stem, data_dir=out.parent)["rows"]}
    except (FileNotFoundError, ValueError):
        timings = {}
    t_all = time.perf_counter()
    for part, spec in parts.items():
        before = len(sweep.read_results(out))
        t0 = time.perf_counter()
        rows = sweep.run_sweep(spec, out, progress=True)
        took = time.perf_counter() - t0
        measured = len(sweep.read_results(out)) - before
        s = sweep.summarize_results(rows)
        print(f"{part}: {len(spec.points())} points x {spec.repeats} repeats, {measured} "
              f"measured now in {took:.0f} s")
        if measured or part not in timings:
            timings[part] = {"part": part, "points": len(spec.points()), "repeats": spec.repeats,
                             "warmup": spec.warmup, "steps": spec.steps, "wall_s": took,
                             "measured": measured, "resumed": measured < len(spec.points()) * spec.repeats,
                             "ok": int((s["status"] == "ok").sum()),
                             "unstable": int(s["unstable"].sum())}
    total = time.perf_counter() - t_all
    timings = list(timings.values())
    bench.write_result(stem, timings, meta={"results_file": out.name, "wall_s_this_run": total},
                       data_dir=out.parent)
    print()
    print(sweep.format_report(sweep.read_results(out)))
    print()
    for t in timings:
        print(f"{t['part']:>20}: {t['wall_s']:6.0f} s  ({t['points']} points x {t['repeats']}, "
              f"{t['unstable']} unstable{', resumed' if t.get('resumed') else ''})")
    print(f"{'this run':>20}: {total:6.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

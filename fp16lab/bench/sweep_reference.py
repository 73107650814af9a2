"""The reference sweeps whose results ship in data/, so readers without a GPU see real numbers.

On a GPU (the original grid about 5-6 minutes on an H200; the later axes' parts add more,
compile points compiling once per repeat; ``--only`` runs parts one at a time):

- ResNet-50: batch 64, 128, 256 x nchw, channels_last x fp32, tf32, amp-fp16, amp-bf16;
- ResNet-50 loss-scaler settings at batch 128, channels_last, amp-fp16 (init_scale 2**16, 2**24,
  2**40; growth_interval 2000 and 1) and pure fp16 (fp32 master weights) at batch 256;
- small_cnn, ResNet-18 (batch 64, 256 x both layouts x 4 precisions) and transformer_block
  (batch 64, 256 x 4 precisions);
- the later axes: execution (eager, cuda-graph, compile) for ResNet-50 channels_last batch 64
  and small_cnn / transformer_block batch 64 in fp32 and AMP; input (synthetic and every file
  input that runs here) for ResNet-50 channels_last batch 256 amp-fp16, on ``--images``
  generated JPEGs in ``--images-dir``; the fp8 recipes against amp-bf16 for transformer_block;
  a workload, BERT-base (``bert-base``, sequence 128, transformers' model built from its
  configuration with random weights) at batch 64 in the four precisions and fp16-o2, where
  transformers is installed; gpus 1 and 2 for ResNet-50 channels_last batch 256 amp-fp16,
  where two GPUs are there.

Rows go to ``data/sweep_reference_<gpu>.parquet`` (and .csv) as each point finishes, so a run cut
short resumes where it stopped when started again; how long each part took goes to
``data/sweep_reference_<gpu>.json``. ``--quick`` runs a tiny CPU grid into
``data/sweep_reference_cpu.parquet`` instead.

    python -m fp16lab.bench.sweep_reference            # GPU
    python -m fp16lab.bench.sweep_reference --quick    # CPU smoke test
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from fp16lab import measure, sweep, validate
from fp16lab.bench import argument_parser
from fp16lab.device import device_info
from fp16lab.execution import EXECUTIONS
from fp16lab.inputs import BACKENDS, unavailable_reason
from fp16lab.sweep import ScalerSettings, SweepSpec
from fp16lab.sweep.cli import images_folder
from fp16lab.workload import load_workload
from fp16lab.workloads import missing_package

ALL4 = ("fp32", "tf32", "amp-fp16", "amp-bf16")
BOTH = ("nchw", "channels_last")
FP8 = tuple(p for p in sweep.SWEEP_PRECISIONS if p.startswith("fp8-"))


#: Every part's name: the GPU run's (:func:`gpu_parts`), then the CPU run's (:func:`cpu_parts`).
PARTS = ("resnet50_grid", "resnet50_scaler", "resnet50_pure_fp16", "small_models", "transformer",
         "execution_resnet50", "execution_small", "fp8_transformer", "workload_bert",
         "inputs_resnet50", "gpus_resnet50", "small_cnn_cpu", "mlp_fp8_cpu", "workload_cpu")


def gpu_parts(images_dir: str | None = None, images: int = 2048) -> dict[str, SweepSpec]:
    """Returns the named sweeps of the GPU reference run, in the order they run.

    Every part measures by :data:`fp16lab.sweep.GPU_PROTOCOL`, as the claims do; the later
    axes' parts come last, so their default point (eager, synthetic, one GPU) is one an earlier
    part measured (same key: resumed, not re-measured); ``inputs_resnet50`` only with
    ``images_dir``, ``gpus_resnet50`` only where torch sees two GPUs or more, ``workload_bert``
    only where transformers is installed.
    """
    protocol = sweep.GPU_PROTOCOL  # the claims measure the same way
    common = dict(device="cuda", repeats=3, cudnn_benchmark=protocol.cudnn_benchmark,
                  warmup=protocol.warmup, steps=protocol.steps)
    later = {
        "execution_resnet50": SweepSpec(models=("resnet50",), batches=(64,),
                                        layouts=("channels_last",),
                                        precisions=("amp-fp16", "amp-bf16"),
                                        executions=tuple(EXECUTIONS), **common),
        "execution_small": SweepSpec(models=("small_cnn", "transformer_block"), batches=(64,),
                                     precisions=("fp32", "amp-fp16", "amp-bf16"),
                                     executions=tuple(EXECUTIONS), **common),
        "fp8_transformer": SweepSpec(models=("transformer_block",), batches=(64, 256),
                                     precisions=("amp-bf16", *FP8), **common),
    }
    if missing_package("bert-base") is None:
        later["workload_bert"] = SweepSpec(models=("bert-base",), batches=(64,),
                                           precisions=(*ALL4, "fp16-o2"), **common)
    if images_dir is not None:
        runnable = tuple(b for b in BACKENDS if unavailable_reason(b, "cuda") is None)
        later["inputs_resnet50"] = SweepSpec(
            models=("resnet50",), batches=(256,), layouts=("channels_last",),
            precisions=("amp-fp16",), inputs=runnable, images_dir=images_dir, images=images,
            **common)
    if torch.cuda.device_count() >= 2:
        later["gpus_resnet50"] = SweepSpec(
            models=("resnet50",), batches=(256,), layouts=("channels_last",),
            precisions=("amp-fp16",), gpus=tuple(range(1, torch.cuda.device_count() + 1)),
            **common)
    return {
        "resnet50_grid": SweepSpec(models=("resnet50",), batches=(64, 128, 256), layouts=BOTH,
                                   precisions=ALL4, **common),
        "resnet50_scaler": SweepSpec(
            models=("resnet50",), batches=(128,), layouts=("channels_last",),
            precisions=("amp-fp16",),
            scalers=(ScalerSettings(), ScalerSettings(init_scale=2.0**24),
                     ScalerSettings(init_scale=2.0**40), ScalerSettings(growth_interval=1)),
            **common),
        "resnet50_pure_fp16": SweepSpec(models=("resnet50",), batches=(256,),
                                        layouts=("channels_last",), precisions=("fp16-o2", "amp-fp16"),
                                        **common),
        "small_models": SweepSpec(models=("small_cnn", "resnet18"), batches=(64, 256), layouts=BOTH,
                                  precisions=ALL4, **common),
        "transformer": SweepSpec(models=("transformer_block",), batches=(64, 256),
                                 precisions=ALL4, **common),
        **later,
    }


def cpu_parts(only: Sequence[str] | None = None) -> dict[str, SweepSpec]:
    """Returns a tiny CPU grid (a smoke test of this script, not a reference), or its parts
    named in ``only``; its workload part, tiny BERT, only where transformers is installed (and
    built only where it is asked for)."""
    parts = {"small_cnn_cpu": SweepSpec(models=("small_cnn",), batches=(8, 32), layouts=BOTH,
                                       precisions=("fp32", "amp-bf16"), device="cpu", warmup=1,
                                       steps=4, repeats=2),
            "mlp_fp8_cpu": SweepSpec(models=("mlp",), batches=(32,),
                                     precisions=("amp-bf16", "fp8-tensorwise"), device="cpu",
                                     warmup=1, steps=4, repeats=2)}
    if missing_package("bert-base") is None and (only is None or "workload_cpu" in only):
        parts["workload_cpu"] = SweepSpec(models=(load_workload("bert-base", tiny=True),),
                                          batches=(8,), precisions=("fp32", "amp-bf16"),
                                          device="cpu", warmup=1, steps=4, repeats=2)
    return parts if only is None else {k: v for k, v in parts.items() if k in only}


def main(argv: list[str] | None = None) -> int:
    ap = argument_parser("sweep_reference", __doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny CPU grid")
    ap.add_argument("--only", default=None,
                    type=validate.argument(validate.choice, PARTS, many=True),
                    help="comma-separated part names to run")
    ap.add_argument("--replace", action="store_true",
                   help="write the committed file in data/ instead of data/local/")
    ap.add_argument("--images-dir", default=None, type=validate.argument(images_folder),
                    help="JPEG folder of the inputs part (default: fp16lab_jpegs_<images> in the "
                         "temp folder, written once)")
    ap.add_argument("--images", type=validate.argument(validate.count), default=2048,
                    help="JPEGs in a new --images-dir")
    args = ap.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.quick
    images_dir = str(args.images_dir
                     or Path(tempfile.gettempdir()) / f"fp16lab_jpegs_{args.images}")
    parts = gpu_parts(images_dir, args.images) if gpu else cpu_parts(args.only)
    if args.only is not None:
        elsewhere = [k for k in args.only if k not in parts]
        if elsewhere:  # a GPU part on the CPU, say: refused before anything runs
            ap.error(f"argument --only: {', '.join(elsewhere)} not run here; this run's parts: "
                     f"{', '.join(parts)}")
        parts = {k: v for k, v in parts.items() if k in args.only}
    if gpu:
        name = device_info().gpu_name or "gpu"
        slug = "h200" if "H200" in name else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    else:
        slug = "cpu"
    stem = f"sweep_reference_{slug}"
    out = (measure.data_dir() if args.replace else measure.local_dir()) / f"{stem}.parquet"
    total_points = sum(len(s.points()) * s.repeats for s in parts.values())
    print(f"{len(parts)} sweeps, {total_points} measurements, results to {out}")
    # a resumed run keeps the timings of parts it had nothing left to measure
    # and the notes written into the earlier file's meta (``*_note``: where it ran, and how)
    try:
        earlier = measure.read_result(stem, data_dir=out.parent, rows_need=("part",))
        timings = {t["part"]: t for t in earlier["rows"]}
        notes = {k: v for k, v in earlier["meta"].items() if k.endswith("_note")}
    except (FileNotFoundError, ValueError):
        timings, notes = {}, {}
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
    measure.write_result(stem, timings, meta={**notes, "results_file": out.name,
                                              "wall_s_this_run": total}, data_dir=out.parent)
    print()
    print(sweep.format_report(sweep.read_results(out)))
    print()
    for t in timings:
        took = "     -" if t.get("wall_s") is None else f"{t['wall_s']:6.0f}"  # kept parts: unknown
        print(f"{t['part']:>20}: {took} s  ({t['points']} points x {t['repeats']}, "
              f"{t['unstable']} unstable{', resumed' if t.get('resumed') else ''})")
    print(f"{'this run':>20}: {total:6.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

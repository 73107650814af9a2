"""Which side caps ResNet-50 training on real JPEGs: the input pipeline, or the model?

One run measures, on a JPEG data set made by ``fp16lab.inputs.make_image_folder`` (500x375,
quality 90, about 105 kB a file):

1. **loader only**: images/s of each input backend (``fp16lab.inputs.BACKENDS``; hw-decode
   skipped with the reason where nvImageCodec or the GPU's JPEG engines are missing) with no
   training, and the CPU its processes and threads used; the ``dataloader`` backend at 25%, 50%,
   75% and 100% of the cores as workers (the "75% of cores" rule checked), and once with uint8
   batches normalised on the GPU; ``gpu-decode`` and ``hw-decode`` also with a quarter of each
   batch decoded on the CPU by their reader threads;
2. **training**: images/s of ResNet-50 training steps (channels_last, batch 256) in amp-fp16,
   amp-bf16 and fp32 (TF32 off), fed by each backend (the dataloader also with uint8
   batches); ``synthetic`` (one batch already on the GPU) is the model's own ceiling.

Protocol (the same in ``fp16lab.feeding`` and notebook 07): ``cudnn.benchmark`` on; warm-up
batches or steps first (workers + 2 of them, so that the first wave of batches the workers
finish together is used up); then at least 12 batches or 20 steps and at least
``MIN_SECONDS`` (5 s), timed on the host clock between two ``torch.cuda.synchronize()`` calls.
The gpu-decode and hw-decode rows also record the host milliseconds per batch their producer
threads spent reading, decoding and augmenting. Ratios are taken within this one run.

A row that cannot run here is recorded as ``skipped`` with the reason (e.g. DALI not installed),
one that fails as ``error`` with the message; rows are written to the result file as they are
measured, and rows still waiting when ``--budget-s`` runs out are recorded as ``skipped``.

    python -m fp16lab.bench.input_pipeline            # GPU: about 5 minutes on an H200 host
    python -m fp16lab.bench.input_pipeline --quick    # small smoke run (CPU is fine)
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from fp16lab import validate
from fp16lab.measure import write_result
from fp16lab.bench import add_output_arguments, argument_parser
from fp16lab.device import device_info
from fp16lab.sweep.cli import images_folder
from fp16lab.inputs import (GPU_DECODE_DEPTH, GPU_DECODE_PRODUCERS, InputSettings, cpu_cores,
                            default_workers, make_image_folder, measure_loader, measure_training,
                            physical_cores, summary_lines)

#: Each timed window lasts at least this long (and at least the row's steps), so that a
#: pipeline of 12 workers building whole batches is timed over several waves of batches.
MIN_SECONDS = 5.0
#: The share of each gpu-decode batch the hybrid rows decode on the CPU: a guess from the last
#: H200 run (nvJPEG near 4500 images/s; 12 reader threads at perhaps 100-150 JPEGs/s each).
HYBRID_SHARE = 0.25


def protocol(a: argparse.Namespace) -> str:
    """Returns the measuring protocol of a run, in words, for the result file's meta."""
    return (f"cudnn.benchmark on; warm-up of workers + 2 batches/steps; then at least "
            f"{a.loader_steps} batches (loader) or {a.train_steps} steps (training; fp32 "
            f"{max(3, a.train_steps // 2)}) and at least {a.min_seconds:g} s (the synthetic "
            f"loader: the batches only), timed on the host clock between two "
            f"torch.cuda.synchronize() calls; one run")


def default_name() -> str:
    """Returns the result name for this machine: input_pipeline_h200 on an H200."""
    gpu = device_info().gpu_name
    if not gpu:
        return "input_pipeline_cpu"
    slug = next((w for w in gpu.replace("-", " ").split() if any(c.isdigit() for c in w)), gpu)
    return "input_pipeline_" + "".join(c for c in slug.lower() if c.isalnum())


def plan(a: argparse.Namespace, device: str) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    """Returns the rows to measure, most wanted first: (label, function returning the row).

    The question first: each backend's loader rate at the default worker count (the dataloader
    with float32 batches normalised on the CPU and with uint8 batches normalised on the GPU),
    then amp-fp16 training with the fused SGD (GradScaler's step without a host sync) fed by
    each input (synthetic, dali, gpu-decode, hw-decode, dataloader, dataloader uint8); then the
    same inputs with the plain SGD in amp-fp16 and amp-bf16; then hw-decode and gpu-decode with
    ``HYBRID_SHARE`` of each batch decoded on the CPU (loader, and amp-fp16 with the fused SGD);
    then fp32 (its first step pays about a minute of cuDNN's algorithm search on an H200); then the
    worker sweep (the "75% of cores" rule); then DALI's reader threads at the same shares of the
    *physical* cores, the form the rule has in its source (where DALI is not installed, those
    rows are skipped at once). What the budget leaves out is recorded as skipped.
    """
    cores = cpu_cores()
    shares = (0.5, 1.0) if a.quick else (0.25, 0.5, 0.75, 1.0)
    rule = default_workers(cores)
    counts = [w for w in sorted({max(1, int(s * cores)) for s in shares}) if w != rule]
    physical = physical_cores() or cores
    threads = [t for t in sorted({max(1, int(s * physical)) for s in shares}) if t != rule]
    size, root = a.image_size, a.images_dir

    def loader(backend: str, workers: int, normalize_on: str = "cpu", cpu_share: float = 0.0):
        s = InputSettings(backend, batch=a.batch, image_size=size, num_workers=workers,
                          normalize_on=normalize_on, cpu_decode_share=cpu_share)
        if backend == "synthetic":  # nothing to wait for: the window would only time a loop
            return lambda: measure_loader(s, root, device=device, warmup=2, steps=a.loader_steps)
        return lambda: measure_loader(s, root, device=device, warmup=workers + 2,
                                      steps=a.loader_steps, min_seconds=a.min_seconds)

    def train(precision: str, backend: str, normalize_on: str = "cpu", cpu_share: float = 0.0,
              optimizer: str = "sgd"):
        s = InputSettings(backend, batch=a.batch, image_size=size, num_workers=rule,
                          normalize_on=normalize_on, cpu_decode_share=cpu_share)
        steps = max(3, a.train_steps // 2) if precision == "fp32" else a.train_steps  # 4-5x slower
        return lambda: measure_training(a.model, precision, s, root, device=device,
                                        warmup=rule + 2, steps=steps, min_seconds=a.min_seconds,
                                        optimizer=optimizer)

    inputs = [("synthetic", "cpu"), ("dali", "cpu"), ("gpu-decode", "cpu"),
              ("hw-decode", "cpu"), ("dataloader", "cpu"), ("dataloader", "gpu")]

    def label(backend: str, normalize_on: str) -> str:
        return f"{backend}{' uint8' if normalize_on == 'gpu' else ''}"

    rows = [("loader synthetic", loader("synthetic", rule)),
            ("loader dali", loader("dali", rule)),
            ("loader gpu-decode", loader("gpu-decode", rule)),
            ("loader hw-decode", loader("hw-decode", rule)),
            (f"loader dataloader {rule} workers", loader("dataloader", rule)),
            ("loader dataloader uint8", loader("dataloader", rule, "gpu"))]
    # the question first: each input feeding amp-fp16 at its best. GradScaler.step reads
    # found-inf on the host unless the optimizer is fused: a sync every step, which keeps the
    # host from queueing the next batch's work while the GPU trains
    rows += [(f"train amp-fp16 {label(b, n)} sgd-fused", train("amp-fp16", b, n, optimizer="sgd-fused"))
             for b, n in inputs]
    for precision in ("amp-fp16", "amp-bf16"):
        rows += [(f"train {precision} {label(b, n)}", train(precision, b, n)) for b, n in inputs]
    # decoders beside the GPU's: the CPU decodes a share of each batch, so that a GPU decoder
    # slower than the model alone (hw-decode's engines, on an H200) does not take all of it
    for backend in ("hw-decode", "gpu-decode"):
        hybrid = f"{backend} + {HYBRID_SHARE:.0%} CPU"
        rows += [(f"loader {hybrid}", loader(backend, rule, cpu_share=HYBRID_SHARE)),
                 (f"train amp-fp16 {hybrid} sgd-fused",
                  train("amp-fp16", backend, cpu_share=HYBRID_SHARE, optimizer="sgd-fused"))]
    rows += [(f"train fp32 {b}", train("fp32", b)) for b in ("synthetic", "dali", "gpu-decode", "dataloader")]
    rows += [(f"loader dataloader {w} workers", loader("dataloader", w)) for w in counts]
    rows += [(f"loader dali {t} threads", loader("dali", t)) for t in threads]
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argument_parser("input_pipeline", __doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="small_cnn, batch 16, 64 pixels, 48 images, few steps (a smoke test)")
    add_output_arguments(p, "input_pipeline_<gpu>",
                         "data/local/, or data/ with --replace; --quick: a temporary folder")
    p.add_argument("--images-dir", type=validate.argument(images_folder), default=None,
                   help="where the JPEG data set is made or reused (default: a folder under /tmp)")
    p.add_argument("--images", type=validate.argument(validate.count), default=None,
                   help="number of JPEG files (default 2048)")
    p.add_argument("--host-note", type=validate.argument(validate.text), default=None,
                   help="a sentence on the host for the result's meta (e.g. what else ran on it)")
    p.add_argument("--budget-s", type=validate.argument(validate.number, low=0, low_open=True),
                   default=400.0,
                   help="rows not started after this many seconds are recorded as skipped (a "
                        "row takes 7-15 s, fp32's first one about a minute more)")
    a = p.parse_args(argv)
    a.model, a.batch, a.image_size = ("small_cnn", 16, 64) if a.quick else ("resnet50", 256, 224)
    a.loader_steps, a.train_steps = (3, 4) if a.quick else (12, 20)
    a.min_seconds = 0.0 if a.quick else MIN_SECONDS
    a.images = a.images or (48 if a.quick else 2048)
    a.images_dir = a.images_dir or Path(tempfile.gettempdir()) / f"fp16lab_jpegs_{a.images}"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = a.name or default_name()
    out = a.out or (Path(tempfile.mkdtemp()) if a.quick else None)

    t0 = time.perf_counter()
    data = make_image_folder(a.images_dir, images=a.images, classes=10)
    print(f"data set: {data.images} JPEGs, mean {data.mean_kb:.0f} kB, "
          f"{'reused' if data.reused else 'made'} in {time.perf_counter() - t0:.1f} s at {data.root}")
    meta = {"benchmark": "fp16lab.bench.input_pipeline", "quick": a.quick, "protocol": protocol(a),
            "loader_steps": a.loader_steps, "train_steps": a.train_steps,
            "min_seconds": a.min_seconds, "budget_s": a.budget_s,
            "gpu_decode": {"producer_threads": GPU_DECODE_PRODUCERS, "depth": GPU_DECODE_DEPTH},
            "model": a.model, "batch": a.batch, "image_size": a.image_size,
            "cpu_cores": cpu_cores(), "physical_cores": physical_cores(),
            "default_workers": default_workers(),
            "data_set": {"images": data.images, "classes": data.classes, "size": data.size,
                         "quality": data.quality, "mean_kb": data.mean_kb}}
    if a.host_note:
        meta["host_note"] = a.host_note
    rows: list[dict[str, Any]] = []
    path = None
    for label, measure_row in plan(a, device):
        spent = time.perf_counter() - t0
        if spent > a.budget_s:
            rows.append({"label": label, "status": "skipped",
                         "error": f"time budget of {a.budget_s:.0f} s spent"})
        else:
            row = {"label": label, **measure_row()}
            rows.append(row)
            ips = row.get("images_per_s")
            print(f"{time.perf_counter() - t0:6.1f} s  {label:42s} {row['status']:7s} "
                  f"{'' if ips is None else f'{ips:8.0f} img/s'} {row['error'][:90]}", flush=True)
        path = write_result(name, rows, meta=meta, data_dir=out, replace=a.replace)  # a kill keeps what ran
    print()
    print(f"{'row':42s} {'status':7s} {'img/s':>8s} {'CPU cores':>9s} {'CPU %':>6s}")
    for r in rows:
        def fmt(v: Any, spec: str) -> str:
            return "" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)
        print(f"{r['label']:42s} {r['status']:7s} {fmt(r.get('images_per_s'), '8.0f'):>8s} "
              f"{fmt(r.get('cpu_cores_busy'), '9.1f'):>9s} {fmt(r.get('cpu_util_pct'), '6.0f'):>6s}")
    for line in summary_lines(rows):
        print(line)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

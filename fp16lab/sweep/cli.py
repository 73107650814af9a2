"""The ``fp16lab sweep`` and ``fp16lab report`` sub-commands."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..scaling import ScalerSettings
from .axes import BACKENDS, COMPILE_MODES, EXECUTIONS, SWEEP_PRECISIONS
from .engine import run_sweep
from .report import format_report
from .results import check_results_path, read_results
from .spec import LAYOUTS, SweepSpec, check_tolerance


def _split(text: str, kind: type = str) -> tuple[Any, ...]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        return tuple(kind(t) for t in items)
    except ValueError:
        raise ValueError(f"could not read {text!r} as a comma-separated list of {kind.__name__}")


def _on_off(text: str, flag: str = "--cudnn-benchmark") -> tuple[bool, ...]:
    table = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}
    bad = [t for t in _split(text) if t.lower() not in table]
    if bad:
        raise ValueError(f"{flag} takes on/off values, got {', '.join(bad)}")
    return tuple(table[t.lower()] for t in _split(text))


def _workers(text: str) -> tuple[int | None, ...]:
    """Reads --num-workers: integers, or 'auto' for 75% of the cores."""
    try:
        return tuple(None if t == "auto" else int(t) for t in _split(text))
    except ValueError:
        raise ValueError(f"--num-workers takes integers or 'auto' (75% of the cores), got {text!r}")


def _cmd_sweep(args: Any) -> int:
    scalers = tuple(
        ScalerSettings(init_scale=i, growth_factor=args.growth_factor,
                       backoff_factor=args.backoff_factor, growth_interval=args.growth_interval)
        for i in _split(args.init_scale, float))
    spec = SweepSpec(models=_split(args.model), batches=_split(args.batch, int),
                     layouts=_split(args.layout), precisions=_split(args.precision),
                     scalers=scalers, cudnn_benchmark=_on_off(args.cudnn_benchmark),
                     executions=_split(args.execution), compile_modes=_split(args.compile_mode),
                     inputs=_split(args.input), num_workers=_workers(args.num_workers),
                     pin_memory=_on_off(args.pin_memory, "--pin-memory"),
                     non_blocking=_on_off(args.non_blocking, "--non-blocking"),
                     normalize_on=_split(args.normalize_on), gpus=_split(args.gpus, int),
                     images_dir=args.images_dir, images=args.images, device=args.device,
                     warmup=args.warmup, steps=args.steps, repeats=args.repeats,
                     tolerance=args.tolerance, telemetry=not args.no_telemetry)
    check_results_path(args.out)
    n = len(spec.points())
    print(f"sweep: {n} points x {spec.repeats} repeats on {spec.resolved_device()}, "
          f"results appended to {args.out}")
    t0 = time.perf_counter()
    measured: list[dict[str, Any]] = []
    try:
        rows = run_sweep(spec, args.out, progress=True,
                         on_result=lambda row, done, total: measured.append(row))
    except KeyboardInterrupt:
        kept = len(read_results(args.out))
        print(f"\ninterrupted: {args.out} keeps {kept} finished rows; run the same command "
              f"again to resume")
        return 130
    earlier = len(rows) - len(measured)
    print(f"measured {len(measured)} rows in {time.perf_counter() - t0:.1f} s"
          + (f"; {earlier} rows were already in {args.out} (same points, {spec.warmup} warm-up "
             f"+ {spec.steps} steps), measured earlier, at the times in its finished_at column"
             if earlier else ""))
    print(format_report(rows))
    return 0


def _cmd_report(args: Any) -> int:
    p = Path(args.file)
    if args.tolerance is not None:
        check_tolerance(args.tolerance, "--tolerance")
    if not p.exists():
        raise FileNotFoundError(f"no results file {p}")
    rows = read_results(p)
    if not len(rows):
        raise ValueError(f"{p}: holds no rows yet")
    print(format_report(rows, args.tolerance))
    return 0


def register_cli(subparsers: Any) -> None:
    """Adds the ``sweep`` and ``report`` sub-commands to the fp16lab command line."""
    p = subparsers.add_parser("sweep", help="measure training steps over a grid (headless)")
    p.add_argument("--model", default="small_cnn", help=f"comma-separated; one of: "
                   f"{', '.join(__import__('fp16lab.models', fromlist=['MODELS']).MODELS)}")
    p.add_argument("--batch", default="8,16", help="comma-separated batch sizes, e.g. 64,128,256")
    p.add_argument("--layout", default="nchw", help=f"comma-separated; of {', '.join(LAYOUTS)}")
    p.add_argument("--precision", "--precisions", default="fp32",
                   help=f"comma-separated; of {', '.join(SWEEP_PRECISIONS)}")
    d = ScalerSettings()  # GradScaler's defaults, written once in fp16lab.scaling
    p.add_argument("--init-scale", default=f"{d.init_scale:g}",
                   help="comma-separated GradScaler init_scale")
    p.add_argument("--growth-factor", type=float, default=d.growth_factor)
    p.add_argument("--backoff-factor", type=float, default=d.backoff_factor)
    p.add_argument("--growth-interval", type=int, default=d.growth_interval)
    p.add_argument("--cudnn-benchmark", default="off", help="on, off or on,off")
    p.add_argument("--execution", default="eager",
                   help=f"comma-separated; of {', '.join(EXECUTIONS)}")
    p.add_argument("--compile-mode", default="default",
                   help=f"comma-separated torch.compile modes for --execution compile; of "
                        f"{', '.join(COMPILE_MODES)}")
    p.add_argument("--input", default="synthetic",
                   help=f"comma-separated; of {', '.join(BACKENDS)}")
    p.add_argument("--images-dir", default=None,
                   help="image folder the file inputs read (written first if it holds no images)")
    p.add_argument("--images", type=int, default=SweepSpec.images,
                   help="JPEGs to write into an empty --images-dir")
    p.add_argument("--num-workers", default="auto",
                   help="comma-separated input workers; 'auto' is 75%% of the cores")
    p.add_argument("--pin-memory", default="on", help="dataloader input: on, off or on,off")
    p.add_argument("--non-blocking", default="on", help="dataloader input: on, off or on,off")
    p.add_argument("--normalize-on", default="cpu", help="dataloader input: cpu, gpu or cpu,gpu")
    p.add_argument("--gpus", default="1",
                   help="comma-separated GPU counts, 1 up to the GPUs torch sees, e.g. 1,2 "
                        "(batch is per GPU)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every point")
    p.add_argument("--tolerance", type=float, default=0.03,
                   help="flag a point whose repeat medians differ by more than this fraction")
    p.add_argument("--no-telemetry", action="store_true", help="do not sample NVML")
    p.add_argument("--out", required=True, help="results file (.parquet; a .csv copy is written)")
    p.set_defaults(func=_cmd_sweep)

    r = subparsers.add_parser("report", help="print a sweep's results file as a table")
    r.add_argument("file", help="a .parquet (or .csv) file written by `fp16lab sweep`")
    r.add_argument("--tolerance", type=float, default=None,
                   help="repeat-spread tolerance for the UNSTABLE flag (default: the sweep's)")
    r.set_defaults(func=_cmd_report)

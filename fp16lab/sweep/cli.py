"""The ``fp16lab sweep`` and ``fp16lab report`` sub-commands."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..recipes import PRECISIONS
from ..scaling import ScalerSettings
from .engine import run_sweep
from .report import format_report
from .results import read_results
from .spec import LAYOUTS, SweepSpec

def _split(text: str, kind: type = str) -> tuple[Any, ...]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        return tuple(kind(t) for t in items)
    except ValueError:
        raise ValueError(f"could not read {text!r} as a comma-separated list of {kind.__name__}")


def _on_off(text: str) -> tuple[bool, ...]:
    table = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}
    bad = [t for t in _split(text) if t.lower() not in table]
    if bad:
        raise ValueError(f"--cudnn-benchmark takes on/off values, got {', '.join(bad)}")
    return tuple(table[t.lower()] for t in _split(text))


def _cmd_sweep(args: Any) -> int:
    scalers = tuple(
        ScalerSettings(init_scale=i, growth_factor=args.growth_factor,
                       backoff_factor=args.backoff_factor, growth_interval=args.growth_interval)
        for i in _split(args.init_scale, float))
    spec = SweepSpec(models=_split(args.model), batches=_split(args.batch, int),
                     layouts=_split(args.layout), precisions=_split(args.precision),
                     scalers=scalers, cudnn_benchmark=_on_off(args.cudnn_benchmark),
                     device=args.device, warmup=args.warmup, steps=args.steps,
                     repeats=args.repeats, tolerance=args.tolerance,
                     telemetry=not args.no_telemetry)
    n = len(spec.points())
    print(f"sweep: {n} points x {spec.repeats} repeats on {spec.resolved_device()}, "
          f"results appended to {args.out}")
    t0 = time.perf_counter()
    try:
        rows = run_sweep(spec, args.out, progress=True)
    except KeyboardInterrupt:
        kept = len(read_results(args.out))
        print(f"\ninterrupted: {args.out} keeps {kept} finished rows; run the same command "
              f"again to resume")
        return 130
    print(f"took {time.perf_counter() - t0:.1f} s")
    print(format_report(rows))
    return 0


def _cmd_report(args: Any) -> int:
    p = Path(args.file)
    if not p.exists():
        raise FileNotFoundError(f"no results file {p}")
    print(format_report(read_results(p), args.tolerance))
    return 0


def register_cli(subparsers: Any) -> None:
    """Adds the ``sweep`` and ``report`` sub-commands to the fp16lab command line."""
    p = subparsers.add_parser("sweep", help="measure training steps over a grid (headless)")
    p.add_argument("--model", default="small_cnn", help=f"comma-separated; one of: "
                   f"{', '.join(__import__('fp16lab.models', fromlist=['MODELS']).MODELS)}")
    p.add_argument("--batch", default="8,16", help="comma-separated batch sizes, e.g. 64,128,256")
    p.add_argument("--layout", default="nchw", help=f"comma-separated; of {', '.join(LAYOUTS)}")
    p.add_argument("--precision", default="fp32",
                   help=f"comma-separated; of {', '.join(PRECISIONS)}")
    d = ScalerSettings()  # GradScaler's defaults, written once in fp16lab.scaling
    p.add_argument("--init-scale", default=f"{d.init_scale:g}",
                   help="comma-separated GradScaler init_scale")
    p.add_argument("--growth-factor", type=float, default=d.growth_factor)
    p.add_argument("--backoff-factor", type=float, default=d.backoff_factor)
    p.add_argument("--growth-interval", type=int, default=d.growth_interval)
    p.add_argument("--cudnn-benchmark", default="off", help="on, off or on,off")
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

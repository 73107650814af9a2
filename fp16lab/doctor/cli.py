"""``fp16lab doctor NAME``: the doctor from a shell; the report goes to a folder."""

from __future__ import annotations

import argparse

from .. import validate
from ..recipes import PRECISIONS
from ..workload import LAYOUTS, workload_name
from . import doctor
from .checks import CHECKS


def _run(args: argparse.Namespace) -> int:
    report = doctor(args.workload, args.device, batch_size=args.batch_size,
                    precision=args.precision, layout=args.layout, budget_s=args.budget_min * 60,
                    checks=args.checks, progress=not args.no_progress)
    paths = report.write(args.out)
    first = report.first
    print(f"first finding: {first.title}" if first else "no finding")
    if report.combined_gain is not None:
        print(f"all changes together: {report.combined.config.describe()}, "
              f"{report.combined_gain:.2f}x the samples/s of the start")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="measure a workload, say what to change, prove each gain",
                       description="Runs the mixed-precision doctor on a workload and writes "
                                   "its report (Markdown, JSON, a plot) to --out.")
    p.add_argument("workload", type=validate.argument(workload_name),
                   help="a built-in workload (bert-base, gpt2-small, ...) or package.module:factory")
    p.add_argument("--device", default=None, type=validate.argument(validate.device),
                   help="cuda or cpu (default: the GPU where torch sees one)")
    p.add_argument("--batch-size", default=32, type=validate.argument(validate.count),
                   help="the batch it trains at now (default 32)")
    p.add_argument("--precision", default="fp32", type=validate.argument(validate.choice,
                                                                         list(PRECISIONS)),
                   help="the precision it trains in now (default fp32)")
    p.add_argument("--layout", default="nchw", type=validate.argument(validate.choice, LAYOUTS),
                   help="the memory layout it trains in now")
    p.add_argument("--budget-min", default=5.0,
                   type=validate.argument(validate.number, low=0, low_open=True),
                   help="minutes the checks may take (default 5)")
    p.add_argument("--checks", default=None,
                   type=validate.argument(validate.choice, list(CHECKS), many=True),
                   help=f"comma-separated checks (default all: {','.join(CHECKS)})")
    p.add_argument("--out", default="doctor-report", type=validate.argument(validate.output_dir),
                   help="folder for the report (default ./doctor-report)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)

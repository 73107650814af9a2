"""The ``fp16lab claims`` sub-command: check the claims headless and write the verdict table."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from .. import validate
from ..device import has_gpu
from .report import claims_folder, write_claims
from .run import CLAIMS, check_all, get_claim


def run(args: argparse.Namespace) -> int:
    """Returns 0 after checking the claims ``args`` name (see :func:`add_arguments`), printing the
    verdict table and writing claims_<device>.md and .json."""
    ids = None if args.only is None else [get_claim(i).id for i in args.only]
    folder = claims_folder(args.out)  # before any claim runs
    quick = args.quick or not has_gpu()
    t0 = time.perf_counter()
    checked = check_all(ids, quick=quick, data_dir=args.data, progress=True)
    elapsed = time.perf_counter() - t0
    md, js = write_claims(checked, folder, quick=quick, elapsed_s=round(elapsed, 1))
    for c in checked:
        if "error" in c.figures:
            print(f"claim {c.id} failed: {c.figures['error']}", file=sys.stderr)
    width = max(len(c.short) for c in checked)
    print(f"\n{'#':>2}  {'claim':<{width}}  verdict")
    for c in checked:
        print(f"{c.id:>2}  {c.short:<{width}}  {c.verdict}")
    print(f"\n{len(checked)} claims in {elapsed:.0f} s; wrote {md} and {js}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Adds the options of ``fp16lab claims`` (--quick, --out, --data, --only) to ``p``."""
    p.add_argument("--quick", action="store_true",
                   help="small sizes (always on without a GPU)")
    p.add_argument("--out", type=validate.argument(validate.output_dir), default=None,
                   help="folder for claims_<device>.md/.json (default: data/local/)")
    p.add_argument("--data", type=validate.argument(validate.existing_dir), default=None,
                   help="folder holding the recorded GPU run shown for GPU-only claims on a CPU "
                        "(default: data/local/, then data/)")
    p.add_argument("--only", default=None,
                   type=validate.argument(validate.count, high=len(CLAIMS), many=True),
                   help="comma-separated claim numbers, e.g. 1,6,8")


def register_cli(subparsers: Any) -> None:
    """Adds ``fp16lab claims`` to the command line."""
    p = subparsers.add_parser(
        "claims", help="check popular mixed-precision claims on this device; write the table")
    add_arguments(p)
    p.set_defaults(func=run)

"""The ``fp16lab`` console command.

``fp16lab info`` prints what this machine has; ``fp16lab bench NAME`` runs one benchmark of
:mod:`fp16lab.bench`. Other modules add sub-commands by defining ``register_cli(subparsers)``;
they are listed in ``_COMMAND_MODULES``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from pathlib import Path

from .bench import BENCHMARKS
from .device import device_info

# Modules that contribute sub-commands (sweep, report, claims).
_COMMAND_MODULES = ("fp16lab.sweep.cli", "fp16lab.claims.cli", "fp16lab.doctor.cli")


def _info(args: argparse.Namespace) -> int:
    info = device_info()
    print(json.dumps(info.as_dict(), indent=2) if args.json else info.summary())
    return 0


def _bench(args: argparse.Namespace) -> int:
    if args.list or not args.name:
        width = max(map(len, BENCHMARKS))
        for name, what in BENCHMARKS.items():
            print(f"{name:{width}}  {what}")
        return 0 if args.list else 2
    if args.name not in BENCHMARKS:
        raise ValueError(f"no benchmark {args.name!r}; the benchmarks are: {', '.join(BENCHMARKS)}")
    module = importlib.import_module(f"fp16lab.bench.{args.name}")
    return int(module.main(args.args) or 0)


def build_parser() -> argparse.ArgumentParser:
    """Returns the argument parser with every available sub-command."""
    parser = argparse.ArgumentParser(
        prog="fp16lab", description="FP16 and mixed-precision workbook: tools behind the notebooks.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("info", help="what this machine has: GPU, driver, CUDA, CuPy")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=_info)
    p = sub.add_parser("bench", help="run one benchmark (--list names them); writes data/local/",
                       description="Runs a benchmark of fp16lab.bench; the arguments after NAME "
                                   "go to it (--quick, --replace, ... ; NAME --help lists them).")
    p.add_argument("--list", action="store_true", help="list the benchmarks and what they measure")
    p.add_argument("name", nargs="?", metavar="NAME")
    p.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")
    p.set_defaults(func=_bench)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register_cli(sub)
    return parser


_VALIDATE = str(Path(__file__).with_name("validate.py"))


def is_user_error(exc: BaseException) -> bool:
    """Returns True for what a user's own value or machine causes, shown as one line, not a traceback.

    That is a ValueError (a value that does not apply), an OSError (a path that cannot be read or
    written, a full disk) and a TypeError raised by :mod:`fp16lab.validate` (a value of the wrong
    kind). Any other exception, a TypeError from a bug included, is a bug and keeps its traceback.
    """
    if isinstance(exc, (ValueError, OSError)):
        return True
    if isinstance(exc, TypeError):
        frames = traceback.extract_tb(exc.__traceback__)
        return bool(frames) and frames[-1].filename == _VALIDATE
    return False


def main(argv: list[str] | None = None) -> int:
    """Runs the command line and returns its exit status (2, with one line, for a user error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0), or a refused value: usage and one line (2)
        return int(exit_.code or 0)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except Exception as e:  # the one place every sub-command's user errors become one line
        if not is_user_error(e):
            raise
        print(f"fp16lab {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

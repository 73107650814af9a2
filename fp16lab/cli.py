"""The ``fp16lab`` console command.

``fp16lab info`` prints what this machine has. Other modules add sub-commands by defining
``register_cli(subparsers)``; they are listed in ``_COMMAND_MODULES``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# Modules that contribute sub-commands (sweep, report, claims, ...), imported when present.
_COMMAND_MODULES = ("fp16lab.sweep", "fp16lab.claims")


def _info(args: argparse.Namespace) -> int:
    from .device import device_info

    info = device_info()
    print(json.dumps(info.as_dict(), indent=2) if args.json else info.summary())
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Returns the argument parser with every available sub-command."""
    parser = argparse.ArgumentParser(
        prog="fp16lab", description="FP16 and mixed-precision workbook: tools behind the notebooks.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("info", help="what this machine has: GPU, driver, CUDA, CuPy")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=_info)
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue  # not written yet
            raise
        module.register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the command line and returns its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"fp16lab {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

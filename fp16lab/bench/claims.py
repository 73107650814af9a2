"""Checks the twelve popular mixed-precision claims on this device and writes the verdict table.

The same as ``fp16lab claims``: runs every experiment in fp16lab.claims, prints a short verdict
table last, and writes claims_<device>.md and claims_<device>.json (figures, verdicts, device,
driver and versions) to data/local/, or to the committed data/ with ``--replace``.

    python -m fp16lab.bench.claims              # full sizes on a GPU (about 3 min on an H200)
    python -m fp16lab.bench.claims --quick      # small sizes (always so on a CPU)
"""

from __future__ import annotations

import sys

from fp16lab import measure
from fp16lab.bench import argument_parser
from fp16lab.claims import cli as claims_cli


def main(argv: list[str] | None = None) -> int:
    """Runs ``fp16lab claims`` writing into this machine's results folder (or data/ with --replace)."""
    p = argument_parser("claims", __doc__.splitlines()[0])
    claims_cli.add_arguments(p)
    p.add_argument("--replace", action="store_true",
                   help="write the committed files in data/ (default: --out, else data/local/)")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = measure.data_dir() if args.replace else measure.local_dir()
    try:
        return claims_cli.run(args)
    except (ValueError, FileNotFoundError) as e:  # as fp16lab claims reports them
        print(f"fp16lab bench claims: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

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
from fp16lab.cli import main as cli_main


def main(argv: list[str] | None = None) -> int:
    """Runs ``fp16lab claims`` writing into this machine's results folder (or data/ with --replace)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    replace = "--replace" in argv
    argv = [a for a in argv if a != "--replace"]
    if "--out" not in argv:
        argv += ["--out", str(measure.data_dir() if replace else measure.local_dir())]
    return cli_main(["claims", *argv])


if __name__ == "__main__":
    sys.exit(main())

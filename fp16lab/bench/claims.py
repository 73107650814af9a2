"""Checks the twelve popular mixed-precision claims on this device and writes the verdict table.

The same as ``python3 -m fp16lab.cli claims``: runs every experiment in fp16lab.claims, prints a
short verdict table last, and writes data/claims_<device>.md and data/claims_<device>.json
(figures, verdicts, device, driver and versions).

    PYTHONPATH=. python3 benchmarks/claims.py              # full sizes on a GPU (about 3 min on an H200)
    PYTHONPATH=. python3 benchmarks/claims.py --quick      # small sizes (always so on a CPU)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fp16lab.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["claims", *sys.argv[1:]]))

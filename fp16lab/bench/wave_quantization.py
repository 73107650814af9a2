"""Tile and wave quantization measured: a Linear(4096, 4096) in fp16 at every batch from 64 to 2048.

For each batch M (a step of 32 by default): the forward ``F.linear`` in fp16, CUDA-event median
after a warm-up, TFLOP/s, the kernel cuBLAS ran (torch.profiler), the tile its name states, and
the tiles and waves on this GPU's SMs (:mod:`fp16lab.waves`). Results go to
``wave_quantization_<gpu>.json`` (data/local/, or data/ with ``--replace``).

    python -m fp16lab.bench.wave_quantization            # M = 64..2048 step 32 (about 1 min)
    python -m fp16lab.bench.wave_quantization --quick    # M in 128, 256, 320
"""

from __future__ import annotations

import re
import sys
from typing import Any

from fp16lab.measure import cuda_kernels, cuda_missing, time_cuda, write_result
from fp16lab import waves
from fp16lab.bench import argument_parser

#: The Linear layer measured (in and out features), and the default batch range.
FEATURES = 4096
BATCHES = tuple(range(64, 2048 + 1, 32))


def gpu_slug() -> str:
    """Returns a short name of this GPU for the file name ('h200' on an H200)."""
    import torch

    name = torch.cuda.get_device_name()
    return "h200" if "H200" in name else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def measure(batches: tuple[int, ...] = BATCHES, *, features: int = FEATURES, warmup: int = 10,
            repeat: int = 50) -> list[dict[str, Any]]:
    """Returns one row per batch: time, TFLOP/s, cuBLAS's kernel and tile, tiles and waves (CUDA)."""
    import torch
    import torch.nn.functional as F

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    w = torch.randn(features, features, device="cuda", dtype=torch.float16)
    rows = []
    for m in batches:
        x = torch.randn(m, features, device="cuda", dtype=torch.float16)
        fn = lambda: F.linear(x, w)  # noqa: E731
        t = time_cuda(fn, warmup=warmup, repeat=repeat)
        names = [n for n, _ in cuda_kernels(fn)]
        kernel = next((n for n in names if waves.tile_from_kernel(n)), names[0] if names else "")
        tile = waves.tile_from_kernel(kernel)
        row = {"batch": m, "n": features, "k": features, "median_ms": t.median_ms,
               "spread": t.spread, "tflops": 2 * m * features * features / (t.median_ms * 1e-3) / 1e12,
               "kernel": kernel, "sms": sms, "tile_m": None, "tile_n": None, "tiles": None,
               "waves": None, "efficiency": None}
        if tile:
            tiles = waves.tile_count(m, features, *tile)
            row.update(tile_m=tile[0], tile_n=tile[1], tiles=tiles,
                       waves=waves.wave_count(tiles, sms),
                       efficiency=waves.efficiency(m, features, *tile, sms))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argument_parser("wave_quantization", __doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="three batches only")
    p.add_argument("--replace", action="store_true",
                   help="write the committed file in data/ instead of data/local/")
    args = p.parse_args(argv)
    why = cuda_missing("fp16lab.bench.wave_quantization")
    if why:
        print(why, file=sys.stderr)
        return 2
    batches = (128, 256, 320) if args.quick else BATCHES
    rows = measure(batches, repeat=10 if args.quick else 50)
    path = write_result(f"wave_quantization_{gpu_slug()}", rows,
                              meta={"benchmark": "fp16lab.bench.wave_quantization",
                                    "features": FEATURES, "dtype": "float16"},
                              replace=args.replace)
    print(f"\nwrote {path}\n\n{'batch':>6s} {'TFLOP/s':>8s} {'tile':>8s} {'tiles':>6s} {'waves':>5s} "
          f"{'eff.':>5s}  kernel")
    for r in rows:
        tile = f"{r['tile_m']}x{r['tile_n']}" if r["tile_m"] else "-"
        eff = f"{r['efficiency']:.2f}" if r["efficiency"] is not None else "-"
        print(f"{r['batch']:6d} {r['tflops']:8.1f} {tile:>8s} {r['tiles'] or '-':>6} "
              f"{r['waves'] or '-':>5} {eff:>5s}  {r['kernel'][:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

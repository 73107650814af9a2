"""Tile and wave quantization: how a GEMM's output splits into tiles, and the tiles into waves on the SMs.

A GEMM kernel cuts its output C (M x N) into tiles of ``tile_m x tile_n``; each tile is one
thread block, and the GPU runs one block per SM at a time for the large tiles cuBLAS picks. So a
product with ``tiles`` tiles on a GPU with ``sms`` SMs runs in ``ceil(tiles / sms)`` *waves*, and
the last wave may leave most SMs idle (wave quantization). A tile that sticks out past M or N
costs as much as a full one (tile quantization). Both waste the same thing, SM time, and
:func:`efficiency` counts it::

    efficiency = M * N / (waves * sms * tile_m * tile_n)

By this count, while every tile fits in one wave the call takes about one tile's time whatever
M is: for a ``Linear(4096, 4096)`` on an H200 (132 SMs) with 256x128 tiles, batch 256 makes 32
tiles and batch 320 makes 64, both one wave. That is the model's prediction, not a measurement:
a GEMM that is not compute-bound at these sizes (a batch-256 Linear sits near the roofline's
ridge) follows it only partly, and notebook 03 sets it against measured rates.
"""

from __future__ import annotations

import math
import re

__all__ = ["H200_SMS", "efficiency", "tile_count", "tile_from_kernel", "wave_count"]

#: The SM count of an NVIDIA H200 (NVIDIA's specification; the measured file records it too).
H200_SMS = 132

_TILE = re.compile(r"(?:nvjet_sm\d+a?_\w+?_|_)(\d+)x(\d+)(?:_|x\d)")


def _positive(**values: int) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def tile_count(m: int, n: int, tile_m: int, tile_n: int) -> int:
    """Returns the number of output tiles: ``ceil(m / tile_m) * ceil(n / tile_n)``."""
    _positive(m=m, n=n, tile_m=tile_m, tile_n=tile_n)
    return math.ceil(m / tile_m) * math.ceil(n / tile_n)


def wave_count(tiles: int, sms: int, tiles_per_sm: int = 1) -> int:
    """Returns how many waves ``tiles`` blocks take on ``sms`` SMs running ``tiles_per_sm`` each."""
    _positive(tiles=tiles, sms=sms, tiles_per_sm=tiles_per_sm)
    return math.ceil(tiles / (sms * tiles_per_sm))


def efficiency(m: int, n: int, tile_m: int, tile_n: int, sms: int, tiles_per_sm: int = 1) -> float:
    """Returns the share of the provisioned SM-tile slots that hold useful output elements."""
    waves = wave_count(tile_count(m, n, tile_m, tile_n), sms, tiles_per_sm)
    return m * n / (waves * sms * tiles_per_sm * tile_m * tile_n)


def tile_from_kernel(name: str) -> tuple[int, int] | None:
    """Returns the (tile_m, tile_n) a cuBLAS or CUTLASS kernel name states, or None if it states none.

    cuBLAS's Hopper kernels are named like ``nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNN``
    (a 256x128 tile, K slices of 64, 4 stages); CUTLASS kernels carry ``..._128x256_32x3_...``.
    """
    m = _TILE.search(name)
    return (int(m.group(1)), int(m.group(2))) if m else None

"""A sweep point on several GPUs: measured in fp16lab.distributed's torchrun ranks, sweep columns.

The point becomes a :class:`fp16lab.distributed.DistPoint` (DDP, ``gradient_as_bucket_view``,
no comm hook: PyTorch's defaults) with the sweep's warm-up and timed steps; its ranks train
``batch`` samples each, on synthetic batches. A rank that raises or hangs past
``fp16lab.distributed.DEFAULT_TIMEOUT_S`` ends the point as ``error`` with the rank's message,
and the sweep goes on. The row's step time is the slowest rank's median; ``samples_per_s``
counts every GPU's samples; ``per_rank`` holds each rank's figures as JSON.
"""

from __future__ import annotations

import json
from typing import Any

from .. import distributed
from .point import Point


def measure_on_gpus(point: Point, *, warmup: int, steps: int,
                    timeout_s: float | None = None) -> dict[str, Any]:
    """Returns the row columns of one repeat of a ``gpus > 1`` point, with status and error."""
    dp = distributed.DistPoint(model=point.model, batch=point.batch, precision=point.precision,
                               gpus=point.gpus, layout=point.layout, device=point.device,
                               warmup=warmup, steps=steps)
    got = distributed.measure_point(dp, timeout_s=timeout_s or distributed.DEFAULT_TIMEOUT_S)
    status = got.get("status") or "error"
    out: dict[str, Any] = {
        "status": status, "error": got.get("error") or "",
        "telemetry_note": f"{point.gpus} torchrun ranks: no NVML telemetry sampled",
        "memory_note": "the largest peak of any rank",
    }
    if status != "ok":
        return out
    median = float(got["step_ms_median"])
    per_rank = got.get("per_rank") or []
    peak = got.get("peak_memory_gib")
    out.update({
        "step_ms_median": median,
        "samples_per_s": point.gpus * point.batch / (median / 1e3),
        "peak_mem_allocated_mb": None if peak is None else float(peak) * 1024,
        "per_rank": json.dumps(per_rank),
    })
    return out

"""The sweep's results file: its columns, and appending and reading rows atomically (parquet + CSV)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

#: What a results row's ``status`` can be.
STATUSES = ("ok", "oom", "error")

#: Provenance columns copied from fp16lab.device.metadata() into every row.
META_COLUMNS = ("gpu_name", "compute_capability", "driver_version", "cuda_driver_version",
                "cuda_runtime_version", "torch", "cudnn", "host", "python")

#: Every row's columns, in order.
ROW_COLUMNS = (
    "key", "model", "batch", "layout", "precision", "init_scale", "growth_factor",
    "backoff_factor", "growth_interval", "cudnn_benchmark", "device", "repeat", "status",
    "error", "warmup", "steps", "tolerance", "step_ms_median", "step_ms_p10", "step_ms_p90",
    "spread", "samples_per_s", "peak_mem_allocated_mb", "peak_mem_reserved_mb", "memory_note",
    "final_scale", "skipped_steps", "final_loss", "telemetry_samples", "gpu_busy_mean",
    "gpu_busy_max", "mem_busy_mean", "mem_busy_max", "sm_clock_mhz_mean", "sm_clock_mhz_max",
    "power_w_mean", "power_w_max", "telemetry_note", "elapsed_s", "finished_at", *META_COLUMNS,
)


def _csv_path(path: Path) -> Path:
    return path.with_suffix(".csv")


def read_results(path: str | Path) -> pd.DataFrame:
    """Returns the rows of a results file (parquet, or its CSV export); empty if it is absent."""
    p = Path(path)
    if not p.exists():
        return pd.DataFrame(columns=list(ROW_COLUMNS))
    if p.suffix == ".csv":
        return pd.read_csv(p)
    return pd.read_parquet(p)


def _atomic_write(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    if path.suffix == ".csv":
        df.to_csv(tmp, index=False)
    else:
        df.to_parquet(tmp, index=False)
    os.replace(tmp, path)  # a reader never sees half a file, an interrupt never leaves one


def append_rows(path: str | Path, rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Appends rows to a parquet results file (and rewrites its CSV copy); returns all rows."""
    p = Path(path)
    if p.suffix != ".parquet":
        raise ValueError(f"a results file must end in .parquet (a .csv copy is written beside "
                         f"it), got {p}")
    p.parent.mkdir(parents=True, exist_ok=True)
    new = pd.DataFrame([{c: r.get(c) for c in ROW_COLUMNS} for r in rows], columns=list(ROW_COLUMNS))
    old = read_results(p)
    frames = [f for f in (old, new) if len(f)]
    df = pd.concat(frames, ignore_index=True) if frames else new
    _atomic_write(df, p)
    _atomic_write(df, _csv_path(p))
    return df

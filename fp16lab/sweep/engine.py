"""Running a sweep: each point's training step measured, repeats interleaved, every row saved at once.

How one point is measured:

1. build a fresh model and batch, run ``warmup`` steps (cuDNN picks algorithms, the caching
   allocator fills, clocks rise);
2. time ``steps`` steps back to back, with CUDA events between consecutive steps on a GPU
   (so gaps between steps count) and ``time.perf_counter`` on a CPU;
3. report the median step time and its 10th-90th percentile spread, samples/s, peak memory
   allocated and reserved, the final loss scale and how many steps the scaler skipped, and GPU
   telemetry sampled by :class:`fp16lab.telemetry.TelemetrySampler` during the timed steps.

A CUDA out-of-memory point is recorded with status ``oom`` and its memory released; any other
failure is recorded with its message; re-running the same sweep skips what the file holds.

The step itself comes from :mod:`.steps` (recipe or FP8 recipe, execution mode, input
pipeline: with a file input, the timed steps include waiting for the next batch, and the
warm-up is at least ``num_workers + 2`` steps, recorded as ``input_warmup``). A point with ``gpus > 1`` is measured by
:mod:`.multi_gpu` in torchrun ranks, with the same warm-up and timed steps.
"""

from __future__ import annotations

import gc
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from .. import models  # a module, not names: tests replace its functions
from ..device import metadata
from ..inputs import dataset  # a module too: tests replace its image-folder makers
from ..measure import step_times_ms, summarize
from ..recipes import LR, MOMENTUM, math_flags
from ..telemetry import TelemetrySampler
from .multi_gpu import measure_on_gpus
from .results import (MEASUREMENT, META_COLUMNS, ROW_COLUMNS, append_rows, check_results_path,
                      claim, drop_duplicate_measurements, read_results, release)
from .point import Point
from .spec import SweepSpec, check_images_dir
from .steps import build_step, build_workload_step, input_warmup

__all__ = ["LR", "MOMENTUM", "FaultInjector", "is_oom", "measure_point", "run_sweep"]

#: Called before every training step as fault_injector(point, repeat, step_index); tests use
#: it to raise an out-of-memory error or an interrupt from inside a point.
FaultInjector = Callable[[Point, int, int], None]

#: What torch's allocators say when memory runs out (CUDA, the CPU allocator on Linux, Windows).
_OOM_WORDS = ("out of memory", "can't allocate memory", "not enough memory")


def is_oom(exc: BaseException) -> bool:
    """Returns True when an exception is an out-of-memory error (CUDA or host).

    On the host, torch's CPU allocator raises a RuntimeError saying "DefaultCPUAllocator: can't
    allocate memory" (Linux) or "not enough memory" (Windows), not "out of memory".
    """
    import torch

    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(w in text for w in _OOM_WORDS)


class _ScaleHistory:
    """Records the loss scale after every step without a host sync, to count skipped steps."""

    def __init__(self, scaler: Any):
        self.scaler = scaler
        self.values: list[Any] = []

    def record(self) -> None:
        if self.scaler is None:
            return
        t = getattr(self.scaler, "_scale", None)  # GradScaler's scale tensor, on the device
        # get_scale() would force a GPU sync each step and distort the timing; clone() does not
        self.values.append(t.clone() if t is not None else self.scaler.get_scale())

    def final_and_skipped(self, init_scale: float) -> tuple[float | None, int | None]:
        """Returns (final scale, number of steps whose update lowered the scale)."""
        if self.scaler is None:
            return None, None
        xs = [init_scale] + [float(v) for v in self.values]
        skipped = sum(1 for i in range(1, len(xs)) if xs[i] < xs[i - 1])
        return xs[-1], skipped


def _run_point(point: Point, *, warmup: int, steps: int, telemetry: bool, interval_s: float,
               repeat: int, fault_injector: FaultInjector | None) -> dict[str, Any]:
    """Returns the measurements of one repeat of one point (raises on OOM and other failures)."""
    import torch

    dev = point.device
    torch.manual_seed(1234 + repeat)
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    if point.workload is not None:
        return _measure_built(point, build_workload_step(point, seed=1234 + repeat), warmup=warmup,
                              steps=steps, telemetry=telemetry, interval_s=interval_s,
                              repeat=repeat, fault_injector=fault_injector)
    model = models.build_model(point.model).to(dev)
    x = torch.randn(models.input_shape(point.model, point.batch), device=dev)
    y = torch.randint(0, models.NUM_CLASSES, (point.batch,), device=dev)
    if point.layout == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return _measure_built(point, build_step(point, model, x, y), warmup=warmup, steps=steps,
                          telemetry=telemetry, interval_s=interval_s, repeat=repeat,
                          fault_injector=fault_injector)


def _measure_built(point: Point, built: Any, **timing: Any) -> dict[str, Any]:
    try:
        measured = _time_steps(point, built, **timing)
    finally:
        built.close()
    return {**measured, **built.columns, **built.finish()}


def _time_steps(point: Point, built: Any, *, warmup: int, steps: int, telemetry: bool,
                interval_s: float, repeat: int,
                fault_injector: FaultInjector | None) -> dict[str, Any]:
    """Returns the timings, memory, scaler and telemetry of ``steps`` steps after ``warmup``."""
    import torch

    dev = point.device
    cuda = dev == "cuda"
    step = built.step
    history = _ScaleHistory(built.scaler)
    calls, loss = 0, None

    def one() -> None:
        nonlocal calls, loss
        if fault_injector is not None:
            fault_injector(point, repeat, calls)
        calls += 1
        loss = step()
        history.record()

    for _ in range(warmup):
        one()
    sampler = TelemetrySampler(enabled=telemetry and cuda, interval_s=interval_s)
    if not cuda and telemetry:
        sampler.note = "CPU run: no GPU telemetry"
    if cuda:
        torch.cuda.synchronize()  # the warm-up finishes before the sampler starts
    sampler.start()
    try:
        times = step_times_ms(one, steps, dev)
    finally:  # a failure mid-point must not leave the sampler thread running
        tele = sampler.stop()
    if cuda:
        peak_alloc = torch.cuda.max_memory_allocated() / 2**20
        peak_res = torch.cuda.max_memory_reserved() / 2**20
        mem_note = ""
    else:
        peak_alloc = peak_res = None
        mem_note = "CPU run: torch keeps no peak-memory counter for host allocations"
    timing = summarize(times)
    final_scale, skipped = history.final_and_skipped(point.scaler.init_scale if point.scaler else 1.0)
    return {
        "step_ms_median": timing.median_ms, "step_ms_p10": timing.p10_ms,
        "step_ms_p90": timing.p90_ms, "spread": timing.spread,
        "samples_per_s": point.batch / (timing.median_ms / 1e3),
        "peak_mem_allocated_mb": peak_alloc, "peak_mem_reserved_mb": peak_res,
        "memory_note": mem_note, "final_scale": final_scale, "skipped_steps": skipped,
        "final_loss": float(loss.detach().float()), **tele.as_dict(),
    }


_META_CACHE: dict[str, Any] = {}


def _provenance() -> dict[str, Any]:
    if not _META_CACHE:
        meta = metadata()
        _META_CACHE.update({k: meta.get(k) for k in META_COLUMNS})
        if _META_CACHE.get("cudnn") is not None:
            _META_CACHE["cudnn"] = str(_META_CACHE["cudnn"])
    return dict(_META_CACHE)


def _drop_inner_frames(exc: BaseException) -> None:
    """Cuts an exception's traceback below the current frame.

    Whoever catches an exception keeps its traceback, and with it the frames (and the closures
    of their functions) that hold the point's model, optimizer and activations; cutting the
    traceback here lets that memory go now instead of when the exception is dropped.
    """
    if exc.__traceback__ is not None:
        exc.__traceback__.tb_next = None


def _release_memory() -> None:
    """Frees what a finished or failed point left: unreachable objects, then cached GPU blocks."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def measure_point(point: Point, *, repeat: int = 0, warmup: int = 3, steps: int = 10,
                  tolerance: float = 0.03, telemetry: bool = True, interval_s: float = 0.05,
                  fault_injector: FaultInjector | None = None) -> dict[str, Any]:
    """Returns one results row for one repeat of a point, with status 'ok', 'oom' or 'error'.

    An out-of-memory error or any other exception is caught and recorded in the row; the
    point's model, optimizer and tensors are then released (``gc.collect`` and
    ``torch.cuda.empty_cache``) so the next point starts from the same memory level.
    ``KeyboardInterrupt`` is re-raised after the same release.
    """
    row: dict[str, Any] = dict.fromkeys(ROW_COLUMNS)
    row.update(point.settings(), key=point.key, repeat=repeat, warmup=warmup, steps=steps,
               tolerance=tolerance, error="")
    t0 = time.perf_counter()
    status, error = "ok", ""
    try:
        if point.gpus > 1:
            measured = measure_on_gpus(point, warmup=warmup, steps=steps)
            status, error = measured.pop("status"), measured.pop("error")
            row.update(measured)
        else:
            warmup = input_warmup(point, warmup)
            row["input_warmup"] = warmup if point.input != "synthetic" else None
            # an fp8 point's other layers run as amp-bf16 does: TF32 off
            with math_flags(point.precision, point.cudnn_benchmark):
                row.update(_run_point(point, warmup=warmup, steps=steps, telemetry=telemetry,
                                      interval_s=interval_s, repeat=repeat,
                                      fault_injector=fault_injector))
    except Exception as e:  # recorded, and the sweep goes on
        status = "oom" if is_oom(e) else "error"
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        _drop_inner_frames(e)
    except BaseException as e:  # KeyboardInterrupt: release the point's memory, then re-raise
        _drop_inner_frames(e)
        _release_memory()
        raise
    _release_memory()
    row.update(status=status, error=error, elapsed_s=time.perf_counter() - t0,
               finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               **_provenance())
    return row


# --------------------------------------------------------------------------- running a sweep

def _prepare_images(spec: SweepSpec, points: list[Point]) -> None:
    """Writes the image folder file inputs read (``spec.images`` JPEGs) unless it holds images,
    then checks it is an image folder: a missing or empty one fails before any point runs."""
    if all(p.input == "synthetic" for p in points):
        return
    root = check_images_dir(spec.images_dir)  # the folder may have changed since the spec
    if not root.exists() or not any(root.iterdir()):
        dataset.make_image_folder(root, images=spec.images)
    dataset.scan_image_folder(root)


ResultCallback = Callable[[dict[str, Any], int, int], None]


def run_sweep(spec: SweepSpec, out: str | Path | None = None, *,
              stop: threading.Event | None = None, on_result: ResultCallback | None = None,
              progress: bool = False, fault_injector: FaultInjector | None = None) -> pd.DataFrame:
    """Runs a sweep and returns its rows (one per point and repeat), resuming from ``out``.

    Args:
        spec: the grid and how to measure it. With a file input, ``spec.images_dir`` is
            written first when it holds no images yet (:func:`fp16lab.inputs.make_image_folder`).
        out: a ``.parquet`` results file, checked before anything runs; each finished repeat
            is appended at once (with a CSV copy). Repeats the file already holds with this
            spec's protocol (``warmup`` and ``steps``) are skipped, as are the remaining repeats
            of a point recorded as ``oom`` or ``error`` with it (delete those rows to retry
            them). Rows measured with another protocol are kept but not counted: their points
            are measured again, and the rows returned are this protocol's only.
        stop: when set (from another thread), the sweep ends after the current point.
        on_result: called as ``on_result(row, done, total)`` after every finished repeat.
        progress: show a tqdm progress bar.
        fault_injector: called before every training step; for tests.
    """
    points = spec.points()
    keys = {p.key for p in points}
    if out is not None:
        check_results_path(out)
    _prepare_images(spec, points)
    existing = _this_protocol(read_results(out), spec, keys) if out is not None else \
        pd.DataFrame(columns=list(ROW_COLUMNS))
    done = {(k, int(r)) for k, r, s in zip(existing.get("key", []), existing.get("repeat", []),
                                            existing.get("status", [])) if s == "ok"}
    failed = {k for k, s in zip(existing.get("key", []), existing.get("status", [])) if s != "ok"}
    tasks = [(r, p) for r in range(spec.repeats) for p in points
             if (p.key, r) not in done and p.key not in failed]
    rows: list[dict[str, Any]] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(tasks), unit="measurement", desc="sweep")  # a point, one repeat
    try:
        for i, (r, p) in enumerate(tasks):
            if stop is not None and stop.is_set():
                break
            if p.key in failed:
                if bar is not None:
                    bar.update(1)
                continue
            if bar is not None:
                bar.set_postfix_str(f"{p.label()} r{r}", refresh=True)
            measurement = (p.key, r, spec.warmup, spec.steps)
            if out is not None and not _claim_unmeasured(out, measurement):
                if bar is not None:  # another sweep measures it, or has: its row is used
                    bar.update(1)
                continue
            try:
                row = measure_point(p, repeat=r, warmup=spec.warmup, steps=spec.steps,
                                    tolerance=spec.tolerance, telemetry=spec.telemetry,
                                    interval_s=spec.telemetry_interval_s,
                                    fault_injector=fault_injector)
                if out is not None:
                    append_rows(out, [row])
            finally:
                if out is not None:
                    release(out, measurement)
            rows.append(row)
            if row["status"] != "ok":
                failed.add(p.key)
            if bar is not None:
                bar.update(1)
            if on_result is not None:
                on_result(row, i + 1, len(tasks))
    finally:
        if bar is not None:
            bar.close()
    if out is not None:  # with the rows another sweep of this grid measured for it
        return _this_protocol(drop_duplicate_measurements(read_results(out))[0], spec, keys)
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))


def _claim_unmeasured(out: str | Path, measurement: tuple[Any, ...]) -> bool:
    """Returns True when this sweep now owns ``measurement`` and the file does not hold it yet.

    Another sweep of the same grid on the same file may have claimed it (it is measuring it) or
    finished it since this sweep read the file; either way this sweep skips it.
    """
    if not claim(out, measurement):
        return False
    held, _ = drop_duplicate_measurements(read_results(out))
    if len(held) and (held[list(MEASUREMENT)] == list(measurement)).all(axis=1).any():
        release(out, measurement)
        return False
    return True


def _this_protocol(df: pd.DataFrame, spec: SweepSpec, keys: set[str]) -> pd.DataFrame:
    """Returns the rows of ``df`` for these points measured with the spec's warm-up and steps."""
    if not len(df):
        return df
    same = (df["key"].isin(keys) & (pd.to_numeric(df["warmup"]) == spec.warmup)
            & (pd.to_numeric(df["steps"]) == spec.steps))
    return df[same].reset_index(drop=True)

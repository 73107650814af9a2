"""Which side caps a training step: the input pipeline's images/s against the model's.

Two measurements, one protocol (also stated in ``fp16lab.bench.input_pipeline`` and notebook 07):
``cudnn.benchmark`` on; ``warmup`` batches or steps first (workers start, the first wave of
batches that the workers finish together is used up, cuDNN picks its algorithms); then at
least ``steps`` batches or steps, and more until ``min_seconds`` have passed, timed on the host
clock between two ``torch.cuda.synchronize()`` calls, so time the GPU spends waiting for data
counts. Rows record the warm-up and the timed count (``warmup``, ``timed_steps``).

- :func:`measure_loader`: images/s of an input pipeline alone (batches produced and placed on
  the device, no training), with the CPU time its processes and threads used meanwhile.
- :func:`measure_training`: images/s of full training steps fed by that pipeline.

Both return one row (a dict) with ``status`` ``ok``, ``error`` (the message in ``error``, e.g.
a corrupt JPEG named) or ``skipped`` (a backend that cannot run here, with the reason), so a
sweep records the point and goes on. :func:`make_input_train_step` returns the step a sweep
point calls.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from .. import validate
from ..models import NUM_CLASSES, build_model, is_image_model
from ..recipes import (OPTIMIZERS, PRECISIONS, check_precision, math_flags, optimizer_factory,
                       precisions)
from ..recipes import make_train_step as recipe_step
from .registry import make_input, unavailable_reason
from .settings import CPU_SHARE_BACKENDS, InputPipeline, InputSettings, cpu_cores

__all__ = ["ProcessCpu", "input_label", "loader_table", "make_input_train_step",
           "make_train_step", "measure_loader", "measure_training", "plot_training",
           "speedup_table", "summary_lines", "training_label", "training_table"]


def _tree_cpu_seconds(pid: int) -> float | None:
    """Returns the CPU seconds (user + system) used so far by ``pid`` and its live descendants,
    threads included, read from /proc; None where there is no /proc."""
    proc = Path("/proc")
    if not (proc / str(pid) / "stat").exists():
        return None
    tick = os.sysconf("SC_CLK_TCK")
    parent, used = {}, {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        # after the command name: state, ppid, ..., utime (14th field overall), stime (15th)
        parent[int(d.name)] = int(fields[1])
        used[int(d.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree, frontier = {pid}, [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in tree]
        tree.update(kids)
        frontier += kids
    return sum(used.get(p, 0.0) for p in tree)


class ProcessCpu:
    """Measures the CPU this process and its children (e.g. DataLoader workers) use.

    ``start()``, then ``stop()`` returns ``{"cpu_cores_busy": ..., "cpu_util_pct": ...}``: CPU
    seconds per wall second, and that as a share of the cores this process may use. Both are
    None where /proc is missing (not Linux).
    """

    def start(self) -> "ProcessCpu":
        self._t0, self._cpu0 = time.perf_counter(), _tree_cpu_seconds(os.getpid())
        return self

    def stop(self) -> dict[str, float | None]:
        cpu1, wall = _tree_cpu_seconds(os.getpid()), time.perf_counter() - self._t0
        if cpu1 is None or self._cpu0 is None or wall <= 0:
            return {"cpu_cores_busy": None, "cpu_util_pct": None}
        busy = max(cpu1 - self._cpu0, 0.0) / wall
        return {"cpu_cores_busy": busy, "cpu_util_pct": 100 * busy / cpu_cores()}


def make_train_step(precision: str, model: torch.nn.Module, *, device: str,
                    optimizer: str = "sgd") -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Returns ``step(x, y) -> loss``: one SGD training step of ``model`` in ``precision``.

    The arguments come in the order of :func:`fp16lab.recipes.make_train_step`, whose step it is.

    The model must already be on ``device`` in the layout the batches will have. The step is
    :func:`fp16lab.recipes.make_train_step`'s, fed a new batch at every call; ``optimizer`` is
    a name from :data:`fp16lab.recipes.OPTIMIZERS` (``sgd-fused``: no host sync per step).
    """
    _check_precision_optimizer(precision, optimizer)
    step, _ = recipe_step(precision, model, None, None,
                          device=torch.device(validate.device("device", device)).type,
                          optimizer=optimizer_factory(optimizer))
    return step


def _check_precision_optimizer(precision: str, optimizer: str) -> None:
    # the pipeline's batches feed the model as built: no fp16 copy, no FP8 layers
    check_precision(precision, precisions(converts_model=False),
                    where="by the input pipeline's training step")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; known: {', '.join(OPTIMIZERS)}")


def make_input_train_step(model_name: str, precision: str, settings: InputSettings,
                          root: str | Path | None = None, *, device: str = "cuda",
                          optimizer: str = "sgd") -> tuple[Callable[[], torch.Tensor], InputPipeline]:
    """Returns ``(step, pipeline)``: ``step()`` takes the next batch from the pipeline and runs
    one training step of a fresh ``model_name``; close the pipeline when done.

    Everything is checked before any work starts (model, precision, settings, folder, backend);
    a file that cannot be decoded raises :class:`fp16lab.data.CorruptImageError` from the
    ``step()`` whose batch holds it, naming the file.
    """
    _check_precision_optimizer(precision, optimizer)
    if not is_image_model(model_name):
        raise ValueError(f"model {model_name!r} does not take images; the input backends feed "
                         "image models (small_cnn, resnet18, resnet50)")
    pipeline = make_input(settings, root, device=device, num_classes=NUM_CLASSES)
    try:
        model = build_model(model_name).to(device)
        if settings.channels_last:
            model = model.to(memory_format=torch.channels_last)
        train = make_train_step(precision, model, device=device, optimizer=optimizer)
    except BaseException:
        pipeline.close()
        raise

    def step() -> torch.Tensor:
        x, y = next(pipeline)
        return train(x, y % NUM_CLASSES)  # the data set may have more classes than the head

    return step, pipeline


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _row(kind: str, settings: InputSettings, device: str, **extra: Any) -> dict[str, Any]:
    return {"measure": kind, "backend": settings.backend, "batch": settings.batch,
            "image_size": settings.image_size, "num_workers": settings.resolved_workers(),
            "pin_memory": settings.pin_memory, "non_blocking": settings.non_blocking,
            "channels_last": settings.channels_last, "normalize_on": settings.normalize_on,
            "cpu_decode_share": settings.cpu_decode_share,
            "device": str(device), "cpu_cores": cpu_cores(), "status": "ok", "error": "",
            "implementation": "", "images_per_s": None, "seconds": None,
            "cpu_cores_busy": None, "cpu_util_pct": None, **extra}


def _timed(row: dict[str, Any], device: str, warmup: int, steps: int, batch: int,
           one: Callable[[], Any], min_seconds: float = 0.0,
           stages: Callable[[], dict[str, float]] = dict) -> None:
    for _ in range(warmup):
        one()
    _sync(device)
    cpu = ProcessCpu().start()
    before = stages()
    t0 = time.perf_counter()
    done = 0
    while done < steps or time.perf_counter() - t0 < min_seconds:
        one()
        done += 1
    _sync(device)
    seconds = time.perf_counter() - t0
    row.update(cpu.stop(), seconds=seconds, images_per_s=done * batch / seconds, warmup=warmup,
               timed_steps=done)
    after = stages()
    made = after.get("batches", 0) - before.get("batches", 0)
    if made > 0:  # where the producer's host time went, per batch it made in the window
        row["stage_ms_per_batch"] = {k[:-2]: 1000 * (after[k] - before.get(k, 0.0)) / made
                                     for k in after if k.endswith("_s")}


def _check_counts(warmup: int, steps: int, min_seconds: float = 0.0) -> None:
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0 or \
            isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"need warmup >= 0 and steps >= 1 (integers), got {warmup!r}, {steps!r}")
    if isinstance(min_seconds, bool) or not isinstance(min_seconds, (int, float)) \
            or not 0 <= min_seconds < float("inf"):
        raise ValueError(f"min_seconds must be a finite number >= 0, got {min_seconds!r}")


def measure_loader(settings: InputSettings, root: str | Path | None = None, *,
                   device: str = "cuda", warmup: int = 3, steps: int = 10,
                   min_seconds: float = 0.0) -> dict[str, Any]:
    """Returns one row: images/s of the pipeline alone (batches made and placed on ``device``),
    and the CPU it used. ``status`` is ``skipped`` (with the reason) for a backend that cannot
    run here and ``error`` (with the message) when a batch fails."""
    _check_counts(warmup, steps, min_seconds)
    row = _row("loader", settings, device, precision=None, model=None)
    reason = unavailable_reason(settings.backend, device)
    if reason:
        return {**row, "status": "skipped", "error": reason}
    try:
        with make_input(settings, root, device=device) as pipeline:
            row["implementation"] = pipeline.implementation
            _timed(row, device, warmup, steps, settings.batch, lambda: next(pipeline),
                   min_seconds, pipeline.stage_seconds)
    except Exception as e:  # recorded; the caller goes on with the next point
        row.update(status="error", error=f"{type(e).__name__}: {e}")
    return row


def measure_training(model_name: str, precision: str, settings: InputSettings,
                     root: str | Path | None = None, *, device: str = "cuda", warmup: int = 5,
                     steps: int = 20, min_seconds: float = 0.0,
                     optimizer: str = "sgd") -> dict[str, Any]:
    """Returns one row: images/s of training steps of ``model_name`` in ``precision`` with
    ``optimizer`` (a name from :data:`fp16lab.recipes.OPTIMIZERS`) fed by the pipeline
    ``settings`` describes, with the CPU used; ``status`` as for :func:`measure_loader`."""
    _check_counts(warmup, steps, min_seconds)
    _check_precision_optimizer(precision, optimizer)
    row = _row("training", settings, device, precision=precision, model=model_name,
               optimizer=optimizer)
    reason = unavailable_reason(settings.backend, device)
    if reason:
        return {**row, "status": "skipped", "error": reason}
    try:
        with math_flags(precision, cudnn_benchmark=True):
            step, pipeline = make_input_train_step(model_name, precision, settings, root,
                                                   device=device, optimizer=optimizer)
            with pipeline:
                row["implementation"] = pipeline.implementation
                _timed(row, device, warmup, steps, settings.batch, step, min_seconds,
                       pipeline.stage_seconds)
    except Exception as e:
        row.update(status="error", error=f"{type(e).__name__}: {e}")
    finally:
        if str(device).startswith("cuda"):
            torch.cuda.empty_cache()
    return row


# --------------------------------------------------------------------------- reading results


def input_label(row: dict[str, Any]) -> str:
    """Returns how a row's input is named in tables: the backend, plus ``uint8`` where the
    dataloader's batches were normalised on the GPU, or ``+ 25% CPU`` where gpu-decode or
    hw-decode had the CPU decode a share of each batch."""
    uint8 = row.get("backend") == "dataloader" and row.get("normalize_on") == "gpu"
    share = row.get("cpu_decode_share") or 0.0
    hybrid = row.get("backend") in CPU_SHARE_BACKENDS and share > 0
    return f"{row.get('backend')}{' uint8' if uint8 else ''}{f' + {share:.0%} CPU' if hybrid else ''}"


def training_label(row: dict[str, Any]) -> str:
    """Returns how a training row's precision is named in tables: the precision, plus the
    optimizer where it is not plain ``sgd`` (``amp-fp16 sgd-fused``)."""
    opt = row.get("optimizer")
    opt = opt if isinstance(opt, str) and opt else "sgd"  # rows from before the axis: NaN in a table
    return row.get("precision") if opt == "sgd" else f"{row.get('precision')} {opt}"


def _columns(labels: Any) -> list[str]:
    """The training columns in PRECISIONS order, each precision's optimizer variants after it."""
    labels = list(labels)
    return [c for p in PRECISIONS for c in labels if c == p or str(c).startswith(p + " ")]


def _rate_columns(table: Any) -> list[str]:
    """The images/s columns of a :func:`training_table` (not its shares), in :func:`_columns` order."""
    return _columns(c for c in table.columns if not str(c).endswith(" share"))


def _ok(rows: list[dict[str, Any]], measure: str) -> Any:
    import pandas as pd

    df = pd.DataFrame([r for r in rows if r.get("measure") == measure and r.get("status") == "ok"])
    if df.empty:
        return df
    records = df.to_dict("records")
    df = df.assign(input=[input_label(r) for r in records])
    if measure == "training":
        df = df.assign(column=[training_label(r) for r in records])
    return df


def training_table(rows: list[dict[str, Any]]) -> Any:
    """Returns a DataFrame: training images/s per input (rows) and precision (columns; a
    precision trained with another optimizer than ``sgd`` is a column of its own, e.g.
    ``amp-fp16 sgd-fused``), and each column's share of its synthetic-input (model-only) rate
    as ``<column> share``."""
    df = _ok(rows, "training")
    if df.empty:
        return df
    table = df.pivot_table(index="input", columns="column", values="images_per_s", aggfunc="max")
    table = table[_columns(table.columns)]
    table.columns.name = "precision"
    if "synthetic" in table.index:
        for p in list(table.columns):
            table[f"{p} share"] = table[p] / table.loc["synthetic", p]
    return table


def speedup_table(rows: list[dict[str, Any]], *, over: str = "fp32") -> Any:
    """Returns a DataFrame: per input, each precision's training images/s divided by ``over``'s."""
    table = training_table(rows)
    if table.empty or over not in table.columns:
        raise ValueError(f"no ok training rows in precision {over!r} to divide by")
    rates = table[_rate_columns(table)]
    return rates.div(rates[over], axis=0).drop(columns=over).add_suffix(f" / {over}")


def loader_table(rows: list[dict[str, Any]]) -> Any:
    """Returns a DataFrame of the loader-only rows: input, workers, images/s, CPU used."""
    df = _ok(rows, "loader")
    if df.empty:
        return df
    cols = ["input", "num_workers", "images_per_s", "cpu_cores_busy", "cpu_util_pct", "implementation"]
    return df[cols].sort_values(["input", "num_workers"]).reset_index(drop=True)


def plot_training(rows: list[dict[str, Any]], *, ax: Any = None) -> Any:
    """Returns a bar chart: training images/s per precision, one bar per input, with the
    loader-only rate of each input drawn as a tick over its bars."""
    import matplotlib.pyplot as plt
    import numpy as np

    table = training_table(rows)
    if table.empty:
        raise ValueError("no ok training rows to plot")
    precisions = _rate_columns(table)
    loaders = loader_table(rows)
    trained = _ok(rows, "training")
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.8 / len(table.index)
    for k, name in enumerate(table.index):
        xs = np.arange(len(precisions)) + (k - (len(table.index) - 1) / 2) * width
        bars = ax.bar(xs, table.loc[name, precisions].to_numpy(dtype=float), width, label=name)
        workers = set(trained[trained["input"] == name]["num_workers"])
        alone = (loaders[(loaders["input"] == name) & loaders["num_workers"].isin(workers)]
                 ["images_per_s"] if len(loaders) else [])
        if name != "synthetic" and len(alone):  # the input alone, with the workers it trained with
            ax.hlines([float(max(alone))] * len(xs), xs - width / 2, xs + width / 2,
                      colors=bars.patches[0].get_facecolor(), linestyles="dotted")
    ax.set_xticks(np.arange(len(precisions)), precisions)
    ax.set_ylabel("training images/s")
    ax.set_title("training fed by each input (dotted: the input alone)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)  # beside the bars, not over them
    return ax.figure


def summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Returns sentences about measured rows: per precision, the model's own rate (synthetic
    input), the fastest real input and its share of that rate; then AMP's speed-up over fp32
    for each input."""
    table = training_table(rows)
    if table.empty or "synthetic" not in table.index:
        return ["no ok training rows with synthetic input to compare with"]
    lines = []
    real = table.drop(index="synthetic")
    for p in _rate_columns(table):
        measured = real[p].dropna()
        if measured.empty:
            continue
        best = measured.idxmax()
        lines.append(f"{p}: the model alone trains at {table.loc['synthetic', p]:.0f} images/s; the "
                     f"fastest real input, {best}, reaches {measured[best]:.0f} "
                     f"({measured[best] / table.loc['synthetic', p]:.0%} of it)")
    if "fp32" in table.columns:
        for col, ratios in speedup_table(rows).items():
            ratios = ratios.dropna()
            order = ["synthetic"] + [n for n in ratios.index if n != "synthetic"]
            for name, r in ratios.reindex([n for n in order if n in ratios.index]).items():
                lines.append(f"{col.split(' /')[0]} over fp32 with {name} input: {r:.2f}x")
    return lines

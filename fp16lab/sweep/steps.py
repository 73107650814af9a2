"""A sweep point's training step: its recipe or FP8 recipe, run as its execution says, on its input.

:func:`build_step` returns a :class:`PointStep` whose ``step()`` runs one full training step:

- ``execution='eager'`` with a recipe precision: :func:`fp16lab.recipes.make_train_step`;
- ``cuda-graph`` or ``compile``: :func:`fp16lab.execution.make_step` with the point's scaler
  settings (a CUDA graph has taken its warm-up and capture steps when it returns);
- ``fp8-<recipe>``: :func:`fp16lab.fp8.training.make_fp8_step` with the sweep's SGD and bf16
  autocast for the rest of the model (on a CPU too, so it compares with amp-bf16 there), no
  GradScaler;
- a workload point (``point.workload``): :func:`fp16lab.workload.train_step` of the workload,
  every recipe (its FP8 ones convert the workload's linear layers), eager, compiled or captured
  as a CUDA graph, on the workload's own batches (:func:`build_workload_step`);
- ``input`` other than ``synthetic``: each step first takes the pipeline's next batch
  (:func:`fp16lab.inputs.make_input`), so time spent waiting for data counts; ``close()``
  stops the pipeline's workers.

``PointStep.columns`` holds what the row records about the step: the input's implementation,
the execution's notes and, for FP8, whether ``torch._scaled_mm`` ran or the matmuls were
emulated (an emulated point's speed is not an FP8 speed).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import execution, fp8, inputs, workload  # modules: tests replace inputs.make_input
from ..execution import make_step
from ..fp8 import training as fp8_training  # a module too (tests replace make_fp8_step)
from ..models import NUM_CLASSES, input_shape
from ..recipes import PRECISIONS, make_train_step, sgd
from .point import Point


@dataclass
class PointStep:
    """One point's training step, ready to time."""

    step: Callable[[], Any]
    scaler: Any = None
    columns: dict[str, Any] = field(default_factory=dict)
    close: Callable[[], None] = lambda: None
    finish: Callable[[], dict[str, Any]] = dict  # columns known only after the timed steps


def input_warmup(point: Point, warmup: int) -> int:
    """Returns the warm-up steps a point needs: a dataloader's workers each deliver a first batch
    together, so at least num_workers + 2 steps go before the timed ones."""
    if point.input == "dataloader":
        return max(warmup, int(point.num_workers) + 2)
    return warmup


def build_workload_step(point: Point, seed: int = 0) -> PointStep:
    """Returns the step of a workload point: :func:`fp16lab.workload.train_step` of its
    workload (FP8 recipes included, which it converts itself), compiled if its execution says.

    ``cuda-graph`` captures the whole step as :func:`fp16lab.execution.make_step` does: fused
    SGD where the workload names no optimizer (its own must be capturable), autocast's cache
    off, ``WARMUP_STEPS`` steps before the capture. A capture that fails (a host sync, a
    dynamic shape, an optimizer that cannot be captured) raises
    :class:`fp16lab.workload.WorkloadCannotRun` naming the workload, which the row records."""
    graph = point.execution == "cuda-graph"
    engine: dict[str, Any] = {}
    if graph:
        engine = {"autocast_cache": False, "unscale_first": True}
        if point.workload.optimizer is None:
            engine["optimizer"] = functools.partial(sgd, fused=True)
    step = workload.train_step(point.workload, point.precision, point.device, point.batch,
                               layout=point.layout, scaler=point.scaler, seed=seed,
                               compile_mode=point.compile_mode, **engine)
    columns = {"execution_notes": f"torch.compile(model, mode={point.compile_mode!r}); loss, "
                                  "scaler, optimizer eager"} if point.compile_mode else {}
    if graph:
        step = _captured(point, step)
        columns = {"execution_notes": "the whole step captured as one CUDA graph; "
                                      + ("fused SGD; " if "optimizer" in engine else
                                         "the workload's optimizer; ")
                                      + "autocast cache off; static batch"}
    if not PRECISIONS[point.precision].fp8:
        return PointStep(step, step.scaler, columns)
    columns.update(fp8_layers=len(step.converted), fp8_scaled_mm=fp8.scaled_mm_available(point.device))
    return PointStep(step, None, columns, finish=_fp8_finish(point))


def _captured(point: Point, step: Any) -> Any:
    """Returns ``step`` (a WorkloadStep) whose ``run`` replays a CUDA graph of it."""
    try:  # step(), not step.run(): the precision's maths flags (TF32) hold while it records
        replay = execution.capture(lambda: step().detach(), execution.WARMUP_STEPS,
                                   traceable=False)
    except Exception as e:  # noqa: BLE001 - any capture failure is this setting's, for the row
        raise workload.WorkloadCannotRun(
            f"workload {point.workload.name!r} cannot run execution 'cuda-graph': capturing its "
            f"step failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            "a CUDA graph needs a step with no host synchronisation, fixed shapes and a "
            "capturable optimizer") from e

    def run(*batch: Any) -> Any:
        if batch:
            raise ValueError(f"workload {point.workload.name!r}: a CUDA graph replays the batch "
                             "it captured; it cannot take another")
        return replay()

    return dataclasses.replace(step, run=run)


def build_step(point: Point, model: Any, x: Any, y: Any) -> PointStep:
    """Returns the point's step training ``model`` (on the point's device, in its layout).

    ``x`` and ``y`` are a synthetic batch of the point's shape; with a file input they only set
    the shapes, and every step trains on the pipeline's next batch.
    """
    pipeline = _pipeline(point) if point.input != "synthetic" else None
    try:
        built = _train_step(point, model, x, y)
    except BaseException:
        if pipeline is not None:
            pipeline.close()
        raise
    if pipeline is None:
        return built
    train = built.step
    feed = _feeder(point, train)

    def step() -> Any:
        xb, yb = next(pipeline)
        return feed(xb, yb % NUM_CLASSES)  # the image folder may have more classes than the head

    built.step, built.close = step, pipeline.close
    built.columns["input_implementation"] = pipeline.implementation
    return built


def _feeder(point: Point, train: Any) -> Callable[[Any, Any], Any]:
    """Returns how a new batch reaches the step: as arguments, or copied into a captured step's."""
    if point.execution == "eager":
        return train

    def load_and_run(xb: Any, yb: Any) -> Any:
        train.load(xb, yb)  # a CUDA graph or compiled step reads fixed tensors
        return train()

    return load_and_run


def _pipeline(point: Point) -> Any:
    settings = inputs.InputSettings(
        backend=point.input, batch=point.batch,
        image_size=input_shape(point.model, point.batch)[-1], num_workers=point.num_workers,
        pin_memory=True if point.pin_memory is None else point.pin_memory,
        non_blocking=True if point.non_blocking is None else point.non_blocking,
        channels_last=point.layout == "channels_last",
        normalize_on=point.normalize_on or "cpu")
    return inputs.make_input(settings, point.images_dir, device=point.device, num_classes=NUM_CLASSES)


def _train_step(point: Point, model: Any, x: Any, y: Any) -> PointStep:
    if PRECISIONS[point.precision].fp8:
        return _fp8_step(point, model, x, y)
    if point.execution != "eager":
        step = make_step(model, x, y, precision=point.precision, execution=point.execution,
                         compile_mode=point.compile_mode or "default", scaler=point.scaler)
        return PointStep(step, step.scaler, {"execution_notes": "; ".join(step.notes)})
    step, scaler = make_train_step(point.precision, model, x, y, device=point.device,
                                   scaler=point.scaler, optimizer=sgd)
    return PointStep(step, scaler)


def _fp8_step(point: Point, model: Any, x: Any, y: Any) -> PointStep:
    recipe = PRECISIONS[point.precision].fp8_recipe
    step = fp8_training.make_fp8_step(model, x, y, recipe, optimizer=sgd(model.parameters()),
                                      autocast=True)
    fast = fp8.scaled_mm_available(point.device)
    return PointStep(step, None, {"fp8_layers": len(step.converted), "fp8_scaled_mm": fast},
                     finish=_fp8_finish(point))


def _fp8_finish(point: Point) -> Callable[[], dict[str, Any]]:
    """Returns what an FP8 point's row records after its steps: emulated or not, and why.

    ``fp8.FALLBACKS`` keeps, for the whole process, the first reason each kind of GEMM was
    emulated; a point must report only its own. So it is set aside here, as the step is built,
    the steps record afresh, and ``finish`` reads what they recorded (the GEMMs of every scale
    kind the recipe makes: a blockwise step's backward has tiles _scaled_mm cannot take) and
    puts the earlier reasons back."""
    fast = fp8.scaled_mm_available(point.device)
    earlier = dict(fp8.FALLBACKS)
    fp8.FALLBACKS.clear()

    def finish() -> dict[str, Any]:
        met = [f"{k}: {v}" for k, v in fp8.FALLBACKS.items()]
        for k, v in earlier.items():
            fp8.FALLBACKS.setdefault(k, v)
        if not fast:
            met = [f"emulated: torch._scaled_mm needs a CUDA GPU of compute capability 8.9 or "
                   f"newer, the device is {point.device}"]
        return {"fp8_emulated": not fast or bool(met), "fp8_fallbacks": "; ".join(met)}

    return finish

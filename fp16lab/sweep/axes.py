"""The later chapters' sweep axes: their values, defaults, and which points each one applies to.

Beside model, batch, layout, precision and the scaler, a sweep point has four axes, each with a
default that is the original sweep's behaviour (``AXIS_DEFAULTS``):

- ``execution``: ``eager``, ``cuda-graph`` or ``compile`` with a ``compile_mode``
  (:mod:`fp16lab.execution`);
- ``input``: ``synthetic`` (one batch made on the device) or an input pipeline reading image
  files, with ``num_workers``, ``pin_memory``, ``non_blocking`` and ``normalize_on``
  (:mod:`fp16lab.inputs`);
- ``gpus``: 1, or several ranks launched with torchrun (:mod:`fp16lab.distributed`), the batch
  being per GPU;
- the ``fp8-<recipe>`` precisions (:mod:`fp16lab.fp8`): the model's linear layers in FP8, the
  rest as ``amp-bf16``.

The ``check_*`` functions raise ValueError, saying what is allowed, for a combination a point
cannot run; :class:`fp16lab.sweep.Point` calls them on creation.
"""

from __future__ import annotations

import functools
from typing import Any

from .. import distributed, inputs  # inputs a module: tests replace unavailable_reason
from ..execution import COMPILE_MODES, EXECUTIONS, check_execution
from ..fp8 import convert_to_fp8
from ..inputs import BACKENDS
from ..models import build_model, is_image_model
from ..recipes import PRECISIONS, check_precision, precisions
from ..scaling import ScalerSettings

__all__ = ["AXIS_DEFAULTS", "BACKENDS", "COMPILE_MODES", "EXECUTIONS", "SWEEP_PRECISIONS",
           "check_execution_axis", "check_gpus_axis", "check_input_axis", "fp8_problem",
           "gpu_count", "variant_label"]

#: The sweep's precisions: every one fp16lab knows (the recipes' and ``fp8-<recipe>``).
SWEEP_PRECISIONS = dict(PRECISIONS)

#: The axes' defaults (also what a results file without the column means). A point whose axes
#: all have these values keeps the key it had before the axes existed.
AXIS_DEFAULTS = {"execution": "eager", "compile_mode": None, "input": "synthetic",
                 "num_workers": None, "pin_memory": None, "non_blocking": None,
                 "normalize_on": None, "gpus": 1}


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _one_of(kind: str, value: Any, allowed: Any) -> None:
    _check(value in allowed, f"unknown {kind} {value!r}; allowed: {', '.join(allowed)}")


@functools.lru_cache(maxsize=None)
def fp8_problem(model: str, precision: str) -> str | None:
    """Returns why an ``fp8-<recipe>`` precision cannot train ``model``, or None when it can.

    The recipe converts the model's eligible linear layers (:func:`fp16lab.fp8.convert_to_fp8`,
    tried on a weightless copy); image models keep their convolutions and are refused outright.
    """
    if is_image_model(model):
        return (f"{precision} converts linear layers to FP8; {model!r} is an image model (its "
                f"convolutions stay in high precision): use transformer_block or mlp")
    import torch

    with torch.device("meta"):
        weightless = build_model(model)
    if not convert_to_fp8(weightless, PRECISIONS[precision].fp8_recipe):
        return (f"{model!r} has no linear layer {precision} can convert (features must be "
                f"multiples of 16, of 128 for blockwise)")
    return None


def check_execution_axis(execution: str, compile_mode: str | None, *, precision: str,
                         device: str) -> str | None:
    """Returns the compile mode a point keeps ('default' filled in for compile, else None)."""
    _one_of("execution", execution, EXECUTIONS)
    if execution == "eager":
        return None
    mode = (compile_mode or "default") if execution == "compile" else None
    _check(not PRECISIONS[precision].fp8,
           f"{precision} runs with execution 'eager' only, not {execution!r}")
    check_execution(execution, device=device, compile_mode=mode or "default", precision=precision)
    return mode


def check_input_axis(input: str, *, model: str, device: str, images_dir: Any,
                     num_workers: Any, pin_memory: Any, non_blocking: Any,
                     normalize_on: Any) -> dict[str, Any]:
    """Returns the input settings a point keeps: None where they do not apply, defaults filled in.

    ``num_workers`` None becomes 75% of the cores (:func:`fp16lab.inputs.default_workers`);
    ``pin_memory``, ``non_blocking`` and ``normalize_on`` apply to the dataloader only.
    """
    _one_of("input", input, BACKENDS)
    kept: dict[str, Any] = dict.fromkeys(("num_workers", "pin_memory", "non_blocking",
                                          "normalize_on", "images_dir"))
    if input == "synthetic":
        return kept
    _check(is_image_model(model), f"input {input!r} reads image files; {model!r} takes no "
                                  f"images (file inputs feed small_cnn, resnet18, resnet50)")
    reason = inputs.unavailable_reason(input, device)
    _check(reason is None, f"input {input!r} cannot run here: {reason}")
    _check(images_dir is not None, f"input {input!r} reads image files: give images_dir, an "
                                   f"image folder (fp16lab.inputs.make_image_folder makes one)")
    w = inputs.default_workers() if num_workers is None else num_workers
    low = 0 if input == "dataloader" else 1
    _check(not isinstance(w, bool) and isinstance(w, int) and w >= low,
           f"num_workers must be None (75% of the cores) or an integer >= {low} for input "
           f"{input!r}, got {w!r}")
    kept.update(num_workers=w, images_dir=str(images_dir))
    if input != "dataloader":  # gpu-decode, hw-decode and dali normalise on the GPU themselves
        return kept
    for name, value in (("pin_memory", pin_memory), ("non_blocking", non_blocking)):
        value = True if value is None else value
        _check(isinstance(value, bool), f"{name} must be True or False, got {value!r}")
        kept[name] = value
    kept["normalize_on"] = normalize_on or "cpu"
    _check(kept["normalize_on"] in ("cpu", "gpu"),
           f"normalize_on must be 'cpu' or 'gpu', got {normalize_on!r}")
    return kept


def check_gpus_axis(gpus: Any, *, device: str, precision: str, execution: str, input: str,
                    scaler: ScalerSettings | None, cudnn_benchmark: bool) -> None:
    """Raises ValueError unless ``gpus`` is 1, or 2..device_count() for what the ranks run."""
    _check(not isinstance(gpus, bool) and isinstance(gpus, int) and gpus >= 1,
           f"gpus must be a positive integer, got {gpus!r}")
    if gpus == 1:
        return
    have = gpu_count() if device == "cuda" else 0
    _check(gpus <= have, f"gpus={gpus} needs {gpus} CUDA GPUs; allowed here: 1"
                         + (f" to {have}" if have > 1 else "")
                         + ("" if device == "cuda" else " (the points run on the CPU)"))
    check_precision(precision, precisions(autocast_recipe=True), where="across GPUs")
    _check(execution == "eager" and input == "synthetic",
           "gpus > 1 runs eager steps on synthetic batches only (execution 'eager', input "
           "'synthetic')")
    _check(scaler is None or scaler == ScalerSettings(),
           "gpus > 1 uses GradScaler's default settings; other settings are not passed to the "
           "ranks yet")
    _check(cudnn_benchmark == distributed.CUDNN_BENCHMARK,
           f"gpus > 1 measures with cudnn_benchmark={distributed.CUDNN_BENCHMARK} (the "
           f"distributed protocol); other values are not passed to the ranks yet")


def gpu_count() -> int:
    """Returns how many CUDA GPUs torch sees here (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def variant_label(settings: Any) -> str:
    """Returns a row's non-default execution, input and gpus, e.g. 'compile(default) x2', or ''.

    A value missing or NaN (a results file older than the axis) counts as the default.
    """
    def get(name: str) -> Any:
        v = settings.get(name, AXIS_DEFAULTS[name])
        return AXIS_DEFAULTS[name] if v is None or v != v else v

    parts = []
    if get("execution") != "eager":
        mode = get("compile_mode")
        parts.append(get("execution") + (f"({mode})" if mode else ""))
    if get("input") != "synthetic":
        parts.append(f"{get('input')} w{int(get('num_workers'))}"
                     + (" uint8" if get("normalize_on") == "gpu" else ""))
    if int(get("gpus")) != 1:
        parts.append(f"x{int(get('gpus'))}")
    return " ".join(parts)

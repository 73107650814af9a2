"""One training step, run three ways: eager, captured as a CUDA graph, or through torch.compile.

A small step (ResNet-50 at batch 64, a transformer block, a CIFAR CNN) can be *launch-bound*:
each kernel finishes before Python and the CUDA driver have launched the next, so the GPU idles
between kernels however fast its tensor cores are. Two fixes, beside plain ``eager``:

- ``cuda-graph``: ``torch.cuda.graph`` records every kernel of one whole step (zero_grad,
  forward, backward, unscale, optimizer step, scaler update) once; each later step is a single
  ``replay()``, one launch instead of hundreds. What had to change for the capture:

  * the step reads its batch from *static* tensors (copy the next batch into them with
    :meth:`TrainingStep.load`): a graph replays the same addresses;
  * GradScaler's ``step`` normally asks the host whether any gradient was inf/NaN
    (``found_inf.item()``), a device-to-host sync that capture forbids. With a *fused*
    optimizer (``torch.optim.SGD(fused=True)``) GradScaler hands ``found_inf`` to the optimizer
    as a device tensor and the fused kernel skips the update on the device; ``update`` already
    adjusts the scale on the device (``torch._amp_update_scale_``). So the captured step keeps
    the exact skip-and-back-off behaviour of eager GradScaler, with no host sync. The fused
    SGD's momentum buffers start as zeros: left to itself it makes them uninitialised on its
    first step, and if that step is skipped (ResNet-50's first AMP steps overflow) they stay so;
  * autocast's cast cache is off during capture (``cache_enabled=False``), as PyTorch requires;
  * warm-up steps run on a side stream before capture (cuDNN, cuBLAS and the optimizer's
    momentum buffers settle there), and the scale only changes on the device afterwards;
  * capture records the step's kernels but does not run them: after ``make_step`` the model
    has taken only the warm-up steps, and the first ``replay`` takes the next one.

- ``compile``: ``torch.compile(model, mode=...)`` fuses elementwise kernels with Triton (fewer,
  larger kernels); mode ``reduce-overhead`` also replays the model's forward and backward as CUDA
  graphs. The loss, the scaler and the optimizer stay eager.

The step itself is :func:`fp16lab.recipes.make_train_step`'s, with what each mode adds (a
compiled forward, autocast's cache off for capture, the unscale as a phase of its own, the
phases marked for the profiler). Precisions are the workbook's that leave the model as built:
fp32 (TF32 off), tf32, amp-fp16 (autocast + GradScaler) and amp-bf16 (autocast, no scaler).
:func:`build_step` makes the step for one sweep point.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.profiler import ProfilerActivity

from . import validate
from .models import MODELS, NUM_CLASSES, build_model, input_shape, is_image_model
from .profile import phase, torch_profiler
from .recipes import PRECISIONS, check_precision, make_train_step, precisions, sgd, tf32
from .scaling import ScalerSettings

#: Execution modes, with what each does.
EXECUTIONS = {
    "eager": "Python launches every kernel of every step (PyTorch's default)",
    "cuda-graph": "the whole step captured once with torch.cuda.graph, then replayed (CUDA only)",
    "compile": "the model compiled with torch.compile (generated kernels that fuse operations)",
}

#: torch.compile modes the ``compile`` execution accepts. reduce-overhead needs CUDA.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")

#: Steps run before a CUDA graph is captured (and before timing, in the benchmarks).
WARMUP_STEPS = 3


def check_execution(execution: str, *, device: str, compile_mode: str = "default",
                    precision: str = "fp32", fused_optimizer: bool | None = None) -> None:
    """Raises ValueError (TypeError for a flag that is not True or False), saying what is
    allowed, for an execution this device cannot run."""
    validate.choice("execution", execution, EXECUTIONS)
    if fused_optimizer is not None:
        validate.boolean("fused_optimizer", fused_optimizer)
    # fp16-o2's fp16 model and the FP8 layer swap are not captured or compiled here yet
    check_precision(precision, precisions(converts_model=False),
                    where="by fp16lab.execution's steps (they take the model as built)")
    if execution == "cuda-graph" and fused_optimizer is False:
        raise ValueError("execution 'cuda-graph' needs fused_optimizer=True (or None): a foreach "
                         "SGD under GradScaler reads found_inf on the host, which capture forbids")
    validate.choice("device", device, ("cpu", "cuda"))
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but torch sees no CUDA device")
    if execution == "cuda-graph" and device != "cuda":
        raise ValueError("execution 'cuda-graph' needs a CUDA device; on a CPU use 'eager' or "
                         "'compile'")
    validate.choice("compile_mode", compile_mode, COMPILE_MODES)
    if execution == "compile" and compile_mode == "reduce-overhead" and device != "cuda":
        raise ValueError("compile mode 'reduce-overhead' replays CUDA graphs and needs a CUDA "
                         "device; on a CPU use 'default'")


@dataclass
class TrainingStep:
    """A training step ready to call: ``loss = step()`` runs one step and returns the loss tensor.

    ``x`` and ``y`` are the batch the step reads; :meth:`load` copies a new batch into them
    (a CUDA graph reads fixed addresses, so a new batch must land in the same tensors).
    """

    run: Callable[[], torch.Tensor]
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    x: torch.Tensor
    y: torch.Tensor
    precision: str
    execution: str
    compile_mode: str | None = None
    fused_optimizer: bool = False
    notes: list[str] = field(default_factory=list)

    def __call__(self) -> torch.Tensor:
        return self.run()

    def load(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Copies a new batch into the step's input tensors (same shapes)."""
        if x.shape != self.x.shape or y.shape != self.y.shape:
            raise ValueError(f"the batch must keep its shapes {tuple(self.x.shape)} and "
                             f"{tuple(self.y.shape)}; got {tuple(x.shape)} and {tuple(y.shape)}")
        self.x.copy_(x)
        self.y.copy_(y)


def make_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, precision: str,
              execution: str = "eager", compile_mode: str = "default",
              warmup: int = WARMUP_STEPS, fused_optimizer: bool | None = None,
              traceable: bool = True, scaler: ScalerSettings | None = None) -> TrainingStep:
    """Returns a :class:`TrainingStep` training ``model`` on the batch (x, y) as asked.

    The model and tensors must already be on one device, in the memory layout wanted. For
    ``cuda-graph`` this runs ``warmup`` steps and then captures one more without running it
    (capture only records kernels; the GPU executes them at the first ``replay``), so the model
    has then taken ``warmup`` optimizer steps; the other modes take none.

    Args:
        fused_optimizer: use ``SGD(fused=True)`` (one kernel for all weights, and GradScaler's
            overflow check stays on the device: no host sync per step). By default only for
            ``cuda-graph``, which needs it; the other modes default to PyTorch's foreach SGD.
        traceable: for ``cuda-graph``, capture inside a short torch.profiler session, so that a
            later profile of the replays can list the graph's kernels one by one (CUPTI, which
            the profiler uses, may see only the whole graph if it was not active when the graph
            was built).
        scaler: GradScaler settings for ``amp-fp16`` (default: torch's defaults).
    """
    device = x.device.type
    check_execution(execution, device=device, compile_mode=compile_mode, precision=precision,
                    fused_optimizer=fused_optimizer)
    warmup = validate.count("warmup", warmup, low=0)
    traceable = validate.boolean("traceable", traceable)
    if warmup < 1 and execution == "cuda-graph":  # before any work, as capture() checks
        raise ValueError(f"a CUDA graph needs warmup >= 1 steps before capture, got {warmup}")
    graph = execution == "cuda-graph"
    fused = graph if fused_optimizer is None else fused_optimizer
    forward = model
    notes: list[str] = []
    mark_step = False
    if execution == "compile":
        forward = torch.compile(model, mode=None if compile_mode == "default" else compile_mode)
        mark_step = compile_mode == "reduce-overhead"
        notes.append(f"torch.compile(model, mode={compile_mode!r}); loss, scaler, optimizer eager")
    if fused:
        notes.append("fused SGD (GradScaler's found_inf stays on the device)")
    if graph:
        notes.append("autocast cache off during capture; static batch")
    # the fused SGD takes GradScaler's found_inf as a device tensor: no host sync, capturable
    body, scaler = make_train_step(precision, model, x, y, device=device, scaler=scaler,
                                   optimizer=functools.partial(sgd, fused=fused), forward=forward,
                                   autocast_cache=not graph, unscale_first=True, region=phase)
    on_tf32 = PRECISIONS[precision].tf32

    def eager() -> torch.Tensor:
        with tf32(on_tf32):
            if mark_step:  # tells compile's CUDA graphs a new iteration began
                torch.compiler.cudagraph_mark_step_begin()
            return body().detach()

    run = eager
    if graph:
        run = capture(eager, warmup, traceable)
    return TrainingStep(run, model, body.optimizer, scaler, x, y, precision, execution,
                        compile_mode if execution == "compile" else None, fused, notes)


def capture(step: Callable[[], torch.Tensor], warmup: int,
            traceable: bool) -> Callable[[], torch.Tensor]:
    """Returns a function replaying a CUDA graph of ``step``, captured after ``warmup`` steps
    (at least one: it allocates what the graph will reuse) run on a side stream;
    ``traceable`` as in :func:`make_step`."""
    if not callable(step):
        raise TypeError(f"step must be a function to capture, got {type(step).__name__}")
    warmup = validate.count("warmup", warmup, low=0)
    traceable = validate.boolean("traceable", traceable)
    if warmup < 1:
        raise ValueError(f"a CUDA graph needs warmup >= 1 steps before capture, got {warmup}")
    if not torch.cuda.is_available():
        raise ValueError("capture needs a CUDA device; torch sees none")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    session = contextlib.nullcontext()
    if traceable:
        session = torch_profiler([ProfilerActivity.CUDA])
    with session:
        with torch.cuda.graph(g):
            static_loss = step()
        torch.cuda.synchronize()

    def replay() -> torch.Tensor:
        g.replay()
        return static_loss

    replay.graph = g
    return replay


def build_step(model_name: str, batch: int, *, precision: str, execution: str = "eager",
               device: str | None = None, layout: str = "nchw", compile_mode: str = "default",
               seed: int = 0, fused_optimizer: bool | None = None,
               traceable: bool = True) -> TrainingStep:
    """Returns the training step of one sweep point: a fresh model on a random batch.

    Args:
        model_name: a name from ``fp16lab.models.MODELS``.
        batch: the batch size.
        precision: a precision that leaves the model as built (fp32, tf32, amp-fp16, amp-bf16).
        execution: one of ``EXECUTIONS``.
        device: 'cuda' or 'cpu'; by default CUDA where torch sees it.
        layout: 'nchw' or 'channels_last' (image models only).
        compile_mode: the torch.compile mode (``COMPILE_MODES``) when execution is 'compile'.
        seed: seeds the model's weights and the batch.
        fused_optimizer, traceable: see :func:`make_step`.
    """
    validate.choice("model_name", model_name, MODELS)
    batch, seed = validate.count("batch", batch), validate.count("seed", seed, low=0)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = validate.device("device", device)
    check_execution(execution, device=device, compile_mode=compile_mode, precision=precision,
                    fused_optimizer=fused_optimizer)
    validate.boolean("traceable", traceable)
    validate.choice("layout", layout, ("nchw", "channels_last"))
    if layout == "channels_last" and not is_image_model(model_name):
        raise ValueError(f"layout 'channels_last' applies to image models only, not {model_name!r}")
    shape = input_shape(model_name, batch)
    torch.manual_seed(seed)
    model = build_model(model_name).to(device)
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    x = torch.randn(shape, generator=gen).to(device)
    y = torch.randint(0, NUM_CLASSES, (batch,), generator=gen).to(device)
    if layout == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return make_step(model, x, y, precision=precision, execution=execution,
                     compile_mode=compile_mode, fused_optimizer=fused_optimizer,
                     traceable=traceable)

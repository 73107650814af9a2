"""Memory, accounted: what a workload's training step holds under each precision, and why.

:func:`predict` counts, for one workload, precision and batch size, the bytes of

* ``parameters`` (and ``buffers``, BatchNorm's running statistics): fp32, or fp16 under
  ``fp16-o2`` (BatchNorm kept in fp32), 4 or 2 bytes each;
* ``gradients``: one per trainable parameter, in the parameter's dtype;
* ``master_weights`` and ``master_gradients``: ``fp16-o2``'s fp32 copies the optimizer steps
  (4 bytes each), and the fp32 gradients copied into them;
* ``optimizer_state``: SGD's momentum (one tensor per parameter), Adam's and AdamW's two
  moments (two, three with amsgrad) and their step counts (a 4-byte scalar per parameter);
* ``activations``: every tensor autograd saves for the backward pass during one real step's
  forward and loss, counted once per storage (``torch.autograd.graph.saved_tensors_hooks``);
  the parameters and the batch themselves are not counted again, but autocast's low-precision
  copies of the weights are (autograd keeps them until the backward);
* ``batch``: the inputs and targets.

These parts are what a step allocates of each kind; they are not all alive at once. The
gradients are freed at the next step's ``zero_grad`` and appear one by one in the backward
pass while the activations are freed, and the loss's backward makes temporaries of its own
(a language model's logits-sized buffers: a GPT-2 step at sequence 1024 holds several of
50,257 floats per token). So the peak is predicted from the step's timeline: :class:`LiveBytes`
follows every tensor storage the second step makes and frees (its first made the optimizer's
state), and ``peak`` is the largest sum alive at once, with what it held then (``at_peak``).

The activations are measured, on the device asked (a CPU by default: the same ops save the same
tensors on a GPU, up to autocast's per-device op lists and the kernels each device picks, such
as attention's: notebook 10's small model saves 3.29 MiB in fp32 on an H200 and 3.04 MiB on a
CPU); the rest is arithmetic from the model
and the optimizer's class. :func:`measure_peak` runs the step on CUDA and reads
``torch.cuda.max_memory_allocated`` (and, on request, a memory snapshot), the figure the
prediction is compared with. :func:`checkpointing` says what activation checkpointing
(``torch.utils.checkpoint``, non-reentrant) saves and what it costs in step time.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ContextManager, Iterator

import torch
import torch.utils.checkpoint
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import validate
from .recipes import PRECISIONS, check_precision, sgd
from .workload import Workload, WorkloadStep, train_step
from .workloads.batches import ModelInputs

#: The parts of a step's memory, in the order they are reported.
PARTS = ("parameters", "buffers", "gradients", "master_weights", "master_gradients",
         "optimizer_state", "activations", "batch")

#: What the storages alive at the predicted peak were (see :func:`predict`): ``held``, alive
#: before the step began (weights, buffers, master copies, optimizer state, the batch, and
#: fp16-o2's master gradients of the step before);
#: ``activations``, saved by the step's forward for its backward; ``gradients``, the model's
#: ``.grad`` tensors its backward pass made (fp16-o2's new fp32 master gradients are copies made
#: after it, counted as temporaries); ``temporaries``, anything else the step made.
AT_PEAK = ("held", "activations", "gradients", "temporaries")


@dataclass(frozen=True)
class MemoryAccount:
    """The bytes one workload's step holds under one precision, part by part (see :data:`PARTS`)."""

    workload: str
    precision: str
    batch_size: int
    parameters: int
    buffers: int
    gradients: int
    master_weights: int
    master_gradients: int
    optimizer_state: int
    activations: int
    batch: int
    peak: int = 0
    at_peak: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def total(self) -> int:
        """Returns the sum of every part: the bytes if all of them were alive at once (more
        than ``peak``, or less where the loss's temporaries are large)."""
        return sum(getattr(self, p) for p in PARTS)

    def as_dict(self) -> dict[str, Any]:
        """Returns the account as a row (every part, the total, the peak and what it held as
        ``peak_<kind>``, the notes joined)."""
        row = asdict(self)
        row.pop("at_peak")
        row["total"] = self.total
        row.update({f"peak_{k}": self.at_peak.get(k, 0) for k in AT_PEAK})
        row["notes"] = "; ".join(self.notes)
        return row


def storage_id(t: torch.Tensor) -> int | None:
    """Returns the identity of ``t``'s storage while it lives (views share it), or None for a
    tensor with no storage of its own (meta, a wrapper subclass)."""
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    try:
        return StorageWeakRef(t.untyped_storage()).cdata
    except (RuntimeError, NotImplementedError, TypeError):
        return None


class LiveBytes(TorchDispatchMode):
    """Follows the bytes of the tensor storages alive while it is active, on any device.

    Every op's outputs are seen (autocast's casts and the backward's ops included); a storage
    is counted once, from when an op first returns it until it is freed (a weak reference says
    so; one an op resizes is counted at its new size). ``alive`` are tensors that exist before
    (weights, optimizer state, the batch), tagged ``"held"``; :meth:`tag` names what another
    storage is. ``peak`` is the largest sum alive just after an op returned (its inputs still
    alive), and ``at_peak`` the bytes then alive by tag (``"temporaries"`` for the untagged).
    What an op allocates inside itself and frees before returning is not seen (an fp32 GEMM's
    cuBLAS workspace: 32 MiB on an H200), nor the caching allocator's rounding.
    """

    def __init__(self, alive: Any = ()):
        super().__init__()
        self._live: dict[int, list[Any]] = {}  # storage id -> [weak reference, bytes, tag]
        self.current = 0
        for t in _tensors(alive):
            self._track(t)
            self.tag(t, "held")
        self.peak = self.current
        self.at_peak = self._by_tag()

    def _by_tag(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, nbytes, tag in self._live.values():
            out[tag or "temporaries"] = out.get(tag or "temporaries", 0) + nbytes
        return out

    def _sweep(self) -> None:
        for key in [k for k, (ref, _, _) in self._live.items() if ref.expired()]:
            self.current -= self._live.pop(key)[1]

    def _track(self, t: Any) -> None:
        key = storage_id(t)
        if key is None:
            return
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        old = self._live.get(key)
        if old is not None and not old[0].expired():
            self.current += nbytes - old[1]  # the same storage, perhaps resized
            old[1] = nbytes
            return
        if old is not None:  # a freed storage's identity given to a new one
            self.current -= old[1]
        self._live[key] = [StorageWeakRef(storage), nbytes, None]
        self.current += nbytes

    def tag(self, t: Any, kind: str) -> None:
        """Names what ``t``'s storage is, if it is followed and not named yet."""
        entry = self._live.get(storage_id(t)) if isinstance(t, torch.Tensor) else None
        if entry is not None and not entry[0].expired() and entry[2] is None:
            entry[2] = kind

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            self._track(t)
        if self.current > self.peak:
            self._sweep()  # the freed ones first: only then is the sum what is alive
            if self.current > self.peak:
                self.peak = self.current
                self.at_peak = self._by_tag()
        return out


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    s = t.untyped_storage()
    return (str(t.device), s.data_ptr())


class SavedTensors:
    """Counts the bytes of the tensors autograd saves while it is active, once per storage.

    ``exclude`` holds storages not to count (the parameters, the batch); :meth:`add` counts a
    tensor kept some other way (a checkpointed segment's inputs). ``on_save``, when set, is
    called with every tensor saved, counted or not (autograd calls only the innermost hooks).
    """

    def __init__(self, exclude: set[tuple[str, int]] = frozenset()):
        self.exclude = set(exclude)
        self.seen: dict[tuple[str, int], int] = {}
        self.active = True
        self.on_save: Callable[[torch.Tensor], None] | None = None

    @property
    def bytes(self) -> int:
        return sum(self.seen.values())

    def add(self, t: Any) -> Any:
        if self.on_save is not None and isinstance(t, torch.Tensor):
            self.on_save(t)
        if self.active and isinstance(t, torch.Tensor) and t.device.type != "meta":
            key = _storage_key(t)
            if key not in self.exclude and key[1] != 0:
                self.seen.setdefault(key, t.untyped_storage().nbytes())
        return t

    @contextlib.contextmanager
    def hooks(self) -> Iterator["SavedTensors"]:
        with torch.autograd.graph.saved_tensors_hooks(self.add, lambda t: t):
            yield self


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, ModelInputs):
        return _tensors(value.value)
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def optimizer_state_bytes(factory: Callable[[Any], torch.optim.Optimizer],
                          params: list[torch.Tensor]) -> tuple[int, str]:
    """Returns (bytes, how) of the state ``factory``'s optimizer keeps for ``params`` once it
    has stepped: from its class (SGD, Adam, AdamW) where fp16lab knows it, else counted after a
    step on zero-gradient CPU copies."""
    probe = factory([nn.Parameter(torch.zeros(1))])
    kind, d = type(probe), probe.defaults
    per_param = sum(p.numel() * p.element_size() for p in params)
    if kind is torch.optim.SGD:
        return (per_param if d.get("momentum", 0) else 0), "SGD: a momentum buffer per parameter"
    if kind in (torch.optim.Adam, torch.optim.AdamW):
        moments = 3 if d.get("amsgrad") else 2
        return (moments * per_param + 4 * len(params),
                f"{kind.__name__}: {moments} moments per parameter and a 4-byte step count")
    copies = [nn.Parameter(torch.zeros_like(p, device="cpu")) for p in params]
    opt = factory(copies)
    for c in copies:
        c.grad = torch.zeros_like(c)
    opt.step()
    counted = sum(_nbytes(_tensors(s)) for s in opt.state.values())
    return counted, f"{kind.__name__}: counted after one step on CPU copies"


def _forward_only(counter: SavedTensors) -> Callable[[str], ContextManager[Any]]:
    """Returns a make_train_step ``region`` that counts saved tensors in the forward phase only
    (the loss is computed there too)."""

    @contextlib.contextmanager
    def region(name: str) -> Iterator[None]:
        with counter.hooks() if name == "forward" else contextlib.nullcontext():
            yield

    return region


def _step_with_counter(workload: Workload, precision: str, device: Any, batch_size: int,
                       layout: str, seed: int, checkpoint: Any = None,
                       ) -> tuple[WorkloadStep, SavedTensors]:
    counter = SavedTensors()
    step = train_step(workload, precision, device, batch_size, layout=layout, seed=seed,
                      region=_forward_only(counter))
    counter.exclude = {_storage_key(t) for t in [*step.model.parameters(), *step.model.buffers(),
                                                 *_tensors(step.inputs), *_tensors(step.targets)]}
    if checkpoint is not None:
        checkpoint_modules(step.model, checkpoint, counter)
    return step, counter


def predict(workload: Workload, precision: str, batch_size: int, *, device: Any = "cpu",
            layout: str = "nchw", seed: int = 0, checkpoint: Any = None) -> MemoryAccount:
    """Returns the :class:`MemoryAccount` of ``workload``'s step under ``precision``.

    One real step runs on ``device`` to count the activations (see the module's docstring);
    ``checkpoint`` counts them with those modules checkpointed (see :func:`checkpoint_modules`).
    """
    check_precision(precision)
    batch_size = validate.count("batch_size", batch_size)
    step, counter = _step_with_counter(workload, precision, device, batch_size, layout, seed,
                                       checkpoint)
    step()
    peak, at_peak = _timeline_peak(step, counter)
    model = step.model
    params = [p for p in model.parameters()]
    trainable = [p for p in params if p.requires_grad]
    master = PRECISIONS[precision].master_weights
    # fp16-o2's optimizer steps fp32 copies: its state is fp32 (meta tensors: shapes only)
    stepped = [torch.empty(p.shape, dtype=torch.float32, device="meta") for p in trainable] \
        if master else trainable
    state, how = optimizer_state_bytes(workload.optimizer or sgd, stepped)
    notes = [how]
    if master:
        notes.append("fp16-o2: fp32 master weights and fp32 master gradients beside the fp16 model")
    if PRECISIONS[precision].autocast_dtype:
        notes.append("activations include autocast's low-precision copies of the weights")
    return MemoryAccount(
        workload=workload.name, precision=precision, batch_size=batch_size,
        parameters=_nbytes(params), buffers=_nbytes(list(model.buffers())),
        gradients=_nbytes(trainable), master_weights=4 * sum(p.numel() for p in trainable) * master,
        master_gradients=4 * sum(p.numel() for p in trainable) * master,
        optimizer_state=state, activations=counter.bytes,
        batch=_nbytes(_tensors(step.inputs) + _tensors(step.targets)), peak=peak,
        at_peak=at_peak, notes=tuple(notes))


def _held(step: WorkloadStep) -> list[torch.Tensor]:
    """Returns the tensors alive between steps: weights, buffers, the optimizer's parameters
    (fp16-o2's master copies) and state, the scaler's, the batch (and fp16-o2's fp16 copy of
    it, which the step function keeps), and the last step's
    gradients (the model's go at ``zero_grad``; fp16-o2's master gradients stay until the next
    backward pass has replaced them)."""
    opt = step.optimizer
    weights = [*step.model.parameters(), *(p for g in opt.param_groups for p in g["params"])]
    held = [*weights, *step.model.buffers(), *(p.grad for p in weights if p.grad is not None),
            *_tensors(list(opt.state.values())), *_tensors(step.inputs), *_tensors(step.targets),
            *_tensors(getattr(step.run, "batch", ()))]  # fp16-o2's fp16 copy of the batch
    scaler = step.scaler
    for name in ("_scale", "_growth_tracker"):
        held += _tensors(getattr(scaler, name, None))
    return held


def _timeline_peak(step: WorkloadStep, counter: SavedTensors) -> tuple[int, dict[str, int]]:
    """Runs ``step`` once more under :class:`LiveBytes` and returns its peak and what the
    storages alive then were (:data:`AT_PEAK`): the saved tensors are named as ``counter``'s
    hooks see autograd save them, the gradients as each is accumulated."""
    live = LiveBytes(_held(step))
    hooks = [p.register_post_accumulate_grad_hook(lambda p: live.tag(p.grad, "gradients"))
             for p in step.model.parameters() if p.requires_grad]
    counter.active, counter.on_save = False, lambda t: live.tag(t, "activations")
    try:
        with live:
            step()
    finally:
        counter.on_save = None
        for h in hooks:
            h.remove()
    return live.peak, {k: live.at_peak.get(k, 0) for k in AT_PEAK}


# ----------------------------------------------------------------------------- checkpointing

def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """Returns the blocks activation checkpointing usually wraps: the modules of the model's
    largest ``nn.ModuleList`` (a transformer's layers), else its top-level children."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if lists:
        return list(max(lists, key=len))
    return list(model.children())


def checkpoint_modules(model: nn.Module, modules: Any = "blocks",
                       counter: SavedTensors | None = None) -> list[nn.Module]:
    """Wraps each module's forward in ``torch.utils.checkpoint.checkpoint`` (non-reentrant) and
    returns them: their activations are recomputed in the backward instead of kept.

    ``modules``: ``"blocks"`` (:func:`repeated_blocks`) or a list of submodules. A ``counter``
    counts each segment's tensor inputs, which the checkpoint keeps for the recomputation.
    """
    chosen = repeated_blocks(model) if isinstance(modules, str) and modules == "blocks" \
        else list(modules)
    if not chosen or not all(isinstance(m, nn.Module) for m in chosen):
        raise ValueError("checkpoint needs 'blocks' or a non-empty list of the model's modules")
    for module in chosen:
        inner = module.forward

        def forward(*args: Any, _inner: Callable[..., Any] = inner, **kwargs: Any) -> Any:
            if counter is not None and torch.is_grad_enabled():
                for t in _tensors(list(args) + list(kwargs.values())):
                    counter.add(t)
            return torch.utils.checkpoint.checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        module.forward = forward
    return chosen


def _seconds_per_step(step: WorkloadStep, steps: int, warmup: int) -> float:
    cuda = step.inputs_device.type == "cuda"
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def checkpointing(workload: Workload, precision: str, batch_size: int, *, device: Any = "cpu",
                  modules: Any = "blocks", steps: int = 5, warmup: int = 2,
                  seed: int = 0) -> dict[str, Any]:
    """Returns what checkpointing ``modules`` saves and costs: the activation bytes with and
    without, the bytes saved, and the median seconds per step with and without (the cost is
    the recomputed forward)."""
    steps, warmup = validate.count("steps", steps), validate.count("warmup", warmup, low=0)
    row: dict[str, Any] = {"workload": workload.name, "precision": precision,
                           "batch_size": batch_size}
    for label, ck in (("plain", None), ("checkpointed", modules)):
        step, counter = _step_with_counter(workload, precision, device, batch_size, "nchw", seed,
                                           ck)
        step()
        row[f"{label}_activations"] = counter.bytes
        counter.active = False  # the first step's count is the figure; time the rest bare
        row[f"{label}_step_s"] = _seconds_per_step(step, steps, warmup)
    row["saved_bytes"] = row["plain_activations"] - row["checkpointed_activations"]
    row["slowdown"] = row["checkpointed_step_s"] / row["plain_step_s"]
    return row


# ----------------------------------------------------------------------------- measured on CUDA

def measure_peak(workload: Workload, precision: str, batch_size: int, *, steps: int = 3,
                 layout: str = "nchw", seed: int = 0, snapshot: bool = False) -> dict[str, Any]:
    """Returns the measured memory of ``steps`` steps on CUDA: ``peak_bytes``
    (``torch.cuda.max_memory_allocated`` from just before the model is built, so the model, the
    batch and the optimizer's state are in it, cuBLAS's workspaces not: they are made first), ``allocated_bytes`` after the steps, and with
    ``snapshot`` the ``torch.cuda.memory._snapshot()`` of the steps (every allocation and its
    stack, for https://pytorch.org/memory_viz)."""
    if not torch.cuda.is_available():
        raise ValueError("measure_peak needs a CUDA device; torch sees none")
    steps = validate.count("steps", steps)
    validate.boolean("snapshot", snapshot)
    _start_cublas()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    step = train_step(workload, precision, "cuda", batch_size, layout=layout, seed=seed)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    try:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        row: dict[str, Any] = {
            "workload": workload.name, "precision": precision, "batch_size": batch_size,
            "peak_bytes": torch.cuda.max_memory_allocated() - before,
            "allocated_bytes": torch.cuda.memory_allocated() - before,
            "reserved_peak_bytes": torch.cuda.memory_stats().get("reserved_bytes.all.peak", 0)}
        if snapshot:
            row["snapshot"] = torch.cuda.memory._snapshot()
    finally:
        if snapshot:
            torch.cuda.memory._record_memory_history(enabled=None)
    return row


def _start_cublas() -> None:
    """Runs one small linear layer forward and backward per dtype, so that cuBLAS's workspaces
    (made at a thread's first GEMM and kept: the backward pass runs on autograd's own thread,
    with a workspace of its own; 68 MB in all on an H200) exist before a measured window."""
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        a = torch.ones(64, 64, device="cuda", dtype=dtype, requires_grad=True)
        torch.nn.functional.linear(a, a, a[0]).sum().backward()
    torch.cuda.synchronize()


def compare(workload: Workload, precision: str, batch_size: int, *, layout: str = "nchw",
            seed: int = 0, steps: int = 3, count_on: Any = "cpu") -> dict[str, Any]:
    """Returns the prediction beside the measured CUDA peak, and their ratio (``predicted /
    measured``); ``count_on`` is where the activations are counted (``"cuda"`` is quicker for
    the real sizes, whose CPU step takes minutes)."""
    predicted = predict(workload, precision, batch_size, layout=layout, seed=seed,
                        device=count_on).as_dict()
    if count_on != "cpu":
        torch.cuda.empty_cache()
    measured = measure_peak(workload, precision, batch_size, layout=layout, seed=seed,
                            steps=steps)
    return {**predicted, "measured_peak": measured["peak_bytes"],
            "ratio": predicted["peak"] / measured["peak_bytes"]}


__all__ = ["AT_PEAK", "LiveBytes", "MemoryAccount", "PARTS", "SavedTensors", "checkpoint_modules",
           "checkpointing", "compare", "measure_peak", "optimizer_state_bytes", "predict",
           "repeated_blocks", "storage_id"]

"""A distributed point: one measured configuration (model, batch per GPU, precision, DDP or FSDP
and how its gradients travel), checked on creation; its fields start the point's row."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .. import validate
from ..models import MODELS, is_image_model
from ..recipes import OPTIMIZERS, check_precision, precisions
from ..workload import check_settings, load_workload
from ..workloads import WORKLOADS

#: How the gradients are averaged across ranks.
STRATEGIES = {
    "ddp": "DistributedDataParallel: every rank holds the whole model; gradients all-reduced in buckets",
    "fsdp": "FSDP2 fully_shard: parameters, gradients and optimizer state sharded; all-gather + reduce-scatter",
}

#: DDP communication hooks: the precision the gradient buckets travel in.
COMM_HOOKS = {
    "none": "no hook: buckets all-reduced in the gradients' own dtype (fp32)",
    "fp16": "torch's fp16_compress_hook: bucket cast to fp16, divided by the world size, all-reduced",
    "bf16": "torch's bf16_compress_hook: the same in bf16",
}

#: FSDP reduce dtypes: the precision gradients are reduce-scattered in.
REDUCE_DTYPES = ("fp32", "bf16", "fp16")

#: Models a point can train: fp16lab.models plus a parameter-heavy transformer stack.
DIST_MODELS = {**MODELS, "transformer_stack": (
    "6 pre-norm transformer encoder layers, hidden 2048, 16 heads, on 64 tokens (~300M parameters): "
    "a model whose gradient all-reduce is large next to its compute")}

#: The measurement protocol, written once: warm-up steps, timed steps, cudnn.benchmark (off, as
#: in the one-GPU sweep's default, so the two measure the same thing).
WARMUP, STEPS, CUDNN_BENCHMARK = 10, 30, False


#: Faults a point can plant, for tests and the notebook: ``raise@R`` (rank R raises in its
#: first timed step) or ``hang@R`` (rank R sleeps forever there).
FAULTS = ("raise", "hang")


@dataclass(frozen=True)
class DistPoint:
    """One distributed training configuration to measure.

    Args:
        model: a name in ``DIST_MODELS``, or a workload's name (a built-in workload such as
            ``"gpt2-small"``, or ``"package.module:function"`` importable on every rank) that
            each rank builds with :func:`fp16lab.workload.load_workload`.
        batch: samples per GPU (the global batch is ``batch * gpus``).
        precision: ``fp32``, ``amp-fp16`` (autocast + GradScaler) or ``amp-bf16`` (autocast):
            the precisions whose ``autocast_recipe`` is true (:mod:`fp16lab.recipes`).
        optimizer: a name in ``fp16lab.recipes.OPTIMIZERS`` (``sgd``, or ``sgd-fused``, whose
            step takes GradScaler's found-inf without a host sync).
        gpus: number of ranks; 1 trains the plain model (the single-GPU baseline, no wrapper).
        strategy: ``ddp`` or ``fsdp``.
        comm_hook: DDP only: ``none``, ``fp16`` or ``bf16``.
        bucket_cap_mb, gradient_as_bucket_view, static_graph: DDP's own arguments.
        broadcast_buffers: DDP's own argument: True broadcasts rank 0's buffers (BatchNorm's
            running statistics) to every rank at the start of each forward; False lets each
            rank keep its own.
        reduce_dtype: FSDP only: the gradients' reduce-scatter dtype.
        reshard_after_forward: FSDP only (``fully_shard``'s own argument): True frees each
            unit's gathered parameters after its forward and gathers them again for its
            backward (less memory, one more all-gather per unit); False keeps them to the
            backward.
        layout: ``channels_last`` or ``nchw`` (image models); None picks channels_last for them.
        device: ``cuda`` (NCCL, one GPU per rank) or ``cpu`` (gloo).
        warmup, steps: untimed and timed steps.
        profile_steps: extra steps under torch.profiler to split the step into compute and
            communication (CUDA only; 0 skips).
        fault: ``''``, ``'raise@R'`` or ``'hang@R'`` (see ``FAULTS``).
        workload_settings: the settings a workload ``model`` is built with (plain values:
            they travel to the ranks as JSON), e.g. ``{"tiny": True}``.
    """

    model: str = "resnet50"
    batch: int = 256
    precision: str = "amp-fp16"
    optimizer: str = "sgd"
    gpus: int = 1
    strategy: str = "ddp"
    comm_hook: str = "none"
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    broadcast_buffers: bool = True
    reduce_dtype: str = "fp32"
    reshard_after_forward: bool = True
    layout: str | None = None
    device: str = "cuda"
    warmup: int = WARMUP
    steps: int = STEPS
    profile_steps: int = 0
    fault: str = ""
    workload_settings: dict[str, Any] = field(default_factory=dict)

    @property
    def is_workload(self) -> bool:
        """True where ``model`` names a workload rather than one of ``DIST_MODELS``."""
        return self.model not in DIST_MODELS

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        def keep(name: str, value: Any) -> None:  # the checked value (an int for a count)
            object.__setattr__(self, name, value)

        keep("workload_settings", check_settings(self.workload_settings))
        if self.is_workload:
            try:  # what every rank will do, once here: a name that does not load fails now
                load_workload(validate.text("model", self.model), **self.workload_settings)
            except (ImportError, TypeError, RuntimeError) as e:
                raise ValueError(f"model {self.model!r}: {e}") from None
            except ValueError:
                raise ValueError(f"model must be one of {', '.join(map(repr, DIST_MODELS))}, or "
                                 f"a workload: a built-in one ({', '.join(map(repr, WORKLOADS))}) "
                                 f"or 'package.module:function'; got {self.model!r}") from None
        else:
            check(not self.workload_settings, "workload_settings apply to a workload model only")
        keep("batch", validate.count("batch (per GPU)", self.batch))
        # fp32 changed only by autocast: the ranks run with TF32 off, and FSDP takes autocast's
        # dtype as its parameter dtype (fp32, amp-fp16, amp-bf16)
        check_precision(self.precision, precisions(autocast_recipe=True), where="across GPUs")
        validate.choice("optimizer", self.optimizer, OPTIMIZERS)
        keep("gpus", validate.count("gpus", self.gpus))
        validate.choice("strategy", self.strategy, STRATEGIES)
        validate.choice("comm_hook", self.comm_hook, COMM_HOOKS)
        validate.choice("reduce_dtype", self.reduce_dtype, REDUCE_DTYPES)
        check(self.strategy == "ddp" or self.comm_hook == "none",
              "comm_hook applies to DDP only; FSDP sets its gradient precision with reduce_dtype")
        check(self.strategy == "fsdp" or self.reduce_dtype == "fp32",
              "reduce_dtype applies to FSDP only; DDP sets its gradient precision with comm_hook")
        keep("reshard_after_forward",
             validate.boolean("reshard_after_forward", self.reshard_after_forward))
        check(self.strategy == "fsdp" or self.reshard_after_forward,
              "reshard_after_forward applies to FSDP only; DDP keeps whole parameters on every rank")
        validate.number("bucket_cap_mb", self.bucket_cap_mb, low=0, low_open=True)
        for name in ("gradient_as_bucket_view", "static_graph", "broadcast_buffers"):
            keep(name, validate.boolean(name, getattr(self, name)))
        validate.choice("device", self.device, ("cuda", "cpu"))
        image = not self.is_workload and self.model != "transformer_stack" and \
            is_image_model(self.model)
        if self.layout is None:
            keep("layout", "channels_last" if image else "nchw")
        validate.choice("layout", self.layout, ("nchw", "channels_last"))
        check(image or self.layout == "nchw",
              f"layout 'channels_last' applies to the built-in image models only, not {self.model!r}")
        keep("warmup", validate.count("warmup", self.warmup, low=0))
        keep("steps", validate.count("steps", self.steps))
        keep("profile_steps", validate.count("profile_steps", self.profile_steps, low=0))
        if self.fault != "":
            validate.text("fault", self.fault, pattern=rf"({'|'.join(FAULTS)})@\d+",
                          like="'raise@R' or 'hang@R' (or '', no fault)")
            check(int(self.fault.partition("@")[2]) < self.gpus,
                  f"fault must be '', 'raise@R' or 'hang@R' with R < gpus={self.gpus}, got {self.fault!r}")

    def settings(self) -> dict[str, Any]:
        """Returns the point's fields as a plain dict (what a row starts with)."""
        return asdict(self)

    def label(self) -> str:
        """Returns a short name like 'resnet50 b256 amp-fp16 x2 ddp hook=fp16' ('opt=sgd-fused' last
        where the optimizer is not the default)."""
        parts = [self.model, f"b{self.batch}", self.precision, f"x{self.gpus}"]
        if self.gpus > 1:
            parts.append(self.strategy)
            if self.strategy == "ddp":
                parts += [f"hook={self.comm_hook}", f"bucket={self.bucket_cap_mb:g}MB"]
                if self.static_graph:
                    parts.append("static_graph")
                if not self.gradient_as_bucket_view:
                    parts.append("no_bucket_view")
                if not self.broadcast_buffers:
                    parts.append("no_broadcast")
            else:
                parts.append(f"reduce={self.reduce_dtype}")
                if not self.reshard_after_forward:
                    parts.append("no_reshard")
        if self.optimizer != "sgd":
            parts.append(f"opt={self.optimizer}")
        return " ".join(parts)



def point_fields() -> list[str]:
    """Returns DistPoint's field names (the columns a row starts with)."""
    return [f.name for f in fields(DistPoint)]

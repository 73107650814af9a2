"""FSDP2 with mixed precision: the policy a point asks for, the sharded GradScaler, and its check.

Under FSDP2 (``torch.distributed.fsdp.fully_shard``) each rank holds a shard of every parameter
and of its gradient. ``MixedPrecisionPolicy`` says in which dtype the gathered parameters run
(``param_dtype``: autocast's dtype here, as the recipes of :mod:`fp16lab.recipes` say) and in
which the gradients are reduce-scattered (``reduce_dtype``). FP16 training needs a loss scaler
whose skip decision is the same on every rank, though an inf may sit in one rank's shard only:
``ShardedGradScaler`` all-reduces its found-inf flag across the ranks
(https://github.com/pytorch/pytorch/blob/main/torch/distributed/fsdp/sharded_grad_scaler.py).
:func:`sharded_found_inf` plants an inf in one rank's shard and reports what each rank did.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..recipes import LR, MOMENTUM, PRECISIONS, autocast_dtype

#: The reduce dtypes a point may ask for, by name.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def shard(model: nn.Module, precision: str, reduce_dtype: str = "fp32") -> nn.Module:
    """Returns ``model`` sharded in place with FSDP2: each transformer layer or ResNet block
    its own unit, then the whole model, under the policy of ``precision`` and ``reduce_dtype``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=autocast_dtype(precision),
                                  reduce_dtype=DTYPES[reduce_dtype])
    for module in model.modules():
        if isinstance(module, nn.TransformerEncoderLayer) or \
                type(module).__name__ in ("Bottleneck", "BasicBlock"):
            fully_shard(module, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def loss_scaler(precision: str, device: str, strategy: str, world: int) -> Any:
    """Returns what scales a distributed point's loss: ``"recipe"`` (the precision's own, a
    GradScaler for amp-fp16) except for FSDP across ranks with a scaled precision, which gets
    ``ShardedGradScaler`` (its found-inf is all-reduced over the ranks)."""
    if strategy == "fsdp" and world > 1 and PRECISIONS[precision].scaled:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device)
    return "recipe"


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (a plain tensor is its own)."""
    return t.to_local() if hasattr(t, "to_local") else t


def sharded_found_inf(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Trains one amp-fp16 step of a small MLP under FSDP2 with ``ShardedGradScaler``, an inf
    planted after the backward in rank ``inf_rank``'s shard of the first weight's gradient.

    Returns, per rank: whether its own shards of the gradients were finite before the step,
    whether the step changed its shards of the weights, and the scale after ``update()``.
    """
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    inf_rank, init_scale = int(item.get("inf_rank", 1)), float(item.get("init_scale", 2.0 ** 10))
    dev = ctx.device
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).to(dev)
    for layer in model:
        if isinstance(layer, nn.Linear):
            shard(layer, "amp-fp16")
    shard(model, "amp-fp16")
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    scaler = ShardedGradScaler(dev.type, init_scale=init_scale)
    torch.manual_seed(100 + ctx.rank)
    x = torch.randn(8, 16, device=dev)
    y = torch.randint(0, 8, (8,), device=dev)
    with torch.autocast(dev.type, dtype=torch.float16):
        loss = F.cross_entropy(model(x).float(), y)
    scaler.scale(loss).backward()
    first = _local(next(iter(model.parameters())).grad)
    if ctx.rank == inf_rank and first.numel():
        first.view(-1)[0] = float("inf")
    local_finite = all(bool(torch.isfinite(_local(p.grad)).all()) for p in model.parameters())
    before = [_local(p).detach().clone() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    stepped = any(not torch.equal(b, _local(p)) for b, p in zip(before, model.parameters()))
    ranks = ctx.gather({"rank": ctx.rank, "local_grads_finite": local_finite, "stepped": stepped,
                        "scale_after": float(scaler.get_scale())})
    return {"task": "sharded_found_inf", "status": "ok", "error": None, "inf_rank": inf_rank,
            "init_scale": init_scale, "backend": ctx.backend, "world_size": ctx.world,
            "ranks": ranks}


__all__ = ["DTYPES", "loss_scaler", "shard", "sharded_found_inf"]

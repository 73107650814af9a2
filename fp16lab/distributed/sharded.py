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

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..recipes import LR, MOMENTUM, PRECISIONS, autocast_dtype

#: The reduce dtypes a point may ask for, by name.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def shard(model: nn.Module, precision: str, reduce_dtype: str = "fp32", *,
          reshard_after_forward: bool = True) -> nn.Module:
    """Returns ``model`` sharded in place with FSDP2: each transformer layer or ResNet block
    its own unit, then the whole model, under the policy of ``precision`` and ``reduce_dtype``
    (``reshard_after_forward`` is ``fully_shard``'s own argument).

    The ranks' mesh is made on the device the model's parameters are on: left to itself,
    ``fully_shard`` makes it on the machine's accelerator, so that a CPU (gloo) run on a
    one-GPU machine sent rank 1 to a ``cuda:1`` that does not exist."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=autocast_dtype(precision),
                                  reduce_dtype=DTYPES[reduce_dtype])
    mesh = init_device_mesh(next(model.parameters()).device.type,
                            (torch.distributed.get_world_size(),))
    for module in model.modules():
        if isinstance(module, nn.TransformerEncoderLayer) or \
                type(module).__name__ in ("Bottleneck", "BasicBlock"):
            fully_shard(module, mesh=mesh, mp_policy=policy,
                        reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


def _shard_linears(model: nn.Sequential, precision: str, reduce_dtype: str = "fp32") -> nn.Module:
    """The checks' small MLPs sharded as :func:`shard` shards a real model: each Linear layer
    its own unit, then the whole model."""
    for layer in model:
        if isinstance(layer, nn.Linear):
            shard(layer, precision, reduce_dtype)
    return shard(model, precision, reduce_dtype)


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
    model = _shard_linears(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).to(dev),
                           "amp-fp16")
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


def _classifier() -> nn.Module:
    """sharded_reduce's model: three Linear layers, each its own FSDP unit."""
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
                         nn.Linear(64, 10))


def _flat_grads(model: nn.Module) -> torch.Tensor:
    """Every parameter's whole gradient (a sharded one gathered from the ranks), flattened."""
    return torch.cat([(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad)
                      .detach().double().flatten() for p in model.parameters()])


def sharded_reduce(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Trains one classifier under FSDP2 once per reduce dtype of ``reduce_dtypes`` (default
    fp32, then bf16), ``steps`` steps of AdamW with the parameters in ``precision``'s dtype,
    each rank on its own batches of a learnable task (labels from a fixed linear teacher).

    Returns, per reduce dtype, the loss of every step (averaged over the ranks) and, at the
    first step, ``grad_error``: how far the reduce-scattered gradient lies from the exact
    average of the ranks' gradients, max |g - exact| / max |exact|. The exact one is computed
    by every rank on an unsharded copy of the model (same dtype, same batch), gathered, and
    averaged in float64: an fp32 reduce should leave only float32 rounding, a bf16 reduce
    about 2^-9 of the largest gradient.
    """
    steps = int(item.get("steps", 200))
    precision = str(item.get("precision", "amp-bf16"))
    reduce_dtypes = list(item.get("reduce_dtypes", ["fp32", "bf16"]))
    if steps < 1 or precision not in PRECISIONS or not all(r in DTYPES for r in reduce_dtypes):
        raise ValueError(f"sharded_reduce: steps >= 1, precision one of {', '.join(PRECISIONS)}, "
                         f"reduce_dtypes from {', '.join(DTYPES)}; got {steps}, {precision!r}, "
                         f"{reduce_dtypes!r}")
    dev, dtype = ctx.device, autocast_dtype(precision)
    teacher = torch.randn(32, 10, generator=torch.Generator().manual_seed(7)).to(dev)
    runs = []
    for reduce_dtype in reduce_dtypes:
        torch.manual_seed(0)  # the same initial weights on every rank and in every run
        model = _classifier().to(dev)
        exact_model = copy.deepcopy(model).to(dtype)
        _shard_linears(model, precision, reduce_dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.Generator().manual_seed(100 + ctx.rank)  # each rank its own batches
        losses, grad_error = [], None
        for step in range(steps):
            x = torch.randn(64, 32, generator=data).to(dev)
            y = (x @ teacher).argmax(1)
            loss = F.cross_entropy(model(x).float(), y)
            loss.backward()
            if step == 0:
                F.cross_entropy(exact_model(x.to(dtype)).float(), y).backward()
                mine = torch.cat([p.grad.double().flatten() for p in exact_model.parameters()])
                exact = torch.stack([t.to(dev) for t in ctx.gather(mine.cpu())]).mean(0)
                got = _flat_grads(model)
                grad_error = float((got - exact).abs().max() / exact.abs().max())
            opt.step()
            opt.zero_grad()
            mean = loss.detach().float().clone()
            torch.distributed.all_reduce(mean)
            losses.append(float(mean) / ctx.world)
        runs.append({"reduce_dtype": reduce_dtype, "losses": losses, "grad_error": grad_error})
    return {"task": "sharded_reduce", "status": "ok", "error": None, "precision": precision,
            "steps": steps, "backend": ctx.backend, "world_size": ctx.world, "runs": runs}


__all__ = ["DTYPES", "loss_scaler", "shard", "sharded_found_inf", "sharded_reduce"]

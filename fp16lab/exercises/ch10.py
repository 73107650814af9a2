"""Exercises of notebook 10 (your own model): a workload written by the learner, trained to check
it, and a step's memory counted by hand, checked against :func:`fp16lab.memory.predict`."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..memory import predict
from ..workload import Workload, WorkloadCannotRun, train_step
from ..workloads.batches import synthetic_batch
from .core import Exercise, Wrong

__all__ = ["SmallCNN", "q1", "q2"]


class SmallCNN(nn.Module):
    """The model q1 wraps: two convolutions and a linear head, for 3 x 32 x 32 images, 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def _check_q1(answer: object) -> str:
    workload = answer() if callable(answer) and not isinstance(answer, Workload) else answer
    if not isinstance(workload, Workload):
        raise Wrong(f"give a Workload (or a function returning one), not {type(workload).__name__}.")
    model = workload.build()
    if not isinstance(model, SmallCNN):
        raise Wrong(f"build() should return a fresh SmallCNN, it returned {type(model).__name__}.")
    inputs, targets = workload.batch(8, "cpu")
    if not isinstance(inputs, torch.Tensor) or tuple(inputs.shape) != (8, 3, 32, 32):
        shape = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__
        raise Wrong(f"batch(8, 'cpu') should give images of shape (8, 3, 32, 32), got {shape}.")
    if not isinstance(targets, torch.Tensor) or targets.shape != (8,) or targets.dtype != torch.long \
            or not bool(((targets >= 0) & (targets < 10)).all()):
        raise Wrong("the targets should be 8 class labels (torch.long) between 0 and 9.")
    try:
        step = train_step(workload, "amp-bf16", "cpu", 8, layout="channels_last")
    except WorkloadCannotRun as e:
        raise Wrong(f"fp16lab could not train it: {e}") from None
    losses = [float(step().detach()) for _ in range(8)]
    if not all(math.isfinite(v) for v in losses):
        raise Wrong(f"the loss went non-finite in 8 amp-bf16 steps: {losses}.")
    if not losses[-1] < losses[0]:
        raise Wrong(f"8 steps on one batch did not lower the loss ({losses[0]:.3f} -> "
                    f"{losses[-1]:.3f}): is the batch the same on every call?")
    return (f"your workload trains: 8 amp-bf16 steps in channels_last on a CPU took the loss from "
            f"{losses[0]:.3f} to {losses[-1]:.3f}. Every engine of fp16lab takes it now.")


q1 = Exercise(
    "q1", "Write a Workload for SmallCNN (images 3 x 32 x 32, 10 classes): its build, and a batch "
    "of random images and labels that is the same on every call. Pass the Workload.", _check_q1,
    hint="Workload(name=..., build=SmallCNN, batch=synthetic_batch((3, 32, 32), num_classes=10)); "
         "synthetic_batch is in fp16lab.workloads.batches.",
    solution="A name, the class as build (a function of no arguments that returns a fresh model), "
             "and synthetic_batch for the batch.",
    solution_code="from fp16lab.workload import Workload\n"
                  "from fp16lab.workloads.batches import synthetic_batch\n"
                  "from fp16lab.exercises.ch10 import SmallCNN\n"
                  "Workload(name='small-cnn', build=SmallCNN,\n"
                  "         batch=synthetic_batch((3, 32, 32), num_classes=10))",
    time_limit_s=60.0)


def _q2_parts() -> dict[str, int]:
    account = predict(Workload(name="small-cnn", build=SmallCNN,
                               batch=synthetic_batch((3, 32, 32), num_classes=10)), "fp32", 2)
    return {"parameters": account.parameters, "gradients": account.gradients,
            "optimizer_state": account.optimizer_state}


def _check_q2(answer: object) -> str:
    try:
        value = float(answer)
    except (TypeError, ValueError):
        raise Wrong(f"give a number of bytes, not {type(answer).__name__} {answer!r}.") from None
    parts = _q2_parts()
    right = sum(parts.values())
    n = parts["parameters"] // 4
    if value == right:
        return (f"{right:,} bytes: {n:,} parameters x 4 bytes, three times (the weights, their "
                "gradients, SGD's momentum), all fp32. The activations come on top and grow "
                "with the batch.")
    if value == 2 * right / 3:
        raise Wrong("that counts the weights and the gradients; SGD with momentum keeps one "
                    "more tensor per parameter.")
    if value == n:
        raise Wrong("that is the number of parameters; each fp32 value takes 4 bytes, and the "
                    "step keeps more than one copy.")
    if value == parts["parameters"]:
        raise Wrong("that is the weights alone; the step also keeps their gradients and SGD's "
                    "momentum.")
    raise Wrong(f"{value:,.0f} is not it: count the parameters (sum of p.numel()), then the "
                "bytes of each fp32 copy the step keeps.")


q2 = Exercise(
    "q2", "Training SmallCNN in fp32 with SGD and momentum: how many bytes do the weights, their "
    "gradients and the optimizer's state take together (the activations and the batch aside)?",
    _check_q2,
    hint="sum(p.numel() for p in SmallCNN().parameters()) values, 4 bytes each, and count how "
         "many tensors of that size the step keeps.",
    solution="3 x 4 bytes x the parameter count: weights, gradients and one momentum buffer.",
    solution_code="3 * 4 * sum(p.numel() for p in SmallCNN().parameters())")

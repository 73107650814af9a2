"""fp16lab's five models (:mod:`fp16lab.models`) as workloads: the same models, batches and loss."""

from __future__ import annotations

from .. import models
from ..workload import Workload
from .batches import cross_entropy, synthetic_batch
from . import require


def _model_workload(name: str) -> Workload:
    if name in ("resnet18", "resnet50"):
        require(name)
    shape = models.input_shape(name, 1)[1:]
    return Workload(name=name, build=lambda: models.build_model(name),
                    batch=synthetic_batch(shape, models.NUM_CLASSES), loss=cross_entropy,
                    layouts=("nchw", "channels_last") if models.is_image_model(name) else ("nchw",))


def small_cnn() -> Workload:
    """Returns the 4-layer CIFAR-sized CNN on 3x32x32 images."""
    return _model_workload("small_cnn")


def mlp() -> Workload:
    """Returns the 3-layer MLP on 64 features."""
    return _model_workload("mlp")


def transformer_block() -> Workload:
    """Returns one pre-norm transformer encoder block (d=256, 4 heads) on 64 tokens."""
    return _model_workload("transformer_block")


def resnet18() -> Workload:
    """Returns torchvision's ResNet-18 (10 classes) on 3x224x224 images."""
    return _model_workload("resnet18")


def resnet50() -> Workload:
    """Returns torchvision's ResNet-50 (10 classes) on 3x224x224 images."""
    return _model_workload("resnet50")

"""Models the notebooks train: small ones that run on a CPU in seconds, real ones for the GPU.

``build_model(name)`` returns a fresh ``torch.nn.Module`` and ``input_shape(name, batch)`` the
shape of one synthetic batch for it. ResNets come from torchvision (an optional dependency:
``pip install fp16lab[vision]``); the rest are defined here.
"""

from __future__ import annotations

import torch
from torch import nn

from . import validate

#: Model names build_model() accepts, with what each is for.
MODELS = {
    "small_cnn": "4-layer CNN on 3x32x32 images; trains on a CPU in seconds",
    "mlp": "3-layer MLP on 64 features; the smallest model, for CPU tests",
    "transformer_block": "one pre-norm transformer encoder block (d=256, 4 heads) on 64 tokens",
    "resnet18": "torchvision ResNet-18 on 3x224x224 images (needs torchvision)",
    "resnet50": "torchvision ResNet-50 on 3x224x224 images (needs torchvision)",
}

#: Number of classes every classifier here predicts.
NUM_CLASSES = 10


class SmallCNN(nn.Module):
    """Conv-BN-ReLU x3, global pool, linear: a CIFAR-sized classifier."""

    def __init__(self, width: int = 32, num_classes: int = NUM_CLASSES):
        width, num_classes = validate.count("width", width), validate.count("num_classes", num_classes)
        super().__init__()
        w = width
        self.features = nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
            nn.Conv2d(w, 2 * w, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(2 * w),
            nn.ReLU(inplace=True),
            nn.Conv2d(2 * w, 4 * w, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(4 * w),
            nn.ReLU(inplace=True),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


class MLP(nn.Module):
    """Linear-ReLU-Linear-ReLU-Linear."""

    def __init__(self, in_features: int = 64, hidden: int = 128, num_classes: int = NUM_CLASSES):
        in_features, hidden = validate.count("in_features", in_features), validate.count("hidden", hidden)
        num_classes = validate.count("num_classes", num_classes)
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TransformerBlockClassifier(nn.Module):
    """One transformer encoder block over token embeddings, mean-pooled into a classifier."""

    def __init__(self, d_model: int = 256, nhead: int = 4, num_classes: int = NUM_CLASSES):
        d_model, nhead = validate.count("d_model", d_model), validate.count("nhead", nhead)
        num_classes = validate.count("num_classes", num_classes)
        if d_model % nhead:
            raise ValueError(f"d_model ({d_model}) must be a multiple of nhead ({nhead})")
        super().__init__()
        self.block = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=4 * d_model,
                                                dropout=0.0, batch_first=True, norm_first=True)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x).mean(dim=1))


_INPUT_SHAPES = {
    "small_cnn": (3, 32, 32),
    "mlp": (64,),
    "transformer_block": (64, 256),
    "resnet18": (3, 224, 224),
    "resnet50": (3, 224, 224),
}


def _check_name(name: str) -> None:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")


def build_model(name: str) -> nn.Module:
    """Returns a freshly initialised model by name (see ``MODELS``)."""
    _check_name(name)
    if name == "small_cnn":
        return SmallCNN()
    if name == "mlp":
        return MLP()
    if name == "transformer_block":
        return TransformerBlockClassifier()
    try:
        import torchvision
    except ImportError as e:
        raise ImportError(f"model {name!r} needs torchvision: pip install 'fp16lab[vision]'") from e
    return getattr(torchvision.models, name)(num_classes=NUM_CLASSES)


def input_shape(name: str, batch: int) -> tuple[int, ...]:
    """Returns the shape of one input batch for the named model."""
    _check_name(name)
    if batch < 1:
        raise ValueError(f"batch size must be a positive integer, got {batch}")
    return (batch, *_INPUT_SHAPES[name])


def is_image_model(name: str) -> bool:
    """Returns True for models whose input is NCHW images (so memory layout matters)."""
    _check_name(name)
    return len(_INPUT_SHAPES[name]) == 3

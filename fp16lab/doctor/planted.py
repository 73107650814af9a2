"""Eight workloads, each with one planted problem, that test the doctor: its first finding
should name the problem.

Each factory takes ``tiny=True`` for a CPU-sized version of the same model. :data:`PLANTED`
gives, per name, the factory, the configuration the workload is started in, its batch size,
the kind of finding that names its problem, and whether the problem shows on a CPU (a
dimension of 4097 costs nothing there, nor does a GPU's idle time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import validate
from ..workload import Workload
from ..workloads.batches import cross_entropy, synthetic_batch

CLASSES = 16


@dataclass(frozen=True)
class Planted:
    """One planted workload: how the doctor is started on it and what it should find first."""

    reference: str
    precision: str
    layout: str
    batch_size: int
    tiny_batch_size: int
    expected: str
    shows_on_cpu: bool
    problem: str
    #: the precision a run on the CPU starts from, where it is not ``precision``
    cpu_precision: str | None = None

    def precision_on(self, device: Any) -> str:
        """The precision the doctor starts from on ``device``."""
        cpu = torch.device(validate.device("device", device)).type == "cpu"
        return self.cpu_precision if cpu and self.cpu_precision else self.precision


class NaiveRMSNorm(nn.Module):
    """``x / sqrt(mean(x * x))``, written out: under autocast ``x * x`` runs in FP16, where
    any element above 256 squares past 65504."""

    def __init__(self, width: int):
        super().__init__()
        width = validate.count("width", width)
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * self.weight


def _scaled_linear(fin: int, fout: int, factor: float) -> nn.Linear:
    layer = nn.Linear(fin, fout)
    with torch.no_grad():
        layer.weight.mul_(factor)
        layer.bias.mul_(factor)
    return layer


def _mlp_workload(name: str, build, features: int, settings: dict, **kw) -> Workload:
    return Workload(name=name, build=build, batch=synthetic_batch((features,), CLASSES),
                    settings=settings, **kw)


def overflow(tiny: bool = False) -> Workload:
    """An activation above FP16's range: a linear layer whose outputs reach about 1e5."""
    tiny = validate.boolean("tiny", tiny)
    d = 64 if tiny else 1024
    return _mlp_workload(
        "planted-overflow", lambda: nn.Sequential(
            _scaled_linear(64, d, 3e5), nn.LayerNorm(d), nn.ReLU(), nn.Linear(d, CLASSES)),
        64, {"tiny": tiny})


def underflow(tiny: bool = False) -> Workload:
    """Gradients below FP16's smallest subnormal at GradScaler's default scale: the loss is
    multiplied by 2**-40 (and the learning rate by 2**40, so fp32 trains as usual)."""
    tiny = validate.boolean("tiny", tiny)
    d = 64 if tiny else 1024
    factor = 2.0**-40
    return _mlp_workload(
        "planted-underflow", lambda: nn.Sequential(
            nn.Linear(64, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU(), nn.Linear(d, CLASSES)),
        64, {"tiny": tiny}, loss=lambda out, y: cross_entropy(out, y) * factor,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.05 / factor, momentum=0.9))


def fp32_layer(tiny: bool = False) -> Workload:
    """A layer that must stay in FP32: a hand-written RMS norm after a layer whose outputs are
    about 300 (their squares overflow FP16)."""
    tiny = validate.boolean("tiny", tiny)
    d = 64 if tiny else 1024
    return _mlp_workload(
        "planted-fp32-layer", lambda: nn.Sequential(
            _scaled_linear(64, d, 1000.0), NaiveRMSNorm(d), nn.ReLU(), nn.Linear(d, CLASSES)),
        64, {"tiny": tiny})


def odd_dimension(tiny: bool = False, hidden: int | None = None) -> Workload:
    """A hidden size of 4097, not a multiple of 8 (the setting ``hidden`` changes it)."""
    tiny = validate.boolean("tiny", tiny)
    width = 32 if tiny else 2048
    hidden = validate.count("hidden", hidden) if hidden is not None else (33 if tiny else 4097)
    return _mlp_workload(
        "planted-odd-dimension", lambda: nn.Sequential(
            nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width), nn.GELU(),
            nn.Linear(width, CLASSES)), width, {"tiny": tiny, "hidden": hidden})


def _cnn(channels: int) -> nn.Module:
    layers: list[nn.Module] = []
    cin = 3
    for cout in (channels, channels * 2, channels * 2, channels * 4):
        layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                   nn.ReLU()]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, CLASSES))


def nchw_convolutions(tiny: bool = False) -> Workload:
    """Convolutions trained in NCHW, where channels_last would be faster on tensor cores."""
    tiny = validate.boolean("tiny", tiny)
    side = 16 if tiny else 64
    ch = 8 if tiny else 64
    return Workload(name="planted-nchw", build=lambda: _cnn(ch),
                    batch=synthetic_batch((3, side, side), CLASSES), settings={"tiny": tiny})


def host_sync(tiny: bool = False) -> Workload:
    """A launch-bound step (many small layers) under amp-fp16 with a non-fused SGD, so
    GradScaler reads found-inf on the host every step."""
    tiny = validate.boolean("tiny", tiny)
    d, depth = (32, 4) if tiny else (256, 24)

    def build() -> nn.Module:
        layers: list[nn.Module] = [nn.Linear(64, d)]
        for _ in range(depth):
            layers += [nn.ReLU(), nn.Linear(d, d)]
        return nn.Sequential(*layers, nn.ReLU(), nn.Linear(d, CLASSES))

    return _mlp_workload("planted-host-sync", build, 64, {"tiny": tiny})


def small_batch(tiny: bool = False) -> Workload:
    """A batch too small for the GPU: four 8192-wide layers trained at batch 8."""
    tiny = validate.boolean("tiny", tiny)
    d = 128 if tiny else 8192

    def build() -> nn.Module:
        layers: list[nn.Module] = []
        for _ in range(4):
            layers += [nn.Linear(d, d), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(d, CLASSES))

    return _mlp_workload("planted-small-batch", build, d, {"tiny": tiny})


def slow_input(tiny: bool = False, passes: int | None = None) -> Workload:
    """An input pipeline slower than the model: each image is blurred on the CPU, ``passes``
    times (32 tiny, 8 otherwise) through an FFT, before the batch goes to the device."""
    tiny = validate.boolean("tiny", tiny)
    passes = validate.count("passes", passes, low=0) if passes is not None else (32 if tiny else 8)
    side = 32 if tiny else 96
    ch = 8 if tiny else 32

    def batch(size: int, device):
        g = torch.Generator().manual_seed(size)
        images = torch.randn(size, 3, side, side, generator=g)
        kernel = torch.exp(-torch.linspace(-3, 3, side) ** 2)
        blur = kernel[:, None] * kernel[None, :]
        for _ in range(passes):
            images = torch.stack([torch.fft.ifft2(torch.fft.fft2(im) * blur).real
                                  for im in images])
        labels = torch.randint(0, CLASSES, (size,), generator=g)
        return images.to(device), labels.to(device)

    return Workload(name="planted-slow-input", build=lambda: _cnn(ch), batch=batch,
                    settings={"tiny": tiny, "passes": passes})


_HERE = "fp16lab.doctor.planted:"

#: The planted suite: name -> how to start the doctor on it and what it should find first.
PLANTED = {
    "overflow": Planted(_HERE + "overflow", "amp-fp16", "nchw", 256, 32, "range", True,
                        "an activation that overflows FP16"),
    "underflow": Planted(_HERE + "underflow", "amp-fp16", "nchw", 256, 32, "range", True,
                         "gradients that underflow at the default scale"),
    "fp32-layer": Planted(_HERE + "fp32_layer", "amp-fp16", "nchw", 256, 32, "sensitive", True,
                          "a layer that must stay in FP32"),
    "odd-dimension": Planted(_HERE + "odd_dimension", "amp-bf16", "nchw", 4096, 32, "shapes",
                             False, "a dimension of 4097"),
    "nchw": Planted(_HERE + "nchw_convolutions", "amp-bf16", "nchw", 128, 8, "layout", False,
                    "NCHW convolutions"),
    "host-sync": Planted(_HERE + "host_sync", "amp-fp16", "nchw", 64, 16, "time", False,
                         "GradScaler with a non-fused optimizer on a launch-bound step"),
    "small-batch": Planted(_HERE + "small_batch", "amp-bf16", "nchw", 8, 2, "batch", False,
                           "a batch too small for the GPU"),
    # fp32 on the CPU, where autocast to bf16 can be the slower recipe by far (torch 2.14.1 on
    # a 2-core development machine: 94 samples/s against fp32's 765), and so hide the input
    "slow-input": Planted(_HERE + "slow_input", "amp-bf16", "nchw", 64, 16, "input", True,
                          "an input pipeline slower than the model", cpu_precision="fp32"),
}

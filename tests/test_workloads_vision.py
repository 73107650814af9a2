"""fp16lab.workloads.vision: ViT-B/16 and torchvision's ResNet-50, built offline, tiny ones trained."""

from __future__ import annotations

import math
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded, ever: a hub call fails at once

import pytest  # noqa: E402
import torch  # noqa: E402

from fp16lab.workload import load_workload, train_step  # noqa: E402
from fp16lab.workloads import missing_package  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _needs(name: str):
    reason = missing_package(name)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


@_needs("vit-b16")
def test_vit_b16_has_the_published_size():
    with torch.device("meta"):
        model = load_workload("vit-b16").build()
    assert sum(p.numel() for p in model.parameters()) == 86_567_656  # ViT-B/16, 1000 classes
    assert model.config.patch_size == 16 and model.config.image_size == 224
    inputs, targets = load_workload("vit-b16").batch(1, "cpu")
    assert inputs["pixel_values"].shape == (1, 3, 224, 224) and targets.shape == (1,)


@_needs("vit-b16")
@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
def test_vit_tiny_trains_a_step(precision):
    w = load_workload("vit-b16", tiny=True, num_classes=10)
    step = train_step(w, precision, "cpu", 2)
    assert all(math.isfinite(float(step().detach())) for _ in range(2))
    assert "channels_last" in w.accepted_layouts()  # its patch embedding is a convolution


@_needs("torchvision-resnet50")
def test_resnet50_has_the_published_size():
    with torch.device("meta"):
        model = load_workload("torchvision-resnet50").build()
    assert sum(p.numel() for p in model.parameters()) == 25_557_032


@_needs("torchvision-resnet50")
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_resnet50_tiny_trains_a_step(layout):
    w = load_workload("torchvision-resnet50", tiny=True, num_classes=10)
    step = train_step(w, "amp-bf16", "cpu", 2, layout=layout)
    assert type(step.model).__name__ == "ResNet"
    assert all(math.isfinite(float(step().detach())) for _ in range(2))


def test_a_missing_package_gives_the_pip_command(monkeypatch):
    import importlib.util

    from fp16lab.workloads import WorkloadNeedsPackage

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))
    assert missing_package("vit-b16") == \
        "workload 'vit-b16' needs transformers: pip install 'fp16lab[models]'"
    with pytest.raises(WorkloadNeedsPackage, match=r"pip install 'fp16lab\[models\]'"):
        load_workload("vit-b16")

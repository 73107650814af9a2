"""Vision models as workloads, built from their configurations with random weights.

* ``vit-b16``: ViT-B/16 (``transformers.ViTForImageClassification``: 12 layers, hidden 768,
  16x16 patches of a 224x224 image), 1000 classes;
* ``torchvision-resnet50``: torchvision's ResNet-50 on 224x224 images, 1000 classes.

Nothing is downloaded (no pretrained weights). ``tiny=True`` gives the same class on 32x32
images: ViT with 8x8 patches, hidden 32, two layers; ResNet with one Bottleneck per stage.
"""

from __future__ import annotations

from .. import validate
from ..workload import Workload
from .batches import cross_entropy, synthetic_batch
from . import require


def vit_b16(tiny: bool = False, num_classes: int = 1000, attention: str = "sdpa") -> Workload:
    """Returns ViT-B/16 for image classification."""
    require("vit-b16")
    import transformers  # local: optional heavy dependency (the models extra)

    validate.boolean("tiny", tiny)
    num_classes = validate.count("num_classes", num_classes, low=2)
    validate.choice("attention", attention, ("sdpa", "eager"))
    size = (dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                 num_attention_heads=2, intermediate_size=64) if tiny else {})
    cfg = transformers.ViTConfig(num_labels=num_classes, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0, attn_implementation=attention,
                                 **size)

    def batch(size: int, device):
        x, y = synthetic_batch((3, cfg.image_size, cfg.image_size), num_classes)(size, device)
        return {"pixel_values": x}, y

    return Workload(name="vit-b16" + ("-tiny" if tiny else ""),
                    build=lambda: transformers.ViTForImageClassification(cfg), batch=batch,
                    loss=cross_entropy, output="logits",
                    settings=dict(tiny=tiny, num_classes=num_classes, attention=attention))


def torchvision_resnet50(tiny: bool = False, num_classes: int = 1000) -> Workload:
    """Returns torchvision's ResNet-50 (tiny: one Bottleneck per stage, 32x32 images)."""
    require("torchvision-resnet50")
    import torchvision  # local: optional dependency (the vision extra)

    validate.boolean("tiny", tiny)
    num_classes = validate.count("num_classes", num_classes, low=2)
    models = torchvision.models

    def build():
        if tiny:
            return models.ResNet(models.resnet.Bottleneck, [1, 1, 1, 1], num_classes=num_classes)
        return models.resnet50(num_classes=num_classes)

    side = 32 if tiny else 224
    return Workload(name="torchvision-resnet50" + ("-tiny" if tiny else ""), build=build,
                    batch=synthetic_batch((3, side, side), num_classes), loss=cross_entropy,
                    settings=dict(tiny=tiny, num_classes=num_classes))

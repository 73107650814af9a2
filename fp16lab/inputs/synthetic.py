"""The synthetic input backend: one random batch made on the device once, returned every time.

Free: the upper bound every sweep before notebook 07 measured, and the baseline the other
backends are compared with.
"""

from __future__ import annotations

from typing import Iterator

import torch

from .settings import InputPipeline, InputSettings

__all__ = ["synthetic_pipeline"]


def synthetic_pipeline(s: InputSettings, device: str, num_classes: int) -> InputPipeline:
    """Returns the synthetic :class:`InputPipeline` of ``s``: one batch of normal noise and
    labels in ``range(num_classes)``, drawn from ``s.seed`` and placed on ``device`` once."""
    g = torch.Generator().manual_seed(s.seed)
    x = torch.randn(s.batch, 3, s.image_size, s.image_size, generator=g).to(device)
    y = torch.randint(0, num_classes, (s.batch,), generator=g).to(device)
    if s.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)

    def forever() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield x, y

    return InputPipeline(s, device, "one random batch on the device", forever())

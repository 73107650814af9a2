"""A GradScaler that records which of its methods a learner's training step called."""

from __future__ import annotations

import torch


class RecordingScaler(torch.amp.GradScaler):
    """A ``torch.amp.GradScaler`` whose ``called`` set names the methods used (to say what is missing)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.called: set[str] = set()

    def scale(self, outputs):
        self.called.add("scale")
        return super().scale(outputs)

    def step(self, optimizer, *args, **kwargs):
        self.called.add("step")
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        self.called.add("update")
        return super().update(new_scale)

"""What a workload feeds its model and how it scores it: batch makers and losses.

A workload's ``batch(size, device)`` returns ``(inputs, targets)`` for one step. Three makers
cover the built-in workloads and a user's own data: :func:`synthetic_batch` (random images or
features with class labels), :func:`token_batch` (random token ids for a causal or masked
language model) and :func:`loader_batch` (the next batch of a DataLoader). The losses compute in
fp32 whatever the precision of the logits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F

from .. import validate


def synthetic_batch(shape: tuple[int, ...], num_classes: int, *,
                    seed: int = 0) -> Callable[[int, Any], tuple[torch.Tensor, torch.Tensor]]:
    """Returns ``batch(size, device)``: standard-normal inputs of ``(size, *shape)`` and class
    labels below ``num_classes``, the same for a given size and seed on every call. Its
    ``synthetic`` attribute is True: the doctor does not take it for an input pipeline."""
    shape = tuple(validate.count("input dimension", s) for s in shape)
    num_classes = validate.count("num_classes", num_classes)

    def batch(size: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
        size = validate.count("batch size", size)
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn((size, *shape), generator=gen)
        y = torch.randint(0, num_classes, (size,), generator=gen)
        return x.to(device), y.to(device)

    batch.synthetic = True  # made on the spot, not read: no input pipeline to measure
    return batch


def token_batch(seq_len: int, vocab: int, *, causal: bool, mask_fraction: float = 0.15,
                seed: int = 0, keys: tuple[str, str | None] = ("input_ids", "attention_mask"),
                ) -> Callable[[int, Any], tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """Returns ``batch(size, device)`` of random token ids for a language model.

    ``causal``: the targets are the next tokens (the inputs are ids 0..T-1 of a T+1 sequence,
    the targets ids 1..T). Otherwise masked-LM: the targets are the ids at a random
    ``mask_fraction`` of the positions and -100 (ignored) elsewhere. ``keys``: the model's
    keywords for the ids and for an all-ones attention mask (None: no mask, which lets SDPA
    take its causal path).
    """
    seq_len, vocab = validate.count("seq_len", seq_len), validate.count("vocab", vocab, low=2)
    mask_fraction = validate.number("mask_fraction", mask_fraction, low=0, high=1, low_open=True)

    def batch(size: int, device: Any) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        size = validate.count("batch size", size)
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (size, seq_len + causal), generator=gen)
        if causal:
            inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
        else:
            inputs = ids
            chosen = torch.rand((size, seq_len), generator=gen) < mask_fraction
            targets = torch.where(chosen, ids, torch.full_like(ids, -100))
        feed = {keys[0]: inputs.to(device)}
        if keys[1]:
            feed[keys[1]] = torch.ones_like(inputs).to(device)
        return feed, targets.to(device)

    batch.synthetic = True
    return batch


def loader_batch(loader: Iterable[Any]) -> Callable[[int, Any], tuple[Any, Any]]:
    """Returns ``batch(size, device)`` drawing the next (inputs, targets) of a DataLoader (its
    batch size must be ``size``), round and round; tensors go to ``device``."""
    state: dict[str, Any] = {"it": None}

    def batch(size: int, device: Any) -> tuple[Any, Any]:
        size = validate.count("batch size", size)
        try:
            inputs, targets = next(state["it"])
        except (StopIteration, TypeError):
            state["it"] = iter(loader)
            inputs, targets = next(state["it"])
        got = len(targets)
        if got != size:
            raise ValueError(f"the DataLoader gives batches of {got}, not the {size} asked for")
        return _to(inputs, device), _to(targets, device)

    return batch


def _to(value: Any, device: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, Mapping):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


# ----------------------------------------------------------------------------- losses

def cross_entropy(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in fp32 over every position (a classifier's (N, C) or a token model's
    (N, T, V) logits), ignoring targets of -100."""
    return F.cross_entropy(out.float().flatten(0, -2), targets.flatten(), ignore_index=-100)


def lm_cross_entropy(vocab: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Returns :func:`cross_entropy` over the first ``vocab`` logits only: a vocabulary padded
    to a multiple of 64 adds columns no token uses, which the softmax must not see."""
    vocab = validate.count("vocab", vocab)

    def loss(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy(out[..., :vocab], targets)

    return loss



# ----------------------------------------------------------------------------- inputs

class ModelInputs:
    """A batch's inputs as the model takes them; ``half()`` casts only the floating tensors
    (recipes.make_train_step halves the inputs for fp16-o2: token ids must stay ids)."""

    def __init__(self, value: Any):
        self.value = value

    def half(self) -> "ModelInputs":
        return ModelInputs(map_float(self.value, torch.Tensor.half))

    def call(self, model: Callable[..., Any]) -> Any:
        if isinstance(self.value, Mapping):
            return model(**self.value)
        if isinstance(self.value, (list, tuple)):
            return model(*self.value)
        return model(self.value)


def map_float(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Returns ``value`` with ``fn`` applied to its floating-point tensors (in dicts, lists and
    tuples too); integer tensors (token ids, labels) and other values pass unchanged."""
    if isinstance(value, torch.Tensor):
        return fn(value) if value.is_floating_point() else value
    if isinstance(value, Mapping):
        return {k: map_float(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map_float(v, fn) for v in value)
    return value


def channels_last_images(t: torch.Tensor) -> torch.Tensor:
    """Returns a 4-d (image batch) tensor in channels_last memory; any other tensor as it is."""
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t

__all__ = ["ModelInputs", "channels_last_images", "cross_entropy", "lm_cross_entropy", "loader_batch",
           "map_float", "synthetic_batch", "token_batch"]

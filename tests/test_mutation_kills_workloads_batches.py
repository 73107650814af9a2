"""fp16lab.workloads.batches: every batch maker and loss against values worked out here (a
seeded generator drawn by hand, torch's cross-entropy over the kept positions)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fp16lab.workloads.batches import (ModelInputs, channels_last_images, cross_entropy,
                                       lm_cross_entropy, loader_batch, map_float, synthetic_batch,
                                       token_batch)


def test_synthetic_batch_draws_inputs_then_labels_from_one_seeded_generator():
    x, y = synthetic_batch((2, 3), 5, seed=4)(6, "cpu")
    gen = torch.Generator().manual_seed(4)
    assert torch.equal(x, torch.randn((6, 2, 3), generator=gen))
    assert torch.equal(y, torch.randint(0, 5, (6,), generator=gen))
    x0, _ = synthetic_batch((2,), 2)(3, "cpu")
    assert torch.equal(x0, torch.randn((3, 2), generator=torch.Generator().manual_seed(0)))
    x1, y1 = synthetic_batch((1,), 1)(50, "cpu")
    assert x1.shape == (50, 1) and (y1 == 0).all()  # one class: every label 0
    _, y2 = synthetic_batch((1,), 2)(200, "cpu")
    assert set(y2.tolist()) == {0, 1}


def test_synthetic_batch_checks_its_arguments_by_name():
    with pytest.raises(ValueError, match="^input dimension must be >= 1"):
        synthetic_batch((2, 0), 3)
    with pytest.raises(ValueError, match="^num_classes must be >= 1"):
        synthetic_batch((2,), 0)
    with pytest.raises(ValueError, match="^batch size must be >= 1"):
        synthetic_batch((2,), 3)(0, "cpu")
    assert synthetic_batch((2.0,), 3.0)(1, "cpu")[0].shape == (1, 2)


def test_a_causal_token_batch_is_the_next_tokens():
    feed, targets = token_batch(4, 10, causal=True, seed=3)(2, "cpu")
    ids = torch.randint(0, 10, (2, 5), generator=torch.Generator().manual_seed(3))
    assert list(feed) == ["input_ids", "attention_mask"]
    assert torch.equal(feed["input_ids"], ids[:, :-1]) and torch.equal(targets, ids[:, 1:])
    assert torch.equal(feed["attention_mask"], torch.ones(2, 4, dtype=torch.int64))
    assert feed["input_ids"].is_contiguous() and targets.is_contiguous()
    feed, _ = token_batch(4, 2, causal=True, keys=("ids", None))(1, "cpu")
    assert list(feed) == ["ids"]
    feed, _ = token_batch(4, 2, causal=True, keys=("ids", "mask"))(1, "cpu")
    assert list(feed) == ["ids", "mask"]


def test_a_masked_token_batch_keeps_targets_at_the_chosen_positions():
    feed, targets = token_batch(50, 7, causal=False, mask_fraction=0.3, seed=1)(3, "cpu")
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 7, (3, 50), generator=gen)
    chosen = torch.rand((3, 50), generator=gen) < 0.3
    assert torch.equal(feed["input_ids"], ids)
    assert torch.equal(targets, torch.where(chosen, ids, torch.full_like(ids, -100)))
    assert 0 < chosen.sum() < chosen.numel()
    _, every = token_batch(8, 7, causal=False, mask_fraction=1.0)(2, "cpu")
    assert (every != -100).all()  # rand < 1 everywhere


def test_token_batch_checks_its_arguments_by_name():
    with pytest.raises(ValueError, match="^seq_len must be >= 1"):
        token_batch(0, 10, causal=True)
    with pytest.raises(ValueError, match="^vocab must be >= 2"):
        token_batch(4, 1, causal=True)
    token_batch(4, 2, causal=True)
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="^mask_fraction must be > 0 and <= 1"):
            token_batch(4, 10, causal=False, mask_fraction=bad)
    with pytest.raises(ValueError, match="^batch size must be >= 1"):
        token_batch(4, 10, causal=True)(0, "cpu")


def test_loader_batch_goes_round_and_moves_nested_values():
    data = [({"a": torch.full((2,), float(i)), "n": [torch.ones(1), "text"]}, torch.tensor([i, i]))
            for i in range(3)]
    batch = loader_batch(data)
    got = [batch(2, "cpu") for _ in range(7)]
    assert [int(t[0]) for _, t in got] == [0, 1, 2, 0, 1, 2, 0]
    inputs, _ = got[4]
    assert torch.equal(inputs["a"], torch.full((2,), 1.0)) and inputs["n"][1] == "text"
    assert type(inputs["n"]) is list and torch.equal(inputs["n"][0], torch.ones(1))
    tup = loader_batch([((torch.ones(1), 3), torch.zeros(1))])(1, "cpu")[0]
    assert type(tup) is tuple and tup[1] == 3
    with pytest.raises(ValueError, match="^the DataLoader gives batches of 2, not the 3 asked for$"):
        batch(3, "cpu")
    with pytest.raises(ValueError, match="^batch size must be >= 1"):
        batch(0, "cpu")


def test_loader_batch_moves_tensors_to_the_device(monkeypatch):
    moved = []
    real = torch.Tensor.to

    def to(self, *args, **kwargs):
        moved.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    loader_batch([({"x": torch.ones(2)}, torch.zeros(2))])(2, "cpu")
    assert moved == [("cpu",), ("cpu",)]
    moved.clear()
    synthetic_batch((1,), 2)(1, "meta")
    assert moved == [("meta",), ("meta",)]
    moved.clear()
    token_batch(2, 3, causal=False)(1, "meta")
    assert moved == [("meta",), ("meta",), ("meta",)]


def test_cross_entropy_over_every_position_in_fp32_ignoring_minus_100():
    logits = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    targets = torch.tensor([[1, -100, 3], [0, 2, -100]])
    kept = [(0, 0), (0, 2), (1, 0), (1, 1)]
    expected = sum(F.cross_entropy(logits[i, j].float()[None], targets[i, j][None]) for i, j in kept) / 4
    out = cross_entropy(logits, targets)
    assert out.dtype == torch.float32 and torch.allclose(out, expected)
    flat = torch.randn(5, 3)
    y = torch.tensor([0, 1, 2, 1, 0])
    assert torch.allclose(cross_entropy(flat, y), F.cross_entropy(flat, y))


def test_lm_cross_entropy_sees_only_the_first_vocab_logits():
    logits = torch.randn(2, 3, 6)
    logits[..., 4:] = 50.0  # padded columns that would swamp the softmax
    targets = torch.tensor([[0, 1, 2], [3, 0, 1]])
    expected = F.cross_entropy(logits[..., :4].reshape(6, 4), targets.reshape(6))
    assert torch.allclose(lm_cross_entropy(4)(logits, targets), expected)
    with pytest.raises(ValueError, match="^vocab must be >= 1"):
        lm_cross_entropy(0)


def test_model_inputs_call_and_half():
    def f(*args, **kwargs):
        return args, kwargs

    t = torch.ones(1)
    assert ModelInputs(t).call(f) == ((t,), {})
    assert ModelInputs((t, 2)).call(f) == ((t, 2), {})
    assert ModelInputs([t]).call(f) == ((t,), {})
    assert ModelInputs({"a": t}).call(f) == ((), {"a": t})
    half = ModelInputs({"x": torch.ones(2), "ids": torch.ones(2, dtype=torch.int64)}).half().value
    assert half["x"].dtype == torch.float16 and half["ids"].dtype == torch.int64


def test_map_float_reaches_floats_in_every_container():
    value = {"a": [torch.ones(1), (torch.ones(1, dtype=torch.int32), 3)], "b": "s"}
    out = map_float(value, torch.Tensor.double)
    assert out["a"][0].dtype == torch.float64 and out["a"][1][0].dtype == torch.int32
    assert type(out["a"]) is list and type(out["a"][1]) is tuple and out["a"][1][1] == 3
    assert out["b"] == "s"


def test_channels_last_only_for_image_batches():
    img = torch.randn(2, 3, 4, 5)
    assert channels_last_images(img).is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(channels_last_images(img), img)
    three = torch.randn(3, 4, 5)
    assert channels_last_images(three) is three
    five = torch.randn(1, 2, 3, 4, 5)
    assert channels_last_images(five) is five


def test_token_batch_defaults_to_seed_0_and_a_strict_fraction():
    feed, targets = token_batch(6, 9, causal=False)(2, "cpu")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 9, (2, 6), generator=gen)
    draws = torch.rand((2, 6), generator=gen)
    assert torch.equal(feed["input_ids"], ids)
    assert torch.equal(targets, torch.where(draws < 0.15, ids, torch.full_like(ids, -100)))
    # a position is masked when its draw is below the fraction, not equal to it
    at = float(draws[0, 0])
    _, exact = token_batch(6, 9, causal=False, mask_fraction=at)(2, "cpu")
    assert exact[0, 0] == -100
    assert torch.equal(exact != -100, draws < at)


def test_loader_batch_moves_tensors_inside_lists_and_tuples(monkeypatch):
    moved = []
    real = torch.Tensor.to

    def to(self, *args, **kwargs):
        moved.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    loader_batch([([torch.ones(1), (torch.ones(1),)], torch.zeros(1))])(1, "cpu")
    assert moved == [("cpu",)] * 3

"""RandomResizedCrop, flip and normalisation against numpy and PIL references (and torchvision where installed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from PIL import Image

from fp16lab.inputs.augment import (IMAGENET_MEAN, IMAGENET_STD, augment_pil, augment_tensor,
                                    batch_generator, crop_params, crops_from_uniforms,
                                    draw_crops, flip_draw, normalize, resized_crops)
from fp16lab.inputs.dataset import synthetic_photo


@settings(max_examples=200, deadline=None)
@given(h=st.integers(1, 700), w=st.integers(1, 700), seed=st.integers(0, 2**31))
def test_crop_fits_and_obeys_area_and_ratio(h, w, seed):
    top, left, ch, cw = crop_params(h, w, torch.Generator().manual_seed(seed))
    assert 0 <= top and top + ch <= h and 0 <= left and left + cw <= w and ch >= 1 and cw >= 1
    if (top, left, ch, cw) == ((h - ch) // 2, (w - cw) // 2, ch, cw) and (ch == h or cw == w):
        return  # the centre-crop fallback (or a random crop that happens to look like it)
    # a random crop: its area share and aspect ratio are in range, up to rounding to pixels
    assert 0.08 * h * w <= (ch + 1) * (cw + 1) and (ch - 1) * (cw - 1) <= h * w
    assert 3 / 4 <= (cw + 1) / max(ch - 1, 0.5) and (cw - 1) / (ch + 1) <= 4 / 3


def test_fallback_is_the_centre_at_the_nearest_allowed_ratio():
    # a 1000x10 strip: no crop of 8%+ of its area with ratio <= 4/3 fits in 10 tries
    w = round(10 * 4 / 3)  # the widest allowed crop of a strip 10 pixels high
    assert crop_params(10, 1000, torch.Generator().manual_seed(0)) == (0, (1000 - w) // 2, 10, w)
    h = round(10 / (3 / 4))  # the tallest allowed crop of a column 10 pixels wide
    assert crop_params(1000, 10, torch.Generator().manual_seed(0)) == ((1000 - h) // 2, 0, h, 10)


def test_same_generator_state_same_crop():
    a = [crop_params(375, 500, torch.Generator().manual_seed(5)) for _ in range(2)]
    assert a[0] == a[1]
    g = torch.Generator().manual_seed(5)
    assert len({crop_params(375, 500, g) for _ in range(20)}) > 15


def test_flip_is_a_fair_coin():
    g = torch.Generator().manual_seed(0)
    flips = sum(flip_draw(g) for _ in range(4000))
    assert abs(flips - 2000) < 4 * math.sqrt(1000)  # 4 standard deviations


def test_matches_torchvision_draw_for_draw():
    T = pytest.importorskip("torchvision.transforms", reason="torchvision is not installed here")
    img = Image.new("RGB", (500, 375))
    for seed in range(50):
        torch.manual_seed(seed)
        theirs = T.RandomResizedCrop.get_params(img, scale=[0.08, 1.0], ratio=[3 / 4, 4 / 3])
        torch.manual_seed(seed)
        assert crop_params(375, 500) == tuple(theirs)


# ------------------------------------------------- a whole batch's crops at once, against the rule


def _one_crop(h, w, u_area, u_ratio, u_top, u_left, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """RandomResizedCrop's rule for one picture, in plain Python floats, from given uniforms."""
    for a, r in zip(u_area, u_ratio):
        target = h * w * (scale[0] + (scale[1] - scale[0]) * a)
        aspect = math.exp(math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * r)
        cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 1 <= cw <= w and 1 <= ch <= h:
            return (min(int(u_top * (h - ch + 1)), h - ch), min(int(u_left * (w - cw + 1)), w - cw),
                    ch, cw)
    if w / h < ratio[0]:  # too tall: full width, as tall as the narrowest aspect allows
        ch, cw = round(w / ratio[0]), w
    elif w / h > ratio[1]:  # too wide
        ch, cw = h, round(h * ratio[1])
    else:
        ch, cw = h, w
    return (h - ch) // 2, (w - cw) // 2, ch, cw


_sizes = st.lists(st.tuples(st.integers(1, 600), st.integers(1, 600)), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(sizes=_sizes, seed=st.integers(0, 2**32 - 1))
def test_batched_crops_equal_the_scalar_rule_on_the_same_uniforms(sizes, seed):
    rng = np.random.default_rng(seed)
    n = len(sizes)
    ua, ur, ut, ul = rng.random((n, 10)), rng.random((n, 10)), rng.random(n), rng.random(n)
    # some exact corners: the smallest share and aspect, and a top/left draw just below 1
    ua[0, 0], ur[0, 0], ut[0], ul[0] = 0.0, 0.0, np.nextafter(1.0, 0.0), 0.0
    hs, ws = [h for h, _ in sizes], [w for _, w in sizes]
    got = crops_from_uniforms(hs, ws, ua, ur, ut, ul)
    want = [_one_crop(h, w, ua[i], ur[i], ut[i], ul[i]) for i, (h, w) in enumerate(sizes)]
    assert got.dtype == np.int64 and got.shape == (n, 4)
    assert [tuple(int(v) for v in row) for row in got] == want


def test_batched_crops_follow_other_scale_and_ratio():
    rng = np.random.default_rng(7)
    hs, ws = rng.integers(1, 300, 200), rng.integers(1, 300, 200)
    ua, ur, ut, ul = rng.random((200, 3)), rng.random((200, 3)), rng.random(200), rng.random(200)
    got = crops_from_uniforms(hs, ws, ua, ur, ut, ul, scale=(0.3, 0.6), ratio=(0.5, 2.0))
    want = [_one_crop(int(hs[i]), int(ws[i]), ua[i], ur[i], ut[i], ul[i], (0.3, 0.6), (0.5, 2.0))
            for i in range(200)]
    assert [tuple(int(v) for v in row) for row in got] == want


def test_draw_crops_takes_its_uniforms_in_the_stated_order():
    hs, ws = [375, 500, 90, 3], [500, 375, 1000, 2]
    crops, flips = draw_crops(hs, ws, np.random.default_rng(11))
    replay = np.random.default_rng(11)  # area shares, aspects, tops, lefts, flips
    ua, ur = replay.random((4, 10)), replay.random((4, 10))
    ut, ul, uf = replay.random(4), replay.random(4), replay.random(4)
    assert [tuple(int(v) for v in row) for row in crops] == [
        _one_crop(hs[i], ws[i], ua[i], ur[i], ut[i], ul[i]) for i in range(4)]
    assert flips.dtype == bool and flips.tolist() == (uf < 0.5).tolist()


def test_batch_generators_are_deterministic_and_independent():
    a = draw_crops([375] * 64, [500] * 64, batch_generator(3, 5))
    b = draw_crops([375] * 64, [500] * 64, batch_generator(3, 5))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    others = [draw_crops([375] * 64, [500] * 64, batch_generator(*k))[0] for k in ((3, 6), (4, 5))]
    assert all((o != a[0]).any(axis=1).mean() > 0.9 for o in others)
    with pytest.raises(ValueError, match="index must be an integer >= 0"):
        batch_generator(0, -1)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        batch_generator(1.5, 0)


@settings(max_examples=100, deadline=None)
@given(sizes=_sizes, seed=st.integers(0, 2**32 - 1))
def test_batched_crops_fit_inside_their_pictures(sizes, seed):
    hs, ws = np.array([h for h, _ in sizes]), np.array([w for _, w in sizes])
    crops, _ = draw_crops(hs, ws, np.random.default_rng(seed))
    top, left, h, w = crops.T
    assert (top >= 0).all() and (left >= 0).all() and (h >= 1).all() and (w >= 1).all()
    assert (top + h <= hs).all() and (left + w <= ws).all()


def test_batched_edge_cases_tiny_and_elongated_pictures():
    g = np.random.default_rng(0)
    assert draw_crops([1] * 50, [1] * 50, g)[0].tolist() == [[0, 0, 1, 1]] * 50
    # strips where no crop of 8%+ of the area fits within the allowed aspects: the centre crop
    wide = round(10 * 4 / 3)
    assert draw_crops([10] * 50, [1000] * 50, g)[0].tolist() == [[0, (1000 - wide) // 2, 10, wide]] * 50
    tall = round(10 / (3 / 4))
    assert draw_crops([1000] * 50, [10] * 50, g)[0].tolist() == [[(1000 - tall) // 2, 0, tall, 10]] * 50


@pytest.mark.parametrize("h, w", [(375, 500), (20, 200), (2, 3)])
def test_batched_draw_has_torchvisions_distribution(h, w):
    """Against crop_params (torchvision's draws, checked draw for draw above), 8000 crops each:
    the centre-crop share and the mean crop height, width and area agree within 4.5 standard
    errors of their difference."""
    n = 8000
    ours = draw_crops([h] * n, [w] * n, np.random.default_rng(1))[0]
    g = torch.Generator().manual_seed(1)
    theirs = np.array([crop_params(h, w, g) for _ in range(n)])

    def fallback(c):
        return (c[:, 2] == h) & (c[:, 3] == w) | (c[:, 2] == h) & (c[:, 3] == round(h * 4 / 3))

    stats = [fallback, lambda c: c[:, 2], lambda c: c[:, 3], lambda c: c[:, 2] * c[:, 3]]
    for f in stats:
        a, b = f(ours).astype(float), f(theirs).astype(float)
        se = math.sqrt(a.var() / n + b.var() / n) or 1e-12
        assert abs(a.mean() - b.mean()) <= 4.5 * se, (f, a.mean(), b.mean(), se)
    if (h, w) == (20, 200):  # a strip too wide for most tries: the fallback is common
        assert 0.1 < fallback(ours).mean() < 0.9


@pytest.mark.parametrize("heights, widths, match", [
    ([10, 20], [10], "equally long"),
    ([], [], "non-empty"),
    ([10, 0], [10, 10], "positive, got 0x10"),
    ([10.5], [10], "must be integers"),
])
def test_batched_draw_refuses_bad_sizes(heights, widths, match):
    with pytest.raises(ValueError, match=match):
        draw_crops(heights, widths, np.random.default_rng(0))


def test_batched_crops_refuse_draws_outside_the_unit_interval():
    with pytest.raises(ValueError, match="u_top must hold uniform draws"):
        crops_from_uniforms([5], [5], np.zeros((1, 10)), np.zeros((1, 10)), np.ones(1), np.zeros(1))


def _reference(pic: np.ndarray, params, flip: bool, size: int) -> np.ndarray:
    top, left, h, w = params
    out = np.asarray(Image.fromarray(pic[top:top + h, left:left + w]).resize((size, size), Image.BILINEAR))
    return out[:, ::-1] if flip else out


def test_pil_path_equals_numpy_crop_pil_resize_numpy_flip():
    pic = synthetic_photo(1, 2, (160, 120))
    for seed in range(8):
        g, replay = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        got = augment_pil(Image.fromarray(pic), 64, g)
        params = crop_params(120, 160, replay)
        expect = _reference(pic, params, flip_draw(replay), 64)
        assert got.dtype == torch.uint8 and got.shape == (3, 64, 64)
        assert np.array_equal(got.permute(1, 2, 0).numpy(), expect)


def test_tensor_path_matches_pil_within_rounding():
    """torch's antialiased bilinear resize against PIL's: PIL rounds to whole numbers, so up to
    1 apart per pixel, and about 0.3 on average."""
    pic = synthetic_photo(3, 4)
    t = torch.from_numpy(pic.copy()).permute(2, 0, 1)
    g = torch.Generator().manual_seed(11)
    for flip in (False, True, False, True):
        params = crop_params(375, 500, g)
        got = augment_tensor(t, 224, params, flip).permute(1, 2, 0).numpy()
        diff = np.abs(got - _reference(pic, params, flip, 224).astype(np.float32))
        assert diff.max() <= 1.01 and diff.mean() <= 0.35, (params, diff.max(), diff.mean())


def test_normalize_against_numpy():
    x = torch.randint(0, 256, (2, 3, 5, 7), dtype=torch.uint8)
    ref = (x.numpy() / 255.0 - np.array(IMAGENET_MEAN)[None, :, None, None]) / np.array(
        IMAGENET_STD)[None, :, None, None]
    got = normalize(x)
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=1e-5)


# ------------------------------------------------- the whole batch at once, against picture by picture


def _pictures_and_draws(seed: int, sizes: list[tuple[int, int]]):
    g = torch.Generator().manual_seed(seed)
    pics = [torch.from_numpy(synthetic_photo(seed, i, (w, h))).permute(2, 0, 1).contiguous()
            for i, (w, h) in enumerate(sizes)]
    params = [crop_params(p.shape[1], p.shape[2], g) for p in pics]
    flips = [flip_draw(g) for _ in pics]
    return pics, params, flips


@pytest.mark.parametrize("seed, sizes", [
    (0, [(500, 375)] * 6),                                   # the data set's pictures
    (1, [(500, 375), (375, 500), (120, 90), (333, 251)]),    # mixed sizes: zero padding
])
def test_batched_crops_equal_the_per_picture_reference(seed, sizes):
    pics, params, flips = _pictures_and_draws(seed, sizes)
    params[-1] = (3, 5, 30, 40)  # one crop smaller than the output: an upscale
    flips[0], flips[1] = True, False
    got = resized_crops(pics, params, flips, 64)
    # oracle: torch's own antialiased bilinear resize of each crop (augment_tensor)
    want = torch.stack([augment_tensor(p, 64, c, f) for p, c, f in zip(pics, params, flips)])
    assert got.shape == (len(pics), 3, 64, 64) and got.dtype == torch.float32
    # fp32 on a CPU: the same filter, so rounding only (1e-2 on the 0-255 scale)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-2)


def test_batched_crops_refuse_mismatched_lists():
    pics, params, flips = _pictures_and_draws(0, [(64, 48)] * 2)
    with pytest.raises(ValueError, match="as many pictures, crops and flips"):
        resized_crops(pics, params, flips[:1], 32)


@pytest.mark.gpu
def test_batched_crops_on_the_gpu_are_within_half_a_level_of_the_reference():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    pics, params, flips = _pictures_and_draws(2, [(500, 375)] * 64)
    pics = [p.cuda() for p in pics]
    got = resized_crops(pics, params, flips, 224)
    want = torch.stack([augment_tensor(p, 224, c, f) for p, c, f in zip(pics, params, flips)])
    # fp16 products with fp32 accumulation: weights and the intermediate carry 11 bits, so at
    # most about 2 * 255 * 2**-11 = 0.25 off; 0.5 of a level is the bound
    assert float((got - want).abs().max()) <= 0.5


def test_normalize_makes_its_constants_once_per_device():
    from fp16lab.inputs.augment import _channel_stats

    x = torch.randint(0, 256, (1, 3, 2, 2), dtype=torch.uint8)
    normalize(x)
    first = _channel_stats(x.device)
    normalize(x)
    assert _channel_stats(x.device)[0] is first[0] and _channel_stats(x.device)[1] is first[1]
    np.testing.assert_allclose(first[0].view(3).numpy(), np.array(IMAGENET_MEAN) * 255, rtol=1e-6)

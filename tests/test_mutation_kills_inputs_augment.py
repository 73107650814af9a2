"""fp16lab.inputs.augment's crop draws against torchvision's own: live where torchvision is
installed, and everywhere against draws recorded from it.

The recorded draws were made by torchvision 0.28.0's ``RandomResizedCrop.get_params`` (its own
source, scale (0.08, 1), ratio (3/4, 4/3)) with torch 2.13's CPU generator after
``torch.manual_seed(seed)`` for seeds 0, 1, 2, ...: (top, left, height, width) per seed. They
include pictures where the ten tries fail and torchvision falls back to a centre crop.
"""

from __future__ import annotations

import pytest
import torch

from fp16lab.inputs.augment import crop_params

RECORDED = {
    (375, 500): [(17, 80, 294, 343), (71, 153, 272, 311), (13, 54, 360, 336), (217, 343, 141, 112),
                 (7, 52, 328, 340), (110, 28, 194, 223)],
    (480, 64): [(337, 1, 78, 63), (147, 2, 53, 62), (197, 0, 85, 64), (169, 7, 57, 45),
                (129, 16, 59, 45), (197, 0, 85, 64)],
    (64, 480): [(2, 426, 61, 51), (11, 164, 53, 62), (0, 197, 64, 85), (1, 287, 57, 45),
                (5, 308, 59, 45), (7, 156, 51, 67)],
    (5, 7): [(1, 0, 4, 5), (1, 1, 4, 4), (0, 0, 5, 5), (1, 3, 2, 2), (1, 2, 4, 5), (0, 0, 5, 6)],
    (224, 224): [(55, 0, 152, 177), (9, 8, 210, 185), (8, 39, 186, 174), (73, 128, 73, 58),
                 (41, 31, 170, 176), (104, 44, 101, 115)],
    (1000, 10): [(493, 0, 13, 10)] * 3,  # no try fits: the centre, 13 tall (10 / (3/4))
    (10, 1000): [(0, 493, 10, 13)] * 3,
    (1, 1): [(0, 0, 1, 1)] * 3,
}


@pytest.mark.parametrize("size", list(RECORDED), ids=lambda s: f"{s[0]}x{s[1]}")
def test_crops_equal_torchvisions_recorded_draws(size):
    h, w = size
    for seed, expected in enumerate(RECORDED[size]):
        torch.manual_seed(seed)
        assert crop_params(h, w) == expected, (size, seed)


@pytest.mark.parametrize("size", list(RECORDED), ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_generator_draws_what_the_global_rng_draws_from_the_same_seed(size):
    h, w = size
    for seed, expected in enumerate(RECORDED[size]):
        assert crop_params(h, w, torch.Generator().manual_seed(seed)) == expected


def test_crops_equal_torchvisions_live_draws_where_it_is_installed():
    T = pytest.importorskip("torchvision.transforms", reason="torchvision is not installed here")
    from PIL import Image

    for (h, w) in RECORDED:
        img = Image.new("RGB", (w, h))
        for seed in range(20):
            torch.manual_seed(seed)
            theirs = T.RandomResizedCrop.get_params(img, scale=[0.08, 1.0], ratio=[3 / 4, 4 / 3])
            torch.manual_seed(seed)
            assert crop_params(h, w) == tuple(theirs), ((h, w), seed)

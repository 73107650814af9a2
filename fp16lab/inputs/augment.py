"""ImageNet training augmentation, the same on a CPU (PIL) and on a GPU (torch tensors).

The standard recipe: RandomResizedCrop (a crop of 8% to 100% of the picture's area, aspect
ratio 3/4 to 4/3, resized to ``size`` x ``size``), a horizontal flip half the time, then
normalisation by ImageNet's channel means and standard deviations. :func:`crop_params` draws a
crop the way torchvision's ``RandomResizedCrop.get_params`` does (the same random draws in the
same order, so the same seed gives the same crop); :func:`draw_crops` draws the same
distribution for a whole batch in a few numpy operations (no Python loop per picture, seeded per
batch by :func:`batch_generator`); :func:`augment_pil` applies a crop to a PIL image on the CPU, :func:`augment_tensor` to a decoded uint8 tensor on any device, and
:func:`resized_crops` to a whole batch at once (two batched matrix products instead of a few
kernels per picture).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch

from fp16lab import validate

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "SCALE", "RATIO", "TRIES", "augment_pil",
           "augment_tensor", "batch_generator", "crop_params", "crops_from_uniforms", "draw_crops",
           "flip_draw", "normalize", "resized_crops"]

#: ImageNet's per-channel mean and standard deviation (RGB, on a 0-1 scale).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: RandomResizedCrop's defaults: the crop's share of the area, and its aspect-ratio range.
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
#: How many random crops RandomResizedCrop tries before it falls back to the centre crop.
TRIES = 10


def crop_params(height: int, width: int, generator: torch.Generator | None = None, *,
                scale: tuple[float, float] = SCALE,
                ratio: tuple[float, float] = RATIO) -> tuple[int, int, int, int]:
    """Returns (top, left, height, width) of a random crop of a ``height`` x ``width`` picture.

    Ten tries draw an area share in ``scale`` and a log-uniform aspect ratio in ``ratio``; the
    first crop that fits is taken. If none fits, the whole picture is taken, cut to the nearest
    allowed aspect ratio around its centre. ``generator=None`` draws from torch's global RNG.
    """
    height, width = validate.count("height", height), validate.count("width", width)
    area = height * width
    log_lo, log_hi = torch.log(torch.tensor(ratio)).tolist()  # in float32, as torchvision has it
    for _ in range(TRIES):
        target = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect = torch.exp(torch.empty(1).uniform_(log_lo, log_hi, generator=generator)).item()
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator).item())
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator).item())
            return top, left, h, w
    shape = width / height
    if shape < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif shape > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def batch_generator(seed: int, index: int) -> np.random.Generator:
    """Returns the numpy generator of batch ``index`` of a pipeline seeded with ``seed``.

    Each (seed, index) pair is its own stream (numpy's SeedSequence mixes both), so any thread
    may draw any batch's crops and the result does not depend on which one did or when.
    """
    for name, value in (("seed", seed), ("index", index)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return np.random.default_rng([int(seed), int(index)])


def _sizes(heights: Sequence[int], widths: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    h, w = np.asarray(heights), np.asarray(widths)
    if h.ndim != 1 or h.shape != w.shape or h.size == 0:
        raise ValueError(f"need two equally long, non-empty lists of picture heights and widths; "
                         f"got shapes {h.shape} and {w.shape}")
    if not (np.issubdtype(h.dtype, np.integer) and np.issubdtype(w.dtype, np.integer)):
        raise ValueError(f"picture sizes must be integers, got {h.dtype} and {w.dtype}")
    if (h < 1).any() or (w < 1).any():
        bad = int(np.flatnonzero((h < 1) | (w < 1))[0])
        raise ValueError(f"picture sizes must be positive, got {h[bad]}x{w[bad]} (picture {bad})")
    return h.astype(np.int64), w.astype(np.int64)


def crops_from_uniforms(heights: Sequence[int], widths: Sequence[int], u_area: np.ndarray,
                        u_ratio: np.ndarray, u_top: np.ndarray, u_left: np.ndarray, *,
                        scale: tuple[float, float] = SCALE,
                        ratio: tuple[float, float] = RATIO) -> np.ndarray:
    """Returns an (N, 4) int64 array of crops (top, left, height, width), one per picture,
    made from uniform draws in [0, 1): RandomResizedCrop's rule for N pictures at once.

    Picture n (``heights[n]`` x ``widths[n]``) tries ``u_area[n, t]`` and ``u_ratio[n, t]``
    (shape (N, T)) in turn: area share ``scale[0] + (scale[1] - scale[0]) * u_area`` and aspect
    ``exp(log ratio[0] + (log ratio[1] - log ratio[0]) * u_ratio)``, giving
    ``w = round(sqrt(area * share * aspect))`` and ``h = round(sqrt(area * share / aspect))``
    (half to even, as Python's round). The first try with ``0 < w <= width`` and
    ``0 < h <= height`` wins and is placed at ``top = floor(u_top * (height - h + 1))``, ``left``
    likewise. A picture where no try fits gets the centre crop at the nearest allowed aspect.
    """
    hh, ww = _sizes(heights, widths)
    n = hh.size
    u_area, u_ratio = np.asarray(u_area, dtype=np.float64), np.asarray(u_ratio, dtype=np.float64)
    u_top, u_left = np.asarray(u_top, dtype=np.float64), np.asarray(u_left, dtype=np.float64)
    if u_area.ndim != 2 or u_area.shape[0] != n or u_area.shape != u_ratio.shape \
            or u_top.shape != (n,) or u_left.shape != (n,):
        raise ValueError(f"need u_area and u_ratio of shape (N, tries) and u_top, u_left of shape "
                         f"(N,) for N = {n} pictures; got {u_area.shape}, {u_ratio.shape}, "
                         f"{u_top.shape}, {u_left.shape}")
    for name, u in (("u_area", u_area), ("u_ratio", u_ratio), ("u_top", u_top), ("u_left", u_left)):
        if not ((u >= 0) & (u < 1)).all():
            raise ValueError(f"{name} must hold uniform draws in [0, 1)")
    area = (hh * ww).astype(np.float64)[:, None]
    share = scale[0] + (scale[1] - scale[0]) * u_area
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(log_lo + (log_hi - log_lo) * u_ratio)
    w = np.rint(np.sqrt(area * share * aspect)).astype(np.int64)
    h = np.rint(np.sqrt(area * share / aspect)).astype(np.int64)
    fits = (w > 0) & (w <= ww[:, None]) & (h > 0) & (h <= hh[:, None])
    first = fits.argmax(axis=1)  # the first True; 0 where none fits (masked below)
    rows = np.arange(n)
    ch, cw = h[rows, first], w[rows, first]
    # u * k < k for u < 1 in exact arithmetic; the minimum guards the last bit of rounding
    span_h, span_w = hh - ch + 1, ww - cw + 1
    top = np.minimum(np.floor(u_top * span_h).astype(np.int64), span_h - 1)
    left = np.minimum(np.floor(u_left * span_w).astype(np.int64), span_w - 1)
    # no try fits: the whole picture, cut to the nearest allowed aspect around its centre
    shape = ww / hh
    lo, hi = min(ratio), max(ratio)
    fh = np.where(shape < lo, np.rint(ww / lo).astype(np.int64), hh)
    fw = np.where(shape > hi, np.rint(hh * hi).astype(np.int64), ww)
    ok = fits.any(axis=1)
    return np.stack([np.where(ok, top, (hh - fh) // 2), np.where(ok, left, (ww - fw) // 2),
                     np.where(ok, ch, fh), np.where(ok, cw, fw)], axis=1)


def draw_crops(heights: Sequence[int], widths: Sequence[int], generator: np.random.Generator, *,
               scale: tuple[float, float] = SCALE, ratio: tuple[float, float] = RATIO,
               p_flip: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``(crops, flips)`` for a batch: an (N, 4) int64 array of random crops (top, left,
    height, width), RandomResizedCrop's distribution (:func:`crops_from_uniforms`), and an (N,)
    bool array, True with probability ``p_flip``.

    All draws come from ``generator`` in one fixed order (area shares, aspects, tops, lefts,
    flips, each as one array), so one generator state gives one batch whatever the sizes. The
    draws differ from torchvision's picture-by-picture order; :func:`crop_params` keeps that.
    """
    hh, ww = _sizes(heights, widths)
    n = hh.size
    u_area = generator.random((n, TRIES))
    u_ratio = generator.random((n, TRIES))
    u_top, u_left, u_flip = generator.random(n), generator.random(n), generator.random(n)
    crops = crops_from_uniforms(hh, ww, u_area, u_ratio, u_top, u_left, scale=scale, ratio=ratio)
    return crops, u_flip < p_flip


def flip_draw(generator: torch.Generator | None = None, p: float = 0.5) -> bool:
    """Returns whether to flip, drawn like torchvision's RandomHorizontalFlip."""
    p = validate.number("p", p, low=0, high=1)
    return bool(torch.rand(1, generator=generator).item() < p)


def augment_pil(img: Any, size: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Returns a random crop of a PIL image, resized to ``size`` x ``size`` (bilinear) and
    flipped half the time, as a uint8 tensor of shape (3, size, size)."""
    from PIL import Image

    top, left, h, w = crop_params(img.height, img.width, generator)
    out = img.crop((left, top, left + w, top + h)).resize((size, size), Image.BILINEAR)
    if flip_draw(generator):
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.frombuffer(bytearray(out.tobytes()), dtype=torch.uint8).view(
        size, size, 3).permute(2, 0, 1).contiguous()


def augment_tensor(img: torch.Tensor, size: int, params: tuple[int, int, int, int],
                   flip: bool) -> torch.Tensor:
    """Returns the crop ``params`` (top, left, height, width) of a (3, H, W) uint8 picture on
    its own device, resized to ``size`` x ``size`` (bilinear with antialiasing, like PIL) and
    flipped if ``flip``, as float32 on the 0-255 scale."""
    top, left, h, w = params
    crop = img[None, :, top:top + h, left:left + w].float()
    out = torch.nn.functional.interpolate(crop, size=(size, size), mode="bilinear",
                                          align_corners=False, antialias=True)[0]
    return out.flip(-1) if flip else out


def _resize_weights(start: torch.Tensor, length: torch.Tensor, size: int, extent: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """Returns (N, size, extent) weights: row i of picture n resamples pixels
    ``start[n] .. start[n] + length[n]`` of an axis ``extent`` long to output pixel i.

    PyTorch's antialiased bilinear filter (``interpolate(..., antialias=True)``, PIL's too): a
    triangle as wide as the scale ``s = length / size`` (at least 1 pixel) around the centre
    ``s * (i + 0.5)``, cut at the crop's edges, its weights normalised to sum to 1.
    """
    device, f32 = start.device, torch.float32
    scale = (length.to(f32) / size)[:, None, None]
    support = scale.clamp(min=1.0)
    centre = scale * (torch.arange(size, device=device, dtype=f32)[None, :, None] + 0.5)
    # each pixel's place in its crop, and the triangle's value there
    j = torch.arange(extent, device=device, dtype=f32)[None, None, :] - start.to(f32)[:, None, None]
    w = (1 - ((j - centre + 0.5) / support).abs()).clamp(min=0)
    w = w * ((j >= 0) & (j < length.to(f32)[:, None, None]))
    return (w / w.sum(-1, keepdim=True)).to(dtype)


def resized_crops(images: torch.Tensor | list[torch.Tensor],
                  params: Sequence[tuple[int, int, int, int]] | np.ndarray,
                  flips: Sequence[bool] | np.ndarray, size: int) -> torch.Tensor:
    """Returns a (N, 3, size, size) float32 batch (0-255 scale): crop ``params[n]`` (top, left,
    height, width) of picture n, resized to ``size`` x ``size`` and flipped where ``flips[n]``.

    The same pixels as :func:`augment_tensor` picture by picture (its antialiased bilinear
    resize is separable: ``out = Wy @ crop @ Wx.T`` with one weight matrix per axis), done for
    the whole batch in two batched matrix products; the flip reverses the rows of ``Wx``.
    Pictures of different sizes are zero-padded to the largest (the weights never reach the
    padding). On a GPU the products run in fp16 with fp32 accumulation (uint8 pixels are exact
    in fp16; the weights carry 11 bits), within 0.5 of fp32 on the 0-255 scale.
    """
    n = len(params)
    if n == 0 or len(flips) != n or len(images) != n:
        raise ValueError(f"need as many pictures, crops and flips (at least one); got "
                         f"{len(images)}, {n}, {len(flips)}")
    if isinstance(images, torch.Tensor):
        batch = images
    elif len({tuple(im.shape) for im in images}) == 1:
        batch = torch.stack(list(images))
    else:
        h = max(im.shape[1] for im in images)
        w = max(im.shape[2] for im in images)
        batch = images[0].new_zeros((n, 3, h, w))
        for dst, im in zip(batch, images):
            dst[:, :im.shape[1], :im.shape[2]].copy_(im)
    device = batch.device
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    p = torch.as_tensor(np.asarray(params), dtype=torch.int64).to(device)
    wy = _resize_weights(p[:, 0], p[:, 2], size, batch.shape[2], dtype)
    wx = _resize_weights(p[:, 1], p[:, 3], size, batch.shape[3], dtype)
    flip = torch.as_tensor(np.asarray(flips), dtype=torch.bool).to(device)
    wx = torch.where(flip[:, None, None], wx.flip(1), wx)
    # (N, 3H, W) @ (N, W, size): every row of every channel at once, no broadcast copy;
    # then (N, 1, size, H) @ (N, 3, H, size) -> (N, 3, size, size)
    n, c, h, w = batch.shape
    rows = batch.to(dtype).reshape(n, c * h, w) @ wx.transpose(1, 2)
    return (wy[:, None] @ rows.view(n, c, h, size)).float()


_STATS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _channel_stats(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ImageNet's mean and std on the 0-255 scale as (1, 3, 1, 1) tensors on ``device``,
    made once per device: building them from Python numbers is a blocking host-to-device copy,
    which would make the host wait for everything queued on the stream, at every batch."""
    if device not in _STATS:
        mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255
        std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255
        _STATS[device] = (mean.to(device), std.to(device))
    return _STATS[device]


def normalize(x: torch.Tensor) -> torch.Tensor:
    """Returns a batch (N, 3, H, W) on the 0-255 scale normalised by ImageNet's mean and std."""
    mean, std = _channel_stats(x.device)
    return (x.float() - mean) / std

"""ImageNet training augmentation, the same on a CPU (PIL) and on a GPU (torch tensors).

The standard recipe: RandomResizedCrop (a crop of 8% to 100% of the picture's area, aspect
ratio 3/4 to 4/3, resized to ``size`` x ``size``), a horizontal flip half the time, then
normalisation by ImageNet's channel means and standard deviations. :func:`crop_params` draws a
crop the way torchvision's ``RandomResizedCrop.get_params`` does (the same random draws in the
same order, so the same seed gives the same crop); :func:`augment_pil` applies it to a PIL
image on the CPU, :func:`augment_tensor` to a decoded uint8 tensor on any device, and
:func:`resized_crops` to a whole batch at once (two batched matrix products instead of a few
kernels per picture).
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "SCALE", "RATIO", "augment_pil", "augment_tensor",
           "crop_params", "flip_draw", "normalize", "resized_crops"]

#: ImageNet's per-channel mean and standard deviation (RGB, on a 0-1 scale).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: RandomResizedCrop's defaults: the crop's share of the area, and its aspect-ratio range.
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


def crop_params(height: int, width: int, generator: torch.Generator | None = None, *,
                scale: tuple[float, float] = SCALE,
                ratio: tuple[float, float] = RATIO) -> tuple[int, int, int, int]:
    """Returns (top, left, height, width) of a random crop of a ``height`` x ``width`` picture.

    Ten tries draw an area share in ``scale`` and a log-uniform aspect ratio in ``ratio``; the
    first crop that fits is taken. If none fits, the whole picture is taken, cut to the nearest
    allowed aspect ratio around its centre. ``generator=None`` draws from torch's global RNG.
    """
    if height < 1 or width < 1:
        raise ValueError(f"picture size must be positive, got {height}x{width}")
    area = height * width
    log_lo, log_hi = torch.log(torch.tensor(ratio)).tolist()  # in float32, as torchvision has it
    for _ in range(10):
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


def flip_draw(generator: torch.Generator | None = None, p: float = 0.5) -> bool:
    """Returns whether to flip, drawn like torchvision's RandomHorizontalFlip."""
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


def resized_crops(images: torch.Tensor | list[torch.Tensor], params: list[tuple[int, int, int, int]],
                  flips: list[bool], size: int) -> torch.Tensor:
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
    p = torch.tensor(params, dtype=torch.int64).to(device)
    wy = _resize_weights(p[:, 0], p[:, 2], size, batch.shape[2], dtype)
    wx = _resize_weights(p[:, 1], p[:, 3], size, batch.shape[3], dtype)
    flip = torch.tensor(flips, dtype=torch.bool).to(device)
    wx = torch.where(flip[:, None, None], wx.flip(1), wx)
    # (N, 3H, W) @ (N, W, size): every row of every channel at once, no broadcast copy;
    # then (N, 1, size, H) @ (N, 3, H, size) -> (N, 3, size, size)
    n, c, h, w = batch.shape
    rows = batch.to(dtype).reshape(n, c * h, w) @ wx.transpose(1, 2)
    return (wy[:, None] @ rows.view(n, c, h, size)).float()


def normalize(x: torch.Tensor) -> torch.Tensor:
    """Returns a batch (N, 3, H, W) on the 0-255 scale normalised by ImageNet's mean and std."""
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1) * 255
    return (x.float() - mean) / std

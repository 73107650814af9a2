"""The dali input backend: an NVIDIA DALI pipeline, decoding and augmentation on the GPU.

File reader, JPEG decode with a random crop, resize, flip and normalise, all in DALI's own
pipeline, where the ``nvidia-dali`` package imports; elsewhere :func:`dali_unavailable` says
why not. DALI is imported only when this backend is built or checked, never with the package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch

from .. import validate
from .augment import IMAGENET_MEAN, IMAGENET_STD, RATIO, SCALE
from .dataset import scan_image_folder
from .settings import InputPipeline, InputSettings

__all__ = ["DALI_INSTALL", "dali_pipeline", "dali_unavailable"]

#: What to install where ``nvidia.dali`` does not import.
DALI_INSTALL = ("pip install nvidia-dali-cuda130 for CUDA 13, nvidia-dali-cuda120 for CUDA 12; "
                "Linux x86-64 and aarch64 only")


def dali_unavailable(device: str) -> str | None:
    """Returns why the dali backend cannot run on ``device`` here, or None when it can."""
    device = validate.device("device", device)
    if not str(device).startswith("cuda"):
        return "dali runs its GPU pipeline on a CUDA GPU; the device here is " + str(device)
    try:
        import nvidia.dali  # noqa: F401  (local: DALI is optional)
    except ImportError:
        return f"NVIDIA DALI is not installed ({DALI_INSTALL})"
    return None


def dali_pipeline(s: InputSettings, root: Path, device: str) -> InputPipeline:
    """Returns the dali :class:`InputPipeline` of ``s`` over the image folder ``root`` (use
    :func:`fp16lab.inputs.make_input`, which checks the settings and folder first).

    On a CUDA device the ``mixed`` decoder shares each batch between the GPU's JPEG engines
    (DALI's default ``hw_decoder_load`` share) and nvJPEG; the batch leaves DALI in NHWC
    memory, which is channels_last as an NCHW tensor, so it is handed over without a copy. (On
    a CPU the decoder is libjpeg-turbo: ``make_input`` refuses that, and tests use it to check
    this plumbing without a GPU.)"""
    from nvidia.dali import fn, pipeline_def, types  # local: DALI is optional
    from nvidia.dali.plugin.pytorch import DALIGenericIterator  # local: DALI is optional

    files, labels, _ = scan_image_folder(root)
    cuda = str(device).startswith("cuda")

    @pipeline_def
    def pipeline():
        jpegs, y = fn.readers.file(files=[str(f) for f in files], labels=labels,
                                   random_shuffle=True, name="reader")
        x = fn.decoders.image_random_crop(jpegs, device="mixed" if cuda else "cpu",
                                          output_type=types.RGB, random_area=list(SCALE),
                                          random_aspect_ratio=list(RATIO))
        x = fn.resize(x, resize_x=s.image_size, resize_y=s.image_size)
        x = fn.crop_mirror_normalize(x, dtype=types.FLOAT,
                                     output_layout="HWC" if s.channels_last else "CHW",
                                     mean=[m * 255 for m in IMAGENET_MEAN],
                                     std=[d * 255 for d in IMAGENET_STD],
                                     mirror=fn.random.coin_flip(probability=0.5))
        return x, (y.gpu() if cuda else y)

    pipe = pipeline(batch_size=s.batch, num_threads=s.resolved_workers(),
                    device_id=(torch.device(device).index or 0) if cuda else None, seed=s.seed)
    pipe.build()
    # the only reference to the pipeline: close() drops it, and DALI frees its threads and buffers
    held = {"it": DALIGenericIterator([pipe], ["x", "y"], reader_name="reader", auto_reset=True)}
    del pipe

    def forever() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while held:
            for out in held["it"]:
                x, y = out[0]["x"], out[0]["y"].view(-1).long()
                yield (x.permute(0, 3, 1, 2) if s.channels_last else x), y
                if not held:
                    return

    return InputPipeline(s, device, f"NVIDIA DALI, {s.resolved_workers()} threads", forever(),
                         held.clear)

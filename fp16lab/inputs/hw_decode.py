"""The hw-decode input backend: JPEGs decoded by the GPU's hardware JPEG engines (NVJPG).

gpu-decode (:mod:`fp16lab.inputs.gpu_decode`) decodes with nvJPEG's CUDA kernels, on the same SMs the
training step needs: on an H200 its best training row reached 82% of the synthetic-input rate
(issue #14). A100, H100, H200 and later data-centre GPUs also have fixed-function JPEG decode
engines beside the SMs; NVIDIA's nvImageCodec (``nvidia.nvimgcodec``, pip package
``nvidia-nvimgcodec-cu13`` or ``-cu12``) drives them through nvJPEG's hardware backend.

This backend is gpu-decode's pipeline (reader threads, ordered producer threads on side
streams, the batched augmentation of :func:`fp16lab.inputs.gpu_decode.augment_batch`) with one thing
changed: the batch decoder, :class:`HwDecoder`, which asks nvImageCodec for the
``BackendKind.HW_GPU_ONLY`` backend alone, so a file the engines cannot decode is an error
naming the file, never a silent fall-back to decoding on the SMs or the CPU.

nvImageCodec calls used (nvimgcodec 0.9): ``Decoder(device_id=, backends=[Backend(
BackendKind.HW_GPU_ONLY)])``; ``Decoder.decode(list[CodeStream], params=DecodeParams(
apply_exif_orientation=False, color_spec=ColorSpec.SRGB, sample_format=SampleFormat.I_RGB),
cuda_stream=<int>)``, which returns one ``Image`` per code stream, or None where that one could
not be decoded; an ``Image`` of ``I_RGB`` is (H, W, 3) uint8 in device memory (rows may be
padded), taken zero-copy with ``torch.from_dlpack`` (its ``__dlpack__`` makes the consumer's
stream wait for the decode).
"""

from __future__ import annotations

import functools
import io
import threading
from pathlib import Path
from typing import Any

import torch

from .. import validate
from .dataset import CorruptImageError, load_rgb
from .gpu_decode import gpu_decode_pipeline
from .settings import InputPipeline, InputSettings

__all__ = ["HW_DECODER", "HwDecoder", "hw_decode_pipeline", "hw_decode_unavailable", "new_decoder"]

#: How the hw-decode backend's decoder is named in ``InputPipeline.implementation``.
HW_DECODER = "nvImageCodec hardware JPEG decoder (HW_GPU_ONLY)"
#: What to install where ``nvidia.nvimgcodec`` does not import.
INSTALL = "pip install nvidia-nvimgcodec-cu13 for CUDA 13, nvidia-nvimgcodec-cu12 for CUDA 12"


def nvimgcodec() -> Any:
    """Returns the ``nvidia.nvimgcodec`` module (ImportError where it is not installed)."""
    from nvidia import nvimgcodec as module  # local: nvImageCodec is optional

    return module


def new_decoder(device_index: int) -> Any:
    """Returns an nvImageCodec Decoder on GPU ``device_index`` that may use the hardware JPEG
    engines and nothing else (tests on a CPU replace this factory)."""
    nv = nvimgcodec()
    return nv.Decoder(device_id=device_index, backends=[nv.Backend(nv.BackendKind.HW_GPU_ONLY)])


def _params(nv: Any) -> Any:
    # RGB, interleaved; no EXIF rotation, as torchvision's decode_jpeg (gpu-decode) does not
    return nv.DecodeParams(apply_exif_orientation=False, color_spec=nv.ColorSpec.SRGB,
                           sample_format=nv.SampleFormat.I_RGB)


def _to_chw(image: Any) -> torch.Tensor:
    """Returns a decoded (H, W, 3) uint8 Image as a (3, H, W) uint8 tensor view, zero-copy."""
    hwc = torch.from_dlpack(image)
    if hwc.dim() != 3 or hwc.shape[2] != 3 or hwc.dtype != torch.uint8:
        raise RuntimeError(f"nvImageCodec returned a {hwc.dtype} picture of shape "
                           f"{tuple(hwc.shape)}, not (H, W, 3) uint8")
    return hwc.permute(2, 0, 1)


def _device_index(device: str) -> int:
    d = torch.device(device)
    if d.type != "cuda":
        return 0
    return torch.cuda.current_device() if d.index is None else d.index


class HwDecoder:
    """The hw-decode batch decoder: ``decoder(blobs, paths, device)`` returns the JPEG ``blobs``
    (uint8 tensors of file bytes) decoded on ``device``'s hardware JPEG engines as (3, H, W)
    uint8 tensors, in one nvImageCodec call on the current CUDA stream.

    Each calling thread gets a Decoder of its own (made by :func:`new_decoder` on first use):
    the producer threads decode concurrently and nvImageCodec does not say a Decoder may be
    shared. A file the engines cannot decode raises an error naming it:
    :class:`CorruptImageError` where the file does not decode on the CPU either (PIL), a
    RuntimeError where it does (e.g. a progressive JPEG: hw-decode never falls back to SM or
    CPU decoding, so such a data set needs gpu-decode).
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self, blobs: list[torch.Tensor], paths: list[Path],
                 device: str) -> list[torch.Tensor]:
        nv = nvimgcodec()
        if not hasattr(self._local, "decoder"):
            self._local.decoder = new_decoder(_device_index(device))
        cuda = str(device).startswith("cuda")
        stream = torch.cuda.current_stream(torch.device(device)).cuda_stream if cuda else 0
        streams = [nv.CodeStream(blob.numpy()) for blob in blobs]
        images = self._local.decoder.decode(streams, params=_params(nv), cuda_stream=stream)
        for image, blob, path in zip(images, blobs, paths):
            if image is None:
                raise _failure(blob, path)
        return [_to_chw(image) for image in images]


def _failure(blob: torch.Tensor, path: Path) -> Exception:
    """Returns the error for a file the hardware decoder returned no picture for: the
    :class:`CorruptImageError` of :func:`fp16lab.inputs.dataset.load_rgb` where PIL cannot decode its
    bytes either, else a RuntimeError saying the hardware cannot."""
    try:
        load_rgb(path, data=blob.numpy().tobytes())
    except CorruptImageError as e:
        return e
    return RuntimeError(f"the GPU's hardware JPEG decoder cannot decode image file {path} (it "
                        "decodes on the CPU: perhaps a progressive or otherwise unsupported "
                        "JPEG); hw-decode does not fall back to SM or CPU decoding, use the "
                        "gpu-decode backend for such files")


def _probe_jpeg() -> Any:
    """Returns the bytes of a small baseline 4:2:0 JPEG (what the data sets here are made of)."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:96, 0:128]
    rgb = np.stack([x * 2, y * 2, (x + y)], axis=-1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="JPEG", quality=90, subsampling=2)
    return np.frombuffer(out.getvalue(), dtype=np.uint8).copy()


@functools.lru_cache(maxsize=None)
def _hw_probe(device_index: int) -> str | None:
    """Decodes one small JPEG on GPU ``device_index``'s hardware engines; returns why it
    could not, or None. Made once per GPU (a Decoder and one picture: well under a second)."""
    nv = nvimgcodec()
    try:
        decoder = new_decoder(device_index)
        image = decoder.decode([nv.CodeStream(_probe_jpeg())], params=_params(nv))[0]
    except Exception as e:  # what nvImageCodec raises here is not documented
        return (f"nvImageCodec's hardware JPEG decoder (HW_GPU_ONLY) failed to start on GPU "
                f"{device_index}: {type(e).__name__}: {e}")
    if image is None:
        name = torch.cuda.get_device_name(device_index) if torch.cuda.is_available() else "?"
        return (f"this GPU ({name}) has no hardware JPEG decoder that nvImageCodec can use: "
                "its HW_GPU_ONLY backend decoded nothing (A100, H100, H200 and later data-"
                "centre GPUs have one); use gpu-decode")
    return None


def hw_decode_unavailable(device: str) -> str | None:
    """Returns why hw-decode cannot run on ``device`` here, or None when it can: it needs a
    CUDA GPU, the nvImageCodec package, and a GPU with hardware JPEG engines (checked by
    decoding one small JPEG on them, once per GPU)."""
    device = validate.device("device", device)
    if not str(device).startswith("cuda"):
        return ("hw-decode decodes on the hardware JPEG engines of a CUDA GPU; the device here "
                f"is {device}")
    try:
        nvimgcodec()
    except ImportError as e:
        return f"NVIDIA nvImageCodec is not installed ({INSTALL}): {e}"
    if not torch.cuda.is_available():
        return "hw-decode needs a CUDA GPU; torch.cuda.is_available() is False here"
    return _hw_probe(_device_index(device))


def hw_decode_pipeline(s: InputSettings, root: Path, device: str, **kw: Any) -> InputPipeline:
    """Returns the hw-decode :class:`InputPipeline` of ``s`` over the image folder ``root``
    (use :func:`fp16lab.inputs.make_input`, which checks the settings and folder first): the
    gpu-decode pipeline with :class:`HwDecoder` as its batch decoder. ``kw`` goes to
    :func:`fp16lab.inputs.gpu_decode.gpu_decode_pipeline` (``producers``, ``depth``)."""
    return gpu_decode_pipeline(s, root, device, decode=HwDecoder(), decoder=HW_DECODER, **kw)

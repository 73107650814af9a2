"""The input backends by name, and :func:`make_input`, which checks its settings and builds one.

Five backends (``BACKENDS``) each yield ``(images, labels)`` batches on the training device,
images float32 (N, 3, size, size) normalised by ImageNet's mean and std, labels int64:

- ``synthetic``: one random batch made on the device once and returned every time
  (:mod:`fp16lab.inputs.synthetic`).
- ``dataloader``: ``torch.utils.data.DataLoader`` over the JPEG files, decoding and augmenting
  in CPU worker processes, then a copy to the GPU (:mod:`fp16lab.inputs.dataloader`).
- ``gpu-decode``: threads read the file bytes on the CPU; nvJPEG decodes them on the GPU
  (``torchvision.io.decode_jpeg(device="cuda")``) and the crop, flip and normalisation run
  there as tensor operations; two producer threads each make whole batches, handed over in
  order (:mod:`fp16lab.inputs.gpu_decode`).
- ``hw-decode``: gpu-decode's pipeline with the JPEGs decoded by the GPU's hardware JPEG
  engines (NVJPG, on A100, H100, H200 and later) through NVIDIA nvImageCodec, leaving the SMs
  to training; nvImageCodec's ``HW_GPU_ONLY`` backend alone, never a fall-back to the SMs or
  the CPU (:mod:`fp16lab.inputs.hw_decode`).
- ``dali``: an NVIDIA DALI pipeline (decoding with nvJPEG, augmentation on the GPU), where the
  ``nvidia-dali`` package imports; elsewhere :func:`unavailable_reason` says why not
  (:mod:`fp16lab.inputs.dali`).

The backend modules import without their optional heavy dependencies (torchvision's nvJPEG,
nvImageCodec, DALI): each imports its own inside the function that builds or checks it, so a
backend that cannot run here costs nothing until it is asked for.

:class:`InputSettings` checks its fields as it is made; :func:`make_input` checks the folder
and the device against them before any work starts. A file that cannot be decoded raises :class:`fp16lab.inputs.CorruptImageError`
naming the file, from the batch that meets it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import validate
from .dali import dali_pipeline, dali_unavailable
from .dataloader import dataloader_pipeline
from .dataset import scan_image_folder
from .gpu_decode import gpu_decode_pipeline, gpu_decode_unavailable
from .hw_decode import hw_decode_pipeline, hw_decode_unavailable
from .settings import InputPipeline, InputSettings
from .synthetic import synthetic_pipeline

__all__ = ["BACKENDS", "REGISTRY", "Backend", "make_input", "unavailable_reason"]


@dataclass(frozen=True)
class Backend:
    """One input backend: what it does, how to build it, and why it may not run here.

    Attributes:
        description: one line, what the backend does.
        build: returns its :class:`InputPipeline`: ``build(settings, root, device)`` where it
            ``reads_files``, else ``build(settings, device, num_classes)``.
        reads_files: whether it reads an image folder.
        unavailable: ``unavailable(device)`` returns why it cannot run on ``device`` here, or
            None; None means it runs everywhere.
    """

    description: str
    build: Callable[..., InputPipeline]
    reads_files: bool = True
    unavailable: Callable[[str], str | None] | None = None


#: The input backends by name.
REGISTRY: dict[str, Backend] = {
    "synthetic": Backend("one random batch made on the device once (no files, no decoding)",
                         synthetic_pipeline, reads_files=False),
    "dataloader": Backend("DataLoader: decode, crop, flip, normalise on CPU worker processes, "
                          "copy to GPU", dataloader_pipeline),
    "gpu-decode": Backend("bytes read on the CPU, nvJPEG decode and augmentation on the GPU",
                          gpu_decode_pipeline, unavailable=gpu_decode_unavailable),
    "hw-decode": Backend("bytes read on the CPU, decode on the GPU's hardware JPEG engines "
                         "(nvImageCodec), augmentation on the GPU",
                         hw_decode_pipeline, unavailable=hw_decode_unavailable),
    "dali": Backend("NVIDIA DALI: nvJPEG decode and augmentation on the GPU in DALI's own "
                    "pipeline", dali_pipeline, unavailable=dali_unavailable),
}

#: The input backends, with what each one does.
BACKENDS = {name: backend.description for name, backend in REGISTRY.items()}


def unavailable_reason(backend: str, device: str) -> str | None:
    """Returns why ``backend`` cannot run on ``device`` here, or None when it can."""
    device = validate.device("device", device)
    validate.choice("backend", backend, REGISTRY)
    check = REGISTRY[backend].unavailable
    return None if check is None else check(device)


def _check(settings: InputSettings, root: str | Path | None, device: str) -> None:
    """Raises unless the folder and the device suit ``settings`` (checked as they were made)."""
    s = settings
    if not REGISTRY[s.backend].reads_files:
        return
    if root is None:
        raise ValueError(f"the {s.backend} backend reads image files: pass root= an image folder "
                         "(fp16lab.inputs.make_image_folder makes one)")
    files, _, _ = scan_image_folder(validate.existing_dir("root", root))
    if len(files) < s.batch:
        raise ValueError(f"image folder {root} has {len(files)} images, fewer than one batch of "
                         f"{s.batch}; make more images or use a smaller batch")
    reason = unavailable_reason(s.backend, device)
    if reason:
        raise RuntimeError(f"input backend {s.backend!r} cannot run here: {reason}")


def make_input(settings: InputSettings, root: str | Path | None = None, *,
               device: str = "cuda", num_classes: int = 10) -> InputPipeline:
    """Returns an :class:`InputPipeline` for ``settings``, reading ``root`` (an ImageFolder).

    ``num_classes`` sets the label range of the synthetic backend (file backends take the labels
    from the class folders). Raises ValueError, FileNotFoundError or RuntimeError, before any
    work starts, when a setting, the folder or the backend is not usable here.
    """
    if not isinstance(settings, InputSettings):
        raise TypeError(f"settings must be an InputSettings, got {type(settings).__name__}")
    device = validate.device("device", device)
    num_classes = validate.count("num_classes", num_classes)
    _check(settings, root, device)
    backend = REGISTRY[settings.backend]
    if backend.reads_files:
        return backend.build(settings, Path(root), device)
    return backend.build(settings, device, num_classes)

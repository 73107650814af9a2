"""The dataloader input backend: ``torch.utils.data.DataLoader`` over the JPEG files.

Decoding, RandomResizedCrop, flip and (by default) normalisation run in ``num_workers`` CPU
processes over epochs run back to back; then a copy to the GPU (pinned memory and
``non_blocking`` as options; non-blocking copies run one batch ahead on a side stream, as in
NVIDIA's ImageNet example) and channels_last there. torchvision's ``ImageFolder`` and
transforms where torchvision is installed, otherwise fp16lab's equivalent
(:class:`JpegFolder`: :mod:`fp16lab.inputs.augment`, PIL); ``pipeline.implementation`` says
which.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import torch

from .augment import IMAGENET_MEAN, IMAGENET_STD, augment_pil, normalize
from .dataset import CorruptImageError, load_rgb, scan_image_folder
from .settings import InputPipeline, InputSettings

__all__ = ["JpegFolder", "dataloader_pipeline"]

#: The sampler runs epochs back to back, at least this many images a pass.
_SAMPLES_PER_PASS = 1 << 22


def _to_device(x: torch.Tensor, y: torch.Tensor, s: InputSettings,
               device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies a CPU batch to the device, sets the layout, normalises a uint8 batch there."""
    nb = s.non_blocking and str(device).startswith("cuda")
    x, y = x.to(device, non_blocking=nb), y.to(device, non_blocking=nb)
    if s.channels_last:  # before normalising: a uint8 batch moves a quarter of the bytes
        x = x.contiguous(memory_format=torch.channels_last)
    if x.dtype == torch.uint8:
        x = normalize(x)  # elementwise: keeps the channels_last layout
    return x, y


def _prefetched(batches: Iterator[tuple[torch.Tensor, torch.Tensor]], s: InputSettings,
                device: str) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yields CPU batches placed on a CUDA ``device``, one batch ahead, as NVIDIA's ImageNet
    example's ``data_prefetcher`` does: the copy (and the normalisation of a uint8 batch) of
    batch k+1 is launched on a side stream before batch k is handed over, so it overlaps
    batch k's training step instead of queueing behind it on the training stream."""
    stream = torch.cuda.Stream(device=torch.device(device))

    def start(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        with torch.cuda.stream(stream):
            x, y = _to_device(x, y, s, device)
            done = torch.cuda.Event()
            done.record(stream)
        return x, y, done

    ahead = start(*next(batches))
    while True:
        x, y, done = ahead
        here = torch.cuda.current_stream()
        here.wait_event(done)
        x.record_stream(here)  # made on the side stream, used on this one
        y.record_stream(here)
        ahead = start(*next(batches))
        yield x, y


def _from_worker(e: CorruptImageError) -> CorruptImageError:
    """Returns the error a DataLoader worker raised, as raised there (its message names the
    file). The DataLoader re-raises it in this process as ``CorruptImageError("Caught
    CorruptImageError in DataLoader worker process 0. Original Traceback ...")``, the
    worker's message only on the traceback's last line."""
    text = str(e)
    if not text.startswith("Caught "):  # raised here (no worker processes): already named
        return e
    last = [line for line in text.splitlines() if f"{CorruptImageError.__name__}: " in line]
    if not last:
        return e
    return CorruptImageError(last[-1].split(f"{CorruptImageError.__name__}: ", 1)[1])


class JpegFolder(torch.utils.data.Dataset):
    """fp16lab's ImageFolder: (uint8 or normalised float crop, label) for each file, read with PIL."""

    def __init__(self, root: Path, size: int, normalize_here: bool) -> None:
        self.files, self.labels, self.classes = scan_image_folder(root)
        self.size, self.normalize_here = size, normalize_here

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = augment_pil(load_rgb(self.files[i]), self.size)
        return (normalize(x[None])[0] if self.normalize_here else x), self.labels[i]


def _torchvision_folder(root: Path, size: int, normalize_here: bool) -> Any:
    """Returns torchvision's ImageFolder with the same augmentation, or None without torchvision."""
    try:  # local: torchvision is optional (JpegFolder stands in without it)
        from torchvision import datasets, transforms as T
    except ImportError:
        return None
    steps = [T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.PILToTensor()]
    if normalize_here:
        steps += [T.ConvertImageDtype(torch.float32), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    # load_rgb instead of torchvision's PIL loader: its error names the file that failed
    return datasets.ImageFolder(str(root), transform=T.Compose(steps), loader=load_rgb)


def dataloader_pipeline(s: InputSettings, root: Path, device: str) -> InputPipeline:
    """Returns the dataloader :class:`InputPipeline` of ``s`` over the image folder ``root``
    (use :func:`fp16lab.inputs.make_input`, which checks the settings and folder first)."""
    normalize_here = s.normalize_on == "cpu"
    dataset = _torchvision_folder(root, s.image_size, normalize_here)
    implementation = "torchvision ImageFolder + transforms"
    if dataset is None:
        dataset = JpegFolder(root, s.image_size, normalize_here)
        implementation = "fp16lab JpegFolder (PIL; torchvision is not installed)"
    workers = s.resolved_workers()
    pin = s.pin_memory and str(device).startswith("cuda")
    # one long pass over many shuffled epochs, back to back: no pipeline drain and refill at
    # every epoch's end, which on a small data set (8 batches an epoch) would idle the workers
    passes = max(1, -(-_SAMPLES_PER_PASS // len(dataset)))
    sampler = torch.utils.data.RandomSampler(dataset, num_samples=passes * len(dataset),
                                             generator=torch.Generator().manual_seed(s.seed))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=s.batch, sampler=sampler, drop_last=True, num_workers=workers,
        pin_memory=pin, persistent_workers=workers > 0)

    def on_cpu() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        try:
            while True:  # persistent workers survive from one pass to the next
                yield from loader
        except CorruptImageError as e:
            raise _from_worker(e) from None

    def forever() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if str(device).startswith("cuda") and s.non_blocking:
            yield from _prefetched(on_cpu(), s, device)
        else:  # the copy waits on the training stream (and, blocking, the host waits too)
            for x, y in on_cpu():
                yield _to_device(x, y, s, device)

    def close() -> None:
        it = getattr(loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()

    return InputPipeline(s, device, f"{implementation}, {workers} workers", forever(), close)

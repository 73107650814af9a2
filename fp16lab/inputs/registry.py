"""Input pipelines behind one interface: where a training batch comes from, and what it costs.

Five backends (``BACKENDS``) each yield ``(images, labels)`` batches on the training device,
images float32 (N, 3, size, size) normalised by ImageNet's mean and std, labels int64:

- ``synthetic``: one random batch made on the device once and returned every time. Free; the
  upper bound every sweep before notebook 07 measured.
- ``dataloader``: ``torch.utils.data.DataLoader`` over the JPEG files, with decoding,
  RandomResizedCrop, flip and (by default) normalisation in ``num_workers`` CPU processes
  over epochs run back to back, then a copy to the GPU (pinned memory and ``non_blocking`` as
  options; non-blocking copies run one batch ahead on a side stream, as in NVIDIA's ImageNet
  example) and channels_last there.
  torchvision's ``ImageFolder`` and transforms where torchvision is installed, otherwise
  fp16lab's equivalent (:mod:`fp16lab.augment`, PIL); ``pipeline.implementation`` says which.
- ``gpu-decode``: threads read the file bytes on the CPU; nvJPEG decodes them on the GPU
  (``torchvision.io.decode_jpeg(device="cuda")``) and the crop, flip and normalisation run
  there as tensor operations; two producer threads each make whole batches, handed over in
  order (:mod:`fp16lab.gpu_decode`).
- ``hw-decode``: gpu-decode's pipeline with the JPEGs decoded by the GPU's hardware JPEG
  engines (NVJPG, on A100, H100, H200 and later) through NVIDIA nvImageCodec, leaving the SMs
  to training; nvImageCodec's ``HW_GPU_ONLY`` backend alone, never a fall-back to the SMs or
  the CPU (:mod:`fp16lab.hw_decode`).
- ``dali``: an NVIDIA DALI pipeline (decoding with nvJPEG, augmentation on the GPU), where the
  ``nvidia-dali`` package imports; elsewhere :func:`unavailable_reason` says why not.

:func:`make_input` checks everything it is given (backend, batch, folder, options) before any
work starts. A file that cannot be decoded raises :class:`fp16lab.data.CorruptImageError`
naming the file, from the batch that meets it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from .augment import augment_pil, normalize
from .dataset import load_rgb, scan_image_folder

__all__ = ["BACKENDS", "CPU_SHARE_BACKENDS", "InputPipeline", "InputSettings", "cpu_cores",
           "default_workers", "make_input", "unavailable_reason"]

#: The input backends, with what each one does.
BACKENDS = {
    "synthetic": "one random batch made on the device once (no files, no decoding)",
    "dataloader": "DataLoader: decode, crop, flip, normalise on CPU worker processes, copy to GPU",
    "gpu-decode": "bytes read on the CPU, nvJPEG decode and augmentation on the GPU",
    "hw-decode": "bytes read on the CPU, decode on the GPU's hardware JPEG engines "
                 "(nvImageCodec), augmentation on the GPU",
    "dali": "NVIDIA DALI: nvJPEG decode and augmentation on the GPU in DALI's own pipeline",
}

#: The backends built on gpu-decode's pipeline, whose reader threads can decode a share of each
#: batch on the CPU (``InputSettings.cpu_decode_share``).
CPU_SHARE_BACKENDS = ("gpu-decode", "hw-decode")

#: Share of the CPU cores the default worker count uses (the "75% of cores" rule).
WORKER_SHARE = 0.75
#: The dataloader backend's sampler runs epochs back to back, at least this many images a pass.
_SAMPLES_PER_PASS = 1 << 22


def cpu_cores() -> int:
    """Returns the number of CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_workers(cores: int | None = None) -> int:
    """Returns the default worker count: 75% of the cores rounded down, at least 1."""
    return max(1, int(WORKER_SHARE * (cores or cpu_cores())))


@dataclass(frozen=True)
class InputSettings:
    """How to build one input pipeline. Every field is checked by :func:`make_input`.

    Attributes:
        backend: one of ``BACKENDS``.
        batch: images per batch. image_size: side of the square crops.
        num_workers: worker processes (dataloader), reader/decoder threads (gpu-decode,
            hw-decode, dali);
            None means :func:`default_workers`.
        pin_memory, non_blocking: dataloader only: page-locked batches; an asynchronous copy
            (and normalisation) one batch ahead on a side stream, instead of on the training
            stream when the batch is taken.
        channels_last: the batch is converted to channels_last on the device.
        normalize_on: ``"cpu"`` (in the workers, float32 crosses to the GPU) or ``"gpu"``
            (uint8 crosses, 4x fewer bytes, and is normalised there); dataloader only.
        seed: the order of the files and the random crops follow it (except the crops of a
            dataloader with ``num_workers=0``, which draw from torch's global RNG).
        cpu_decode_share: gpu-decode and hw-decode only: the share of each batch that the
            reader threads decode on the CPU (libjpeg-turbo, through torchvision) while the GPU
            (nvJPEG, or the JPEG engines) decodes the rest; 0 (the default) decodes everything
            on the GPU.
    """

    backend: str
    batch: int
    image_size: int = 224
    num_workers: int | None = None
    pin_memory: bool = True
    non_blocking: bool = True
    channels_last: bool = True
    normalize_on: str = "cpu"
    seed: int = 0
    cpu_decode_share: float = 0.0

    def resolved_workers(self) -> int:
        """Returns the worker count this pipeline uses."""
        return default_workers() if self.num_workers is None else self.num_workers


def unavailable_reason(backend: str, device: str) -> str | None:
    """Returns why ``backend`` cannot run on ``device`` here, or None when it can."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown input backend {backend!r}; known: {', '.join(BACKENDS)}")
    cuda = str(device).startswith("cuda")
    if backend == "gpu-decode":
        if not cuda:
            return "gpu-decode decodes with nvJPEG on a CUDA GPU; the device here is " + str(device)
        try:
            from torchvision.io import decode_jpeg  # noqa: F401
        except ImportError:
            return "gpu-decode needs torchvision (torchvision.io.decode_jpeg); it is not installed"
    if backend == "hw-decode":
        from .hw_decode import hw_decode_unavailable

        return hw_decode_unavailable(device)
    if backend == "dali":
        if not cuda:
            return "dali runs its GPU pipeline on a CUDA GPU; the device here is " + str(device)
        try:
            import nvidia.dali  # noqa: F401
        except ImportError:
            return ("NVIDIA DALI is not installed (pip install nvidia-dali-cuda130 for CUDA 13, "
                    "nvidia-dali-cuda120 for CUDA 12; Linux x86-64 and aarch64 only)")
    return None


def _check(settings: InputSettings, root: str | Path | None, device: str) -> None:
    s = settings
    problems = []
    if s.backend not in BACKENDS:
        problems.append(f"backend must be one of {', '.join(BACKENDS)}, got {s.backend!r}")
    for name, low in (("batch", 1), ("image_size", 8), ("seed", 0)):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.append(f"{name} must be an integer >= {low}, got {value!r}")
    w = s.num_workers
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 0):
        problems.append(f"num_workers must be None (75% of the cores) or an integer >= 0, got {w!r}")
    if w == 0 and s.backend in ("gpu-decode", "hw-decode", "dali"):
        problems.append(f"{s.backend} needs num_workers >= 1 (its reader threads), got 0")
    for name in ("pin_memory", "non_blocking", "channels_last"):
        if not isinstance(getattr(s, name), bool):
            problems.append(f"{name} must be True or False, got {getattr(s, name)!r}")
    if s.normalize_on not in ("cpu", "gpu"):
        problems.append(f"normalize_on must be 'cpu' or 'gpu', got {s.normalize_on!r}")
    share = s.cpu_decode_share
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share < 1:
        problems.append(f"cpu_decode_share must be a number in [0, 1), got {share!r}")
    elif share and s.backend not in CPU_SHARE_BACKENDS:
        problems.append(f"cpu_decode_share applies to the {' and '.join(CPU_SHARE_BACKENDS)} "
                        f"backends only, not {s.backend!r}")
    if problems:
        raise ValueError("bad input settings: " + "; ".join(problems))
    if s.backend == "synthetic":
        return
    if root is None:
        raise ValueError(f"the {s.backend} backend reads image files: pass root= an image folder "
                         "(fp16lab.data.make_image_folder makes one)")
    files, _, _ = scan_image_folder(root)
    if len(files) < s.batch:
        raise ValueError(f"image folder {root} has {len(files)} images, fewer than one batch of "
                         f"{s.batch}; make more images or use a smaller batch")
    reason = unavailable_reason(s.backend, device)
    if reason:
        raise RuntimeError(f"input backend {s.backend!r} cannot run here: {reason}")


class InputPipeline:
    """An endless source of training batches: ``next(pipeline)`` returns (images, labels).

    Attributes:
        settings: the :class:`InputSettings` it was built from.
        device: where the batches are.
        implementation: which code produces them (e.g. torchvision's ImageFolder or fp16lab's).
    """

    def __init__(self, settings: InputSettings, device: str, implementation: str,
                 batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
                 close: Callable[[], None] = lambda: None,
                 stages: Callable[[], dict[str, float]] = dict) -> None:
        self.settings, self.device, self.implementation = settings, device, implementation
        self._batches, self._close, self._stages = batches, close, stages

    def stage_seconds(self) -> dict[str, float]:
        """Returns the host seconds spent so far in each stage of making batches, with the
        batch count (``batches``), for backends that keep them (gpu-decode, hw-decode); else {}."""
        return self._stages()

    def __iter__(self) -> "InputPipeline":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return next(self._batches)

    def close(self) -> None:
        """Stops the workers and threads behind the pipeline."""
        self._close()

    def __enter__(self) -> "InputPipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"InputPipeline({self.settings.backend}, {self.implementation}, device={self.device})"


def make_input(settings: InputSettings, root: str | Path | None = None, *,
               device: str = "cuda", num_classes: int = 10) -> InputPipeline:
    """Returns an :class:`InputPipeline` for ``settings``, reading ``root`` (an ImageFolder).

    ``num_classes`` sets the label range of the synthetic backend (file backends take the labels
    from the class folders). Raises ValueError, FileNotFoundError or RuntimeError, before any
    work starts, when a setting, the folder or the backend is not usable here.
    """
    _check(settings, root, device)
    if settings.backend == "synthetic":
        return _synthetic(settings, device, num_classes)
    if settings.backend == "dataloader":
        return _dataloader(settings, Path(root), device)
    if settings.backend == "gpu-decode":
        from .gpu_decode import gpu_decode_pipeline  # it builds on this module's types

        return gpu_decode_pipeline(settings, Path(root), device)
    if settings.backend == "hw-decode":
        from .hw_decode import hw_decode_pipeline

        return hw_decode_pipeline(settings, Path(root), device)
    return _dali(settings, Path(root), device)


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


def _synthetic(s: InputSettings, device: str, num_classes: int) -> InputPipeline:
    g = torch.Generator().manual_seed(s.seed)
    x = torch.randn(s.batch, 3, s.image_size, s.image_size, generator=g).to(device)
    y = torch.randint(0, num_classes, (s.batch,), generator=g).to(device)
    if s.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)

    def forever() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield x, y

    return InputPipeline(s, device, "one random batch on the device", forever())


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
    try:
        from torchvision import datasets, transforms as T
    except ImportError:
        return None
    steps = [T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.PILToTensor()]
    if normalize_here:
        from .augment import IMAGENET_MEAN, IMAGENET_STD
        steps += [T.ConvertImageDtype(torch.float32), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    # load_rgb instead of torchvision's PIL loader: its error names the file that failed
    return datasets.ImageFolder(str(root), transform=T.Compose(steps), loader=load_rgb)


def _dataloader(s: InputSettings, root: Path, device: str) -> InputPipeline:
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
        while True:  # persistent workers survive from one pass to the next
            yield from loader

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


def _dali(s: InputSettings, root: Path, device: str) -> InputPipeline:
    """DALI: file reader, JPEG decode with a random crop, resize, flip and normalise, all in
    DALI's own pipeline. On a CUDA device the ``mixed`` decoder shares each batch between the
    GPU's JPEG engines (DALI's default ``hw_decoder_load`` share) and nvJPEG; the batch leaves
    DALI in NHWC memory, which is channels_last as an NCHW tensor, so it is handed over without
    a copy. (On a CPU the decoder is libjpeg-turbo: ``make_input`` refuses that, and tests use
    it to check this plumbing without a GPU.)"""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    from .augment import IMAGENET_MEAN, IMAGENET_STD, RATIO, SCALE

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

"""The gpu-decode input backend: nvJPEG decoding and batched augmentation on the GPU.

File bytes are read on the CPU by a pool of reader threads; :func:`decode_batch` decodes a
whole batch with one ``torchvision.io.decode_jpeg(device="cuda")`` call (torchvision runs one
decode at a time, under a global lock, and waits for it), or, for a chosen share of each
batch, :func:`decode_on_cpu` in the reader threads; :func:`augment_batch` draws the batch's
crops at once and resamples them with a few batched kernels. Two producer threads
(:class:`fp16lab.inputs.producers.OrderedProducer`) each make whole batches on a CUDA stream of their
own, so one thread's decode overlaps the other's Python work, and hand them over in order.
:func:`gpu_decode_pipeline` is what :func:`fp16lab.inputs.make_input` returns for
``backend="gpu-decode"``, after its checks. torchvision (its nvJPEG decoder) is imported only
when a batch is decoded or the backend checked (:func:`gpu_decode_unavailable`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .. import validate
from .augment import batch_generator, draw_crops, normalize, resized_crops
from .dataset import CorruptImageError, read_jpeg_bytes, scan_image_folder
from .producers import OrderedProducer
from .settings import InputPipeline, InputSettings

__all__ = ["GPU_DECODE_DEPTH", "GPU_DECODE_PRODUCERS", "augment_batch", "decode_batch",
           "decode_on_cpu", "gpu_decode_pipeline", "gpu_decode_unavailable"]


def gpu_decode_unavailable(device: str) -> str | None:
    """Returns why gpu-decode cannot run on ``device`` here, or None when it can: it needs a
    CUDA GPU and torchvision's ``decode_jpeg``."""
    device = validate.device("device", device)
    if not str(device).startswith("cuda"):
        return "gpu-decode decodes with nvJPEG on a CUDA GPU; the device here is " + str(device)
    try:
        from torchvision.io import decode_jpeg  # noqa: F401  (local: torchvision is optional)
    except ImportError:
        return "gpu-decode needs torchvision (torchvision.io.decode_jpeg); it is not installed"
    return None


def decode_batch(blobs: list[torch.Tensor], paths: list[Path], device: str) -> list[torch.Tensor]:
    """Returns the JPEGs ``blobs`` decoded by nvJPEG on ``device`` as (3, H, W) uint8 tensors.

    nvJPEG fails a batch as a whole; the files are then decoded one by one on the CPU to find
    and name the one that is broken.
    """
    from torchvision.io import ImageReadMode, decode_jpeg  # local: torchvision is optional

    try:
        return decode_jpeg(blobs, mode=ImageReadMode.RGB, device=device)
    except RuntimeError as e:
        for blob, path in zip(blobs, paths):
            try:
                decode_jpeg(blob, mode=ImageReadMode.RGB)
            except RuntimeError as one:
                raise CorruptImageError(f"cannot decode image file {path}: {one}") from None
        raise RuntimeError(f"nvJPEG failed on a batch whose files all decode on the CPU: {e}") from e


def decode_on_cpu(blob: torch.Tensor, path: Path) -> torch.Tensor:
    """Returns one JPEG decoded on the CPU (libjpeg-turbo, through torchvision) as a (3, H, W)
    uint8 tensor; raises CorruptImageError naming ``path`` when it cannot be decoded."""
    from torchvision.io import ImageReadMode, decode_jpeg  # local: torchvision is optional

    try:
        return decode_jpeg(blob, mode=ImageReadMode.RGB)
    except (RuntimeError, ValueError) as e:
        raise CorruptImageError(f"cannot decode image file {path}: {e}") from None


def _to_device(pictures: list[torch.Tensor], device: str) -> list[torch.Tensor]:
    """Returns CPU pictures copied to ``device``: pictures of one size in one page-locked,
    non-blocking copy on the current stream, others one by one."""
    if not pictures or not str(device).startswith("cuda"):
        return pictures
    if len({tuple(p.shape) for p in pictures}) == 1:
        return list(torch.stack(pictures).pin_memory().to(device, non_blocking=True).unbind(0))
    return [p.pin_memory().to(device, non_blocking=True) for p in pictures]


def _deal(items: list[int], n: int) -> list[list[int]]:
    """Returns ``items`` dealt round-robin into at most ``n`` non-empty hands."""
    return [items[i::n] for i in range(min(n, len(items)))]


def _gather(hands: list[list[Any]], n: int, total: int) -> list[Any]:
    """Returns the items of hands dealt by :func:`_deal` (``n`` hands, ``total`` items) in order."""
    out: list[Any] = [None] * total
    for i, hand in enumerate(hands):
        out[i::n] = hand
    return out


def augment_batch(images: list[torch.Tensor], size: int,
                  generator: np.random.Generator) -> torch.Tensor:
    """Returns a (N, 3, size, size) float32 batch on the images' device (0-255 scale): a random
    resized crop and flip of each decoded (3, H, W) uint8 image.

    The crops and flips of the whole batch are drawn at once (:func:`draw_crops`, a few numpy
    operations) and the pixels resampled at once (:func:`resized_crops`): a batch of 256 costs
    a few tens of kernel launches and no Python loop per picture.
    """
    crops, flips = draw_crops([img.shape[1] for img in images], [img.shape[2] for img in images],
                              generator)
    return resized_crops(images, crops, flips, size)


#: Producer threads of the gpu-decode backend: while one decodes a batch (nvJPEG, no
#: interpreter lock), the other draws and launches the augmentation of the previous one.
GPU_DECODE_PRODUCERS = 2
#: Batches of the gpu-decode backend in hand at once (being made, or ready and not yet taken).
GPU_DECODE_DEPTH = 4
#: The numpy stream word that keeps an epoch's file order apart from the batches' crop draws.
_ORDER_STREAM = 0x0DE4


def _epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """Returns the file order of ``epoch``: a permutation of range(n), fixed by (seed, epoch)."""
    return np.random.default_rng([seed, epoch, _ORDER_STREAM]).permutation(n)


def gpu_decode_pipeline(
        s: InputSettings, root: Path, device: str, *,
        decode: Callable[[list[torch.Tensor], list[Path], str], list[torch.Tensor]] = decode_batch,
        cpu_decode: Callable[[torch.Tensor, Path], torch.Tensor] = decode_on_cpu,
        producers: int = GPU_DECODE_PRODUCERS, depth: int = GPU_DECODE_DEPTH,
        decoder: str = "nvJPEG (torchvision.io.decode_jpeg)") -> InputPipeline:
    """Returns the gpu-decode :class:`InputPipeline` of ``s`` over the image folder ``root``
    (use :func:`fp16lab.inputs.make_input`, which checks the settings and folder first).

    Batch k is made by one of ``producers`` threads (:class:`OrderedProducer`): its files
    are read by the pool of reader threads, decoded with one nvJPEG call, its crops drawn from
    :func:`batch_generator` (seed, k) and applied with a few batched kernels on the thread's
    own CUDA stream, with an event to wait on. Batches are handed over in order, so the result
    does not depend on which thread made which batch; one thread's decode overlaps another's
    Python work, and both overlap the training step. With ``s.cpu_decode_share`` above 0, the
    last share of each batch's files is decoded by ``cpu_decode`` in the reader threads while
    nvJPEG decodes the rest, and copied over (more decoders at work when nvJPEG is what caps
    the rate). ``decode`` and ``cpu_decode`` turn bytes into pictures (tests on a CPU swap in
    PIL; the hw-decode backend passes nvImageCodec's hardware decoder, :mod:`fp16lab.inputs.hw_decode`),
    and ``decoder`` names ``decode`` in the pipeline's ``implementation``. The pipeline's ``stage_seconds()`` adds up, over threads,
    the host seconds spent waiting for the reads, in the decode call (which returns when the
    batch is decoded, and includes waiting while the other thread's batch is: torchvision
    decodes one batch at a time), waiting after it for the CPU's share, and in the augmentation
    (drawn, launched, and run: the labels' small blocking copy afterwards waits for the
    thread's stream)."""
    files, labels, _ = scan_image_folder(root)
    cuda = str(device).startswith("cuda")
    per_epoch = len(files) // s.batch
    workers = s.resolved_workers()
    reader = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fp16lab-gpu-decode-read")
    local = threading.local()  # each producer thread's CUDA stream
    lock = threading.Lock()
    orders: dict[int, np.ndarray] = {}
    stages = {"batches": 0, "read_s": 0.0, "decode_s": 0.0, "cpu_decode_wait_s": 0.0,
              "augment_s": 0.0}

    def order(epoch: int) -> np.ndarray:
        with lock:
            if epoch not in orders:
                for old in [e for e in orders if e < epoch - 1]:
                    del orders[old]
                orders[epoch] = _epoch_order(s.seed, epoch, len(files))
            return orders[epoch]

    def read(chunk: list[int]) -> list[torch.Tensor]:
        return [torch.frombuffer(bytearray(read_jpeg_bytes(files[i])), dtype=torch.uint8)
                for i in chunk]

    def read_and_decode(chunk: list[int]) -> list[torch.Tensor]:
        return [cpu_decode(blob, files[i]) for blob, i in zip(read(chunk), chunk)]

    def make(k: int) -> tuple[torch.Tensor, torch.Tensor, Any]:
        epoch, b = divmod(k, per_epoch)
        idx = order(epoch)[b * s.batch:(b + 1) * s.batch].tolist()
        n_cpu = round(s.cpu_decode_share * len(idx))
        on_gpu, on_cpu = idx[:len(idx) - n_cpu], idx[len(idx) - n_cpu:]
        t0 = time.perf_counter()
        # the reads nvJPEG waits for go first in the readers' queue, the CPU's decodes after
        reading = [reader.submit(read, hand) for hand in _deal(on_gpu, workers)]
        decoding = [reader.submit(read_and_decode, hand) for hand in _deal(on_cpu, workers)]
        blobs = _gather([f.result() for f in reading], workers, len(on_gpu))
        t1 = time.perf_counter()
        if cuda and not hasattr(local, "stream"):
            local.stream = torch.cuda.Stream(device=torch.device(device))
        with torch.cuda.stream(local.stream) if cuda else contextlib.nullcontext():
            pictures = decode(blobs, [files[i] for i in on_gpu], device) if on_gpu else []
            t2 = time.perf_counter()
            by_cpu = _gather([f.result() for f in decoding], workers, len(on_cpu))
            t3 = time.perf_counter()
            pictures = list(pictures) + _to_device(by_cpu, device)
            x = normalize(augment_batch(pictures, s.image_size, batch_generator(s.seed, k)))
            if s.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = torch.tensor([labels[i] for i in idx]).to(device)
            done = torch.cuda.Event() if cuda else None
            if done is not None:
                done.record(local.stream)
        t4 = time.perf_counter()
        with lock:
            stages["batches"] += 1
            stages["read_s"] += t1 - t0
            stages["decode_s"] += t2 - t1
            stages["cpu_decode_wait_s"] += t3 - t2
            stages["augment_s"] += t4 - t3
        return x, y, done

    made = OrderedProducer(make, threads=producers, depth=depth, name="fp16lab-gpu-decode")

    def forever() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y, done in made:
            if done is not None:  # the training stream waits for the producer stream's batch
                here = torch.cuda.current_stream()
                here.wait_event(done)
                x.record_stream(here)  # the allocator must not reuse it before training is done
                y.record_stream(here)
            yield x, y

    def close() -> None:
        try:
            made.close()
        finally:
            reader.shutdown(wait=True, cancel_futures=True)

    cpu_part = f", {s.cpu_decode_share:.0%} decoded on the CPU" if s.cpu_decode_share else ""
    return InputPipeline(s, device, f"{decoder}{cpu_part}, {producers} "
                         f"producer threads on side streams, {workers} reader threads",
                         forever(), close, lambda: dict(stages))

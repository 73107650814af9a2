"""What every input backend shares: the settings it is built from and the pipeline it returns.

:class:`InputSettings` says how to build one pipeline; :class:`InputPipeline` is what every
backend returns, an endless iterator of ``(images, labels)`` batches on the training device.
The constants the backends share are written here once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from fp16lab import validate

__all__ = ["BACKEND_NAMES", "CPU_SHARE_BACKENDS", "READER_THREAD_BACKENDS", "WORKER_SHARE",
           "InputPipeline", "InputSettings", "cpu_cores", "default_workers"]

#: The input backends' names, in the order :data:`fp16lab.inputs.REGISTRY` describes and builds
#: them (the registry imports this module, so the names that settings are checked against live here).
BACKEND_NAMES = ("synthetic", "dataloader", "gpu-decode", "hw-decode", "dali")

#: The backends built on gpu-decode's pipeline, whose reader threads can decode a share of each
#: batch on the CPU (``InputSettings.cpu_decode_share``).
CPU_SHARE_BACKENDS = ("gpu-decode", "hw-decode")

#: The backends whose ``num_workers`` are reader or decoder threads: they need at least one.
READER_THREAD_BACKENDS = ("gpu-decode", "hw-decode", "dali")

#: Share of the CPU cores the default worker count uses (the "75% of cores" rule).
WORKER_SHARE = 0.75


def cpu_cores() -> int:
    """Returns the number of CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


#: Where Linux describes its CPUs (cpuN/topology/core_id and physical_package_id).
CPU_TOPOLOGY = "/sys/devices/system/cpu"


def physical_cores(sysfs: str | os.PathLike | None = None) -> int | None:
    """Returns the physical cores among the CPUs this process may run on (two hyperthreads of
    one core count once), read from Linux's CPU topology; None where it cannot be read (another
    system, a container that hides it). ``sysfs``: the topology's folder, :data:`CPU_TOPOLOGY`
    by default (a test gives one of its own; a folder given must exist)."""
    if sysfs is None:
        if not os.path.isdir(CPU_TOPOLOGY):
            return None
        sysfs = CPU_TOPOLOGY
    else:
        sysfs = validate.existing_dir("sysfs", sysfs)
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return None
    cores = set()
    for cpu in cpus:
        topology = os.path.join(sysfs, f"cpu{cpu}", "topology")
        try:
            with open(os.path.join(topology, "physical_package_id")) as f:
                package = f.read().strip()
            with open(os.path.join(topology, "core_id")) as f:
                core = f.read().strip()
        except OSError:
            return None
        cores.add((package, core))
    return len(cores) or None


def default_workers(cores: int | None = None) -> int:
    """Returns the default worker count: 75% of the cores rounded down, at least 1."""
    cores = cpu_cores() if cores is None else validate.count("cores", cores)
    return max(1, int(WORKER_SHARE * cores))


@dataclass(frozen=True)
class InputSettings:
    """How to build one input pipeline. Every field is checked as the settings are made;
    :func:`fp16lab.inputs.make_input` checks what depends on the folder and the device.

    Attributes:
        backend: one of ``fp16lab.inputs.BACKENDS``.
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

    def __post_init__(self) -> None:
        def keep(name: str, value: Any) -> None:  # the checked value (an int for a count)
            object.__setattr__(self, name, value)

        validate.choice("backend", self.backend, BACKEND_NAMES)
        keep("batch", validate.count("batch", self.batch))
        keep("image_size", validate.count("image_size", self.image_size, low=8))
        if self.num_workers is not None:
            keep("num_workers", validate.count("num_workers", self.num_workers, low=0))
            if self.num_workers == 0 and self.backend in READER_THREAD_BACKENDS:
                raise ValueError(f"{self.backend} needs num_workers >= 1 (its reader threads), got 0")
        for name in ("pin_memory", "non_blocking", "channels_last"):
            keep(name, validate.boolean(name, getattr(self, name)))
        validate.choice("normalize_on", self.normalize_on, ("cpu", "gpu"))
        keep("seed", validate.count("seed", self.seed, low=0))
        share = validate.number("cpu_decode_share", self.cpu_decode_share, low=0, high=1,
                                high_open=True)
        if share and self.backend not in CPU_SHARE_BACKENDS:
            raise ValueError(f"cpu_decode_share applies to the {' and '.join(CPU_SHARE_BACKENDS)} "
                             f"backends only, not {self.backend!r}")

    def resolved_workers(self) -> int:
        """Returns the worker count this pipeline uses."""
        return default_workers() if self.num_workers is None else self.num_workers


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

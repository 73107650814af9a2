"""The built-in workloads, by name: fp16lab's five models and real ones built offline.

:data:`WORKLOADS` maps each name :func:`fp16lab.workload.load_workload` accepts to the factory
that builds it (``"module:function"``); the families live in :mod:`.builtin` (the models of
:mod:`fp16lab.models`), :mod:`.text` (BERT, GPT-2, a Llama-style decoder, from ``transformers``)
and :mod:`.vision` (ViT-B/16 from ``transformers``, ResNet-50 from torchvision). The real
models are built from their configurations with random weights: nothing is downloaded. Each
takes ``tiny=True``, a configuration of the same class small enough for a CPU test.
"""

from __future__ import annotations

import importlib.util

from ..device import import_torchao_quietly

#: Every built-in workload name, with the factory that builds it.
WORKLOADS = {
    "small_cnn": "fp16lab.workloads.builtin:small_cnn",
    "mlp": "fp16lab.workloads.builtin:mlp",
    "transformer_block": "fp16lab.workloads.builtin:transformer_block",
    "resnet18": "fp16lab.workloads.builtin:resnet18",
    "resnet50": "fp16lab.workloads.builtin:resnet50",
    "bert-base": "fp16lab.workloads.text:bert_base",
    "gpt2-small": "fp16lab.workloads.text:gpt2_small",
    "llama": "fp16lab.workloads.text:llama",
    "vit-b16": "fp16lab.workloads.vision:vit_b16",
    "torchvision-resnet50": "fp16lab.workloads.vision:torchvision_resnet50",
}

#: The package each built-in workload needs beyond fp16lab's own, and the pip extra bringing it.
NEEDS = {
    "resnet18": ("torchvision", "vision"),
    "resnet50": ("torchvision", "vision"),
    "bert-base": ("transformers", "models"),
    "gpt2-small": ("transformers", "models"),
    "llama": ("transformers", "models"),
    "vit-b16": ("transformers", "models"),
    "torchvision-resnet50": ("torchvision", "vision"),
}


class WorkloadNeedsPackage(ImportError):
    """A workload needs a package that is not installed; the message gives the pip command."""


def missing_package(name: str) -> str | None:
    """Returns why the built-in workload ``name`` cannot be built here (a package it needs is
    not installed, with the pip command), or None where it can."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; built-in: {', '.join(WORKLOADS)}")
    if name not in NEEDS:
        return None
    package, extra = NEEDS[name]
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        try:
            importlib.import_module(package)
        except Exception as e:  # installed but broken (a torchvision built for another torch)
            return f"workload {name!r} needs {package}, which does not import here ({e})"
        return None
    return f"workload {name!r} needs {package}: pip install 'fp16lab[{extra}]'"


def require(name: str) -> None:
    """Raises :class:`WorkloadNeedsPackage` where :func:`missing_package` says why (and imports
    torchao quietly first, which transformers would import noisily)."""
    reason = missing_package(name)
    if reason is not None:
        raise WorkloadNeedsPackage(reason)
    import_torchao_quietly()


__all__ = ["NEEDS", "WORKLOADS", "WorkloadNeedsPackage", "missing_package", "require"]

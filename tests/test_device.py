"""fp16lab.device and ``fp16lab info`` report this machine, checked against torch itself."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from fp16lab import device
from fp16lab.cli import main


def test_device_info_agrees_with_torch():
    info = device.device_info()
    assert info.has_gpu == torch.cuda.is_available()
    assert info.torch_version == torch.__version__
    assert info.cuda_runtime_version == torch.version.cuda
    if info.has_gpu:
        assert info.gpu_name == torch.cuda.get_device_name(0)
        assert info.compute_capability == torch.cuda.get_device_capability(0)
    else:
        assert info.gpu_name is None and info.compute_capability is None


def test_cupy_reason_is_one_line_when_unusable():
    info = device.device_info()
    if info.cupy_ok:
        assert info.cupy_reason == ""
    else:
        assert info.cupy_reason and "\n" not in info.cupy_reason


def test_banner_names_what_is_skipped_without_gpu(capsys):
    info = device.banner(skips="the kernel timings")
    out = capsys.readouterr().out
    assert (info.gpu_name or "GPU: none") in out
    if not info.has_gpu:
        assert "the kernel timings" in out and "data/" in out


def test_metadata_carries_provenance():
    meta = device.metadata()
    for key in ("measured_at", "torch", "gpu_name", "driver_version", "cupy_version", "numpy"):
        assert key in meta
    json.dumps(meta)  # must be writable as-is


def test_info_command_prints_json(capsys):
    assert main(["info", "--json"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert parsed["torch_version"] == torch.__version__


def test_console_script_installed():
    out = subprocess.run([sys.executable, "-m", "fp16lab.cli", "info"],
                         capture_output=True, text=True, check=True).stdout
    assert "torch" in out


def test_unknown_command_is_an_error():
    assert main(["no-such-command"]) == 2  # argparse's usage and one line


@pytest.mark.gpu
def test_gpu_banner_on_gpu():
    info = device.device_info()
    assert info.has_gpu and info.driver_version, "a GPU machine must report its driver"


@pytest.mark.parametrize("gpu, version, ok, words", [
    (None, "14.2.0", False, "CuPy: 14.2.0 installed, not used without a GPU"),
    (None, None, False, "CuPy: not installed (only needed with a GPU)"),
    ("NVIDIA H200", "14.2.0", False, "CuPy: unusable (CuPy found no CUDA device)"),
    ("NVIDIA H200", "14.2.0", True, "CuPy: 14.2.0 works"),
])
def test_summary_calls_cupy_broken_only_where_there_is_a_gpu(gpu, version, ok, words):
    """On a laptop without a GPU an idle CuPy is nothing wrong; with a GPU it is a fault."""
    from dataclasses import replace
    info = replace(device.device_info(), gpu_name=gpu, cupy_version=version, cupy_ok=ok,
                   compute_capability=(9, 0) if gpu else None,
                   gpu_memory_gib=139.8 if gpu else None,
                   cupy_reason="" if ok else "CuPy found no CUDA device")
    assert words in info.summary()


def test_torchaos_enum_notices_are_dropped_and_nothing_else():
    import logging

    device.import_torchao_quietly()
    device.import_torchao_quietly()  # twice: one filter, not two
    logger = logging.getLogger("torch.utils._pytree")
    assert logger.filters.count(device._not_torchaos_enum_notice) == 1

    def record(msg):
        return logging.LogRecord("torch.utils._pytree", logging.WARNING, __file__, 1, msg, (), None)

    notice = ("<enum 'KernelPreference'> is an Enum subclass and is now natively supported by "
              "torch.compile as an opaque value type. Calling register_constant() on Enum "
              "subclasses is deprecated and will be an error in a future release.")
    assert not logger.filter(record(notice))
    assert logger.filter(record("some other pytree warning"))

"""What this machine has: GPU, driver, CUDA, CuPy, and the versions that go into every result.

Every notebook opens with :func:`banner`, and every measured file in ``data/`` carries
:func:`metadata`, so a number can always be traced to the device and software that produced it.
"""

from __future__ import annotations

import functools
import platform
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from . import validate


@dataclass(frozen=True)
class DeviceInfo:
    """Facts about the local accelerator and software stack."""

    gpu_name: str | None
    compute_capability: tuple[int, int] | None
    gpu_memory_gib: float | None
    driver_version: str | None
    cuda_driver_version: str | None
    cuda_runtime_version: str | None
    torch_version: str
    cupy_version: str | None
    cupy_ok: bool
    cupy_reason: str
    python_version: str = field(default_factory=platform.python_version)
    platform: str = field(default_factory=platform.platform)

    @property
    def has_gpu(self) -> bool:
        """True when torch sees a CUDA device."""
        return self.gpu_name is not None

    def summary(self) -> str:
        """Returns the facts as a few human-readable lines."""
        if self.has_gpu:
            cc = ".".join(map(str, self.compute_capability or ()))
            gpu = (f"GPU: {self.gpu_name} (compute capability {cc}, "
                   f"{self.gpu_memory_gib:.0f} GiB)")
        else:
            gpu = "GPU: none (torch sees no CUDA device)"
        lines = [
            gpu,
            f"driver: {self.driver_version or 'n/a'}   CUDA driver API: "
            f"{self.cuda_driver_version or 'n/a'}   torch CUDA runtime: "
            f"{self.cuda_runtime_version or 'n/a (CPU build)'}",
            f"torch {self.torch_version}   CuPy: " + self._cupy_words(),
            f"python {self.python_version} on {self.platform}",
        ]
        return "\n".join(lines)

    def _cupy_words(self) -> str:
        if self.cupy_ok:
            return f"{self.cupy_version} works"
        if not self.has_gpu:  # nothing is wrong: CuPy's kernels need a GPU, and there is none
            return (f"{self.cupy_version} installed, not used without a GPU" if self.cupy_version
                    else "not installed (only needed with a GPU)")
        return f"unusable ({self.cupy_reason})"

    def as_dict(self) -> dict[str, Any]:
        """Returns a JSON-friendly dict of the facts."""
        d = asdict(self)
        d["compute_capability"] = (".".join(map(str, self.compute_capability))
                                   if self.compute_capability else None)
        d["has_gpu"] = self.has_gpu
        return d


def _nvml_versions() -> tuple[str | None, str | None]:
    """Returns (driver version, CUDA driver API version) from NVML, or Nones."""
    try:
        import pynvml
    except ImportError:
        return None, None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: NVMLError_LibraryNotFound and friends
        return None, None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        return driver, f"{cuda // 1000}.{(cuda % 1000) // 10}"
    except Exception:
        return None, None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _nvidia_smi_driver() -> str | None:
    """Returns the driver version that nvidia-smi reports, or None."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def _cupy_status() -> tuple[str | None, bool, str]:
    """Returns (CuPy version, whether it works, one-line reason when it does not)."""
    try:
        import cupy
    except ImportError:
        return None, False, ("CuPy is not installed; on a GPU machine `make setup` adds "
                             "cupy-cuda13x or cupy-cuda12x to match the driver")
    except Exception as e:  # a broken install raises all sorts
        return None, False, f"importing CuPy failed: {type(e).__name__}: {e}"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return cupy.__version__, False, f"CuPy found no CUDA device ({type(e).__name__}: {e})"
    if n < 1:
        return cupy.__version__, False, "CuPy found no CUDA device"
    return cupy.__version__, True, ""


@functools.lru_cache(maxsize=1)
def device_info() -> DeviceInfo:
    """Returns what this machine has (cached: the hardware does not change mid-session)."""
    import torch

    gpu_name = cc = mem = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu_name, cc = props.name, (props.major, props.minor)
        mem = props.total_memory / 2**30
    driver, cuda_driver = _nvml_versions()
    if driver is None:
        driver = _nvidia_smi_driver()
    cupy_version, cupy_ok, cupy_reason = _cupy_status()
    return DeviceInfo(
        gpu_name=gpu_name, compute_capability=cc, gpu_memory_gib=mem,
        driver_version=driver, cuda_driver_version=cuda_driver,
        cuda_runtime_version=torch.version.cuda, torch_version=torch.__version__,
        cupy_version=cupy_version, cupy_ok=cupy_ok, cupy_reason=cupy_reason)


def has_gpu() -> bool:
    """Returns True when a CUDA GPU is usable through torch."""
    return device_info().has_gpu


def _not_torchaos_enum_notice(record: Any) -> bool:
    return "register_constant() on Enum subclasses is deprecated" not in record.getMessage()


def import_torchao_quietly() -> bool:
    """Imports torchao where it is installed, its enum notices left out of torch's log; returns
    whether it is there.

    torchao registers enum classes with torch's pytree as it (and, later, its prototype modules)
    is imported, and torch 2.10 and later log a deprecation notice for each (``W... Enum
    subclass ... register_constant()``): lines on stderr that nothing in a learner's code causes
    or can fix. A filter on torch's pytree logger drops those notices alone, for the rest of the
    process; transformers imports torchao by itself where it is installed, so whatever builds a
    transformers model or a torchao optimizer calls this first."""
    import logging

    logger = logging.getLogger("torch.utils._pytree")
    if _not_torchaos_enum_notice not in logger.filters:
        logger.addFilter(_not_torchaos_enum_notice)
    try:
        import torchao  # noqa: F401 - optional (the state16 extra); imported for its side effect
    except Exception:  # noqa: BLE001 - absent, or broken against this torch: transformers copes
        return False
    return True


def banner(skips: str | None = None, recorded: bool = True) -> DeviceInfo:
    """Prints the device banner a notebook opens with, and returns the facts.

    Args:
        skips: what the notebook leaves out without a GPU, said once at the top.
        recorded: whether data/ holds a GPU's results for what it skips (False: the banner
            says none is recorded yet, rather than promising them).
    """
    recorded = validate.boolean("recorded", recorded)
    info = device_info()
    bar = "=" * 78
    print(bar)
    print(info.summary())
    if not info.has_gpu and skips:
        print("-" * 78)
        print("No GPU here, so this notebook skips: " + skips)
        print("Those sections show results measured on a real GPU, loaded from data/ "
              "(each file names its device, driver and versions)." if recorded else
              "No GPU run of those sections is recorded in data/ yet.")
    print(bar)
    return info


def metadata() -> dict[str, Any]:
    """Returns the provenance every measured file carries: when, where, which device and versions."""
    import numpy
    import torch

    meta = {
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "numpy": numpy.__version__,
        "torch": torch.__version__,
    }
    meta.update({k: v for k, v in device_info().as_dict().items()
                 if k not in ("python_version", "torch_version")})
    if torch.backends.cudnn.is_available():
        meta["cudnn"] = torch.backends.cudnn.version()
    return meta

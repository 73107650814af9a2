"""Building a ``.cu`` file into a cubin with nvcc, cached on disk: steps 6 and 7 of the ladder.

Steps 6 and 7 use ``wgmma`` and ``setmaxnreg``, which exist only in the ``sm_90a`` target
(Hopper's architecture-specific instructions). NVRTC can target it too; nvcc is used because
its assembler warns when it serialises the ``wgmma`` instructions (C7514, which the compile test
refuses). This module compiles such a file with
``nvcc -gencode=arch=compute_90a,code=sm_90a -cubin``, keeps the result in the user's cache
directory under a name made from a hash of the source text, the flags and the nvcc version (so
an edited kernel, other tile sizes or another compiler give another file), and loads it with
``cupy.RawModule(path=...)``. A second process, or a second session, reuses the file.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from .. import validate
from .compiler import KernelUnavailable, require_cupy, source_path

#: The architecture-specific Hopper target that wgmma and setmaxnreg need.
HOPPER_ARCH = "sm_90a"

#: What an nvcc target looks like: sm_ and the compute capability, with 'a' (architecture-
#: specific) or 'f' (family) after it where the kernel needs such instructions.
ARCH_PATTERN = r"sm_[1-9][0-9]+[af]?"


def cache_dir() -> Path:
    """Returns the directory for compiled cubins: $FP16LAB_CACHE_DIR, else the user's cache
    directory ($XDG_CACHE_HOME or ~/.cache) + ``fp16lab/cubin``."""
    if os.environ.get("FP16LAB_CACHE_DIR"):
        return Path(os.environ["FP16LAB_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fp16lab" / "cubin"


def find_nvcc() -> Path | None:
    """Returns the nvcc to use ($CUDA_PATH/bin, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin), or None."""
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            p = Path(os.environ[var]) / "bin" / "nvcc"
            if p.is_file():
                return p
    found = shutil.which("nvcc")
    if found:
        return Path(found)
    p = Path("/usr/local/cuda/bin/nvcc")
    return p if p.is_file() else None


def require_nvcc() -> Path:
    """Returns nvcc's path.

    Raises:
        KernelUnavailable: no nvcc; says where it was looked for and how to get one.
    """
    nvcc = find_nvcc()
    if nvcc is None:
        raise KernelUnavailable(
            f"the wgmma kernels are built for {HOPPER_ARCH} with nvcc, and no nvcc was found "
            "(looked in $CUDA_PATH/bin, $CUDA_HOME/bin, PATH and /usr/local/cuda/bin). Install "
            "the CUDA toolkit (12.0 or newer; e.g. `apt install cuda-toolkit-13-0` or "
            "`pip install nvidia-cuda-nvcc`) and put its bin/ on PATH or set CUDA_PATH.")
    return nvcc


def nvcc_flags(arch: str = HOPPER_ARCH, defines: dict[str, int] | None = None) -> list[str]:
    """Returns the nvcc flags for one cubin: the target, C++17, ptxas's report and the defines."""
    validate.text("arch", arch, pattern=ARCH_PATTERN, like="'sm_90a' or 'sm_100'")
    number = arch.removeprefix("sm_")
    return ([f"-gencode=arch=compute_{number},code={arch}", "-cubin", "-std=c++17", "-Xptxas", "-v"]
            + [f"-D{k}={v}" for k, v in sorted((defines or {}).items())])


@functools.lru_cache(maxsize=None)
def _nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout


def local_includes(source: Path) -> list[Path]:
    """Returns the headers ``source`` includes by quoted name (``#include "hopper.cuh"``) from its
    own folder, in the order included."""
    names = re.findall(r'^\s*#\s*include\s+"([^"]+)"', source.read_text(), flags=re.M)
    return [source.parent / n for n in names]


def cubin_path(filename: str, defines: dict[str, int] | None = None, arch: str = HOPPER_ARCH,
               nvcc: Path | None = None) -> Path:
    """Returns where the cubin of ``filename`` built with these defines lives in the cache.

    The name holds a hash of the source text, the flags and nvcc's version string.
    """
    nvcc = require_nvcc() if nvcc is None else validate.existing_file("nvcc", nvcc, executable=True)
    h = hashlib.sha256()
    source = source_path(filename)
    h.update(source.read_bytes())
    for header in local_includes(source):  # an edited header gives another cubin too
        h.update(header.read_bytes())
    h.update("\0".join(nvcc_flags(arch, defines)).encode())
    h.update(_nvcc_version(str(nvcc)).encode())
    return cache_dir() / f"{Path(filename).stem}-{arch}-{h.hexdigest()[:20]}.cubin"


def build(filename: str, defines: dict[str, int] | None = None, arch: str = HOPPER_ARCH) -> Path:
    """Returns the path of the cubin of one of the package's ``.cu`` files, compiling it first if
    the cache does not hold it yet.

    The compiler writes to a temporary file in the cache directory that is then renamed, so a
    process never loads a half-written cubin.

    Raises:
        KernelUnavailable: no nvcc here.
        RuntimeError: nvcc failed; the message holds its command and error output.
    """
    nvcc = require_nvcc()
    out = cubin_path(filename, defines, arch, nvcc)
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".cubin", dir=out.parent)
    os.close(fd)
    cmd = [str(nvcc), *nvcc_flags(arch, defines), "-o", tmp, str(source_path(filename))]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise RuntimeError(f"nvcc failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


@functools.lru_cache(maxsize=None)
def _module(filename: str, device_id: int, defines: tuple[tuple[str, int], ...], arch: str) -> Any:
    cupy = require_cupy()
    path = build(filename, dict(defines), arch)
    with cupy.cuda.Device(device_id):
        return cupy.RawModule(path=str(path))


def load_cubin(filename: str, defines: dict[str, int] | None = None, arch: str = HOPPER_ARCH) -> Any:
    """Returns the ``cupy.RawModule`` of a ``.cu`` file built with nvcc, cached per device."""
    cupy = require_cupy()
    return _module(filename, cupy.cuda.Device().id, tuple(sorted((defines or {}).items())), arch)

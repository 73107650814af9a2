"""Compiling the package's ``.cu`` files with CuPy: finding CuPy and a complete CUDA include directory.

Every kernel of fp16lab (the GEMM ladder, the census, the gradient monitor) is a ``.cu`` file
beside this module, compiled here and launched with :mod:`fp16lab.kernels.launch`.

CuPy compiles with NVRTC and adds its own idea of the CUDA include path. On a machine where that
path is pip's ``nvidia/cu13/include``, ``mma.h`` includes ``crt/mma.h``, which the wheel does not
ship, and NVRTC stops with ``cannot open source file "crt/mma.h"``. So this module looks for an
include directory that really holds every header the kernels need (``CUDA_PATH``, ``CUDA_HOME``,
``/usr/local/cuda``, the directory above ``nvcc``, the pip ``nvidia`` wheels), passes it with
``-I``, and, when there is none, says which file is missing and how to get it.

Compiled modules are cached per (device, source file): CuPy's own on-disk cache keys on the
source text and the options, not on the headers, so the include directory is part of the options.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from .. import validate
from .launch import cupy_or_none

#: Directory that holds the ``.cu`` sources.
SOURCE_DIR = Path(__file__).resolve().parent

#: Headers that a complete include directory must contain (relative paths).
REQUIRED_HEADERS = ("cuda_fp16.h", "mma.h", "crt/mma.h")


class KernelUnavailable(RuntimeError):
    """Raised when the kernels cannot run here: no CuPy, no GPU or no usable CUDA headers."""


def candidate_include_dirs() -> list[Path]:
    """Returns the directories searched for CUDA headers, in order of preference."""
    dirs: list[Path] = []
    for var in ("CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"):
        if os.environ.get(var):
            dirs.append(Path(os.environ[var]) / "include")
    dirs.append(Path("/usr/local/cuda/include"))
    nvcc = shutil.which("nvcc")
    if nvcc:
        dirs.append(Path(nvcc).resolve().parent.parent / "include")
    for site in map(Path, sys.path):
        nv = site / "nvidia"
        if nv.is_dir():
            dirs += sorted(p for p in nv.glob("*/include") if p.is_dir())
    seen, out = set(), []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def find_cuda_include(candidates: list[Path] | None = None) -> Path:
    """Returns the first include directory that holds every header in ``REQUIRED_HEADERS``.

    Raises:
        KernelUnavailable: no candidate is complete; the message names, for each candidate
            that exists, the header it lacks, and says how to get a complete one.
    """
    candidates = candidate_include_dirs() if candidates is None else list(candidates)
    problems = []
    for d in candidates:
        if not d.is_dir():
            continue
        missing = [h for h in REQUIRED_HEADERS if not (d / h).is_file()]
        if not missing:
            return d
        problems.append(f"  {d}: missing {', '.join(missing)}")
    looked = "\n".join(problems) or "  (none of them exists)"
    raise KernelUnavailable(
        "no complete CUDA include directory found: the kernels need "
        f"{', '.join(REQUIRED_HEADERS)}. Looked in:\n{looked}\n"
        "Install the CUDA toolkit headers (for example `apt install cuda-toolkit-13-0`, or "
        "`conda install -c nvidia cuda-nvcc cuda-cudart-dev`) and point CUDA_PATH at the "
        "toolkit root (the folder whose include/ holds crt/mma.h).")


def require_cupy() -> Any:
    """Returns the ``cupy`` module once it is importable and sees a CUDA device.

    Raises:
        KernelUnavailable: saying whether CuPy or the GPU is what is missing.
    """
    cupy = cupy_or_none()
    if cupy is None:
        raise KernelUnavailable(
            "the CUDA kernels run through CuPy, which is not installed here; on a GPU machine "
            "install cupy-cuda13x (or cupy-cuda12x) to match the driver, e.g. "
            "`pip install cupy-cuda13x`")
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError without a driver, and friends
        raise KernelUnavailable(f"CuPy {cupy.__version__} is installed but finds no CUDA GPU "
                                f"({type(e).__name__}: {e})") from e
    if n < 1:
        raise KernelUnavailable(f"CuPy {cupy.__version__} is installed but finds no CUDA GPU")
    return cupy


def available() -> tuple[bool, str]:
    """Returns (True, "") when the kernels can be compiled and run here, else (False, why not)."""
    try:
        require_cupy()
        find_cuda_include()
    except KernelUnavailable as e:
        return False, str(e)
    return True, ""


def source_path(filename: str) -> Path:
    """Returns the path of one of the package's ``.cu`` files."""
    p = SOURCE_DIR / validate.text("filename", filename)
    if not p.is_file():
        known = ", ".join(sorted(x.name for x in SOURCE_DIR.glob("*.cu")))
        raise FileNotFoundError(f"no kernel source {filename!r} (filename); the package has: {known}")
    return p


def compile_options(include_dir: Path | None) -> tuple[str, ...]:
    """Returns the NVRTC options used for every module (CuPy adds ``-arch`` itself).

    ``include_dir``, where given, must be an existing folder (:func:`find_cuda_include`'s).
    """
    if include_dir is None:
        return ("-std=c++17",)
    return ("-std=c++17", f"-I{validate.existing_dir('include_dir', include_dir)}")


@functools.lru_cache(maxsize=None)
def _load(filename: str, device_id: int, defines: tuple[tuple[str, int], ...] = (),
          cuda_headers: bool = True) -> Any:
    cupy = require_cupy()
    # only the tensor-core kernels need mma.h; the others compile with NVRTC's own headers
    include_dir = find_cuda_include() if cuda_headers else None
    code = source_path(filename).read_text()
    options = compile_options(include_dir) + tuple(f"-D{k}={v}" for k, v in defines)
    with cupy.cuda.Device(device_id):
        module = cupy.RawModule(code=code, options=options)
        module.compile()
    return module


def load_module(filename: str, defines: dict[str, int] | None = None, *,
                cuda_headers: bool = True) -> Any:
    """Returns the compiled ``cupy.RawModule`` of a ``.cu`` file, cached per current device.

    ``defines`` sets preprocessor macros (``-DNAME=value``); each set is its own module.
    ``cuda_headers``: the source includes ``mma.h`` and needs a complete include directory.
    """
    cupy = require_cupy()
    return _load(filename, cupy.cuda.Device().id, tuple(sorted((defines or {}).items())),
                 cuda_headers)


@functools.lru_cache(maxsize=None)
def _function(filename: str, name: str, device_id: int, dynamic_smem: int,
              defines: tuple[tuple[str, int], ...] = (), cuda_headers: bool = True) -> Any:
    fn = _load(filename, device_id, defines, cuda_headers).get_function(name)
    if dynamic_smem > 48 * 1024:
        # above 48 KB a block gets dynamic shared memory only after the limit is raised
        fn.max_dynamic_shared_size_bytes = dynamic_smem
    return fn


def get_function(filename: str, name: str, dynamic_smem: int = 0,
                 defines: dict[str, int] | None = None, *, cuda_headers: bool = True) -> Any:
    """Returns a kernel of a compiled module, its dynamic shared-memory limit raised if needed.

    ``defines`` and ``cuda_headers`` as in :func:`load_module`.
    """
    cupy = require_cupy()
    return _function(filename, name, cupy.cuda.Device().id, int(dynamic_smem),
                     tuple(sorted((defines or {}).items())), cuda_headers)

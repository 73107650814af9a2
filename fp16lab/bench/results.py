"""Measured result files: where they live, and writing and reading them with their provenance.

A result file is JSON, ``{"meta": ..., "rows": [...]}``, where ``meta`` is
:func:`fp16lab.device.metadata` (device, driver, versions, date) plus what the benchmark adds.

Where the files are (one rule, used by every loader and every benchmark):

* the **committed** results (measured on an H200 and shipped with fp16lab) are in
  ``$FP16LAB_DATA`` when that is set; else in the checkout's top-level ``data/`` when fp16lab
  is imported from a git checkout; else in the ``measured/`` folder shipped inside the
  installed package;
* **your** results go to the ``local/`` folder inside that data folder (git-ignored), or to
  ``$XDG_CACHE_HOME/fp16lab`` (``~/.cache/fp16lab``) for an installed package's shipped copy
  or a data folder that cannot be written. A
  benchmark writes there unless it is told ``--replace``, which writes the committed file.
* A loader reads your file when there is one, else the committed one, and its provenance line
  (:func:`describe_source`) says which.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: Name of the setting that overrides where the committed results are.
DATA_ENV = "FP16LAB_DATA"

_PACKAGE = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """Returns the folder of the committed measured results (see the module docstring's rule)."""
    return _committed()[0]


def _committed() -> tuple[Path, bool]:
    """Returns (the committed results' folder, whether it is the copy inside the installed package)."""
    env = os.environ.get(DATA_ENV)
    if env is not None:
        if not env.strip():
            raise ValueError(f"{DATA_ENV} is set but empty; set it to the folder holding the "
                             f"measured result files, or unset it to use fp16lab's own data/")
        return Path(env).expanduser(), False
    checkout = _PACKAGE.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "data").is_dir():
        return checkout / "data", False
    return _PACKAGE / "measured", True


def local_dir() -> Path:
    """Returns the folder where results measured here are written and preferred when read."""
    base, shipped = _committed()
    if not shipped and (os.access(base, os.W_OK) or not base.exists()):
        return base / "local"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fp16lab"


def find_result(name: str, suffix: str = ".json") -> Path:
    """Returns the path of result ``name``: this machine's file if there is one, else the committed one.

    The path may not exist; callers that need it say so with the folders they looked in.
    """
    local = local_dir() / f"{name}{suffix}"
    return local if local.exists() else data_dir() / f"{name}{suffix}"


def _check_name(name: str) -> None:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"result name must be a plain file stem like 'census_bench', got {name!r}")


def write_result(name: str, rows: list[dict[str, Any]], *, meta: dict[str, Any] | None = None,
                 data_dir: Path | None = None, replace: bool = False) -> Path:
    """Writes measured rows with their provenance to ``<folder>/<name>.json`` and returns the path.

    The folder is ``data_dir`` when given, else the committed data folder when ``replace``,
    else this machine's :func:`local_dir`.
    """
    from ..device import metadata

    _check_name(name)
    folder = Path(data_dir) if data_dir is not None else (_data_dir() if replace else local_dir())
    path = folder / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": {**metadata(), **(meta or {})}, "rows": rows}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=_jsonable) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a file
    return path


_data_dir = data_dir  # write_result's parameter of the same name hides the function


def read_result(name_or_path: str | Path, *, data_dir: Path | None = None) -> dict[str, Any]:
    """Returns ``{"meta": ..., "rows": [...]}`` from a file written by :func:`write_result`.

    A name is looked up in ``data_dir`` when given, else with :func:`find_result` (this
    machine's file first). ``meta["read_from"]`` is set to the file that was read.
    """
    p = Path(name_or_path)
    if p.suffix != ".json":
        p = Path(data_dir) / f"{name_or_path}.json" if data_dir is not None \
            else find_result(str(name_or_path))
    if not p.exists():
        known = sorted(x.stem for x in p.parent.glob("*.json")) if p.parent.is_dir() else []
        raise FileNotFoundError(f"no measured result {p}; {p.parent} has: "
                                f"{', '.join(known) or 'nothing'}")
    payload = json.loads(p.read_text())
    if not isinstance(payload, dict) or "meta" not in payload or "rows" not in payload:
        raise ValueError(f"{p} is not a fp16lab result file (needs 'meta' and 'rows' keys)")
    payload["meta"]["read_from"] = str(p)
    return payload


def merge_with_previous(name: str, rows: list[dict[str, Any]], *, key: str = "device",
                        data_dir: Path | None = None) -> list[dict[str, Any]]:
    """Returns ``rows`` plus the rows of an earlier result ``name`` whose ``key`` this run did not measure.

    A benchmark run on one machine (say ``--gpu-only`` on the GPU host) then keeps the rows
    measured elsewhere (the CPU rows). Each row says where it was measured in ``measured_on``,
    since the file's ``meta`` describes only the latest run.
    """
    from ..device import metadata

    here = describe_source(metadata())
    rows = [{**r, "measured_on": r.get("measured_on", here)} for r in rows]
    try:
        old = read_result(name, data_dir=data_dir)
    except FileNotFoundError:
        return rows
    measured = {r.get(key) for r in rows}
    there = describe_source(old["meta"])
    kept = [{**r, "measured_on": r.get("measured_on", there)}
            for r in old["rows"] if r.get(key) not in measured]
    return kept + rows


def describe_source(meta: dict[str, Any], *, with_file: bool = True) -> str:
    """Returns one line saying which device, driver and versions produced a result (and its file)."""
    gpu = meta.get("gpu_name") or "CPU"
    line = (f"measured on {gpu} (driver {meta.get('driver_version') or 'n/a'}, "
            f"torch {meta.get('torch')}, CuPy {meta.get('cupy_version') or 'n/a'}) "
            f"at {meta.get('measured_at', '?')}")
    src = meta.get("read_from")
    if with_file and src:
        mine = Path(src).resolve().parent == local_dir().resolve()
        where = "measured on this machine" if mine else "committed"
        line += f"; file {Path(src).name} ({where})"
    return line


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (tuple, set)):
        return list(x)
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"cannot write {type(x).__name__} to a result file")

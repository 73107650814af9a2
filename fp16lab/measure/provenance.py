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
from typing import Any, Sequence

from .. import validate
from .. import device  # the module, not its names: tests replace its functions

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
    name = validate.text("name", name, pattern=r"[A-Za-z0-9_.+-]+", like="'sweep_h200'")
    suffix = validate.text("suffix", suffix, pattern=r"\.[A-Za-z0-9_.]+", like="'.json'")
    local = local_dir() / f"{name}{suffix}"
    return local if local.exists() else data_dir() / f"{name}{suffix}"


def is_read_only(path: Path) -> bool:
    """Returns True when ``path`` cannot be written, or carries no write permission bit at all.

    The mode bits are checked as well as ``os.access`` because the superuser (a container, a
    cloud GPU box) may write anything: a file marked read-only was still marked so by someone.
    """
    path = validate.existing_path("path", path)
    return not os.access(path, os.W_OK) or not (path.stat().st_mode & 0o222)


def check_can_write(path: Path) -> None:
    """Raises ValueError, naming ``path``, unless a file can be written there now.

    ``path`` may not exist yet; its nearest existing folder must be a writable folder, and an
    existing ``path`` a writable regular file (a read-only file is not replaced).
    """
    path = Path(path)
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"{path}: {folder} is a file, so no folder can be made there")
    if is_read_only(folder):
        raise ValueError(f"{path}: the folder {folder} is read-only; write somewhere else")
    if path.exists() and (not path.is_file() or is_read_only(path)):
        raise ValueError(f"{path} is read-only or not a regular file, so it is not replaced; "
                         f"write somewhere else or make it writable")


def _check_name(name: str) -> None:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"result name must be a plain file stem like 'census_bench', got {name!r}")


def write_result(name: str, rows: list[dict[str, Any]], *, meta: dict[str, Any] | None = None,
                 data_dir: Path | None = None, replace: bool = False) -> Path:
    """Writes measured rows with their provenance to ``<folder>/<name>.json`` and returns the path.

    The folder is ``data_dir`` when given, else the committed data folder when ``replace``,
    else this machine's :func:`local_dir`. A ``read_from`` in ``meta`` (set by
    :func:`read_result`) is not written.
    """
    _check_name(name)
    folder = Path(data_dir) if data_dir is not None else (_data_dir() if replace else local_dir())
    path = folder / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    # read_result's note of where a file was read is this machine's, not the measurement's
    meta = {k: v for k, v in (meta or {}).items() if k != "read_from"}
    payload = {"meta": {**device.metadata(), **meta}, "rows": rows}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=_jsonable) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a file
    return path


_data_dir = data_dir  # write_result's parameter of the same name hides the function


#: The provenance every measured file's ``meta`` holds (``gpu_name`` is None on a CPU).
PROVENANCE_FIELDS = ("measured_at", "gpu_name", "torch")


def read_result(name_or_path: str | Path, *, data_dir: Path | None = None,
                rows_need: Sequence[str] = (), meta_needs: Sequence[str] = (),
                allow_empty: bool = False) -> dict[str, Any]:
    """Returns ``{"meta": ..., "rows": [...]}`` from a file written by :func:`write_result`.

    A name is looked up in ``data_dir`` when given, else with :func:`find_result` (this
    machine's file first). ``meta["read_from"]`` is set to the file that was read.

    The file is checked before it is returned: valid JSON, a ``meta`` object holding the
    provenance (:data:`PROVENANCE_FIELDS`) and the loader's ``meta_needs`` (a dotted name such
    as ``"summary.model"`` looks inside), and a list of row objects each holding ``rows_need``;
    a file with no rows (a run that measured nothing) is refused unless ``allow_empty``.

    Raises:
        FileNotFoundError: no such file (the message lists what the folder has).
        ValueError: naming the file and the field that is missing or wrong.
    """
    p = Path(name_or_path)
    if p.suffix != ".json":
        p = Path(data_dir) / f"{name_or_path}.json" if data_dir is not None \
            else find_result(str(name_or_path))
    if not p.exists():
        known = sorted(x.stem for x in p.parent.glob("*.json")) if p.parent.is_dir() else []
        raise FileNotFoundError(f"no measured result {p}; {p.parent} has: "
                                f"{', '.join(known) or 'nothing'}")
    try:
        payload = json.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not a text file (byte {e.start} is not UTF-8)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); "
                         f"a truncated copy? Measure it again or restore it") from None
    if not isinstance(payload, dict) or "meta" not in payload or "rows" not in payload:
        raise ValueError(f"{p} is not a fp16lab result file (needs 'meta' and 'rows' keys)")
    meta, rows = payload["meta"], payload["rows"]
    if not isinstance(meta, dict):
        raise ValueError(f"{p}: 'meta' must be an object, got {type(meta).__name__}")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{p}: 'rows' must be a list of objects")
    for field in (*PROVENANCE_FIELDS, *meta_needs):  # where and when first: it names the run
        _lookup(meta, field, p)
    if not rows and not allow_empty:
        raise ValueError(f"{p}: holds no measured rows (a run that measured nothing, or cut "
                         f"short?); measure it again or restore the file")
    for i, row in enumerate(rows):
        missing = [f for f in rows_need if f not in row]
        if missing:
            raise ValueError(f"{p}: row {i} lacks the field {missing[0]!r} (each row needs "
                             f"{', '.join(map(repr, rows_need))})")
    meta["read_from"] = str(p)
    return payload


def _lookup(meta: dict[str, Any], dotted: str, path: Path) -> Any:
    """Returns ``meta``'s field ``dotted`` ('summary.model' looks inside), or raises naming it."""
    value: Any = meta
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            what = ("the provenance every measured file records (where and when it was measured)"
                    if dotted in PROVENANCE_FIELDS else "what this loader reads")
            raise ValueError(f"{path}: meta lacks the field {dotted!r}, {what}")
        value = value[part]
    return value


def merge_with_previous(name: str, rows: list[dict[str, Any]], *, key: str = "device",
                        data_dir: Path | None = None) -> list[dict[str, Any]]:
    """Returns ``rows`` plus the rows of an earlier result ``name`` whose ``key`` this run did not measure.

    A benchmark run on one machine (say ``--gpu-only`` on the GPU host) then keeps the rows
    measured elsewhere (the CPU rows). Each row says where it was measured in ``measured_on``,
    since the file's ``meta`` describes only the latest run.
    """
    here = describe_source(device.metadata())
    rows = [{**r, "measured_on": r.get("measured_on", here)} for r in rows]
    try:
        old = read_result(name, data_dir=data_dir, allow_empty=True)
    except FileNotFoundError:
        return rows
    measured = {r.get(key) for r in rows}
    there = describe_source(old["meta"])
    kept = [{**r, "measured_on": r.get("measured_on", there)}
            for r in old["rows"] if r.get(key) not in measured]
    return kept + rows


def describe_source(meta: dict[str, Any], *, with_file: bool = True,
                    rows: list[dict[str, Any]] | None = None) -> str:
    """Returns one line saying which device, driver and versions produced a result (and its file).

    With ``rows`` (some of the file's rows), the time is theirs: a merged file's rows may carry
    their own ``measured_at``, older than the file's; a row without one is of the file's time.
    """
    # a missing gpu_name is an unknown device, not a CPU (whose gpu_name is recorded as None)
    gpu = (meta["gpu_name"] or "CPU") if "gpu_name" in meta else "an unrecorded device"
    when = meta.get("measured_at") or "an unrecorded time"
    if rows:
        when = " and ".join(sorted({r.get("measured_at") or when for r in rows}))
    line = (f"measured on {gpu} (driver {meta.get('driver_version') or 'n/a'}, "
            f"torch {meta.get('torch') or 'unrecorded'}, "
            f"CuPy {meta.get('cupy_version') or 'n/a'}) at {when}")
    src = meta.get("read_from")
    if with_file and src:
        mine = Path(src).resolve().parent == local_dir().resolve()
        where = "measured on this machine" if mine else "shipped with fp16lab"
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

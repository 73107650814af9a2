"""The sweep's results file: its columns, checking it, and appending and reading rows safely (parquet + CSV).

Several sweeps may write one file at once (two notebooks and the command line on one GPU box),
while a notebook or ``fp16lab report`` reads it. The file stays a parquet file with a CSV copy,
what pandas, the notebooks and the committed reference results already read, and is kept whole
in two ways:

* **writers** hold an exclusive lock (``fcntl.flock``) on the folder that holds the file for the
  whole read-add-replace of :func:`append_rows`, so no writer replaces rows another has just
  added; the new file is written beside the old one and renamed over it (``os.replace``), so
  an interrupt or a kill never leaves half a file;
* **sweeps of one grid** share the file: each claims a measurement (one repeat of one point)
  before measuring it (:func:`claim`, a claim file beside the results holding the pid), so the
  second skips what the first has claimed or finished, and nothing is measured twice;
* **readers** take no lock: :func:`read_results` reads the file's bytes through one open file,
  which keeps pointing at one complete version even when a writer renames a newer one over it
  (pyarrow, given the path, may open the file twice and see two versions).

A lock file beside the results would be one more file to leave behind, and SQLite would make the
store a database that the notebooks could no longer read with ``pd.read_parquet``; a folder
lock costs neither. Where ``fcntl`` does not exist (Windows), writers are not serialized: run one
sweep per file there.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

import pandas as pd
import pyarrow.parquet as pq

from ..measure.provenance import check_can_write
from .axes import AXIS_DEFAULTS
from .point import SCALER_FIELDS

#: What a results row's ``status`` can be.
STATUSES = ("ok", "oom", "error")

#: Provenance columns copied from fp16lab.device.metadata() into every row.
META_COLUMNS = ("gpu_name", "compute_capability", "driver_version", "cuda_driver_version",
                "cuda_runtime_version", "torch", "cudnn", "host", "python")

#: Every row's columns, in order.
ROW_COLUMNS = (
    "key", "model", "batch", "layout", "precision", *SCALER_FIELDS, "cudnn_benchmark", "device",
    *AXIS_DEFAULTS,
    "images_dir", "repeat", "status",
    "error", "warmup", "steps", "tolerance", "step_ms_median", "step_ms_p10", "step_ms_p90",
    "spread", "samples_per_s", "peak_mem_allocated_mb", "peak_mem_reserved_mb", "memory_note",
    "final_scale", "skipped_steps", "final_loss", "telemetry_samples", "gpu_busy_mean",
    "gpu_busy_max", "mem_busy_mean", "mem_busy_max", "sm_clock_mhz_mean", "sm_clock_mhz_max",
    "power_w_mean", "power_w_max", "telemetry_note", "sm_util_mean", "sm_util_max",
    "sm_occupancy_mean", "sm_occupancy_max", "tensor_util_mean", "tensor_util_max",
    "hmma_util_mean", "hmma_util_max", "dram_bw_util_mean", "dram_bw_util_max", "gpm_note",
    "input_implementation", "input_warmup", "execution_notes", "fp8_layers", "fp8_scaled_mm", "fp8_emulated",
    "fp8_fallbacks", "per_rank", "elapsed_s", "finished_at", *META_COLUMNS,
)

#: The columns a file must have to be read as sweep results (files written before a column was
#: added to ROW_COLUMNS are read with that column empty), and those every row fills in.
REQUIRED_COLUMNS = ("key", "model", "batch", "layout", "precision", "device", "repeat", "status",
                    "error", "warmup", "steps", "tolerance", "step_ms_median", "spread",
                    "elapsed_s", "finished_at")
_FILLED = ("key", "model", "batch", "precision", "device", "repeat", "status", "warmup", "steps",
           "elapsed_s", "finished_at")
_NUMERIC = ("batch", "repeat", "warmup", "steps", "tolerance", "step_ms_median", "spread",
            "elapsed_s")

_FORMATS = (".parquet", ".csv")


def _csv_path(path: Path) -> Path:
    return path.with_suffix(".csv")


def _bad(path: Path, what: str) -> ValueError:
    return ValueError(f"{path}: {what}")


def _parse(path: Path, data: bytes) -> pd.DataFrame:
    if not data:
        raise _bad(path, "the file is empty")
    if path.suffix == ".csv":
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _bad(path, f"not a text CSV file (byte {e.start} is not UTF-8)") from None
        if not text.endswith("\n"):
            raise _bad(path, "the file ends mid-line: its last row is cut (an interrupted copy?)")
        try:
            return pd.read_csv(io.StringIO(text))
        except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
            raise _bad(path, f"not a readable CSV file ({e})") from None
    try:
        # read in this thread, without pyarrow's dataset reader: that one pre-buffers column
        # chunks on its I/O threads, and a damaged page leaves such a read running while the
        # process exits, which aborts it ("terminate called without an active exception")
        with pq.ParquetFile(io.BytesIO(data), pre_buffer=False) as f:
            return f.read(use_threads=False).to_pandas()
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError and others on a damaged file
        raise _bad(path, f"not a readable parquet file ({type(e).__name__}: {e})") from None


def _validate(path: Path, df: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise _bad(path, f"not a fp16lab sweep results file: it lacks the column(s) "
                         f"{', '.join(missing)} (it has {', '.join(map(str, df.columns[:8]))}"
                         f"{', ...' if len(df.columns) > 8 else ''})")
    for c in _FILLED:
        empty = df.index[df[c].isna()]
        if len(empty):
            raise _bad(path, f"row {int(empty[0]) + 1} has no {c!r} (a row cut short?)")
    for c in _NUMERIC:
        vals = pd.to_numeric(df[c], errors="coerce")
        wrong = df.index[vals.isna() & df[c].notna()]
        if len(wrong):
            raise _bad(path, f"row {int(wrong[0]) + 1}: {c!r} is {df[c].iloc[wrong[0]]!r}, "
                             f"not a number")
    bad = df.index[~df["status"].isin(STATUSES)]
    if len(bad):
        raise _bad(path, f"row {int(bad[0]) + 1}: status {df['status'].iloc[bad[0]]!r} is not "
                         f"one of {', '.join(STATUSES)}")
    extra = [c for c in df.columns if c not in ROW_COLUMNS]
    older = [c for c in AXIS_DEFAULTS if c not in df.columns]
    df = df.reindex(columns=[*ROW_COLUMNS, *extra])
    for c in older:  # a file from before the axis: every row had the default
        df[c] = AXIS_DEFAULTS[c]
    return df


def read_results(path: str | Path) -> pd.DataFrame:
    """Returns the rows of a results file (parquet, or its CSV export); empty if it is absent.

    A column the file lacks (it is older than the column) is added: an axis with its default
    from ``AXIS_DEFAULTS`` (eager, synthetic, 1 GPU, ...), any other column empty.

    Raises:
        ValueError: naming the file and what is wrong: a folder, another extension, a damaged
            or truncated file, a row cut short, or another tool's table (missing columns).
    """
    p = Path(path)
    if p.suffix not in _FORMATS:
        raise _bad(p, f"a results file ends in {' or '.join(_FORMATS)}, not {p.suffix or 'nothing'!r}")
    if p.is_dir():
        raise _bad(p, "is a folder; give a results file (.parquet, or its .csv copy)")
    try:
        with open(p, "rb") as f:  # one open file: one complete version, whatever writers do
            data = f.read()
    except FileNotFoundError:
        return pd.DataFrame(columns=list(ROW_COLUMNS))
    return _validate(p, _parse(p, data))


def check_results_path(path: str | Path) -> Path:
    """Returns ``path`` once it is known that a sweep can append to it, else raises ValueError.

    Checked before anything is measured: it ends in ``.parquet``; it is not a folder; its folder
    can be created or written; an existing file (and its ``.csv`` copy) is writable and holds
    sweep results (not another tool's table, which appending would replace).
    """
    p = Path(path)
    if p.suffix != ".parquet":
        raise _bad(p, "a results file must end in .parquet (a .csv copy is written beside it)")
    if p.is_dir():
        raise _bad(p, "is a folder; give a file name ending in .parquet")
    for f in (p, _csv_path(p)):
        check_can_write(f)
        if f.exists():
            read_results(f)  # raises, naming the file, when it is not sweep results
    return p


@contextlib.contextmanager
def _writer_lock(folder: Path) -> Iterator[None]:
    """Holds an exclusive lock on ``folder`` (every results file in it) while the block runs."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; one writer per file there
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _write_file(df: pd.DataFrame, path: Path, suffix: str) -> None:
    """Writes ``df`` to ``path`` as CSV or parquet (``suffix``, the results file's)."""
    if suffix == ".csv":
        df.to_csv(path, index=False)
    else:
        df.to_parquet(path, index=False)


def _atomic_write(df: pd.DataFrame, paths: Sequence[Path]) -> None:
    """Writes ``df`` to every path, all or none: each is written beside its file, then all renamed.

    A full disk or any failure while writing leaves every file as it was (no half file, no
    parquet and CSV that disagree); the renames write no data, so they do not fail for space.
    """
    tag = f"{os.getpid()}.{threading.get_ident()}"
    tmps = [p.with_name(f".{p.name}.{tag}.tmp") for p in paths]
    try:
        for tmp, path in zip(tmps, paths):
            _write_file(df, tmp, path.suffix)
        for tmp, path in zip(tmps, paths):
            os.replace(tmp, path)  # a reader never sees half a file, an interrupt never leaves one
    finally:
        for tmp in tmps:
            if tmp.exists():
                tmp.unlink()


def append_rows(path: str | Path, rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Appends rows to a parquet results file (and rewrites its CSV copy); returns all rows.

    Safe with other processes appending to the same file: see the module docstring. A sweep
    checks the path with :func:`check_results_path` before measuring anything.

    Raises:
        OSError: the rows could not be written (a full disk, say), with the same errno and a
            message naming the file; the file and its CSV copy keep every earlier row, unchanged.
    """
    p = Path(path)
    if p.suffix != ".parquet":
        raise _bad(p, "a results file must end in .parquet (a .csv copy is written beside it)")
    p.parent.mkdir(parents=True, exist_ok=True)
    new = pd.DataFrame([{c: r.get(c) for c in ROW_COLUMNS} for r in rows], columns=list(ROW_COLUMNS))
    with _writer_lock(p.parent):
        old = read_results(p)
        frames = [f for f in (old, new) if len(f)]
        df = pd.concat(frames, ignore_index=True) if frames else new
        try:
            _atomic_write(df, (p, _csv_path(p)))
        except OSError as e:
            code = errno.errorcode.get(e.errno or 0, "")
            raise OSError(e.errno, f"could not add {len(new)} row(s) to {p}: "
                                   f"{e.strerror or e}{f' ({code})' if code else ''}; it keeps "
                                   f"its {len(old)} earlier rows unchanged") from e
    return df


# --------------------------------------------------------------------------- claims on points

#: The columns that make two rows one measurement (one repeat of one point, one protocol).
MEASUREMENT = ("key", "repeat", "warmup", "steps")


def _claim_path(path: Path, measurement: tuple[Any, ...]) -> Path:
    key, repeat, warmup, steps = measurement
    return path.with_name(f".{path.stem}.claims") / f"{key}.r{repeat}.w{warmup}s{steps}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def claim(path: str | Path, measurement: tuple[Any, ...]) -> bool:
    """Returns True when this process now owns ``measurement`` (key, repeat, warmup, steps) of ``path``.

    Two sweeps of one grid on one file share it this way: each claims a measurement before
    measuring it, by creating a claim file in the hidden folder ``.<stem>.claims`` beside the
    results that holds the claimer's pid. The file appears with the pid already in it (written
    to a file of this process's own, then hard-linked into place: exactly one link wins), so no
    sweep reads a claim half made and takes it for a dead one. A claim whose process has died
    (a killed sweep) is stale and taken over: moved aside, then deleted, or put back where
    what was moved turns out to be another live sweep's. False: another live sweep is
    measuring it. Release with :func:`release` once its row is written.
    """
    f = _claim_path(Path(path), measurement)
    f.parent.mkdir(parents=True, exist_ok=True)
    mine = f.with_name(f"{f.name}.{os.getpid()}.new")
    mine.write_text(str(os.getpid()))
    try:
        for _ in range(3):  # tries after a claim released or taken over meanwhile
            try:
                os.link(mine, f)
                return True
            except FileExistsError:
                pass
            try:
                pid = int(f.read_text())
            except FileNotFoundError:  # released meanwhile: try again
                continue
            except ValueError:  # not a pid: a claim file of an older fp16lab, stale
                pid = 0
            if pid == os.getpid():
                return True
            if pid and _alive(pid):
                return False
            aside = f.with_name(f"{f.name}.{os.getpid()}.stale")
            try:
                os.rename(f, aside)
            except FileNotFoundError:
                continue
            try:
                moved = int(aside.read_text())
            except ValueError:
                moved = 0
            if moved and moved != pid and _alive(moved):  # another sweep's fresh claim: back
                with contextlib.suppress(FileExistsError):
                    os.link(aside, f)
            aside.unlink()
        return False
    finally:
        mine.unlink()


def release(path: str | Path, measurement: tuple[Any, ...]) -> None:
    """Removes this process's claim on ``measurement`` (see :func:`claim`); the folder when empty."""
    f = _claim_path(Path(path), measurement)
    with contextlib.suppress(FileNotFoundError):
        f.unlink()
    with contextlib.suppress(OSError):  # another claim is still in it
        f.parent.rmdir()


def drop_duplicate_measurements(rows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Returns ``rows`` with one row per (key, repeat, warmup, steps), the first, and how many went.

    Two sweeps that both measured a point (before claims, or a file merged from two) leave two
    rows for one repeat; counting both would report an extra repeat.
    """
    if not len(rows):
        return rows, 0
    dup = rows.duplicated(subset=list(MEASUREMENT), keep="first")
    return rows[~dup].reset_index(drop=True), int(dup.sum())

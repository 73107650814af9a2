"""A real image data set on disk, made here: JPEG files in an ImageFolder layout, and reading them back.

:func:`make_image_folder` writes ``images`` JPEG files of ImageNet-like size and content into
``root/<class>/<name>.jpg`` (the layout ``torchvision.datasets.ImageFolder`` reads), once: a
``manifest.json`` beside the class folders records the settings and every file's size and
SHA-256, and a second call with the same settings reuses the files.

The pictures are deterministic functions of ``(seed, index)``: three fields of noise whose power
falls as 1/f^(2*alpha) with spatial frequency f, the way photographs' spectra fall (alpha near
1), mixed into one luminance and two weaker colour channels. At 500x375 and quality 90 that gives
files of about 100-110 KB, close to the average ImageNet training JPEG, so decoding one costs
what decoding a photograph costs. Nothing is downloaded.

Reading: :func:`scan_image_folder` lists the files and labels (and says clearly what is wrong
with a folder that is not an ImageFolder); :func:`load_rgb` and :func:`read_jpeg_bytes` read one
file and raise :class:`CorruptImageError` naming it when it is not a readable JPEG.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import validate

__all__ = ["CorruptImageError", "ImageFolderInfo", "IMAGE_EXTENSIONS", "load_rgb",
           "make_image_folder", "read_jpeg_bytes", "scan_image_folder", "synthetic_photo"]

#: Bumped whenever the pictures change, so an old cache is not taken for a new one.
GENERATOR_VERSION = 1

#: File name extensions read as images (lower case), as torchvision's ImageFolder does.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".webp")

MANIFEST = "manifest.json"
#: Written before the first picture and removed after the manifest: a folder that holds it was
#: left by an interrupted run, which the next call resumes.
MAKING = "making_image_folder.json"

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class CorruptImageError(ValueError):
    """An image file that cannot be decoded; the message names the file."""


@dataclass(frozen=True)
class ImageFolderInfo:
    """What :func:`make_image_folder` made (or found): where, how many, how big."""

    root: Path
    images: int
    classes: int
    size: tuple[int, int]
    quality: int
    seed: int
    total_bytes: int
    reused: bool

    @property
    def mean_kb(self) -> float:
        """Returns the mean file size in kB (1000 bytes)."""
        return self.total_bytes / self.images / 1e3


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low or (
            high is not None and value > high):
        allowed = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def synthetic_photo(seed: int, index: int, size: tuple[int, int] = (500, 375)) -> np.ndarray:
    """Returns one deterministic photograph-like RGB picture, uint8 of shape (height, width, 3).

    Args:
        seed, index: the picture is a function of these two only.
        size: (width, height), as PIL gives sizes.
    """
    width, height = size
    seed, index = validate.count("seed", seed, low=0), validate.count("index", index, low=0)
    rng = np.random.default_rng([seed, index])
    alpha = rng.uniform(0.85, 1.25)  # the spectral slope; photographs sit near 1
    fy = np.fft.fftfreq(height).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(width).astype(np.float32)[None, :]
    freq = np.hypot(fx, fy)
    freq[0, 0] = 1.0
    amplitude = freq ** np.float32(-alpha)
    amplitude[0, 0] = 0.0  # no constant term: the mean is set below
    noise = rng.standard_normal((2, 3, height, width // 2 + 1), dtype=np.float32)
    fields = np.fft.irfft2((noise[0] + 1j * noise[1]) * amplitude, s=(height, width))
    lum, c1, c2 = fields.astype(np.float32)
    rgb = np.stack([lum + 0.35 * c1, lum + 0.35 * c2, lum - 0.175 * (c1 + c2)], axis=-1)
    rgb = (rgb - rgb.mean()) / rgb.std()
    brightness = rng.uniform(100, 150)
    return np.clip(brightness + 48 * rgb, 0, 255).astype(np.uint8)


def _die_with_parent(parent: int) -> None:
    """Pool initializer: the worker ends when the process that made the pool (``parent``) does,
    so that a caller killed by SIGKILL does not leave its encoders running, blocked on a pipe.

    On Linux the kernel kills the worker when its parent process ends
    (``prctl(PR_SET_PDEATHSIG)``; a forkserver's workers die with the forkserver, which ends
    with the caller); elsewhere a thread of the worker watches the caller's pid every second.
    """
    ppid = os.getppid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:
        threading.Thread(target=_watch_parent, args=(parent, ppid), daemon=True).start()
    # the caller ended before the kernel was told to watch it
    if os.getppid() != ppid or (ppid != parent and _gone(parent)):
        os._exit(1)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or its pid now another user's
        return True
    return False


def _watch_parent(parent: int, ppid: int) -> None:
    while not (_gone(parent) or os.getppid() != ppid):
        time.sleep(1.0)
    os._exit(1)


def _write_one(task: tuple[str, int, int, tuple[int, int], int]) -> tuple[int, str]:
    """Writes one JPEG; returns (bytes, sha256). Runs in a worker process."""
    from PIL import Image

    path, seed, index, size, quality = task
    data = synthetic_photo(seed, index, size)
    tmp = path + ".tmp"
    Image.fromarray(data).save(tmp, format="JPEG", quality=quality)
    os.replace(tmp, path)  # a reader never sees half a file
    return _digest(Path(path))


def _digest(path: Path) -> tuple[int, str]:
    blob = path.read_bytes()
    return len(blob), hashlib.sha256(blob).hexdigest()


def _settings(images: int, classes: int, size: tuple[int, int], quality: int,
              seed: int) -> dict[str, Any]:
    return {"generator_version": GENERATOR_VERSION, "images": images, "classes": classes,
            "size": list(size), "quality": quality, "seed": seed}


def _layout(settings: dict[str, Any]) -> list[str]:
    """Returns the relative paths of the files a data set of ``settings`` holds, by index."""
    classes = settings["classes"]
    return [f"class_{i % classes:02d}/img_{i:06d}.jpg" for i in range(settings["images"])]


def _not_ours(root: Path, settings: dict[str, Any]) -> list[str]:
    """Returns what ``root`` holds that an interrupted run with ``settings`` did not write."""
    ours = {MANIFEST, MANIFEST + ".tmp", MAKING, MAKING + ".tmp"}
    for rel in _layout(settings):
        ours |= {rel, rel + ".tmp", rel.split("/")[0]}
    return sorted(rel for rel in (p.relative_to(root).as_posix() for p in root.rglob("*"))
                  if rel not in ours)


def _claim(root: Path, settings: dict[str, Any]) -> None:
    """Makes ``root`` ready for a data set of ``settings`` and marks it as being made
    (:data:`MAKING`), so that a run that is interrupted leaves a folder the next run knows.

    A folder holding the marker of an interrupted run and nothing it did not write is taken
    over: resumed with the same settings, or emptied of that run's files first. Anything else
    that is not empty and has no manifest is refused, and nothing in it is touched.
    """
    marker = root / MAKING
    if not (root / MANIFEST).exists() and marker.exists():
        try:
            previous = json.loads(marker.read_text())["settings"]
            stray = _not_ours(root, previous)
        except (ValueError, KeyError, TypeError):  # not our marker after all
            previous, stray = None, [MAKING]
        if stray:
            raise ValueError(f"{root} holds the marker of an interrupted make_image_folder run but "
                             f"also files it did not write ({', '.join(stray[:3])}"
                             f"{', ...' if len(stray) > 3 else ''}): nothing in it will be "
                             "overwritten. Choose an empty or new folder.")
        if previous != settings:  # another data set was being made: take away its files only
            for rel in _layout(previous):
                for path in (root / rel, root / (rel + ".tmp")):
                    path.unlink(missing_ok=True)
            for d in {rel.split("/")[0] for rel in _layout(previous)}:
                if (root / d).is_dir() and not any((root / d).iterdir()):
                    (root / d).rmdir()
    elif not (root / MANIFEST).exists() and root.exists() and any(root.iterdir()):
        raise ValueError(f"{root} is not empty and has no {MANIFEST}: it is not a data set made "
                         "by make_image_folder, and nothing in it will be overwritten. Choose an "
                         "empty or new folder.")
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / (MAKING + ".tmp")
    tmp.write_text(json.dumps({"settings": settings}) + "\n")
    tmp.replace(marker)


def make_image_folder(root: str | Path, *, images: int = 1024, classes: int = 8,
                      size: tuple[int, int] = (500, 375), quality: int = 90, seed: int = 0,
                      workers: int | None = None) -> ImageFolderInfo:
    """Returns where the JPEG data set is, writing it first unless ``root`` already holds it.

    Args:
        root: the folder to write (created if missing). If it holds a manifest with the same
            settings and every file is there with its recorded size, nothing is written. A
            folder left by an interrupted run (its :data:`MAKING` marker, and only its files)
            is resumed, or remade where the settings differ.
        images: number of files, spread evenly over ``classes`` folders ``class_00``, ...
        size: (width, height) of every picture; quality: the JPEG quality (1-95).
        seed: the pictures are a deterministic function of ``seed`` and their index.
        workers: processes that encode in parallel (default: the CPU count, at most 16); they
            end with the calling process, even when it is killed.

    Raises:
        ValueError: bad settings, or ``root`` holds other files (another data set, or anything
            without a manifest): nothing there is overwritten.
        NotADirectoryError, PermissionError: ``root`` is a file, or a folder that cannot be
            written (or made), when there is something to write; before anything is written.
    """
    _check_int("images", images, 1)
    _check_int("classes", classes, 1, images)
    _check_int("quality", quality, 1, 95)
    _check_int("seed", seed, 0)
    if (not isinstance(size, (tuple, list)) or len(size) != 2
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 8 for s in size)):
        raise ValueError(f"size must be (width, height) with both integers >= 8, got {size!r}")
    size = (int(size[0]), int(size[1]))
    if workers is not None:
        _check_int("workers", workers, 1)
    root = Path(root).expanduser()
    settings = _settings(images, classes, size, quality, seed)
    manifest_path = root / MANIFEST
    recorded: dict[str, int] = {}
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("settings") != settings:
            raise ValueError(f"{root} already holds a data set made with other settings "
                             f"({manifest.get('settings')}); asked for {settings}. Choose "
                             "another folder or delete that one.")
        files = manifest["files"]
        if all((root / f["path"]).is_file() and (root / f["path"]).stat().st_size == f["bytes"]
               for f in files):
            return _info(root, settings, files, reused=True)
        recorded = {f["path"]: f["bytes"] for f in files}
    root = validate.output_dir("image folder", root)  # a file or a read-only place: refused now
    _claim(root, settings)
    rel_paths = _layout(settings)
    tasks, written = [], {}
    for i, rel in enumerate(rel_paths):
        path = root / rel
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        # a picture under its own name is whole (written beside it, then renamed): keep it
        if path.is_file() and recorded.get(rel, path.stat().st_size) == path.stat().st_size:
            written[i] = _digest(path)
        else:
            tasks.append((i, (str(path), seed, i, size, quality)))
    n_workers = min(workers or min(os.cpu_count() or 1, 16), max(1, len(tasks)))
    if n_workers > 1:
        with ProcessPoolExecutor(n_workers, initializer=_die_with_parent,
                                 initargs=(os.getpid(),)) as pool:
            made = list(pool.map(_write_one, [t for _, t in tasks],
                                 chunksize=max(1, len(tasks) // (4 * n_workers))))
    else:
        made = [_write_one(t) for _, t in tasks]
    written.update({i: result for (i, _), result in zip(tasks, made)})
    files = [{"path": rel, "label": i % classes, "bytes": written[i][0], "sha256": written[i][1]}
             for i, rel in enumerate(rel_paths)]
    tmp = manifest_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"settings": settings, "files": files}, indent=0) + "\n")
    tmp.replace(manifest_path)
    (root / MAKING).unlink(missing_ok=True)
    return _info(root, settings, files, reused=False)


def _info(root: Path, settings: dict[str, Any], files: Sequence[dict[str, Any]],
          reused: bool) -> ImageFolderInfo:
    return ImageFolderInfo(root=root, images=settings["images"], classes=settings["classes"],
                           size=tuple(settings["size"]), quality=settings["quality"],
                           seed=settings["seed"], total_bytes=sum(f["bytes"] for f in files),
                           reused=reused)


def scan_image_folder(root: str | Path) -> tuple[list[Path], list[int], list[str]]:
    """Returns (files, labels, class names) of an ImageFolder layout ``root/<class>/<file>``.

    Classes are the sub-folders in sorted order (label 0 is the first), files sorted within
    each, as torchvision's ImageFolder orders them.

    Raises:
        FileNotFoundError: ``root`` is missing, or holds no class folder or no image.
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist (or is not a folder); make "
                                "one with fp16lab.inputs.make_image_folder(path) or point at an "
                                "ImageFolder layout root/<class>/<image>.jpg")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    if not classes:
        raise FileNotFoundError(f"image folder {root} has no class sub-folders; expected the "
                                "layout root/<class>/<image>.jpg")
    files, labels = [], []
    for label, name in enumerate(classes):
        found = sorted(p for p in (root / name).iterdir()
                       if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
        files += found
        labels += [label] * len(found)
    if not files:
        raise FileNotFoundError(f"image folder {root} has class folders ({', '.join(classes[:5])}"
                                f"{', ...' if len(classes) > 5 else ''}) but no image files "
                                f"(extensions {', '.join(IMAGE_EXTENSIONS)})")
    return files, labels, classes


def load_rgb(path: str | Path, *, data: bytes | None = None) -> Any:
    """Returns the image at ``path`` as an RGB ``PIL.Image``, fully decoded; from ``data``, the
    file's bytes already read, where given (``path`` then only names it).

    Raises:
        CorruptImageError: the file cannot be decoded; the message names it.
    """
    from PIL import Image

    try:
        with Image.open(path if data is None else io.BytesIO(data)) as img:
            return img.convert("RGB")  # convert() decodes everything, so errors surface here
    except (OSError, SyntaxError, ValueError) as e:  # PIL's errors for bad and truncated files
        raise CorruptImageError(f"cannot decode image file {path}: {type(e).__name__}: {e}") from None


def read_jpeg_bytes(path: str | Path) -> bytes:
    """Returns the bytes of a JPEG file after checking its start and end markers.

    A JPEG starts with the marker FF D8 and ends with FF D9; a file cut short or not a JPEG at all
    fails this check here, on the CPU, where the file can still be named (a GPU decoder fails on
    the whole batch without saying which file).

    Raises:
        CorruptImageError: the file does not look like a complete JPEG; the message names it.
    """
    blob = Path(path).read_bytes()
    if len(blob) < 4 or blob[:2] != b"\xff\xd8":
        raise CorruptImageError(f"image file {path} is not a JPEG (it does not start with the "
                                "JPEG marker FF D8)")
    if blob.rstrip(b"\x00")[-2:] != b"\xff\xd9":
        raise CorruptImageError(f"image file {path} is cut short (it does not end with the JPEG "
                                "end marker FF D9)")
    return blob

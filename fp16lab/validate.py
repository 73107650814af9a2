"""Checks for values that enter fp16lab from a user: one function per kind of value.

Every public function, CLI flag and settings object that takes a number, a flag, a name or a
path checks it here, before any work starts, so that bad input gets the same clear message
everywhere: what was given, what was wrong, what is allowed. Each check returns the value
(normalised where that is its job: an ``int`` for a count, a ``Path`` for a path), so a caller
writes ``steps = validate.count("steps", steps)``. A command line runs the same checks as it
parses: ``type=validate.argument(validate.count, low=0)`` (:func:`argument`).

Booleans are not numbers here, although Python says ``True == 1``: ``init_scale=True`` is a
mistake, never a scale of 1.

A refused path raises the ``OSError`` that names its problem (``NotADirectoryError``...) and is
a ``ValueError`` as well (as ``io.UnsupportedOperation`` is both), so a caller that reports bad
values with ``except ValueError`` reports a bad path too.
"""
from __future__ import annotations

import argparse
import math
import numbers
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ON_OFF", "NotAFile", "NotAFolder", "NotPermitted", "PathNotFound", "argument", "boolean",
           "choice", "count", "device", "existing_dir", "existing_file", "existing_path", "number",
           "output_dir", "output_file", "text"]


class PathNotFound(FileNotFoundError, ValueError):
    """A path that must exist does not."""


class NotAFolder(NotADirectoryError, ValueError):
    """A path that must be a folder is a file (or lies under one)."""


class NotAFile(IsADirectoryError, ValueError):
    """A path that must be a file is a folder."""


class NotPermitted(PermissionError, ValueError):
    """A path that must be read or written cannot be."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def number(name: str, value: Any, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False, integer: bool = False,
           finite: bool = True) -> float | int:
    """Returns ``value`` if it is a finite real number (not a bool) within the bounds.

    Args:
        name: what the value is, as the caller's user knows it (``"init_scale"``, ``"--lr"``).
        low, high: the bounds; ``None`` leaves that side open to infinity.
        low_open, high_open: whether the bound itself is excluded (``low=0, low_open=True``
            asks for a positive number).
        integer: the value must be a whole number; it is returned as an ``int``.
        finite: NaN and the infinities are refused (``False`` takes them: a value whose bits
            are shown, say); an ``integer`` is always finite.

    Raises:
        TypeError: not a real number (a string, a bool, ``None``, a complex number).
        ValueError: NaN, infinite, fractional where ``integer``, or out of bounds.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        kind = "a whole number" if integer else "a number"
        raise TypeError(f"{name} must be {kind}, got {_shown(value)} ({type(value).__name__})")
    if not math.isfinite(value) and (finite or integer):
        raise ValueError(f"{name} must be finite, got {value}")
    if integer:
        if value != int(value):
            raise ValueError(f"{name} must be a whole number, got {value}")
        value = int(value)
    if math.isnan(value):
        return value  # finite=False: NaN is taken, and no bound can compare with it
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if below or above:
        left = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
        right = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
        allowed = " and ".join(s for s in (left, right) if s)
        raise ValueError(f"{name} must be {allowed}, got {value:g}")
    return value


def count(name: str, value: Any, *, low: int = 1, high: int | None = None) -> int:
    """Returns ``value`` as an ``int`` if it is a whole number from ``low`` (default 1) to ``high``."""
    return number(name, value, low=low, high=high, integer=True)


def boolean(name: str, value: Any) -> bool:
    """Returns ``value`` if it is ``True`` or ``False`` (numpy's bool too); 0, 1 and "yes" are refused."""
    if isinstance(value, bool):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {_shown(value)} ({type(value).__name__})")


def choice(name: str, value: Any, allowed: Iterable[Any]) -> Any:
    """Returns ``value`` if it is one of ``allowed``; the message lists what is allowed."""
    allowed = list(allowed)
    try:
        ok = any(isinstance(a, bool) == isinstance(value, bool) and bool(a == value) for a in allowed)
    except (TypeError, ValueError):  # an incomparable value (an array, say) is simply not allowed
        ok = False
    if not ok:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {_shown(value)}")
    return value


def text(name: str, value: Any, *, pattern: str | None = None, like: str = "") -> str:
    """Returns ``value`` if it is a non-empty string, matching ``pattern`` in full when given.

    ``like`` shows the allowed form in the message (``"'sm_90a'"``); give it with ``pattern``.
    """
    shape = f" like {like}" if like else ""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string{shape}, got {_shown(value)} ({type(value).__name__})")
    if not value or (pattern is not None and re.fullmatch(pattern, value) is None):
        kind = "a string" if pattern is not None else "a non-empty string"
        raise ValueError(f"{name} must be {kind}{shape}, got {_shown(value)}")
    return value


def device(name: str, value: Any) -> str:
    """Returns ``value`` as a device name (``"cpu"``, ``"cuda"``, ``"cuda:1"``) if torch can parse it.

    Whether that device exists here is the caller's question: a check that names the device
    (``"needs a CUDA GPU"``) says more than torch's own error.
    """
    import torch  # optional for the rest of this module: only device names need it

    if isinstance(value, torch.device):
        return str(value)
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be a device name such as 'cpu' or 'cuda', got "
                        f"{_shown(value)} ({type(value).__name__})")
    try:
        return str(torch.device(value))
    except RuntimeError:
        raise ValueError(f"{name} must be a device name such as 'cpu', 'cuda' or 'cuda:1', "
                         f"got {_shown(value)}") from None


def _as_path(name: str, value: Any) -> Path:
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (a str or pathlib.Path), got {_shown(value)}")
    text = os.fspath(value)
    if isinstance(text, bytes) or not text or "\x00" in text:
        raise ValueError(f"{name} must be a non-empty path without NUL characters, got {_shown(value)}")
    return Path(text).expanduser()


def existing_file(name: str, value: Any, *, executable: bool = False) -> Path:
    """Returns ``value`` as a ``Path`` if it names a readable file (one that may be run, where
    ``executable``: a compiler, say)."""
    path = _as_path(name, value)
    if not path.exists():
        raise PathNotFound(f"{name}: {path} does not exist")
    if not path.is_file():
        raise ValueError(f"{name}: {path} is not a file")
    if not os.access(path, os.R_OK):
        raise NotPermitted(f"{name}: {path} cannot be read")
    if executable and not os.access(path, os.X_OK):
        raise NotPermitted(f"{name}: {path} is not executable")
    return path


def existing_path(name: str, value: Any) -> Path:
    """Returns ``value`` as a ``Path`` if something (a file or a folder) is there."""
    path = _as_path(name, value)
    if not path.exists():
        raise PathNotFound(f"{name}: {path} does not exist")
    return path


def existing_dir(name: str, value: Any) -> Path:
    """Returns ``value`` as a ``Path`` if it names a readable folder."""
    path = _as_path(name, value)
    if not path.exists():
        raise PathNotFound(f"{name}: {path} does not exist")
    if not path.is_dir():
        raise NotAFolder(f"{name}: {path} is a file, not a folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise NotPermitted(f"{name}: the folder {path} cannot be read")
    return path


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def output_dir(name: str, value: Any) -> Path:
    """Returns ``value`` as a ``Path`` if it is a folder that exists or can be made, and is writable.

    Nothing is created: the check only proves that writing there will work, so that a
    benchmark can refuse a bad ``--out`` before minutes of measuring.
    """
    path = _as_path(name, value)
    if path.exists():
        if not path.is_dir():
            raise NotAFolder(f"{name}: {path} is a file, not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise NotPermitted(f"{name}: the folder {path} is not writable")
        return path
    base = _nearest_existing(path)
    if not base.is_dir():
        raise NotAFolder(f"{name}: {path} cannot be made: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise NotPermitted(f"{name}: {path} cannot be made: the folder {base} is not writable")
    return path


def output_file(name: str, value: Any) -> Path:
    """Returns ``value`` as a ``Path`` if a file can be written there (made, or replaced)."""
    path = _as_path(name, value)
    if path.exists():
        if path.is_dir():
            raise NotAFile(f"{name}: {path} is a folder, not a file")
        if not os.access(path, os.W_OK):
            raise NotPermitted(f"{name}: the file {path} is not writable")
        return path
    output_dir(f"{name}'s folder", path.parent)  # a bare name's parent is Path(".")
    return path


#: How a command line writes a boolean: ``--pin-memory off``, ``--cudnn-benchmark on,off``.
ON_OFF = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}


def _from_text(text: str, *, whole: bool) -> Any:
    """Returns the number a flag's ``text`` writes (an int where ``whole`` and it is one), or the
    text itself when it writes none, so that the check names what was given."""
    if whole:
        try:
            return int(text)
        except ValueError:
            pass  # "1e8" is a whole number too
    try:
        return float(text)
    except ValueError:
        return text


def argument(check: Callable[..., Any], *args: Any, many: bool = False,
             words: Mapping[str, Any] | None = None, numeric: bool = False,
             **kwargs: Any) -> Callable[[str], Any]:
    """Returns an argparse ``type=`` that reads a flag's text and runs ``check`` on it.

    ``validate.argument(validate.count, low=0)`` reads ``--warmup 3`` as the int 3 and refuses
    ``--warmup -1`` at parse time, so argparse exits 2 with one line: ``argument --warmup: must
    be >= 0, got -1``. Numbers and counts are read from the text (``1e8`` is a count), a boolean
    from the words of :data:`ON_OFF`; other checks get the text unless ``numeric``. ``args``
    and ``kwargs`` go to the check (``validate.argument(validate.choice, MODELS)``).

    Args:
        many: the flag holds a comma-separated list (``--batch 64,128``); each item is checked,
            a tuple is returned, and an empty list is refused.
        words: texts that stand for a value without a check (``{"auto": None}``); a boolean's
            are :data:`ON_OFF`.
        numeric: give a check of another module (``check_scale(name, value)``) the number the
            text writes, as :func:`number` and :func:`count` get it.
    """
    if not callable(check):
        raise TypeError(f"check must be a function of (name, value), got {_shown(check)}")
    boolean("many", many)
    boolean("numeric", numeric)
    if check is boolean and words is None:
        words = ON_OFF

    def one(text: str) -> Any:
        key = text.strip().lower()
        if words and key in words:
            return words[key]
        if check is boolean:
            raise ValueError(f"value must be one of {', '.join(words)}; got {_shown(text)}")
        text = text.strip()
        if numeric or check in (number, count):
            text = _from_text(text, whole=check is not number)
        return check("value", text, *args, **kwargs)

    def read(text: str) -> Any:
        items = [t for t in text.split(",") if t.strip()] if many else [text]
        if not items:
            raise argparse.ArgumentTypeError(
                f"must be a comma-separated list of one or more values, got {_shown(text)}")
        try:
            values = tuple(one(t) for t in items)
        except (TypeError, ValueError) as exc:  # a refused path is a ValueError too
            message = str(exc).removesuffix(" (str)")  # every flag's text is a str
            for prefix, instead in (("value's ", "its "), ("value: ", ""), ("value ", "")):
                if message.startswith(prefix):
                    message = instead + message[len(prefix):]
                    break
            if words and check is not boolean:
                message += f" (or {' or '.join(map(repr, words))})"
            raise argparse.ArgumentTypeError(message) from None
        return values if many else values[0]

    read.__name__ = check.__name__  # argparse names the type in its own messages
    read.check = check  # type: ignore[attr-defined]  # what the flag takes, for a reader
    return read

"""fp16lab.validate: each kind of value is refused with a message naming it and what is allowed."""
import os

import numpy as np
import pytest

from fp16lab import validate


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_number_refuses_non_finite(bad):
    with pytest.raises(ValueError, match="lr must be finite"):
        validate.number("lr", bad)


@pytest.mark.parametrize("bad", [True, False, "1024", None, 1j, [1]])
def test_number_refuses_what_is_not_a_number(bad):
    with pytest.raises(TypeError, match="init_scale must be a number"):
        validate.number("init_scale", bad)


def test_number_bounds_open_and_closed():
    assert validate.number("x", 0, low=0) == 0
    with pytest.raises(ValueError, match=r"x must be > 0, got 0"):
        validate.number("x", 0, low=0, low_open=True)
    assert validate.number("x", 1, high=1) == 1
    with pytest.raises(ValueError, match=r"x must be >= 0 and < 1, got 1"):
        validate.number("x", 1, low=0, high=1, high_open=True)
    with pytest.raises(ValueError, match=r"x must be <= 2, got 3"):
        validate.number("x", 3, high=2)
    assert validate.number("x", np.float32(0.5), low=0, high=1) == pytest.approx(0.5)


def test_integer_and_count():
    assert validate.number("n", 4.0, integer=True) == 4
    assert type(validate.number("n", np.int64(4), integer=True)) is int
    with pytest.raises(ValueError, match="whole number, got 2.5"):
        validate.count("gpus", 2.5)
    with pytest.raises(ValueError, match=r"gpus must be >= 1, got 0"):
        validate.count("gpus", 0)
    assert validate.count("warmup", 0, low=0) == 0
    with pytest.raises(TypeError, match="a whole number"):
        validate.count("steps", True)


def test_boolean():
    assert validate.boolean("b", True) is True
    assert validate.boolean("b", np.bool_(False)) is False
    for bad in (0, 1, "yes", None, 1.0):
        with pytest.raises(TypeError, match="b must be True or False"):
            validate.boolean("b", bad)


def test_choice():
    assert validate.choice("p", "fp32", ("fp32", "tf32")) == "fp32"
    with pytest.raises(ValueError, match=r"p must be one of 'fp32', 'tf32'; got 'fp64'"):
        validate.choice("p", "fp64", ("fp32", "tf32"))
    with pytest.raises(ValueError):  # True == 1, yet a flag is no member of a list of ints
        validate.choice("k", True, (1, 2))
    with pytest.raises(ValueError):
        validate.choice("k", np.array([1, 2]), (1, 2))
    with pytest.raises(ValueError):
        validate.choice("k", [1], ("a",))


def test_paths(tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("x")
    assert validate.existing_file("data", str(f)) == f
    assert validate.existing_dir("root", tmp_path) == tmp_path
    assert validate.existing_path("path", str(f)) == f and validate.existing_path("p", tmp_path) == tmp_path
    with pytest.raises(FileNotFoundError, match="path: .*nope does not exist"):
        validate.existing_path("path", tmp_path / "nope")
    with pytest.raises(TypeError, match="path must be a path"):
        validate.existing_path("path", 3)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        validate.existing_file("data", tmp_path / "nope")
    with pytest.raises(ValueError, match="is not a file"):
        validate.existing_file("data", tmp_path)
    with pytest.raises(NotADirectoryError, match="is a file, not a folder"):
        validate.existing_dir("root", f)
    with pytest.raises(NotADirectoryError, match="is a file, not a folder"):
        validate.output_dir("--out", f)
    with pytest.raises(NotADirectoryError, match="cannot be made"):
        validate.output_dir("--out", f / "sub")
    assert validate.output_dir("--out", tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()  # a check makes nothing
    with pytest.raises(IsADirectoryError, match="is a folder, not a file"):
        validate.output_file("--out", tmp_path)
    assert validate.output_file("--out", tmp_path / "new.json") == tmp_path / "new.json"
    for bad in ("", None, 3, True, "a\x00b"):
        with pytest.raises((TypeError, ValueError)):
            validate.output_file("--out", bad)


def test_unwritable_folder(tmp_path, monkeypatch):
    # root may write anywhere, so the folder's refusal is played by os.access itself
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if os.fspath(p) == str(ro) else real(p, mode))
    with pytest.raises(PermissionError, match="not writable"):
        validate.output_dir("--out", ro / "x")
    with pytest.raises(PermissionError, match="not writable"):
        validate.output_file("--out", ro / "x.json")
    with pytest.raises(PermissionError, match="not writable"):
        validate.output_dir("--out", ro)


def test_device_names_parse_and_nonsense_is_refused():
    import torch
    assert validate.device("device", "cpu") == "cpu"
    assert validate.device("device", "cuda:1") == "cuda:1"
    assert validate.device("device", torch.device("cpu")) == "cpu"
    for bad, error in (("", TypeError), (7, TypeError), (None, TypeError), ("gpu0", ValueError),
                       ("cuda:x", ValueError)):
        with pytest.raises(error, match="device"):
            validate.device("device", bad)


def test_number_may_take_nan_and_the_infinities_when_asked():
    import math
    assert math.isnan(validate.number("value", float("nan"), finite=False))
    assert validate.number("value", -float("inf"), finite=False) == -float("inf")
    with pytest.raises(ValueError, match="value must be <= 1, got inf"):
        validate.number("value", float("inf"), high=1, finite=False)
    with pytest.raises(ValueError, match="n must be finite"):  # a whole number is finite
        validate.number("n", float("inf"), integer=True, finite=False)
    with pytest.raises(TypeError, match="value must be a number"):
        validate.number("value", True, finite=False)


def test_text_and_its_pattern():
    assert validate.text("arch", "sm_90a", pattern=r"sm_\d+a?", like="'sm_90a'") == "sm_90a"
    assert validate.text("title", "any words") == "any words"
    with pytest.raises(ValueError, match=r"arch must be a string like 'sm_90a', got 'abc'"):
        validate.text("arch", "abc", pattern=r"sm_\d+a?", like="'sm_90a'")
    with pytest.raises(ValueError, match="title must be a non-empty string, got ''"):
        validate.text("title", "")
    for bad in (7, None, b"sm_90", True):
        with pytest.raises(TypeError, match="arch must be a string like 'sm_90a'"):
            validate.text("arch", bad, pattern=r"sm_\d+a?", like="'sm_90a'")


def test_a_refused_path_is_a_value_error_too(tmp_path):
    # a caller that reports bad values with `except ValueError` reports a bad path as well
    f = tmp_path / "f.txt"
    f.write_text("x")
    for check, value, oserror in ((validate.existing_dir, f, NotADirectoryError),
                                  (validate.existing_dir, tmp_path / "nope", FileNotFoundError),
                                  (validate.existing_file, tmp_path / "nope", FileNotFoundError),
                                  (validate.output_dir, f / "sub", NotADirectoryError),
                                  (validate.output_file, tmp_path, IsADirectoryError)):
        with pytest.raises(oserror) as e:
            check("where", value)
        assert isinstance(e.value, ValueError) and "where" in str(e.value)
    assert issubclass(validate.NotPermitted, PermissionError)
    assert issubclass(validate.NotPermitted, ValueError)


def test_an_executable_file_must_be_one(tmp_path):
    f = tmp_path / "nvcc"
    f.write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError, match="nvcc: .* is not executable"):
        validate.existing_file("nvcc", f, executable=True)
    f.chmod(0o755)
    assert validate.existing_file("nvcc", f, executable=True) == f

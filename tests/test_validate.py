"""fp16lab.validate: each kind of value is refused with a message naming it and what is allowed."""
import os
import re

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


# ---------------------------------------------------------------- validate.argument: argparse types

def _parser(**types):
    import argparse

    p = argparse.ArgumentParser(prog="prog", exit_on_error=False)
    for flag, type_ in types.items():
        p.add_argument(f"--{flag}", type=type_)
    return p


def _check_says(check, value, *args, **kwargs) -> str:
    """Returns the check's own message for ``value``, as the flag shows it (its name left out)."""
    with pytest.raises((TypeError, ValueError)) as caught:
        check("value", value, *args, **kwargs)
    message = str(caught.value).removesuffix(" (str)")
    for prefix, instead in (("value's ", "its "), ("value: ", ""), ("value ", "")):
        if message.startswith(prefix):
            return instead + message[len(prefix):]
    return message


@pytest.mark.parametrize("check, kwargs, text, read", [
    (validate.count, {"low": 0}, "0", 0), (validate.count, {}, "1e3", 1000),
    (validate.count, {}, " 7 ", 7), (validate.number, {"low": 0}, "2.5", 2.5),
    (validate.number, {}, "-1e-3", -1e-3), (validate.choice, {"allowed": ("a", "b")}, "b", "b"),
    (validate.text, {}, "run 1", "run 1"),
])
def test_argument_reads_what_the_check_takes(check, kwargs, text, read):
    got = validate.argument(check, **kwargs)(text)
    assert got == read and type(got) is type(read)


@pytest.mark.parametrize("check, kwargs, text, value", [
    (validate.count, {"low": 1}, "0", 0), (validate.count, {}, "2.5", 2.5),
    (validate.count, {}, "nan", float("nan")), (validate.count, {}, "abc", "abc"),
    (validate.count, {"low": 0}, "-1", -1), (validate.number, {}, "nan", float("nan")),
    (validate.number, {}, "inf", float("inf")), (validate.number, {}, "", ""),
    (validate.number, {"low": 0, "low_open": True}, "0", 0.0),
    (validate.number, {"low": 0, "high": 1}, "1.5", 1.5),
    (validate.choice, {"allowed": ("a", "b")}, "c", "c"), (validate.text, {}, "", ""),
])
def test_argument_refuses_with_the_checks_own_message(check, kwargs, text, value):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError) as caught:
        validate.argument(check, **kwargs)(text)
    assert str(caught.value) == _check_says(check, value, **kwargs)


def test_argument_paths_refuse_as_the_path_checks_do(tmp_path):
    import argparse

    a_file = tmp_path / "f"
    a_file.write_text("x")
    cases = [(validate.existing_dir, str(a_file)), (validate.existing_dir, str(tmp_path / "no")),
             (validate.existing_file, str(tmp_path)), (validate.existing_file, ""),
             (validate.output_dir, str(a_file)), (validate.output_dir, f"{a_file}/out"),
             (validate.output_file, str(tmp_path)), (validate.output_file, f"{a_file}/r.csv")]
    for check, text in cases:
        with pytest.raises(argparse.ArgumentTypeError) as caught:
            validate.argument(check)(text)
        assert str(caught.value) == _check_says(check, text), (check.__name__, text)
    assert validate.argument(validate.output_dir)(str(tmp_path / "new")) == tmp_path / "new"
    assert validate.argument(validate.existing_file)(str(a_file)) == a_file


def test_argument_booleans_are_on_off_words():
    import argparse

    read = validate.argument(validate.boolean)
    assert [read(t) for t in ("on", "OFF", "true", "false", "1", "0")] == [
        True, False, True, False, True, False]
    for bad in ("yes", "", "2", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be one of on, off"):
            read(bad)


def test_argument_lists_check_every_item_and_refuse_an_empty_list():
    import argparse

    read = validate.argument(validate.count, low=0, many=True, words={"auto": None})
    assert read("0, 4,auto,") == (0, 4, None)
    for bad, says in (("", "one or more"), (" , ", "one or more"), ("4,-1", "must be >= 0"),
                      ("4,x", "whole number, got 'x' (or 'auto')")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(says)):
            read(bad)
    assert validate.argument(validate.boolean, many=True)("on,off") == (True, False)


def test_argument_makes_argparse_exit_2_with_one_line(capsys):
    p = _parser(steps=validate.argument(validate.count))
    p.exit_on_error = True
    with pytest.raises(SystemExit) as caught:
        p.parse_args(["--steps", "0"])
    assert caught.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "prog: error: argument --steps: must be >= 1, got 0"
    assert p.parse_args(["--steps", "3"]).steps == 3


def test_argument_numeric_gives_another_modules_check_the_number():
    def check(name, value):  # a check of another module, taking (name, value) as these do
        return value

    assert validate.argument(check, numeric=True)("3") == 3
    assert validate.argument(check, numeric=True)("0.5") == 0.5
    assert validate.argument(check, numeric=True)("abc") == "abc"  # for the check to refuse
    assert validate.argument(check)("3") == "3"


def test_argument_refuses_its_own_bad_settings():
    with pytest.raises(TypeError, match="check must be a function"):
        validate.argument("count")
    with pytest.raises(TypeError, match="many must be True or False"):
        validate.argument(validate.count, many="yes")
    with pytest.raises(TypeError, match="numeric must be True or False"):
        validate.argument(validate.count, numeric=1)

"""fp16lab.validate: what its messages show, the permissions it asks for, the numbers a flag's
text becomes. Written against the survivors of a mutation run: each test names what a user
would lose if the line it pins changed."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pytest

from fp16lab import validate


def test_a_shown_value_is_cut_only_past_80_characters():
    exact = "x" * 78  # repr adds the quotes: 80 characters
    with pytest.raises(ValueError) as e:
        validate.choice("c", exact, ["a"])
    assert e.value.args[0].endswith(f"got '{exact}'")
    longer = "y" * 79  # 81 characters: 77 of them, then "..."
    with pytest.raises(ValueError) as e:
        validate.choice("c", longer, ["a"])
    assert e.value.args[0].endswith("got '" + "y" * 76 + "...")


class _BytesPath:
    def __fspath__(self):
        return b"/tmp"


def test_paths_name_the_value_and_refuse_bytes():
    with pytest.raises(TypeError, match=r"^out must be a path \(a str or pathlib.Path\), got 42$"):
        validate.existing_path("out", 42)
    with pytest.raises(ValueError, match=r"^out must be a non-empty path without NUL characters, "
                                         r"got 'a\\x00b'$"):
        validate.existing_path("out", "a\x00b")
    with pytest.raises(ValueError, match="non-empty path"):
        validate.existing_path("out", _BytesPath())  # a path-like that gives bytes


@pytest.mark.parametrize("check", [validate.existing_dir, validate.existing_file,
                                   validate.output_dir, validate.output_file])
def test_every_path_check_names_the_value_it_refuses(check):
    with pytest.raises(TypeError, match=r"^--data must be a path"):
        check("--data", 3.5)


def _deny(monkeypatch, asked):
    def access(path, mode):
        asked.append((Path(path), mode))
        return False
    monkeypatch.setattr(validate.os, "access", access)


def test_a_folder_must_be_readable_and_searchable(monkeypatch, tmp_path):
    asked = []
    _deny(monkeypatch, asked)
    with pytest.raises(validate.NotPermitted, match=f"^data: the folder {tmp_path} cannot be read$"):
        validate.existing_dir("data", tmp_path)
    assert asked == [(tmp_path, os.R_OK | os.X_OK)]


def test_a_file_must_be_readable(monkeypatch, tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    asked = []
    _deny(monkeypatch, asked)
    with pytest.raises(validate.NotPermitted, match=f"^nvcc: {f} cannot be read$"):
        validate.existing_file("nvcc", f)
    assert asked == [(f, os.R_OK)]


def test_an_output_folder_must_be_writable_and_searchable(monkeypatch, tmp_path):
    asked = []
    _deny(monkeypatch, asked)
    with pytest.raises(validate.NotPermitted, match=f"^--out: the folder {tmp_path} is not writable$"):
        validate.output_dir("--out", tmp_path)
    new = tmp_path / "a" / "b"
    with pytest.raises(validate.NotPermitted,
                       match=f"^--out: {new} cannot be made: the folder {tmp_path} is not writable$"):
        validate.output_dir("--out", new)
    assert asked == [(tmp_path, os.W_OK | os.X_OK)] * 2


def test_an_output_file_must_be_writable_or_its_folder_must(monkeypatch, tmp_path):
    f = tmp_path / "r.json"
    f.write_text("{}")
    asked = []
    _deny(monkeypatch, asked)
    with pytest.raises(validate.NotPermitted, match=f"^--save: the file {f} is not writable$"):
        validate.output_file("--save", f)
    with pytest.raises(validate.NotPermitted, match=r"^--save's folder: "):
        validate.output_file("--save", tmp_path / "new.json")
    assert asked == [(f, os.W_OK), (tmp_path, os.W_OK | os.X_OK)]
    monkeypatch.setattr(validate.os, "access", lambda path, mode: True)
    assert validate.output_file("--save", f) == f  # writable: taken


def test_booleans_say_what_they_got_and_take_numpys():
    got = validate.boolean("b", np.bool_(True))
    assert got is True
    assert validate.boolean("b", np.bool_(False)) is False
    with pytest.raises(TypeError, match=r"^b must be True or False, got 1 \(int\)$"):
        validate.boolean("b", 1)


def test_a_count_keeps_its_upper_bound():
    assert validate.count("n", 4, high=4) == 4
    with pytest.raises(ValueError, match="^n must be >= 1 and <= 4, got 5$"):
        validate.count("n", 5, high=4)
    with pytest.raises(ValueError, match="^x must be <= 3, got 5$"):  # no lower bound: none said
        validate.number("x", 5, high=3)


def test_text_messages_show_the_value_and_its_type():
    with pytest.raises(TypeError, match=r"^arch must be a string like 'sm_90a', got 90 \(int\)$"):
        validate.text("arch", 90, pattern="sm_[0-9]+a?", like="'sm_90a'")


def test_a_bare_file_name_is_checked_in_the_current_folder(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert validate.output_file("--save", "new.json") == Path("new.json")
    asked = []
    _deny(monkeypatch, asked)
    with pytest.raises(validate.NotPermitted, match=r"^--save's folder: the folder \. is not writable$"):
        validate.output_file("--save", "new.json")
    assert asked == [(Path("."), os.W_OK | os.X_OK)]


def test_device_messages_show_the_value_and_its_type():
    with pytest.raises(TypeError, match=r"such as 'cpu' or 'cuda', got 3 \(int\)$"):
        validate.device("device", 3)
    with pytest.raises(ValueError, match=r"'cuda:1', got 'gpu0'$"):
        validate.device("device", "gpu0")


def test_argument_reads_numbers_as_the_check_needs_them():
    assert type(validate.argument(validate.number)("3")) is float
    big = 2**53 + 1  # not a float: read as an int, a count keeps every digit
    assert validate.argument(validate.count)(str(big)) == big
    assert validate.argument(validate.count)("1e3") == 1000


def test_argument_passes_the_checks_own_arguments_and_says_the_words():
    pick = validate.argument(validate.choice, ["fp32", "amp"], words={"auto": None, "none": None})
    assert pick.check is validate.choice and pick.__name__ == "choice"
    assert pick("amp") == "amp" and pick("AUTO") is None
    with pytest.raises(argparse.ArgumentTypeError) as e:
        pick("fp8")
    assert str(e.value) == "must be one of 'fp32', 'amp'; got 'fp8' (or 'auto' or 'none')"
    on = validate.argument(validate.boolean)
    with pytest.raises(argparse.ArgumentTypeError, match="got 'maybe'$"):
        on("maybe")
    many = validate.argument(validate.count, many=True)
    with pytest.raises(argparse.ArgumentTypeError,
                       match="^must be a comma-separated list of one or more values, got ', ,'$"):
        many(", ,")
    with pytest.raises(TypeError, match=r"^check must be a function of \(name, value\), got 42$"):
        validate.argument(42)

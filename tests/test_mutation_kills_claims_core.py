"""fp16lab.claims.core: the autocast dtype a claim runs in, against what torch's autocast does
on the device (written against the survivors of a mutation run of claims/core.py, 53.8%), and
the formatting helpers, exactly (_brief, _note_label, _number, _outcome, _ratio,
verdict_of_parts, against a later run's survivors)."""

from __future__ import annotations

import math

import pytest
import torch

from fp16lab.claims import FAILS, HOLDS, PARTLY, core
from fp16lab.claims.core import (_NOTE_CHARS, _brief, _note_label, _number, _outcome, _ratio,
                                 verdict_of_parts)


def _autocast_makes_fp16(device: str) -> bool:
    try:
        with torch.autocast(device, dtype=torch.float16):
            return torch.mm(torch.ones(3, 4, device=device), torch.ones(4, 5, device=device)).dtype \
                == torch.float16
    except RuntimeError:
        return False


def test_the_claims_autocast_dtype_is_fp16_where_autocast_makes_fp16():
    # the oracle asks torch directly, with another op and other shapes
    want = torch.float16 if _autocast_makes_fp16("cpu") else torch.bfloat16
    assert core._autocast_dtype("cpu") == want
    # a device autocast does not run on: bfloat16, the claims' fallback
    assert core._autocast_dtype("meta") == torch.bfloat16
    assert core._autocast_dtype("no-such-device") == torch.bfloat16


def test_number_rounds_by_magnitude_at_its_edges():
    assert _number(9.87654) == "9.877" and _number(10.0) == "10.0" and _number(-10.0) == "-10.0"
    assert _number(10.04) == "10.0" and _number(9999.94) == "9999.9"
    assert _number(10000.0) == "1e+04" and _number(math.inf) == "inf"


def test_brief_pairs_notes_and_the_length_limit():
    short = "x" * _NOTE_CHARS           # at the limit: still a pair
    long = "y" * (_NOTE_CHARS + 1)      # above it: a note on its own line
    figures = {"flag": True, "none": None, "n": 3, "f": 1.23456, "s": short, "a_note": long,
               "b_note": long, "lst": [1, 2]}
    assert _brief(figures) == (f"flag=True, none=None, n=3, f=1.235, s={short}\n"
                               f"  note (a, b): {long}")
    assert _brief({"n": 1, "m": 2}, limit=7) == "n=1, m=2"[:7] + " ..."
    assert _brief({"n": 1, "m": 2}, limit=8) == "n=1, m=2"          # exactly at the limit
    assert _brief({"n": 1}) == "n=1" and _brief({}) == ""


def test_note_label_groups_keys_by_their_shared_suffix():
    assert _note_label(["fp32_gpm_note", "amp-fp16_gpm_note"]) == "gpm_note (fp32, amp-fp16)"
    assert _note_label(["a_x", "b_y"]) == "a_x, b_y"                # no shared suffix
    assert _note_label(["solo_note"]) == "solo_note"                # one key: its own name
    assert _note_label(["plain", "other"]) == "plain, other"        # no underscore
    assert _note_label(["a_note", "plain"]) == "a_note, plain"


def test_outcome_names_the_dtype_or_the_error():
    assert _outcome(lambda: torch.ones(1, dtype=torch.float16)) == "torch.float16"

    def fails(msg):
        def fn():
            raise ValueError(msg)
        return fn
    assert _outcome(fails("")) == "error: ValueError: "
    assert _outcome(fails("first line\nsecond")) == "error: ValueError: first line"
    assert _outcome(fails("m" * 200)) == "error: ValueError: " + "m" * 160


def test_ratio_and_verdict_of_parts():
    assert _ratio(3.0, 2.0) == 1.5 and _ratio(1.0, 0.0) == math.inf
    assert verdict_of_parts({"a": True, "b": True}, "f") == (HOLDS, "f")
    assert verdict_of_parts({"a": True, "b": False, "c": True}, "f") == (
        PARTLY, "only the a and c part. f")
    assert verdict_of_parts({"a": False}, "f") == (FAILS, "f")


@pytest.mark.parametrize("limit", [0, 1])
def test_brief_cut_keeps_the_marker(limit):
    assert _brief({"n": 1}, limit=limit).endswith(" ...")

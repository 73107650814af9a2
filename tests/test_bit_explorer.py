"""BitExplorer: set one widget from Python, check the others against numpy / ml_dtypes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp16lab.widgets import BitExplorer


def h16(x: float) -> str:
    return f"0x{int(np.float16(x).view(np.uint16)):04x}"


def shown_code(ex: BitExplorer) -> int:
    """The code the toggles spell, read off the buttons (most significant first)."""
    return int("".join("1" if b.value else "0" for b in ex.bit_buttons), 2)


def test_initial_state_is_one_in_fp16():
    ex = BitExplorer()
    assert len(ex.bit_buttons) == 16
    assert ex.hex_box.value == h16(1.0) == "0x3c00"
    assert float(ex.value_box.value) == 1.0
    assert shown_code(ex) == 0x3C00
    assert "normal" in ex.explanation.value and "0.0009765625" in ex.explanation.value


def test_toggling_sign_bit_gives_minus_one():
    ex = BitExplorer("fp16", 1.0)
    ex.button(15).value = True
    assert float(ex.value_box.value) == -1.0
    assert ex.hex_box.value == "0xbc00" == h16(-1.0)


def test_toggling_mantissa_bit_gives_next_number():
    ex = BitExplorer("fp16", 1.0)
    ex.button(0).value = True
    assert float(ex.value_box.value) == float(np.nextafter(np.float16(1), np.float16(2)))


def test_value_box_rounds_like_numpy():
    ex = BitExplorer("fp16")
    ex.value_box.value = "0.1"
    assert ex.hex_box.value == h16(0.1)
    assert shown_code(ex) == int(np.float16(0.1).view(np.uint16))
    assert float(ex.value_box.value) == float(np.float16(0.1))
    assert "rounding error" in ex.explanation.value


def test_hex_box_sets_bits_and_value():
    ex = BitExplorer("fp16")
    ex.hex_box.value = "0x0001"
    assert float(ex.value_box.value) == float(np.uint16(1).view(np.float16))
    assert "subnormal" in ex.explanation.value
    ex.hex_box.value = "7c00"  # without 0x
    assert ex.value_box.value == "inf"


def test_format_change_keeps_value_and_rebuilds_bits():
    ex = BitExplorer("fp16", 3.140625)
    ex.format_dropdown.value = "bf16"
    assert len(ex.bit_buttons) == 16
    want = np.float32(3.140625).astype(ml_dtypes.bfloat16)
    assert ex.hex_box.value == f"0x{int(want.view(np.uint16)):04x}"
    ex.format_dropdown.value = "fp8_e4m3"
    assert len(ex.bit_buttons) == 8
    want8 = np.float32(float(want)).astype(ml_dtypes.float8_e4m3fn)
    assert float(ex.value_box.value) == float(want8)
    assert ex.button(7).tooltip == "bit 7: sign"


@pytest.mark.parametrize("box,text,match", [
    ("value_box", "abc", "cannot read &#x27;abc&#x27; as a number"),
    ("hex_box", "0xfffff", "out of range for fp16"),
])
def test_bad_input_shows_error_and_keeps_state(box, text, match):
    ex = BitExplorer("fp16", 2.0)
    setattr(getattr(ex, box), "value", text)
    assert match in ex.explanation.value and "fp16lab-error" in ex.explanation.value
    assert shown_code(ex) == 0x4000


def test_colours_and_dom_classes():
    ex = BitExplorer("fp16")
    # read the synced state, what the browser receives, not Python attributes
    styles = {n: ex.button(n).get_state()["button_style"] for n in (15, 14, 10, 9, 0)}
    assert styles == {15: "danger", 14: "success", 10: "success", 9: "info", 0: "info"}
    assert "fp16lab-bit-0" in ex.button(0)._dom_classes
    assert "fp16lab-exponent" in ex.button(10)._dom_classes
    assert "fp16lab-mantissa" in ex.button(9)._dom_classes
    assert "fp16lab-value" in ex.value_box._dom_classes
    assert "fp16lab-hex" in ex.hex_box._dom_classes
    assert "fp16lab-explain" in ex.explanation._dom_classes
    assert "fp16lab-format" in ex.format_dropdown._dom_classes


def test_a_start_value_that_is_no_number_is_refused():
    for bad, error in (("abc", TypeError), (True, TypeError), (None, TypeError)):
        with pytest.raises(error, match="value must be a number"):
            BitExplorer("fp16", bad)
    assert BitExplorer("fp16", float("-inf")).hex_box.value == "0xfc00"

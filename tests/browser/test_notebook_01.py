"""Notebook 01 in the browser: the BitExplorer renders, and clicks and typing reach the kernel.

Expected bits, values and hex codes come from numpy's float16 (an independent oracle), the
class from the IEEE 754 rules applied to the oracle's code here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytestmark = pytest.mark.browser

FP16_BITS = 16


def fp16_code(x: float) -> int:
    """Returns numpy's float16 code of x (round to nearest even)."""
    return int(np.array(x, dtype=np.float16).view(np.uint16))


def fp16_value(code: int) -> float:
    """Returns the number numpy's float16 gives to a code."""
    return float(np.array(code, dtype=np.uint16).view(np.float16))


def fp16_class(code: int) -> str:
    """Returns the IEEE 754 class of an fp16 code: zero, subnormal, normal, inf or nan."""
    exponent, mantissa = (code >> 10) & 0x1F, code & 0x3FF
    if exponent == 0x1F:
        return "inf" if mantissa == 0 else "nan"
    if exponent == 0:
        return "zero" if mantissa == 0 else "subnormal"
    return "normal"


class Explorer:
    """The first BitExplorer on the page, read as a user reads it."""

    def __init__(self, page):
        self.page = page
        self.root = page.locator(".fp16lab-bit-explorer").first
        self.value_input = self.root.locator(".fp16lab-value input")
        self.hex_input = self.root.locator(".fp16lab-hex input")

    def bit(self, n: int):
        return self.root.locator(f"button.fp16lab-bit-{n}")

    def shown_bits(self) -> str:
        """Returns the bits shown on the toggles, most significant first."""
        return "".join(self.bit(n).inner_text().strip() for n in range(FP16_BITS - 1, -1, -1))

    def explanation(self) -> dict[str, str]:
        """Returns the explanation table as {label: text}."""
        return self.root.locator(".fp16lab-explain tr").evaluate_all(
            "rows => Object.fromEntries(rows.map(r => [r.querySelector('th').textContent.trim(),"
            " r.querySelector('td').textContent.trim()]))")

    def type_value(self, text: str) -> None:
        self.value_input.fill(text)
        self.value_input.press("Enter")

    def expect_code(self, code: int) -> None:
        """Waits until every part of the widget shows ``code``, then checks it against numpy."""
        from playwright.sync_api import expect

        expect(self.hex_input).to_have_value(f"0x{code:04x}")
        expect(self.value_input).to_have_value(repr(fp16_value(code)))
        for n in range(FP16_BITS):
            on = bool((code >> n) & 1)
            expect(self.bit(n)).to_have_text("1" if on else "0")
            # the toggle's pressed state, not only its label, follows the bit
            if on:
                expect(self.bit(n)).to_have_class(_has("mod-active"))
            else:
                expect(self.bit(n)).not_to_have_class(_has("mod-active"))
        table = self.explanation()
        assert table["hex"] == f"0x{code:04x}"
        assert table["class"] == fp16_class(code)
        assert table["bits (s|e|m)"].replace(" ", "") == f"{code:016b}"
        shown = float(table["value"])
        assert shown == fp16_value(code) or (math.isnan(shown) and math.isnan(fp16_value(code)))


def _has(css_class: str):
    import re

    return re.compile(rf"(^|\s){re.escape(css_class)}(\s|$)")


def test_bit_explorer_follows_clicks_and_typing(open_notebook, lab_executed):
    from playwright.sync_api import expect

    nb = open_notebook("01_")
    nb.run_all_without_errors(keep=lab_executed)
    ex = Explorer(nb.page)
    expect(ex.root).to_be_visible()
    ex.root.scroll_into_view_if_needed()
    cell = nb.cell_of(ex.root).locator(".jp-Cell-outputArea")
    if ex.root.locator(".fp16lab-format select").input_value() != "fp16":
        ex.root.locator(".fp16lab-format select").select_option("fp16")

    ex.type_value("1.0")  # a known start, whatever the notebook shows first
    ex.expect_code(fp16_code(1.0))
    # Sign, exponent and mantissa toggles are told apart by colour (all three are off here).
    colours = {n: ex.bit(n).evaluate("b => getComputedStyle(b).backgroundColor")
               for n in (15, 14, 0)}
    assert len(set(colours.values())) == 3, f"fields share a colour: {colours}"
    nb.shot("typed-1.0", cell)

    # Flip the sign bit: -1.0, still normal.
    ex.bit(15).click()
    ex.expect_code(fp16_code(-1.0))
    nb.shot("clicked-sign-bit", cell)

    # Type a number below the smallest normal (2**-14): it is stored as a subnormal.
    ex.type_value("1e-5")
    code = fp16_code(1e-5)
    assert fp16_class(code) == "subnormal"
    ex.expect_code(code)
    nb.shot("typed-1e-5-subnormal", cell)

    # Set the lowest exponent bit: the same mantissa becomes a normal number.
    ex.bit(10).click()
    ex.expect_code(code | 1 << 10)
    assert fp16_class(code | 1 << 10) == "normal"
    nb.shot("clicked-exponent-bit-normal", cell)

    # The largest finite fp16 has exponent 11110; one more exponent bit makes it NaN.
    ex.type_value("65504")
    ex.expect_code(fp16_code(65504.0))
    ex.bit(10).click()  # exponent 11110 -> 11111 with a non-zero mantissa: NaN
    ex.expect_code(fp16_code(65504.0) | 1 << 10)
    assert fp16_class(fp16_code(65504.0) | 1 << 10) == "nan"
    nb.shot("clicked-to-nan", cell)

"""BitExplorer: flip the bits of a floating-point number and watch its value change.

A format dropdown, one toggle per bit (sign red, exponent green, mantissa blue), a value box and
a hex box. Changing any of them updates the others and the explanation below (class, exact
value, ULP, neighbours), all computed by :mod:`fp16lab.bits`. Works in JupyterLab 4 with
ipywidgets 8. Widgets carry stable CSS classes (``fp16lab-bit-<n>`` with n counted from the
least significant bit, ``fp16lab-format``, ``fp16lab-value``, ``fp16lab-hex``,
``fp16lab-explain``) so browser tests can find them.
"""

from __future__ import annotations

import html

import ipywidgets as w

from .. import bits, validate
from ..formats import FORMATS, FormatInfo, format_info

#: Button colour per field, as ipywidgets 8 button styles (a ToggleButton has no free colour):
#: sign red, exponent green, mantissa blue.
FIELD_STYLES = {"sign": "danger", "exponent": "success", "mantissa": "info"}


def _field_of(bit: int, f: FormatInfo) -> str:
    """Returns which field bit number ``bit`` (0 = least significant) belongs to."""
    if bit == f.bits - 1:
        return "sign"
    return "exponent" if bit >= f.mantissa_bits else "mantissa"


class BitExplorer(w.VBox):
    """An ipywidgets panel that shows one number of a format bit by bit.

    Args:
        fmt: the format to start with ("fp16", "bf16", "e4m3", ...).
        value: the number to start with (rounded into the format); NaN and the infinities
            too, but not a string or a bool.

    Attributes:
        code: the current code (an int).
        format_dropdown, bit_buttons, value_box, hex_box, explanation: the widgets.
    """

    def __init__(self, fmt: str = "fp16", value: float = 1.0, **kwargs):
        self.fmt = format_info(fmt)
        self.code = bits.encode(float(validate.number("value", value, finite=False)), self.fmt)
        self._busy = False
        self.format_dropdown = w.Dropdown(options=list(FORMATS), value=self.fmt.name,
                                          description="format", tooltip="number format")
        self.format_dropdown.add_class("fp16lab-format")
        self.value_box = w.Text(description="value", continuous_update=False,
                                tooltip="a number: 1.5, -0.1, 1e-5, inf, nan")
        self.value_box.add_class("fp16lab-value")
        self.hex_box = w.Text(description="hex", continuous_update=False,
                              tooltip="the code in hex, as printf(\"%04x\", __half_as_ushort(x))")
        self.hex_box.add_class("fp16lab-hex")
        self.explanation = w.HTML()
        self.explanation.add_class("fp16lab-explain")
        self.bits_row = w.HBox(layout=w.Layout(flex_flow="row wrap"))
        self.bit_buttons: list[w.ToggleButton] = []
        self._build_buttons()
        self.format_dropdown.observe(self._on_format, names="value")
        self.value_box.observe(self._on_value, names="value")
        self.hex_box.observe(self._on_hex, names="value")
        super().__init__([self.format_dropdown, self.bits_row,
                          w.HBox([self.value_box, self.hex_box]), self.explanation], **kwargs)
        self.add_class("fp16lab-bit-explorer")
        self._show()

    # -- building -----------------------------------------------------------------------------
    def _build_buttons(self) -> None:
        f = self.fmt
        buttons = []
        for bit in range(f.bits - 1, -1, -1):  # most significant first, as written
            field = _field_of(bit, f)
            b = w.ToggleButton(value=False, description="0", tooltip=f"bit {bit}: {field}",
                               button_style=FIELD_STYLES[field],
                               layout=w.Layout(width="30px", padding="0px"))
            b.add_class(f"fp16lab-bit-{bit}")
            b.add_class(f"fp16lab-{field}")
            b.observe(self._on_bit, names="value")
            b.bit = bit
            buttons.append(b)
        self.bit_buttons = buttons
        self.bits_row.children = buttons

    def button(self, bit: int) -> w.ToggleButton:
        """Returns the toggle of bit number ``bit`` (0 = least significant)."""
        return self.bit_buttons[self.fmt.bits - 1 - bit]

    # -- events -------------------------------------------------------------------------------
    def _on_bit(self, change) -> None:
        if self._busy:
            return
        code = 0
        for b in self.bit_buttons:
            code |= int(b.value) << b.bit
        self.code = code
        self._show()

    def _on_value(self, change) -> None:
        if self._busy:
            return
        try:
            x = float(change["new"].strip())
        except ValueError:
            self._error(f"cannot read {change['new']!r} as a number; allowed: 1.5, -0.1, "
                        f"1e-5, inf, nan")
            return
        self.code = bits.encode(x, self.fmt)
        self._show(given=x)

    def _on_hex(self, change) -> None:
        if self._busy:
            return
        text = change["new"].strip()
        if text and not text.lower().startswith("0x"):
            text = "0x" + text
        try:
            self.code = bits.parse_code(text, self.fmt)
        except ValueError as e:
            self._error(str(e))
            return
        self._show()

    def _on_format(self, change) -> None:
        value = bits.decode(self.code, self.fmt)
        self.fmt = format_info(change["new"])
        self._busy = True
        try:
            self._build_buttons()
        finally:
            self._busy = False
        self.code = bits.encode(value, self.fmt)
        self._show(given=value)

    # -- display ------------------------------------------------------------------------------
    @property
    def value(self) -> float:
        """Returns the number the bits encode."""
        return bits.decode(self.code, self.fmt)

    def _show(self, given: float | None = None) -> None:
        """Sets every widget from ``self.code`` (and shows how ``given`` was rounded)."""
        self._busy = True
        try:
            for b in self.bit_buttons:
                on = bool((self.code >> b.bit) & 1)
                b.value = on
                b.description = "1" if on else "0"
            e = bits.explain(given if given is not None else bits.to_hex(self.code, self.fmt),
                             self.fmt)
            self.value_box.value = repr(e.value)
            self.hex_box.value = e.hex
            self.explanation.value = e._repr_html_()
        finally:
            self._busy = False

    def _error(self, message: str) -> None:
        self.explanation.value = (f"<p class='fp16lab-error' style='color:#b00'>"
                                  f"{html.escape(message)}</p>")

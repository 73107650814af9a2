"""Notebook 02 in the browser: dragging a ScalerPlayground slider redraws the scale plot.

The slider is dragged with the mouse, as a user would. The kernel must receive the new value
(the slider's readout and the summary change) and send back a new plot: a different PNG (by
its SHA-256 as the browser holds it), drawn at a real size.
"""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.browser

PLOT_DIGEST_JS = """async img => {
  const bytes = await (await fetch(img.src)).arrayBuffer();
  const digest = await crypto.subtle.digest('SHA-256', bytes);
  return [Array.from(new Uint8Array(digest)).map(b => b.toString(16).padStart(2, '0')).join(''),
          img.complete && img.naturalWidth, img.naturalHeight];
}"""


def _plot_state(plot) -> tuple[str, int, int]:
    """Returns the plot image's SHA-256, natural width and natural height as the page has them."""
    from playwright.sync_api import Error

    for attempt in range(3):
        try:
            plot.evaluate("img => img.decode ? img.decode() : null")
            digest, width, height = plot.evaluate(PLOT_DIGEST_JS)
            return digest, int(width or 0), int(height or 0)
        except Error:  # the widget revoked the blob URL we were reading: a new plot arrived
            if attempt == 2:
                raise
            plot.page.wait_for_timeout(200)
    raise AssertionError("unreachable")


def test_scaler_slider_redraws_the_plot(open_notebook, lab_executed):
    from playwright.sync_api import expect

    nb = open_notebook("02_")
    nb.run_all_without_errors(keep=lab_executed)
    page = nb.page
    playground = page.locator(".fp16lab-scaler-playground").first
    expect(playground).to_be_visible()
    playground.scroll_into_view_if_needed()
    cell = nb.cell_of(playground).locator(".jp-Cell-outputArea")
    slider = playground.locator(".fp16lab-slider-init-scale")
    handle = slider.locator(".noUi-handle")
    plot = playground.locator("img.fp16lab-scaler-plot")
    summary = playground.locator(".fp16lab-scaler-summary")
    expect(plot).to_be_visible()

    before_value = handle.get_attribute("aria-valuenow")
    before_plot = _plot_state(plot)
    before_summary = summary.inner_text()
    assert before_plot[1] > 100 and before_plot[2] > 100, f"no plot drawn: {before_plot}"
    nb.shot("before-drag", cell)

    # Drag the handle to 85 % of the track: a different init_scale whatever the start.
    track = slider.locator(".noUi-base").bounding_box()
    grip = handle.bounding_box()
    lo, hi = float(handle.get_attribute("aria-valuemin")), float(
        handle.get_attribute("aria-valuemax"))
    fraction = 0.85 if float(before_value) < lo + 0.6 * (hi - lo) else 0.15
    page.mouse.move(grip["x"] + grip["width"] / 2, grip["y"] + grip["height"] / 2)
    page.mouse.down()
    page.mouse.move(track["x"] + fraction * track["width"], grip["y"] + grip["height"] / 2,
                    steps=8)
    page.mouse.up()

    expect(handle).not_to_have_attribute("aria-valuenow", before_value)
    after_value = handle.get_attribute("aria-valuenow")
    expected = lo + fraction * (hi - lo)
    assert abs(float(after_value) - expected) <= 0.1 * (hi - lo), (after_value, expected)
    # The readout next to the slider shows the value the browser now holds.
    expect(slider.locator(".widget-readout")).to_have_text(
        re.compile(rf"^\s*{round(float(after_value))}\s*$"))

    # The kernel redraws: a new PNG arrives in the same image element.
    after_plot = _plot_state(plot)
    for _ in range(120):
        if after_plot[0] != before_plot[0]:
            break
        page.wait_for_timeout(250)
        after_plot = _plot_state(plot)
    assert after_plot[0] != before_plot[0], "the plot image did not change within 30 s"
    assert after_plot[1] > 100 and after_plot[2] > 100, f"plot not drawn: {after_plot}"
    summary.scroll_into_view_if_needed()
    nb.shot("after-drag-redrawn", cell)
    print(f"init_scale slider {before_value} -> {after_value}; summary "
          f"{before_summary!r} -> {summary.inner_text()!r}")

"""Notebook 04 in the browser: a tiny CPU sweep run from the SweepPanel's Run button.

The test picks the grid a user would pick for a quick look (one model, one batch size, two
layouts, two precisions, one repeat of two timed steps), presses Run, and checks what the
panel shows against that choice: the progress bar fills to exactly the number of
measurements (advancing one measurement at a time), the table has one row per chosen point,
and a plot image is drawn (hidden before the first result). The controls are found by their
``fp16lab-sweep-*`` DOM classes.
"""

from __future__ import annotations

import itertools
import re

import pytest

pytestmark = pytest.mark.browser

BATCH = "2"
LAYOUTS = ("nchw", "channels_last")
PRECISIONS = ("fp32", "amp-bf16")
SWEEP_TIMEOUT_MS = 240_000


def _control(panel, name: str):
    """Returns the <select> or <input> of the panel's control of DOM class fp16lab-sweep-<name>."""
    return panel.locator(f".fp16lab-sweep-{name}").locator("select, input").first


def test_sweep_panel_runs_a_tiny_cpu_sweep(open_notebook, lab_executed):
    from playwright.sync_api import expect

    nb = open_notebook("04_")
    nb.run_all_without_errors(keep=lab_executed)
    page = nb.page
    panel = page.locator(".fp16lab-sweep-panel").first
    expect(panel).to_be_visible()
    panel.scroll_into_view_if_needed()
    cell = nb.cell_of(panel).locator(".jp-Cell-outputArea")

    _control(panel, "model").select_option(label="small_cnn")
    _control(panel, "batches").select_option(label=[BATCH])
    _control(panel, "layouts").select_option(label=list(LAYOUTS))
    _control(panel, "precisions").select_option(
        label=list(PRECISIONS))
    for name, value in (("warmup", "1"), ("steps", "2"), ("repeats", "1")):
        box = _control(panel, name)
        box.fill(value)
        box.press("Enter")
        expect(box).to_have_value(value)
    nb.shot("chosen-tiny-grid", cell)

    # Before any result the plot is hidden (an empty image would show a broken-image icon).
    plot = panel.locator("img.fp16lab-sweep-plot")
    expect(plot).to_be_hidden()

    expected = {(BATCH, lay, prec) for lay, prec in itertools.product(LAYOUTS, PRECISIONS)}
    run = panel.locator(".fp16lab-sweep-run")
    expect(run).to_be_enabled()
    progress = panel.locator(".fp16lab-sweep-progress")
    status = panel.locator(".fp16lab-sweep-status")
    bar = progress.locator(".progress-bar")
    # Record every width the bar is drawn at (to see it advance point by point) and every
    # state of the Run button (a quick sweep can end between two looks at the page).
    bar.evaluate("""b => { window.fp16labBarWidths = [b.style.width];
        new MutationObserver(() => window.fp16labBarWidths.push(b.style.width))
          .observe(b, {attributes: true, attributeFilter: ['style']}); }""")
    run.evaluate("""r => { window.fp16labRunDisabled = [r.disabled];
        new MutationObserver(() => window.fp16labRunDisabled.push(r.disabled))
          .observe(r, {attributes: true, attributeFilter: ['disabled']}); }""")
    run.click()
    nb.shot("running", cell)

    expect(status).to_contain_text(re.compile(r"^done: \d+ rows"), timeout=SWEEP_TIMEOUT_MS)
    expect(run).to_be_enabled()
    # Run disabled itself while the sweep ran on the kernel's background thread.
    states = page.evaluate("window.fp16labRunDisabled")
    assert states[0] is False and True in states and states[-1] is False, states
    expect(bar).to_have_class(re.compile(r"(^|\s)progress-bar-success(\s|$)"))
    # ipywidgets draws the bar's width as value / max in percent: complete means 100%.
    width = bar.evaluate("b => b.style.width")
    assert width == "100%", f"progress bar is at {width}, not complete"
    widths = [float(x.rstrip("%")) for x in page.evaluate("window.fp16labBarWidths") if x]
    assert widths == sorted(widths), f"the bar went backwards: {widths}"
    n = len(expected)  # one repeat: one measurement per point
    for k in range(1, n + 1):
        assert any(abs(x - 100 * k / n) < 0.01 for x in widths), \
            f"the bar never showed {k}/{n} measurements done: {widths}"
    status_text = status.inner_text()
    assert f"done: {len(expected)} rows" in status_text, status_text

    table = panel.locator(".fp16lab-sweep-table table")
    expect(table).to_be_visible()
    header = [h.strip() for h in table.locator("thead th").all_inner_texts()]
    rows = [dict(zip(header, (c.strip() for c in r.locator("td").all_inner_texts())))
            for r in table.locator("tbody tr").all()]
    assert {(r["batch"], r["layout"], r["precision"]) for r in rows} == expected
    assert len(rows) == len(expected)
    assert all(r["model"] == "small_cnn" for r in rows)
    assert all(r["status"] == "ok" for r in rows), [r["status"] for r in rows]
    assert all(float(r["samples_per_s"].replace(",", "")) > 0 for r in rows)

    # The summary is wider than the output area: its box scrolls sideways, nothing is cut off.
    box = panel.locator(".fp16lab-sweep-table")
    assert box.evaluate("b => getComputedStyle(b).overflowX") == "auto"
    scroll_w, client_w = box.evaluate("b => [b.scrollWidth, b.clientWidth]")
    area_right = cell.evaluate("c => c.getBoundingClientRect().right")
    box_right = box.evaluate("b => b.getBoundingClientRect().right")
    assert box_right <= area_right + 1, f"the table box overflows the output area: {box_right}"
    assert scroll_w > client_w, f"the table fits ({scroll_w} <= {client_w}): nothing to scroll"
    # Scrolled to the end, the last column lies inside the box.
    left, right = box.evaluate("""b => { b.scrollLeft = b.scrollWidth;
        const r = b.getBoundingClientRect(); return [r.left, r.right]; }""")
    last = table.locator("thead th").last.evaluate("th => th.getBoundingClientRect().right")
    assert left < last <= right + 1, f"last column ends at {last}, box is {left}..{right}"

    expect(plot).to_be_visible()
    size = plot.evaluate("img => [img.complete, img.naturalWidth, img.naturalHeight]")
    assert size[0] and size[1] > 100 and size[2] > 100, f"plot image not drawn: {size}"
    nb.shot("sweep-done", cell)

"""Exercises in the browser: a learner answers one wrongly, then rightly, and asks for a solution.

Notebook 03's wave-counting exercise (q3): the test replaces the ``ex.q3.check(...)`` cell's
code as a learner types it, runs the cell with Shift+Enter and reads the feedback the page shows.
The right answer and the typical wrong one (the number of tiles) are computed here with
``math.ceil`` from the question's numbers, not taken from fp16lab.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.browser

BATCH, FEATURES, TILE, SMS = 2100, 4096, (256, 128), 132
TILES = math.ceil(BATCH / TILE[0]) * math.ceil(FEATURES / TILE[1])
WAVES = math.ceil(TILES / SMS)


def _exercise_cell(nb, code: str):
    """Returns the code cell whose source contains ``code``, pinned by its position (its source
    changes when the test types an answer)."""
    cells = nb.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell")
    sources = cells.locator(".cm-content").all_inner_texts()
    matching = [i for i, text in enumerate(sources) if code in text]
    assert len(matching) == 1, f"expected one cell with {code!r}, found {len(matching)}"
    cell = cells.nth(matching[0])
    cell.scroll_into_view_if_needed()
    return cell


def _type_and_run(nb, cell, source: str) -> None:
    """Replaces the cell's code with ``source`` by typing, then runs it with Shift+Enter."""
    cell.locator(".cm-content").click()
    nb.page.keyboard.press("Control+A")
    nb.page.keyboard.type(source)
    nb.page.keyboard.press("Shift+Enter")
    nb.wait_until(lambda s: s["kernel"] == "idle" and s["running"] == 0, "cell ran", 60)


def test_wrong_then_right_answer_shows_both_messages(open_notebook):
    from playwright.sync_api import expect

    nb = open_notebook("03_")
    nb.run_all_without_errors()
    cell = _exercise_cell(nb, "ex.q3.check(...)")
    output = cell.locator(".jp-Cell-outputArea")
    expect(output).to_contain_text("No answer yet (q3)")

    _type_and_run(nb, cell, f"ex.q3.check({TILES})")
    expect(output).to_contain_text("Not yet (q3)")
    expect(output).to_contain_text(f"{TILES} is the number of tiles")
    expect(output).not_to_contain_text("Correct")
    nb.shot("wrong-answer", cell)

    _type_and_run(nb, cell, f"ex.q3.check({WAVES})")
    expect(output).to_contain_text("Correct (q3)")
    expect(output).to_contain_text(f"{WAVES} waves: {TILES} tiles on {SMS} SMs")
    expect(output).not_to_contain_text("Not yet")
    nb.shot("right-answer", cell)
    nb.assert_no_errors()


def test_solution_is_shown_only_when_asked_for(open_notebook):
    from playwright.sync_api import expect

    nb = open_notebook("03_")
    nb.run_all_without_errors()
    page_text = nb.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
    expect(page_text).not_to_contain_text("Solution (q")  # nothing revealed by default

    cell = _exercise_cell(nb, "ex.q3.check(...)")
    _type_and_run(nb, cell, "ex.q3.solution()")
    output = cell.locator(".jp-Cell-outputArea")
    expect(output).to_contain_text("Solution (q3)")
    expect(output).to_contain_text(f"{WAVES} waves")
    expect(output).to_contain_text("waves.wave_count(waves.tile_count(2100, 4096, 256, 128), 132)")
    nb.shot("solution", cell)
    nb.assert_no_errors()

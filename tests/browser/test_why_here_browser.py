""" "Why here?" in Debian's Chromium: a click on a cell of the Heads page's head heatmap opens
the panel on that cell (Streamlit's plotly selection of a heatmap point names its row and
column categories)."""

from __future__ import annotations

import pytest

from bench.browser import PAGE_PLOTS, streamlit_server, wait_for_app

pytestmark = pytest.mark.browser
TEXT = "ro+te+mi+bu+gu+ka+be+pa+ku+pi+ro+te+mi+bu+gu+ka"


@pytest.fixture(scope="module")
def app_url():
    with streamlit_server() as url:
        yield url


def _click_cell(page, tokens: int, query: int, key: int, head: str) -> None:
    """Click cell (query, key) of the page's head map (its markers go row by row:
    ``plots.clickable_cells``) and wait for the Why here? figure of ``head``."""
    marker = page.locator(".js-plotly-plot >> nth=1 >> .scatterlayer .point")
    marker = marker.nth(query * tokens + key)
    marker.scroll_into_view_if_needed()
    box = marker.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
        f".some(e => e.textContent.startsWith('{head}: the largest terms'))",
        timeout=90_000,
    )


def test_a_click_on_a_cell_opens_why_here_there(app_url, page) -> None:
    page.goto(f"{app_url}/Heads?model=toy:induction&text={TEXT}&layer=1&head=3")
    wait_for_app(page, plots=PAGE_PLOTS["Heads"])
    _click_cell(page, 17, 15, 6, "L1H3")  # [BOS] and 16 syllables
    sentence = page.get_by_text("L1H3 from 15:").first.text_content()
    assert "to 6: 'ka'" in sentence or "to 6: 'be'" in sentence
    assert "K-composition with L0H" in sentence
    assert page.locator("[data-testid='stException']").count() == 0


def test_why_here_on_the_default_model_splits_a_clicked_cell(app_url, page) -> None:
    """MiniLM (a post-norm encoder): a click on cell (3, 8), a key after the query, opens the
    split there."""
    text = "The+cat+sat+on+the+mat+because+it+was+warm."
    page.goto(f"{app_url}/Heads?text={text}&layer=5&head=7")
    wait_for_app(page, plots=PAGE_PLOTS["Heads"])
    _click_cell(page, 13, 3, 8, "L5H7")  # [CLS], 11 words and the full stop, [SEP]
    sentence = page.get_by_text("L5H7 from 3:").first.text_content()
    assert "to 8: 'it'" in sentence and "Its largest term" in sentence
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("[data-testid='stAlert']").filter(has_text="pre-norm decoder").count() == 0

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


def test_a_click_on_a_cell_opens_why_here_there(app_url, page) -> None:
    page.goto(f"{app_url}/Heads?model=toy:induction&text={TEXT}&layer=1&head=3")
    wait_for_app(page, plots=PAGE_PLOTS["Heads"])
    tokens = 17  # [BOS] and 16 syllables: the markers go row by row (plots.clickable_cells)
    marker = page.locator(".js-plotly-plot >> nth=1 >> .scatterlayer .point").nth(15 * tokens + 6)
    marker.scroll_into_view_if_needed()
    box = marker.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
        ".some(e => e.textContent.startsWith('L1H3: the largest terms'))",
        timeout=90_000,
    )
    sentence = page.get_by_text("L1H3 from 15:").first.text_content()
    assert "to 6: 'ka'" in sentence or "to 6: 'be'" in sentence
    assert "K-composition with L0H" in sentence
    assert page.locator("[data-testid='stException']").count() == 0

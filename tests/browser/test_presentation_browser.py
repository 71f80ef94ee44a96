"""Presentation mode in Debian's Chromium at 1600 px: the computed sizes of every figure's tick
labels, axis titles and colour bars, the captions and the sidebar are at least 20 px; long
button labels wrap instead of being cut."""

from __future__ import annotations

import pytest

from bench.browser import wait_for_app

pytestmark = pytest.mark.browser

#: where each measured text is, as CSS selectors of the rendered page
PLACES = {
    "heatmap tick labels": ".js-plotly-plot .xtick text, .js-plotly-plot .ytick text",
    "axis titles": ".js-plotly-plot .g-xtitle text, .js-plotly-plot .g-ytitle text",
    "colour bars": ".js-plotly-plot .cbaxis text, .js-plotly-plot .cbtitle text",
    "figure titles": ".js-plotly-plot .gtitle",
    "captions": "[data-testid='stCaptionContainer']",
    "sidebar labels": "[data-testid='stSidebar'] label p",
}

SIZES = """(selector) => [...document.querySelectorAll(selector)]
    .filter(e => e.getClientRects().length)
    .map(e => parseFloat(getComputedStyle(e).fontSize))"""


@pytest.fixture
def wide(browser):
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = context.new_page()
    yield page
    context.close()


def test_presentation_mode_makes_every_text_20_px_or_more(app_url, wide) -> None:
    wide.goto(f"{app_url}/Heads?presentation=1")
    wait_for_app(wide, plots=3)
    measured = {name: wide.evaluate(SIZES, selector) for name, selector in PLACES.items()}
    for name, sizes in measured.items():
        assert sizes, f"nothing measured for {name}"
        assert min(sizes) >= 20, (name, sorted(set(sizes)))


def test_without_presentation_mode_figures_keep_their_size(app_url, wide) -> None:
    """The measurement can fail: without the mode the tick labels are smaller."""
    wide.goto(f"{app_url}/Heads")
    wait_for_app(wide, plots=3)
    ticks = wide.evaluate(SIZES, PLACES["heatmap tick labels"])
    assert ticks and max(ticks) < 20


def test_long_button_labels_wrap_in_presentation_mode(app_url, wide) -> None:
    wide.goto(f"{app_url}/Head_roles?presentation=1")
    wait_for_app(wide, plots=3)
    button = wide.get_by_role("button", name="Repeat random tokens (induction test)")
    clipped = button.evaluate(
        "b => [...b.querySelectorAll('p')].some(p => p.scrollWidth > p.clientWidth + 1)"
    )
    assert not clipped


def test_presentation_mode_enlarges_the_data_tables(app_url, wide) -> None:
    """Head statistics' table: a canvas grid of 14 px text without the mode; with it, an HTML
    table whose cells are 20 px or more."""
    wide.goto(f"{app_url}/Head_statistics?presentation=1")
    wait_for_app(wide, plots=1)
    cells = wide.evaluate(SIZES, "[data-testid='stTable'] td, [data-testid='stTable'] th")
    assert cells and min(cells) >= 20, sorted(set(cells))
    wide.goto(f"{app_url}/Head_statistics")
    wait_for_app(wide, plots=1)
    assert wide.evaluate(SIZES, "[data-testid='stTable'] td") == []  # the canvas grid there

"""The real app in Debian's Chromium: every page, typing, the rendered labels, clicking a head.

Screenshots land in docs/ (one per page), the ones the README shows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.browser import PAGE_PLOTS, PAGES, chromium, streamlit_server, tick_labels, wait_for_app

pytestmark = pytest.mark.browser
DOCS = Path(__file__).resolve().parents[2] / "docs"
CAT = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]


@pytest.fixture(scope="module")
def app_url():
    with streamlit_server() as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    context.close()
    assert not errors, errors


@pytest.mark.parametrize("name", list(PAGES))
def test_each_page_renders_and_is_screenshot(app_url, page, name) -> None:
    page.goto(f"{app_url}/{PAGES[name]}")
    wait_for_app(page, plots=PAGE_PLOTS[name])
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("[data-testid='stAlertContentError']").count() == 0
    assert page.locator("h1").first.inner_text().strip() != ""
    if name in ("Heads", "Rollout", "Compare"):
        assert tick_labels(page, 1 if name == "Heads" else 0) == CAT
    if name == "Overview":
        page.get_by_text("max positions").wait_for()
    DOCS.mkdir(exist_ok=True)
    page.screenshot(path=str(DOCS / f"{PAGES[name] or 'Overview'}.png"), full_page=False)


def test_typing_a_sentence_updates_the_heatmaps(app_url, page) -> None:
    page.goto(f"{app_url}/Heads")
    wait_for_app(page, plots=3)
    box = page.get_by_role("textbox", name="Sentence")
    box.fill("Dogs <b>bark</b> loudly.")
    box.press("Control+Enter")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot')[1].querySelectorAll('.xtick text')]"
        ".some(e => e.textContent === 'bark')",
        timeout=60_000,
    )
    wait_for_app(page, plots=3)
    labels = tick_labels(page, 1)
    assert labels[:4] == ["[CLS]", "dogs", "<", "b"]  # tags shown as literal characters
    assert "bark" in labels and labels[-1] == "[SEP]"
    assert page.locator(".js-plotly-plot b").count() == 0  # no <b> element was created
    assert "text=Dogs" in page.url


def test_clicking_a_head_in_the_grid_enlarges_it(app_url, page) -> None:
    page.goto(f"{app_url}/Heads")
    wait_for_app(page, plots=3)
    layer, head = 2, 5
    point = page.locator(".js-plotly-plot >> nth=0 >> .scatterlayer .point").nth(layer * 12 + head)
    box = point.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function(
        "() => document.querySelectorAll('.js-plotly-plot')[1]?.querySelector('.gtitle')"
        f"?.textContent === 'Layer {layer}, head {head}'",
        timeout=60_000,
    )
    assert re.search(r"layer=2", page.url) and re.search(r"head=5", page.url)
    page.screenshot(path=str(DOCS / "Heads-selected.png"))


def test_shared_link_reopens_the_same_view(app_url, page) -> None:
    page.goto(f"{app_url}/Heads?layer=4&head=9&text=A+shared+link.")
    wait_for_app(page, plots=3)
    title = page.locator(".js-plotly-plot >> nth=1 >> .gtitle").text_content()
    assert title == "Layer 4, head 9"
    assert tick_labels(page, 1) == ["[CLS]", "a", "shared", "link", ".", "[SEP]"]

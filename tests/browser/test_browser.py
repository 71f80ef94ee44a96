"""The real app in Debian's Chromium: every page, typing, the rendered labels, clicking a head,
hostile links.

Screenshots go to a temporary folder; ``scripts/screenshots.sh`` sets ``MHSA_SCREENSHOTS=docs``
to refresh the ones the README shows (the tests never touch tracked files).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from urllib.parse import quote

import pytest

from bench.browser import PAGE_PLOTS, PAGES, chromium, streamlit_server, tick_labels, wait_for_app

pytestmark = pytest.mark.browser
DOCS = Path(os.environ.get("MHSA_SCREENSHOTS") or tempfile.mkdtemp(prefix="mhsa-shots-"))
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
    shot = DOCS / f"{PAGES[name] or 'Overview'}.png"
    page.screenshot(path=str(shot), full_page=False)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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


HOSTILE_LINK = {
    "text": "<img src=x onerror=alert(1)> [Sign in](https://example.org/phish)",
    "layer": "[Sign in](https://example.org/phish)",
    "head": "<b>9</b>",
    "model": "[Sign in](https://example.org/phish)",
    "engine": "<script>alert(1)</script>",
    "source": "x",
    "step": "1e309",
    "metric": "**x**",
    "k": "NaN",
}


@pytest.mark.parametrize("name", list(PAGES))
def test_hostile_link_shows_no_error_screen_and_no_markup_from_the_url(app_url, page, name) -> None:
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in HOSTILE_LINK.items())
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(f"{app_url}/{PAGES[name]}?{query}")
    wait_for_app(page, plots=PAGE_PLOTS[name])
    assert page.locator("[data-testid='stException']").count() == 0
    main = page.locator("[data-testid='stMain']")
    assert main.locator("a[href*='example.org']").count() == 0  # no link from the URL
    assert page.locator("img[src='x']").count() == 0 and not dialogs  # no element, no script
    assert page.locator("a[href*='example.org']").count() == 0
    # the link's text is shown literally where it is shown (the notices), word joiners aside
    if name == "Heads":
        shown = main.inner_text().replace("\u2060", "")
        assert "layer='[Sign in](https://example.org/phish)' ignored" in shown

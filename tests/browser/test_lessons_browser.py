"""Every lesson step in Debian's Chromium (issue 38, "Done when"): each step's link from
``ui.lessons`` opens its page with no exception, no error box and no ``[UNK]`` among the
figures' token labels (every lesson names the default or a toy model, each with an example of
its own), and the Overview's own address with parameters opens the Overview. One server for
the module (``conftest.app_url``); the steps share their models, loaded once."""

from __future__ import annotations

import pytest

from bench.browser import PAGE_PLOTS, PAGES, wait_for_app
from ui.lessons import LESSONS, step_link

pytestmark = pytest.mark.browser

STEPS = [(lesson, step) for lesson in LESSONS for step in lesson.steps]
IDS = [
    f"{lesson.title}-{i}-{step.page}" for lesson in LESSONS for i, step in enumerate(lesson.steps)
]
TITLE = {path: title for title, path in PAGES.items()}

#: every text the figures rendered: tick labels, and the line view's tokens (scatter text)
TEXTS = """() => [...document.querySelectorAll('.js-plotly-plot .xtick text,'
    + ' .js-plotly-plot .ytick text, .js-plotly-plot .textpoint text')]
    .map(e => e.textContent)"""


def _settle(page, plots: int) -> None:
    """The run finished and, where the page draws figures, at least one drawn."""
    wait_for_app(page, plots=min(1, plots), timeout_ms=120_000)
    page.wait_for_timeout(300)  # a rerun the first run asked for (a switched example) starts
    wait_for_app(page, plots=min(1, plots), timeout_ms=120_000)


@pytest.mark.parametrize(
    ("lesson", "step"),
    STEPS,
    ids=IDS,
)
def test_each_lesson_step_opens_its_page_whole(app_url, page, lesson, step) -> None:
    page.goto(f"{app_url}/{step_link(step)}")
    plots = PAGE_PLOTS[TITLE[step.page]]
    _settle(page, plots)
    body = page.locator("[data-testid='stMain']").inner_text()
    assert "Page not found" not in body
    assert page.locator("[data-testid='stException']").count() == 0, body[:500]
    assert page.locator("[data-testid='stAlertContentError']").count() == 0, body[:500]
    if plots:
        texts = page.evaluate(TEXTS)
        assert texts, "no labels were rendered"
        assert not [t for t in texts if "[UNK]" in t], (step.page, step.settings)


def test_the_overview_opens_at_its_own_address_with_parameters(app_url, page) -> None:
    page.goto(f"{app_url}/Overview?model=toy:induction")
    _settle(page, 0)
    body = page.locator("[data-testid='stMain']").inner_text()
    assert "Page not found" not in body
    assert page.locator("[data-testid='stMain'] h1").first.inner_text() == "MHSA Explorer"
    for section in ("Pages, in a good order for a first visit", "Tokens as the model sees them"):
        assert section in body  # the Overview's own sections, with the model loaded
    assert page.locator("[data-testid='stException']").count() == 0

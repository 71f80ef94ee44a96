"""The Information flow page in Debian's Chromium: on the default encoder it says which models
apply, and its button opens the toy induction model, whose route, attribution and logit lens
are drawn."""

from __future__ import annotations

import pytest

from bench.browser import wait_for_link
from tests.browser.steps import titles_after_click

pytestmark = pytest.mark.browser


def test_the_switch_to_the_toy_model_draws_the_flow(app_url, page) -> None:
    page.goto(f"{app_url}/Information_flow")
    button = page.get_by_role("button", name="Open toy:induction with a repeat to continue")
    button.wait_for(timeout=120_000)
    assert page.get_by_text("causal language model with pre-norm layers").count() == 1
    titles = titles_after_click(page, button, plots=3, timeout_ms=120_000)
    assert titles[0].startswith("Information flow to the last token")
    assert titles[1].startswith("Direct logit attribution of logit(di) − logit(lu)")
    assert titles[2].startswith("Logit lens")
    # the route is painted: edge lines in the first figure, the lens's top tokens written
    lines = page.eval_on_selector_all(
        ".js-plotly-plot >> nth=0 >> .scatterlayer .js-line", "els => els.length"
    )
    assert lines >= 3
    written = page.eval_on_selector_all(
        ".js-plotly-plot >> nth=2 >> .heatmaplayer text", "els => els.map(e => e.textContent)"
    )
    assert "di" in written
    wait_for_link(page, "model=toy%3Ainduction", "answer=di")

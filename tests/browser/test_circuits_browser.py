"""The Circuits page in Debian's Chromium: on the default encoder (MiniLM) it draws the circuit
of the embedding target; its toy:induction example draws the circuit and the faithfulness curve,
and a click on an edge path-patches it."""

from __future__ import annotations

import pytest

from bench.browser import wait_for_app, wait_for_link
from tests.browser.steps import chart_titles

pytestmark = pytest.mark.browser


def test_the_toy_induction_example_draws_the_circuit_and_patches_a_clicked_edge(
    app_url, page
) -> None:
    page.goto(f"{app_url}/Circuits")
    button = page.get_by_role("button", name="toy:induction (a repeat, and the repeat broken)")
    button.wait_for(timeout=120_000)
    page.wait_for_function(  # MiniLM, the embedding target: the circuit and the curve
        "() => document.querySelectorAll('.js-plotly-plot').length >= 2", timeout=180_000
    )
    assert page.get_by_text("to the clean run's (1 for the clean run)").count() >= 1
    # the MiniLM charts already count 2: wait for the toy example's own caption first
    button.click()
    page.get_by_text("Head roles names").wait_for(timeout=180_000)
    wait_for_app(page, plots=2, timeout_ms=180_000)
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("[data-testid='stAlertContentError']").count() == 0
    titles = chart_titles(page)
    assert titles[0].startswith("Circuit: the top 20 edges")
    assert titles[1].startswith("Faithfulness of the top-n edges (CPR")
    lines = page.eval_on_selector_all(
        ".js-plotly-plot >> nth=0 >> .scatterlayer .js-line", "els => els.length"
    )
    assert lines >= 20  # one line per edge
    labels = page.eval_on_selector_all(
        ".js-plotly-plot >> nth=0 >> .scatterlayer text", "els => els.map(e => e.textContent)"
    )
    assert "k" in labels and "L1H3" in labels
    wait_for_link(page, "model=toy%3Ainduction", "answer=lo")
    # a click on an edge's label point path-patches that edge
    point = page.locator(".js-plotly-plot >> nth=0 >> .scatterlayer .trace.scatter .point").first
    point.click(force=True)
    patched = page.get_by_text("m goes from")
    patched.wait_for(timeout=120_000)
    assert "an exact score of" in patched.text_content()
    assert page.locator("[data-testid='stAlertContentError']").count() == 0

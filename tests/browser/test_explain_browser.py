"""A head explained by a program, in Debian's Chromium: the Head atlas page on toy:induction
leads with the head's explanation, and a hypothesis typed into its box is scored (its IoU and
accuracy on the atlas's held-out texts shown beside the explanation's)."""

from __future__ import annotations

from pathlib import Path

import pytest

import mhsa
import mhsa.explain
from bench.browser import streamlit_server, wait_for_app

pytestmark = pytest.mark.browser
#: the explanation's two heatmaps, the map of every head, the example and three histograms
PLOTS = 7


@pytest.fixture(scope="module")
def app_url(explained_toy_atlas):
    with streamlit_server(env={"MHSA_ATLAS_DIR": explained_toy_atlas}) as url:
        yield url


def _metric_values(page, label: str, at_least: int = 1) -> list[str]:
    """The values of every metric called ``label``, in the page's order, once ``at_least`` of
    them are drawn (a rerun writes the page's elements one by one: the figures may be there
    before the metrics below them)."""
    metrics = page.locator("[data-testid='stMetric']").filter(has_text=label)
    metrics.nth(at_least - 1).locator("[data-testid='stMetricValue']").wait_for(timeout=30_000)
    return [m.locator("[data-testid='stMetricValue']").inner_text().strip() for m in metrics.all()]


def test_the_head_atlas_explains_a_head_and_scores_a_typed_hypothesis(
    app_url, page, explained_toy_atlas, tmp_path
) -> None:
    atlas = mhsa.atlas.open_atlas(Path(explained_toy_atlas) / "toy-induction")
    row = mhsa.explain.saved(atlas).table.set_index("head").loc["L0H3"]
    page.goto(f"{app_url}/Head_atlas?model=toy:induction&atlas=toy-induction&atlas_head=L0H3")
    wait_for_app(page, plots=PLOTS, timeout_ms=120_000)
    page.screenshot(path=str(tmp_path / "explain-lead.png"), full_page=False)
    assert page.locator("[data-testid='stException']").count() == 0
    main = page.locator("[data-testid='stMain']")
    main.get_by_text("What L0H3 does").wait_for(timeout=30_000)
    assert main.get_by_text(f"L0H3: {row['description']}").count() >= 1
    assert _metric_values(page, "IoU") == [f"{row['iou']:.2f}"]
    assert main.locator("[data-testid='stCode']").first.inner_text().strip() == row["program"]

    box = page.get_by_label("Program", exact=True)
    box.fill("offset(-2)")
    box.press("Enter")
    page.wait_for_function(
        "() => document.querySelectorAll(\"[data-testid='stMetric']\").length >= 8",
        timeout=60_000,
    )
    wait_for_app(page, plots=PLOTS)
    scored = mhsa.explain.score_program(atlas, "L0H3", "offset(-2)")
    ious = _metric_values(page, "IoU", at_least=2)
    assert ious == [f"{row['iou']:.2f}", f"{scored['iou']:.2f}"]
    assert _metric_values(page, "Accuracy", at_least=2)[1] == f"{scored['accuracy']:.2f}"
    scores = page.locator("[data-testid='stMetric']").nth(4)  # the hypothesis's IoU
    scores.evaluate("e => e.scrollIntoView({block: 'center'})")
    page.screenshot(path=str(tmp_path / "explain-hypothesis.png"), full_page=False)
    page.locator(".js-plotly-plot").nth(2).scroll_into_view_if_needed()
    page.screenshot(path=str(tmp_path / "explain-map.png"), full_page=False)

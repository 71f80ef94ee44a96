"""The Patching page in Debian's Chromium: the toy induction example's maps drawn and carried
by the link."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.browser import PAGE_PLOTS, wait_for_app, wait_for_link

pytestmark = pytest.mark.browser
TOY = Path(__file__).resolve().parents[2] / "data" / "toy" / "induction"
MAPS = "Effect of patching each head (1 = restores)"


@pytest.mark.skipif(not TOY.is_dir(), reason="the toy induction model is not in this checkout")
def test_toy_example_draws_exact_and_attribution_maps(app_url, page) -> None:
    page.goto(f"{app_url}/Patching")
    wait_for_app(page, plots=PAGE_PLOTS["Patching"])
    page.get_by_role(
        "button", name="Example on toy:induction (a repeat, and the repeat broken)"
    ).click()
    page.wait_for_function("() => location.search.includes('answer=fu')", timeout=60_000)
    wait_for_app(page, plots=PAGE_PLOTS["Patching"])
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("[data-testid='stAlertContentError']").count() == 0
    maps = page.evaluate(
        "(title) => { const p = [...document.querySelectorAll('.js-plotly-plot')].find(d =>"
        " d.layout.title && d.layout.title.text.includes(title));"
        " return p._fullData.map(t => Array.from(t.z, row => Array.from(row))); }",
        MAPS,
    )
    assert len(maps) == 2  # exact and attribution, side by side
    exact = maps[0]
    assert len(exact) == 2 and all(len(row) == 4 for row in exact)  # 2 layers x 4 heads
    assert max(max(row) for row in exact) > 0.3  # a head restores much of the answer
    ticks = page.eval_on_selector_all(
        ".js-plotly-plot .xtick text", "els => els.map(e => e.textContent)"
    )
    assert "di → ra" in ticks  # the per-position view names the swapped symbol
    wait_for_link(page, ("model=toy%3Ainduction", "model=toy:induction"))

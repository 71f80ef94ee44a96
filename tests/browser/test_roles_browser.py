"""The Head roles page in Debian's Chromium: its figures drawn, and the repeated-random-tokens
button finding the toy model's induction head."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from bench.browser import PAGE_PLOTS, streamlit_server, wait_for_app, wait_for_link

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "data" / "toy" / "induction"


@pytest.fixture(scope="module")
def app_url():
    with streamlit_server(env={"MHSA_ALLOWED_MODELS": str(TOY)}) as url:
        yield url


def titles(page) -> list[str]:
    return page.eval_on_selector_all(
        ".js-plotly-plot .gtitle", "els => els.map(e => e.textContent)"
    )


def panels(page) -> list[str]:
    """The panel titles of the page's figures (subplot titles are annotations)."""
    return page.eval_on_selector_all(
        ".js-plotly-plot .annotation-text", "els => els.map(e => e.textContent)"
    )


def test_head_roles_page_draws_its_figures(app_url, page) -> None:
    page.goto(f"{app_url}/Head_roles")
    wait_for_app(page, plots=PAGE_PLOTS["Head roles"])
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("[data-testid='stAlertContentError']").count() == 0
    drawn = titles(page)
    assert drawn[0] == "Detection scores (error measure mul)"
    assert panels(page)[:3] == ["Previous token score", "Duplicate token score", "Induction score"]
    assert "Detection pattern: previous token" in drawn
    assert sum(t.endswith("earlier one") for t in drawn) == 3  # Q, K, V composition
    cells = page.eval_on_selector_all(
        ".js-plotly-plot >> nth=0 >> .heatmaplayer image", "els => els.length"
    )
    assert cells == 3  # the three maps are painted, not only their frames


@pytest.mark.skipif(not TOY.is_dir(), reason="the toy induction model is not in this checkout")
def test_repeat_random_tokens_finds_the_toy_induction_head(app_url, page) -> None:
    page.goto(f"{app_url}/Head_roles?model={quote(str(TOY), safe='')}&text=ba+be+bi+bo")
    wait_for_app(page, plots=PAGE_PLOTS["Head roles"])
    page.get_by_role("button", name="Repeat random tokens (induction test)").click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot .annotation-text')]"
        ".some(e => e.textContent === 'Induction score, repeated random tokens')",
        timeout=60_000,
    )
    wait_for_app(page, plots=PAGE_PLOTS["Head roles"])
    z = page.evaluate(
        "() => { const name = 'Induction score, repeated random tokens';"
        " const p = [...document.querySelectorAll('.js-plotly-plot')].find(d =>"
        " (d.layout.annotations || []).some(a => a.text === name));"
        " const i = p.layout.annotations.findIndex(a => a.text === name);"
        " return Array.from(p._fullData[i].z, row => Array.from(row)); }"
    )
    assert len(z) == 2 and max(z[1]) > 0.5 and max(z[0]) < 0.5
    wait_for_link(page, "random_tokens=1")

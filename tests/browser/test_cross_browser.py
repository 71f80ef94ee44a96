"""An encoder-decoder's cross attention in Debian's Chromium: the Line view with the decoder's
tokens on the left and the encoder's on the right, and the sidebar's choice of attention."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from bench.browser import PAGE_PLOTS, streamlit_server, wait_for_app, wait_for_link

pytestmark = pytest.mark.browser

#: the teacher-forced decoder input: the start token [PAD], then the target shifted right
DECODER = ["[PAD]", "[CLS]", "le", "chat"]
ENCODER = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]


@pytest.fixture(scope="module")
def app_url(tiny_bart_path: str):
    with streamlit_server(env={"MHSA_ALLOWED_MODELS": tiny_bart_path}) as url:
        yield url


def _columns(page) -> list[list[str]]:
    """The texts of the line view's two token columns, as drawn (left, then right)."""
    return page.evaluate(
        "() => { const p = document.querySelector('.js-plotly-plot');"
        " return [0, 1].map(i => Array.from(p._fullData[i].text)); }"
    )


def test_cross_line_view_draws_decoder_left_and_encoder_right(
    app_url, page, tiny_bart_path: str
) -> None:
    model = quote(tiny_bart_path, safe="")
    page.goto(f"{app_url}/Line_view?model={model}&target_text=le+chat&kind=cross")
    wait_for_app(page, plots=PAGE_PLOTS["Line view"])
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("[data-testid='stAlertContentError']").count() == 0
    assert _columns(page) == [DECODER, ENCODER]
    title = page.eval_on_selector(".js-plotly-plot .gtitle", "e => e.textContent")
    assert title.startswith("Layer 0, cross attention")
    # the drawn texts: the decoder's at the left of the plot, the encoder's at its right
    lefts = page.eval_on_selector_all(
        ".js-plotly-plot .scatterlayer .trace:nth-child(1) text",
        "els => els.map(e => e.getBoundingClientRect().x)",
    )
    rights = page.eval_on_selector_all(
        ".js-plotly-plot .scatterlayer .trace:nth-child(2) text",
        "els => els.map(e => e.getBoundingClientRect().x)",
    )
    assert len(lefts) == 4 and len(rights) == 9 and max(lefts) < min(rights)
    page.get_by_text("decoder (causal self-attention over the target)").click()
    page.wait_for_function(
        "() => { const p = document.querySelector('.js-plotly-plot');"
        " return p && p._fullData && p._fullData[1].text.length === 4; }",
        timeout=60_000,
    )
    assert _columns(page) == [DECODER, DECODER]
    wait_for_link(page, "kind=decoder")

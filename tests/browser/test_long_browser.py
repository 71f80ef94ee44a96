"""A long input in Debian's Chromium (issue 41): the Heads page on a 700-token text with a
selection of layers and heads draws without an error, every heatmap within the cell budget
(512 a side: the overview block-averaged, the zoom window exact).

The embedded default model reads at most 512 positions, so the text would be cut there: the
model here is a tiny BERT with the default model's tokens and 1024 positions."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from bench.browser import PAGE_PLOTS, streamlit_server, wait_for_app
from tests.tiny import save_tiny, tiny_bert

pytestmark = pytest.mark.browser
WORDS = 700


@pytest.fixture(scope="module")
def long_bert(tmp_path_factory: pytest.TempPathFactory) -> str:
    import torch

    torch.manual_seed(0)
    model = tiny_bert(layers=6, positions=1024).eval()
    return save_tiny(tmp_path_factory.mktemp("long-bert"), model)


@pytest.fixture(scope="module")
def app_url(long_bert):
    with streamlit_server(env={"MHSA_ALLOWED_MODELS": long_bert}) as url:
        yield url


def test_heads_page_on_a_700_token_text_stays_within_the_cell_budget(
    app_url, page, long_bert
) -> None:
    text = " ".join(["cat", "dog", "sat", "ran", "mat", "log", "sun"] * (WORDS // 7))
    query = {
        "model": long_bert,
        "text": text,
        "long_layers": "5",
        "long_heads": "0-3",
        "layer": "5",
        "head": "2",
        "zoom": "150",
    }
    page.goto(f"{app_url}/Heads?{urlencode(query)}")
    wait_for_app(page, plots=PAGE_PLOTS["Heads"] + 1, timeout_ms=60_000)  # and the zoom
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("[data-testid='stAlertContentError']").count() == 0
    sizes = page.eval_on_selector_all(
        ".js-plotly-plot",
        """els => els.flatMap(el => (el.data || []).filter(t => t.type === 'heatmap').map(t => {
            const z = t.z;
            const title = (el.layout.title && el.layout.title.text) || '';
            if (z && z.shape) return [title, ...String(z.shape).split(',').map(Number)];
            return [title, z.length, z[0] ? z[0].length : 0];
        }))""",
    )
    by_title = {title: (rows, cols) for title, rows, cols in sizes}
    # the budget: at most 512 x 512 cells a figure (token focus: one row of every head)
    assert all(rows * cols <= 512 * 512 for rows, cols in by_title.values()), by_title
    n = WORDS + 2  # one token a word, [CLS] and [SEP]
    (overview,) = [t for t in by_title if f"Layer 5, head 2 ({n}x{n} shown at 512x512)" in t]
    assert by_title[overview] == (512, 512)  # block-averaged
    (zoom,) = [t for t in by_title if "tokens 150-661 at full resolution" in t]
    assert by_title[zoom] == (512, 512)  # every weight of the window
    (grid,) = [t for t in by_title if "All heads" in t]
    assert by_title[grid][0] <= 24  # one layer of thumbnails

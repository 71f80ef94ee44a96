"""The notebook view (``AttentionResult.to_html``) in Debian's Chromium with the network cut:
no request, no console error; hovering a token colours the keys by its weights in the chosen
head; clicking a head enlarges it; the pickers, the line view and the dark theme; the neuron
view's rows follow the query token under the pointer."""

from __future__ import annotations

import numpy as np
import pytest

import mhsa
from bench.browser import chromium

pytestmark = pytest.mark.browser
TOKENS = ["<s>", "the", "cat", "sat", "</b>&<i>", "cat"]
LIGHT = ((255, 255, 255), (29, 78, 216))  # the view's colour map: weight 0 -> 1
DARK = ((24, 24, 27), (253, 224, 71))


def _attention() -> np.ndarray:
    """2 layers x 3 heads of 6 tokens; every head different, every row summing to 1."""
    rng = np.random.default_rng(7)
    a = rng.random((2, 3, 6, 6))
    a[0, 0, 3] = [0.05, 0.7, 0.1, 0.05, 0.05, 0.05]  # "sat" -> "the" in L0H0
    a[1, 2, 3] = [0.1, 0.1, 0.1, 0.1, 0.55, 0.05]  # "sat" -> the hostile token in L1H2
    return a / a.sum(-1, keepdims=True)


def _colour(weight: float, theme=LIGHT) -> str:
    lo, hi = theme
    return "rgb({}, {}, {})".format(
        *(round(a + (b - a) * weight) for a, b in zip(lo, hi, strict=True))
    )


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def open_view(browser, tmp_path):
    """Open a result's view offline; after the test, assert that nothing was requested and no
    console error or page error happened."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    requests: list[str] = []
    errors: list[str] = []

    def cut(route):
        requests.append(route.request.url)
        route.abort()

    context.route("**/*", cut)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))

    def open_(result: mhsa.AttentionResult, **options) -> object:
        page.set_content(result.to_html(tmp_path / "view.html", **options).read_text())
        page.wait_for_selector(".mhsa-view[data-ready]")
        return page

    yield open_
    context.close()
    assert requests == [] and errors == []


def _key_colours(page) -> list[str]:
    return page.eval_on_selector_all(
        ".mhsa-tok", "els => els.map(e => getComputedStyle(e).backgroundColor)"
    )


def _big_pixel(page, q: int, k: int) -> list[int]:
    return page.evaluate(
        """([q, k]) => Array.from(document.querySelector('.mhsa-big').getContext('2d')
            .getImageData(k, q, 1, 1).data.slice(0, 3))""",
        [q, k],
    )


def test_hover_a_token_to_see_where_it_attends(open_view) -> None:
    a = _attention()
    page = open_view(mhsa.from_attention(a, TOKENS))
    assert page.locator(".mhsa-thumb").count() == 6
    assert page.text_content(".mhsa-heading") == "L0H0"
    assert page.locator(".mhsa-tok").all_text_contents() == TOKENS  # shown literally
    page.hover(".mhsa-tok >> nth=3")
    assert _key_colours(page) == [_colour(w) for w in a[0, 0, 3]]
    assert "attends most to the (#1): 0.700" in page.text_content(".mhsa-readout")
    page.mouse.move(0, 0)
    assert _key_colours(page)[1] == "rgba(0, 0, 0, 0)"  # hover gone, colours gone


def test_click_a_head_to_enlarge_it_and_the_pickers_follow(open_view) -> None:
    a = _attention()
    page = open_view(mhsa.from_attention(a, TOKENS))
    page.click("[data-head='L1H2']")
    assert page.text_content(".mhsa-heading") == "L1H2"
    assert page.eval_on_selector_all("select", "s => s.map(e => e.value)")[:2] == ["1", "2"]
    assert _big_pixel(page, 3, 4) == [int(c) for c in _colour(a[1, 2, 3, 4])[4:-1].split(",")]
    page.hover(".mhsa-tok >> nth=3")
    assert _key_colours(page)[4] == _colour(a[1, 2, 3, 4])
    page.select_option("select >> nth=0", "0")  # the layer picker: L0H2
    assert page.text_content(".mhsa-heading") == "L0H2"
    assert page.locator(".mhsa-thumb.mhsa-on").get_attribute("data-head") == "L0H2"


def test_line_view_and_dark_theme(open_view) -> None:
    a = _attention()
    page = open_view(mhsa.from_attention(a, TOKENS), view="line", theme="dark", layer=1)
    assert page.locator(".mhsa-view.mhsa-dark").count() == 1
    drawn = int((a[1, 0] >= 0.01).sum())
    assert page.locator("svg line").count() == drawn
    page.hover("svg text[data-i='3']")
    opacities = page.eval_on_selector_all(
        "svg line",
        "ls => ls.filter(l => l.style.display !== 'none')"
        ".map(l => +l.getAttribute('stroke-opacity'))",
    )
    assert sorted(opacities) == pytest.approx(sorted(a[1, 0, 3][a[1, 0, 3] >= 0.01]), abs=1e-4)
    assert _key_colours(page)[3] == _colour(a[1, 0, 3, 3], DARK)


def _neuron_rows(page) -> list[tuple[str, str]]:
    """Each key row's score and weight as shown."""
    return [
        (r.locator(".mhsa-score").text_content(), r.locator(".mhsa-wtext").text_content())
        for r in page.locator(".mhsa-krow").all()
    ]


def test_neuron_view_follows_the_query_under_the_pointer(open_view) -> None:
    """toy:induction with its vectors: hovering a query shows its row of weights and its
    scores q . k_j / sqrt(d) (recomputed here from the result's q and k), later keys masked."""
    text = "ba be bi bo du ba be bi bo du"
    result = mhsa.attend(text, model="toy:induction", qk=True)
    page = open_view(result, view="neuron", layer=1, head=2)
    n = result.num_tokens
    assert page.locator(".mhsa-q").all_text_contents() == result.tokens
    for query in (7, 2):
        page.hover(f".mhsa-q >> nth={query}")
        assert page.text_content(".mhsa-heading").endswith(f"(#{query})")
        assert page.locator(".mhsa-q.mhsa-from").get_attribute("data-i") == str(query)
        q, k = result.q[1, 2, query].astype(np.float64), result.k[1, 2].astype(np.float64)
        scores = k @ q * result.qk_scale
        shown = _neuron_rows(page)
        assert [s == "masked" for s, _ in shown] == [j > query for j in range(n)]
        # 3 decimals as shown: within half a unit of the last place (and the 16-bit weights)
        visible = [j for j in range(n) if j <= query]
        assert [float(shown[j][0]) for j in visible] == pytest.approx(scores[visible], abs=6e-4)
        weights = [float(w) for _, w in shown]
        assert weights == pytest.approx(result.attention[1, 2, query], abs=6e-4)
        assert page.locator(".mhsa-krow.mhsa-masked").count() == n - 1 - query
    page.select_option("select >> nth=1", "0")  # head picker: H0, same query
    assert page.text_content(".mhsa-heading").startswith("L1H0")
    weights = [float(w) for _, w in _neuron_rows(page)]
    assert weights == pytest.approx(result.attention[1, 0, 2], abs=6e-4)

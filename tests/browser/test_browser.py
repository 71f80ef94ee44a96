"""The real app in Debian's Chromium: every page, typing, the rendered labels, clicking a head,
hostile links.

Screenshots go to a temporary folder; ``scripts/screenshots.sh`` sets ``MHSA_SCREENSHOTS=docs``
to refresh the ones the README shows (the tests never touch tracked files).
"""

from __future__ import annotations

import os
import re
import tempfile
import zipfile
from pathlib import Path
from urllib.parse import quote

import pytest

from bench.browser import (
    PAGE_PLOTS,
    PAGES,
    streamlit_server,
    tick_labels,
    wait_for_app,
    wait_for_link,
)
from tests.hostile import PLACEHOLDER
from ui.navigation import NAV_KEY

pytestmark = pytest.mark.browser
DOCS = Path(os.environ.get("MHSA_SCREENSHOTS") or tempfile.mkdtemp(prefix="mhsa-shots-"))
CAT = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]


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
    wait_for_link(page, "text=Dogs")


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
    # the link is written at the end of the rerun, after the figure's title: wait for it too
    page.wait_for_function(
        "() => /[?&]layer=2(&|$)/.test(location.search) && /[?&]head=5(&|$)/.test(location.search)",
        timeout=30_000,
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
    "k": "NaN",  # the old name of clusters: links made before the rename stay hostile-tested
    "off": "[Sign in](https://example.org/phish)",
    "method": "<script>alert(1)</script>",
    "target": "**x**",
    "pair": "<img src=x onerror=alert(1)> [Sign in](https://example.org/phish)",
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
    if name == "Heads":  # the notices share one box, listed in an expander when many
        main.get_by_text("values that fell back").first.click()
        notices = main.locator("[data-testid='stExpander']").first
        notices.get_by_text("ignored").first.wait_for(timeout=30_000)
        shown = main.inner_text().replace("\u2060", "")
        assert "layer='[Sign in](https://example.org/phish)' ignored" in shown
        assert main.locator("[data-testid='stAlert']").count() <= 3  # not one box a value


@pytest.mark.parametrize(
    ("method", "target"),
    [("ablation", "auto"), ("ablation", "similarity"), ("gradient", "similarity")],
)
def test_importance_page_for_each_method_and_target(
    app_url, page, method, target, tiny_bert_path
) -> None:
    model = quote(tiny_bert_path, safe="")  # the page is tested, not the model: the tiny BERT
    page.goto(f"{app_url}/Head_importance?model={model}&method={method}&target={target}")
    wait_for_app(page, plots=PAGE_PLOTS["Head importance"])
    assert page.locator("[data-testid='stAlertContentError']").count() == 0
    titles = page.locator(".js-plotly-plot .gtitle").all_text_contents()
    assert titles[0].startswith("Importance of each head")
    assert titles[1].startswith("Pruning curve") and titles[2] == "Importance against confidence"
    page.get_by_text(f"method: {method}").first.wait_for()


def test_gradient_of_the_embedding_shows_why_in_the_browser(app_url, page) -> None:
    page.goto(f"{app_url}/Head_importance?method=gradient")
    wait_for_app(page)
    error = page.locator("[data-testid='stAlertContentError']")
    error.wait_for()
    assert "zero at the intact model" in error.inner_text()
    assert page.locator("[data-testid='stException']").count() == 0


def test_clicking_the_importance_map_opens_that_head(app_url, page) -> None:
    page.goto(f"{app_url}/Head_importance")
    wait_for_app(page, plots=PAGE_PLOTS["Head importance"])
    layer, head = 3, 7
    point = page.locator(".js-plotly-plot >> nth=0 >> .scatterlayer .point").nth(layer * 12 + head)
    box = point.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_url(re.compile(r"/Heads\?"), timeout=60_000)
    wait_for_app(page, plots=PAGE_PLOTS["Heads"])
    title = page.locator(".js-plotly-plot >> nth=1 >> .gtitle").text_content()
    assert title == f"Layer {layer}, head {head}"
    wait_for_link(page, "layer=3", "head=7")


def test_knock_outs_on_the_heads_page(app_url, page) -> None:
    page.goto(f"{app_url}/Heads?off=L0H3")
    wait_for_app(page, plots=PAGE_PLOTS["Heads"] + 5)
    page.get_by_text("Output change").wait_for()
    titles = page.locator(".js-plotly-plot .gtitle").all_text_contents()
    assert "How much each layer's attention moved" in titles
    # switch one more head off with the button under the grid (the selected head: L0H0)
    page.get_by_role("button", name="Switch L0H0 off").click()
    page.wait_for_url(re.compile(r"off=L0H0(%2C|,)L0H3"), timeout=60_000)
    wait_for_app(page, plots=PAGE_PLOTS["Heads"] + 5)
    page.screenshot(path=str(DOCS / "Heads-knock-out.png"), full_page=True)


# --- issue 13: navigation, line view, export, token search, generated text ---------------------
def test_navigation_is_named_grouped_and_old_links_still_work(page) -> None:
    with streamlit_server() as url:  # a fresh server: this link is its first visitor
        _first_visit_by_a_page_link(url, page)


def _first_visit_by_a_page_link(app_url, page) -> None:
    page.goto(f"{app_url}/Head_similarity?metric=cosine")  # a link made before the navigation
    wait_for_app(page, plots=PAGE_PLOTS["Head similarity"])
    nav = page.locator(f".st-key-{NAV_KEY}")  # app.py's page links (Streamlit's menu hidden)
    headers = nav.locator("strong").all_text_contents()
    assert headers == ["Explore", "Analyse", "Teach"]
    links = [t.strip() for t in nav.locator("a").all_text_contents()]  # icon name + title
    assert len(links) == len(PAGES)
    for link, title in zip(links, ["Overview", "Heads", "Line view"], strict=False):
        assert link.endswith(title)
    assert not [t for t in links if t.lower().endswith("app")]
    nav.get_by_text("Heads", exact=True).click()  # one click from anywhere
    page.wait_for_url(re.compile(r"/Heads"), timeout=60_000)
    wait_for_app(page, plots=PAGE_PLOTS["Heads"])
    assert page.locator("h1").first.inner_text().strip() == "Heads"


def _line_counts(page) -> dict[str, int]:
    """Lines the browser drew per stroke colour: subpaths (M commands) of the line paths."""
    return page.eval_on_selector_all(
        ".js-plotly-plot .scatterlayer .trace path.js-line",
        """els => {
            const out = {};
            for (const e of els) {
                const rgb = (e.style.stroke || '').replace(/\\s/g, '');
                const n = ((e.getAttribute('d') || '').match(/M/g) || []).length;
                out[rgb] = (out[rgb] || 0) + n;
            }
            return out;
        }""",
    )


def test_line_view_draws_each_heads_lines_in_its_colour(app_url, page) -> None:
    import numpy as np

    import mhsa
    from mhsa.plots import head_style

    page.goto(f"{app_url}/Line_view?layer=3")
    wait_for_app(page, plots=1)
    a = mhsa.attend("The cat sat on the mat.").attention[3]
    counts = _line_counts(page)
    for h in (0, 4, 11):
        color = head_style(h)[0]
        r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
        drawn = counts.get(f"rgb({r},{g},{b})", 0)  # the weight is the stroke's opacity
        # heads 3 and 11 share a colour (eight colours; the dash tells them apart)
        alike = [k for k in range(a.shape[0]) if head_style(k)[0] == color]
        expected = sum(int(np.count_nonzero(a[k] >= 0.01)) for k in alike)
        assert drawn == expected, (h, alike, counts)
    # a click on a token shows only its lines
    point = page.locator(".js-plotly-plot .scatterlayer .trace").first.locator("path.point").nth(2)
    box = point.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_url(re.compile(r"line_token=2"), timeout=60_000)
    wait_for_app(page, plots=1)
    assert "lines of 'cat'" in page.locator(".js-plotly-plot .gtitle").first.text_content()
    page.screenshot(path=str(DOCS / "Line_view.png"), full_page=False)


def test_a_link_with_old_keys_opens_the_same_view_and_takes_the_new_keys(app_url, page) -> None:
    title = ".js-plotly-plot .gtitle"
    page.goto(f"{app_url}/Line_view?layer=3&line_token=2&line_heads=4")
    wait_for_app(page, plots=1)
    new_title = page.locator(title).first.text_content()
    assert "lines of 'cat'" in new_title
    page.goto(f"{app_url}/Line_view?layer=3&ltoken=2&lheads=4")  # a link made before the rename
    page.wait_for_url(re.compile(r"line_token=2"), timeout=60_000)
    wait_for_app(page, plots=1)
    assert page.locator(title).first.text_content() == new_title
    assert "ltoken" not in page.url and "lheads" not in page.url


#: every JSON.stringify of the tab, as whether its text holds binary arrays and plotly's cache
RECORD_SERIALISED = """
window.__serialised = [];
const stringify = JSON.stringify;
JSON.stringify = function (...args) {
  const text = stringify.apply(this, args);
  if (typeof text === "string" && text.includes('"bdata"'))
    window.__serialised.push({
      cached: text.includes('"_inputArray"'),
      length: text.length,
      figure: (text.match(/"bdata":"([^"]{0,120})/) || ["", ""])[1],  // its first binary array
    });
  return text;
};
"""


def test_charts_are_reserialised_without_plotlys_decoded_arrays(app_url, page) -> None:
    """Streamlit's chart element serialises each figure again after plotly.js drew it; our
    page script (``ui.page.PAGE_SCRIPT``) keeps plotly's decoded copies out of that JSON, and
    plotly.js still draws our numbers from the figure after that second pass."""
    import numpy as np

    import mhsa

    page.add_init_script(RECORD_SERIALISED)
    page.goto(f"{app_url}/Heads?layer=2&head=5")
    wait_for_app(page, plots=PAGE_PLOTS["Heads"])
    # the first pass and the second, for each of the three figures
    page.wait_for_function("() => window.__serialised.length >= 6", timeout=60_000)
    page.wait_for_timeout(500)
    serialised = page.evaluate("window.__serialised")
    assert not [s for s in serialised if s["cached"]], serialised
    # whatever plotly.js names its cache: no figure's later pass is much larger than its first
    # (the figure as sent; with the cache leaking, this page's grid came to 209 kB from 42 kB)
    passes: dict[str, list[int]] = {}
    for s in serialised:
        passes.setdefault(s["figure"], []).append(s["length"])
    assert len(passes) == 3 and all(len(p) >= 2 for p in passes.values()), passes.values()
    assert all(max(p) <= p[0] + 10_000 for p in passes.values()), passes.values()
    drawn = page.evaluate(
        "() => Array.from(document.querySelectorAll('.js-plotly-plot')[1]._fullData[0].z,"
        " row => Array.from(row))"
    )
    expected = mhsa.attend("The cat sat on the mat.").attention[2, 5]
    # the server's forward and this one differ in the last float32 digits (threads, batching)
    np.testing.assert_allclose(np.asarray(drawn), expected, rtol=1e-4, atol=1e-7)


def test_plotlys_chunk_loads_before_any_figure_arrives(app_url, page) -> None:
    """The page script asks for Streamlit's plotly chunk as soon as a page's first element
    arrives: Overview draws no figure, and the chunk is loaded there all the same."""
    from ui.page import PAGE_SCRIPT

    page.goto(app_url)
    wait_for_app(page)
    page.get_by_text("max positions").wait_for()
    assert page.locator(".js-plotly-plot").count() == 0
    chunk = re.search(r'"(PlotlyChart\.[^"]+\.js)"', PAGE_SCRIPT).group(1)
    page.wait_for_function(
        "(chunk) => performance.getEntriesByType('resource').some(e => e.name.endsWith(chunk))",
        arg=chunk,
        timeout=30_000,
    )
    # the script's element takes no room (no gap) on the page
    display = page.eval_on_selector(
        "#mhsa-page-script",
        "e => getComputedStyle(e.closest('[data-testid=stElementContainer]')).display",
    )
    assert display == "none"


def test_svg_export_saves_the_figure_as_svg(app_url, page) -> None:
    page.goto(f"{app_url}/Heads?export=svg&layer=2&head=7")
    wait_for_app(page, plots=PAGE_PLOTS["Heads"])
    chart = page.locator(".js-plotly-plot").nth(1)
    chart.hover()
    with page.expect_download(timeout=60_000) as info:
        chart.locator("[data-title^='Download plot']").click()
    download = info.value
    assert download.suggested_filename.endswith("-default-transformers-L2H7-head.svg")
    svg = Path(download.path()).read_text()
    assert svg.lstrip().startswith("<svg") and "Layer 2, head 7" in svg
    assert ">cat<" in svg  # the tokens travel as text in the vector file


def test_the_pages_figures_download_as_one_zip(app_url, page) -> None:
    page.goto(f"{app_url}/Heads?layer=2&head=7")
    wait_for_app(page, plots=PAGE_PLOTS["Heads"])
    button = page.get_by_role("button", name=re.compile(r"Download the 3 figures"))
    with page.expect_download(timeout=60_000) as info:
        button.click()
    download = info.value
    assert download.suggested_filename.endswith("-default-transformers-figures.zip")
    archive = zipfile.ZipFile(download.path())
    names = archive.namelist()
    assert "plotly.min.js" in names
    stems = {n.rsplit(".", 1)[0] for n in names if n.endswith(".csv")}
    assert len(stems) == 3 and any(s.endswith("-L2H7-head") for s in stems)
    assert all(f"{s}.html" in names for s in stems)
    head = next(s for s in stems if s.endswith("-L2H7-head"))
    assert "Layer 2, head 7" in archive.read(f"{head}.html").decode()
    assert len(archive.read(f"{head}.csv").decode().splitlines()) == 1 + 9 * 9  # every cell
    for stem in stems:  # the app's colours, not Streamlit's placeholders (near-black offline)
        assert not PLACEHOLDER.search(archive.read(f"{stem}.html").decode())


def test_token_search_at_512_tokens_selects_and_boxes_it(app_url, page) -> None:
    vocabulary = ["the", "cat", "dog", "sat", "on", "mat", "and", "a", "big", "house"]
    words = [vocabulary[i % len(vocabulary)] for i in range(515)]
    words[400] = "elephant"
    page.goto(f"{app_url}/Heads?text={quote(' '.join(words))}&find=elephant")
    wait_for_app(page, plots=PAGE_PLOTS["Heads"], timeout_ms=120_000)
    titles = page.locator(".js-plotly-plot .gtitle").all_text_contents()
    assert any("Where 'elephant' attends" in t for t in titles), titles
    boxes = page.eval_on_selector_all(
        ".js-plotly-plot >> nth=1 >> .shapelayer path",
        "els => els.map(e => e.style.stroke.replace(/\\s/g, ''))",
    )
    assert boxes.count("rgb(214,39,40)") == 2  # the token's row and column


def test_generated_tokens_appear_on_the_pages(tiny_gpt2_path, page) -> None:
    env = {"MHSA_ALLOWED_MODELS": tiny_gpt2_path}
    with streamlit_server(env=env) as url:
        page.goto(f"{url}/Heads?model={quote(tiny_gpt2_path)}&text=The+cat+sat&generate=6")
        wait_for_app(page, plots=PAGE_PLOTS["Heads"])
        page.get_by_text("dashed: generated text begins").first.wait_for()
        labels = tick_labels(page, 1)
        assert labels[:4] == ["[CLS]", "the", "cat", "sat"] and len(labels) > 5
        page.goto(f"{url}/Line_view?model={quote(tiny_gpt2_path)}&text=The+cat+sat&generate=6")
        wait_for_app(page, plots=1)
        page.get_by_text("dashed: generated text begins").first.wait_for()

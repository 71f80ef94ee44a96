"""WCAG 2.1 AA in Debian's Chromium, checked by machine: axe-core (the copy
``axe-playwright-python``, pinned in requirements-dev.txt, ships; MPL-2.0, used as it comes)
injected into every page on the default model, on toy:induction and in presentation mode, one
browser and the pages in turn; the test fails on any critical or serious violation of the
wcag2a, wcag2aa, wcag21a and wcag21aa rules. Every chart drawn is named by a sentence from its
numbers (``mhsa.plots.alt_text``); at 320 px wide and at 200% zoom nothing of a page is cut
(WCAG 1.4.10 reflow, 1.4.4 resize text). docs/accessibility.md says what this covers."""

from __future__ import annotations

import re
from pathlib import Path

import axe_playwright_python
import pytest

from bench.browser import PAGE_PLOTS, PAGES, wait_for_app

pytestmark = pytest.mark.browser

AXE = Path(axe_playwright_python.__file__).with_name("axe.min.js")
TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
#: the three ways every page is checked: the link's query
MODES = {
    "default model": "",
    "toy:induction": "model=toy:induction",
    "presentation": "presentation=1",
}
RUN_AXE = """(tags) => axe.run(document, {
    runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']})"""
#: every chart's accessible name (Streamlit puts ``alt`` on the chart's element, role figure)
CHART_NAMES = """() => [...document.querySelectorAll('[data-testid="stPlotlyChart"]')]
    .map(e => [e.getAttribute('role'), e.getAttribute('aria-label')])"""


#: pages whose figures on the default model wait for a job (seconds to minutes on a small
#: machine) or for an atlas built beforehand: checked as they stand when their run is done
WAITING = {"Head atlas", "Head importance"}


STALE = '[data-testid="stElementContainer"][data-stale="true"]'


def _settle(page, name: str, query: str) -> None:
    """The page's run finished (twice over: a first visit reruns into the navigation) and
    its charts drawn (on the default model, as many as ``PAGE_PLOTS`` says; elsewhere every
    chart the run sent)."""
    page.locator("[data-testid='stMain'] h1").first.wait_for(timeout=180_000)
    default = query == "" and name not in WAITING
    wait_for_app(page, plots=PAGE_PLOTS[name] if default else 0, timeout_ms=180_000)
    page.wait_for_timeout(300)
    wait_for_app(page, plots=PAGE_PLOTS[name] if default else 0, timeout_ms=180_000)
    # no element of an earlier run still shown faded (Streamlit's stale elements: their
    # lowered opacity is no colour of the page)
    page.wait_for_function(f"() => !document.querySelector('{STALE}')", timeout=60_000)
    page.wait_for_function(
        """() => [...document.querySelectorAll('.js-plotly-plot')]
            .every(p => p.querySelector('.main-svg'))""",
        timeout=60_000,
    )


def serious_violations(page) -> list[str]:
    """axe-core's critical and serious violations of the WCAG 2.1 A and AA rules on the page
    as it is, one line each: the rule, its impact, how many elements and the first one."""
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    found = page.evaluate(RUN_AXE, TAGS)["violations"]
    return [
        f"{v['id']} ({v['impact']}, {len(v['nodes'])}x): {v['nodes'][0]['html'][:200]} "
        f"{v['nodes'][0].get('failureSummary', '')[-200:]}"
        for v in found
        if v["impact"] in ("critical", "serious")
    ]


def test_every_page_in_every_mode_passes_axe_and_names_its_charts(app_url, page) -> None:
    failures: dict[str, list[str]] = {}
    unnamed: dict[str, list] = {}
    charts = 0
    for mode, query in MODES.items():
        for name, path in PAGES.items():
            page.goto(f"{app_url}/{path}?{query}")
            _settle(page, name, query)
            where = f"{name} ({mode})"
            found = serious_violations(page)
            if found:
                failures[where] = found
            names = page.evaluate(CHART_NAMES)
            charts += len(names)
            bad = [n for n in names if n[0] != "figure" or not re.search(r"\d", n[1] or "")]
            if bad:
                unnamed[where] = bad
    assert not failures, failures
    assert not unnamed, unnamed
    assert charts >= sum(PAGE_PLOTS.values())  # the charts were there to be named


def test_the_axe_run_can_fail(app_url, page) -> None:
    """The check finds what it looks for: an image without a text alternative and grey text
    of 2.3:1 put into a page are reported."""
    page.goto(f"{app_url}/Rollout")
    _settle(page, "Rollout", "")
    page.evaluate(
        """() => {
            const main = document.querySelector('[data-testid="stMain"]');
            const img = document.createElement('img');
            img.src = 'data:image/gif;base64,R0lGODlhAQABAAAAACw=';
            main.prepend(img);
            const p = document.createElement('p');
            p.textContent = 'faint';
            p.style.color = '#aaaaaa';
            main.prepend(p);
        }"""
    )
    found = " ".join(serious_violations(page))
    assert "image-alt (critical" in found and "color-contrast (serious" in found


#: the pages the reflow check visits (the widest controls and tables), by navigation title
REFLOW = ("Heads", "Head atlas", "Lessons", "Train heads", "Head statistics")
#: what of the main content is wider than the window: elements that overflow the page itself,
#: not inside a box of their own that scrolls (a figure or a table may scroll in its box)
OVERFLOW = """() => {
    const main = document.querySelector('[data-testid="stMain"]');
    const width = document.documentElement.clientWidth;
    const scrolls = (e) => {
        for (let p = e.parentElement; p && p !== main; p = p.parentElement) {
            const s = getComputedStyle(p).overflowX;
            if (s === 'auto' || s === 'scroll' || s === 'hidden') return true;
        }
        return false;
    };
    const out = [];
    for (const e of main.querySelectorAll('p, label, h1, h2, h3, button, input, textarea, a')) {
        const r = e.getBoundingClientRect();
        if (r.width && (r.right > width + 1 || r.left < -1) && !scrolls(e))
            out.push(`${e.tagName} ${(e.textContent || e.value || '').slice(0, 40)}`);
    }
    return {page: document.documentElement.scrollWidth - width, cut: out};
}"""


@pytest.mark.parametrize(
    ("width", "scale"), [(320, 1), (640, 2)], ids=["320px", "200%-zoom-of-640px"]
)
def test_at_320_px_and_200_percent_nothing_is_cut(browser, app_url, width, scale) -> None:
    """WCAG 1.4.10: at 320 CSS px no horizontal scrolling of the page and no text outside
    it; 1.4.4: a 1280 px window at 200% zoom is 640 CSS px at 2 device pixels each."""
    context = browser.new_context(
        viewport={"width": width, "height": 800}, device_scale_factor=scale
    )
    page = context.new_page()
    try:
        for name in REFLOW:
            page.goto(f"{app_url}/{PAGES[name]}")
            _settle(page, name, "reflow")
            measured = page.evaluate(OVERFLOW)
            assert measured["page"] <= 1 and not measured["cut"], (name, measured)
    finally:
        context.close()

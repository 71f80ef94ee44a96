"""A keyboard-only walk in Debian's Chromium (WCAG 2.1.1, 2.4.1, 2.4.3): Tab from the top of
Heads, Head atlas, Lessons and Train heads reaches every control of the page and its sidebar
(a group of radio buttons is one stop, its choices taken with the arrows); the skip link is the
first stop and moves the focus to the page; on Heads the sentence, model, layer and head come
before any figure's mode bar; the arrows change the layer, Space opens "Why here?", whose query
and key boxes choose a heatmap cell; Enter starts a training. docs/accessibility.md records
the walk."""

from __future__ import annotations

import re

import pytest

from bench.browser import wait_for_app

pytestmark = pytest.mark.browser

#: the focused element, as "where kind | name" (S: sidebar, M: main; [modebar] on a figure's)
FOCUSED = """() => {
    const e = document.activeElement;
    if (!e || e === document.body) return 'body';
    const name = e.getAttribute('aria-label') || (e.labels && e.labels[0]
        && e.labels[0].textContent) || e.textContent || '';
    const where = e.closest('[data-testid="stSidebar"]') ? 'S' : 'M';
    const bar = e.closest('.modebar') ? '[modebar]' : '';
    return `${where}${bar} ${e.tagName.toLowerCase()} | ${name.trim().slice(0, 60)}`;
}"""
#: every control a keyboard user must reach, one entry per tab stop: focusable and shown
#: (a radio group once: the browser gives it one stop)
CONTROLS = """() => {
    const all = document.querySelectorAll(
        'a[href], button, input, textarea, select, summary, [tabindex]:not([tabindex="-1"])');
    const seen = new Set();
    const out = [];
    for (const e of all) {
        if (e.disabled || e.tabIndex < 0 || !e.getClientRects().length) continue;
        if (getComputedStyle(e).visibility === 'hidden') continue;
        const closed = e.closest('details:not([open])');
        if (closed && e.tagName !== 'SUMMARY') continue;  // inside a closed expander
        if (e.type === 'radio') {
            if (seen.has(e.name)) continue;
            seen.add(e.name);
        }
        if (!e.closest('[data-testid="stSidebar"], [data-testid="stMain"]')) continue;
        out.push(e);
    }
    window.__mhsaControls = out;
    return out.length;
}"""
REACHED = """() => {
    const e = document.activeElement;
    const i = window.__mhsaControls.findIndex(c => c === e || (c.type === 'radio'
        && e.type === 'radio' && c.name === e.name));
    return i;
}"""
UNREACHED = """(reached) => window.__mhsaControls
    .map((e, i) => [i, e.tagName + ' ' + (e.getAttribute('aria-label') || e.textContent
        || e.name || '').trim().slice(0, 50)])
    .filter(([i]) => !reached.includes(i))"""


def _ready(page, url: str, control) -> None:
    page.goto(url)
    control(page).wait_for(timeout=180_000)
    wait_for_app(page, timeout_ms=180_000)
    page.wait_for_timeout(500)
    wait_for_app(page, timeout_ms=180_000)


def walk(page, limit: int = 400) -> list[str]:
    """Tab from the top of the page until the focus comes back round to the skip link: the
    stops in order. Fails when a control of the page was never reached."""
    page.evaluate(CONTROLS)
    page.locator("body").focus()
    page.evaluate("() => document.activeElement?.blur()")
    stops: list[str] = []
    reached: set[int] = set()
    for _ in range(limit):
        page.keyboard.press("Tab")
        stop = page.evaluate(FOCUSED)
        if len(stops) > 2 and "Skip to main content" in stop:
            break  # round the page once (the link takes a first Tab to show, then its own)
        stops.append(stop)
        index = page.evaluate(REACHED)
        if index >= 0:
            reached.add(index)
    missed = page.evaluate(UNREACHED, sorted(reached))
    assert not missed, (missed, stops)
    assert "Skip to main content" in stops[0], stops[:3]
    return stops


def _first(stops: list[str], pattern: str) -> int:
    return next(i for i, s in enumerate(stops) if re.search(pattern, s))


def test_heads_by_keyboard(app_url, page) -> None:
    layer = lambda p: p.get_by_role("spinbutton", name="Layer", exact=True)  # noqa: E731
    _ready(page, f"{app_url}/Heads?model=toy:induction&text=a b c a b c", layer)
    stops = walk(page)
    bars = _first(stops, r"\[modebar\]")
    for control in (r"^S textarea \| Sentence", r"^S input \| Model$", r"\| Layer$", r"\| Head$"):
        assert _first(stops, control) < bars, (control, stops)
    # the skip link's Enter puts the focus on the page, whose next stop is the page's own
    page.keyboard.press("Tab")
    assert "Skip to main content" in page.evaluate(FOCUSED)
    page.keyboard.press("Enter")
    assert page.evaluate("() => document.activeElement.dataset.testid") == "stMain"
    page.keyboard.press("Tab")
    assert page.evaluate(FOCUSED).startswith("M ")
    # the arrows change the layer (the model's 2 layers: 0 to 1)
    layer(page).focus()
    page.keyboard.press("ArrowUp")
    page.wait_for_url(re.compile(r"layer=1"), timeout=60_000)
    wait_for_app(page, plots=3)
    assert "Layer 1, head 0" in page.locator(".js-plotly-plot .gtitle").all_text_contents()[1]
    # Space opens "Why here?"; its boxes choose the cell a click would
    why = page.get_by_role("switch", name=re.compile(r"^Why here\?"))
    why.focus()
    page.keyboard.press("Space")
    key = page.get_by_role("spinbutton", name="Key position")
    key.wait_for(timeout=60_000)
    key.focus()
    page.keyboard.press("ArrowUp")
    wait_for_app(page, plots=4)
    assert page.get_by_role("spinbutton", name="Key position").input_value() == "1"


def test_head_atlas_lessons_and_train_heads_by_keyboard(app_url, page) -> None:
    _ready(
        page,
        f"{app_url}/Head_atlas?model=toy:induction",
        lambda p: p.locator("[data-testid='stMain'] h1"),
    )
    walk(page)
    _ready(page, f"{app_url}/Lessons", lambda p: p.locator("[data-testid='stMain'] h1"))
    stops = walk(page)
    assert sum(s.startswith("M a |") and "Open" not in s for s in stops) >= 5  # the steps' links
    train = lambda p: p.get_by_role("button", name="Train", exact=True)  # noqa: E731
    _ready(page, f"{app_url}/Train_heads?layers=2&heads=2&width=16&train_seed=1&steps=30", train)
    stops = walk(page)
    assert any(s.endswith("| Train") for s in stops)
    train(page).focus()
    page.keyboard.press("Enter")
    page.get_by_text("30 of 30").wait_for(timeout=120_000)

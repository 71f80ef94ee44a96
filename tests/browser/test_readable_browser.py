"""Figures readable on a small and a large model (issue 38, point 5), measured in Debian's
Chromium: on the 2-layer ``toy:induction`` and on the 6-layer, 12-head default MiniLM, every
figure is drawn at least ``MIN_FIGURE`` px tall, every colour bar at least ``MIN_BAR`` px long,
every title whole (the rendered text is the figure's full title, within the figure's width, over
lines if need be) and no two tick labels of a figure overlap. A screenshot of each page is
saved to a temporary folder (its path in the test's output)."""

from __future__ import annotations

import pytest

from bench.browser import PAGE_PLOTS, wait_for_app

pytestmark = pytest.mark.browser

MIN_FIGURE = 300  # px: a 2-layer layer x head map was about 60 px of plot in a 240 px figure
MIN_BAR = 100  # px: colour bars were a few pixels tall on 2 layers

#: per figure: its height, its colour bars' heights, its titles (rendered text, the layout's
#: text with line breaks, whether the title lies within the figure) and its overlapping ticks
MEASURE = """() => [...document.querySelectorAll('.js-plotly-plot')].map(div => {
    const svg = div.querySelector('.main-svg').getBoundingClientRect();
    const decode = s => new DOMParser().parseFromString(s, 'text/html').body.textContent;
    const title = div.querySelector('.gtitle');
    const box = title ? title.getBoundingClientRect() : null;
    const overlaps = [];
    for (const axis of ['xtick', 'ytick']) {
        const boxes = [...div.querySelectorAll(`.${axis} text`)]
            .filter(e => e.textContent.trim())
            .map(e => [e.textContent, e.getBoundingClientRect()]);
        for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
            const [a, p] = boxes[i], [b, q] = boxes[j];
            const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
            const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
            if (w > 1 && h > 1) overlaps.push([a, b]);
        }
    }
    const layoutTitle = (div.layout && div.layout.title && div.layout.title.text) || '';
    return {
        height: svg.height, width: svg.width,
        bars: [...div.querySelectorAll('.colorbar .cbbg')]
            .map(e => e.getBoundingClientRect())
            .map(r => Math.max(r.width, r.height)),  // its length, upright or lying
        title: title ? title.textContent : '',
        full: decode(layoutTitle.replaceAll('<br>', '')),
        inside: !box || (box.left >= svg.left - 1 && box.right <= svg.right + 1),
        overlaps,
    };
})"""


@pytest.mark.parametrize(
    ("page_name", "model"),
    [
        ("Head roles", "toy:induction"),
        ("Head roles", "default"),
        ("Heads", "toy:induction"),
        ("Heads", "default"),
    ],
)
def test_figures_are_readable_on_small_and_large_models(
    app_url, page, tmp_path_factory, page_name, model
) -> None:
    path = page_name.replace(" ", "_")
    page.goto(f"{app_url}/{path}?model={model}")
    wait_for_app(page, plots=PAGE_PLOTS[page_name], timeout_ms=120_000)
    assert page.locator("[data-testid='stException']").count() == 0
    shot = tmp_path_factory.mktemp("readable") / f"{path}-{model.replace(':', '-')}.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    figures = page.evaluate(MEASURE)
    assert len(figures) >= PAGE_PLOTS[page_name]
    problems = []
    for fig in figures:
        where = (page_name, model, fig["full"])
        if fig["height"] < MIN_FIGURE:
            problems.append((where, "height", fig["height"]))
        if not all(bar >= MIN_BAR for bar in fig["bars"]):
            problems.append((where, "colour bar", fig["bars"]))
        if fig["title"] != fig["full"]:
            problems.append((where, "title text", fig["title"]))
        if not fig["inside"]:
            problems.append((where, "title cut"))
        if fig["overlaps"]:
            problems.append(
                (
                    where,
                    "overlapping ticks",
                    len(fig["overlaps"]),
                    fig["overlaps"][:2],
                    fig["width"],
                )
            )
    for problem in problems:
        print(problem)
    assert not problems, problems
    assert any(fig["bars"] for fig in figures)  # the measure can fail: colour bars were found

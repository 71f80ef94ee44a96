"""Screenshots for checking figure layout by eye (issue 46, item 9): Heads, Head roles, Head
similarity and Circuits on the default model and on ``toy:induction``, in normal and in
presentation mode, in Chromium at 1600 px wide.

Usage: ``PYTHONPATH=. .venv/bin/python -m scripts.screenshots_layout --out /tmp/shots``
"""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import urlencode

from bench.browser import PAGE_PLOTS, PAGES, chromium, streamlit_server, wait_for_app

TOY = {
    "model": "toy:induction",
    "text": "ba ke mo di fu lo ni pa su te ba ke mo di fu",
    "clean": "ba ke mo di fu lo ni pa su te ba ke mo di fu",
    "corrupted": "ba ke mo di ra lo ni pa su te ba ke mo di fu",
    "answer": "lo",
    "wrong": "ba",
}
MODELS = {"default": {}, "toy": TOY}
TITLES = ("Heads", "Head roles", "Head similarity", "Circuits")


def shoot(out: Path, titles: tuple[str, ...] = TITLES) -> list[Path]:
    """One PNG per chart of each page, model and mode: ``<page>-<model>-<mode>-<chart>.png``."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with streamlit_server() as url, chromium() as browser:
        context = browser.new_context(viewport={"width": 1600, "height": 1800})
        page = context.new_page()
        for title in titles:
            for model, keys in MODELS.items():
                for mode in ("normal", "presentation"):
                    link = dict(keys) | ({"presentation": "1"} if mode == "presentation" else {})
                    page.goto(f"{url}/{PAGES[title]}?{urlencode(link)}")
                    wait_for_app(page, plots=min(PAGE_PLOTS[title], 2), timeout_ms=300_000)
                    page.wait_for_timeout(1500)
                    charts = page.locator(".js-plotly-plot")
                    for i in range(charts.count()):  # each chart whole (the page scrolls inside)
                        name = f"{PAGES[title]}-{model}-{mode}-{i}.png"
                        chart = charts.nth(i)
                        chart.scroll_into_view_if_needed()
                        box = chart.bounding_box()
                        # 60 px above the chart's box: what a title drawn outside it covers
                        top = max(0.0, box["y"] - 60)
                        clip = {**box, "y": top, "height": box["height"] + box["y"] - top}
                        page.screenshot(path=str(out / name), clip=clip)
                        written.append(out / name)
                        print(out / name, flush=True)
        context.close()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/shots"))
    parser.add_argument("--pages", nargs="*", default=list(TITLES))
    args = parser.parse_args()
    shoot(args.out, tuple(args.pages))


if __name__ == "__main__":
    main()

"""Screenshots of the Analyse and Teach pages with an example set, for the README (docs/*.png).

Usage: ``.venv/bin/python -m scripts.screenshots_pages [--out docs]`` (``scripts/screenshots.sh``
runs it). Each page opens by link on a shipped toy model, so the figures show what the page is
for (an induction head, a patched answer, a route to the answer) rather than the default view.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import urlencode

from bench.browser import chromium, streamlit_server, wait_for_app

REPEAT = "ba ke mo di lu ba ke mo"
#: (file name, page address, link keys, plotly charts to wait for)
SHOTS = [
    (
        "Head_roles",
        "Head_roles",
        {"model": "toy:induction", "text": REPEAT, "random_tokens": "1"},
        3,
    ),
    (
        "Patching",
        "Patching",
        {
            "model": "toy:induction",
            "clean": "ba ke mo di fu lo ba ke mo di",
            "corrupted": "ba ke mo ra fu lo ba ke mo di",
            "answer": "fu",
            "wrong": "lo",
        },
        2,
    ),
    (
        "Information_flow",
        "Information_flow",
        {"model": "toy:induction", "text": REPEAT, "answer": "di", "wrong": "lu"},
        2,
    ),
    (
        "Circuits",
        "Circuits",
        {
            "model": "toy:induction",
            "clean": "ba ke mo di fu lo ni pa su te ba ke mo di fu",
            "corrupted": "ba ke mo di ra lo ni pa su te ba ke mo di fu",
            "answer": "lo",
            "wrong": "ba",
        },
        2,
    ),
]


def shoot(out: Path, *, train_steps: int = 1000) -> list[Path]:
    """Open each page of ``SHOTS`` and Train heads (a short run of ``train_steps``), save PNGs."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with streamlit_server() as url, chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        for name, path, keys, plots in SHOTS:
            page.goto(f"{url}/{path}?{urlencode({'text': REPEAT, **keys})}")  # no [UNK]s
            wait_for_app(page, plots=plots, timeout_ms=180_000)
            written.append(out / f"{name}.png")
            page.screenshot(path=str(written[-1]))
        page.goto(f"{url}/Train_heads?{urlencode({'steps': train_steps})}")
        wait_for_app(page)
        page.get_by_role("button", name="Train", exact=True).click()
        page.get_by_role("button", name="Explore this model").wait_for(timeout=600_000)
        wait_for_app(page, plots=3, timeout_ms=120_000)
        written.append(out / "Train_heads.png")
        page.screenshot(path=str(written[-1]))
        context.close()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs"), help="folder for the PNGs")
    args = parser.parse_args()
    for path in shoot(args.out):
        print(path)


if __name__ == "__main__":
    main()

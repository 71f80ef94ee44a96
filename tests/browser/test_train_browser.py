"""The Train heads page in Debian's Chromium: a 30-step training shows its progress and its live
figures, the trained model opens on Heads with "Explore this model", and Cancel stops a long run
and keeps what it trained."""

from __future__ import annotations

import re

import pytest

from bench.browser import PAGE_PLOTS, tick_labels, wait_for_app, wait_for_link

pytestmark = pytest.mark.browser
#: a tiny two-layer model: 30 steps take a second or two
TINY = "layers=2&heads=2&width=16&train_seed=1"
FIGURES = 3  # loss and accuracy, the probe mosaic, the head scores


def _main(page):
    return page.locator("[data-testid='stMain']")


def test_train_30_steps_then_explore_the_model_on_heads(app_url, page) -> None:
    page.goto(f"{app_url}/Train_heads?{TINY}&steps=30")
    wait_for_app(page, plots=PAGE_PLOTS["Train heads"])
    assert page.locator("h1").first.inner_text().strip() == "Train heads"
    main = _main(page)
    main.get_by_role("button", name="Train", exact=True).click()
    # progress is seen: the bar while it trains, or (a fast machine) the finished count
    main.get_by_text(re.compile(r"Training: step \d+ of 30|30 of 30")).first.wait_for(
        timeout=60_000
    )
    main.get_by_text("30 of 30").wait_for(timeout=120_000)
    wait_for_app(page, plots=FIGURES)
    assert page.locator("[data-testid='stException']").count() == 0
    assert main.get_by_text(re.compile(r"Every head on the probe sequence at step 30")).count()
    held = main.get_by_text(re.compile(r"trained:[0-9a-f]{12}")).first.inner_text()
    name = re.search(r"trained:[0-9a-f]{12}", held).group(0)
    main.get_by_role("button", name="Explore this model").click()
    page.wait_for_url(re.compile(r"/Heads"), timeout=60_000)
    wait_for_app(page, plots=PAGE_PLOTS["Heads"])
    assert page.locator("h1").first.inner_text().strip() == "Heads"
    assert page.locator("[data-testid='stAlertContentError']").count() == 0
    model_box = page.locator("[data-testid='stSidebar'] input[aria-label='Model']")
    assert model_box.input_value() == name
    wait_for_link(page, "model=trained")
    ticks = tick_labels(page, 1)
    assert ticks[0] == "[BOS]" and len(ticks) > 10  # the probe sequence, not the cat


def test_cancel_stops_a_long_run_and_keeps_what_was_trained(app_url, page) -> None:
    page.goto(f"{app_url}/Train_heads?{TINY}&steps=5000")
    wait_for_app(page)
    main = _main(page)
    main.get_by_role("button", name="Train", exact=True).click()
    main.get_by_text(re.compile(r"Training: step [1-9]\d* of 5000")).wait_for(timeout=60_000)
    wait_for_app(page, plots=FIGURES)  # the live figures, while it trains
    main.get_by_role("button", name="Cancel").click()
    main.get_by_text(re.compile(r"Cancelled after step \d+")).wait_for(timeout=60_000)
    text = main.get_by_text(re.compile(r"Cancelled after step \d+")).inner_text()
    assert 0 < int(re.search(r"step (\d+)", text).group(1)) < 5000
    assert main.get_by_text(re.compile(r"trained:[0-9a-f]{12}")).count()
    assert main.get_by_role("button", name="Train", exact=True).is_enabled()

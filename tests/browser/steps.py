"""What several browser tests do on a page: click a button that runs the page's example, wait
for its figures, and read their titles."""

from __future__ import annotations

from bench.browser import wait_for_app


def chart_titles(page) -> list[str]:
    """The titles plotly rendered, chart by chart in the page's order."""
    return page.eval_on_selector_all(
        ".js-plotly-plot .gtitle", "els => els.map(e => e.textContent)"
    )


def titles_after_click(page, button, *, plots: int, timeout_ms: int) -> list[str]:
    """Click ``button`` (a locator), wait until ``plots`` charts are drawn and the app is idle,
    check that the page shows no exception and no error, and return the charts' titles."""
    button.click()
    page.wait_for_function(
        "(n) => document.querySelectorAll('.js-plotly-plot').length >= n",
        arg=plots,
        timeout=timeout_ms,
    )
    wait_for_app(page, plots=plots, timeout_ms=timeout_ms)
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("[data-testid='stAlertContentError']").count() == 0
    return chart_titles(page)

"""The app makes no request beyond its own server: every page opened once, in one browser
context, with every request to another host recorded and cut (as a machine without internet
would), the figures each page draws waited for. The server refuses only the two requests that
Streamlit's frontend makes at a page's path before it finds its root (404s in the console;
streamlit/streamlit#7074, open).

Streamlit shows a Material page icon as the tab's icon by fetching its SVG from
fonts.gstatic.com (its frontend's favicon handling): the app's tab icon is inline SVG
(``ui.navigation.FAVICON``, a data: URL), set before the navigation so that no page's Material
icon is fetched either. The icons in the navigation and the buttons come from the Material
Symbols font Streamlit serves itself.

Left to the server (``bench.browser.streamlit_server`` turns it off on its command line, so the
browser cannot see it): the deployed settings keep Streamlit's usage statistics off, which
would else be sent from the browser.
"""

from __future__ import annotations

import time
import tomllib
from urllib.parse import urlsplit

import pytest

from bench.browser import PAGE_PLOTS, PAGES, ROOT, wait_for_app

pytestmark = pytest.mark.browser
#: the tab's icon is the app's own, inline
_OWN_ICON = """() => document.querySelector("link[rel='shortcut icon']").href
    .startsWith("data:image/svg+xml")"""


#: what Streamlit asks of the page's path before the root (streamlit/streamlit#7074)
_PROBES = ("health", "host-config")


def test_no_page_requests_anything_from_another_host(app_url, browser) -> None:
    local = urlsplit(app_url).netloc
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    outside: list[tuple[str, str]] = []
    errors: list[str] = []
    current = {"page": ""}

    def elsewhere(url: str) -> bool:
        parts = urlsplit(url)
        return parts.scheme not in ("data", "blob", "about") and parts.netloc != local

    def cut(route) -> None:
        outside.append((current["page"], route.request.url))
        route.abort("internetdisconnected")

    context.route(elsewhere, cut)
    page = context.new_page()
    page.on("websocket", lambda ws: elsewhere(ws.url) and outside.append((current["page"], ws.url)))
    page.on("pageerror", lambda e: errors.append(f"{current['page']}: {e}"))
    refused: set[str] = set()  # local answers >= 400
    page.on("response", lambda r: r.status >= 400 and refused.add(urlsplit(r.url).path))
    seconds = {}
    try:
        for name, path in PAGES.items():
            current["page"] = name
            start = time.monotonic()
            page.goto(f"{app_url}/{path}")
            page.locator("h1").first.wait_for()  # its script runs (wait_for_app may come first)
            wait_for_app(page, plots=PAGE_PLOTS[name], timeout_ms=120_000)
            assert page.locator("[data-testid='stException']").count() == 0, name
            seconds[name] = round(time.monotonic() - start, 1)
        page.wait_for_timeout(1000)  # what the last page asks for late
        assert outside == [], outside
        assert page.evaluate(_OWN_ICON)
        # the only local refusals: Streamlit's frontend, opened at /<page>, first asks the page's
        # path for its health and host config (404), then the root (streamlit/streamlit#7074)
        assert refused <= {f"/{p}/_stcore/{end}" for p in PAGES.values() for end in _PROBES}
    finally:
        context.close()
    assert errors == [], errors
    print("seconds per page:", seconds)


def test_the_deployed_settings_send_no_usage_statistics() -> None:
    settings = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert settings["browser"]["gatherUsageStats"] is False

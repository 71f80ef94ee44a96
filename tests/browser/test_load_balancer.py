"""deploy/nginx.conf, the load balancer of the scaling example, in front of two real replicas:
the app works through it (websocket included) and one browser stays on one replica."""

from __future__ import annotations

import re
import urllib.request

import pytest

from bench.browser import chromium, nginx_in_front, streamlit_server, tick_labels, wait_for_app

pytestmark = pytest.mark.browser


def test_two_replicas_behind_the_sticky_load_balancer(tmp_path) -> None:
    with (
        streamlit_server() as one,
        streamlit_server() as two,
        nginx_in_front([one, two], tmp_path) as url,
    ):
        access = tmp_path / "access.log"
        # Streamlit's hashed assets are kept by the proxy: the second request never reaches
        # a replica, and the bytes are the replica's own
        html = urllib.request.urlopen(f"{url}/", timeout=10).read().decode()
        asset = re.search(r"static/js/index\.[\w-]+\.js", html).group(0)
        statuses, bodies = [], []
        for _ in range(2):
            with urllib.request.urlopen(f"{url}/{asset}", timeout=10) as r:
                statuses.append(r.headers["X-Cache-Status"])
                bodies.append(r.read())
        direct = urllib.request.urlopen(f"{one}/{asset}", timeout=10).read()
        assert statuses == ["MISS", "HIT"] and bodies == [direct, direct]
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            console: list[str] = []
            page.on("console", lambda m: console.append(m.text))
            page.on("requestfailed", lambda r: console.append(f"failed {r.url} {r.failure}"))
            page.goto(f"{url}/Heads")
            try:
                wait_for_app(page, plots=3, timeout_ms=120_000)
            except Exception as e:  # say why: the proxy's log and the browser's console
                proxy_log = (tmp_path / "nginx.log").read_text()[-2000:]
                raise AssertionError(
                    f"no heatmaps through nginx: {e}\nnginx: {proxy_log}\nbrowser: {console[-20:]}"
                ) from e
            assert tick_labels(page, 1)[:3] == ["[CLS]", "the", "cat"]
            box = page.get_by_role("textbox", name="Sentence")
            box.fill("Through the proxy.")
            box.press("Control+Enter")  # a rerun over the proxied websocket
            page.wait_for_function(
                "() => [...(document.querySelectorAll('.js-plotly-plot')[1]"
                "?.querySelectorAll('.xtick text') ?? [])]"
                ".some(e => e.textContent === 'proxy')",
                timeout=60_000,
            )
            assert tick_labels(page, 1) == ["[CLS]", "through", "the", "proxy", ".", "[SEP]"]
            # a link as long as the app puts in the address bar passes the proxy
            from urllib.parse import quote

            from ui.state import MAX_LINK_VALUE_BYTES

            text = "Longest link é. " * 400
            while len(quote(text, safe="")) > MAX_LINK_VALUE_BYTES:
                text = text[:-1]
            assert len(quote(text, safe="")) > MAX_LINK_VALUE_BYTES - 10
            page.goto(f"{url}/Heads?text={quote(text, safe='')}")
            wait_for_app(page, plots=3, timeout_ms=120_000)
            assert page.get_by_role("textbox", name="Sentence").input_value() == text
        # stickiness, by behaviour: every request of the browser went to one replica
        served = [ln.split(" ", 1) for ln in access.read_text().splitlines() if ln.strip()]
        replicas = {addr for addr, _ in served if addr != "-"}
        assert len(served) >= 10 and len(replicas) == 1, served[:20]

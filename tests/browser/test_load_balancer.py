"""deploy/nginx.conf, the load balancer of the scaling example, in front of two real replicas:
the app works through it (websocket included) and one browser stays on one replica."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from bench.browser import chromium, free_port, streamlit_server, tick_labels, wait_for_app

pytestmark = pytest.mark.browser
CONF = Path(__file__).resolve().parents[2] / "deploy" / "nginx.conf"


def test_two_replicas_behind_the_sticky_load_balancer(tmp_path) -> None:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    assert Path(nginx).exists(), "nginx is missing: scripts/run-tests.sh installs it (Debian)"
    with streamlit_server() as one, streamlit_server() as two:
        port = free_port()  # chosen once both replicas hold theirs
        servers = "\n".join(f"        server {u.removeprefix('http://')};" for u in (one, two))
        conf = re.sub(r"(?:\s*server app\d:8501;)+", "\n" + servers, CONF.read_text())
        conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{port};")
        conf = conf.replace("/tmp/mhsa-nginx", str(tmp_path / "nginx"))
        if os.geteuid() == 0:  # workers would run as nobody, who cannot enter pytest's tmp_path
            conf = conf.replace("worker_processes auto;", "user root;\nworker_processes auto;")
        assert str(two).removeprefix("http://") in conf
        # the test's copy logs which replica served each request (routing stays as shipped)
        access = tmp_path / "access.log"
        conf = conf.replace(
            "access_log off;",
            f"log_format upstream '$upstream_addr $request'; access_log {access} upstream;",
        )
        (tmp_path / "nginx.conf").write_text(conf)
        log = tmp_path / "nginx.log"
        with log.open("w") as err:
            proc = subprocess.Popen(
                [nginx, "-c", str(tmp_path / "nginx.conf"), "-g", "daemon off;"], stderr=err
            )
        try:
            url = f"http://127.0.0.1:{port}"
            health = b""
            for _ in range(100):
                try:
                    health = urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read()
                    break
                except OSError:
                    time.sleep(0.2)
            assert health == b"ok", log.read_text()
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
                    raise AssertionError(
                        f"no heatmaps through nginx: {e}\nnginx: {log.read_text()[-2000:]}\n"
                        f"browser: {console[-20:]}"
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
        finally:
            proc.terminate()
            proc.wait(timeout=10)

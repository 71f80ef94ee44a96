"""A real Streamlit server and Debian's Chromium driven by Playwright, shared by the browser tests
and the browser benchmarks. Never downloads a browser: it uses /usr/lib/chromium/chromium.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from ui.navigation import PAGES as APP_PAGES
from ui.serve import PRODUCTION_ENV

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("MHSA_CHROMIUM", "/usr/lib/chromium/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: how many plotly charts each page draws once its result is shown, by navigation title
PAGE_PLOTS = {page.title: page.figures for page in APP_PAGES}
#: each page's address under the app's root, by navigation title ("": the home page)
PAGES = {page.title: page.url_path for page in APP_PAGES}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerURL(str):
    """The base URL of a running server, with its process id (for memory readings)."""

    pid: int

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process has used so far, all threads (Linux /proc)."""
        with open(f"/proc/{self.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        """Resident memory of the server process, in MB (Linux /proc)."""
        with open(f"/proc/{self.pid}/status") as fh:
            kb = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
        return kb / 1024


@contextlib.contextmanager
def streamlit_server(
    env: dict[str, str] | None = None,
    timeout: float = 90,
    root: Path = ROOT,
    options: dict[str, str] | None = None,
) -> Iterator[ServerURL]:
    """Serve ``root``'s app.py (this checkout's by default) on 127.0.0.1 at a free port; yields
    the base URL, stops the server after. ``options`` are Streamlit settings given on the command
    line (``{"runner.postScriptGC": "true"}``), over ``.streamlit/config.toml``'s; the process
    environment has ``ui.serve.PRODUCTION_ENV`` unless this one or ``env`` sets it."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(root / "app.py"),
        "--server.headless=true",
        "--server.address=127.0.0.1",
        f"--server.port={port}",
        "--browser.gatherUsageStats=false",
        "--server.fileWatcherType=none",
        *(f"--{name}={value}" for name, value in (options or {}).items()),
    ]
    full_env = {
        **PRODUCTION_ENV,  # as ui.serve starts a deployment
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **(env or {}),
    }
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - a file, not a pipe (a full pipe stalls)
    proc = subprocess.Popen(
        cmd, cwd=root, env=full_env, stdout=log, stderr=subprocess.STDOUT, text=True
    )
    url = ServerURL(f"http://127.0.0.1:{port}")
    url.pid = proc.pid
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                out = log.read()
                raise RuntimeError(f"streamlit did not become healthy:\n{out[-3000:]}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """A Playwright Browser on Debian's Chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def wait_for_app(page, *, plots: int = 0, timeout_ms: int = 60_000) -> None:
    """Wait until Streamlit has finished running and at least ``plots`` plotly charts are drawn."""
    page.wait_for_selector("[data-testid='stApp']", timeout=timeout_ms)
    page.wait_for_function(
        """(n) => {
            const running = document.querySelector("[data-testid='stStatusWidget']");
            const drawn = document.querySelectorAll('.js-plotly-plot .main-svg').length;
            return !running && document.querySelectorAll('.js-plotly-plot').length >= n
                && drawn >= n;
        }""",
        arg=plots,
        timeout=timeout_ms,
    )


def wait_for_link(page, *parts: str, timeout_ms: int = 60_000) -> None:
    """Wait until the page's address holds every one of ``parts`` (each as written, or any one
    of a tuple's spellings): the app writes its link at the end of a rerun, after the figures
    are drawn. Fails (a timeout naming the address) when it never does."""
    wanted = [[p] if isinstance(p, str) else list(p) for p in parts]
    try:
        page.wait_for_function(
            "(w) => w.every(any => any.some(p => window.location.href.includes(p)))",
            arg=wanted,
            timeout=timeout_ms,
        )
    except Exception as e:
        raise AssertionError(f"the address {page.url!r} never held {wanted}") from e


def tick_labels(page, chart: int, axis: str = "x") -> list[str]:
    """The tick labels plotly actually rendered on one chart's axis."""
    return page.eval_on_selector_all(
        f".js-plotly-plot >> nth={chart} >> .{axis}tick text",
        "els => els.map(e => e.textContent)",
    )


NGINX_CONF = ROOT / "deploy" / "nginx.conf"


@contextlib.contextmanager
def nginx_in_front(replicas: list[str], folder: Path) -> Iterator[str]:
    """``deploy/nginx.conf`` as shipped, in front of ``replicas`` (base URLs of running
    servers) on a free port; its files in ``folder``, and an access log ``folder/access.log``
    of which replica served each request ("-": none, such as a cache hit). Yields its base URL
    once it answers the app's health check."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        raise RuntimeError("nginx is missing: scripts/run-tests.sh installs it (Debian)")
    port = free_port()
    servers = "\n".join(f"        server {u.removeprefix('http://')};" for u in replicas)
    conf = re.sub(r"(?:\s*server app\d:8501;)+", "\n" + servers, NGINX_CONF.read_text())
    conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    conf = conf.replace("/tmp/mhsa-nginx", str(folder / "nginx"))
    if os.geteuid() == 0:  # workers would run as nobody, who may not enter ``folder``
        conf = conf.replace("worker_processes auto;", "user root;\nworker_processes auto;")
    conf = conf.replace(
        "access_log off;",
        f"log_format upstream '$upstream_addr $request'; access_log {folder / 'access.log'} "
        "upstream;",
    )
    (folder / "nginx.conf").write_text(conf)
    log = folder / "nginx.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [nginx, "-c", str(folder / "nginx.conf"), "-g", "daemon off;"], stderr=err
        )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.read() == b"ok":
                        break
            except OSError:
                time.sleep(0.2)
        else:
            raise RuntimeError(f"nginx in front did not answer:\n{log.read_text()[-2000:]}")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)

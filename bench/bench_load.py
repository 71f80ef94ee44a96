"""A class on one server: N concurrent browser sessions on the Heads page, each with its own
32-token sentence, first opening a shared link (a fresh visit) and then typing new sentences
(typed reruns).

    python -m bench.bench_load                 # N = 1, 8, 30; production settings and defaults
    python -m bench.bench_load --sessions 8 --typed 2 --configs production

Reported per N and per server configuration:

- **server CPU seconds per page view** (user + system time of the server process from
  ``/proc``, over the phase, divided by the views in it), fresh and typed. This is the capacity
  figure: the browsers run on the same cores as the server, so wall times here are those of a
  machine shared with N Chromium tabs, while the server's CPU per view is what a teacher's
  server spends for each student's view wherever the students' browsers are.
- p50 / p95 of the time to render: from navigation (fresh) or from Ctrl+Enter (typed) to every
  figure of the page drawn with the session's own tokens, measured in the page's own clock.
- the server's resident memory after each phase.

Configurations: ``production`` is the app as served (``.streamlit/config.toml``);
``defaults`` puts back Streamlit's defaults for the settings that config changes (the file
watcher, the post-run garbage collection), so the ratios say what those settings are worth.
Targets (issue 28), at 32 tokens: <= 0.10 s server CPU per typed rerun, <= 0.30 s per fresh
visit.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import tempfile
import time
import urllib.parse
from pathlib import Path

from bench.browser import chromium, nginx_in_front, streamlit_server
from bench.common import print_table

#: Streamlit's defaults for the settings ``.streamlit/config.toml`` changes for production
CONFIGS: dict[str, dict[str, str]] = {
    "production": {},
    "defaults": {"server.fileWatcherType": "auto", "runner.postScriptGC": "true"},
    "production+nginx": {},  # behind deploy/nginx.conf, which keeps Streamlit's static files
}
TARGETS = {"typed": 0.10, "fresh": 0.30}
WORDS = (
    "river castle violin planet garden rocket pencil window forest silver morning yellow "
    "teacher student summer winter market bridge island mountain"
).split()

#: set in every page (an init script): when the Heads page shows the session's marker word as
#: the first word of the selected head's axis, with every figure drawn and Streamlit idle,
#: ``window.__done`` takes the page's clock (ms since navigation)
WATCH = """
(() => {
  const fromUrl = new URLSearchParams(location.search).get('text');
  if (window.__marker === undefined && fromUrl) window.__marker = fromUrl.split(' ')[1];
  window.__done = null;
  const tick = () => {
    const plots = document.querySelectorAll('.js-plotly-plot');
    const drawn = document.querySelectorAll('.js-plotly-plot .main-svg').length;
    const labels = plots[1] ? [...plots[1].querySelectorAll('.xtick text')] : [];
    if (window.__done === null && plots.length >= 3 && drawn >= 3 && labels.length > 3
        && labels[2].textContent === String(window.__marker)
        && !document.querySelector("[data-testid='stStatusWidget']")) {
      window.__done = performance.now();
    }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
})();
"""


def sentence(marker: int, seed: int) -> str:
    """About 32 tokens for MiniLM: 'Student <marker>' and 28 common words, new for each seed."""
    rng = random.Random(seed)
    return f"Student {marker} " + " ".join(rng.choice(WORDS) for _ in range(28)) + "."


def _wait_all(pages: list, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    for page in pages:
        left_ms = max(1000, int((deadline - time.monotonic()) * 1000))
        page.wait_for_function("() => window.__done !== null", timeout=left_ms)


def _percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95


def run_config(browser, n: int, typed_rounds: int, config: str) -> dict[str, float]:
    """One fresh server: a warm-up visit, N fresh visits at once, then ``typed_rounds`` rounds in
    which every session types a new sentence at once."""
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(streamlit_server(options=CONFIGS[config], timeout=180))
        url = server
        if config.endswith("+nginx"):
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            url = stack.enter_context(nginx_in_front([server], folder))
        return _visits(browser, server, url, n, typed_rounds)


def _prime(browser, url: str) -> None:
    """One visit before the timed ones (the first student of a class primes the caches)."""
    warm = browser.new_context()
    warm.add_init_script(WATCH)
    page = warm.new_page()
    page.goto(f"{url}/Heads?text={urllib.parse.quote(sentence(199, 0))}")
    _wait_all([page])
    warm.close()


def _sessions(browser, n: int) -> tuple[list, list]:
    """``n`` fresh browser contexts (empty caches) and a tab in each."""
    contexts = [browser.new_context(viewport={"width": 1300, "height": 900}) for _ in range(n)]
    for c in contexts:
        c.add_init_script(WATCH)
    for c in contexts:  # thirty tabs on two cores: a navigation may wait minutes
        c.set_default_timeout(600_000)
        c.set_default_navigation_timeout(600_000)
    return contexts, [c.new_page() for c in contexts]


def _typed_round(pages: list, r: int) -> list[float]:
    """Every session types a new sentence at once; each one's ms to its figures drawn."""
    for i, p in enumerate(pages):
        marker = 100 + r  # a new first word each round; 100.. are single tokens
        text = sentence(marker, 1000 * (r + 1) + i)
        box = p.get_by_role("textbox", name="Sentence")
        box.fill(text)
        p.evaluate(
            "(m) => { window.__marker = String(m); window.__done = null; "
            "window.__start = performance.now(); }",
            marker,
        )
        box.press("Control+Enter")
    _wait_all(pages)
    return [p.evaluate("window.__done - window.__start") for p in pages]


def _visits(browser, server, url: str, n: int, typed_rounds: int) -> dict[str, float]:
    _prime(browser, url)
    contexts, pages = _sessions(browser, n)
    cpu = server.cpu_seconds()
    for i, p in enumerate(pages):
        p.goto(f"{url}/Heads?text={urllib.parse.quote(sentence(i, i))}", wait_until="commit")
    _wait_all(pages)
    fresh_cpu = (server.cpu_seconds() - cpu) / n
    fresh_ms = [p.evaluate("window.__done") for p in pages]
    rss_fresh = server.rss_mb()

    typed_ms: list[float] = []
    cpu = server.cpu_seconds()
    for r in range(typed_rounds):
        typed_ms += _typed_round(pages, r)
    typed_cpu = (server.cpu_seconds() - cpu) / (n * typed_rounds)
    rss_typed = server.rss_mb()
    for c in contexts:
        c.close()
    fresh_p50, fresh_p95 = _percentiles(fresh_ms)
    typed_p50, typed_p95 = _percentiles(typed_ms)
    return {
        "fresh_cpu": fresh_cpu,
        "typed_cpu": typed_cpu,
        "fresh_p50": fresh_p50 / 1000,
        "fresh_p95": fresh_p95 / 1000,
        "typed_p50": typed_p50 / 1000,
        "typed_p95": typed_p95 / 1000,
        "rss_fresh": rss_fresh,
        "rss_typed": rss_typed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 30])
    parser.add_argument("--typed", type=int, default=3, help="typed rounds per session")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from mhsa.engine.models.loading import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    print(f"tokens per sentence: {len(tokenizer(sentence(0, 0))['input_ids'])}")
    rows = []
    with chromium() as browser:
        for n in args.sessions:
            measured = {c: run_config(browser, n, args.typed, c) for c in args.configs}
            for name, m in measured.items():
                row = {"N": n, "config": name}
                row["CPU/fresh (s)"] = m["fresh_cpu"]
                row["CPU/typed (s)"] = m["typed_cpu"]
                if name != "defaults" and "defaults" in measured:
                    base = measured["defaults"]
                    row["vs defaults"] = (
                        f"{m['fresh_cpu'] / base['fresh_cpu']:.2f}x / "
                        f"{m['typed_cpu'] / base['typed_cpu']:.2f}x"
                    )
                else:
                    row["vs defaults"] = "-"
                row["fresh p50/p95 (s)"] = f"{m['fresh_p50']:.2f} / {m['fresh_p95']:.2f}"
                row["typed p50/p95 (s)"] = f"{m['typed_p50']:.2f} / {m['typed_p95']:.2f}"
                row["RSS (MB)"] = f"{m['rss_fresh']:.0f} / {m['rss_typed']:.0f}"
                if name.startswith("production"):
                    # to the clock's resolution (10 ms ticks over the phase)
                    met = round(m["fresh_cpu"], 3) <= TARGETS["fresh"]
                    met = met and round(m["typed_cpu"], 3) <= TARGETS["typed"]
                    row["targets"] = "met" if met else "MISSED"
                else:
                    row["targets"] = "-"
                rows.append(row)
            print(f"N={n}:", rows[-len(measured) :], flush=True)
    print()
    print_table(rows, list(rows[0]))


if __name__ == "__main__":
    main()

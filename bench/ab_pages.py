"""Two versions of the app compared page by page at 512 tokens, interleaved (the VM's speed
drifts over an hour, so runs minutes apart do not compare).

    PYTHONPATH=. .venv/bin/python -m bench.ab_pages --a /path/to/other/checkout \
        [--b .] [--b-env OMP_NUM_THREADS=1] [--rounds 6] [--pages "Overview,Heads,Head similarity"]

Each round starts A's server and then B's (B first in odd rounds), each with a fresh browser
context; the model loads before timing, then Overview and each page named are opened by link in
a new tab while the server computes them: the benchmark's first visits (``bench_browser``).
Prints every round and each page's median per side: the time until every figure is first
drawn (the benchmark's measure) and, as "settled", until the tab's main thread is also done
(the end of its last long task, read 1.5 s later; the chart element's second pass over each
figure comes after the first drawing, and whether the benchmark's poll lands before or after it
is luck).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.bench_browser import LONG_QUERY, _wait_for_page, fresh_context
from bench.browser import PAGES, chromium, streamlit_server

#: long tasks (over 50 ms) of the tab's main thread, recorded from its start
LONG_TASKS = """
window.__longTaskEnds = [];
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) window.__longTaskEnds.push(e.startTime + e.duration);
}).observe({type: "longtask", buffered: true});
"""


def _settled(page, drawn_s: float) -> float:
    """Seconds from navigation to the end of the tab's last long task (at least ``drawn_s``)."""
    time.sleep(1.5)
    ends = page.evaluate("window.__longTaskEnds")
    return max([drawn_s, *(e / 1000 for e in ends)])


def _env(pairs: list[str]) -> dict[str, str]:
    return dict(p.split("=", 1) for p in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=Path, required=True, help="checkout A (the baseline)")
    parser.add_argument("--b", type=Path, default=Path("."), help="checkout B (default: this one)")
    parser.add_argument("--a-env", nargs="*", default=[], metavar="K=V")
    parser.add_argument("--b-env", nargs="*", default=[], metavar="K=V")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pages", default="Overview,Heads,Head similarity")
    args = parser.parse_args()
    pages = [p.strip() for p in args.pages.split(",") if p.strip()]
    unknown = [p for p in pages if p not in PAGES]
    if unknown:
        parser.error(f"unknown pages {unknown}: choose from {', '.join(PAGES)}")
    sides = {"A": (args.a.resolve(), _env(args.a_env)), "B": (args.b.resolve(), _env(args.b_env))}
    times: dict[tuple[str, str], list[float]] = {(s, p): [] for s in sides for p in pages}
    settled: dict[tuple[str, str], list[float]] = {(s, p): [] for s in sides for p in pages}
    with chromium() as browser:
        for rnd in range(args.rounds):
            for side in ("A", "B") if rnd % 2 == 0 else ("B", "A"):
                root, env = sides[side]
                with streamlit_server(env=env, root=root) as url:
                    context = fresh_context(browser, url)
                    context.add_init_script(LONG_TASKS)
                    for name in ["Overview", *[p for p in pages if p != "Overview"]]:
                        page = context.new_page()
                        start = time.perf_counter()
                        page.goto(f"{url}/{PAGES[name]}?{LONG_QUERY}")
                        _wait_for_page(page, name)
                        if name in pages:
                            times[(side, name)].append(time.perf_counter() - start)
                            settled[(side, name)].append(_settled(page, times[(side, name)][-1]))
                        page.close()
                    context.close()
            print(
                rnd,
                {
                    f"{s}/{p}": (round(t[-1], 2), round(settled[s, p][-1], 2))
                    for (s, p), t in times.items()
                    if t
                },
                flush=True,
            )
    for (side, name), t in times.items():
        for what, values in (("drawn", t), ("settled", settled[side, name])):
            rounds = ", ".join(f"{x:.2f}" for x in values)
            print(f"{side} {name} {what}: median {statistics.median(values):.3f} s ({rounds})")


if __name__ == "__main__":
    main()

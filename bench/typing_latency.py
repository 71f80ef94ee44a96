"""Typing latency alone (Ctrl+Enter to every figure of the Heads page drawn), 7 rounds: run it on
two checkouts in one session to compare them on the same machine."""

import statistics

from bench.bench_browser import typing_latency
from bench.browser import chromium, streamlit_server

if __name__ == "__main__":
    with streamlit_server() as url, chromium() as browser:
        times = typing_latency(browser, url, repeats=7)
    print(
        f"median {statistics.median(times):.2f} s over 7 ({', '.join(f'{t:.2f}' for t in times)})"
    )

"""The server's memory housekeeping (``ui.runtime``): a full collection every
``GC_EVERY_RUNS`` page runs, then the freed heap pages handed back to the system."""

from __future__ import annotations

import gc
import sys

import pytest

from ui import runtime


def rss_mb() -> float:
    """This process's resident memory (``VmRSS``), in MB."""
    with open("/proc/self/status") as fh:
        return int(next(ln for ln in fh if ln.startswith("VmRSS:")).split()[1]) / 1024


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not runtime.release_freed_memory(),
    reason="needs glibc's malloc_trim (not macOS, Windows or musl)",
)
def test_freed_heap_pages_go_back_to_the_system() -> None:
    """200 MB of 2 KB objects, 9 in 10 freed: glibc keeps the pages (every fifth still holds a
    live object, so the heap cannot shrink from its top) until ``release_freed_memory``."""
    objects = [bytes(2000) for _ in range(100_000)]
    kept = objects[::10]
    del objects
    before = rss_mb()
    assert runtime.release_freed_memory() is True
    after = rss_mb()
    assert before - after > 60, (before, after)
    assert len(kept) == 10_000


def test_every_sixteenth_page_run_collects_then_releases(monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(runtime, "_page_runs", iter(range(1, 100)))
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append("collect") or 0)
    monkeypatch.setattr(runtime, "release_freed_memory", lambda: calls.append("release") or True)
    for _ in range(2 * runtime.GC_EVERY_RUNS):
        runtime.collect_now_and_then()
    assert calls == ["collect", "release"] * 2

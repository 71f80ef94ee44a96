"""Fixtures of the page tests."""

from __future__ import annotations

import threading

import pytest

from ui import core


@pytest.fixture
def one_slot(monkeypatch):
    """The process's heavy queue with one slot, taken by a job until ``release`` is set."""
    monkeypatch.setenv("MHSA_MAX_HEAVY", "1")
    core.heavy_queue.cache_clear()
    queue = core.heavy_queue()
    release, started = threading.Event(), threading.Event()

    def hold(progress):
        started.set()
        while not release.wait(0.02):
            progress(0, 1)

    holder = queue.submit(("test", "holder"), hold, "another student's job")
    assert started.wait(5)
    yield queue, release
    release.set()
    holder.wait(10)
    core.heavy_queue.cache_clear()

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


@pytest.fixture
def tiny_bert(tiny_bert_path: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The tiny BERT (the default model's tokens, 2 layers of 4 heads), allowed in links: pass
    it as ``model=`` where the model is not what a page test tests."""
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", tiny_bert_path)
    return tiny_bert_path


@pytest.fixture
def with_toy_atlas(explained_toy_atlas: str, monkeypatch: pytest.MonkeyPatch):
    """The app's atlases with the explained toy atlas listed first (the session's MiniLM atlas,
    without explanations, after it); the pages' listings read afresh before and after."""
    import os

    from ui.views import atlas as atlas_views
    from ui.views import explain as explain_views

    others = os.environ.get("MHSA_ATLAS_DIR", "")
    monkeypatch.setenv(
        "MHSA_ATLAS_DIR", os.pathsep.join(p for p in (explained_toy_atlas, others) if p)
    )
    atlas_views._listing.clear()
    explain_views._saved.clear()
    yield explained_toy_atlas
    atlas_views._listing.clear()
    explain_views._saved.clear()

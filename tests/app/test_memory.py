"""Memory while many sessions browse long texts: results are shared, never copied per rerun, and
the process keeps at most MHSA_RESULT_CACHE_MB of them."""

from __future__ import annotations

import pytest

from tests.app.test_pages import run
from tests.app.test_runtime import rss_mb
from ui import core, runtime

pytestmark = pytest.mark.slow


def _rss_mb() -> float:
    """Resident memory, after handing freed heap pages back to the system (glibc keeps them
    otherwise, which would measure the allocator rather than what the app holds)."""
    runtime.release_freed_memory()
    return rss_mb()


def test_long_texts_stay_within_the_result_budget(monkeypatch) -> None:
    monkeypatch.setenv("MHSA_RESULT_CACHE_MB", "160")  # two MiniLM results at 512 tokens
    core.result_cache.clear()  # a fresh process-wide cache that reads the limit
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    texts = [" ".join(words[i:] + words[:i]) + " " + " ".join(["word"] * 600) for i in range(10)]
    at = run("pages/1_Heads.py", text=texts[0])  # warm: model loaded, first result cached
    assert not at.exception and not at.error
    start = _rss_mb()
    for text in texts[1:] + texts[:2]:  # nine sessions with new texts, then two revisits
        at = run("pages/5_Rollout.py", text=text)
        assert not at.exception and not at.error
        assert any("tokens were dropped" in w.value for w in at.warning)  # 512 tokens
    cache = core.result_cache()
    one = 6 * 12 * 512 * 512 * 4
    assert len(cache) == 2 and cache.nbytes == 2 * one <= 160 * 2**20
    # ten 75 MB results (755 MB) went through; the process kept two of them and no copies per
    # rerun: it grows by less than the budget and three results' worth of transient buffers
    growth = _rss_mb() - start
    print(f"RSS growth over nine new 512-token texts: {growth:.0f} MB")
    assert growth < 160 + 3 * one / 2**20, (start, growth)
    assert core.attention(core.Query(texts[1])) is core.attention(core.Query(texts[1]))
    core.result_cache.clear()

"""The service computes a long new result's head analyses ahead, at the lowest CPU priority, so
that Head similarity and Head statistics open at once after another page computed the result."""

from __future__ import annotations

import os
import threading

import numpy as np
import pandas as pd
import pytest
import torch

import mhsa
from ui import service

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()


def _long_text(seed: int, words: int = 300) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, size=words))


class _Refuse:
    """Stands in for the service's accumulators: a page computing the analysis itself fails."""

    def __init__(self, *args, **kwargs) -> None:
        raise AssertionError("computed by the page, not ahead")


def test_a_long_new_result_has_its_similarity_and_statistics_computed_ahead(monkeypatch) -> None:
    query = service.Query(_long_text(1))
    result = service.attention(query)
    assert result.num_tokens >= service.PREFETCH_TOKENS
    assert service.prefetcher().wait_idle(120)
    service.head_similarity.clear()
    service.head_stats.clear()
    monkeypatch.setattr(service, "HeadSimilarityAccumulator", _Refuse)
    monkeypatch.setattr(service, "HeadStatsAccumulator", _Refuse)
    similarity = service.head_similarity((query,), "js")
    stats = service.head_stats((query,))
    # the values a page computing them itself gets
    pd.testing.assert_frame_equal(similarity, mhsa.head_similarity(result, metric="js"))
    assert similarity.attrs["metric"] == "js"
    pd.testing.assert_frame_equal(stats, mhsa.head_stats(result))
    with pytest.raises(AssertionError, match="computed by the page"):
        service.head_similarity((query,), "cosine")  # only JS is computed ahead


def test_a_short_result_is_left_to_the_pages() -> None:
    query = service.Query("a short sentence about a cat")
    service.attention(query)
    assert service.prefetcher().wait_idle(120)
    assert service.prefetcher().take(("js", query)) is None


def test_what_a_page_took_is_not_computed_again_and_a_newer_result_wins() -> None:
    model = service.loaded_model("default", "auto")
    first, second = (service.Query(_long_text(s)) for s in (2, 3))
    r1, r2 = (mhsa.attend(q.text, model=model) for q in (first, second))
    ahead = service.Prefetcher()
    ahead.take(("js", second))  # a page is computing this one itself
    ahead.submit(first, r1)
    ahead.submit(second, r2)  # at once: the first may be dropped, never mixed up
    assert ahead.wait_idle(120)
    assert ahead.take(("js", second)) is None
    stats = ahead.take(("stats", second))
    assert stats is not None
    pd.testing.assert_frame_equal(stats, mhsa.head_stats(r2))
    done = ahead.take(("js", first))
    if done is not None:  # the first ran before the second arrived
        pd.testing.assert_frame_equal(done, mhsa.head_similarity(r1, metric="js"))


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="per-thread priority is Linux's")
def test_the_thread_and_the_torch_threads_it_starts_run_at_the_lowest_priority() -> None:
    query = service.Query(_long_text(4))
    service.attention(query)
    assert service.prefetcher().wait_idle(120)
    thread = service.prefetcher()._thread
    assert thread is not None and thread.name == "mhsa-prefetch"
    assert os.getpriority(os.PRIO_PROCESS, thread.native_id) == 19
    niced = [
        tid
        for tid in os.listdir("/proc/self/task")
        if os.getpriority(os.PRIO_PROCESS, int(tid)) == 19
    ]
    python_threads = {t.native_id for t in threading.enumerate()}
    torch_workers = [tid for tid in niced if int(tid) not in python_threads]
    # torch's worker threads started from it (one fewer than torch's threads) inherited it
    assert len(torch_workers) >= torch.get_num_threads() - 1 >= 1, niced
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0

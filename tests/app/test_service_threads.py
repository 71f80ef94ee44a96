"""The service runs a page's own computations on one core fewer than the machine has (the
browser and Streamlit's event loop keep one), in the page's thread only."""

from __future__ import annotations

import os
import threading

import torch

import mhsa
from ui.core import Query
from ui.views import similarity


def test_page_analyses_run_on_one_core_fewer_in_their_own_thread_only(monkeypatch) -> None:
    seen: dict[str, int] = {}

    class Recording(mhsa.analysis.stats.HeadSimilarityAccumulator):
        def add(self, result: mhsa.AttentionResult) -> None:
            seen["analysis"] = torch.get_num_threads()
            seen["other thread"] = _in_new_thread(torch.get_num_threads)
            super().add(result)

    monkeypatch.setattr(similarity, "HeadSimilarityAccumulator", Recording)
    similarity.head_similarity.clear()
    before = torch.get_num_threads()
    query = Query("Threads of a page's own work.")
    frame = similarity.head_similarity((query,), "cosine")
    assert frame.shape == (72, 72)
    assert 1 <= seen["analysis"] <= before
    if os.cpu_count() == before > 1:  # no CPU beyond torch's threads (CI's 2 cores): one fewer
        assert seen["analysis"] == before - 1
    assert seen["other thread"] == before  # another session's thread keeps every core
    assert torch.get_num_threads() == before  # and so does this one afterwards


def _in_new_thread(fn):
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]

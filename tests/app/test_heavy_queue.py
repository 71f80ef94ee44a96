"""Heavy work waits its turn on the pages (AppTest): with one slot taken, a corpus waits, says
how many jobs are ahead, the page still draws its figures, and Cancel takes the job out."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import mhsa
from mhsa.corpus.jobs import JobState

ROOT = Path(__file__).resolve().parents[2]
CORPUS = "The cat sat.\nDogs bark loudly, all night."


def titles(at: AppTest) -> list[str]:
    return [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]


@pytest.mark.slow
def test_a_waiting_corpus_shows_its_place_the_page_still_draws_and_cancel_removes_it(
    one_slot,
) -> None:
    queue, release = one_slot
    at = AppTest.from_file(str(ROOT / "pages/3_Head_statistics.py"), default_timeout=120).run()
    at.text_area(key="corpus").input(CORPUS).run()
    assert not at.exception
    waiting = [i.value for i in at.info if "waits its turn" in i.value]
    assert waiting and "1 heavy job ahead of you" in waiting[0], [i.value for i in at.info]
    assert queue.counts() == (1, 1)
    # the page's figures are drawn meanwhile: the sidebar sentence's statistics
    assert len(at.dataframe[0].value) == 72
    assert any(t.startswith("entropy") or "entropy" in t for t in titles(at)), titles(at)
    assert "1 sentence(s)" in " ".join(c.value for c in at.caption)
    # cancel: the job leaves the queue, and the page says so instead of queueing it again
    next(b for b in at.button if b.label == "Cancel").click().run()
    assert queue.counts() == (1, 0)
    assert any("cancelled" in i.value for i in at.info)
    # once the slot is free, "Run it again" computes the corpus
    release.set()
    for _ in range(500):  # the other job's thread ends and frees the slot (no race with the click)
        if queue.counts() == (0, 0):
            break
        time.sleep(0.01)
    next(b for b in at.button if b.label == "Run it again").click().run()
    assert not at.exception
    corpus = at.dataframe[0].value
    want = mhsa.head_stats(
        [mhsa.attend(t) for t in ["The cat sat.", "Dogs bark loudly, all night."]]
    )
    assert corpus["entropy"].to_numpy() == pytest.approx(want["entropy"].to_numpy(), rel=1e-5)
    assert "2 sentence(s)" in " ".join(c.value for c in at.caption)


@pytest.mark.slow
def test_importance_waits_behind_a_running_job_and_starts_by_itself(one_slot) -> None:
    queue, release = one_slot
    at = AppTest.from_file(str(ROOT / "pages/7_Head_importance.py"), default_timeout=180)
    at.query_params["text"] = "Cats purr."
    at.run()
    assert not at.exception
    assert any("1 heavy job ahead of you" in i.value for i in at.info)
    assert not [t for t in titles(at) if t.startswith("Importance of each head")]
    job = at.session_state["_mhsa_jobs"]["importance"]
    assert job.state is JobState.WAITING
    release.set()  # the other job ends: this one starts without a click
    assert job.wait(120) and job.state is JobState.DONE
    at.run()
    assert [t for t in titles(at) if t.startswith("Importance of each head")]
    assert queue.counts() == (0, 0)

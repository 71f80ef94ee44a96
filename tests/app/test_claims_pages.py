"""Every role a page states shows its support (``mhsa.analysis.claims``): Head statistics,
Compare and Head roles, each counted here by hand from the attention the library returns."""

from __future__ import annotations

import re

import numpy as np

import mhsa
from tests.app.test_pages import run

CAT = "The cat sat on the mat."  # 9 tokens with [CLS] and [SEP]


def _previous_counts(text: str) -> tuple[int, int]:
    """Query rows of the default model on ``text``: those with a previous token, and all."""
    n = len(mhsa.attend(text).tokens)
    return n - 1, n


def test_head_statistics_shows_every_role_with_its_queries() -> None:
    at = run("pages/3_Head_statistics.py")
    assert not at.exception
    table = at.dataframe[0].value
    with_prev, every = _previous_counts(CAT)
    stats = mhsa.head_stats(mhsa.attend(CAT))
    for head, shown in table["role"].items():
        role = stats.loc[head, "role"]
        rows = with_prev if role in ("previous token", "next token") else every
        assert shown == f"{role}: {rows} of {every} queries", (head, shown)
    # 9 tokens: only offset 0 reaches 90% of them, so no head is called positional elsewhere
    a = mhsa.attend(CAT).attention  # (L, H, n, n)
    self_hits = (a.argmax(-1) == np.arange(every)).sum(-1).reshape(-1)
    for (head, shown), hits in zip(table["positional"].items(), self_hits, strict=True):
        if hits >= 0.9 * every:
            assert shown == f"positional +0: {hits} of {every} queries", head
        else:
            assert shown.startswith(f"not positional (+0: {hits} of {every}"), head


def test_compare_says_each_role_and_positional_call_with_its_support() -> None:
    """The issue's pair: Compare printed "positional 8" next to role "broad"; each call now
    carries its counts, and a 15-token second sentence can call offset -1 (14 queries)."""
    second = "The dog sat on the log and ate a big bone today."
    at = run("pages/6_Compare.py", text2=second)
    assert not at.exception
    diff = at.dataframe[0].value
    with_prev, every = _previous_counts(second)
    assert diff.loc["L0H2", "role 2"] == f"previous token: {with_prev} of {every} queries"
    for column in ("positional 1", "positional 2"):
        for shown in diff[column]:
            assert re.fullmatch(
                r"positional [+-]\d+: \d+ of \d+ queries|not positional \(.*\)|too few .*", shown
            ), shown
    a = mhsa.attend(second).attention[0, 2]
    hits = int((a.argmax(-1)[1:] == np.arange(every - 1)).sum())
    assert hits >= 0.9 * (every - 1)  # L0H2 takes -1 for the 14 queries that have it
    assert diff.loc["L0H2", "positional 2"] == f"positional -1: {hits} of {every - 1} queries"


def test_head_roles_top_heads_are_ranked_with_their_whole() -> None:
    at = run("pages/10_Head_roles.py", model="toy:induction", detector="previous token")
    assert not at.exception
    scores = mhsa.detect_heads(
        mhsa.examples.model_examples("toy:induction")[0].text,
        "previous token",
        model="toy:induction",
    )["score"].sort_values(ascending=False)
    first, second = scores.index[0], scores.index[1]
    said = [c.value for c in at.caption]
    line = (
        f"{first} is the strongest of {len(scores)} heads on the previous token score "
        f"({scores.iloc[0]:.2f}; next {second}, {scores.iloc[1]:.2f})"
    )
    assert line in said, said
    assert (
        f"{first}: score {scores.iloc[0]:.3f}, ranks 1st of {len(scores)} heads by this score"
        in said
    )


def test_head_similarity_map_shows_each_role_with_its_queries_on_hover() -> None:
    from tests.app.test_pages import specs

    at = run("pages/2_Head_similarity.py")
    assert not at.exception
    head_map = specs(at)[1]
    hover = [row[1] for row in head_map["data"][0]["customdata"]]
    with_prev, every = _previous_counts(CAT)
    assert len(hover) == 72
    assert all(re.fullmatch(rf".+: ({with_prev}|{every}) of {every} queries", h) for h in hover)
    labels = [row[0] for row in head_map["data"][0]["customdata"]]
    assert hover[labels.index("L0H2")] == f"previous token: {with_prev} of {every} queries"

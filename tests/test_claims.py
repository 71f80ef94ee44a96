"""Claims carry their support (``mhsa.analysis.claims``): each builder's sentence counted by hand,
not made below its minimum, and the Head statistics table's roles and positional calls made
through them on attention written out by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import mhsa
from mhsa import AttentionResult
from mhsa.analysis.claims import (
    count_claim,
    ordinal,
    positional_claim,
    rank_claim,
    ranking_claim,
    role_claim,
)
from mhsa.analysis.stats import MIN_QUERIES, POSITIONAL_SHARE, with_support


def _result(attention: np.ndarray) -> AttentionResult:
    n = attention.shape[-1]
    tokens = [f"t{i}" for i in range(n)]
    return AttentionResult(
        text="x",
        tokens=tokens,
        attention=attention.astype(np.float32),
        offsets=[(0, 0)] * n,
        special=[False] * n,
        punctuation=[False] * n,
        word_ids=list(range(n)),
        model="hand-made",
        engine="test",
        device="cpu",
    )


def _previous(n: int) -> np.ndarray:
    a = np.zeros((n, n))
    a[0, 0] = 1.0
    a[np.arange(1, n), np.arange(n - 1)] = 1.0
    return a


def test_a_role_is_said_with_its_support_and_not_below_the_minimum() -> None:
    made = role_claim("previous token", 8, 9, minimum=3)
    assert (made.text, made.support, made.of, made.made) == (
        "previous token: 8 of 9 queries",
        8,
        9,
        True,
    )
    assert str(made) == made.text
    refused = role_claim("previous token", 2, 3, minimum=3)
    assert not refused.made and "previous token" not in refused.text
    assert refused.text == "too few tokens to call a role: 2 queries, 3 needed"


def test_a_positional_call_needs_ninety_percent_and_three_queries() -> None:
    assert positional_claim(-1, 8, 8, share=0.9, minimum=3).text == (
        "positional -1: 8 of 8 queries"
    )
    # 9 of 10 is 90%: positional; 8 of 10 is not (9 needed)
    assert positional_claim(2, 9, 10, share=0.9, minimum=3).text.startswith("positional +2")
    no = positional_claim(2, 8, 10, share=0.9, minimum=3)
    assert no.made and no.text == "not positional (+2: 8 of 10 queries, 9 needed)"
    # share 1 over one query row (offset -8 of a 9-token sentence): no call
    one = positional_claim(-8, 1, 1, share=0.9, minimum=3)
    assert not one.made and one.text.startswith("too few tokens to call a positional head")


def test_a_ranking_names_the_strongest_and_its_runner_up_and_refuses_a_tie() -> None:
    values = pd.Series({"L0H0": 0.2, "L0H1": 0.93, "L1H0": 0.41, "L1H1": float("nan")})
    claim, head = ranking_claim(values, "attention to the previous token")
    assert head == "L0H1" and claim.made and claim.support == 3  # the NaN is no head's value
    assert claim.text == (
        "L0H1 is the strongest of 3 heads on attention to the previous token "
        "(0.93; next L1H0, 0.41)"
    )
    tie, none = ranking_claim({"a": 0.5, "b": 0.5, "c": 0.1}, "x")
    assert none is None and not tie.made and "tie at 0.50" in tie.text
    alone, none = ranking_claim({"a": 0.5}, "x")
    assert (
        none is None and not alone.made and alone.text == "too few heads to rank on x: 1, 2 needed"
    )


def test_a_rank_and_a_count_say_their_whole() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th",
    ]  # fmt: skip
    assert rank_claim("a → b (k)", 4, 110, "|score|", unit="edges").text == (
        "a → b (k) ranks 4th of 110 edges by |score|"
    )
    assert not rank_claim("a", 0, 110, "|score|", unit="edges").made
    four = count_claim(4, 5, "ranked alike", unit="heads", whole="the top ")
    assert (four.text, four.support, four.of) == ("4 of the top 5 heads ranked alike", 4, 5)
    assert not count_claim(0, 0, "ranked alike", unit="heads").made


def test_head_statistics_show_each_role_and_positional_call_with_its_support() -> None:
    """Three heads by hand over 10 tokens: previous token (9 of 9 rows with a previous token
    at -1), first token (every row on token 0) and self; the table's role and positional
    columns say each with its counts."""
    n = 10
    first = np.zeros((n, n))
    first[:, 0] = 1.0
    heads = np.stack([_previous(n), first, np.eye(n)])[None]  # (1, 3, n, n)
    shown = with_support(mhsa.head_stats(_result(heads)))
    assert list(shown["role"]) == [
        "previous token: 9 of 10 queries",
        "first token: 10 of 10 queries",
        "self: 10 of 10 queries",
    ]
    # 10 tokens: offsets -1, 0, +1 reach 90% of them. The previous-token head's largest
    # weight is at -1 in 9 of the 9 rows that have a key at -1; the self head at 0 in 10 of 10
    assert shown["positional"].iloc[0] == "positional -1: 9 of 9 queries"
    assert shown["positional"].iloc[2] == "positional +0: 10 of 10 queries"
    # the first-token head: row 1 alone puts its largest weight at -1 (1 of 9)
    assert shown["positional"].iloc[1] == ("not positional (-1: 1 of 9 queries, 9 needed)")


@pytest.mark.parametrize("n", [2, 3])
def test_no_role_and_no_positional_call_on_too_few_tokens(n: int) -> None:
    """A previous-token head over n tokens: n - 1 rows have a previous token; below
    MIN_QUERIES the table says so instead of a role."""
    shown = with_support(mhsa.head_stats(_result(_previous(n)[None, None]))).iloc[0]
    assert MIN_QUERIES == 3 and POSITIONAL_SHARE == 0.9
    assert shown["role"] == f"too few tokens to call a role: {n - 1} queries, 3 needed"
    if n == 2:  # 2 rows: no offset reaches 3 queries
        assert shown["positional"].startswith("too few tokens to call a positional head")


def test_the_default_models_nine_token_sentence_calls_no_head_positional_off_zero() -> None:
    """Issue's text: "The cat sat on the mat." has 9 tokens, so only offset 0 reaches 90% of
    them; no head is called positional at another offset, every role says its support."""
    shown = with_support(mhsa.head_stats(mhsa.attend("The cat sat on the mat.")))
    called = shown["positional"][shown["positional"].str.startswith("positional")]
    assert all(text.startswith("positional +0") for text in called)
    assert shown["role"].str.contains(r": \d+ of 9 queries$").all()

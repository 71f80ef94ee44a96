"""Claims: every role, verdict and ranking the app states, made from the values a page computed,
with the support it rests on, and not made below a stated minimum.

A ``Claim`` is a sentence and its support: how many queries, texts or heads it rests on, out of
how many, and the fewest it may rest on. Below that minimum the claim is not made and its text
says why ("too few tokens to call a role: 2 queries, 3 needed"). The builders here are the one
way the app words a claim, so that a figure and the sentence beside it read the same numbers:

- ``role_claim``: a head's role from ``head_stats`` (Clark et al. 2019), ``previous token: 8 of
  9 queries``;
- ``positional_claim``: Voita et al. 2019's positional head (its largest weight at one relative
  offset for at least 90% of the tokens), ``positional -1: 8 of 8 queries``;
- ``ranking_claim``: the strongest of several values (a head among heads), not made on a tie;
- ``rank_claim``: where one item ranks among others (``4th of 110 edges``);
- ``count_claim``: how many of some items pass a test (``4 of the top 5 heads ranked alike``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

__all__ = [
    "Claim",
    "count_claim",
    "ordinal",
    "positional_claim",
    "rank_claim",
    "ranking_claim",
    "role_claim",
    "role_claims",
]


@dataclass(frozen=True)
class Claim:
    """A statement with what it rests on.

    Attributes:
        text: what is shown: the statement with its support (``previous token: 8 of 9
            queries``), or, when it is not made, why not.
        support: how many queries, texts, heads or items the statement rests on.
        of: out of how many there are.
        minimum: the fewest it is made on.
        made: whether the statement is made (``support >= minimum``); when not, ``text`` says
            so and no role, verdict or ranking is stated.
        unit: what ``support`` counts ("queries", "texts", "heads"...).
    """

    text: str
    support: int
    of: int
    minimum: int
    made: bool
    unit: str = "queries"

    def __str__(self) -> str:
        return self.text


def _support(count: int, of: int, unit: str) -> str:
    return f"{count} of {of} {unit}"


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``22nd``..."""
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


def role_claim(role: str, support: int, of: int, *, minimum: int, unit: str = "queries") -> Claim:
    """A head's role (``head_stats``' ``role``: the kind of key whose mean share passes its
    threshold, after Clark et al. 2019; "broad" or "mixed" otherwise) with the query rows its
    share is a mean over: ``previous token: 8 of 9 queries``. Below ``minimum`` rows no role is
    called: ``too few tokens to call a role: 2 queries, 3 needed``.

    Args:
        role: the role's name.
        support: the query rows the role's share is a mean over (a previous-token share: the
            rows that have a previous token).
        of: all query rows.
        minimum: the fewest rows a role is called on.
        unit: what the rows are.
    """
    support, of = int(support), int(of)
    if support < minimum:
        return Claim(
            f"too few tokens to call a role: {support} {unit}, {minimum} needed",
            support,
            of,
            minimum,
            False,
            unit,
        )
    return Claim(f"{role}: {_support(support, of, unit)}", support, of, minimum, True, unit)


def role_claims(stats: pd.DataFrame, *, minimum: int) -> pd.Series:
    """Every head's ``role_claim`` text from a ``head_stats`` table (its ``role`` and
    ``role_queries``; the rows of all its sentences in ``query_rows``), by head."""
    of = stats["query_rows"] if "query_rows" in stats else stats["role_queries"]
    return pd.Series(
        [
            role_claim(role, support, total, minimum=minimum).text
            for role, support, total in zip(stats["role"], stats["role_queries"], of, strict=True)
        ],
        index=stats.index,
        name="role",
    )


def positional_claim(
    offset: int, hits: int, queries: int, *, share: float, minimum: int, unit: str = "queries"
) -> Claim:
    """Voita et al. 2019's positional head: its largest weight at one relative offset for at
    least ``share`` (0.9) of the query rows that can take that offset. ``hits`` of ``queries``
    rows have their largest weight at ``offset``. Made only on at least ``minimum`` rows: an
    offset one query can take says nothing of a head (``too few tokens to call a positional
    head``); made, the text says positional or not, with the count.

    Args:
        offset: the relative offset ``d`` (key at ``i + d``) most rows' largest weight sits at.
        hits: the rows whose largest weight sits there.
        queries: the rows that have a key at ``i + d`` (0: no offset counts).
        share: the share of rows a positional head needs.
        minimum: the fewest rows the call is made on.
        unit: what the rows are.
    """
    hits, queries = int(hits), int(queries)
    if queries < minimum:
        return Claim(
            f"too few tokens to call a positional head: {queries} {unit}, {minimum} needed",
            queries,
            queries,
            minimum,
            False,
            unit,
        )
    at = _support(hits, queries, unit)
    if hits >= share * queries:
        return Claim(f"positional {offset:+d}: {at}", hits, queries, minimum, True, unit)
    return Claim(
        f"not positional ({offset:+d}: {at}, {math.ceil(share * queries)} needed)",
        hits,
        queries,
        minimum,
        True,
        unit,
    )


def ranking_claim(
    values: Mapping[str, float] | pd.Series,
    what: str,
    *,
    minimum: int = 2,
    unit: str = "heads",
    digits: int = 2,
) -> tuple[Claim, str | None]:
    """The strongest of several values (a head among the heads on one statistic), with how
    many it was ranked among and the runner-up: ``L0H2 is the strongest of 72 heads on
    attention to the previous token (0.93; next L1H4, 0.41)``. Not made among fewer than
    ``minimum`` finite values, nor on a tie at the top (no one head is the strongest).

    Returns:
        The claim and the item it names (None when not made).
    """
    series = pd.Series(values, dtype=float).dropna()
    series = series[series.map(math.isfinite)]
    n = len(series)
    if n < minimum:
        text = f"too few {unit} to rank on {what}: {n}, {minimum} needed"
        return Claim(text, n, n, minimum, False, unit), None
    ordered = series.sort_values(ascending=False, kind="stable")
    first, second = ordered.index[0], ordered.index[1]
    top, runner = float(ordered.iloc[0]), float(ordered.iloc[1])
    if round(top, digits) == round(runner, digits):
        tie = f"{first} and {second} tie at {top:.{digits}f}"
        text = f"no one strongest of {n} {unit} on {what}: {tie}"
        return Claim(text, n, n, minimum, False, unit), None
    text = (
        f"{first} is the strongest of {n} {unit} on {what} ({top:.{digits}f}; next {second}, "
        f"{runner:.{digits}f})"
    )
    return Claim(text, n, n, minimum, True, unit), str(first)


def rank_claim(item: str, rank: int, of: int, what: str, *, unit: str, minimum: int = 2) -> Claim:
    """Where one item ranks among ``of`` (1: first): ``L0H3 → L1H3 (k) ranks 4th of 110 edges
    by |score|``. Not made among fewer than ``minimum`` items, nor for an item that is not
    ranked (``rank`` 0 or past ``of``)."""
    rank, of = int(rank), int(of)
    if of < minimum or not 1 <= rank <= of:
        text = f"{item} is not ranked among the {of} {unit} by {what}"
        return Claim(text, 0, of, minimum, False, unit)
    return Claim(
        f"{item} ranks {ordinal(rank)} of {of} {unit} by {what}", of, of, minimum, True, unit
    )


def count_claim(
    count: int, of: int, statement: str, *, unit: str, minimum: int = 1, whole: str = ""
) -> Claim:
    """How many of ``of`` items pass a test, said only on at least ``minimum`` items:
    ``4 of the top 5 heads ranked alike`` (``whole`` "the top ", ``statement`` "ranked
    alike"); on fewer: ``no heads to say whether ranked alike``."""
    count, of = int(count), int(of)
    if of < minimum:
        return Claim(f"no {unit} to say whether {statement}", count, of, minimum, False, unit)
    return Claim(f"{count} of {whole}{of} {unit} {statement}", count, of, minimum, True, unit)

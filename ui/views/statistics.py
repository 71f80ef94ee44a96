"""The Head statistics page's values (and the statistics other pages set beside theirs): per-head
statistics of a sentence or a corpus, with the named detectors' scores as more columns."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import streamlit as st

import mhsa
from mhsa.analysis.stats import HeadSimilarityAccumulator, HeadStatsAccumulator
from ui.core import (
    LIMITS,
    Progress,
    Query,
    as_distributions,
    attention,
    computed_attention,
    result_cache,
)
from ui.runtime import page_work
from ui.views.roles import RoleMeans

__all__ = [
    "accumulated",
    "corpus_stats",
    "first_sentence_stats",
    "head_stats",
    "head_stats_and_roles",
    "results_one_at_a_time",
]


def results_one_at_a_time(queries: tuple[Query, ...]) -> Iterator[mhsa.AttentionResult]:
    """One query: the shared result. A corpus: one result at a time, each dropped once the
    accumulator has it, and kept out of the shared cache (a corpus must neither hold all its
    arrays at once nor evict every other session's results)."""
    if len(queries) == 1:
        yield attention(queries[0])
        return
    cache = result_cache()
    for q in queries:
        hit = cache.get(q._replace(kind="encoder"))
        yield hit.of_kind(q.kind) if hit is not None else computed_attention(q)


def accumulated(
    acc: HeadStatsAccumulator | HeadSimilarityAccumulator,
    queries: tuple[Query, ...],
    progress: Progress | None = None,
    role_means: RoleMeans | None = None,
) -> pd.DataFrame:
    """The sentences' results added to ``acc`` (and to ``role_means``, whose columns join the
    table) one at a time (``results_one_at_a_time``), as a page's work (``page_work``): its
    table. ``progress`` sees each sentence (raising from it cancels)."""
    with page_work():
        results = results_one_at_a_time(queries)
        for done, (query, result) in enumerate(zip(queries, results, strict=True)):
            if progress:
                progress(done, len(queries))
            acc.add(as_distributions(result))
            if role_means is not None:
                role_means.add(query, result)
    table = acc.frame()
    return role_means.joined(table) if role_means is not None else table


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner="Analysing heads…")
def head_stats(queries: tuple[Query, ...]) -> pd.DataFrame:
    """``mhsa.analysis.stats`` per head over the sentences (``HeadStatsAccumulator``)."""
    return accumulated(HeadStatsAccumulator(), queries)


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner="Analysing heads…")
def head_stats_and_roles(queries: tuple[Query, ...]) -> pd.DataFrame:
    """``head_stats`` with the named detectors' scores (``head_roles``, default options) as
    more columns: the Head statistics page's table."""
    return accumulated(HeadStatsAccumulator(), queries, role_means=RoleMeans())


def corpus_stats(queries: tuple[Query, ...], progress: Progress | None = None) -> pd.DataFrame:
    """``head_stats_and_roles`` of a corpus, one sentence at a time, as a heavy job
    (``progress`` sees each sentence)."""
    return accumulated(HeadStatsAccumulator(), queries, progress, RoleMeans())


def first_sentence_stats(queries: tuple[Query, ...]) -> pd.DataFrame:
    """``head_stats`` of the sentences, of the first of each ``A || B`` pair."""
    return head_stats(tuple(q._replace(text=q.text.split("||")[0]) for q in queries))

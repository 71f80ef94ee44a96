"""The Head similarity page's values: head-to-head similarity over a sentence or a corpus, the
heads' 2-D map and their clusters."""

from __future__ import annotations

import pandas as pd
import streamlit as st

import mhsa
from mhsa.analysis.stats import HeadSimilarityAccumulator
from ui.core import LIMITS, Query
from ui.views.statistics import accumulated

__all__ = ["head_clusters", "head_map", "head_similarity"]


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner="Comparing heads…")
def head_similarity(queries: tuple[Query, ...], metric: str) -> pd.DataFrame:
    """Every pair of heads' similarity under ``metric`` (``HeadSimilarityAccumulator``)."""
    return accumulated(HeadSimilarityAccumulator(metric), queries)


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner=False)
def head_map(queries: tuple[Query, ...], metric: str) -> pd.DataFrame:
    """The heads placed in 2-D by their similarity (``mhsa.analysis.head_map``)."""
    return mhsa.analysis.head_map(head_similarity(queries, metric))


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner=False)
def head_clusters(queries: tuple[Query, ...], metric: str, k: int) -> mhsa.analysis.HeadClusters:
    """Hierarchical clusters of the heads (at most ``k``) under ``metric``."""
    similarity = head_similarity(queries, metric)
    return mhsa.analysis.head_clusters(similarity, min(k, len(similarity)))

"""Cached access to models and results: models once per process, results in a bounded LRU.

Cached functions take the settings (a small tuple of strings), never the large arrays, so that
Streamlit hashes a few bytes per call rather than the attention itself.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd
import streamlit as st

import mhsa
from mhsa.classroom import Walkthrough, walkthrough
from mhsa.limits import Limits

LIMITS = Limits.from_env()


class Query(NamedTuple):
    """What identifies one attention result."""

    text: str
    model: str = "default"
    engine: str = "transformers"
    device: str = "auto"
    seed: int = 0
    words: bool = False


@st.cache_resource(max_entries=LIMITS.model_cache, show_spinner="Loading the model…")
def loaded_model(name: str, device: str) -> mhsa.LoadedModel:
    """One model object per (name, device), shared by every session of the process."""
    Limits.from_env().check_model(name)  # read at call time: the operator's current policy
    return mhsa.load_model(name, device=device, max_parameters=LIMITS.max_parameters)


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner="Computing attention…")
def attention(query: Query) -> mhsa.AttentionResult:
    """The attention result for these settings (tokens or whole words). The ``mhsa`` engine is
    verified against the model's own forward once, here, and the figures travel in the result."""
    if len(query.text) > LIMITS.max_chars:
        raise mhsa.InputError(
            f"The text has {len(query.text):,} characters; this server accepts at most "
            f"{LIMITS.max_chars:,}. Shorten it."
        )
    result = mhsa.attend(
        query.text,
        model=loaded_model(query.model, query.device),
        engine=query.engine,
        max_tokens=LIMITS.max_tokens,
        seed=query.seed,
        verify=query.engine == "mhsa",
    )
    return result.to_words() if query.words else result


def _results(queries: tuple[Query, ...]) -> list[mhsa.AttentionResult]:
    return [attention(q) for q in queries]


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner="Analysing heads…")
def head_stats(queries: tuple[Query, ...]) -> pd.DataFrame:
    return mhsa.head_stats(_results(queries))


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner="Comparing heads…")
def head_similarity(queries: tuple[Query, ...], metric: str) -> pd.DataFrame:
    return mhsa.head_similarity(_results(queries), metric=metric)


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner=False)
def head_map(queries: tuple[Query, ...], metric: str) -> pd.DataFrame:
    return mhsa.head_map(head_similarity(queries, metric))


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner=False)
def rollout(query: Query) -> np.ndarray:
    return mhsa.attention_rollout(attention(query))


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner="Walking through MHSA…")
def classroom(
    query: Query, layer: int | None, d_model: int, num_heads: int, causal: bool
) -> Walkthrough:
    return walkthrough(
        query.text,
        model=loaded_model(query.model, query.device),
        layer=layer,
        d_model=d_model,
        num_heads=num_heads,
        causal=causal,
        seed=query.seed,
    )

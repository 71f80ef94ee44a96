"""The Inside MHSA page's values: the classroom walk-through of one attention layer, step by
step (``mhsa.analysis.classroom``), self- and cross-attention."""

from __future__ import annotations

import streamlit as st

from mhsa.analysis.classroom import Walkthrough, cross_walkthrough, walkthrough
from ui.core import LIMITS, Query, generation, loaded_model, model_input

__all__ = ["classroom", "classroom_cross"]


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner="Walking through MHSA…")
def classroom(
    query: Query, layer: int | None, d_model: int, num_heads: int, causal: bool
) -> Walkthrough:
    """``mhsa.analysis.classroom.walkthrough`` of the query's input (its generated tokens too)."""
    return walkthrough(
        model_input(query),
        model=loaded_model(query.model, query.device),
        layer=layer,
        d_model=d_model,
        num_heads=num_heads,
        causal=causal,
        seed=query.seed,
    )


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner="Walking through cross-attention…")
def classroom_cross(
    query: Query, target: str, layer: int, d_model: int, num_heads: int
) -> Walkthrough:
    """``mhsa.analysis.classroom.cross_walkthrough`` of the sentence (an encoder-decoder's generated
    target when the query asks for one) and ``target``; ``layer``: an encoder-decoder's
    decoder layer."""
    return cross_walkthrough(
        generation(query) if query.generate else query.text,
        target,
        model=loaded_model(query.model, query.device),
        layer=layer,
        d_model=d_model,
        num_heads=num_heads,
        seed=query.seed,
    )

"""The Rollout page's values: attention rollout (Abnar & Zuidema 2020) of the sentence."""

from __future__ import annotations

import numpy as np
import streamlit as st

import mhsa
from ui.core import LIMITS, Query, attention

__all__ = ["rollout"]


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner=False)
def rollout(query: Query) -> np.ndarray:
    """``mhsa.analysis.attention_rollout`` of the query's attention, layer by layer."""
    return mhsa.analysis.attention_rollout(attention(query))

"""Long inputs in the app: the sidebar's layers and heads (link keys ``long_layers``,
``long_heads``), what a page says when a text is over the token limit or the attention budget,
and what a result materialised (``mhsa.partial``: only the selected layers and heads are
computed and kept)."""

from __future__ import annotations

import streamlit as st

import mhsa
from ui.core import LIMITS
from ui.state import md_escape

__all__ = ["HINT", "ask_when_over_budget", "materialised_note", "selection_inputs"]

#: what a page adds when a text was cut or a request was over the attention budget
HINT = (
    "To see a long text whole, choose a layer and a range of heads under **Long inputs** in "
    "the sidebar: only those are computed and kept."
)


def selection_inputs() -> None:
    """The sidebar's layers and heads (empty: all), open when either is set."""
    state = st.session_state
    with st.expander("Long inputs", expanded=bool(state["long_layers"] or state["long_heads"])):
        st.caption(
            f"Over {LIMITS.max_tokens} tokens, or over this server's attention budget "
            f"({LIMITS.max_attention_mb:,} MB), choose what to compute: every other layer "
            "runs a fused kernel and keeps nothing."
        )
        st.text_input(
            "Layers", key="long_layers", max_chars=200, help="As 2, or 0-3,8. Empty: all."
        )
        st.text_input("Heads", key="long_heads", max_chars=200, help="As 0-7. Empty: all.")


def ask_when_over_budget(error: Exception) -> None:
    """After an error that a selection of layers and heads would avoid, say how."""
    if "MHSA_MAX_ATTENTION_MB" in str(error):
        st.info(HINT, icon="✂️")


def materialised_note(result: mhsa.AttentionResult) -> str | None:
    """What a partial or 16-bit result holds and its size, for the Overview (markdown-safe);
    None for a whole float32 result."""
    if not result.is_partial and result.attention_dtype == "float32":
        return None
    return f"Materialised: {md_escape(result.materialised)}."

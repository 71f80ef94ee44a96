"""What every page does: page config, the shared sidebar, the current result, safe messages,
figures with their downloads."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

import mhsa
from ui import data
from ui.data import LIMITS, Query
from ui.state import (
    GLOBAL_PARAMS,
    MAX_LINK_VALUE_BYTES,
    Param,
    md_escape,
    show_notices,
    sync_url,
    use_params,
)

__all__ = ["ENGINE_LABELS", "error", "figure", "finish", "load", "md_escape", "setup", "table"]

ENGINE_LABELS = {
    "transformers": "Model's own attention",
    "mhsa": "Model run through our MHSA module",
    "mhsa-random": "Model with untrained MHSA modules",
}


def setup(title: str, params: dict[str, Param] | None = None) -> Query:
    """Page config, state from the URL, the sidebar. Returns the settings of the result."""
    st.set_page_config(page_title=f"{title} · MHSA Explorer", page_icon="🔍", layout="wide")
    all_params = GLOBAL_PARAMS | (params or {})
    use_params(all_params)
    st.title(title)
    show_notices()
    query = _sidebar()
    st.session_state["_mhsa_params"] = all_params
    return query


def finish() -> None:
    """Mirror the final selections into the URL (call at the end of a page), and say which
    value is too long to travel in a link."""
    too_long = sync_url(st.session_state.get("_mhsa_params", GLOBAL_PARAMS))
    if too_long:
        with st.sidebar:
            st.caption(
                f"Not in the link (too long to share by link, over "
                f"{MAX_LINK_VALUE_BYTES:,} bytes encoded): {', '.join(too_long)}. "
                "Share the text itself alongside the link."
            )


def _sidebar() -> Query:
    with st.sidebar:
        st.header("Settings")
        st.text_area(
            "Sentence",
            key="text",
            max_chars=LIMITS.max_chars,
            height=100,
            help="Press Ctrl+Enter (or click outside) to apply.",
        )
        st.text_input(
            "Model",
            key="model",
            help="'default' is the embedded all-MiniLM-L6-v2 (works offline). "
            "Or a transformers model id, or a local folder.",
        )
        st.radio(
            "Engine",
            list(ENGINE_LABELS),
            key="engine",
            format_func=ENGINE_LABELS.get,
            help="  \n".join(
                f"**{ENGINE_LABELS[e]}**: {mhsa.ENGINE_DESCRIPTIONS[e]}." for e in ENGINE_LABELS
            ),
        )
        if st.session_state["engine"] == "mhsa-random":
            st.number_input("Seed of the untrained weights", min_value=0, step=1, key="seed")
        st.selectbox("Device", ["auto", "cpu", "cuda", "mps"], key="device")
        st.toggle("Whole words (merge sub-word tokens)", key="words")
    s = st.session_state
    return Query(
        s["text"],
        s["model"].strip() or "default",
        s["engine"],
        s["device"],
        int(s["seed"]),
        bool(s["words"]),
    )


def error(e: Exception) -> None:
    st.error(md_escape(str(e)), icon="🚫")


def load(query: Query) -> mhsa.AttentionResult | None:
    """The result for ``query``, or None after showing what went wrong (the page goes on)."""
    try:
        result = data.attention(query)
    except mhsa.MHSAError as e:
        error(e)
        return None
    if result.truncated_tokens:
        st.warning(
            f"The text was cut to {result.num_tokens} tokens: {result.truncated_tokens} tokens "
            f"were dropped (this server's limit is {LIMITS.max_tokens} tokens).",
            icon="✂️",
        )
    with st.sidebar:
        st.caption(f"Running on **{md_escape(result.device)}**")
    return result


def table(frame: pd.DataFrame, name: str, *, label: str, height: int = 400) -> None:
    """A sortable table with its CSV download."""
    st.dataframe(frame, width="stretch", height=height)
    st.download_button(
        label, frame.to_csv(index_label="name"), file_name=f"{name}.csv", mime="text/csv"
    )


def figure(fig: go.Figure, name: str, *, key: str | None = None, **kwargs: Any) -> Any:
    """A plotly chart with PNG (toolbar camera) and standalone-HTML downloads."""
    config = {
        "toImageButtonOptions": {"format": "png", "filename": name, "scale": 2},
        "displaylogo": False,
    }
    event = st.plotly_chart(fig, key=key, config=config, **kwargs)
    st.download_button(
        "Download as HTML",
        data=lambda: fig.to_html(include_plotlyjs=True, full_html=True),
        file_name=f"{name}.html",
        mime="text/html",
        on_click="ignore",
        key=f"html-{key or name}",
    )
    return event

"""Drawn sections about why a head looks where it does (issue 49), kept out of the pages so
that each stays under its line budget: the "Why here?" panel under a head's heatmap (Heads) and
the weights section (Head roles). Values come from ``ui.views.weights``, figures from
``mhsa.plots``."""

from __future__ import annotations

import streamlit as st

import mhsa
from mhsa import plots
from ui import core, page
from ui.core import Query
from ui.state import md_escape
from ui.views import weights

__all__ = ["select_cell", "weights_section", "why_here_panel"]

_SHOWN, _ROW, _KEY = "why-shown", "why-query", "why-key"


def select_cell(chart_key: str) -> None:
    """A click on a cell of the heatmap drawn under ``chart_key`` (its markers:
    ``plots.clickable_cells``, trace 1, ``[row, column, value]``) opens "Why here?" on it."""
    for point in st.session_state[chart_key].selection.get("points", []):
        data = point.get("customdata")
        if point.get("curve_number") == 1 and data is not None:
            values = list(data.values()) if isinstance(data, dict) else list(data)
            st.session_state.update({_SHOWN: True, _ROW: int(values[0]), _KEY: int(values[1])})
            return


def why_here_panel(
    query: Query, result: mhsa.AttentionResult, layer: int, head: int, *, clickable: bool = True
) -> None:
    """ "Why here?" for head (``layer``, ``head``: the model's numbers) of ``result``: the
    chosen cell's largest (query part, key part) terms and the row's other strong keys, as a
    bar chart and a table, with a sentence naming what the largest term is (``clickable``:
    a click on the heatmap above picks the cell, ``select_cell``)."""
    where = "click a cell of the heatmap, or pick one" if clickable else "pick a cell"
    if not st.toggle(f"Why here? A score split into its sources ({where} below)", key=_SHOWN):
        return
    last = result.num_queries - 1
    state = st.session_state
    state[_ROW] = min(max(int(state.get(_ROW, last)), 0), last)
    keys = int(state[_ROW]) if result.causal else result.num_tokens - 1  # a decoder: up to it
    state[_KEY] = min(max(int(state.get(_KEY, 0)), 0), keys)
    left, right = st.columns(2)
    left.number_input("Query position", 0, last, key=_ROW)
    right.number_input("Key position", 0, keys, key=_KEY)
    st.caption(weights.WHY_NOTE)
    row, key = int(state[_ROW]), int(state[_KEY])
    why = page.or_error(weights.why_here, query, layer, head, row, key, result.kind)
    if why is None:
        return
    st.markdown(md_escape(why.sentence))
    title = f"{why.head}: the largest terms of the score at the clicked key and the row's others"
    page.figure(plots.qk_terms_figure(why.bars, title=title), f"{why.head}-why-here", key="why")
    page.table(why.cell, f"{page.file_stem()}-{why.head}-why-here", label="Download (.csv)")


def weights_section(query: Query) -> None:
    """Copying score per head; for a chosen head, "Why here?" on the sentence, its top copied
    tokens, and the positional pattern where the model has learned absolute positions."""
    st.subheader("What the weights say")
    scores = page.or_error(weights.copying_scores, query)
    if scores is None:
        return
    st.caption(weights.COPYING_NOTE)
    page.figure(plots.copying_figure(scores), "copying-scores", key="copying")
    if not str(scores.attrs.get("circuit", "")).startswith("W_E"):
        st.caption("This model has no unembedding: the scores are of W_V W_O alone.")
    head = st.selectbox("Head", list(scores.index), key="weights-head")
    page.atlas_button(head, key="weights-to-atlas")
    result = page.or_error(core.attention, query)
    if result is not None:  # its score at a cell of this text, split
        why_here_panel(query, result, *mhsa.parse_head_label(head), clickable=False)
    if str(scores.attrs.get("circuit", "")).startswith("W_E"):
        top = page.or_error(weights.top_tokens, query, head)
        if top is not None:
            st.caption(f"The tokens {head}'s OV circuit raises most, for common input tokens.")
            page.table(top, f"{page.file_stem()}-{head}-top-tokens", label="Download (.csv)")
    try:
        positions = weights.positional(query)
    except mhsa.UnsupportedModelError as e:
        st.caption(md_escape(f"Positional pattern: {e}"))
        return
    layer, index = mhsa.parse_head_label(head)
    score = positions.previous_token[head]
    page.figure(
        plots.positional_figure(positions.pattern[layer, index], head, positions.reads),
        f"{head}-positional",
        key="positional",
    )
    st.caption(f"{head}'s previous-token score from positions alone: {score:.3f}.")

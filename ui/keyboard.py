"""What a click on a figure does, by keyboard too (WCAG 2.1.1): a choice and a button beside
each figure whose clicks do something, setting the same session keys as the click. The Heads
page's grid and heatmap have theirs already (the layer and head boxes; "Why here?"'s query and
key boxes), as has Line view (its "Lines of" box)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

__all__ = ["edge_picker", "head_picker"]


def head_picker(table: pd.DataFrame, key: str, opened: str) -> None:
    """A head of ``table`` (one row per head: columns ``layer`` and ``head``, the index its
    label) to open on the Heads page: the button sets ``opened`` to ``(layer, head)`` as a
    click on the head's cell does, and reruns (the page opens it)."""
    if table.empty or not {"layer", "head"} <= set(table.columns):
        return
    heads = {str(name): (int(row["layer"]), int(row["head"])) for name, row in table.iterrows()}
    left, right = st.columns([2, 1], vertical_alignment="bottom")
    left.selectbox("Head to open (or click it on the map)", list(heads), key=key)
    if right.button("Open it on the Heads page", key=f"{key}-open"):
        st.session_state[opened] = heads[st.session_state[key]]
        st.rerun()


def edge_picker(edges: pd.DataFrame, key: str, patched: str) -> None:
    """An edge of the drawn circuit (``edges``: columns ``source``, ``target``, ``input``) to
    path-patch: the button sets ``patched`` to ``(source, target, input)`` as a click on the
    edge does."""
    if edges.empty:
        return
    names = {
        f"{r.source} → {r.target}" + (f" ({r.input})" if r.input else ""): (
            str(r.source),
            str(r.target),
            str(r.input),
        )
        for r in edges.itertuples()
    }
    left, right = st.columns([2, 1], vertical_alignment="bottom")
    left.selectbox("Edge to path-patch (or click it in the circuit)", list(names), key=key)
    if right.button("Path-patch this edge", key=f"{key}-patch"):
        st.session_state[patched] = names[st.session_state[key]]

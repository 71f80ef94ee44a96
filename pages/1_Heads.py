"""Heads: every head at a glance, one head large, and where one token attends in every head."""

from __future__ import annotations

import streamlit as st

from mhsa import plots
from ui import page
from ui.state import Param, bounded_int, choice, clamp

PARAMS = {
    "layer": Param(0, bounded_int(0, 1023)),
    "head": Param(0, bounded_int(0, 1023)),
    "token": Param(0, bounded_int(0, 100_000)),
    "view": Param("head", choice("head", "mean-heads", "mean-layers")),
}
VIEWS = {
    "head": "one head",
    "mean-heads": "mean over the heads of the layer",
    "mean-layers": "mean over the layers for this head",
}


def _select_from_grid() -> None:
    """A click on a thumbnail's marker selects that head (customdata = [layer, head])."""
    for point in st.session_state["grid"].selection.get("points", []):
        data = point.get("customdata")
        if point.get("curve_number") == 1 and data is not None:
            values = list(data.values()) if isinstance(data, dict) else list(data)
            st.session_state["layer"], st.session_state["head"] = int(values[0]), int(values[1])
            return


query = page.setup("Heads", PARAMS)
result = page.load(query)
if result is not None:
    layer = clamp("layer", 0, result.num_layers - 1)
    head = clamp("head", 0, result.num_heads - 1)
    token = clamp("token", 0, result.num_tokens - 1)
    page.figure(
        plots.head_grid(result, selected=(layer, head)),
        "all-heads",
        key="grid",
        on_select=_select_from_grid,
        selection_mode="points",
    )
    left, mid, right = st.columns([1, 1, 2])
    left.number_input("Layer", 0, result.num_layers - 1, key="layer")
    mid.number_input("Head", 0, result.num_heads - 1, key="head")
    right.radio("Show", list(VIEWS), key="view", format_func=VIEWS.get, horizontal=True)
    layer, head = st.session_state["layer"], st.session_state["head"]
    view = st.session_state["view"]
    if view == "head":
        fig = plots.head_heatmap(result, layer, head)
    elif view == "mean-heads":
        fig = plots.matrix_heatmap(
            result.attention[layer].mean(0),
            result.tokens,
            result.tokens,
            title=f"Layer {layer}, mean over heads",
            zmax=1.0,
        )
    else:
        fig = plots.matrix_heatmap(
            result.attention[:, head].mean(0),
            result.tokens,
            result.tokens,
            title=f"Head {head}, mean over layers",
            zmax=1.0,
        )
    page.figure(fig, f"L{layer}H{head}-{view}", key="head-large")
    st.subheader("Token focus")
    st.selectbox(
        "Token",
        range(result.num_tokens),
        key="token",
        format_func=lambda i: f"{i}: {result.tokens[i]}",
    )
    page.figure(plots.token_focus(result, st.session_state["token"]), "token-focus", key="focus")
page.finish()

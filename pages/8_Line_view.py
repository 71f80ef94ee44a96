"""Line view (BertViz's head view): the tokens in two columns joined by lines whose opacity is
the weight, every head of a layer in its own colour."""

from __future__ import annotations

import streamlit as st

from mhsa import plots
from ui import core, page
from ui.state import Param, bounded_int, choice, clamp, heads_list_param, index_param
from ui.views import long_inputs

PARAMS = {
    "layer": Param(0, index_param),
    "line_heads": Param([], heads_list_param, old_keys=("lheads",)),
    "line_token": Param(-1, bounded_int(-1, 100_000), old_keys=("ltoken",)),
    "lines_per_token": Param(0, bounded_int(0, 50), old_keys=("lk",)),
    "values": Param("weights", choice(*core.VALUES)),
}


def _select_token() -> None:
    """A click on a token (trace 0: left column, 1: right) shows only its lines; in cross
    attention the right column holds the encoder's tokens, not queries: the left only."""
    columns = (0,) if page.shown_kind() == "cross" else (0, 1)
    for point in st.session_state["lines"].selection.get("points", []):
        if point.get("curve_number") in columns and point.get("customdata") is not None:
            st.session_state["line_token"] = int(point["customdata"])
            return


with page.run("Line view", PARAMS, kinds=True) as query:
    query, result = page.switched_result(query)
    result = core.shown_rows(query)
    long_inputs.focused_layer(result)  # the link's layer: the model's own number
    clamp("line_token", -1, result.num_queries - 1)
    held = list(result.heads)  # the model's head numbers (a partial result's head_ids)
    valid = [h for h in st.session_state["line_heads"] if h in held]
    st.session_state["line_heads"] = valid
    left, mid, right, last = st.columns([1, 3, 2, 1])
    if result.is_partial:
        left.selectbox("Layer", list(result.layers), key="layer")
    else:
        left.number_input("Layer", 0, result.num_layers - 1, key="layer")
    mid.multiselect(
        "Heads shown",
        held,
        key="line_heads",
        format_func=lambda h: f"head {h}",
        placeholder="all heads",
    )
    right.selectbox(
        "Lines of",
        range(-1, result.num_queries),
        key="line_token",
        format_func=lambda i: "every token" if i < 0 else f"#{i} {result.queries[i]}",
    )
    last.number_input(
        "Lines per token (0: automatic)",
        0,
        50,
        key="lines_per_token",
        help="0: all lines up to 40 tokens; beyond, each token's 5 strongest (fewer on long "
        "inputs, so the browser stays quick). More lines draw more slowly.",
    )
    token = st.session_state["line_token"]
    heads = st.session_state["line_heads"] or None
    page.figure(
        plots.line_view(
            result,
            list(result.layers).index(st.session_state["layer"]),
            heads=None if heads is None else [held.index(h) for h in heads],
            token=None if token < 0 else token,
            top_k=st.session_state["lines_per_token"] or None,
        ),
        f"L{st.session_state['layer']}-lines" + ("" if token < 0 else f"-t{token}"),
        key="lines",
        on_select=_select_token,
        selection_mode="points",
    )
    st.caption(
        (
            "Left: the decoder's token attending (query); right: the sentence's token "
            "attended to (key, the encoder's). "
            if result.query_tokens is not None
            else "Left: the token attending (query); right: the token attended to (key). "
        )
        + "A line's "
        "opacity is the weight, its colour the head. Click a token to see only its lines, "
        "click a head in the legend to hide it (double-click: only that head)."
        + (
            " Weighted by value norm: each weight times the norm of the vector the head "
            "carries from that key, each token's lines scaled to sum 1 (Kobayashi et al. 2020)."
            if query.norms
            else ""
        )
    )

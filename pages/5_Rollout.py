"""Rollout: how attention flows from the input tokens through the layers (Abnar & Zuidema)."""

from __future__ import annotations

import streamlit as st

import mhsa
from mhsa import plots
from ui import page
from ui.state import Param, bounded_int, clamp
from ui.views import rollout

PARAMS = {"rollout_layer": Param(-1, bounded_int(-1, 1023), old_keys=("rlayer",))}

with page.run("Attention rollout", PARAMS) as query:
    result = page.load(query)
    if result is None:
        page.stop()
    try:
        roll = rollout.rollout(query)
    except mhsa.MHSAError as e:  # a partial result: rollout needs every layer from 0
        page.error(e)
        page.stop()
    if st.session_state["rollout_layer"] == -1:  # the default: through the last layer
        st.session_state["rollout_layer"] = result.num_layers - 1
    clamp("rollout_layer", 0, result.num_layers - 1)
    st.slider("Through layer", 0, result.num_layers - 1, key="rollout_layer")
    layer = st.session_state["rollout_layer"]
    page.figure(
        plots.rollout_figure(roll, result.tokens, layer), f"rollout-L{layer}", key="rollout"
    )
    per_layer = roll[:, 0, :]  # what reaches the first position ([CLS]/BOS), layer by layer
    page.figure(
        plots.matrix_heatmap(
            per_layer,
            [f"after L{i}" for i in range(result.num_layers)],
            result.tokens,
            title="Rollout into the first token, layer by layer",
            row_title="layer",
            col_title="input token",
            zmax=None,
            value_name="share",
        ),
        "rollout-first-token",
        key="rollout-first",
    )
    st.caption(
        "Per layer: average the heads, add the identity (residual), renormalise rows, "
        "multiply through the layers. Rows sum to 1."
    )

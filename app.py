"""MHSA Explorer: overview page. Run with `streamlit run app.py`."""

from __future__ import annotations

import io

import pandas as pd
import streamlit as st

from ui import data, page

query = page.setup("MHSA Explorer")
st.caption(
    "What do the heads of a multi-head self-attention layer look at? Type a sentence in the "
    "sidebar, then explore the pages: heads, head similarity, statistics, the inside of MHSA, "
    "rollout and comparison."
)
result = page.load(query)
if result is not None:
    model = data.loaded_model(query.model, query.device)
    facts = model.facts()
    st.subheader("Tokens as the model sees them")
    tokens = pd.DataFrame(
        {
            "token": result.tokens,
            "special": result.special,
            "punctuation": result.punctuation,
            "start": [o[0] for o in result.offsets],
            "end": [o[1] for o in result.offsets],
        }
    )
    st.dataframe(tokens.T.astype(str), width="stretch")  # one type per column for Arrow
    st.subheader("Model")
    cols = st.columns(6)
    for col, (name, value) in zip(
        cols,
        [
            ("layers", facts["layers"]),
            ("heads", facts["heads"]),
            ("d_model", facts["d_model"]),
            ("d_head", facts["d_head"]),
            ("parameters", f"{facts['parameters'] / 1e6:.1f}M"),
            ("device", facts["device"]),
        ],
        strict=True,
    ):
        col.metric(name, value)
    st.text(
        f"Model: {facts['model']}  ·  type: {facts['type']}  ·  "
        f"max positions: {facts['max_positions']}"
    )
    timing = st.columns(3)
    timing[0].metric("load time", f"{result.timings['load']:.2f} s")
    timing[1].metric(
        "compute time",
        f"{result.timings['forward'] * 1e3:.1f} ms",
        help="One forward pass of the whole model with this engine.",
    )
    if result.engine == "mhsa-random":
        timing[2].metric("attention blocks", f"untrained, seed {result.seed}")
    if result.max_abs_diff is not None:
        timing[2].metric(
            "model's own forward (check)",
            f"{result.timings.get('verify', 0.0) * 1e3:.1f} ms",
            help="The model's own forward pass, run once more to check our module against it.",
        )
        st.subheader("Our module against the model's own forward")
        st.caption(
            "The sentence ran through the model with every attention block swapped for our "
            "MultiHeadSelfAttention (each layer's output feeding the next), then once more "
            "through the model's own attention. Largest absolute differences:"
        )
        agreement = pd.DataFrame(
            {
                "compared": [f"layer {i} attention weights" for i in range(result.num_layers)]
                + ["final hidden state (the model's output)"],
                "max |ours - model|": [*result.layer_max_abs_diff, result.hidden_max_abs_diff],
            }
        )
        st.dataframe(
            agreement,
            hide_index=True,
            column_config={"max |ours - model|": st.column_config.NumberColumn(format="%.1e")},
        )
    buffer = io.BytesIO()
    result.save(buffer)
    st.download_button(
        "Download the result (.npz)",
        buffer.getvalue(),
        file_name="attention.npz",
        mime="application/octet-stream",
    )
page.finish()

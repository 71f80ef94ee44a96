"""Overview: the tokens as the model sees them, the model's facts, timings, and our module's
agreement with the model's own forward."""

from __future__ import annotations

import streamlit as st
import streamlit.components.v1 as components

import mhsa
from mhsa import plots
from mhsa.analysis.tables import agreement_table, token_table
from ui import exports, lessons, page, state
from ui.state import md_escape
from ui.views import long_inputs, uploads
from ui.views import roles as role_views

UPLOAD_TABS = ["Heads", "Statistics", "Head similarity", "Head roles", "Rollout"]


def _figure(fig, name: str) -> None:
    """An uploaded file's figure: not boxed by the sidebar's sentence, not in the page's zip."""
    page.figure(fig, f"upload-{name}", key=f"upload-{name}", decorate=False, download=False)


def _uploaded(shown: uploads.Imported) -> None:
    """An uploaded file's attention through what the model pages compute from attention."""
    st.caption(shown.summary)
    heads, stats, similar, roles, rollout = st.tabs(UPLOAD_TABS)
    with heads:
        components.html(shown.view_html, height=shown.height, scrolling=True)
    with stats:
        page.frame(shown.stats, width="stretch")
    with similar:
        _figure(plots.similarity_figure(shown.similarity, shown.order), "similarity")
        st.caption("Heads ordered by hierarchical clustering (average linkage).")
    with roles:
        if shown.roles is None:
            st.info("Head detection needs at least two tokens.")
        else:
            maps = [(f"{n.capitalize()} score", shown.roles, n) for n in role_views.ROLE_DETECTORS]
            _figure(plots.role_maps(maps, title="Detection scores (error measure mul)"), "roles")
            st.caption(uploads.ROLES_NOTE)
        sinks = shown.sinks
        _figure(
            plots.sink_map(sinks.received, sinks.heads, sinks.tokens, threshold=sinks.threshold),
            "sinks",
        )
        st.caption(md_escape(sinks.note()))
    with rollout:
        last = shown.rollout.shape[0] - 1
        _figure(plots.rollout_figure(shown.rollout, shown.tokens, last), "rollout")
        st.caption(
            "Per layer: average the heads, add the identity (residual), renormalise rows, "
            "multiply through the layers (Abnar & Zuidema 2020). Rows sum to 1."
        )


with page.run("MHSA Explorer") as query:
    st.caption(
        "What do the heads of a multi-head self-attention layer look at? Type a sentence in the "
        "sidebar, then open the pages in the order below, or follow a lesson."
    )
    st.subheader("Pages, in a good order for a first visit")
    st.markdown(lessons.guide_markdown())
    with st.expander("Attention computed elsewhere: open a .npz or .pt file"):
        upload = st.file_uploader("Attention and tokens", type=uploads.ATTENTION_FILE_TYPES)
        st.caption(md_escape(uploads.HELP))
        if upload is not None:
            try:
                shown = uploads.imported(upload.name, upload.getvalue())
            except mhsa.MHSAError as e:
                state.error(e)
            else:
                _uploaded(shown)
    result = page.load(query)
    if result is None:
        page.stop()
    facts = result.facts
    note = long_inputs.materialised_note(result)
    if note:
        st.info(note)
    st.subheader("Tokens as the model sees them")
    page.frame(token_table(result), width="stretch")
    if result.is_encoder_decoder:
        st.subheader("The decoder's tokens (the target)")
        st.caption(
            "What the decoder reads: the typed target (or the sentence itself when there is "
            "none) or the target the model wrote, its start token first."
        )
        page.frame(token_table(result.of_kind("decoder")), width="stretch")
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
    if mhsa.engine.ENGINE_SPECS[result.engine].seeded:
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
        page.frame(
            agreement_table(result),
            hide_index=True,
            column_config={"max |ours - model|": st.column_config.NumberColumn(format="%.1e")},
        )
    st.download_button(
        "Download the result (.npz)",
        lambda: exports.result_file(result),  # compressed when clicked, not on every run
        file_name=f"{page.file_stem()}.npz",
        mime="application/octet-stream",
        on_click="ignore",
    )

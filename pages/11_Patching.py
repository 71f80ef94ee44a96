"""Patching: which heads carry the difference between a clean and a corrupted text
(activation patching, TransformerLens's conventions, and attribution patching, its fast
first-order estimate)."""

from __future__ import annotations

from typing import Any

import streamlit as st

import mhsa
from mhsa import plots
from ui import core, page
from ui.state import (
    DEFAULT_TEXT,
    Param,
    choice,
    clamp,
    index_param,
    md_escape,
    text_param,
    word_param,
)
from ui.views import patching
from ui.views.patching import PATCH_MODES, PatchSettings

DEFAULT_CORRUPTED = "The dog sat on the mat."
#: the per-position view's layer was chosen (by the link or the box): no longer the strongest
LAYER_CHOSEN = "_patch_layer_chosen"
#: what "effect" means, one line beside the figures (the rest is under the expander)
EFFECT_LINE = (
    "Effect of a head: (metric with it patched − corrupted run) / (clean run − corrupted run): "
    "1 = patching it alone restores the clean output, 0 = it changes nothing."
)


def _choose_layer() -> None:
    st.session_state[LAYER_CHOSEN] = True


PARAMS = {
    "clean": Param(DEFAULT_TEXT, text_param),
    "corrupted": Param(DEFAULT_CORRUPTED, text_param),
    "answer": Param("", word_param),
    "wrong": Param("", word_param),
    "patch_target": Param("embedding", choice(*mhsa.causal.PATCH_TARGETS)),
    "pair": Param("A cat was sitting on the rug.", text_param),
    "patch_mode": Param("both", choice(*PATCH_MODES)),
    "patch_what": Param("z", choice(*mhsa.causal.PATCH_POINTS)),
    "patch_layer": Param(0, index_param),
}
#: the examples' settings: the embedded encoder (a word swapped), and the toy induction model
#: (a repeat, and the same with the symbol before the answer's first occurrence replaced)
EXAMPLES: dict[str, dict[str, Any]] = {
    "Example on the default model (MiniLM)": {
        "model": "default",
        "clean": DEFAULT_TEXT,
        "corrupted": "The dog sat on the mat.",
        "patch_target": "embedding",
        "patch_layer": 0,
    },
    "Example on toy:induction (a repeat, and the repeat broken)": {
        "model": "toy:induction",
        "engine": "transformers",
        "clean": "ba ke mo di fu lo ba ke mo di",
        "corrupted": "ba ke mo ra fu lo ba ke mo di",
        "answer": "fu",
        "wrong": "lo",
        "patch_layer": 0,
    },
}
EXPLANATION = """\
**Activation patching** (clean into corrupted). Run the **corrupted** text; for one head, take its
activation at every position from the run of the **clean** text, keep the layers below as they were
and recompute the layers above; measure the metric m. Its **effect** is (m_patched − m_corrupted) /
(m_clean − m_corrupted): 1 when that head alone restores the clean run, 0 when it changes nothing,
negative when it moves the other way. The activation is the head's output before W_O (**z**), or its
queries, keys (before rotary positions), values or attention pattern. With grouped-query attention,
keys and values are patched per key/value head.

**The metric**: for a model with a next-token head, logit(answer) − logit(wrong) at the last
position (answer and wrong must each be one token after a space). For an encoder, the cosine
similarity of the run's sentence embedding to the clean run's (1 for the clean run), or to a
second sentence's.

**Attribution patching** (Nanda 2023) estimates every head's m_patched − m_corrupted at once:
the gradient of m at the corrupted run times (clean − corrupted activation), summed over
positions: one backward pass instead of one run per head. It is a first-order estimate: it
follows exact patching where the model is close to linear, and misses where a patch saturates
(a softmax that flips). "Both" shows the two maps side by side and their correlation.

**Per position**: each head of one layer patched at one position at a time: where in the text
the head's difference lies.
Everything runs through our module with the model's own weights, whatever the sidebar's engine;
the model is the sidebar's, the two texts are this page's own (not the sidebar's sentence).

**For reference**, TransformerLens's names for the same: `get_act_patch_attn_head_out_all_pos`
(per head) and `get_act_patch_attn_head_out_by_pos` (per position).
"""


def _example(values: dict[str, Any]) -> None:
    """A button's example: its settings into the session (the widgets read them)."""
    st.session_state.update(values)


with page.run("Patching", PARAMS) as sidebar:
    st.caption(
        "Which heads carry the difference between two texts? Patch one head at a time from the "
        "clean run into the corrupted run and see how much of the clean behaviour comes back."
    )
    page.example_buttons(EXAMPLES, _example, sidebar.model, PARAMS)
    state = st.session_state
    # the page's own two texts, with the sidebar's model and device (no generated tokens)
    query = sidebar._replace(text=state["clean"], generate=0)
    page.patch_texts("Clean text (its activations are patched in)", query, answers=False)
    causal = core.can_generate(query.model, query.device)
    if causal:
        page.answer_inputs()
    else:
        page.encoder_target_inputs("patch_target")
    left, right = st.columns(2)
    left.radio("Mode", list(PATCH_MODES), key="patch_mode", format_func=PATCH_MODES.get)
    right.radio(
        "Activation patched",
        list(mhsa.causal.PATCH_POINTS),
        key="patch_what",
        format_func=lambda n: f"{n}: {mhsa.causal.PATCH_POINTS[n].label}",
    )
    with st.expander("What these numbers mean, and the references"):
        st.markdown(EXPLANATION)
    result = page.load(query, primary=False)
    if result is None:
        page.stop()
    page.matched_tokens(
        patching.patch_tokens,
        query,
        state["corrupted"],
        "Patching replaces activations position by position",
    )
    if causal and not (state["answer"].strip() and state["wrong"].strip()):
        st.info("Type the answer and the wrong answer: the metric is their logit difference.")
        page.stop()
    chosen = state.setdefault(LAYER_CHOSEN, "patch_layer" in st.query_params)
    clamp("patch_layer", 0, result.num_layers - 1)
    settings = PatchSettings(
        state["corrupted"],
        state["answer"],
        state["wrong"],
        state["patch_target"],
        state["pair"],
        state["patch_what"],
    )
    # the per-position view opens on the layer with the largest effect, until one is chosen
    mode, layer = state["patch_mode"], state["patch_layer"] if chosen else None
    view = page.heavy_or_stop(
        "patching",
        ("patching", query.text, query.model, query.device, settings, mode, layer),
        lambda progress: patching.patching(query, settings, mode, layer, progress),
        "Patching every head",
    )
    if view.layer is not None and not chosen:
        state["patch_layer"] = view.layer  # before its box is drawn
    st.number_input(
        "Layer of the per-position view",
        0,
        result.num_layers - 1,
        key="patch_layer",
        on_change=_choose_layer,
        help="It opens on the layer of the head with the largest effect.",
    )
    attrs = view.shown.attrs
    point = mhsa.causal.PATCH_POINTS[attrs["what"]]
    st.caption(
        md_escape(
            f"Metric: {attrs['metric']} · clean run {attrs['clean']:.4g} · corrupted run "
            f"{attrs['corrupted']:.4g} · activation: {point.label}"
        )
    )
    if attrs["kv_heads"]:
        st.caption(
            "Grouped-query attention: keys and values are patched per key/value head "
            "(each serves several query heads), so the maps have fewer heads."
        )
    panels = [
        (name, table)
        for name, table in (("exact", view.exact), ("attribution", view.attribution))
        if table is not None
    ]
    page.figure(
        plots.patching_maps(panels, title="Effect of patching each head (1 = restores)"),
        "patching-heads",
        key="patching-maps",
    )
    st.caption(EFFECT_LINE)
    if view.exact is not None and view.attribution is not None:
        st.caption(view.agreement_line())  # head labels and numbers: nothing to escape
        page.figure(
            plots.patching_scatter(view.exact, view.attribution, view.correlation),
            "patching-exact-vs-attribution",
            key="patching-scatter",
        )
    page.table(view.plain_table(), "patching", label="Download patching (.csv)", height=300)
    if view.positions is not None:
        page.figure(
            plots.patching_positions_figure(view.positions),
            "patching-positions",
            key="patching-positions",
        )
    else:
        st.caption(
            f"The per-position view is offered for texts up to "
            f"{patching.MAX_POSITION_TOKENS} tokens."
        )

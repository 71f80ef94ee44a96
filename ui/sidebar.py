"""The shared sidebar of every page: what to compute (sentence, model, engine, device, whole
words, generation, an encoder-decoder's target and attention), then how to show it."""

from __future__ import annotations

import streamlit as st

import mhsa
from ui import core
from ui.core import LIMITS, Query
from ui.views import examples, long_inputs

__all__ = ["EXPORT_FORMATS", "KIND_LABELS", "attention_kind", "sidebar"]

#: how the camera button of every figure saves it (client-side: plotly.js draws the image of
#: exactly what is on screen, zoom and hidden traces included)
EXPORT_FORMATS = {"png": "PNG, 4x resolution", "svg": "SVG (vector, for papers)"}

#: an encoder-decoder's attentions, as the sidebar names them (link key ``kind``)
KIND_LABELS = {
    "encoder": "encoder (self-attention over the sentence)",
    "decoder": "decoder (causal self-attention over the target)",
    "cross": "cross (decoder tokens attend to the sentence's)",
}


def _sidebar_model() -> str:
    """The model the sidebar names ("default" when the box is blank)."""
    return st.session_state["model"].strip() or "default"


def sidebar() -> Query:
    """The shared sidebar: what to compute, then how to show it. Returns the settings of the
    result."""
    with st.sidebar:
        st.header("Settings")
        _what_to_compute()
        _generation()
        _encoder_decoder()
        long_inputs.selection_inputs()
        _how_to_show()
    return _sidebar_query()


def _what_to_compute() -> None:
    """Sentence, model, engine (and the seed of untrained weights), device, whole words."""
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
        help="'default' is the embedded all-MiniLM-L6-v2 (works offline); toy:induction, "
        "toy:reverse-seq2seq, ... are the shipped toy models (toy:induction-long reads 2,048 "
        "tokens: long inputs offline). Or a transformers model id, or "
        "a local folder.",
    )
    examples.example_picker(_sidebar_model())
    st.radio(
        "Engine",
        mhsa.engine.ENGINES,
        key="engine",
        format_func=lambda name: mhsa.engine.ENGINE_SPECS[name].label,
        help="  \n".join(
            f"**{spec.label}**: {spec.description}." for spec in mhsa.engine.ENGINE_SPECS.values()
        ),
    )
    if mhsa.engine.ENGINE_SPECS[st.session_state["engine"]].seeded:
        st.number_input("Seed of the untrained weights", min_value=0, step=1, key="seed")
    st.selectbox("Device", mhsa.engine.DEVICES, key="device")
    st.toggle("Whole words (merge sub-word tokens)", key="words")


def _generation() -> None:
    """Tokens to generate after the sentence (an encoder-decoder: the target), offered only
    for a model with a next-token head."""
    if not core.can_generate(_sidebar_model(), st.session_state["device"]):
        return
    if core.is_encoder_decoder(_sidebar_model(), st.session_state["device"]):
        label = "Generate the target (tokens; 0: type it)"
        what = (
            "This encoder-decoder writes the target for the sentence (greedy, or sampled "
            "from the seed): the decoder's tokens are exactly the ids it chose, its start "
            "token first."
        )
    else:
        label = "Generate tokens after the sentence"
        what = (
            "This model has a next-token head: it continues the sentence (greedy, or "
            "sampled from the seed), and every page shows attention over the sentence and "
            "what it wrote, the generated part behind a dashed green line."
        )
    st.number_input(label, 0, mhsa.engine.MAX_NEW_TOKENS, key="generate", help=what)
    if st.session_state["generate"]:
        st.toggle("Sample (seeded) instead of greedy", key="sample")


def _encoder_decoder() -> None:
    """An encoder-decoder's target text (unless generated) and which of its attentions the
    pages draw (``attention_kind``)."""
    if not core.is_encoder_decoder(_sidebar_model(), st.session_state["device"]):
        return
    if not st.session_state["generate"]:
        st.text_area(
            "Target (decoder) text",
            key="target_text",
            max_chars=LIMITS.max_chars,
            height=70,
            help="What the decoder reads (a translation, a summary ...). Empty: the sentence "
            "itself. Or set the number above to let the model write it.",
        )
    attention_kind()


def attention_kind() -> str:
    """The attention of an encoder-decoder that the pages draw (link key ``kind``): the
    encoder's, the decoder's, or the cross attention (decoder tokens attending to the
    encoder's). Over whole words only the encoder's exists, and the choice says so."""
    if st.session_state["words"]:
        st.caption("Whole words: the encoder's attention only (turn them off for the others).")
        return "encoder"
    st.radio(
        "Attention",
        list(KIND_LABELS),
        key="kind",
        format_func=KIND_LABELS.get,
        help="An encoder-decoder has three: the encoder's self-attention, the decoder's "
        "causal self-attention, and cross attention, where the decoder's queries meet the "
        "encoder's keys and values (rows: decoder tokens; columns: the sentence's tokens).",
    )
    return st.session_state["kind"]


def _how_to_show() -> None:
    """The token search, presentation mode, the format figures save in."""
    st.text_input(
        "Find a token",
        key="find",
        max_chars=200,
        help="Selects the first matching token (case-insensitive, ## and Ġ ignored) and "
        "boxes it in red in every figure of tokens.",
    )
    st.toggle("Presentation mode (large text, for a projector)", key="presentation")
    st.radio(
        "Figures save as",
        list(EXPORT_FORMATS),
        key="export",
        format_func=EXPORT_FORMATS.get,
        horizontal=True,
        help="The camera button on every figure saves what is on screen in this format.",
    )


def _sidebar_query() -> Query:
    """The sidebar's settings as a ``Query``."""
    state = st.session_state
    model = _sidebar_model()
    generate = int(state["generate"]) if core.can_generate(model, state["device"]) else 0
    seq2seq = core.is_encoder_decoder(model, state["device"])
    query = Query(
        state["text"],
        model,
        state["engine"],
        state["device"],
        int(state["seed"]),
        bool(state["words"]),
        generate,
        bool(state["sample"]),
        target=state["target_text"] if seq2seq and not generate else "",
        kind=state["kind"] if seq2seq and not state["words"] else "encoder",
        layers=state["long_layers"],
        heads=state["long_heads"],
    )
    return query

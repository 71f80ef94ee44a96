"""Inside MHSA: the classroom walk-through of our module on the sentence, one step at a time."""

from __future__ import annotations

import streamlit as st

from mhsa import plots
from mhsa.engine.attention.module import OBSERVATION_POINTS
from mhsa.heads import head_label
from ui import core, page
from ui.state import Param, bounded_int, clamp, flag, index_param
from ui.views import classroom

LAST_STEP = len(OBSERVATION_POINTS) - 1  # the most steps a trace can have, minus one
PARAMS = {
    "step": Param(0, index_param),
    "source": Param("pretrained", lambda raw: {"pretrained": raw, "fresh": raw}[raw]),
    "pretrained_layer": Param(0, index_param, old_keys=("mlayer",)),
    "fresh_d_model": Param(64, bounded_int(4, 1024), old_keys=("dm",)),
    "fresh_heads": Param(4, bounded_int(1, 64), old_keys=("nh",)),
    "causal": Param(False, flag),
    "step_head": Param(0, index_param, old_keys=("mhead",)),
    "neuron_token": Param(0, index_param, old_keys=("nquery",)),
    "neuron_head": Param(0, index_param, old_keys=("nhead",)),
    "cross": Param(False, flag),
}


def _move(delta: int) -> None:
    st.session_state["step"] = min(max(st.session_state["step"] + delta, 0), LAST_STEP)


with page.run("Inside MHSA", PARAMS, kinds=True) as query:
    cross = st.toggle(
        "Cross-attention: queries from the decoder, keys and values from the encoder",
        key="cross",
        help="As in an encoder-decoder (T5, BART, Marian): the decoder's tokens ask (Q, m rows), "
        "the sentence's tokens answer (K and V, n rows): scores and weights are m x n.",
    )
    note = page.walkthrough_mode_note(query.kind, cross=cross)
    if note is not None:
        st.caption(note)
    query = query._replace(kind="encoder")  # the walk-through reads the sentence itself
    top = st.columns([2, 1, 1, 1.3])
    if not cross:
        top[0].radio(
            "Weights",
            ["pretrained", "fresh"],
            key="source",
            horizontal=True,
            format_func={
                "pretrained": "from a pretrained layer",
                "fresh": "freshly initialised (xavier)",
            }.get,
        )
    fresh = st.session_state["source"] == "fresh"
    try:
        facts = core.model_facts(query.model, query.device)
    except Exception as e:
        page.error(e)
        page.stop()
    layers = facts["layers"] or 1
    seq2seq = cross and core.is_encoder_decoder(query.model, query.device)
    if cross and not seq2seq:  # the sentence plays the encoder, this text the decoder
        top[0].text_input("Decoder (target) text; empty: the sentence", key="target_text")
    # an encoder-decoder's cross step: its own weights; cross over another model: fresh ones
    fresh = not seq2seq if cross else fresh
    if fresh:
        top[1].number_input("d_model", 4, 1024, step=4, key="fresh_d_model")
        top[2].number_input("heads", 1, 64, key="fresh_heads")
    else:
        clamp("pretrained_layer", 0, layers - 1)
        top[1].number_input(
            "Decoder layer" if cross else "Layer", 0, layers - 1, key="pretrained_layer"
        )
    if not cross:
        top[3].toggle("Causal mask", key="causal")
    try:
        if cross:
            walk = classroom.classroom_cross(
                query._replace(words=False),
                query.target if seq2seq else st.session_state["target_text"],
                st.session_state["pretrained_layer"],
                st.session_state["fresh_d_model"],
                st.session_state["fresh_heads"],
            )
        else:
            walk = classroom.classroom(
                query._replace(words=False),
                None if fresh else st.session_state["pretrained_layer"],
                st.session_state["fresh_d_model"],
                st.session_state["fresh_heads"],
                st.session_state["causal"],
            )
    except Exception as e:
        page.error(e)
        page.stop()
    if walk.truncated_tokens:
        st.warning(
            f"The classroom view shows the first {len(walk.tokens)} tokens: "
            f"{walk.truncated_tokens} tokens were dropped to keep every step legible.",
            icon=":material/content_cut:",
        )
    step_no = clamp("step", 0, len(walk.steps) - 1)
    nav = st.columns([1, 1, 6])
    nav[0].button("◀ Previous", on_click=_move, args=(-1,), disabled=step_no == 0)
    nav[1].button("Next ▶", on_click=_move, args=(1,), disabled=step_no == len(walk.steps) - 1)
    step = walk.steps[step_no]
    nav[2].progress(
        (step_no + 1) / len(walk.steps),
        text=f"Step {step_no + 1} of {len(walk.steps)}: {step.name}",
    )
    gqa = (
        f", {walk.num_kv_heads} key/value heads (grouped-query attention: each serves "
        f"{walk.groups} query heads)"
        if walk.groups > 1
        else ""
    )
    rope = ", rotary positions on Q and K" if walk.rotary else ""
    st.caption(
        f"Weights: {page.md_escape(walk.source)}; d_model {walk.d_model}, "
        f"{walk.num_heads} heads{gqa}, d_head {walk.d_head}{rope}"
    )
    st.subheader(step.name)
    st.markdown(f"`{step.formula}`")  # constant text; no highlighter chunk to load
    st.markdown(f"shape **{step.shape}**")
    value = step.value[0]  # drop the batch axis
    head = clamp("step_head", 0, walk.num_heads - 1)
    if value.ndim == 3:  # per-head: pick the head
        st.number_input("Head", 0, walk.num_heads - 1, key="step_head")
        head = st.session_state["step_head"]
        if not (fresh or cross or core.is_encoder_decoder(query.model, query.device)):
            page.atlas_button(
                head_label(st.session_state["pretrained_layer"], head), key="inside-to-atlas"
            )
        if value.shape[0] == walk.num_kv_heads != walk.num_heads:  # K or V of GQA
            st.info(
                f"Grouped-query attention: query head {head} reads key/value head "
                f"{walk.kv_head(head)}, shared by query heads "
                f"{walk.kv_head(head) * walk.groups} to "
                f"{walk.kv_head(head) * walk.groups + walk.groups - 1}.",
                icon=":material/link:",
            )
            head = walk.kv_head(head)
        value = value[head]
    fig = plots.step_heatmap(value, walk.rows(step), step.name, step.shape, keys=walk.keys)
    page.figure(
        fig,
        f"step-{step_no}-{step.name.replace(' ', '-')}" + ("-cross" if cross else ""),
        key="step-fig",
        decorate=not cross,  # the found token is the sentence's, not the decoder's
    )
    if cross:
        st.caption(
            f"Cross-attention: the queries are the decoder's {len(walk.tokens)} tokens "
            f"(Q [{len(walk.tokens)}, {walk.d_model}]), the keys and values the encoder's "
            f"{len(walk.keys)} (K, V [{len(walk.keys)}, {walk.d_model}]): scores and "
            f"weights are [{len(walk.tokens)}, {len(walk.keys)}], each decoder token's row "
            "a distribution over the sentence's tokens. No mask: every decoder token may "
            "read the whole sentence."
        )
    if not fresh:
        st.subheader("Neuron view: how one token's weights come about")
        pick = st.columns(2)
        clamp("neuron_token", 0, len(walk.tokens) - 1)
        pick[0].selectbox(
            "Query token" if not cross else "Query (decoder) token",
            range(len(walk.tokens)),
            key="neuron_token",
            format_func=lambda i: f"#{i} {walk.tokens[i]}",
        )
        clamp("neuron_head", 0, walk.num_heads - 1)
        pick[1].number_input("Query head", 0, walk.num_heads - 1, key="neuron_head")
        neuron = walk.neuron(st.session_state["neuron_head"], st.session_state["neuron_token"])
        neuron_name = head_label(st.session_state["pretrained_layer"], neuron.head)
        page.figure(
            plots.neuron_figure(neuron, walk.keys, queries=walk.tokens),
            f"neuron-{neuron_name}-q{neuron.token}",
            key="neuron",
        )
        st.caption(
            "The query vector q of the chosen token (top), each key vector k, their "
            "elementwise product q ⊙ k (each row sums to q·k), q·k, the scaled score and "
            "the softmax: the weights of that token's row in the head. Hover for values."
        )
    with st.expander("All steps and their shapes"):
        st.table(
            {
                "step": [s.name for s in walk.steps],
                "shape": [str(s.shape) for s in walk.steps],
                "formula": [s.formula for s in walk.steps],
            }
        )

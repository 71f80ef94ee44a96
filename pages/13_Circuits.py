"""Circuits: which edges between heads carry the answer (edge attribution patching, EAP-IG,
exact), drawn across layers, with how faithful the top edges are (MIB's faithfulness curve)."""

from __future__ import annotations

from typing import Any

import streamlit as st

import mhsa
from mhsa import plots
from ui import core, keyboard, page
from ui.state import (
    DEFAULT_TEXT,
    Param,
    bounded_int,
    choice,
    md_escape,
    text_param,
    word_param,
)
from ui.views import circuits
from ui.views.circuits import CIRCUIT_EXAMPLES, MAX_DRAWN, MAX_EXACT_EDGES, CircuitSettings

#: a link may ask for any n up to this; the page clamps it to the model's edges
MAX_N = 10_000_000
PARAMS = {
    "clean": Param(DEFAULT_TEXT, text_param),
    "corrupted": Param("The dog sat on the mat.", text_param),
    "answer": Param("", word_param),
    "wrong": Param("", word_param),
    "circuit_method": Param("eap-ig", choice(*mhsa.circuits.EDGE_METHODS)),
    "circuit_steps": Param(5, bounded_int(1, 50)),
    "circuit_n": Param(20, bounded_int(1, MAX_N)),
    "circuit_target": Param("embedding", choice(*mhsa.causal.PATCH_TARGETS)),
    "pair": Param("A cat was sitting on the rug.", text_param),
}
EXPLANATION = """\
**The graph** (EAP-IG's, as the MIB benchmark counts it): nodes are the embeddings (**input**),
every head (**L1H3**), every MLP (**M1**) and the **logits**. An edge runs from every node into
every node above it: into a head's **q**, **k** or **v** input (each reads its own copy of the
residual stream, TransformerLens's split q/k/v input), an MLP's input or the logits'. A head's
output is its part of the attention output, z_h W_O^h.

**Scores.** Run the clean text; an edge is corrupted when it carries its source's output from
the corrupted text instead. **exact**: m with that one edge corrupted, minus m of the clean run
(path patching, one run per edge). **eap** (Syed et al. 2023): its first-order estimate, for
every edge from one backward pass: (corrupted − clean source output) · the gradient of m at the
target's input. **eap-ig** (Hanna et al. 2024): the same with the gradient averaged over runs
whose embeddings go from the corrupted text's to the clean text's in a number of steps. m is
logit(answer) − logit(wrong) at the last position; a negative score is an edge whose corruption
lowers it: one that carries the clean answer. The graph and the table's **support** show minus
the score, so such an edge is blue with a support above 0 (the scores keep the library's sign,
EAP-IG's). For an encoder (MiniLM, BERT), m is patching's: the cosine similarity of the run's
sentence embedding to the clean run's (**embedding**: 1 for the clean run, so its gradient there
is zero and plain eap says nothing: use eap-ig or exact) or to a second sentence's
(**similarity**).

**Encoders** put a LayerNorm after each residual sum (post-norm), so the stream is no sum of the
nodes' outputs. Here each target reads its own copy of the whole chain of norms, recomputed from
the nodes' outputs with its own edges' sources (our definition, after EAP-IG's graph; see
Kobayashi et al. 2021 on the norms in post-norm streams): with every edge clean the copies are
the model's own forward pass.

**Faithfulness** of a circuit (the top n edges by |score|): run the clean text with every edge
not in the circuit corrupted; f = (m_circuit − m_corrupted) / (m_clean − m_corrupted): 1 when
the circuit alone keeps the clean behaviour, 0 when it keeps none. The curve takes MIB's sizes
(0.1% to 100% of the edges); **CPR** is the area under it (higher is better), **CMD** the area
between it and 1 (lower is better).

**Click** a head to open it on the Heads page; click an edge's label to path-patch that edge
alone (its exact score). Everything runs through our module with the model's own weights, on
pre-norm causal language models (GPT-2, the Llama family, the parallel-block GPT-J,
GPT-NeoX/Pythia, Phi and Falcon, the toy models) and BERT-family encoders (BERT, RoBERTa,
ELECTRA, MiniLM).

References: A. Syed, C. Rager, A. Conmy, "Attribution Patching Outperforms Automated Circuit
Discovery", 2023. M. Hanna, S. Pezzelle, Y. Belinkov, "Have Faith in Faithfulness", COLM 2024.
A. Mueller et al., "MIB: A Mechanistic Interpretability Benchmark", ICML 2025 (circuit track).
G. Kobayashi, T. Kuribayashi, S. Yokoi, K. Inui, "Incorporating Residual and Normalization Layers
into Analysis of Masked Language Models", EMNLP 2021.
"""


def _example(values: dict[str, Any]) -> None:
    """A button's example: its settings into the session (the widgets read them)."""
    st.session_state.update(values)
    st.session_state.pop("_circuit_edge", None)


def _clicked() -> None:
    """A click on the circuit: a head opens on Heads (after this run), an edge is path-patched."""
    for point in st.session_state["circuit-graph"].selection.get("points", []):
        data = point.get("customdata")
        values = list(data.values()) if isinstance(data, dict) else list(data or ())
        if len(values) == 2 and values[0] == "node":
            try:
                st.session_state["_circuit_open"] = mhsa.parse_head_label(str(values[1]))
            except ValueError:
                continue  # the input, an MLP or the logits: nothing to open
            return
        if len(values) == 4 and values[0] == "edge":
            st.session_state["_circuit_edge"] = tuple(str(v) for v in values[1:])
            return


with page.run("Circuits", PARAMS) as sidebar:
    st.caption(
        "Which edges between heads carry the answer? Score every edge at once, keep the "
        "strongest, and see how much of the clean behaviour that small circuit keeps."
    )
    page.example_buttons(CIRCUIT_EXAMPLES, _example, sidebar.model, PARAMS)
    state = st.session_state
    query = sidebar._replace(text=state["clean"], generate=0)
    if "_circuit_open" in state:
        page.open_head(query, *state.pop("_circuit_open"))
    with st.expander("What these numbers mean, and the references"):
        st.markdown(EXPLANATION)
    problem = circuits.circuit_problem(query)
    if problem is not None:
        st.info(md_escape(problem + " Try one of the examples above."), icon=":material/explore:")
        page.stop()
    causal = core.can_generate(query.model, query.device)
    page.patch_texts("Clean text (the run)", query, answers=causal)
    if not causal:
        page.encoder_target_inputs("circuit_target")
    left, right = st.columns(2)
    page.described_choice("Edge scores", mhsa.circuits.EDGE_METHODS, "circuit_method", where=left)
    if state["circuit_method"] == "eap-ig":
        right.number_input("Integrated-gradient steps", 1, 50, key="circuit_steps")
    page.matched_tokens(
        circuits.circuit_tokens,
        query,
        state["corrupted"],
        "An edge carries a source's output position by position",
    )
    if causal and not (state["answer"].strip() and state["wrong"].strip()):
        st.info("Type the answer and the wrong answer: the metric is their logit difference.")
        page.stop()
    target = "" if causal else state["circuit_target"]
    if target == "embedding" and state["circuit_method"] == "eap":
        st.info(
            "The embedding target's gradient is zero at the clean run (the cosine with its own "
            "embedding is at its maximum), so eap would score every edge 0: choose eap-ig or "
            "exact, or the similarity target.",
            icon=":material/explore:",
        )
        page.stop()
    steps = state["circuit_steps"] if state["circuit_method"] == "eap-ig" else 5
    settings = CircuitSettings(
        state["corrupted"],
        state["answer"] if causal else "",
        state["wrong"] if causal else "",
        state["circuit_method"],
        steps,
        target,
        state["pair"] if target == "similarity" else "",
    )
    graph = circuits.circuit_graph(query)
    total = graph.n_edges
    if settings.method == "exact" and total > MAX_EXACT_EDGES:
        st.info(
            f"Exact scores run every edge alone: {total:,} edges are too many here (up to "
            f"{MAX_EXACT_EDGES:,}). Choose eap or eap-ig, or use the command line.",
            icon=":material/hourglass_top:",
        )
        page.stop()
    asked = state["circuit_n"]
    n = min(max(int(asked), 1), total) if isinstance(asked, int) else 1
    if n != asked:
        st.info(
            f"Top n was {asked}: this model has {total} edges, so n is {n}.",
            icon=":material/content_cut:",
        )
        state["circuit_n"] = n
    st.slider("Top n edges (the circuit)", 1, total, key="circuit_n")
    n = state["circuit_n"]
    view = page.heavy_or_stop(
        "circuits",
        ("circuits", query.text, query.model, query.device, settings, n),
        lambda progress: circuits.circuit_view(query, settings, n, progress),
        "Scoring every edge",
    )
    attrs = view.scores.attrs
    st.caption(
        md_escape(
            f"Metric: {attrs['metric']} · clean run {attrs['clean']:.4g} · corrupted run "
            f"{attrs['corrupted']:.4g} · {total} edges scored by {attrs['method']} · the top "
            f"{n} keep f = {view.faithfulness:.3f}"
        )
    )
    drawn = view.circuit.iloc[:MAX_DRAWN]
    if n > MAX_DRAWN:
        st.caption(f"The drawing shows the top {MAX_DRAWN} of the {n} edges.")
    output = "logits" if causal else "last hidden state"  # what m reads, in both places
    page.figure(
        plots.circuit_figure(
            drawn, graph.layers, graph.heads, output=output, metric=attrs["metric"]
        ),
        "circuit",
        key="circuit-graph",
        on_select=_clicked,
        selection_mode="points",
    )
    keyboard.edge_picker(drawn, "circuit-edge-pick", "_circuit_edge")
    edge = state.get("_circuit_edge")
    if edge is not None:
        try:
            patched = circuits.path_patched(query, settings, edge)
        except mhsa.MHSAError as e:
            page.error(e)
        else:
            into = f"{edge[1]} ({edge[2]})" if edge[2] else edge[1]
            row = view.scores[
                (view.scores["source"] == edge[0])
                & (view.scores["target"] == edge[1])
                & (view.scores["input"] == edge[2])
            ]
            estimate = float(row["score"].iloc[0]) if len(row) else float("nan")
            st.success(
                md_escape(
                    f"Path patching {edge[0]} → {into}: m goes from {patched.clean:.4g} (clean) "
                    f"to {patched.patched:.4g}, an exact score of {patched.score:.4g} "
                    f"({attrs['method']} said {estimate:.4g}); {patched.effect:.1%} of the "
                    "clean-to-corrupted change."
                ),
                icon=":material/electrical_services:",
            )
    page.figure(plots.faithfulness_figure(view.curve, n), "faithfulness", key="circuit-curve")
    if query.model == "toy:induction":
        previous, induction = circuits.induction_heads(query)
        table = circuits.edge_table(view.scores)
        hit = table[
            (table["source"] == previous) & (table["target"] == induction) & (table["input"] == "k")
        ]
        edge = f"their K-composition edge {previous} → {induction} (k)"
        rank = mhsa.analysis.claims.rank_claim(
            edge, int(hit["rank"].iloc[0]) if len(hit) else 0, total, "|score|", unit="edges"
        )
        st.caption(
            f"Head roles names {previous} the previous-token head and {induction} the induction "
            f"head: {rank.text}."
        )
    page.table(
        circuits.edge_table(view.scores, output),
        "circuit-edges",
        label="Download edges (.csv)",
        height=300,
        shown=circuits.EDGES_SHOWN,
    )

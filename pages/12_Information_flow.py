"""Information flow: which tokens and blocks the prediction at the last token is built from
(the LLM Transparency Tool's contribution graph), each head's direct effect on the logit of an
answer against a wrong one, and the logit lens."""

from __future__ import annotations

import streamlit as st

import mhsa
from mhsa import plots
from ui import core, page
from ui.state import MAX_WORD_CHARS, Param, bounded_int, flag, md_escape, word_param
from ui.views import flow

TOY_MODEL = "toy:induction"
TOY_EXAMPLE = "ba ke mo di lu ba ke mo"  # a repeat: after the second "mo" comes "di"
LAST = -1  # the route's token: the last one, whatever the text
PARAMS = {
    "answer": Param("", word_param),
    "wrong": Param("", word_param),
    "flow_threshold": Param(4, bounded_int(1, 20)),
    "flow_renormalize": Param(True, flag),
    "flow_token": Param(LAST, bounded_int(LAST, 100_000)),
}
EXPLANATION = """\
**Information flow** (Ferrando & Voita 2024, as the LLM Transparency Tool computes it): at each
layer, the residual stream after attention is a sum of parts, one per (earlier token, head) and the
residual entering the layer; a part contributes as much as the whole's size (its L1 norm) would
shrink without it (never below a tiny floor), normalised over the parts. The same for the MLP
against the residual. Contributions under the threshold are dropped (and, by default, the rest
renormalised, each token's MLP edges against that token's own whole: the tool's code sums them over
all tokens); the graph keeps what is reachable from the last token. In a parallel layer (GPT-NeoX,
GPT-J, Phi, Falcon) the MLP reads the layer's input. Hover an edge for its heads, a node for the
tokens it promotes (its residual through the final norm and the unembedding).

**Direct logit attribution**: the last residual is the sum of the embeddings, every head's
output, every output bias and every MLP. Through the final norm with its scale frozen
and the unembedding, each part's share of logit(answer) − logit(wrong) at the last token; the
parts sum to the model's value.

**Logit lens**: the residual after the embeddings and after each layer, read through the final
norm and the unembedding: what the model would predict if it stopped there.

**For reference**: a part's contribution is max(‖whole‖₁ − ‖whole − part‖₁, 10⁻⁵) (the tool's
`get_contributions`); the frozen final norm is TransformerLens's `apply_ln_to_stack`.
"""


def _use_toy() -> None:
    """Switch to the toy induction model with a repeat to continue."""
    state = st.session_state
    state.update(model=TOY_MODEL, text=TOY_EXAMPLE, answer="di", wrong="lu", generate=0)


def _not_a_decoder(model: str) -> None:
    """Which models the page reads, and the switch to one that works offline."""
    st.info(
        f"This page reads the residual stream of a causal language model with pre-norm "
        "layers: GPT-2, the Llama family (Llama, Qwen2/3, Mistral, Gemma 1-3, OLMo 2, Phi-3), "
        "GPT-NeoX (Pythia), GPT-J, Phi, OPT, Falcon "
        f"or a toy model ({TOY_MODEL}, ...). The sidebar's model ({md_escape(model)}) has no "
        "next-token head, or its norms sit after each residual sum (BERT, the embedded MiniLM).",
        icon=":material/info:",
    )
    st.button(f"Open {TOY_MODEL} with a repeat to continue", on_click=_use_toy, type="primary")


def _flow(query: core.Query) -> None:
    """The routes to the last token, through the heavy queue; the threshold redraws them."""
    st.subheader("Information flow")
    left, right = st.columns([3, 1])
    left.slider("Contribution threshold (%)", 1, 20, key="flow_threshold")
    right.toggle("Renormalise after the threshold", key="flow_renormalize")
    try:
        contributions = page.heavy(
            "flow",
            flow.flow_key(query),
            lambda progress: flow.flow_contributions(query, progress),
            "Information flow",
        )
    except mhsa.MHSAError as e:
        page.error(e)
        return
    if contributions is None:
        return
    state = st.session_state
    tokens = contributions.tokens
    if not LAST <= state["flow_token"] < len(tokens):  # a link's position past this text's end
        state["flow_token"] = LAST
    st.selectbox(
        "Route to the token",
        [LAST, *range(len(tokens))],
        key="flow_token",
        format_func=lambda i: "the last token" if i == LAST else f"#{i} {tokens[i]}",
    )
    output = len(tokens) - 1 if state["flow_token"] == LAST else state["flow_token"]
    graph = flow.flow_graph(
        contributions, state["flow_threshold"], state["flow_renormalize"], output
    )
    page.figure(plots.flow_figure(graph), "information-flow", key="flow", decorate=False)
    st.caption(
        f"{len(graph.edges)} edges over the threshold, of {len(graph.tokens)} tokens "
        f"(the first {flow.FLOW_MAX_TOKENS} at most). Blue: attention from another token; "
        "light blue: the token's own residual (with attention to itself); orange: the MLP."
    )


def _attribution(query: core.Query, answer: str, wrong: str) -> bool:
    """The attribution of the answer pair; whether there was one to show."""
    st.subheader("Direct logit attribution")
    if not answer or not wrong:
        st.info("Type an answer and a wrong answer (one word each) to attribute them.")
        _top_two_button(query)
        return False
    try:
        result = flow.head_attribution(query, answer, wrong)
    except mhsa.MHSAError as e:
        page.error(e)
        return False
    page.figure(plots.attribution_figure(result), "logit-attribution", key="dla", decorate=False)
    if result.logit_softcap is not None:
        st.caption(
            f"This model soft-caps its logits ({result.logit_softcap:g} · tanh(logit / "
            f"{result.logit_softcap:g})). Attribution is linear only before the cap, so the "
            "components add up to the logit difference before the cap, not to the capped one."
        )
    page.table(
        result.frame(), "logit-attribution", label="Download the attribution (.csv)", height=240
    )
    return True


def _use_words(words: tuple[str, ...]) -> None:
    st.session_state.update(answer=words[0], wrong=words[1])


def _top_two_button(query: core.Query) -> None:
    """A button that attributes the model's own top two predictions."""
    try:
        words = flow.predicted_words(query)
    except mhsa.MHSAError:
        return  # the lens below says what is wrong
    if len(words) == 2:
        st.button(
            "Attribute the model's top two predictions: "
            f"{md_escape(words[0])} against {md_escape(words[1])}",
            on_click=_use_words,
            args=(words,),
        )


def _lens(query: core.Query, pair: tuple[str, str] | tuple[None, None]) -> None:
    """The logit lens, coloured by the answer pair's logit difference when there is one."""
    st.subheader("Logit lens")
    try:
        lens = flow.logit_lens(query, *pair)
    except mhsa.MHSAError as e:
        page.error(e)
        return
    page.figure(plots.logit_lens_figure(lens), "logit-lens", key="lens", decorate=False)


with page.run("Information flow", PARAMS) as query:
    st.caption(
        "Where the prediction at the last token comes from: the routes through tokens, heads and "
        "MLPs (the LLM Transparency Tool's contribution graph), each head's direct effect on "
        "logit(answer) − logit(wrong), and what each layer would predict (logit lens)."
    )
    with st.expander("What these mean"):
        st.markdown(EXPLANATION)
    result = page.load(query)  # the sentence checked (empty, too long) as on every page
    if result is None:
        page.stop()
    if not core.can_generate(query.model, query.device):
        _not_a_decoder(query.model)
        page.stop()
    left, right = st.columns(2)
    left.text_input("Answer (one word)", key="answer", max_chars=MAX_WORD_CHARS)
    right.text_input("Wrong answer (one word)", key="wrong", max_chars=MAX_WORD_CHARS)
    answer, wrong = st.session_state["answer"].strip(), st.session_state["wrong"].strip()
    _flow(query)
    attributed = _attribution(query, answer, wrong)
    _lens(query, (answer, wrong) if attributed else (None, None))

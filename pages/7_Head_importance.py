"""Head importance: which heads matter (Michel et al. 2019, Voita et al. 2019), over a sentence
or a small corpus, with the pruning curve and its random baseline."""

from __future__ import annotations

import streamlit as st

import mhsa
from mhsa import plots
from mhsa.analysis.stats import STAT_COLUMNS
from mhsa.causal.importance import METHODS, rank_correlation
from mhsa.causal.targets import TARGET_SPECS
from ui import keyboard, page
from ui.state import Param, bounded_int, choice, flag, text_param
from ui.views import importance

DEFAULT_PAIR = "A cat was sitting on the rug."
AGAINST = [*STAT_COLUMNS, "positional_share"]
PARAMS = {
    "method": Param("ablation", choice(*METHODS)),
    "target": Param("auto", choice("auto", *TARGET_SPECS)),
    "pair": Param(DEFAULT_PAIR, text_param),
    "normalize": Param(False, flag),
    "prune_seed": Param(0, bounded_int(0, 2**31 - 1)),
    "against": Param("confidence", choice(*AGAINST)),
}
TARGET_CHOICES = {"auto": "automatic", **{n: t.label for n, t in TARGET_SPECS.items()}}
EXPLANATION = """\
**What the numbers mean.** A head is switched off by multiplying its output by 0 before the
layer's output projection (its **gate**), in our module running the model with its own weights.
The **target** says what "the output" is:

- **sentence embedding**: the attention-mask-weighted mean of the last hidden state (how
  sentence-transformers pool all-MiniLM-L6-v2); the change is 1 − cosine with the intact one.
- **similarity of two sentences**: the cosine similarity of their embeddings (the task MiniLM was
  trained for); the change is how far it moves.
- **language-model loss**: for models whose checkpoint has a language-model head: the
  cross-entropy of the text (next token, or a fixed seeded 15% of tokens masked).
- **loss on the repeat**: causal language models: the next-token cross-entropy of only the
  tokens an induction head can predict (the token before was seen earlier, followed then by
  this same token: a repeated sequence's second half after its first token; Olsson et al.
  2022). A random first half, which no head can predict, counts for nothing.

The **method** says how a head's importance is measured:

- **ablation** (leave-one-out): the target's change with that head alone off, averaged over the
  sentences. Exact, one knock-out per head.
- **gradient** (Michel et al. 2019): |∂ target / ∂ gate| at every gate = 1, averaged over the
  sentences: one backward pass for all heads, a first-order estimate. Zero for the embedding
  change (it is at its minimum when nothing changed), so that target needs ablation.
  "Normalise per layer" divides each layer's importances by their l2 norm, as Michel et al. do.

The **pruning curve** switches heads off cumulatively, least important first (importance
computed once, before pruning, not after each step), beside a random order drawn from the seed:
the gap between the curves is what the importance ranking is worth. Michel et al. found that
about 40% of BERT's heads can go on MNLI before accuracy drops.

**Confidence** (Voita et al. 2019) is the mean over tokens of a head's largest weight; they
found the important heads are confident, positional (the largest weight at a fixed offset for
90% of tokens) or syntactic.

References: P. Michel, O. Levy, G. Neubig, "Are Sixteen Heads Really Better than One?",
NeurIPS 2019. E. Voita, D. Talbot, F. Moiseev, R. Sennrich, I. Titov, "Analyzing Multi-Head
Self-Attention: Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned", ACL 2019.
"""


#: a single sentence up to this many tokens is computed at once; longer ones, and corpora, wait
#: for "Compute importance" (a knock-out of every head of a long input takes seconds)
AUTO_TOKENS = 128


def _open_head() -> None:
    """A click on the map opens that head on the Heads page (after this run)."""
    clicked = page.clicked_head("importance-grid")
    if clicked is not None:
        st.session_state["_open_head"] = clicked


def _back_to_the_button() -> None:
    """Cancel: back to the "Compute importance" button (what a long input waits for)."""
    st.session_state.pop("_importance_go", None)


with page.run("Head importance", PARAMS, kinds=True) as query:  # every attention's heads at once
    st.caption(
        "Which heads matter? Switch each head off and measure how the model's output changes "
        "(knock-outs through our module), or take the gradient with respect to each head's gate."
    )
    if "_open_head" in st.session_state:  # an encoder-decoder's head opens with its attention
        page.open_head(query, *st.session_state.pop("_open_head"))
    queries = page.corpus_queries(
        query,
        "Average over several sentences (one per line; empty = the sidebar's sentence; for the "
        "similarity target a line may hold a pair as: first sentence || second sentence; for an "
        "encoder-decoder: source || target)",
    )
    # importance measures every attention's heads: the same job whichever the sidebar shows
    queries = tuple(q._replace(kind="encoder") for q in queries)
    left, mid, right = st.columns(3)
    left.radio("Method", list(METHODS), key="method", help=" ".join(METHODS.values()))
    mid.radio("Target", list(TARGET_CHOICES), key="target", format_func=TARGET_CHOICES.get)
    right.toggle("Normalise per layer (Michel et al.)", key="normalize")
    right.number_input("Seed of the random pruning order", min_value=0, step=1, key="prune_seed")
    if st.session_state["target"] == "similarity":
        st.text_input("Second sentence (compared with each sentence)", key="pair")
    with st.expander("What these numbers mean, and the references"):
        st.markdown(EXPLANATION)
    result = page.load(queries[0])
    if result is None:
        page.stop()
    state = st.session_state
    target = None if state["target"] == "auto" else state["target"]
    settings = (queries, state["method"], target, state["pair"])
    auto = len(queries) == 1 and result.num_tokens <= AUTO_TOKENS  # quick: no button needed
    if not (auto or state.get("_importance_go") == settings):
        what = f"{len(queries)} sentences" if len(queries) > 1 else f"{result.num_tokens} tokens"
        st.info(f"Importance over {what} takes a while.", icon=":material/hourglass_top:")
        if st.button("Compute importance", type="primary"):
            state["_importance_go"] = settings
            st.rerun()
        page.stop()

    normalize, seed = state["normalize"], state["prune_seed"]
    try:
        done = page.heavy(
            "importance",
            ("importance+pruning", settings, normalize, seed),
            lambda progress: importance.importance_and_pruning(
                *settings, normalize, seed, progress
            ),
            "Head importance and pruning curve",
            on_cancel=_back_to_the_button,
        )
    except mhsa.MHSAError as e:
        page.error(e)
        page.stop()
    if done is None:
        page.stop()
    table, curve = done
    if not auto and st.button("Cancel"):
        _back_to_the_button()
        st.rerun()
    target = TARGET_SPECS[table.attrs["target"]]
    st.caption(
        f"{len(queries)} sentence(s) · target: {target.label} ({target.description}) "
        f"· method: {state['method']} ({METHODS[state['method']]})"
    )
    if "kind" in table.columns:
        st.caption(
            "An encoder-decoder's heads, one row per attention block: E = encoder "
            "self-attention, D = decoder self-attention, C = cross attention (the "
            "decoder's loss of the target given the sentence)."
        )
    page.figure(
        plots.head_value_grid(
            table,
            "importance",
            title="Importance of each head: click one to open it on the Heads page",
        ),
        "head-importance",
        key="importance-grid",
        on_select=_open_head,
        selection_mode="points",
    )
    keyboard.head_picker(table, "importance-pick", "_open_head")
    page.table(table, "head-importance", label="Download importance (.csv)", height=300)
    page.figure(
        plots.pruning_figure(curve, target.metric),
        "pruning-curve",
        key="pc",
    )
    st.download_button(
        "Download the pruning curve (.csv)",
        curve.to_csv(index=False),
        file_name="pruning-curve.csv",
        mime="text/csv",
    )
    st.subheader("Are the important heads the specialised ones?")
    st.selectbox("Against", AGAINST, key="against")
    stats = importance.importance_stats(queries)
    against = state["against"]
    rho = rank_correlation(table, stats, against)
    page.figure(plots.importance_scatter(table, stats, against), "importance-vs", key="vs")
    st.caption(f"Spearman rank correlation of importance and {against}: {rho:.2f}")

"""Head atlas: what one head does over a whole corpus (``mhsa.atlas``): the program explaining
it (``mhsa.explain``), its strongest pairs by norm and by weight (as OpenAI's Transformer
Debugger shows a head), random and per-decile samples, histograms and corpus-wide scores, a
search by token and offset, and similar contexts (exBERT's search)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

import mhsa
from mhsa import plots
from ui import atlas_build, atlas_tags, explain_section, page
from ui.state import Param, bounded_int, choice, head_label_param, md_escape, word_param
from ui.views import atlas as views

PARAMS = {
    "atlas": Param("", word_param),
    "atlas_head": Param("", head_label_param),
    "atlas_by": Param("norm", choice("norm", "weight")),
    "atlas_decile": Param(9, bounded_int(0, 9)),
    "atlas_example": Param(0, bounded_int(0, 99)),
    "atlas_query": Param("", word_param),
    "atlas_key": Param("", word_param),
    "atlas_offset": Param("", word_param),
    "atlas_position": Param(-1, bounded_int(-1, 4095)),  # -1: the example's query token
    **explain_section.PARAMS,  # the explanation's hypothesis and example text
    **atlas_tags.PARAMS,  # the search's part-of-speech boxes
}
INTRO = (
    "A head over a whole corpus, not one sentence: its strongest (query, key) pairs, samples, "
    "histograms and scores, computed once into an atlas and searched here. Tokens are shown "
    "as the model's tokenizer writes them; in an example the query is in [[ ]] and the key in "
    "<< >>."
)


def _notice(message: str) -> None:
    """A link value that does not apply here, and what is shown instead (literally)."""
    st.warning(md_escape(message), icon=":material/warning:")


def _choose_atlas(model: str) -> mhsa.atlas.Atlas | None:
    """The atlas picker (the sidebar model's atlas first); None when the server holds none."""
    names = views.atlas_names()
    state = st.session_state
    for name, reason in views.problems().items():
        st.caption(md_escape(f"Atlas folder {name!r} skipped: {reason}"))
    if state["atlas"] and state["atlas"] not in names:
        _notice(f"This server holds no atlas called {state['atlas']!r}: showing another.")
        state["atlas"] = ""
    if not state["atlas"]:
        state["atlas"] = views.default_atlas_for(model) or (names[0] if names else "")
    if not names:
        return None
    st.selectbox("Atlas", names, key="atlas", format_func=lambda n: _describe(n))
    return views.open_named(state["atlas"])


def _describe(name: str) -> str:
    a = views.open_named(name)
    plan = a.manifest["plan"]
    return f"{name}: {a.model}, {a.tokens:,} tokens of {plan['texts']:,} texts"


def _table(frame: pd.DataFrame, name: str, label: str, height: int) -> None:
    """A table of examples, its real numbers in significant digits (``views.number_columns``)."""
    page.table(frame, name, label=label, height=height, column_config=views.number_columns(frame))


def _pick_head(atlas: mhsa.atlas.Atlas) -> str:
    state = st.session_state
    if state["atlas_head"] not in atlas.labels:
        if state["atlas_head"]:
            _notice(f"The atlas has no head {state['atlas_head']}: showing the first.")
        state["atlas_head"] = atlas.labels[0]
    st.selectbox("Head", atlas.labels, key="atlas_head")
    return state["atlas_head"]


def _examples(atlas: mhsa.atlas.Atlas, name: str, head: str) -> None:
    """The head's top pairs (by norm or weight), one example's neighbourhood, open in Heads."""
    st.subheader("Top examples")
    st.radio(
        "Rank by",
        ["norm", "weight"],
        key="atlas_by",
        horizontal=True,
        captions=["weight × ‖value after W_O‖ (Kobayashi et al.)", "attention weight"],
    )
    top = atlas.top(head, k=20, by=st.session_state["atlas_by"])
    _table(top, f"atlas-top-{head}", "Download the top pairs (.csv)", 300)
    atlas_tags.tag_histograms(atlas, head, top, "top", "these top pairs")
    if top.empty:
        return
    state = st.session_state
    state["atlas_example"] = min(state["atlas_example"], len(top) - 1)
    st.number_input("Example (row)", 0, len(top) - 1, key="atlas_example")
    row = top.iloc[state["atlas_example"]]
    left, right = st.columns(2)
    with left:
        sub, rows, cols = views.neighbourhood(
            name, head, int(row.text_id), int(row["query"]), int(row["key"])
        )
        title = f"{head} around text {row.text_id}: query {row['query']}, key {row['key']}"
        cell = views.example_cell(int(row["query"]), int(row["key"]))
        page.figure(
            plots.example_heatmap(sub, rows, cols, title=title, example=cell),
            "atlas-example",
            key="atlas-example-map",
        )
    with right:
        st.text(atlas.text(int(row.text_id)))
        if st.button("Open this text in Heads", key="atlas-open"):
            page.open_text_head(atlas.text(int(row.text_id)), head)
        tokens = atlas.text_tokens(int(row.text_id), head)
        if not -1 <= st.session_state["atlas_position"] < len(tokens):
            st.session_state["atlas_position"] = -1
        st.selectbox(
            "Token for similar contexts",
            range(-1, len(tokens)),
            key="atlas_position",
            format_func=lambda i: "the example's query" if i < 0 else f"{i}: {tokens[i]}",
        )
    chosen = st.session_state["atlas_position"]
    _similar(atlas, head, int(row.text_id), int(row["query"]) if chosen < 0 else chosen)


def _similar(atlas: mhsa.atlas.Atlas, head: str, text_id: int, position: int) -> None:
    token = atlas.text_tokens(text_id, head)[position]
    st.caption(
        md_escape(
            f"Contexts whose {head} output is nearest token {position} "
            f"({token!r}) of text {text_id} (cosine; exBERT's search)."
        )
    )
    near = page.or_error(atlas.similar, text_id, position, head, 10)
    if near is not None:
        _table(near, f"atlas-similar-{head}", "Download the contexts (.csv)", 240)


def _samples(atlas: mhsa.atlas.Atlas, head: str) -> None:
    st.subheader("Samples")
    left, right = st.columns(2)
    with left:
        st.caption("Drawn uniformly from every (query, key) pair of the corpus.")
        sample = atlas.sample(head, k=10)
        _table(sample, f"atlas-sample-{head}", "Download (.csv)", 240)
    with right:
        st.slider("Decile of the head's weights", 0, 9, key="atlas_decile")
        decile = st.session_state["atlas_decile"]
        st.caption(md_escape(views.decile_caption(atlas, head, decile)))
        in_decile = atlas.sample(head, k=10, decile=decile)
        _table(in_decile, f"atlas-decile-{head}", "Download the decile (.csv)", 240)


def _histograms(atlas: mhsa.atlas.Atlas, head: str) -> None:
    st.subheader("Over the corpus")
    summary = atlas.summary(head)
    page.frame(views.scores_table(atlas, head), hide_index=True)
    figures = [
        (summary["weight_histogram"], "Weights of every pair", "weight from", "pairs"),
        (summary["offset_histogram"], "Where the attention goes", "key − query", "share"),
        (summary["key_kinds"], "Attention on kinds of key", "key", "share"),
    ]
    for column, (series, title, x, y) in zip(st.columns(3), figures, strict=True):
        with column:
            page.figure(
                plots.atlas_histogram(series, title=title, x_title=x, y_title=y, columns=3),
                f"atlas-{x}",
                key=f"atlas-hist-{x}",
            )


def _search(atlas: mhsa.atlas.Atlas, head: str) -> None:
    st.subheader("Search")
    st.caption(
        "Tokens whose strongest key under this head matches: the query token, the key "
        "token, the offset key − query (-1: the token before), their parts of speech (a "
        "tagged atlas). Leave a box empty to match any."
    )
    a, b, c = st.columns(3)
    a.text_input("Query token", key="atlas_query")
    b.text_input("Key token", key="atlas_key")
    c.text_input("Offset", key="atlas_offset")
    query_tag, key_tag = atlas_tags.tag_search_boxes(atlas)
    state = st.session_state
    raw = state["atlas_offset"].strip()
    if raw and not raw.lstrip("+-").isdigit():
        st.warning("The offset must be a whole number, as -1.")
        return
    if not (state["atlas_query"] or state["atlas_key"] or raw or query_tag or key_tag):
        return
    found = page.or_error(
        atlas.search,
        head,
        state["atlas_query"] or None,
        state["atlas_key"] or None,
        int(raw) if raw else None,
        50,
        query_tag,
        key_tag,
    )
    if found is not None:
        st.caption(f"{len(found)} found (at most 50 shown, strongest first).")
        _table(found, f"atlas-search-{head}", "Download the matches (.csv)", 300)
        atlas_tags.tag_histograms(atlas, head, found, "search", "these matches")


with page.run("Head atlas", PARAMS, kinds=True) as query:  # its heads say their attention
    st.caption(INTRO)
    if views.default_atlas_for(query.model) is None:  # never another model's atlas alone
        atlas_build.build_offer(query.model)
    atlas = _choose_atlas(query.model)
    if atlas is None:
        page.stop()
    if atlas.model != query.model:
        st.caption(
            md_escape(f"This atlas is of {atlas.model!r}; the sidebar's model is {query.model!r}.")
        )
    head = _pick_head(atlas)
    explain_section.show(atlas, st.session_state["atlas"], head)
    _examples(atlas, st.session_state["atlas"], head)
    _samples(atlas, head)
    _histograms(atlas, head)
    _search(atlas, head)

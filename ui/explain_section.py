"""The Head atlas page's explanation of a head by a program (``mhsa.explain``; values in
``ui.views.explain``), and its one line on the Heads and Head roles pages.

- ``show``: the head's explanation first (its sentence, IoU and accuracy against the fixed
  baseline, AUC, faithfulness or why none, the held-out texts it rests on), the program's
  pattern beside the head's own attention on an atlas text, a box where a student types or
  builds a hypothesis and sees its scores, and a map of every head coloured by the kind of its
  program. An atlas without saved explanations offers to compute them (the heavy queue).
- ``head_line``: one line with the head's explanation and a link to it on the Head atlas page,
  where an atlas of the sidebar's model has saved explanations; nothing otherwise.
"""

from __future__ import annotations

import math
from urllib.parse import urlencode

import pandas as pd
import streamlit as st

import mhsa
from mhsa import plots
from mhsa.atlas.tags import UNIVERSAL_TAGS
from ui import page
from ui.state import Param, bounded_int, md_escape, search_param
from ui.views import explain as views

__all__ = ["PARAMS", "PROGRAM_KEY", "TEXT_KEY", "head_line", "show"]

#: link keys of this section (the Head atlas page's ``PARAMS`` takes them in)
PROGRAM_KEY = "explain_program"
TEXT_KEY = "explain_text"
PARAMS = {
    PROGRAM_KEY: Param("", search_param),  # a hypothesis
    TEXT_KEY: Param(-1, bounded_int(-1, 10_000_000)),  # the example; -1: the first held out
}
#: the builder's session keys and their first values
_BUILDER = {
    "explain_kind": "positional",
    "explain_name": "offset",
    "explain_offset": -1,
    "explain_tag": "DET",
    "explain_direction": "left",
    "explain_select": "nearest",
}
_SCORES_HELP = {
    "iou": "Soft IoU of the head's attention A and the program's pattern P: the sum of "
    "min(A, P) over the sum of max(A, P), every query but the first (Hayes, Li & Andreas 2026).",
    "accuracy": "The share of queries whose most-attended key is one the program gives weight "
    "to (Clark et al. 2019), beside the best fixed program's.",
    "auc": "ROC-AUC of the pattern as a classifier of the head's top pairs by attention write "
    "norm against random weak pairs (OpenAI's Transformer Debugger).",
    "faithfulness": "The head's pattern replaced by the program's in the real forward, against "
    "the head made uniform: 1 - (m_program - m_clean) / (m_uniform - m_clean).",
}


def _number(value: object, digits: int = 2) -> str:
    number = float(value)  # type: ignore[arg-type]
    return f"{number:.{digits}f}" if math.isfinite(number) else "—"


def _scores(row: pd.Series, *, typed: bool = False) -> None:
    """IoU, accuracy against the baseline, AUC and faithfulness as four metrics, the baseline
    named and the held-out texts counted under them (values shown literally)."""
    iou, acc, auc, faith = st.columns(4)
    iou.metric("IoU", _number(row["iou"]), help=_SCORES_HELP["iou"])
    base = float(row.get("baseline_accuracy", math.nan))
    gain = float(row["accuracy"]) - base
    acc.metric(
        "Accuracy",
        _number(row["accuracy"]),
        delta=f"{gain:+.2f} vs baseline" if math.isfinite(gain) else None,
        help=_SCORES_HELP["accuracy"],
    )
    auc.metric("AUC", _number(row.get("auc", math.nan)), help=_SCORES_HELP["auc"])
    faithfulness = row.get("faithfulness", math.nan)
    faith.metric("Faithfulness", _number(faithfulness), help=_SCORES_HELP["faithfulness"])
    words = "not computed for a typed hypothesis" if typed else views.faithfulness_words(row)
    texts = row.get("texts")
    known = texts is not None and not pd.isna(texts)
    texts_words = f"{int(texts):,} held-out texts" if known else "the atlas's held-out texts"
    st.caption(
        md_escape(
            f"Baseline: {row.get('baseline', '?')}, the best fixed program (offset(d) for "
            f"|d| <= 3, first, last, self), accuracy {_number(base)}. Scored on {texts_words}, "
            f"never those the search used. Faithfulness: {words}."
        )
    )


def _explanation(atlas: mhsa.atlas.Atlas, name: str, head: str, row: pd.Series) -> None:
    """The head's sentence and program, its scores, and its pattern beside the head's."""
    st.markdown(f"**{md_escape(head)}**: {md_escape(row['description'])}")
    st.code(str(row["program"]), language=None)
    _scores(row)
    _patterns(atlas, name, head, str(row["program"]))


def _patterns(atlas: mhsa.atlas.Atlas, name: str, head: str, program: str) -> None:
    """The program's pattern beside the head's own attention on one atlas text."""
    held = views.held_out_texts(name)
    state = st.session_state
    if state[TEXT_KEY] not in held:  # a link's text that is not held out: the first that is
        state[TEXT_KEY] = held[0]
    st.selectbox(
        "Example (a held-out text of the atlas)",
        held,
        key=TEXT_KEY,
        format_func=lambda t: f"text {t}: {atlas.text(t)[:60]}",
    )
    weights, pattern, tokens, _ = views.example_patterns(name, head, program, state[TEXT_KEY])
    head_fig, program_fig = plots.pattern_pair(
        weights,
        pattern,
        tokens,
        head_title=f"{head}'s attention",  # one line each: the two maps' rows level
        program_title="Program's pattern",
    )
    left, right = st.columns(2)
    with left:
        page.figure(head_fig, f"{head}-attention", key="explain-head", decorate=False)
    with right:
        page.figure(program_fig, f"{head}-program", key="explain-program", decorate=False)


def _compute_offer(name: str) -> None:
    """No saved explanations: what they are, and their computation through the heavy queue."""
    st.info(
        md_escape(
            f"The atlas {name!r} has no explanations yet: each head's best program, scored "
            "on held-out texts. Compute them here (a toy model's atlas takes seconds, MiniLM's "
            "a few minutes), or on the command line: python -m mhsa explain "
        )
        + md_escape(name),
        icon=":material/info:",
    )
    if st.button("Explain every head of this atlas", key="explain-compute"):
        st.session_state["_explain_compute"] = name
    if st.session_state.get("_explain_compute") == name:
        page.heavy_or_stop(
            "explain",
            ("explain", name),
            lambda progress: views.compute(name, progress),
            f"Explaining the heads of {name}",
            unit="heads",
        )
        st.session_state.pop("_explain_compute", None)
        st.rerun()


def _build(atlas: mhsa.atlas.Atlas) -> None:
    """The hypothesis builder: kind, name or tag, direction, offset; its button writes the
    program into the box."""
    state = st.session_state
    for key, value in _BUILDER.items():
        state.setdefault(key, value)
    kinds = list(views.KINDS) if getattr(atlas, "has_tags", False) else ["positional", "token"]
    if state["explain_kind"] not in kinds:
        state["explain_kind"] = kinds[0]
    cols = st.columns(4)
    cols[0].selectbox("Kind", kinds, key="explain_kind")
    kind = state["explain_kind"]
    if kind == "linguistic":
        cols[1].selectbox("Tag of the key", UNIVERSAL_TAGS, key="explain_tag")
        cols[2].selectbox("Direction", views.DIRECTIONS, key="explain_direction")
        cols[3].selectbox("Which", views.SELECTS, key="explain_select")
    else:
        names = views.KINDS[kind]
        if state["explain_name"] not in names:
            state["explain_name"] = names[0]
        cols[1].selectbox("Which program", names, key="explain_name")
        if state["explain_name"] == "offset":
            cols[2].number_input("Offset (key − query)", -16, 16, key="explain_offset")
    built = views.build_program(
        kind,
        state["explain_name"],
        int(state["explain_offset"]),
        state["explain_tag"],
        state["explain_direction"],
        state["explain_select"],
    )
    st.button(
        f"Use {built}",
        key="explain-use",
        on_click=state.__setitem__,
        args=(PROGRAM_KEY, built),
    )
    if not getattr(atlas, "has_tags", False):
        st.caption(
            "This atlas's corpus has no part-of-speech tags: no linguistic programs (pos, when)."
        )


def _hypothesis(atlas: mhsa.atlas.Atlas, name: str, head: str) -> None:
    """A typed or built program and its scores on the atlas's held-out texts."""
    st.subheader("Your hypothesis")
    st.caption(
        "Type a program (offset(-1), first, last, self, special, punctuation, same_token, "
        "induction, same_word, word_start, pos(TAG, left|right|any, nearest|all), "
        "when(TAG, program), a | b, mix(a, b, w)) or build one, and see how well it explains "
        "this head on the atlas's held-out texts."
    )
    _build(atlas)
    st.text_input("Program", key=PROGRAM_KEY, placeholder="offset(-1)")
    typed = st.session_state[PROGRAM_KEY].strip()
    if not typed:
        return
    scores = page.or_error(views.hypothesis, name, head, typed)
    if scores is None:
        return
    program = mhsa.explain.parse_program(typed)
    said = f"{head}, if it is {program}: {program.describe()}"
    st.markdown(f"**{md_escape(said)}**")
    _scores(scores, typed=True)


def _head_map(explanations: object, name: str) -> None:
    """Every head coloured by its program's kind, with its score, beside the table."""
    st.subheader("Every head's program")
    frame = views.head_map_table(explanations)
    left, right = st.columns([3, 2])
    with left:
        page.figure(
            plots.explanation_map(frame, score="iou", title=f"Heads of {name} by their program"),
            "explanation-map",
            key="explain-map",
            decorate=False,
        )
        st.caption(
            "Each cell: the kind of the head's program (P positional, T token, L linguistic; "
            "a combination in the kind of its heaviest part, followed by +) and its IoU on "
            "held-out texts."
        )
    with right:
        page.table(frame, f"explanations-{name}", label="Download the programs (.csv)", height=360)
    together = views.together_table(explanations)
    if together is not None:
        st.markdown("**Heads replaced by their programs together**")
        st.caption(
            "Faithfulness with every head of a layer replaced at once, and with the "
            "best-explained quarter of the model's heads (by held-out IoU) at once: 1 is the "
            "model's own loss, 0 what the same heads made uniform give."
        )
        page.table(together, f"explanations-together-{name}", label="Download (.csv)")


def show(atlas: mhsa.atlas.Atlas, name: str, head: str) -> None:
    """The section on the Head atlas page, for the atlas ``name`` and its chosen ``head``."""
    st.subheader(f"What {head} does")
    explanations = views.saved_named(name)
    if explanations is None:
        _compute_offer(name)
    else:
        row = views.head_row(explanations, head)
        if row is None:
            st.info(md_escape(f"The saved explanations have no row for {head}."))
        else:
            _explanation(atlas, name, head, row)
    _hypothesis(atlas, name, head)
    if explanations is not None:
        _head_map(explanations, name)


def head_line(model: str, head: str) -> None:
    """The head's explanation in one line with a link to it on the Head atlas page, when an
    atlas of ``model`` with saved explanations exists; nothing otherwise."""
    found = views.saved_for_model(model)
    if found is None:
        return
    name, explanations = found
    row = views.head_row(explanations, head)
    if row is None:
        return
    link = "Head_atlas?" + urlencode({"model": model, "atlas": name, "atlas_head": head})
    st.markdown(
        f"**{md_escape(head)}**: {md_escape(row['description'])} "
        f"Program {md_escape(row['program'])}: IoU {_number(row['iou'])}, accuracy "
        f"{_number(row['accuracy'])} against {_number(row.get('baseline_accuracy', math.nan))} "
        f"for {md_escape(row.get('baseline', '?'))}. "
        f"[See it in the Head atlas →]({link})"
    )

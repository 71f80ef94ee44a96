"""The values of heads explained by programs (``mhsa.explain``) for the Head atlas page, the
Heads and Head roles pages' one line, and the lesson: an atlas's saved explanations, their
computation as a heavy job, a head's row, its program's pattern beside its own attention on one
text, a typed or built hypothesis and its scores on the atlas's held-out texts.

The scores are Hayes, Li & Andreas 2026's soft IoU, Clark et al. 2019's accuracy against the
best fixed-offset baseline, the ROC-AUC of OpenAI's Transformer Debugger and the faithfulness
of the head replaced by its program (``mhsa.explain.scores``, ``mhsa.explain.faithfulness``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

import mhsa
import mhsa.explain
from mhsa.explain.explanations import split_texts
from ui.core import Progress
from ui.views import atlas as atlas_views

__all__ = [
    "DIRECTIONS",
    "KINDS",
    "POSITIONAL",
    "SELECTS",
    "TOKEN_CLASSES",
    "build_program",
    "compute",
    "example_patterns",
    "faithfulness_words",
    "head_map_table",
    "head_row",
    "held_out_texts",
    "hypothesis",
    "kind_of",
    "saved_for_model",
    "saved_named",
]

#: the builder's kinds of program, and for each the names it offers
POSITIONAL = ("offset", "first", "last", "self")
TOKEN_CLASSES = ("special", "punctuation", "same_token", "induction", "same_word", "word_start")
KINDS = {"positional": POSITIONAL, "token": TOKEN_CLASSES, "linguistic": ("pos",)}
DIRECTIONS = ("left", "right", "any")
SELECTS = ("nearest", "all")


@st.cache_resource(ttl=15, show_spinner=False)
def _saved(name: str) -> Any:
    """The saved explanations of the atlas ``name`` (looked at again every 15 s: ones computed
    by the command line appear), or None."""
    return mhsa.explain.saved(atlas_views.open_named(name))


def saved_named(name: str) -> Any:
    """The saved ``HeadExplanations`` of the atlas ``name``, or None when it has none."""
    return _saved(name)


def saved_for_model(model: str) -> tuple[str, Any] | None:
    """The sidebar model's atlas (its shipped one first) and its saved explanations, or None
    when the server holds no atlas of the model or it has no explanations."""
    name = atlas_views.default_atlas_for(model)
    if name is None:
        return None
    found = _saved(name)
    return None if found is None else (name, found)


def compute(name: str, progress: Progress) -> str:
    """Explain every head of the atlas ``name`` and save the explanations in its folder (a heavy
    job: ``progress`` reports heads done). Returns ``name``."""
    atlas = atlas_views.open_named(name)
    heads = len(atlas.labels)
    progress(0, heads)  # the search reports no steps of its own to the page: begun, then done
    mhsa.explain.explain_heads(atlas, progress=False, save=True)
    progress(heads, heads)
    _saved.clear()
    return name


def kind_of(program: str) -> str:
    """The kind of a program written canonically (``positional``, ``token``...)."""
    return mhsa.explain.parse_program(program).kind


def head_row(explanations: Any, head: str) -> pd.Series | None:
    """The head's row of the explanations' table, or None when the table lacks it."""
    table = explanations.table
    rows = table[table["head"] == head]
    return None if rows.empty else rows.iloc[0]


def faithfulness_words(row: pd.Series) -> str:
    """The faithfulness of a head's program in words: its value, or why there is none."""
    value = float(row.get("faithfulness", math.nan))
    if math.isfinite(value):
        return f"{value:.2f}"
    reason = str(row.get("faithfulness_note", "") or "")
    if reason in ("", "nan", "not asked"):
        reason = "not computed for these explanations"
    return f"none: {reason}"


def head_map_table(explanations: Any) -> pd.DataFrame:
    """Every head's program, its kind and its scores, in the table's order."""
    table = explanations.table
    columns = [c for c in ("head", "program", "iou", "accuracy", "baseline", "auc") if c in table]
    frame = table[columns].copy()
    kinds = table["kind"] if "kind" in table else [kind_of(str(p)) for p in frame["program"]]
    frame.insert(2, "kind", list(kinds))
    # a combination is drawn in the colour of its heaviest part's kind (most heads of a real
    # model mix a positional or token program with the first token)
    mostly = [mhsa.explain.parse_program(str(p)).main.kind for p in frame["program"]]
    frame.insert(3, "mostly", mostly)
    return frame.reset_index(drop=True)


def together_table(explanations: Any) -> pd.DataFrame | None:
    """The heads replaced together (each whole layer, the best-explained quarter): what,
    how many heads, faithfulness or why none; None when the explanations have no such rows."""
    together = getattr(explanations, "together", None)
    if together is None or together.empty:
        return None
    heads = [len([h for h in str(v).split(",") if h]) for v in together["heads"]]
    values = pd.to_numeric(together["faithfulness"], errors="coerce")
    shown = [
        f"{v:.2f}" if math.isfinite(v) else f"none: {str(note) or 'not computed'}"
        for v, note in zip(values, together["note"].fillna(""), strict=True)
    ]
    return pd.DataFrame(
        {"heads replaced": list(together["what"]), "heads": heads, "faithfulness": shown}
    )


def held_out_texts(name: str) -> list[int]:
    """The atlas's held-out texts, those the explanations are scored on (never searched)."""
    return list(split_texts(atlas_views.open_named(name))[1])


def example_patterns(
    name: str, head: str, program: str, text_id: int | None
) -> tuple[np.ndarray, np.ndarray, list[str], int]:
    """The head's attention on an atlas text and the program's pattern on the same text, with
    its tokens and the text's id (``text_id`` None: the first held-out text); the head's
    attentions are the ones ``score_program`` reads, kept in the process."""
    example = mhsa.explain.pattern_example(
        atlas_views.open_named(name), head, program, text_id=text_id
    )
    return (
        np.asarray(example.attention, dtype=np.float64),
        np.asarray(example.pattern, dtype=np.float64),
        list(example.tokens),
        int(example.text_id),
    )


def hypothesis(name: str, head: str, program: str) -> pd.Series:
    """A hypothesis's scores on the atlas's held-out texts (``score_program``: the head's
    attentions on them are kept in the process, so a second program costs only its pattern).

    Raises:
        InputError: the program does not parse (``ProgramError``) or the atlas cannot score it.
    """
    atlas = atlas_views.open_named(name)
    return mhsa.explain.score_program(atlas, head, program)


def build_program(kind: str, name: str, offset: int, tag: str, direction: str, select: str) -> str:
    """The program the builder's choices make, canonically written: ``offset(-1)``,
    ``induction``, ``pos(DET, left, nearest)``."""
    if kind == "linguistic":
        return f"pos({tag}, {direction}, {select})"
    if name == "offset":
        return f"offset({offset})"
    return name
